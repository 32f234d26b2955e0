//! Property tests of the reducers on the in-process backend (docs/ALGORITHMS.md), for random world
//! sizes P ∈ 1..=5, model sizes, densities and seeds:
//!
//! * **volume**: the bytes each rank sends per step, phase by phase, against the accounting
//!   of Ok-Topk Table 1 (`cost`) and each reducer's documented traffic, recomputed here from
//!   the selections (`StepOutput::contributed`) and the result;
//! * **error-feedback conservation** of every sparse exchange on dense input with the
//!   residual on: Σ_ranks Σ_t g_t = Σ_t result_t + Σ_ranks residual_T (Op::Sum; f64 with a
//!   tolerance; the residual read through `Reducer::state()`);
//! * **1-bit state identity** through the reducer: with the worker and server errors of
//!   `Reducer::state()`, Σ_t result_t + server_error_T = (Σ_ranks Σ_t x_t − Σ_ranks
//!   worker_error_T)/P, elementwise (the kernel-level identities are in
//!   lib/sparsify/tests/sparsify/kernels.rs).

#![allow(clippy::needless_range_loop)] // ranks × steps tables read clearest by index

use std::collections::BTreeMap;

use gradkit_collectives::registry::Params;
use gradkit_collectives::{cost, make_reducer, Flat, StepOutput};
use gradkit_comm::{run_local, Comm, PhaseCounts};
use gradkit_core::trace::{Layout, Sparse};
use gradkit_testkit::rng::Rng;
use proptest::prelude::*;

use crate::common;

type Traffic = BTreeMap<String, PhaseCounts>;

/// What one rank brings back from a run: per step (output, traffic), and its final state.
type RankRun = (Vec<(StepOutput, Traffic)>, Vec<(String, Vec<f32>)>);

/// Runs `algo` for the steps of `g[t][r]` (dense) on P = `g[0].len()` ranks.
fn run(algo: &str, params: &Params, lay: &Layout, g: &[Vec<Vec<f32>>]) -> Vec<RankRun> {
    let p = g[0].len();
    run_local(p, |comm: &dyn Comm| {
        let mut red = make_reducer(algo, params)?;
        let mut v = Vec::new();
        for (t, gt) in g.iter().enumerate() {
            comm.traffic().reset();
            let o = red.reduce(comm, t as u32, lay, Flat::Dense(gt[comm.rank()].clone()))?;
            v.push((o, comm.traffic().snapshot()));
        }
        red.finish(comm)?;
        Ok((v, red.state()))
    })
    .unwrap_or_else(|e| panic!("{algo}: {e:#}"))
}

/// Dense gradients `[step][rank][i]`: dyadic values k/16, |k| ≤ 512 (sums of a few are exact
/// in f32), with the odd exact zero.
fn gradients(seed: u64, steps: usize, p: usize, n: usize) -> Vec<Vec<Vec<f32>>> {
    let mut rng = Rng::new(seed);
    (0..steps)
        .map(|_| {
            (0..p)
                .map(|_| (0..n).map(|_| rng.dyadic(512, 16)).collect())
                .collect()
        })
        .collect()
}

fn sparse(o: &StepOutput) -> &Sparse {
    match &o.result {
        Flat::Sparse(s) => s,
        Flat::Dense(_) => panic!("sparse result expected"),
    }
}

fn metric(o: &StepOutput, name: &str) -> f64 {
    o.metrics
        .iter()
        .find(|m| m.0 == name)
        .unwrap_or_else(|| panic!("metric {name}"))
        .1
}

fn phase(t: &Traffic, name: &str) -> PhaseCounts {
    t.get(name).copied().unwrap_or_default()
}

fn sent(t: &Traffic) -> u64 {
    t.values().map(|c| c.bytes_sent).sum()
}

/// Bytes rank r sends in a ring allgatherv of blocks `sizes` (elements of `bytes` each): every
/// block but the one of rank r + 1.
fn ring_allgatherv_sent(sizes: &[usize], r: usize, bytes: u64) -> u64 {
    let p = sizes.len();
    (0..p)
        .filter(|&i| i != (r + 1) % p)
        .map(|i| sizes[i] as u64 * bytes)
        .sum()
}

/// The sparse algorithms whose traffic [`check_volume`] recomputes here, as `--algo` names
/// (CLT-k's, Top-k (union)'s and any later one's are checked by their own tests).
const VOLUME: [&str; 6] = ["topka", "topkdsa", "gtopk", "gaussiank", "oktopk", "deft"];

/// Every sparse algorithm of the registry (each selects from dense input).
fn sparse_algos() -> Vec<&'static str> {
    gradkit_collectives::Algo::ALL
        .iter()
        .filter(|a| a.family() == gradkit_collectives::Family::Sparse)
        .map(|a| a.name())
        .collect()
}

/// A random world: (P, n, density, seed, steps, τ').
fn world() -> impl Strategy<Value = (usize, usize, f64, u64, usize, u32)> {
    (
        1usize..=5,
        8usize..400,
        0.005f64..0.3,
        any::<u64>(),
        1usize..=4,
        1u32..=3,
    )
}

fn params(density: f64, reeval: u32, seed: u64) -> Params {
    Params {
        keep: gradkit_core::keep::Keep::Density(density),
        reeval,
        period: 2,
        residual: true,
        seed,
        ..Params::default()
    }
}

/// Checks every rank's traffic of step `t` of `algo` against the accounting written here.
fn check_volume(
    algo: &str,
    p: usize,
    n: usize,
    k: usize,
    runs: &[RankRun],
    t: usize,
) -> Result<(), TestCaseError> {
    if !VOLUME.contains(&algo) {
        for (r, run) in runs.iter().enumerate() {
            let total = sent(&run.0[t].1);
            prop_assert!(
                p > 1 || total == 0,
                "{algo} t={t} rank {r}: P = 1 sends nothing"
            );
        }
        return Ok(());
    }
    let outs: Vec<&StepOutput> = runs.iter().map(|r| &r.0[t].0).collect();
    let sels: Vec<&Vec<u32>> = outs
        .iter()
        .map(|o| o.contributed.as_ref().expect("dense input: contributed"))
        .collect();
    let nnz: Vec<usize> = sels.iter().map(|s| s.len()).collect();
    for r in 0..p {
        let tr = &runs[r].0[t].1;
        let total = sent(tr);
        let ctx = format!("{algo} P={p} n={n} k={k} t={t} rank {r}");
        if p == 1 {
            prop_assert_eq!(total, 0, "{}: P = 1 sends nothing", ctx);
            continue;
        }
        match algo {
            // Table 1: allgather of every rank's COO, 2k(P−1) words when each |S_i| ≤ k.
            "topka" | "gaussiank" => {
                prop_assert_eq!(total, ring_allgatherv_sent(&nnz, r, 8), "{}", ctx);
                let kk = if algo == "topka" {
                    prop_assert!(nnz.iter().all(|&c| c <= k), "{}: top-k keeps ≤ k", ctx);
                    k
                } else {
                    *nnz.iter().max().unwrap()
                };
                let bound = 4.0 * gradkit_collectives::sparse::topka::cost(p, kk as f64).words;
                prop_assert!(total as f64 <= bound, "{}: {} B > {} B", ctx, total, bound);
            }
            // Table 1: reduction tree and broadcast of ≤ k entries: 4k log P words.
            "gtopk" => {
                prop_assert!(nnz.iter().all(|&c| c <= k));
                prop_assert!(sparse(outs[r]).len() <= k, "{}: result ≤ k", ctx);
                prop_assert!(
                    phase(tr, "reduce_tree").bytes_sent <= 8 * k as u64,
                    "{}",
                    ctx
                );
                let bound = 4.0 * gradkit_collectives::sparse::gtopk::cost(p, k as f64).words;
                prop_assert!(total as f64 <= bound, "{}: {} B > {} B", ctx, total, bound);
            }
            // SparCML: static regions i·n/P; the entries outside the own region go out in the
            // reduce; P sizes; then the reduced regions, sparse below n/2 entries, else dense.
            "topkdsa" => {
                let (lo, hi) = (r * n / p, (r + 1) * n / p);
                let out = sels[r]
                    .iter()
                    .filter(|&&i| (i as usize) < lo || (i as usize) >= hi)
                    .count() as u64;
                prop_assert_eq!(phase(tr, "reduce").bytes_sent, 8 * out, "{}", ctx);
                prop_assert_eq!(phase(tr, "allgather_sizes").bytes_sent, 8 * (p as u64 - 1));
                let ag = phase(tr, "allgatherv").bytes_sent;
                if metric(outs[r], "dense_allgather") == 1.0 {
                    let next = (r + 1) % p;
                    let own = (next + 1) * n / p - next * n / p;
                    prop_assert_eq!(ag, 4 * (n - own) as u64, "{}: dense path", ctx);
                    // Table 1's worst case: n(P−1)/P words for the dense allgather.
                    prop_assert!((ag as f64) <= 4.0 * (n as f64 * (p - 1) as f64 / p as f64 + 1.0));
                } else {
                    // The sparse path runs while 2·T < n (T = Σ reduced sizes): < n words.
                    prop_assert!(ag < 4 * n as u64, "{}: sparse path {} B", ctx, ag);
                }
            }
            // Split-and-reduce sends exactly the selection outside the own region (Step C);
            // on reuse steps Step D sends the P sizes and, unbalanced, every rank's kept part
            // of its region once around the ring. (Table 1's 6k(P−1)/P words presumes
            // balanced regions and local counts ≈ k, which random inputs do not promise per
            // rank; sparse_oktopk.rs checks it on a balanced trace.)
            "oktopk" => {
                let region_of = |o: &StepOutput| {
                    (
                        metric(o, "region_start") as u64,
                        metric(o, "region_end") as u64,
                    )
                };
                let (lo, hi) = region_of(outs[r]);
                let out = sels[r]
                    .iter()
                    .filter(|&&i| (i as u64) < lo || (i as u64) >= hi)
                    .count() as u64;
                prop_assert_eq!(phase(tr, "split_and_reduce").bytes_sent, 8 * out, "{}", ctx);
                // `--adjust ladder` (the default): a reuse step whose ladder cannot reach the
                // band re-evaluates exactly instead (metric th_fallback, docs/ALGORITHMS.md):
                // an allgatherv of every rank's reduced entries, and no Step D.
                let fell_back = outs[r]
                    .metrics
                    .iter()
                    .any(|m| m.0 == "th_fallback" && m.1 == 1.0);
                if fell_back {
                    // Rank q's reduced entries: the union of every rank's selection inside
                    // q's region (split_and_reduce keeps every index it received).
                    let reduced: Vec<usize> = outs
                        .iter()
                        .map(|o| {
                            let (a, b) = region_of(o);
                            let union: std::collections::BTreeSet<u32> = sels
                                .iter()
                                .flat_map(|s| s.iter().copied())
                                .filter(|&i| (i as u64) >= a && (i as u64) < b)
                                .collect();
                            union.len()
                        })
                        .collect();
                    prop_assert_eq!(
                        phase(tr, "th_re_evaluate").bytes_sent,
                        ring_allgatherv_sent(&reduced, r, 8),
                        "{}: fallback",
                        ctx
                    );
                    prop_assert_eq!(phase(tr, "balance_and_allgatherv").bytes_sent, 0, "{}", ctx);
                    prop_assert!(sparse(outs[r]).len() <= k, "{}: fallback keeps ≤ k", ctx);
                } else if metric(outs[r], "reevaluated") == 0.0
                    && metric(outs[r], "balanced") == 0.0
                {
                    let kept: Vec<usize> = outs
                        .iter()
                        .map(|o| {
                            let (a, b) = region_of(o);
                            let s = sparse(o);
                            s.indices
                                .iter()
                                .filter(|&&i| (i as u64) >= a && (i as u64) < b)
                                .count()
                        })
                        .collect();
                    prop_assert_eq!(
                        kept.iter().sum::<usize>(),
                        sparse(outs[r]).len(),
                        "{}: regions tile",
                        ctx
                    );
                    prop_assert_eq!(
                        phase(tr, "balance_and_allgatherv").bytes_sent,
                        8 * (p as u64 - 1) + ring_allgatherv_sent(&kept, r, 8),
                        "{}",
                        ctx
                    );
                }
            }
            // DEFT §3.5: counts (u64), the disjoint indices (u32), a ring allreduce of the
            // values at their union.
            "deft" => {
                let u = sparse(outs[r]).len();
                prop_assert_eq!(u, nnz.iter().sum::<usize>(), "{}: disjoint union", ctx);
                prop_assert_eq!(phase(tr, "allgather_counts").bytes_sent, 8 * (p as u64 - 1));
                prop_assert_eq!(
                    phase(tr, "allgather_indices").bytes_sent,
                    ring_allgatherv_sent(&nnz, r, 4),
                    "{}",
                    ctx
                );
                prop_assert_eq!(
                    phase(tr, "allreduce_values").bytes_sent,
                    cost::ring_bytes_sent(p, u, r),
                    "{}",
                    ctx
                );
            }
            other => unreachable!("{other}"),
        }
    }
    Ok(())
}

/// One case of [`sparse_reducers_send_what_table1_and_their_docs_say`].
fn volume_case(
    p: usize,
    n: usize,
    density: f64,
    seed: u64,
    steps: usize,
    reeval: u32,
) -> Result<(), TestCaseError> {
    let lay = common::layout(n as u64, 3);
    let g = gradients(seed, steps, p, n);
    let params = params(density, reeval, seed);
    let k = params.k_for(n as u64) as usize;
    for algo in sparse_algos() {
        let runs = run(algo, &params, &lay, &g);
        for t in 0..steps {
            check_volume(algo, p, n, k, &runs, t)?;
        }
    }
    Ok(())
}

/// Cases the random search once found (CI, 2026-11-29: Ok-Topk on a reuse step at P = 4).
#[test]
fn volume_cases_found_before() {
    let found = [(4, 87, 0.023148703375850593, 8281580954079998149, 2, 2)];
    for (p, n, density, seed, steps, reeval) in found {
        volume_case(p, n, density, seed, steps, reeval).unwrap();
    }
}

proptest! {
    #![proptest_config(gradkit_testkit::proptest_config(32))]

    #[test]
    fn sparse_reducers_send_what_table1_and_their_docs_say(
        (p, n, density, seed, steps, reeval) in world(),
    ) {
        volume_case(p, n, density, seed, steps, reeval)?;
    }

    #[test]
    fn sparse_error_feedback_conserves_the_gradient(
        (p, n, density, seed, steps, reeval) in world(),
    ) {
        let lay = common::layout(n as u64, 3);
        let g = gradients(seed, steps, p, n);
        let params = params(density, reeval, seed);
        // Σ_ranks Σ_t g_t, exact in f64.
        let mut fed = vec![0f64; n];
        for gt in &g {
            for gr in gt {
                for i in 0..n {
                    fed[i] += gr[i] as f64;
                }
            }
        }
        for algo in sparse_algos() {
            if algo == "gtopk" {
                // gTop-k drops entries at every tree level: a rank's entry can be cut below
                // the root while the same index still reaches the result from another
                // subtree, and Algorithm 2's "sent ∩ result" rule then zeroes it in the
                // residual although the result never summed it. Conservation does not hold
                // for gTop-k (this property finds a counterexample at P = 3 within a few
                // cases), so it is left out here.
                eprintln!("gtopk: skipped (the sent ∩ result residual rule loses entries cut inside the tree)");
                continue;
            }
            let runs = run(algo, &params, &lay, &g);
            let mut out = vec![0f64; n];
            for t in 0..steps {
                let s = sparse(&runs[0].0[t].0);
                for (&i, &v) in s.indices.iter().zip(&s.values) {
                    out[i as usize] += v as f64;
                }
            }
            let mut missing = false;
            for r in 0..p {
                match runs[r].1.iter().find(|(name, _)| name == "residual") {
                    Some((_, res)) => {
                        prop_assert_eq!(res.len(), n);
                        for i in 0..n {
                            out[i] += res[i] as f64;
                        }
                    }
                    None => missing = true,
                }
            }
            if missing {
                eprintln!("{algo}: Reducer::state() has no `residual`; conservation not checked");
                continue;
            }
            for i in 0..n {
                let tol = 1e-9 * (1.0 + fed[i].abs());
                prop_assert!(
                    (out[i] - fed[i]).abs() <= tol,
                    "{} P={} n={} t={} i={}: Σ results + Σ residuals = {} but Σ g = {}",
                    algo, p, n, steps, i, out[i], fed[i]
                );
            }
        }
    }

    #[test]
    fn onebit_result_plus_errors_account_for_every_input(
        p in 1usize..=5,
        n in 1usize..300,
        seed in any::<u64>(),
        steps in 1usize..=4,
    ) {
        let lay = common::layout(n as u64, 3);
        let g = gradients(seed, steps, p, n);
        let runs = run("onebit", &Params::default(), &lay, &g);
        let mut res = vec![0f64; n];
        let mut scale = vec![0f64; n];
        for t in 0..steps {
            let Flat::Dense(d) = &runs[0].0[t].0.result else { panic!("dense result") };
            prop_assert_eq!(d.len(), n);
            for i in 0..n {
                res[i] += d[i] as f64;
                scale[i] += d[i].abs() as f64;
            }
        }
        if p == 1 {
            // DeepSpeed skips the compressed allreduce on one rank: the output is the input.
            for i in 0..n {
                let want: f64 = g.iter().map(|gt| gt[0][i] as f64).sum();
                prop_assert_eq!(res[i], want);
            }
            return Ok(());
        }
        let get = |r: usize, name: &str| -> Vec<f32> {
            runs[r].1.iter().find(|(k, _)| k == name).unwrap_or_else(|| panic!("state {name}")).1.clone()
        };
        let server: Vec<f32> = (0..p).flat_map(|r| get(r, "server_error")).collect();
        let worker: Vec<Vec<f32>> = (0..p).map(|r| get(r, "worker_error")).collect();
        prop_assert_eq!(server.len(), worker[0].len(), "server chunks tile the padded buffer");
        for i in 0..n {
            let x: f64 = g.iter().flat_map(|gt| gt.iter().map(move |gr| gr[i] as f64)).sum();
            let ew: f64 = worker.iter().map(|w| w[i] as f64).sum();
            let lhs = res[i] + server[i] as f64;
            let rhs = (x - ew) / p as f64;
            let mag: f64 = g.iter().flat_map(|gt| gt.iter().map(move |gr| gr[i].abs() as f64)).sum::<f64>()
                + worker.iter().map(|w| w[i].abs() as f64).sum::<f64>()
                + scale[i] + (server[i].abs() as f64);
            prop_assert!(
                (lhs - rhs).abs() <= 1e-5 * (1.0 + mag),
                "P={} n={} i={}: Σ result + server error = {} but (Σ x − Σ worker error)/P = {}",
                p, n, i, lhs, rhs
            );
        }
    }
}
