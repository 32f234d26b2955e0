//! The plan/1 cases every consumer of plans (gradselect `--plan`, gradallreduce `--plan` for
//! deft and oktopk) must treat alike: a small trace, plans that tile it, and the plans that do
//! not fit it, each with the words of the shared validator's refusal.

use std::path::Path;

use gradkit_core::io::{Meta, Output};
use gradkit_core::{write_table, PlanRow, TensorRow};

/// A dense trace of layers `a` (10 elements) and `b` (6), ranks 0..2, steps 0..2.
pub fn dense_trace() -> Vec<TensorRow> {
    let mut rows = Vec::new();
    for step in 0..2u32 {
        for rank in 0..2u32 {
            for (id, (name, n)) in [("a", 10u64), ("b", 6)].into_iter().enumerate() {
                rows.push(TensorRow {
                    step,
                    rank,
                    layer_id: id as u32,
                    layer: name.into(),
                    numel: n,
                    shape: None,
                    indices: None,
                    values: (0..n)
                        .map(|i| ((i * 7 + 3 * rank as u64 + step as u64) % 11) as f32 - 5.0)
                        .collect(),
                });
            }
        }
    }
    rows
}

/// One plan row: `worker` owns `layer[start..end)` from `step` on.
pub fn pr(step: u32, worker: u32, layer: &str, start: u64, end: u64, k: Option<u64>) -> PlanRow {
    PlanRow {
        step,
        worker,
        layer_id: u32::from(layer == "b"),
        layer: layer.into(),
        start,
        end,
        k,
    }
}

/// The plans every consumer must refuse, each with the words the refusal must contain
/// (`k` = Some for a DEFT plan, None for Ok-Topk regions).
pub fn bad_plans(k: Option<u64>) -> Vec<(&'static str, Vec<PlanRow>, &'static str)> {
    vec![
        (
            "gap",
            vec![pr(0, 0, "a", 0, 9, k), pr(0, 1, "b", 0, 6, k)],
            "plan step 0: the ranges do not tile the model: flat position 9 is not covered (layer `a`",
        ),
        (
            "overlap",
            vec![
                pr(0, 0, "a", 0, 10, k),
                pr(0, 1, "a", 5, 10, k),
                pr(0, 1, "b", 0, 6, k),
            ],
            "plan step 0: the ranges do not tile the model: flat position 5 is covered twice (layer `a`",
        ),
        (
            "past numel",
            vec![pr(0, 0, "a", 0, 10, k), pr(0, 1, "b", 0, 7, k)],
            "plan step 0: range 0..7 lies outside layer `b` of 6 elements",
        ),
        (
            "gap in a later plan step",
            vec![
                pr(0, 0, "a", 0, 10, k),
                pr(0, 1, "b", 0, 6, k),
                pr(1, 0, "a", 0, 10, k),
                pr(1, 1, "b", 1, 6, k),
            ],
            "plan step 1: the ranges do not tile the model: flat position 10 is not covered (layer `b`",
        ),
        (
            "another world size",
            vec![
                pr(0, 0, "a", 0, 10, k),
                pr(0, 1, "b", 0, 3, k),
                pr(0, 2, "b", 3, 6, k),
            ],
            "plan step 0 has 3 workers but the trace has 2 ranks",
        ),
        (
            "another step set",
            vec![pr(1, 0, "a", 0, 10, k), pr(1, 1, "b", 0, 6, k)],
            "the plan starts at step 1 but the trace at step 0",
        ),
    ]
}

/// A plan that tiles the model: worker 0 owns `a`, worker 1 owns `b`.
pub fn good_plan(k: Option<u64>) -> Vec<PlanRow> {
    vec![pr(0, 0, "a", 0, 10, k), pr(0, 1, "b", 0, 6, k)]
}

pub fn write_plan(path: &Path, rows: &[PlanRow], method: Option<&str>) {
    let mut meta = Meta::default();
    if let Some(m) = method {
        meta.set("method", m);
    }
    write_table::<PlanRow>(&Output::Path(path.into()), &meta, rows).unwrap();
}

pub fn write_trace(path: &Path, rows: &[TensorRow]) {
    write_table::<TensorRow>(&Output::Path(path.into()), &Meta::default(), rows).unwrap();
}
