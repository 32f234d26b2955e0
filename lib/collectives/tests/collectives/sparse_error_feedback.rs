//! Error feedback of the sparse reducers on dense input after the accumulator moved into the
//! residual's buffer (docs/MEMORY.md, `Residual::absorb`): over several steps of data whose f32
//! sums round, every rank's residual is, entry by entry, either 0 or exactly `g + residual`
//! of the previous step as computed here (Ok-Topk Algorithm 2: `ε = acc − acc(sent ∩ kept)`);
//! TopkA's result and residual equal Algorithm 2 written out with a brute-force top-k; and a
//! run cut in two by `state`/`load_state` gives the same bits as one run (the residual is
//! back in place after every step; Ok-Topk left out: its thresholds and regions are state
//! that `state` does not carry).

use crate::common;

use common::{layout, res, topk_by_sorting};
use gradkit_collectives::registry::Params;
use gradkit_collectives::{make_reducer, Flat, StepOutput};
use gradkit_comm::run_local;
use gradkit_core::keep::Keep;
use gradkit_core::trace::Layout;
use gradkit_testkit::rng::Rng;

/// Every sparse algorithm of the registry.
fn algos() -> Vec<&'static str> {
    gradkit_collectives::Algo::ALL
        .iter()
        .filter(|a| a.family() == gradkit_collectives::Family::Sparse)
        .map(|a| a.name())
        .collect()
}

/// `[step][rank]` gradients with values of many scales (sums round in f32), a few exact zeros.
fn grads(seed: u64, steps: usize, p: usize, n: usize) -> Vec<Vec<Vec<f32>>> {
    let mut rng = Rng::new(seed);
    (0..steps)
        .map(|_| {
            (0..p)
                .map(|_| {
                    (0..n)
                        .map(|_| {
                            if rng.below(32) == 0 {
                                return 0.0;
                            }
                            let m = (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                            m * 2f32.powi(rng.below(12) as i32 - 6)
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Per rank, per step: the output and the residual after it, for the steps of `g` numbered
/// from `first`, the reducer first given `start[rank]` as its residual (when not empty).
fn run(
    algo: &str,
    params: &Params,
    lay: &Layout,
    (g, first): (&[Vec<Vec<f32>>], usize),
    start: &[Vec<f32>],
) -> Vec<Vec<(StepOutput, Vec<f32>)>> {
    let p = g[0].len();
    run_local(p, |comm| {
        let r = comm.rank();
        let mut red = make_reducer(algo, params)?;
        if !start[r].is_empty() {
            red.load_state(&[("residual".to_string(), start[r].clone())])?;
        }
        let mut out = Vec::new();
        for (t, gt) in g.iter().enumerate() {
            let o = red.reduce(comm, (first + t) as u32, lay, Flat::Dense(gt[r].clone()))?;
            out.push((o, common::residual_of(&red.state())));
        }
        Ok(out)
    })
    .unwrap()
}

#[test]
fn every_residual_entry_is_zero_or_exactly_the_accumulator() {
    let (p, n, steps) = (4, 70_001, 4);
    let lay = layout(n as u64, 3);
    let params = Params {
        keep: Keep::Density(0.01),
        ..Params::default()
    };
    let g = grads(11, steps, p, n);
    for algo in algos() {
        let outs = run(algo, &params, &lay, (&g, 0), &vec![Vec::new(); p]);
        for (r, steps_r) in outs.iter().enumerate() {
            let mut prev = vec![0f32; n];
            for (t, (o, resid)) in steps_r.iter().enumerate() {
                assert_eq!(resid.len(), n, "{algo} rank {r} step {t}: residual kept");
                let sent = o.contributed.as_ref().expect("dense input: contributed");
                let mut zeroed = 0;
                for i in 0..n {
                    let acc = g[t][r][i] + prev[i];
                    let got = resid[i];
                    if got.to_bits() != acc.to_bits() {
                        assert_eq!(got, 0.0, "{algo} rank {r} step {t} entry {i}");
                        zeroed += 1;
                    }
                }
                assert!(
                    zeroed <= sent.len().max(res(o).len()),
                    "{algo} rank {r} step {t}: {zeroed} entries left the residual"
                );
                prev.clone_from(resid);
            }
        }
    }
}

#[test]
fn topka_is_algorithm_2_written_out() {
    let (p, n, steps, k) = (3, 66_000, 4, 500);
    let lay = layout(n as u64, 2);
    let params = Params {
        keep: Keep::K(k as u64),
        ..Params::default()
    };
    let g = grads(12, steps, p, n);
    let outs = run("topka", &params, &lay, (&g, 0), &vec![Vec::new(); p]);
    let mut resid = vec![vec![0f32; n]; p];
    for t in 0..steps {
        let mut sum = std::collections::BTreeMap::<u32, f32>::new();
        for r in 0..p {
            let acc: Vec<f32> = (0..n).map(|i| g[t][r][i] + resid[r][i]).collect();
            let sel = topk_by_sorting(&acc, k);
            for &i in &sel {
                // Summed in rank order (−0 + v is v, bit for bit).
                *sum.entry(i).or_insert(-0.0) += acc[i as usize];
            }
            resid[r] = acc;
            for &i in &sel {
                resid[r][i as usize] = 0.0;
            }
        }
        for r in 0..p {
            let (o, got) = &outs[r][t];
            let s = res(o);
            let want_idx: Vec<u32> = sum.keys().copied().collect();
            assert_eq!(s.indices, want_idx, "rank {r} step {t}: support");
            let want_val: Vec<u32> = sum.values().map(|v| v.to_bits()).collect();
            let got_val: Vec<u32> = s.values.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got_val, want_val, "rank {r} step {t}: sums");
            let a: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            let b: Vec<u32> = resid[r].iter().map(|v| v.to_bits()).collect();
            assert!(a == b, "rank {r} step {t}: residual");
        }
    }
}

#[test]
fn a_run_cut_in_two_by_its_state_equals_one_run() {
    let (p, n, steps) = (4, 70_001, 4);
    let lay = layout(n as u64, 3);
    let params = Params {
        keep: Keep::Density(0.01),
        ..Params::default()
    };
    let g = grads(13, steps, p, n);
    // Ok-Topk keeps thresholds and regions across steps besides its residual (not in `state`).
    for algo in algos().into_iter().filter(|a| *a != "oktopk") {
        let whole = run(algo, &params, &lay, (&g, 0), &vec![Vec::new(); p]);
        let first = run(algo, &params, &lay, (&g[..2], 0), &vec![Vec::new(); p]);
        let saved: Vec<Vec<f32>> = first.iter().map(|s| s[1].1.clone()).collect();
        let second = run(algo, &params, &lay, (&g[2..], 2), &saved);
        for r in 0..p {
            for (t, (o, resid)) in first[r].iter().chain(&second[r]).enumerate() {
                let (wo, wr) = &whole[r][t];
                assert_eq!(res(o), res(wo), "{algo} rank {r} step {t}: result");
                let a: Vec<u32> = resid.iter().map(|v| v.to_bits()).collect();
                let b: Vec<u32> = wr.iter().map(|v| v.to_bits()).collect();
                assert!(a == b, "{algo} rank {r} step {t}: residual");
            }
        }
    }
}
