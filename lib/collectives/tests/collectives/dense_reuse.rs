//! docs/MEMORY.md: a dense reducer keeps its message buffer across calls. Repeated calls on one
//! reducer, with sizes going up and down, must each equal an independent f64 sum of the
//! ranks' inputs, and hold the same bits as a call with no kept buffer.

use gradkit_collectives::{dense, Flat, Op, Reducer};
use gradkit_comm::{run_local, Comm};
use gradkit_core::trace::Layout;

/// Rank r's input for call c: a deterministic pseudo-random vector in [−1, 1).
fn input(r: usize, c: usize, n: usize) -> Vec<f32> {
    let mut g = gradkit_testkit::rng::Rng::new((c * 131 + r) as u64 + 7);
    (0..n).map(|_| g.unit_f32() * 2.0 - 1.0).collect()
}

/// The sum over ranks in f64, written here independently of the algorithms.
fn reference(p: usize, c: usize, n: usize) -> Vec<f64> {
    let mut acc = vec![0f64; n];
    for r in 0..p {
        for (a, x) in acc.iter_mut().zip(input(r, c, n)) {
            *a += x as f64;
        }
    }
    acc
}

/// Sizes of the successive calls: growing, shrinking below and past the chunk size, odd
/// lengths, smaller than P, and empty, so a kept buffer is reused at every other size.
const SIZES: [usize; 9] = [70_001, 300_000, 1_000, 3, 300_000, 0, 150_017, 1 << 18, 5];

#[test]
fn repeated_calls_on_one_reducer_equal_the_dense_sum_at_every_size() {
    for name in ["ring", "rabenseifner", "tree", "native"] {
        for p in [2usize, 3, 4, 5] {
            let res = run_local(p, |c: &dyn Comm| {
                let mut red = dense::DenseReducer::new(name, Op::Sum)?;
                let mut out = Vec::new();
                for (call, &n) in SIZES.iter().enumerate() {
                    let layout = Layout::new(vec![(0, "w".into(), n as u64, None)]);
                    let x = input(c.rank(), call, n);
                    let mut fresh = x.clone();
                    dense::allreduce(c, name.parse()?, Op::Sum, &mut fresh)?;
                    let got = red.reduce(c, call as u32, &layout, Flat::Dense(x))?;
                    out.push((got.result.into_dense(n), fresh));
                }
                Ok(out)
            })
            .unwrap();
            for (call, &n) in SIZES.iter().enumerate() {
                let want = reference(p, call, n);
                for (r, calls) in res.iter().enumerate() {
                    let (got, fresh) = &calls[call];
                    assert_eq!(got.len(), n, "{name} P={p} call {call}");
                    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()) * p as f64,
                            "{name} P={p} call {call} n={n} rank {r} i={i}: {g} vs {w}"
                        );
                    }
                    let same_bits = got
                        .iter()
                        .zip(fresh)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same_bits,
                        "{name} P={p} call {call}: kept buffer changed the bits"
                    );
                    assert_eq!(
                        got, &res[0][call].0,
                        "{name} P={p} call {call}: ranks differ"
                    );
                }
            }
        }
    }
}

#[test]
fn mean_on_a_reused_reducer_is_the_sum_over_p() {
    let p = 3;
    let n = 100_003;
    let res = run_local(p, |c: &dyn Comm| {
        let mut red = dense::DenseReducer::new("ring", Op::Mean)?;
        let layout = Layout::new(vec![(0, "w".into(), n as u64, None)]);
        let mut last = Vec::new();
        for call in 0..3 {
            let out = red.reduce(
                c,
                call,
                &layout,
                Flat::Dense(input(c.rank(), call as usize, n)),
            )?;
            last = out.result.into_dense(n);
        }
        Ok(last)
    })
    .unwrap();
    let want = reference(p, 2, n);
    for got in &res {
        for (&g, &w) in got.iter().zip(&want) {
            let w = w / p as f64;
            assert!((g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()) * p as f64);
        }
    }
}
