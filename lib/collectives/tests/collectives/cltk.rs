//! CLT-k (DEFT §1, §3.1, Table 1; Chen et al. 2020) against a reference written here: the
//! leader (t mod P) picks the exact top-k of its own accumulator (by sorting), the result is
//! the f64 sum over ranks of their accumulators there, every residual is its accumulator with
//! the leader's indices zeroed, and every rank's bytes and messages per phase follow the
//! binomial broadcast + ring allreduce, held against `cost::cltk` for the leader.

#![allow(clippy::needless_range_loop)] // ranks × steps tables read clearest by index

use gradkit_collectives::registry::Params;
use gradkit_collectives::{cost, make_reducer, Flat, Op};
use gradkit_comm::run_local;
use gradkit_core::keep::Keep;
use gradkit_core::trace::{Layout, Sparse};

use crate::common;
use common::{res, ring_bytes, run_steps, topk_by_sorting, Out};

fn run(p: usize, params: &Params, lay: &Layout, g: &[Vec<Vec<f32>>]) -> Out {
    run_steps("cltk", p, params, lay, g)
}

/// Heavy-tailed gradients: a standard normal times a log-normal scale e^{1.5·N(0,1)}.
fn gradients(seed: u64, steps: usize, p: usize, n: usize) -> Vec<Vec<Vec<f32>>> {
    let mut rng = gradkit_testkit::rng::Rng::new(seed);
    (0..steps)
        .map(|_| {
            (0..p)
                .map(|_| {
                    (0..n)
                        .map(|_| {
                            let z = rng.normal_f64();
                            (z * (1.5 * rng.normal_f64()).exp()) as f32
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Children of `r` in a binomial broadcast tree rooted at `root` among `p` ranks: with virtual
/// ranks v = (r − root) mod P, the parent of v > 0 is v with its highest set bit cleared.
fn bcast_children(p: usize, root: usize, r: usize) -> usize {
    let v = (r + p - root) % p;
    (1..p)
        .filter(|&c| c - (1usize << (usize::BITS - 1 - c.leading_zeros())) == v)
        .count()
}

struct Case {
    n: u64,
    density: f64,
    steps: usize,
}

const CASES: &[Case] = &[
    // k = 24: divisible by 1..4, not by 5.
    Case {
        n: 1200,
        density: 0.02,
        steps: 7,
    },
    // k = 3 < P for P = 4, 5: the ring carries empty chunks.
    Case {
        n: 150,
        density: 0.02,
        steps: 6,
    },
];

#[test]
fn cltk_matches_a_dense_reference_and_its_traffic() {
    for (ci, case) in CASES.iter().enumerate() {
        let lay = common::layout(case.n, 3);
        let n = case.n as usize;
        for p in 1..=5usize {
            let g = gradients(100 * ci as u64 + p as u64, case.steps, p, n);
            let params = Params {
                keep: Keep::Density(case.density),
                ..Params::default()
            };
            let k = (case.density * n as f64).floor() as usize;
            let outs = run(p, &params, &lay, &g);
            let mut eps = vec![vec![0f32; n]; p];
            let mut sum_results = vec![0f64; n];
            for t in 0..case.steps {
                let acc: Vec<Vec<f32>> = (0..p)
                    .map(|r| eps[r].iter().zip(&g[t][r]).map(|(e, x)| e + x).collect())
                    .collect();
                let leader = t % p;
                let idx = topk_by_sorting(&acc[leader], k);
                assert_eq!(idx.len(), k);
                let first = res(&outs[0][t].0).clone();
                for r in 0..p {
                    let ctx = format!("case {ci} P={p} t={t} rank {r}");
                    let (o, tr, residual) = &outs[r][t];
                    let s = res(o);
                    // (1) the leader's top-k, Σ_i acc_i there, the same bits on every rank.
                    assert_eq!(s.indices, idx, "{ctx}: indices");
                    for (j, (&i, &v)) in idx.iter().zip(&s.values).enumerate() {
                        let want: f64 = (0..p).map(|q| acc[q][i as usize] as f64).sum();
                        let scale: f64 = (0..p).map(|q| (acc[q][i as usize] as f64).abs()).sum();
                        assert!(
                            (v as f64 - want).abs() <= 1e-6 * scale,
                            "{ctx}: value {j} at {i}: {v} vs {want}"
                        );
                    }
                    assert_eq!(s.indices, first.indices, "{ctx}");
                    let bits =
                        |x: &Sparse| x.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(s), bits(&first), "{ctx}: identical bits on every rank");
                    assert_eq!(
                        o.contributed.as_deref(),
                        Some(&idx[..]),
                        "{ctx}: contributed"
                    );
                    let m = |name: &str| o.metrics.iter().find(|m| m.0 == name).map(|m| m.1);
                    assert_eq!(m("leader"), Some(leader as f64), "{ctx}");
                    assert_eq!(m("local_nnz"), Some(k as f64), "{ctx}");
                    assert_eq!(m("k"), Some(k as f64), "{ctx}");
                    let ts = m("time_select_s").expect("time_select_s");
                    assert!(ts >= 0.0 && (r == leader || ts == 0.0), "{ctx}: {ts}");

                    // (2) residual = acc with the leader's indices zeroed.
                    let mut want_res = acc[r].clone();
                    for &i in &idx {
                        want_res[i as usize] = 0.0;
                    }
                    assert_eq!(residual, &want_res, "{ctx}: residual");

                    // (3) traffic per phase.
                    let ph = |name: &str| tr.get(name).copied().unwrap_or_default();
                    let kids = bcast_children(p, leader, r) as u64;
                    let b = ph("broadcast_indices");
                    assert_eq!(b.msgs_sent, kids, "{ctx}: broadcast messages");
                    assert_eq!(b.bytes_sent, 4 * k as u64 * kids, "{ctx}: broadcast bytes");
                    let has_parent = u64::from(r != leader);
                    assert_eq!(b.msgs_recv, has_parent, "{ctx}");
                    assert_eq!(b.bytes_recv, 4 * k as u64 * has_parent, "{ctx}");
                    let a = ph("allreduce_values");
                    let (sent, recv) = ring_bytes(p, k, r);
                    let ring_msgs = 2 * (p as u64 - 1);
                    assert_eq!(
                        (a.msgs_sent, a.msgs_recv),
                        (ring_msgs, ring_msgs),
                        "{ctx}: ring messages"
                    );
                    assert_eq!(
                        (a.bytes_sent, a.bytes_recv),
                        (sent, recv),
                        "{ctx}: ring bytes"
                    );
                    let phases: Vec<&String> = tr
                        .iter()
                        .filter(|(_, c)| c.msgs_sent + c.msgs_recv > 0)
                        .map(|(n, _)| n)
                        .collect();
                    assert!(
                        phases
                            .iter()
                            .all(|n| *n == "broadcast_indices" || *n == "allreduce_values"),
                        "{ctx}: phases {phases:?}"
                    );
                    if r == leader {
                        // The leader is the busiest rank: the cost model's messages exactly,
                        // and its words exactly when P divides k (equal ring chunks).
                        let c = gradkit_collectives::sparse::cltk::cost(p, k as f64);
                        assert_eq!(kids as f64, cost::log2p(p), "{ctx}");
                        let total_msgs = b.msgs_sent + a.msgs_sent;
                        assert_eq!(total_msgs as f64, c.latency, "{ctx}: α terms");
                        let total_bytes = (b.bytes_sent + a.bytes_sent) as f64;
                        if k.is_multiple_of(p) {
                            assert_eq!(total_bytes, c.bytes(), "{ctx}: words");
                        }
                        for q in 0..p {
                            let other = &outs[q][t].1;
                            let sent_q: u64 = other.values().map(|c| c.bytes_sent).sum();
                            assert!(sent_q as f64 <= total_bytes, "{ctx}: rank {q} busier");
                        }
                    }
                }
                for (i, v) in first.indices.iter().zip(&first.values) {
                    sum_results[*i as usize] += *v as f64;
                }
                // The next step's residual, from this reference alone.
                for r in 0..p {
                    eps[r] = acc[r].clone();
                    for &i in &idx {
                        eps[r][i as usize] = 0.0;
                    }
                }
            }
            // Conservation: Σ_t Σ_r g = Σ_t result + Σ_r residual, element by element.
            for j in 0..n {
                let mut sum_g = 0f64;
                let mut abs_g = 0f64;
                for t in 0..case.steps {
                    for r in 0..p {
                        sum_g += g[t][r][j] as f64;
                        abs_g += (g[t][r][j] as f64).abs();
                    }
                }
                let sum_res: f64 = (0..p).map(|r| outs[r][case.steps - 1].2[j] as f64).sum();
                let got = sum_results[j] + sum_res;
                assert!(
                    (got - sum_g).abs() <= 1e-5 * abs_g,
                    "case {ci} P={p} element {j}: {got} vs Σg {sum_g}"
                );
            }
        }
    }
}

#[test]
fn mean_divides_by_p_and_no_feedback_keeps_no_residual() {
    let lay = common::layout(500, 2);
    let n = 500usize;
    for p in 1..=5usize {
        let g = gradients(7 + p as u64, 3, p, n);
        let params = Params {
            keep: Keep::K(11),
            op: Op::Mean,
            residual: false,
            ..Params::default()
        };
        let outs = run(p, &params, &lay, &g);
        for t in 0..3 {
            // Without error feedback the accumulator is the gradient itself.
            let idx = topk_by_sorting(&g[t][t % p], 11);
            for r in 0..p {
                let (o, _, residual) = &outs[r][t];
                let s = res(o);
                assert_eq!(s.indices, idx, "P={p} t={t} rank {r}");
                for (&i, &v) in idx.iter().zip(&s.values) {
                    let want: f64 =
                        (0..p).map(|q| g[t][q][i as usize] as f64).sum::<f64>() / p as f64;
                    let scale: f64 = (0..p).map(|q| (g[t][q][i as usize] as f64).abs()).sum();
                    assert!(
                        (v as f64 - want).abs() <= 1e-6 * scale,
                        "P={p} t={t} rank {r} at {i}: {v} vs {want}"
                    );
                }
                assert!(residual.is_empty(), "no residual without error feedback");
            }
        }
    }
}

#[test]
fn sparse_input_is_refused_naming_cltk() {
    let lay = common::layout(100, 2);
    for p in [1usize, 3] {
        let got = run_local(p, |comm| {
            let sel = Sparse {
                indices: vec![3, 40],
                values: vec![1.0, -2.0],
            };
            make_reducer("cltk", &Params::default())?.reduce(comm, 0, &lay, Flat::Sparse(sel))
        });
        let Err(err) = got else {
            panic!("P={p}: sparse input must be refused")
        };
        let msg = format!("{err:#}");
        assert!(msg.contains("cltk"), "{msg}");
        assert!(msg.contains("dense input"), "{msg}");
    }
}
