//! The 1-bit reducers' state moved instead of copied (docs/MEMORY.md): `Reducer::take_state` gives
//! the settled worker and server errors that `Reducer::state` copies, and leaves the reducer
//! without state; `Reducer::load_state_owned` keeps the given buffers and continues the run as
//! `load_state` does. Checked against an uninterrupted run and, for the worker error of
//! onebit-naive, against a dense simulation written here (onebit-lamb.md §2, step 1:
//! `buf = x + e`, `s = ‖buf‖₂/√len`, `e ← buf − s·sign(buf)`).

use gradkit_collectives::{make_reducer, Flat, Params};
use gradkit_comm::run_local;
use gradkit_core::trace::Layout;

type State = Vec<(String, Vec<f32>)>;

fn data(p: usize, n: usize, step: usize) -> Vec<Vec<f32>> {
    (0..p)
        .map(|r| {
            let mut g =
                gradkit_testkit::rng::Rng::new(7 ^ ((r as u64) << 32) ^ ((step as u64) << 48));
            (0..n)
                .map(|_| (0..4).map(|_| g.unit_f32()).sum::<f32>() - 2.0 + 0.1 * r as f32)
                .collect()
        })
        .collect()
}

fn layout_of(n: usize) -> Layout {
    Layout::new(vec![
        (0, "a".into(), 200, None),
        (1, "b".into(), n as u64 - 200, None),
    ])
}

fn bits(st: &State) -> Vec<(String, Vec<u32>)> {
    st.iter()
        .map(|(k, v)| (k.clone(), v.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

/// Per rank: the outputs of `steps`, `state()` and then `take_state()` after the last step
/// (and `state()` once more, which must then be empty), starting from `saved` (moved in).
fn run(
    algo: &str,
    p: usize,
    n: usize,
    steps: std::ops::Range<usize>,
    saved: Option<Vec<State>>,
) -> Vec<(Vec<Vec<f32>>, State, State)> {
    let layout = layout_of(n);
    let saved = std::sync::Mutex::new(saved.map(|v| v.into_iter().map(Some).collect::<Vec<_>>()));
    run_local(p, |comm| {
        let mut red = make_reducer(algo, &Params::default())?;
        let mine = saved
            .lock()
            .unwrap()
            .as_mut()
            .and_then(|v| v[comm.rank()].take());
        if let Some(st) = mine {
            red.load_state_owned(st)?;
        }
        let mut outs = Vec::new();
        for s in steps.clone() {
            let x = data(p, n, s).swap_remove(comm.rank());
            match red.reduce(comm, s as u32, &layout, Flat::Dense(x))?.result {
                Flat::Dense(v) => outs.push(v),
                Flat::Sparse(_) => anyhow::bail!("a sparse 1-bit result"),
            }
        }
        red.finish(comm)?;
        let copied = red.state();
        let taken = red.take_state();
        assert!(red.state().is_empty(), "take_state leaves no state");
        Ok((outs, copied, taken))
    })
    .unwrap()
}

#[test]
fn taken_state_is_the_copied_state_and_resumes_the_run() {
    let (p, n) = (3usize, 501usize);
    for algo in ["onebit", "onebit-naive"] {
        let straight = run(algo, p, n, 0..5, None);
        let first = run(algo, p, n, 0..3, None);
        let saved: Vec<State> = first.iter().map(|r| r.2.clone()).collect();
        let second = run(algo, p, n, 3..5, Some(saved));
        for r in 0..p {
            assert_eq!(
                bits(&straight[r].1),
                bits(&straight[r].2),
                "{algo} rank {r}: take_state differs from state"
            );
            assert_eq!(bits(&first[r].1), bits(&first[r].2), "{algo} rank {r}");
            let names: Vec<&str> = first[r].2.iter().map(|e| e.0.as_str()).collect();
            assert_eq!(names, ["worker_error", "server_error"]);
            assert_eq!(
                straight[r].0[3..],
                second[r].0[..],
                "{algo} rank {r}: the resumed run differs"
            );
            assert_eq!(
                bits(&straight[r].2),
                bits(&second[r].2),
                "{algo} rank {r}: final state differs"
            );
        }
    }
}

#[test]
fn taken_naive_worker_error_matches_the_simulation() {
    let (p, n) = (3usize, 501usize);
    let npad = n.div_ceil(8) * 8;
    let got = run("onebit-naive", p, n, 0..3, None);
    for (r, (_, _, taken)) in got.iter().enumerate() {
        let mut e = vec![0f32; npad];
        for s in 0..3 {
            let x = &data(p, n, s)[r];
            let buf: Vec<f32> = (0..npad)
                .map(|k| x.get(k).copied().unwrap_or(0.0) + e[k])
                .collect();
            let ss: f64 = buf.iter().map(|&v| v as f64 * v as f64).sum();
            let sc = (ss / npad as f64).sqrt() as f32;
            e = buf
                .iter()
                .map(|&b| b - if b >= 0.0 { sc } else { -sc })
                .collect();
        }
        assert_eq!(taken[0].1.len(), npad);
        assert!(taken[1].1.is_empty(), "onebit-naive keeps no server error");
        for (k, (g, w)) in taken[0].1.iter().zip(&e).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "rank {r} elem {k}: {g} vs {w}"
            );
        }
    }
}
