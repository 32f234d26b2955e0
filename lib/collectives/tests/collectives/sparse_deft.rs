//! DEFT's exchange against a reference written here: disjoint selections, result
//! Σ_i acc_i at the union, residuals zeroed at the union, exact traffic per phase.

#![allow(clippy::needless_range_loop)] // ranks × steps tables read clearest by index

use std::collections::BTreeSet;

use gradkit_collectives::registry::Params;
use gradkit_collectives::{make_reducer, Flat, StepOutput};
use gradkit_comm::{run_local, PhaseCounts};
use gradkit_core::keep::Keep;
use gradkit_core::trace::{Layout, Sparse};
use gradkit_core::PlanRow;

use crate::common;
use common::{res, Rng};

type Out = Vec<Vec<(StepOutput, std::collections::BTreeMap<String, PhaseCounts>)>>;

fn run(p: usize, params: &Params, lay: &Layout, g: &[Vec<Vec<f32>>]) -> Out {
    run_local(p, |comm| {
        let mut red = make_reducer("deft", params)?;
        let mut v = Vec::new();
        for (t, gt) in g.iter().enumerate() {
            comm.traffic().reset();
            let o = red.reduce(comm, t as u32, lay, Flat::Dense(gt[comm.rank()].clone()))?;
            v.push((o, comm.traffic().snapshot()));
        }
        Ok(v)
    })
    .unwrap()
}

/// Bytes a ring allreduce of m f32 sends from rank r: every chunk but r+1's in the
/// reduce-scatter, every chunk but r+2's in the allgather (chunks cut at i·m/P).
fn ring_sent(p: usize, m: usize, r: usize) -> u64 {
    if p == 1 {
        return 0;
    }
    let c = |i: usize| (i + 1) * m / p - i * m / p;
    4 * (2 * m - c((r + 1) % p) - c((r + 2) % p)) as u64
}

#[test]
fn deft_sums_every_rank_at_the_disjoint_union() {
    // A layer larger than n/P (split into P pieces) and small ones.
    let lay = Layout::new(vec![
        (0, "big".into(), 900, None),
        (1, "b1".into(), 40, None),
        (2, "mid".into(), 250, None),
        (3, "b2".into(), 10, None),
    ]);
    let n = lay.total() as usize;
    for p in [1usize, 2, 3, 4] {
        let steps = 3;
        let mut rng = Rng::new(p as u64);
        let g: Vec<Vec<Vec<f32>>> = (0..steps)
            .map(|_| {
                (0..p)
                    .map(|_| (0..n).map(|_| rng.val()).collect())
                    .collect()
            })
            .collect();
        let params = Params {
            keep: Keep::Density(0.02),
            ..Params::default()
        };
        let outs = run(p, &params, &lay, &g);
        let mut eps = vec![vec![0f32; n]; p];
        for t in 0..steps {
            let acc: Vec<Vec<f32>> = (0..p)
                .map(|r| eps[r].iter().zip(&g[t][r]).map(|(a, b)| a + b).collect())
                .collect();
            let sels: Vec<&Vec<u32>> = (0..p)
                .map(|r| outs[r][t].0.contributed.as_ref().unwrap())
                .collect();
            let union: BTreeSet<u32> = sels.iter().flat_map(|s| s.iter().copied()).collect();
            let total: usize = sels.iter().map(|s| s.len()).sum();
            assert_eq!(union.len(), total, "P={p} t={t}: selections are disjoint");
            let k = params.k_for(n as u64) as usize;
            assert!(total >= k, "Σ k_x ≥ k");
            let idx: Vec<u32> = union.iter().copied().collect();
            let want: Vec<f32> = idx
                .iter()
                .map(|&j| (0..p).map(|r| acc[r][j as usize] as f64).sum::<f64>() as f32)
                .collect();
            for r in 0..p {
                let o = res(&outs[r][t].0);
                assert_eq!(o.indices, idx, "P={p} t={t} rank {r}");
                assert_eq!(o.values, want, "P={p} t={t} rank {r}");
                let tr = &outs[r][t].1;
                let sent_idx: usize = (0..p)
                    .filter(|&i| i != (r + 1) % p)
                    .map(|i| sels[i].len())
                    .sum();
                let ph = |n: &str| tr.get(n).copied().unwrap_or_default();
                if p > 1 {
                    assert_eq!(ph("allgather_indices").bytes_sent, 4 * sent_idx as u64);
                    assert_eq!(ph("allgather_counts").bytes_sent, 8 * (p as u64 - 1));
                    assert_eq!(ph("plan").bytes_recv % 4, 0);
                }
                assert_eq!(
                    ph("allreduce_values").bytes_sent,
                    ring_sent(p, idx.len(), r)
                );
            }
            for r in 0..p {
                eps[r] = acc[r].clone();
                for &j in &idx {
                    eps[r][j as usize] = 0.0;
                }
            }
        }
    }
}

#[test]
fn deft_with_a_plan_selects_topk_per_row() {
    let lay = Layout::new(vec![(0, "a".into(), 100, None), (1, "b".into(), 300, None)]);
    let row = |w: u32, l: u32, s: u64, e: u64, k: u64| PlanRow {
        step: 0,
        worker: w,
        layer_id: l,
        layer: if l == 0 { "a".into() } else { "b".into() },
        start: s,
        end: e,
        k: Some(k),
    };
    let plan = vec![
        row(0, 0, 0, 100, 5),
        row(1, 1, 0, 150, 7),
        row(0, 1, 150, 300, 3),
    ];
    let params = Params {
        plan: Some(plan.clone()),
        ..Params::default()
    };
    let mut rng = Rng::new(9);
    let g: Vec<Vec<Vec<f32>>> = vec![(0..2)
        .map(|_| (0..400).map(|_| rng.val()).collect())
        .collect()];
    let outs = run(2, &params, &lay, &g);
    // Reference: top-k by |x| (ties to lower index) in each of the rank's flat ranges.
    let topk = |x: &[f32], lo: usize, hi: usize, k: usize| {
        let mut o: Vec<usize> = (lo..hi).collect();
        o.sort_by(|&a, &b| x[b].abs().partial_cmp(&x[a].abs()).unwrap().then(a.cmp(&b)));
        o[..k].iter().map(|&i| i as u32).collect::<Vec<u32>>()
    };
    let mut s0 = topk(&g[0][0], 0, 100, 5);
    s0.extend(topk(&g[0][0], 250, 400, 3));
    s0.sort_unstable();
    let mut s1 = topk(&g[0][1], 100, 250, 7);
    s1.sort_unstable();
    assert_eq!(outs[0][0].0.contributed.as_ref().unwrap(), &s0);
    assert_eq!(outs[1][0].0.contributed.as_ref().unwrap(), &s1);
    let mut union = s0.clone();
    union.extend(&s1);
    union.sort_unstable();
    for r in 0..2 {
        let o = res(&outs[r][0].0);
        assert_eq!(o.indices, union);
        let want: Vec<f32> = union
            .iter()
            .map(|&j| g[0][0][j as usize] + g[0][1][j as usize])
            .collect();
        assert_eq!(o.values, want);
        assert!(
            !outs[r][0].1.contains_key("plan"),
            "no plan broadcast with --plan"
        );
    }
    // Errors: sparse input; a plan for another P.
    let err = run_local(2, |comm| {
        make_reducer("deft", &params)?.reduce(comm, 0, &lay, Flat::Sparse(Sparse::default()))
    })
    .unwrap_err();
    assert!(format!("{err:#}").contains("needs dense input"), "{err:#}");
    let err = run_local(3, |comm| {
        make_reducer("deft", &params)?.reduce(comm, 0, &lay, Flat::Dense(vec![0.0; 400]))
    })
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("plan is for 2 workers but the world has 3 ranks"),
        "{err:#}"
    );
}
