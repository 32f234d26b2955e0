//! The selection-side time breakdown of DEFT and its two baselines (DEFT Figs. 7 and 9 split
//! into selection, norms and bin packing, broadcast and communication): which rank spends
//! time on what, and that the parts are inside `time_select_s`. No wall-clock limits: only
//! where a part must be zero and how the intervals nest.

use std::collections::BTreeMap;

use gradkit_collectives::registry::Params;
use gradkit_collectives::{make_reducer, Flat, StepOutput};
use gradkit_comm::{run_local, PhaseCounts};
use gradkit_core::keep::Keep;
use gradkit_core::trace::Layout;
use gradkit_core::PlanRow;

use crate::common;
use common::Rng;

type Out = Vec<Vec<(StepOutput, BTreeMap<String, PhaseCounts>)>>;

fn run(algo: &str, p: usize, params: &Params, lay: &Layout, steps: usize) -> Out {
    let n = lay.total() as usize;
    let mut rng = Rng::new(p as u64 + 17);
    let g: Vec<Vec<Vec<f32>>> = (0..steps)
        .map(|_| {
            (0..p)
                .map(|_| (0..n).map(|_| rng.val()).collect())
                .collect()
        })
        .collect();
    run_local(p, |comm| {
        let mut red = make_reducer(algo, params)?;
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

fn metric(o: &StepOutput, name: &str) -> f64 {
    o.metrics
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no metric {name} in {:?}", o.metrics))
        .1
}

fn layout() -> Layout {
    Layout::new(vec![
        (0, "big".into(), 900, None),
        (1, "b1".into(), 40, None),
        (2, "mid".into(), 250, None),
        (3, "b2".into(), 10, None),
    ])
}

#[test]
fn deft_times_norms_bin_packing_and_its_top_k_apart() {
    let lay = layout();
    let params = Params {
        keep: Keep::Density(0.02),
        ..Params::default()
    };
    for p in [1usize, 2, 3, 4] {
        let outs = run("deft", p, &params, &lay, 5);
        for (r, steps) in outs.iter().enumerate() {
            for (t, (o, _)) in steps.iter().enumerate() {
                let (norms, pack, topk) = (
                    metric(o, "time_norms_s"),
                    metric(o, "time_binpack_s"),
                    metric(o, "time_topk_s"),
                );
                assert!(
                    norms >= 0.0 && pack >= 0.0 && topk >= 0.0,
                    "P={p} r={r} t={t}"
                );
                // Only the rotating leader (step mod P) bin-packs; the others wait for its table.
                if r != t % p {
                    assert_eq!(pack, 0.0, "P={p} r={r} t={t}: a non-leader bin-packed");
                }
                // Each part is timed inside the selection's own interval.
                assert!(
                    norms + pack + topk <= metric(o, "time_select_s"),
                    "P={p} r={r} t={t}: parts exceed time_select_s"
                );
            }
        }
    }
}

#[test]
fn deft_with_a_plan_computes_no_norms_and_packs_nothing() {
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
    let params = Params {
        plan: Some(vec![
            row(0, 0, 0, 100, 5),
            row(1, 1, 0, 150, 7),
            row(0, 1, 150, 300, 3),
        ]),
        ..Params::default()
    };
    for steps in run("deft", 2, &params, &lay, 1) {
        let o = &steps[0].0;
        assert_eq!(metric(o, "time_norms_s"), 0.0);
        assert_eq!(metric(o, "time_binpack_s"), 0.0);
        assert!(metric(o, "time_topk_s") <= metric(o, "time_select_s"));
    }
}

#[test]
fn the_baselines_time_their_top_k_where_it_runs() {
    let lay = layout();
    let params = Params {
        keep: Keep::Density(0.02),
        ..Params::default()
    };
    for p in [1usize, 2, 3] {
        for algo in ["topk-union", "cltk"] {
            let outs = run(algo, p, &params, &lay, 4);
            for (r, steps) in outs.iter().enumerate() {
                for (t, (o, _)) in steps.iter().enumerate() {
                    let topk = metric(o, "time_topk_s");
                    assert!(
                        topk >= 0.0 && topk <= metric(o, "time_select_s"),
                        "{algo} P={p}"
                    );
                    // CLT-k: only the leader selects.
                    if algo == "cltk" && r != t % p {
                        assert_eq!(topk, 0.0, "{algo} P={p} r={r} t={t}");
                    }
                }
            }
        }
    }
}
