//! One implementation of Ok-Topk's local threshold reuse: the Ok-Topk collective
//! (`gradallreduce --algo oktopk`, `gradtrain --exchange oktopk`) and gradselect's
//! `--method oktopk` (the Selector) select the same local sets from the same accumulators,
//! step by step, at P = 1..4 and for every `--adjust` policy; and only the ladder policy
//! sends the extra integer allreduce, counted in its own phase `th_adjust`.

use gradkit_collectives::registry::{Adjust, Bands, Params};
use gradkit_collectives::{make_reducer, Flat, StepOutput};
use gradkit_comm::{run_local, Comm, PhaseCounts};
use gradkit_sparsify::{Method, Selector};
use std::collections::BTreeMap;

use crate::common;
use common::Rng;
use gradkit_core::keep::Keep;

/// Heavy-tailed accumulators that grow over the steps (as error feedback makes them), a
/// different one per rank and step.
fn inputs(p: usize, steps: usize, n: usize, seed: u64) -> Vec<Vec<Vec<f32>>> {
    let mut rng = Rng::new(seed);
    (0..steps)
        .map(|t| {
            (0..p)
                .map(|_| {
                    (0..n)
                        .map(|_| {
                            let u = (rng.below(1 << 20) + 1) as f32 / (1u64 << 20) as f32;
                            let s = if rng.below(2) == 0 { 1.0 } else { -1.0 };
                            s * u.powf(-0.7) * (1.0 + 0.25 * t as f32)
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

type Traffic = BTreeMap<String, PhaseCounts>;

fn run(params: &Params, n: u64, ins: &[Vec<Vec<f32>>]) -> Vec<Vec<(StepOutput, Traffic)>> {
    let p = ins[0].len();
    let lay = common::layout(n, 3);
    run_local(p, |comm: &dyn Comm| {
        let mut red = make_reducer("oktopk", params)?;
        let mut v = Vec::new();
        for (t, step) in ins.iter().enumerate() {
            comm.traffic().reset();
            let g = Flat::Dense(step[comm.rank()].clone());
            let o = red.reduce(comm, t as u32, &lay, g)?;
            v.push((o, comm.traffic().snapshot()));
        }
        Ok(v)
    })
    .unwrap()
}

#[test]
fn collective_and_gradselect_select_the_same_local_sets() {
    let (n, k, steps, tau) = (6_000usize, 60usize, 9usize, 4u32);
    let policies = [
        Adjust::Paper,
        Adjust::Reference(Bands::VGG),
        Adjust::Reference(Bands::BERT),
        Adjust::Ladder,
    ];
    for p in 1..=4usize {
        let ins = inputs(p, steps, n, 40 + p as u64);
        for adjust in policies {
            // Without the collective's own error feedback its accumulator is the input, the
            // accumulator gradselect would form from the same trace and residuals.
            let params = Params {
                keep: Keep::K(k as u64),
                reeval: tau,
                adjust,
                residual: false,
                ..Params::default()
            };
            let outs = run(&params, n as u64, &ins);
            for r in 0..p {
                let mut sel = Selector::new(
                    Method::OkTopk {
                        reeval: tau,
                        adjust,
                    },
                    0,
                );
                for t in 0..steps {
                    let want = sel.select(t as u32, &ins[t][r], k);
                    let (o, tr) = &outs[r][t];
                    let got = o
                        .contributed
                        .as_ref()
                        .expect("dense input: local selection");
                    assert_eq!(got, &want.indices, "P={p} {adjust:?} rank {r} step {t}");
                    let th = o.metrics.iter().find(|m| m.0 == "threshold").unwrap().1;
                    assert_eq!(th, want.info.threshold.unwrap() as f64, "P={p} t={t}");
                    // Only the ladder policy counts collectively, in its own phase.
                    let adj = tr.get("th_adjust").map_or(0, |c| c.msgs_sent + c.msgs_recv);
                    let reuse = !(t as u32).is_multiple_of(tau);
                    if matches!(adjust, Adjust::Ladder) && reuse && p > 1 {
                        assert!(adj > 0, "P={p} t={t}: ladder without its allreduce");
                    } else {
                        assert_eq!(adj, 0, "P={p} {adjust:?} t={t}: th_adjust messages");
                    }
                }
            }
        }
    }
}

#[test]
fn paper_policy_reuses_the_global_threshold_unchanged() {
    let (n, k, steps, tau) = (6_000usize, 60usize, 6usize, 6u32);
    for p in 2..=4usize {
        let ins = inputs(p, steps, n, 70 + p as u64);
        let params = Params {
            keep: Keep::K(k as u64),
            reeval: tau,
            adjust: Adjust::Paper,
            residual: false,
            ..Params::default()
        };
        let outs = run(&params, n as u64, &ins);
        let gth = |t: usize| {
            outs[0][t]
                .0
                .metrics
                .iter()
                .find(|m| m.0 == "global_threshold")
                .unwrap()
                .1
        };
        for t in 1..steps {
            assert_eq!(
                gth(t),
                gth(0),
                "P={p} t={t}: Algorithm 1 line 13 reuses global_th"
            );
        }
    }
}
