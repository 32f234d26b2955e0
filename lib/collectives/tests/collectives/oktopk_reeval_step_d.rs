//! Ok-Topk's Step D on the re-evaluation steps (Algorithm 1 lines 9–13; oktopk.md §1):
//! `--reeval-step-d run` (line 13 on every step) and the default `skip` (the authors' code:
//! the exact top-k of the gathered set is the result), both against a dense reference of
//! Algorithm 1 + Algorithm 2 written here in f64 on every rank's accumulator, with
//! `--adjust paper` (thresholds reused unchanged between re-evaluations):
//! - local selection: on re-evaluation steps the exact top-k of |acc| (larger first, the lower
//!   index among equals; all non-zeros and threshold 0 when at most k are non-zero) and its
//!   k-th largest |acc| as the local threshold, otherwise `{j : |acc_j| > local_th}`;
//! - `u_j = Σ_{r : j ∈ S_r} acc_r[j]`, its non-zeros;
//! - re-evaluation steps: global_th = the k-th largest |u| (0 when at most k non-zeros);
//!   `skip`: the result is the exact top-k of u (ties to the lower index); `run`: the result is
//!   `{j : |u_j| ≥ global_th}` (every non-zero when global_th = 0);
//! - reuse steps: `{j : |u_j| > global_th}`;
//! - residual: acc_r with `S_r ∩ supp(result)` zeroed.
//!
//! The gradients are small dyadic numbers, so every sum is exact in f32 and f64 and the
//! many equal magnitudes exercise the tie rules. Traffic: the phases each step uses, and with
//! `--balance never` the exact bytes of `th_re_evaluate` and `balance_and_allgatherv` (ring
//! allgathers: a rank sends every block but its successor's), from the reference's counts
//! per region.

#![allow(clippy::needless_range_loop)] // ranks × steps tables read clearest by index

use std::collections::BTreeMap;

use gradkit_collectives::registry::{Adjust, Balance, Params, ReevalStepD};
use gradkit_collectives::{make_reducer, Flat, StepOutput};
use gradkit_comm::{run_local, Comm, PhaseCounts};

use crate::common;
use common::{res, Rng};
use gradkit_core::keep::Keep;

type Traffic = BTreeMap<String, PhaseCounts>;

/// Per rank, per step: output, traffic per phase, residual after the step.
fn run(
    p: usize,
    params: &Params,
    n: u64,
    g: &[Vec<Vec<f32>>],
) -> Vec<Vec<(StepOutput, Traffic, Vec<f32>)>> {
    let lay = common::layout(n, 3);
    run_local(p, |comm: &dyn Comm| {
        let mut red = make_reducer("oktopk", params)?;
        let mut v = Vec::new();
        for (t, gt) in g.iter().enumerate() {
            comm.traffic().reset();
            let o = red.reduce(comm, t as u32, &lay, Flat::Dense(gt[comm.rank()].clone()))?;
            let tr = comm.traffic().snapshot();
            let st = red.state();
            let residual = st.iter().find(|(name, _)| name == "residual");
            v.push((o, tr, residual.expect("the residual is kept").1.clone()));
        }
        Ok(v)
    })
    .unwrap()
}

/// Dyadic gradients k/16, |k| ≤ 512 (exact sums), different per step and rank.
fn gradients(seed: u64, steps: usize, p: usize, n: usize) -> Vec<Vec<Vec<f32>>> {
    let mut rng = Rng::new(seed);
    (0..steps)
        .map(|_| {
            (0..p)
                .map(|_| (0..n).map(|_| rng.val()).collect())
                .collect()
        })
        .collect()
}

/// Indices of the k largest |x| (larger first, the lower index among equals), ascending.
fn topk_by_sorting(x: &[(u32, f64)], k: usize) -> Vec<u32> {
    let mut order: Vec<(u32, f64)> = x.to_vec();
    order.sort_by(|a, b| {
        b.1.abs()
            .partial_cmp(&a.1.abs())
            .unwrap()
            .then(a.0.cmp(&b.0))
    });
    let mut top: Vec<u32> = order.iter().take(k).map(|e| e.0).collect();
    top.sort_unstable();
    top
}

/// The k-th largest |x| when more than k entries are non-zero, else 0.
fn kth_or_zero(x: &[(u32, f64)], k: usize) -> f64 {
    let mut mag: Vec<f64> = x.iter().map(|e| e.1.abs()).filter(|m| *m > 0.0).collect();
    if mag.len() <= k {
        return 0.0;
    }
    mag.sort_by(|a, b| b.partial_cmp(a).unwrap());
    mag[k - 1]
}

/// The reference's step: per rank the local selection and the next residual, and the result.
struct RefStep {
    sel: Vec<Vec<u32>>,
    result: BTreeMap<u32, f64>,
    residual: Vec<Vec<f64>>,
    /// Non-zeros of u (what the ranks reduce), for the traffic of `th_re_evaluate`.
    reduced: Vec<u32>,
    local_th: Vec<f64>,
    global_th: f64,
}

/// Algorithm 1 (+ Algorithm 2's residual) for one step; `local_th` / `global_th` carry over.
fn reference_step(
    eps: &[Vec<f64>],
    g: &[Vec<f32>],
    k: usize,
    reeval: bool,
    mode: ReevalStepD,
    local_th: &[f64],
    global_th: f64,
) -> RefStep {
    let p = g.len();
    let n = g[0].len();
    let acc: Vec<Vec<f64>> = (0..p)
        .map(|r| (0..n).map(|j| eps[r][j] + g[r][j] as f64).collect())
        .collect();
    let mut sel = Vec::new();
    let mut new_local = Vec::new();
    for r in 0..p {
        let pairs: Vec<(u32, f64)> = acc[r]
            .iter()
            .enumerate()
            .map(|(j, &v)| (j as u32, v))
            .collect();
        if reeval {
            let th = kth_or_zero(&pairs, k);
            let s: Vec<u32> = if th == 0.0 {
                pairs.iter().filter(|e| e.1 != 0.0).map(|e| e.0).collect()
            } else {
                topk_by_sorting(&pairs, k)
            };
            sel.push(s);
            new_local.push(th);
        } else {
            let th = local_th[r];
            sel.push(
                pairs
                    .iter()
                    .filter(|e| e.1.abs() > th)
                    .map(|e| e.0)
                    .collect(),
            );
            new_local.push(th);
        }
    }
    let mut u: BTreeMap<u32, f64> = BTreeMap::new();
    for r in 0..p {
        for &j in &sel[r] {
            *u.entry(j).or_default() += acc[r][j as usize];
        }
    }
    let nz: Vec<(u32, f64)> = u
        .iter()
        .filter(|e| *e.1 != 0.0)
        .map(|(&j, &v)| (j, v))
        .collect();
    let (result, gth): (BTreeMap<u32, f64>, f64) = if reeval {
        let th = kth_or_zero(&nz, k);
        let keep: Vec<(u32, f64)> = match mode {
            ReevalStepD::Skip => {
                let top = topk_by_sorting(&nz, k);
                nz.iter().filter(|e| top.contains(&e.0)).copied().collect()
            }
            ReevalStepD::Run => nz.iter().filter(|e| e.1.abs() >= th).copied().collect(),
        };
        (keep.into_iter().collect(), th)
    } else {
        let keep = nz.iter().filter(|e| e.1.abs() > global_th).copied();
        (keep.collect(), global_th)
    };
    let residual = (0..p)
        .map(|r| {
            let mut e = acc[r].clone();
            for &j in &sel[r] {
                if result.contains_key(&j) {
                    e[j as usize] = 0.0;
                }
            }
            e
        })
        .collect();
    RefStep {
        sel,
        result,
        residual,
        reduced: nz.iter().map(|e| e.0).collect(),
        local_th: new_local,
        global_th: gth,
    }
}

fn metric(o: &StepOutput, name: &str) -> f64 {
    o.metrics.iter().find(|m| m.0 == name).expect(name).1
}

/// Bytes rank r sends in a ring allgatherv of blocks of `sizes[q]` elements of `w` bytes.
fn ring_allgather_sent(sizes: &[usize], r: usize, w: u64) -> u64 {
    let p = sizes.len();
    if p == 1 {
        return 0;
    }
    let total: usize = sizes.iter().sum();
    w * (total - sizes[(r + 1) % p]) as u64
}

#[test]
fn step_d_on_reevaluation_steps_matches_a_dense_reference() {
    let (n, steps, reeval) = (1500usize, 7usize, 3u32);
    for mode in [ReevalStepD::Run, ReevalStepD::Skip] {
        for balance in [Balance::Never, Balance::Always] {
            for p in 1..=5usize {
                for seed in [1u64, 2] {
                    for k in [15usize, 150] {
                        let ctx0 = format!("{mode} {balance} P={p} seed {seed} k={k}");
                        let g = gradients(seed * 100 + p as u64, steps, p, n);
                        let params = Params {
                            keep: Keep::K(k as u64),
                            reeval,
                            period: 2,
                            adjust: Adjust::Paper,
                            balance,
                            reeval_step_d: mode,
                            ..Params::default()
                        };
                        let outs = run(p, &params, n as u64, &g);
                        let mut eps = vec![vec![0f64; n]; p];
                        let mut lth = vec![0f64; p];
                        let mut gth = 0f64;
                        for t in 0..steps {
                            let ctx = format!("{ctx0} t={t}");
                            let is_re = (t as u32).is_multiple_of(reeval);
                            let want = reference_step(&eps, &g[t], k, is_re, mode, &lth, gth);
                            check_step(&ctx, &outs, t, &want, mode, balance, is_re);
                            eps = want.residual;
                            lth = want.local_th;
                            gth = want.global_th;
                        }
                    }
                }
            }
        }
    }
}

/// One step of every rank against the reference.
fn check_step(
    ctx: &str,
    outs: &[Vec<(StepOutput, Traffic, Vec<f32>)>],
    t: usize,
    want: &RefStep,
    mode: ReevalStepD,
    balance: Balance,
    is_re: bool,
) {
    let p = outs.len();
    let first = res(&outs[0][t].0).clone();
    let want_idx: Vec<u32> = want.result.keys().copied().collect();
    assert_eq!(first.indices, want_idx, "{ctx}: result support");
    for (v, (j, w)) in first.values.iter().zip(&want.result) {
        assert_eq!(*v as f64, *w, "{ctx}: value at {j}");
    }
    // Kept counts per region (the reducer's regions, from its metrics).
    let regions: Vec<(u32, u32)> = (0..p)
        .map(|r| {
            let o = &outs[r][t].0;
            (
                metric(o, "region_start") as u32,
                metric(o, "region_end") as u32,
            )
        })
        .collect();
    let in_region = |set: &[u32], q: usize| {
        set.iter()
            .filter(|&&j| j >= regions[q].0 && j < regions[q].1)
            .count()
    };
    let kept: Vec<usize> = (0..p).map(|q| in_region(&want_idx, q)).collect();
    let reduced: Vec<usize> = (0..p).map(|q| in_region(&want.reduced, q)).collect();
    for r in 0..p {
        let (o, tr, residual) = &outs[r][t];
        let s = res(o);
        assert_eq!(s.indices, first.indices, "{ctx} rank {r}: same support");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&s.values),
            bits(&first.values),
            "{ctx} rank {r}: same bits"
        );
        assert_eq!(
            o.contributed.as_deref(),
            Some(&want.sel[r][..]),
            "{ctx} rank {r}: local selection"
        );
        let want_res: Vec<f32> = want.residual[r].iter().map(|&v| v as f32).collect();
        assert_eq!(residual, &want_res, "{ctx} rank {r}: residual");
        assert_eq!(
            metric(o, "global_threshold"),
            want.global_th,
            "{ctx} rank {r}: global_th"
        );
        assert_eq!(
            metric(o, "reevaluated"),
            f64::from(u8::from(is_re)),
            "{ctx}"
        );
        // Traffic: Step D on every step under `run`, not on re-evaluation steps under `skip`.
        let ph = |name: &str| tr.get(name).copied().unwrap_or_default();
        let d = ph("balance_and_allgatherv");
        let th = ph("th_re_evaluate");
        let step_d = !is_re || mode == ReevalStepD::Run;
        if p == 1 || !step_d {
            assert_eq!(
                (d.msgs_sent, d.bytes_sent),
                (0, 0),
                "{ctx} rank {r}: no Step D"
            );
        }
        if p > 1 && step_d {
            assert!(d.msgs_sent >= 3 * (p as u64 - 1), "{ctx} rank {r}: Step D");
            if balance == Balance::Never {
                // Sizes (one u64 each), then the indices and values of every region.
                let bytes = 8 * (p as u64 - 1) + ring_allgather_sent(&kept, r, 8);
                assert_eq!(d.bytes_sent, bytes, "{ctx} rank {r}: Step D bytes");
                assert_eq!(
                    d.msgs_sent,
                    3 * (p as u64 - 1),
                    "{ctx} rank {r}: Step D messages"
                );
            }
        }
        let th_bytes = if is_re {
            ring_allgather_sent(&reduced, r, 8)
        } else {
            0
        };
        assert_eq!(
            th.bytes_sent, th_bytes,
            "{ctx} rank {r}: th_re_evaluate bytes"
        );
        let th_msgs = if is_re { 2 * (p as u64 - 1) } else { 0 };
        assert_eq!(
            th.msgs_sent, th_msgs,
            "{ctx} rank {r}: th_re_evaluate messages"
        );
        assert_eq!(
            ph("th_adjust").msgs_sent,
            0,
            "{ctx}: paper policy, no th_adjust"
        );
    }
}

/// The default is `skip`, and `--reeval-step-d run` changes only the re-evaluation steps'
/// traffic when their magnitudes are distinct (then the threshold pass is the exact top-k).
#[test]
fn default_is_skip_and_run_adds_step_d_traffic_only() {
    assert_eq!(Params::default().reeval_step_d, ReevalStepD::Skip);
    assert_eq!("run".parse::<ReevalStepD>(), Ok(ReevalStepD::Run));
    assert!("sometimes"
        .parse::<ReevalStepD>()
        .unwrap_err()
        .contains("--reeval-step-d"));
    let (n, steps, p, k) = (3000usize, 5usize, 4usize, 30usize);
    // Distinct magnitudes: j-dependent irrational-ish values.
    let g: Vec<Vec<Vec<f32>>> = (0..steps)
        .map(|t| {
            (0..p)
                .map(|r| {
                    (0..n)
                        .map(|j| {
                            (((j * 7919 + r * 104_729 + t * 15_485_863) % 1_000_003) as f32 + 0.5)
                                .sqrt()
                                - 500.0
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    let base = Params {
        keep: Keep::K(k as u64),
        reeval: 2,
        ..Params::default()
    };
    let skip = run(p, &base, n as u64, &g);
    let runs = run(
        p,
        &Params {
            reeval_step_d: ReevalStepD::Run,
            ..base.clone()
        },
        n as u64,
        &g,
    );
    for t in 0..steps {
        for r in 0..p {
            let (a, b) = (&skip[r][t], &runs[r][t]);
            assert_eq!(res(&a.0), res(&b.0), "t={t} rank {r}: result");
            assert_eq!(a.2, b.2, "t={t} rank {r}: residual");
            let d = |tr: &Traffic| tr.get("balance_and_allgatherv").map_or(0, |c| c.msgs_sent);
            if t % 2 == 0 {
                assert_eq!(d(&a.1), 0, "t={t}: skip sends no Step D");
                assert!(d(&b.1) > 0, "t={t}: run sends Step D");
            } else {
                let counts = |tr: &Traffic| -> Vec<(String, u64, u64)> {
                    tr.iter()
                        .map(|(k, c)| (k.clone(), c.bytes_sent, c.msgs_sent))
                        .collect()
                };
                assert_eq!(counts(&a.1), counts(&b.1), "t={t}: reuse steps alike");
            }
        }
    }
}
