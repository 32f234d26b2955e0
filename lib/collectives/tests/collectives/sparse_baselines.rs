//! TopkA, TopkDSA, gTopk and Gaussiank against references written here (dense sums, a
//! BTreeMap re-implementation of the gTop-k tree), with exact traffic per rank.

use std::collections::BTreeMap;

use gradkit_collectives::registry::Params;
use gradkit_collectives::{make_reducer, Flat, StepOutput};
use gradkit_comm::{run_local, PhaseCounts};
use gradkit_core::keep::Keep;
use gradkit_core::trace::{Layout, Sparse};

use crate::common;
use common::{rand_sparse, Rng};

fn layout(n: u64) -> Layout {
    common::layout(n, 3)
}

fn dense_sum(inputs: &[Sparse], n: usize) -> Vec<f64> {
    let mut d = vec![0f64; n];
    for s in inputs {
        for (&i, &v) in s.indices.iter().zip(&s.values) {
            d[i as usize] += v as f64;
        }
    }
    d
}

fn as_f64(s: &Sparse, n: usize) -> Vec<f64> {
    s.to_dense(n).into_iter().map(|v| v as f64).collect()
}

fn sparse_of(o: &StepOutput) -> &Sparse {
    match &o.result {
        Flat::Sparse(s) => s,
        Flat::Dense(_) => panic!("sparse algorithms return sparse results"),
    }
}

fn metric(o: &StepOutput, name: &str) -> f64 {
    o.metrics
        .iter()
        .find(|m| m.0 == name)
        .unwrap_or_else(|| panic!("metric {name}"))
        .1
}

/// Runs one step of `algo` on P ranks with rank r's input `inputs[r]`; returns each rank's
/// output and per-phase traffic.
fn run_step(
    algo: &str,
    params: &Params,
    layout: &Layout,
    inputs: &[Flat],
) -> Vec<(StepOutput, BTreeMap<String, PhaseCounts>)> {
    let p = inputs.len();
    run_local(p, |comm| {
        let mut red = make_reducer(algo, params)?;
        let out = red.reduce(comm, 0, layout, inputs[comm.rank()].clone())?;
        Ok((out, comm.traffic().snapshot()))
    })
    .unwrap()
}

fn total(t: &BTreeMap<String, PhaseCounts>) -> PhaseCounts {
    let mut c = PhaseCounts::default();
    for v in t.values() {
        c.add(v);
    }
    c
}

#[test]
fn topka_is_the_dense_sum_with_exact_allgather_traffic() {
    let n = 1000u64;
    for p in [1usize, 2, 3, 4, 5, 8] {
        let mut rng = Rng::new(p as u64);
        let mut ins: Vec<Sparse> = (0..p).map(|_| rand_sparse(&mut rng, n, 60)).collect();
        if p > 2 {
            ins[1] = Sparse::default(); // an empty selection must work
        }
        let flats: Vec<Flat> = ins.iter().cloned().map(Flat::Sparse).collect();
        let outs = run_step("topka", &Params::default(), &layout(n), &flats);
        let want = dense_sum(&ins, n as usize);
        for (r, (o, t)) in outs.iter().enumerate() {
            assert_eq!(as_f64(sparse_of(o), n as usize), want, "P={p} rank {r}");
            assert_eq!(
                sparse_of(o),
                sparse_of(&outs[0].0),
                "identical on every rank"
            );
            let tot = total(t);
            let sent: usize = (0..p)
                .filter(|&i| i != (r + 1) % p)
                .map(|i| ins[i].len())
                .sum();
            let recv: usize = (0..p).filter(|&i| i != r).map(|i| ins[i].len()).sum();
            if p == 1 {
                assert_eq!(tot.bytes_sent + tot.bytes_recv, 0);
            } else {
                assert_eq!(tot.bytes_sent, 8 * sent as u64, "P={p} rank {r}");
                assert_eq!(tot.bytes_recv, 8 * recv as u64, "P={p} rank {r}");
                assert_eq!(tot.msgs_sent, 2 * (p as u64 - 1));
            }
        }
    }
}

#[test]
fn topka_volume_is_table1s_2k_p_minus_1_with_k_entries_each() {
    let (n, k) = (4096u64, 64usize);
    for p in [2usize, 4, 7] {
        let mut rng = Rng::new(11);
        let ins: Vec<Sparse> = (0..p)
            .map(|_| {
                let mut s = rand_sparse(&mut rng, n, 4 * k);
                s.indices.truncate(k);
                s.values.truncate(k);
                s
            })
            .collect();
        assert!(ins.iter().all(|s| s.len() == k));
        let flats: Vec<Flat> = ins.iter().cloned().map(Flat::Sparse).collect();
        let outs = run_step("topka", &Params::default(), &layout(n), &flats);
        let words = gradkit_collectives::sparse::topka::cost(p, k as f64).words;
        for (_, t) in &outs {
            assert_eq!(total(t).bytes_sent as f64, 4.0 * words);
        }
    }
}

#[test]
fn topkdsa_is_the_dense_sum_on_both_paths() {
    let n = 600u64;
    let mut saw = [false, false];
    for p in [1usize, 2, 3, 4, 6] {
        for m in [10usize, 300] {
            let mut rng = Rng::new(100 + p as u64 + m as u64);
            let ins: Vec<Sparse> = (0..p).map(|_| rand_sparse(&mut rng, n, m)).collect();
            let flats: Vec<Flat> = ins.iter().cloned().map(Flat::Sparse).collect();
            let outs = run_step("topkdsa", &Params::default(), &layout(n), &flats);
            let want = dense_sum(&ins, n as usize);
            // Reduced regions: equal static regions i·n/P.
            let reg = |i: usize| (i as u64 * n / p as u64, (i as u64 + 1) * n / p as u64);
            let union: std::collections::BTreeSet<u32> =
                ins.iter().flat_map(|s| s.indices.iter().copied()).collect();
            let nz_union = union.iter().filter(|&&j| want[j as usize] != 0.0).count() as u64;
            let dense = 2 * nz_union >= n;
            for (r, (o, t)) in outs.iter().enumerate() {
                assert_eq!(
                    as_f64(sparse_of(o), n as usize),
                    want,
                    "P={p} m={m} rank {r}"
                );
                assert_eq!(sparse_of(o), sparse_of(&outs[0].0));
                assert_eq!(metric(o, "dense_allgather") == 1.0, dense);
                saw[dense as usize] = true;
                // reduce phase: 8 bytes per selected entry outside the own region.
                let (lo, hi) = reg(r);
                let out = ins[r]
                    .indices
                    .iter()
                    .filter(|&&i| (i as u64) < lo || (i as u64) >= hi)
                    .count();
                let red = t.get("reduce").copied().unwrap_or_default();
                assert_eq!(red.bytes_sent, 8 * out as u64, "P={p} m={m} rank {r}");
            }
        }
    }
    assert!(
        saw[0] && saw[1],
        "both the sparse and the dense allgather ran"
    );
}

/// gTop-k's tree written out on BTreeMaps: fold ranks ≥ p' into r − p', then levels.
fn gtopk_reference(ins: &[Sparse], k: usize) -> BTreeMap<u32, f64> {
    let p = ins.len();
    let topk = |m: BTreeMap<u32, f64>| -> BTreeMap<u32, f64> {
        let mut v: Vec<(u32, f64)> = m.into_iter().collect();
        v.sort_by(|a, b| {
            b.1.abs()
                .partial_cmp(&a.1.abs())
                .unwrap()
                .then(a.0.cmp(&b.0))
        });
        v.truncate(k);
        v.into_iter().collect()
    };
    let add = |mut a: BTreeMap<u32, f64>, b: &BTreeMap<u32, f64>| {
        for (i, v) in b {
            *a.entry(*i).or_insert(0.0) += v;
        }
        a
    };
    let mut v: Vec<BTreeMap<u32, f64>> = ins
        .iter()
        .map(|s| {
            s.indices
                .iter()
                .copied()
                .zip(s.values.iter().map(|&x| x as f64))
                .collect()
        })
        .collect();
    if p == 1 {
        return v.pop().unwrap();
    }
    let mut pp = 1;
    while pp * 2 <= p {
        pp *= 2;
    }
    for r in pp..p {
        let b = v[r].clone();
        v[r - pp] = topk(add(std::mem::take(&mut v[r - pp]), &b));
    }
    let mut half = 1;
    while half < pp {
        for r in (0..pp).step_by(2 * half) {
            let b = v[r + half].clone();
            v[r] = topk(add(std::mem::take(&mut v[r]), &b));
        }
        half *= 2;
    }
    v.swap_remove(0)
}

#[test]
fn gtopk_equals_the_tree_formula() {
    let n = 500u64;
    let k = 25usize;
    for p in [1usize, 2, 3, 4, 6, 8] {
        let mut rng = Rng::new(7 + p as u64);
        let ins: Vec<Sparse> = (0..p).map(|_| rand_sparse(&mut rng, n, k)).collect();
        let flats: Vec<Flat> = ins.iter().cloned().map(Flat::Sparse).collect();
        let params = Params {
            keep: Keep::K(k as u64),
            ..Params::default()
        };
        let outs = run_step("gtopk", &params, &layout(n), &flats);
        let want = gtopk_reference(&ins, k);
        for (r, (o, t)) in outs.iter().enumerate() {
            let got: BTreeMap<u32, f64> = sparse_of(o)
                .indices
                .iter()
                .copied()
                .zip(sparse_of(o).values.iter().map(|&x| x as f64))
                .collect();
            assert_eq!(got, want, "P={p} rank {r}");
            // Every tree message carries at most k entries; the root broadcasts ⌈log2 P⌉ times.
            let tree = t.get("reduce_tree").copied().unwrap_or_default();
            assert!(
                tree.bytes_sent <= 8 * k as u64,
                "one send of ≤ k entries per rank"
            );
            if r == 0 && p > 1 {
                let b = t["broadcast"];
                let rounds = (p as f64).log2().ceil() as u64;
                assert_eq!(b.bytes_sent, 8 * want.len() as u64 * rounds);
            }
        }
    }
}

#[test]
fn gaussiank_selects_above_its_threshold_and_sums_like_topka() {
    let n = 4000usize;
    let p = 3;
    let params = Params {
        keep: Keep::Density(0.01),
        ..Params::default()
    };
    let k = params.k_for(n as u64) as usize;
    let mut rng = Rng::new(5);
    let grads: Vec<Vec<f32>> = (0..p)
        .map(|_| {
            (0..n)
                .map(|_| rng.val() * (1.0 + (rng.below(4) as f32)))
                .collect()
        })
        .collect();
    let flats: Vec<Flat> = grads.iter().cloned().map(Flat::Dense).collect();
    let outs = run_step("gaussiank", &params, &layout(n as u64), &flats);
    let mut sels = Vec::new();
    for (r, (o, _)) in outs.iter().enumerate() {
        let th = metric(o, "threshold") as f32;
        let want: Vec<u32> = (0..n as u32)
            .filter(|&i| grads[r][i as usize].abs() > th)
            .collect();
        assert_eq!(
            o.contributed.as_ref().unwrap(),
            &want,
            "rank {r}: exactly {{|x| > th}}"
        );
        assert!(
            want.len() * 4 >= 3 * k,
            "at least 3k/4 pass (fairness rule)"
        );
        sels.push(Sparse {
            values: want.iter().map(|&i| grads[r][i as usize]).collect(),
            indices: want,
        });
    }
    let sum = dense_sum(&sels, n);
    for (o, _) in &outs {
        assert_eq!(as_f64(sparse_of(o), n), sum);
    }
}

#[test]
fn dense_input_error_feedback_conserves_the_gradient() {
    // Σ_t g_t = Σ_t (what this rank sent and got kept) + residual, per rank (TopkA: all sent
    // entries are kept). Checked through the results: Σ_r Σ_t g = Σ_t u_t + Σ_r residual_T,
    // with residual_T = acc after the last step, derived here independently.
    let n = 300usize;
    let p = 2;
    let steps = 3;
    let params = Params {
        keep: Keep::K(10),
        ..Params::default()
    };
    let mut rng = Rng::new(9);
    let g: Vec<Vec<Vec<f32>>> = (0..steps)
        .map(|_| {
            (0..p)
                .map(|_| (0..n).map(|_| rng.val()).collect())
                .collect()
        })
        .collect();
    let lay = layout(n as u64);
    let outs = run_local(p, |comm| {
        let mut red = make_reducer("topka", &params)?;
        let mut v = Vec::new();
        for (t, gt) in g.iter().enumerate() {
            v.push(red.reduce(comm, t as u32, &lay, Flat::Dense(gt[comm.rank()].clone()))?);
        }
        Ok(v)
    })
    .unwrap();
    // Σ_t u_t (every rank holds the same result) and Σ_r Σ_t g_t, in f64 (exact: dyadics).
    let mut lhs = vec![0f64; n];
    let mut fed = vec![0f64; n];
    for t in 0..steps {
        for (a, b) in lhs.iter_mut().zip(as_f64(sparse_of(&outs[0][t]), n)) {
            *a += b;
        }
        for gr in &g[t] {
            for (a, b) in fed.iter_mut().zip(gr) {
                *a += *b as f64;
            }
        }
    }
    for r in 0..p {
        // Reference error feedback: acc = res + g; select = contributed; res = acc − acc[sel].
        let mut res = vec![0f32; n];
        for t in 0..steps {
            let acc: Vec<f32> = res.iter().zip(&g[t][r]).map(|(a, b)| a + b).collect();
            // Independent top-k: sort by |acc| desc, index asc.
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&a, &b| {
                acc[b]
                    .abs()
                    .partial_cmp(&acc[a].abs())
                    .unwrap()
                    .then(a.cmp(&b))
            });
            let mut sel: Vec<u32> = order[..10].iter().map(|&i| i as u32).collect();
            sel.sort_unstable();
            assert_eq!(
                outs[r][t].contributed.as_ref().unwrap(),
                &sel,
                "rank {r} step {t}"
            );
            res = acc;
            for &i in &sel {
                res[i as usize] = 0.0;
            }
        }
        for (a, b) in lhs.iter_mut().zip(&res) {
            *a += *b as f64;
        }
    }
    // Conservation: Σ_r Σ_t g = Σ_t u_t + Σ_r residual_T, element by element.
    assert_eq!(
        lhs, fed,
        "results plus residuals account for every gradient"
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let lay = layout(100);
    // Mixed dense and sparse steps in one run.
    let err = run_local(2, |comm| {
        let mut red = make_reducer("topka", &Params::default())?;
        red.reduce(comm, 0, &lay, Flat::Dense(vec![1.0; 100]))?;
        red.reduce(comm, 1, &lay, Flat::Sparse(Sparse::default()))?;
        Ok(())
    })
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("mixed dense and sparse"),
        "{err:#}"
    );
    // Wrong length and unsorted indices.
    for (algo, input, want) in [
        (
            "gtopk",
            Flat::Dense(vec![1.0; 99]),
            "dense input has 99 values",
        ),
        (
            "topkdsa",
            Flat::Sparse(Sparse {
                indices: vec![5, 3],
                values: vec![1.0, 1.0],
            }),
            "not strictly ascending",
        ),
        (
            "gaussiank",
            Flat::Sparse(Sparse {
                indices: vec![100],
                values: vec![1.0],
            }),
            "outside the model",
        ),
    ] {
        let err = run_local(1, |comm| {
            make_reducer(algo, &Params::default())?.reduce(comm, 0, &lay, input.clone())
        })
        .unwrap_err();
        assert!(format!("{err:#}").contains(want), "{algo}: {err:#}");
    }
}
