//! docs/ALGORITHMS.md: for every sparse exchange, "gradselect then gradallreduce" and "gradallreduce
//! on dense input" (what gradtrain's sparse exchange runs) give identical selections, sums and
//! residuals, step by step, for P = 1..=5.
//!
//! Path (a): the reducer with `residual: true` fed `Flat::Dense(g)` (its own selection and
//! error feedback). Path (b): per rank a `Residual` and the `Selector` gradselect would use for
//! that algorithm, then a second reducer of the same algorithm with `residual: false` fed the
//! selection as `Flat::Sparse`, then `Residual::settle` with the algorithm's `Leaves` rule.
//! Both run side by side on the same heavy-tailed, mostly-zero gradients (with entries that
//! cancel exactly to 0 across ranks at selected indices). Besides (a) == (b) bit for bit, each
//! step is checked against references written here: the selection against `acc` (top-k order,
//! threshold sets), the residual against a mask of the rule, and the sums against f64 sums of
//! the values the ranks sent.
//!
//! DEFT refuses sparse input (it sends every rank's values at the gathered indices), so its
//! path (b) is a reference computed here from the public planning API (pieces, per-rank k
//! allocation from the rank's own norms, the leader's bin-packing, per-range top-k; what
//! `gradselect --method deft` does) and an f64 sum of every rank's accumulator at the union.

use std::collections::{BTreeMap, BTreeSet};

use gradkit_collectives::registry::{Adjust, Balance, Bands, Params};
use gradkit_collectives::{make_reducer, Flat, StepOutput};
use gradkit_comm::run_local;
use gradkit_core::trace::{Layout, Sparse};
use gradkit_partition::deft as pdeft;
use gradkit_sparsify::{Leaves, Method, Residual, Selector};

use crate::common;
use common::{res, Rng};

const STEPS: usize = 5;

/// A large power of two: selected on every rank wherever it is placed, and exactly cancelled
/// by its negation.
const BIG: f32 = 4096.0;

/// One case: model size (two layers), density, and the gradients `g[rank][step]`.
struct Case {
    n: usize,
    layout: Layout,
    density: f64,
    grads: Vec<Vec<Vec<f32>>>,
    /// `(step, index, ranks)`: where `ranks` put ±BIG-multiples summing to exactly 0.
    cancels: Vec<(usize, usize, Vec<usize>)>,
}

/// Heavy-tailed, mostly zero: an entry is 0 with probability `zero`, else ±scale·Pareto(1.5).
fn heavy_tailed(rng: &mut Rng, n: usize, zero: f64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u = rng.next() as f64 / u64::MAX as f64;
            if u < zero {
                return 0.0;
            }
            let v = (rng.next() >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
            let mag = 1e-3 * (1.0 - v).powf(-1.0 / 1.5);
            let s = if rng.next() & 1 == 0 { 1.0 } else { -1.0 };
            (s * mag) as f32
        })
        .collect()
}

fn make_case(seed: u64, p: usize, n: usize, density: f64, zero: f64) -> Case {
    let mut rng = Rng::new(seed);
    let mut grads: Vec<Vec<Vec<f32>>> = (0..p)
        .map(|_| {
            (0..STEPS)
                .map(|_| heavy_tailed(&mut rng, n, zero))
                .collect()
        })
        .collect();
    let mut cancels = Vec::new();
    // Step 0 (every residual is empty, so acc = g): two ranks cancel at j1, three at j2.
    let j1 = n / 3 + 7;
    let j2 = n - 5;
    if p >= 2 {
        grads[0][0][j1] = BIG;
        grads[1][0][j1] = -BIG;
        for g in grads.iter_mut().skip(2) {
            g[0][j1] = 0.0;
        }
        cancels.push((0, j1, vec![0, 1]));
    }
    if p >= 3 {
        grads[0][0][j2] = 0.5 * BIG;
        grads[1][0][j2] = 0.75 * BIG;
        grads[2][0][j2] = -1.25 * BIG;
        for g in grads.iter_mut().skip(3) {
            g[0][j2] = 0.0;
        }
        cancels.push((0, j2, vec![0, 1, 2]));
    }
    // Step 3: j3 is 0 on every rank before (so every residual is exactly 0 there), then the
    // last two ranks cancel.
    let j3 = 11;
    if p >= 2 {
        for g in grads.iter_mut() {
            for s in g.iter_mut().take(3) {
                s[j3] = 0.0;
            }
            g[3][j3] = 0.0;
        }
        grads[p - 2][3][j3] = -2.0 * BIG;
        grads[p - 1][3][j3] = 2.0 * BIG;
        cancels.push((3, j3, vec![p - 2, p - 1]));
    }
    Case {
        n,
        layout: common::layout(n as u64, 3),
        density,
        grads,
        cancels,
    }
}

/// Which entries leave the residual after each algorithm's exchange (Ok-Topk Algorithm 2).
fn rule(algo: &str) -> Leaves {
    match algo {
        "topka" | "topkdsa" | "gaussiank" => Leaves::Sent,
        "gtopk" | "oktopk" => Leaves::SentInResult,
        "deft" => Leaves::Result,
        _ => unreachable!("{algo}"),
    }
}

/// The selection method gradselect uses for the algorithm.
fn method(algo: &str, params: &Params) -> Method {
    match algo {
        "topka" | "topkdsa" | "gtopk" => Method::Topk,
        "gaussiank" => Method::GaussianK,
        "oktopk" => Method::OkTopk {
            reeval: params.reeval,
            adjust: params.adjust,
        },
        _ => unreachable!("{algo}"),
    }
}

/// One rank's step on both paths.
#[derive(Clone, Debug)]
struct RankStep {
    /// Path (a): the reducer's own selection, result, residual and threshold metric.
    contributed: Vec<u32>,
    result_a: Sparse,
    residual_a: Vec<f32>,
    threshold_a: Option<f64>,
    /// Path (a)'s metrics: TopkDSA's `dense_allgather`, Ok-Topk's `balanced`.
    flags_a: (bool, bool),
    /// Path (b): acc = residual + g, gradselect's selection, the reducer's result on it, the
    /// residual after `settle`, and gradselect's own `update` (Sent rule).
    acc: Vec<f32>,
    sel: Sparse,
    sel_threshold: Option<f32>,
    sel_exact: bool,
    result_b: Sparse,
    residual_b: Vec<f32>,
    residual_update: Vec<f32>,
}

fn metric(o: &StepOutput, name: &str) -> Option<f64> {
    o.metrics.iter().find(|m| m.0 == name).map(|m| m.1)
}

/// Runs both paths of `algo` on P = `case.grads.len()` ranks; returns `[rank][step]`.
fn run_paths(algo: &str, params: &Params, case: &Case) -> Vec<Vec<RankStep>> {
    let p = case.grads.len();
    let k = params.k_for(case.n as u64) as usize;
    run_local(p, |comm| {
        let r = comm.rank();
        let mut a = make_reducer(
            algo,
            &Params {
                residual: true,
                ..params.clone()
            },
        )?;
        assert!(a.state().is_empty(), "{algo}: state before the first step");
        let mut b = make_reducer(
            algo,
            &Params {
                residual: false,
                ..params.clone()
            },
        )?;
        let mut selector = Selector::new(method(algo, params), 0);
        let mut residual = Residual::default();
        let mut gradselect = Residual::default();
        let mut out = Vec::new();
        for (t, g) in case.grads[r].iter().enumerate() {
            let step = t as u32;
            // (a) gradallreduce on dense input
            let oa = a.reduce(comm, step, &case.layout, Flat::Dense(g.clone()))?;
            let contributed = oa.contributed.clone().expect("dense input: contributed");
            // (b) gradselect, then gradallreduce on its selection, then settle
            let acc = residual.accumulate(g.clone());
            let s = selector.select(step, &acc, k);
            let sel = Sparse {
                indices: s.indices.clone(),
                values: s.values.clone(),
            };
            let ob = b.reduce(comm, step, &case.layout, Flat::Sparse(sel.clone()))?;
            assert!(
                b.state().iter().all(|(name, _)| name != "residual"),
                "{algo}: residual kept with residual off"
            );
            let result_b = res(&ob).clone();
            residual.settle(acc.clone(), rule(algo), &sel.indices, &result_b.indices);
            let upd_acc = gradselect.accumulate(g.clone());
            gradselect.update(upd_acc, &sel.indices);
            out.push(RankStep {
                contributed,
                result_a: res(&oa).clone(),
                residual_a: common::residual_of(&a.state()),
                threshold_a: metric(&oa, "threshold"),
                flags_a: (
                    metric(&oa, "dense_allgather") == Some(1.0),
                    metric(&oa, "balanced") == Some(1.0),
                ),
                acc,
                sel_threshold: s.info.threshold,
                sel_exact: s.info.exact_topk,
                sel,
                result_b,
                residual_b: residual.values.clone(),
                residual_update: gradselect.values.clone(),
            });
        }
        Ok(out)
    })
    .unwrap()
}

/// Asserts two f32 vectors are bit-identical, naming the first difference.
fn same_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!("{what}: first difference at {i}: {:e} vs {:e}", a[i], b[i]);
    }
}

fn same_sparse(a: &Sparse, b: &Sparse, what: &str) {
    assert_eq!(a.indices, b.indices, "{what}: indices");
    same_bits(&a.values, &b.values, &format!("{what}: values"));
}

/// The residual the rule leaves, computed here from a mask (not with `Residual::settle`).
fn expected_residual(acc: &[f32], rule: Leaves, sent: &[u32], result: &[u32]) -> Vec<f32> {
    let sent: BTreeSet<u32> = sent.iter().copied().collect();
    let result: BTreeSet<u32> = result.iter().copied().collect();
    (0..acc.len())
        .map(|i| {
            let i32_ = i as u32;
            let leaves = match rule {
                Leaves::Sent => sent.contains(&i32_),
                Leaves::SentInResult => sent.contains(&i32_) && result.contains(&i32_),
                Leaves::Result => result.contains(&i32_),
            };
            if leaves {
                0.0
            } else {
                acc[i]
            }
        })
        .collect()
}

/// `sel` is an exact top-k of `acc` by |x| (min(k, candidates) entries, every selected
/// magnitude ≥ every unselected one); `nonzero_only`: exact zeros are not candidates.
fn check_topk(acc: &[f32], sel: &[u32], k: usize, nonzero_only: bool, what: &str) {
    let cands = if nonzero_only {
        acc.iter().filter(|v| **v != 0.0).count()
    } else {
        acc.len()
    };
    assert_eq!(sel.len(), k.min(cands), "{what}: top-k size");
    let chosen: BTreeSet<u32> = sel.iter().copied().collect();
    let min_in = sel
        .iter()
        .map(|&i| acc[i as usize].abs())
        .fold(f32::INFINITY, f32::min);
    let max_out = (0..acc.len() as u32)
        .filter(|i| !chosen.contains(i))
        .map(|i| acc[i as usize].abs())
        .fold(0.0, f32::max);
    assert!(
        sel.is_empty() || min_in >= max_out,
        "{what}: selected |x| ≥ {min_in:e} but an unselected |x| is {max_out:e}"
    );
}

/// `sel` is exactly `{i : |acc_i| > th}`.
fn check_threshold_set(acc: &[f32], sel: &[u32], th: f32, what: &str) {
    let want: Vec<u32> = (0..acc.len() as u32)
        .filter(|&i| acc[i as usize].abs() > th)
        .collect();
    assert_eq!(sel, want.as_slice(), "{what}: {{|acc| > {th:e}}}");
}

/// f64 sum and f64 sum of magnitudes of the values the ranks sent, per index.
fn sent_sums(ranks: &[&Sparse]) -> BTreeMap<u32, (f64, f64)> {
    let mut m: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    for s in ranks {
        for (&i, &v) in s.indices.iter().zip(&s.values) {
            let e = m.entry(i).or_default();
            e.0 += v as f64;
            e.1 += (v as f64).abs();
        }
    }
    m
}

fn close(got: f32, want: (f64, f64)) -> bool {
    (got as f64 - want.0).abs() <= 1e-6 * want.1
}

/// Checks one algorithm on one case: (a) against (b) bit for bit, and both against the
/// references above. Returns how many selected entries cancelled to exactly 0 in a result.
/// What a run exercised, so that a test can show its cases are not vacuous.
#[derive(Debug, Default)]
struct Seen {
    /// Selected entries whose sum cancelled to an explicit 0 in the result.
    zero_sums: usize,
    /// (rank, step)s whose selection was a reused threshold (Ok-Topk) …
    reuse: usize,
    /// … whose TopkDSA exchange took the dense path, or the sparse one …
    dense_allgather: usize,
    sparse_allgather: usize,
    /// … on which Ok-Topk balanced its buffers …
    balanced: usize,
    /// … and on which some sent entry is not in the result (so `Leaves::Sent` and
    /// `Leaves::SentInResult` leave different residuals).
    dropped: usize,
}

impl Seen {
    fn add(&mut self, o: Seen) {
        self.zero_sums += o.zero_sums;
        self.reuse += o.reuse;
        self.dense_allgather += o.dense_allgather;
        self.sparse_allgather += o.sparse_allgather;
        self.balanced += o.balanced;
        self.dropped += o.dropped;
    }
}

fn check_algo(algo: &str, params: &Params, case: &Case, label: &str) -> Seen {
    let p = case.grads.len();
    let k = params.k_for(case.n as u64) as usize;
    let runs = run_paths(algo, params, case);
    let rule = rule(algo);
    let mut seen = Seen::default();
    for t in 0..STEPS {
        let what = |r: usize| format!("{label} {algo} P={p} step {t} rank {r}");
        for (r, rank) in runs.iter().enumerate() {
            let s = &rank[t];
            let w = what(r);
            // The independent accumulator: (b)'s residual of the previous step + g, one f32 add.
            let acc_ref: Vec<f32> = match t {
                0 => case.grads[r][0].clone(),
                _ => rank[t - 1]
                    .residual_b
                    .iter()
                    .zip(&case.grads[r][t])
                    .map(|(a, b)| a + b)
                    .collect(),
            };
            same_bits(&s.acc, &acc_ref, &format!("{w}: acc"));
            // Selection: gradselect's == the reducer's own, and what the method promises.
            assert_eq!(
                s.sel.indices, s.contributed,
                "{w}: selection vs contributed"
            );
            let gathered: Vec<f32> = s.sel.indices.iter().map(|&i| s.acc[i as usize]).collect();
            same_bits(&s.sel.values, &gathered, &format!("{w}: selected values"));
            match algo {
                "topka" | "topkdsa" | "gtopk" => check_topk(&s.acc, &s.sel.indices, k, false, &w),
                "gaussiank" => {
                    let th = s.sel_threshold.expect("gaussiank threshold");
                    check_threshold_set(&s.acc, &s.sel.indices, th, &w);
                    let nz = s.acc.iter().filter(|v| **v != 0.0).count();
                    assert!(s.sel.len() >= (3 * k).div_ceil(4).min(nz), "{w}: ≥ 3k/4");
                    assert_eq!(s.threshold_a, Some(th as f64), "{w}: threshold metric");
                }
                "oktopk" => {
                    let th = s.sel_threshold.expect("oktopk threshold");
                    if s.sel_exact {
                        check_topk(&s.acc, &s.sel.indices, k, true, &w);
                    } else {
                        check_threshold_set(&s.acc, &s.sel.indices, th, &w);
                    }
                    assert_eq!(s.threshold_a, Some(th as f64), "{w}: threshold metric");
                }
                _ => unreachable!(),
            }
            // Result: (a) == (b), and the same bits on every rank.
            same_sparse(&s.result_a, &s.result_b, &format!("{w}: result (a) vs (b)"));
            same_sparse(
                &s.result_a,
                &runs[0][t].result_a,
                &format!("{w}: vs rank 0"),
            );
            // Residual: (a) == (b) == the rule's mask; Sent: gradselect's update agrees.
            let want = expected_residual(&s.acc, rule, &s.sel.indices, &s.result_a.indices);
            same_bits(&s.residual_b, &want, &format!("{w}: residual (b) vs rule"));
            same_bits(
                &s.residual_a,
                &s.residual_b,
                &format!("{w}: residual (a) vs (b)"),
            );
            seen.reuse += usize::from(algo == "oktopk" && !s.sel_exact);
            seen.dense_allgather += usize::from(s.flags_a.0);
            seen.sparse_allgather += usize::from(algo == "topkdsa" && !s.flags_a.0);
            seen.balanced += usize::from(s.flags_a.1);
            let support: BTreeSet<u32> = s.result_a.indices.iter().copied().collect();
            if s.sel.indices.iter().any(|i| !support.contains(i)) {
                seen.dropped += 1;
            }
            if rule == Leaves::Sent {
                same_bits(
                    &s.residual_update,
                    &s.residual_b,
                    &format!("{w}: gradselect's update vs settle"),
                );
            }
        }
        // The sums against the values the ranks sent (f64).
        let sent: Vec<&Sparse> = runs.iter().map(|rk| &rk[t].sel).collect();
        let sums = sent_sums(&sent);
        let result = &runs[0][t].result_a;
        let w = what(0);
        for (&i, &v) in result.indices.iter().zip(&result.values) {
            let Some(&want) = sums.get(&i) else {
                panic!("{w}: result index {i} that no rank sent");
            };
            if algo != "gtopk" {
                assert!(close(v, want), "{w}: sum at {i}: {v:e} vs {:e}", want.0);
            }
        }
        match algo {
            // TopkA, Gaussiank: exactly the union of the selections, zeros kept.
            "topka" | "gaussiank" => {
                let union: Vec<u32> = sums.keys().copied().collect();
                assert_eq!(result.indices, union, "{w}: support is the union");
            }
            // TopkDSA: the union, less the sums that are 0 on the dense path.
            "topkdsa" => {
                let kept: BTreeSet<u32> = result.indices.iter().copied().collect();
                for (i, want) in &sums {
                    assert!(
                        kept.contains(i) || want.0.abs() <= 1e-6 * want.1,
                        "{w}: index {i} (sum {:e}) missing",
                        want.0
                    );
                }
            }
            "gtopk" => assert!(result.len() <= k, "{w}: gtopk keeps ≤ k"),
            _ => {}
        }
        for (step, j, ranks) in &case.cancels {
            if *step != t {
                continue;
            }
            for &r in ranks {
                assert!(
                    runs[r][t].sel.indices.binary_search(&(*j as u32)).is_ok(),
                    "{w}: rank {r} did not select the cancelling index {j}"
                );
            }
            if let Ok(pos) = result.indices.binary_search(&(*j as u32)) {
                assert_eq!(result.values[pos], 0.0, "{w}: cancelled sum at {j}");
                seen.zero_sums += 1;
            }
        }
    }
    seen
}

fn cases() -> Vec<(String, Case)> {
    let mut v = Vec::new();
    for p in 1..=5usize {
        v.push((
            "sparse".into(),
            make_case(100 + p as u64, p, 4999, 0.01, 0.6),
        ));
        // Dense enough that TopkDSA takes its dense allgather path for P ≥ 2.
        v.push((
            "dense".into(),
            make_case(200 + p as u64, p, 2003, 0.15, 0.5),
        ));
    }
    v
}

fn params(density: f64) -> Params {
    Params {
        keep: gradkit_core::keep::Keep::Density(density),
        period: 3,
        reeval: 2,
        ..Params::default()
    }
}

#[test]
fn select_then_allreduce_equals_allreduce_on_dense_input() {
    for algo in ["topka", "topkdsa", "gtopk", "gaussiank"] {
        let mut seen = Seen::default();
        for (label, case) in cases() {
            seen.add(check_algo(algo, &params(case.density), &case, &label));
        }
        // The cases are exercised: TopkA and Gaussiank keep a cancelled sum as an explicit 0;
        // TopkDSA takes both of its paths; gTop-k's tree drops sent entries (its residual
        // differs from the Sent rule's).
        match algo {
            "topka" | "gaussiank" => assert!(seen.zero_sums > 0, "{algo}: {seen:?}"),
            "topkdsa" => assert!(
                seen.dense_allgather > 0 && seen.sparse_allgather > 0,
                "{algo}: {seen:?}"
            ),
            "gtopk" => assert!(seen.dropped > 0, "{algo}: {seen:?}"),
            _ => {}
        }
    }
}

#[test]
fn oktopk_select_then_allreduce_equals_allreduce_on_dense_input() {
    for adjust in [Adjust::Ladder, Adjust::Paper, Adjust::Reference(Bands::VGG)] {
        let mut seen = Seen::default();
        for (label, case) in cases() {
            for balance in [Balance::Auto, Balance::Always] {
                let ps = Params {
                    adjust,
                    balance,
                    ..params(case.density)
                };
                let label = format!("{label} {} {balance}", adjust.label());
                seen.add(check_algo("oktopk", &ps, &case, &label));
            }
        }
        // Reuse steps ran, balancing ran, and the global selection dropped sent entries.
        let what = adjust.label();
        assert!(
            seen.reuse > 0 && seen.balanced > 0 && seen.dropped > 0,
            "{what}: {seen:?}"
        );
    }
}

/// DEFT needs dense input, so path (b) is computed here: gradselect's DEFT selection (the
/// leader's plan, each rank's own k per piece, top-k per range), then the f64 sum of every
/// rank's accumulator at the union, and the Result rule.
#[test]
fn deft_on_dense_input_equals_the_reference() {
    for (label, case) in cases() {
        let p = case.grads.len();
        let params = params(case.density);
        let k = params.k_for(case.n as u64);
        let lay = &case.layout;
        let runs: Vec<Vec<(StepOutput, Vec<f32>)>> = run_local(p, |comm| {
            let mut red = make_reducer("deft", &params)?;
            let mut v = Vec::new();
            for (t, g) in case.grads[comm.rank()].iter().enumerate() {
                let o = red.reduce(comm, t as u32, lay, Flat::Dense(g.clone()))?;
                v.push((o, common::residual_of(&red.state())));
            }
            Ok(v)
        })
        .unwrap();
        let pieces = pdeft::pieces(lay, p);
        let mut residuals: Vec<Vec<f32>> = vec![Vec::new(); p];
        for t in 0..STEPS {
            let w = format!("{label} deft P={p} step {t}");
            let accs: Vec<Vec<f32>> = (0..p)
                .map(|r| {
                    let g = &case.grads[r][t];
                    match residuals[r].is_empty() {
                        true => g.clone(),
                        false => residuals[r].iter().zip(g).map(|(a, b)| a + b).collect(),
                    }
                })
                .collect();
            let leader = t % p;
            let rows = pdeft::plan_step(lay, &pieces, &accs[leader], k, p, t as u32, false);
            let worker_of = |pc: &pdeft::Piece| {
                let id = lay.layers[pc.layer].layer_id;
                rows.iter()
                    .find(|row| row.layer_id == id && row.start == pc.start && row.end == pc.end)
                    .expect("every piece has a plan row")
                    .worker as usize
            };
            let sels: Vec<Vec<u32>> = (0..p)
                .map(|r| {
                    let norms = pdeft::piece_norms(lay, &pieces, &accs[r]);
                    let ks = pdeft::allocate_k(&pieces, &norms, k, false);
                    let ranges: Vec<(usize, usize, usize)> = pieces
                        .iter()
                        .zip(&ks)
                        .filter(|(pc, _)| worker_of(pc) == r)
                        .map(|(pc, &kx)| {
                            let rg = pc.flat_range(lay);
                            (rg.start, rg.end, kx as usize)
                        })
                        .collect();
                    gradkit_sparsify::deft::select_in_ranges(&accs[r], &ranges)
                })
                .collect();
            let mut union: Vec<u32> = sels.concat();
            union.sort_unstable();
            for (r, rank) in runs.iter().enumerate() {
                let (o, state) = &rank[t];
                assert_eq!(
                    o.contributed.as_ref(),
                    Some(&sels[r]),
                    "{w} rank {r}: selection"
                );
                let got = res(o);
                same_sparse(got, res(&runs[0][t].0), &format!("{w} rank {r}: vs rank 0"));
                assert_eq!(got.indices, union, "{w} rank {r}: support is the union");
                for (&i, &v) in got.indices.iter().zip(&got.values) {
                    let sum: f64 = accs.iter().map(|a| a[i as usize] as f64).sum();
                    let mag: f64 = accs.iter().map(|a| (a[i as usize] as f64).abs()).sum();
                    assert!(close(v, (sum, mag)), "{w}: sum at {i}: {v:e} vs {sum:e}");
                }
                let want = expected_residual(&accs[r], Leaves::Result, &sels[r], &union);
                same_bits(state, &want, &format!("{w} rank {r}: residual"));
                let mut settled = Residual::default();
                settled.settle(accs[r].clone(), Leaves::Result, &sels[r], &union);
                same_bits(&settled.values, &want, &format!("{w} rank {r}: settle"));
            }
            for (r, acc) in accs.into_iter().enumerate() {
                residuals[r] = expected_residual(&acc, Leaves::Result, &sels[r], &union);
            }
            // The cancelling entries: DEFT sums every rank's accumulator at the union.
            for (step, j, _) in &case.cancels {
                if *step == t {
                    if let Ok(pos) = union.binary_search(&(*j as u32)) {
                        assert_eq!(res(&runs[0][t].0).values[pos], 0.0, "{w}: cancelled sum");
                    }
                }
            }
        }
    }
}

/// Gradients where one rank's accumulator has fewer non-zeros than k: all zero on step 0, a
/// handful of non-zeros on step 1 (an idle rank, a frozen part of the model).
fn few_nonzeros_case(p: usize) -> Case {
    let mut case = make_case(300 + p as u64, p, 2003, 0.05, 0.6);
    case.cancels.clear();
    let last = p - 1;
    case.grads[last][0].iter_mut().for_each(|v| *v = 0.0);
    for (i, v) in case.grads[last][1].iter_mut().enumerate() {
        if i % 400 != 3 {
            *v = 0.0;
        }
    }
    case
}

#[test]
fn fewer_nonzeros_than_k_threshold_methods() {
    for algo in ["gaussiank", "oktopk"] {
        for p in 1..=3usize {
            let case = few_nonzeros_case(p);
            check_algo(algo, &params(case.density), &case, "few-nonzeros");
        }
    }
}

/// Known disagreement: with fewer than k non-zeros in `acc`, gradselect's top-k
/// (`Method::Topk`, `Kernels::topk_with_values`) fills k with exact zeros, while the reducers'
/// own selection (`sparse::select_topk`) drops them; the sums then differ in their support
/// (explicit zeros at the indices gradselect padded with), the residuals do not.
#[test]
fn fewer_nonzeros_than_k_topk() {
    for algo in ["topka", "topkdsa", "gtopk"] {
        for p in 1..=3usize {
            let case = few_nonzeros_case(p);
            check_algo(algo, &params(case.density), &case, "few-nonzeros");
        }
    }
}
