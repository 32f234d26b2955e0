//! Top-k (union) (DEFT Algorithm 1 with Top-k as `Sparsify`; deft.md §1.0) against a
//! reference written here: every rank picks the exact top-k of its own accumulator (by
//! sorting), the result is the f64 sum over ranks of their accumulators at the union of the
//! picks, every residual is its accumulator with the union zeroed; every rank's bytes and
//! messages per phase follow the ring allgatherv of k indices + the ring allreduce of the
//! union's values, held against `sparse::topk_union::bytes_sent` (every rank) and
//! `sparse::topk_union::cost` (when P divides the union).

#![allow(clippy::needless_range_loop)] // ranks × steps tables read clearest by index

use gradkit_collectives::registry::Params;
use gradkit_collectives::{make_reducer, Flat, Op};
use gradkit_comm::run_local;
use gradkit_core::keep::Keep;
use gradkit_core::trace::{Layout, Sparse};

use crate::common;
use common::{res, ring_bytes, run_steps, topk_by_sorting, Out};

fn run(p: usize, params: &Params, lay: &Layout, g: &[Vec<Vec<f32>>]) -> Out {
    run_steps("topk-union", p, params, lay, g)
}

/// Heavy-tailed gradients: a standard normal times a log-normal scale e^{1.5·N(0,1)}; rank
/// r's gradients share a common part (correlated top-k, as real replicas' are) with weight
/// `common`.
fn gradients(seed: u64, steps: usize, p: usize, n: usize, common: f64) -> Vec<Vec<Vec<f32>>> {
    let mut rng = gradkit_testkit::rng::Rng::new(seed);
    let draw = |rng: &mut gradkit_testkit::rng::Rng| {
        let z = rng.normal_f64();
        z * (1.5 * rng.normal_f64()).exp()
    };
    (0..steps)
        .map(|_| {
            let shared: Vec<f64> = (0..n).map(|_| draw(&mut rng)).collect();
            (0..p)
                .map(|_| {
                    (0..n)
                        .map(|j| (common * shared[j] + draw(&mut rng)) as f32)
                        .collect()
                })
                .collect()
        })
        .collect()
}

#[test]
fn topk_union_matches_a_dense_reference_and_its_traffic() {
    // (n, density, steps, weight of the shared part): k = 24 and k = 3 (< P for P = 4, 5).
    let cases = [
        (1200u64, 0.02, 6usize, 0.0),
        (1200, 0.02, 6, 2.0),
        (150, 0.02, 5, 0.5),
    ];
    let mut unions_seen = Vec::new();
    for (ci, &(n64, density, steps, common)) in cases.iter().enumerate() {
        let lay = common::layout(n64, 3);
        let n = n64 as usize;
        for p in 1..=5usize {
            for seed in [1u64, 2] {
                let g = gradients(1000 * ci as u64 + 10 * p as u64 + seed, steps, p, n, common);
                let params = Params {
                    keep: Keep::Density(density),
                    ..Params::default()
                };
                let k = (density * n as f64).floor() as usize;
                let outs = run(p, &params, &lay, &g);
                let mut eps = vec![vec![0f32; n]; p];
                let mut sum_results = vec![0f64; n];
                for t in 0..steps {
                    let ctx0 = format!("case {ci} P={p} seed {seed} t={t}");
                    let acc: Vec<Vec<f32>> = (0..p)
                        .map(|r| eps[r].iter().zip(&g[t][r]).map(|(e, x)| e + x).collect())
                        .collect();
                    let sel: Vec<Vec<u32>> = (0..p).map(|r| topk_by_sorting(&acc[r], k)).collect();
                    let mut union: Vec<u32> = sel.concat();
                    union.sort_unstable();
                    union.dedup();
                    let u = union.len();
                    assert!(u >= k && u <= (p * k).min(n), "{ctx0}: union {u}");
                    unions_seen.push((p, k, u));
                    let first = res(&outs[0][t].0).clone();
                    for r in 0..p {
                        let ctx = format!("{ctx0} rank {r}");
                        let (o, tr, residual) = &outs[r][t];
                        let s = res(o);
                        // (1) the union, Σ_i acc_i there, the same bits on every rank.
                        assert_eq!(s.indices, union, "{ctx}: indices");
                        for (&i, &v) in union.iter().zip(&s.values) {
                            let want: f64 = (0..p).map(|q| acc[q][i as usize] as f64).sum();
                            let scale: f64 =
                                (0..p).map(|q| (acc[q][i as usize] as f64).abs()).sum();
                            assert!(
                                (v as f64 - want).abs() <= 1e-6 * scale,
                                "{ctx}: value at {i}: {v} vs {want}"
                            );
                        }
                        let bits =
                            |x: &Sparse| x.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(s), bits(&first), "{ctx}: identical bits on every rank");
                        assert_eq!(
                            o.contributed.as_deref(),
                            Some(&sel[r][..]),
                            "{ctx}: contributed"
                        );
                        let m = |name: &str| o.metrics.iter().find(|m| m.0 == name).map(|m| m.1);
                        assert_eq!(m("local_nnz"), Some(k as f64), "{ctx}");
                        assert_eq!(m("k"), Some(k as f64), "{ctx}");

                        // (2) residual = acc with the union zeroed; its norm is the metric.
                        let mut want_res = acc[r].clone();
                        for &i in &union {
                            want_res[i as usize] = 0.0;
                        }
                        assert_eq!(residual, &want_res, "{ctx}: residual");
                        let norm = want_res
                            .iter()
                            .map(|&v| (v as f64) * (v as f64))
                            .sum::<f64>()
                            .sqrt();
                        let got = m("residual_norm").expect("residual_norm");
                        assert!(
                            (got - norm).abs() <= 1e-9 * norm.max(1.0),
                            "{ctx}: residual_norm {got} vs {norm}"
                        );

                        // (3) traffic per phase, and the cost model's exact bytes.
                        let ph = |name: &str| tr.get(name).copied().unwrap_or_default();
                        let a = ph("allgather_indices");
                        let pm1 = p as u64 - 1;
                        assert_eq!(
                            (a.msgs_sent, a.msgs_recv),
                            (pm1, pm1),
                            "{ctx}: allgather messages"
                        );
                        let idx_bytes = 4 * k as u64 * pm1;
                        assert_eq!(
                            (a.bytes_sent, a.bytes_recv),
                            (idx_bytes, idx_bytes),
                            "{ctx}: allgather bytes"
                        );
                        let v = ph("allreduce_values");
                        let (sent, recv) = ring_bytes(p, u, r);
                        assert_eq!(
                            (v.msgs_sent, v.msgs_recv),
                            (2 * pm1, 2 * pm1),
                            "{ctx}: ring messages"
                        );
                        assert_eq!(
                            (v.bytes_sent, v.bytes_recv),
                            (sent, recv),
                            "{ctx}: ring bytes"
                        );
                        let total: u64 = tr.values().map(|c| c.bytes_sent).sum();
                        let msgs: u64 = tr.values().map(|c| c.msgs_sent).sum();
                        assert_eq!(
                            total,
                            gradkit_collectives::sparse::topk_union::bytes_sent(p, k, u, r),
                            "{ctx}: exact bytes"
                        );
                        let c =
                            gradkit_collectives::sparse::topk_union::cost(p, k as f64, u as f64);
                        assert_eq!(msgs as f64, c.latency, "{ctx}: α terms");
                        if u.is_multiple_of(p) {
                            assert_eq!(total as f64, c.bytes(), "{ctx}: words");
                        }
                    }
                    for (i, v) in first.indices.iter().zip(&first.values) {
                        sum_results[*i as usize] += *v as f64;
                    }
                    // The next step's residual, from this reference alone.
                    for r in 0..p {
                        eps[r] = acc[r].clone();
                        for &i in &union {
                            eps[r][i as usize] = 0.0;
                        }
                    }
                }
                // Conservation: Σ_t Σ_r g = Σ_t result + Σ_r residual, element by element.
                for j in 0..n {
                    let (mut sum_g, mut abs_g) = (0f64, 0f64);
                    for t in 0..steps {
                        for r in 0..p {
                            sum_g += g[t][r][j] as f64;
                            abs_g += (g[t][r][j] as f64).abs();
                        }
                    }
                    let sum_res: f64 = (0..p).map(|r| outs[r][steps - 1].2[j] as f64).sum();
                    let got = sum_results[j] + sum_res;
                    assert!(
                        (got - sum_g).abs() <= 1e-5 * abs_g,
                        "case {ci} P={p} element {j}: {got} vs Σg {sum_g}"
                    );
                }
            }
        }
    }
    // The cases cover build-up (union > k) and full overlap is possible but not forced.
    assert!(unions_seen.iter().any(|&(p, k, u)| p > 1 && u > k));
    assert!(unions_seen.iter().any(|&(p, k, u)| p > 1 && u < p * k));
}

#[test]
fn mean_divides_by_p_and_no_feedback_keeps_no_residual() {
    let (n, p) = (600u64, 3usize);
    let lay = common::layout(n, 2);
    let g = gradients(7, 3, p, n as usize, 1.0);
    let k = 12usize;
    let sum = run(
        p,
        &Params {
            keep: Keep::K(k as u64),
            ..Params::default()
        },
        &lay,
        &g,
    );
    let mean = run(
        p,
        &Params {
            keep: Keep::K(k as u64),
            op: Op::Mean,
            residual: false,
            ..Params::default()
        },
        &lay,
        &g,
    );
    // Step 0: no residual yet either way, so the mean is the sum / P.
    let (s, m) = (res(&sum[0][0].0), res(&mean[0][0].0));
    assert_eq!(s.indices, m.indices);
    for (a, b) in s.values.iter().zip(&m.values) {
        assert_eq!(*b, *a * (1.0 / p as f32));
    }
    for r in 0..p {
        for t in 0..3 {
            assert!(mean[r][t].2.is_empty(), "no residual without feedback");
            assert!(mean[r][t].0.metrics.iter().all(|m| m.0 != "residual_norm"));
            // Without feedback every step is its own: the union of the gradients' top-k.
            let mut union: Vec<u32> = (0..p).flat_map(|q| topk_by_sorting(&g[t][q], k)).collect();
            union.sort_unstable();
            union.dedup();
            assert_eq!(res(&mean[r][t].0).indices, union, "t={t} rank {r}");
        }
    }
}

#[test]
fn sparse_input_is_refused_naming_topk_union() {
    let lay = common::layout(100, 2);
    let err = run_local(2, |comm| {
        let mut red = make_reducer("topk-union", &Params::default())?;
        let s = Sparse {
            indices: vec![1, 5],
            values: vec![1.0, 2.0],
        };
        red.reduce(comm, 0, &lay, Flat::Sparse(s)).map(|_| ())
    })
    .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("topk-union") && msg.contains("dense input"),
        "{msg}"
    );
}
