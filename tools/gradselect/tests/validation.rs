//! Validation that agrees across tools (issue 13, items 8 and 10), as gradselect sees it:
//! every plan/1 that does not fit the trace is refused with the shared validator's message
//! (gradallreduce's tests/validation.rs holds the same cases and the same expected words),
//! and a flag for another method is a usage error, while its default never trips the check.

use std::path::Path;
use std::process::Command;

use gradkit_core::io::{Meta, Output};
use gradkit_core::{write_table, PlanRow, TensorRow};

const BIN: &str = env!("CARGO_BIN_EXE_gradselect");

// ---- shared fixture (the same in gradselect's and gradallreduce's validation tests) ----

/// A dense trace of layers `a` (10 elements) and `b` (6), ranks 0..2, steps 0..2.
fn dense_trace() -> Vec<TensorRow> {
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
fn pr(step: u32, worker: u32, layer: &str, start: u64, end: u64, k: Option<u64>) -> PlanRow {
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
fn bad_plans(k: Option<u64>) -> Vec<(&'static str, Vec<PlanRow>, &'static str)> {
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
fn good_plan(k: Option<u64>) -> Vec<PlanRow> {
    vec![pr(0, 0, "a", 0, 10, k), pr(0, 1, "b", 0, 6, k)]
}

fn write_plan(path: &Path, rows: &[PlanRow], method: Option<&str>) {
    let mut meta = Meta::default();
    if let Some(m) = method {
        meta.set("method", m);
    }
    write_table::<PlanRow>(&Output::Path(path.into()), &meta, rows).unwrap();
}

fn write_trace(path: &Path, rows: &[TensorRow]) {
    write_table::<TensorRow>(&Output::Path(path.into()), &Meta::default(), rows).unwrap();
}
// ---- end of the shared fixture ----

fn run(args: &[&str]) -> (i32, String) {
    let o = Command::new(BIN).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn every_plan_that_does_not_fit_the_trace_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().join("t.parquet");
    write_trace(&t, &dense_trace());
    let (plan, out) = (d.path().join("plan.parquet"), d.path().join("out.parquet"));
    let args = |plan: &Path| -> Vec<String> {
        [
            "--method",
            "deft",
            "--k",
            "2",
            "--plan",
            plan.to_str().unwrap(),
            t.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "-q",
        ]
        .map(String::from)
        .to_vec()
    };
    for (what, rows, needle) in bad_plans(Some(1)) {
        write_plan(&plan, &rows, Some("deft"));
        let a = args(&plan);
        let (c, e) = run(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(c, 1, "{what}: {e}");
        assert!(
            e.starts_with("error: --plan ") && e.contains(needle),
            "{what}: {e}"
        );
        assert_eq!(e.lines().count(), 1, "{what}: one line: {e}");
        assert!(!out.exists(), "{what}: output left behind");
    }
    // An Ok-Topk plan (k null) is not a DEFT plan, with or without its metadata.
    write_plan(&plan, &good_plan(None), None);
    let a = args(&plan);
    let (c, e) = run(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(c, 1, "{e}");
    assert!(e.contains("a row without k is an Ok-Topk region"), "{e}");
    write_plan(&plan, &good_plan(Some(1)), Some("oktopk"));
    let (c, e) = run(&args(&plan).iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(c, 1, "{e}");
    assert!(e.contains("made with method `oktopk`, not `deft`"), "{e}");
    // The tiling plan is accepted.
    write_plan(&plan, &good_plan(Some(1)), Some("deft"));
    let (c, e) = run(&args(&plan).iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(c, 0, "{e}");
    assert!(out.exists());
}

#[test]
fn a_flag_for_another_method_is_a_usage_error() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().join("t.parquet");
    write_trace(&t, &dense_trace());
    let out = d.path().join("out.parquet");
    let (ts, os) = (t.to_str().unwrap(), out.to_str().unwrap());
    for (method, flag, value, applies) in [
        ("topk", "--reeval", "4", "oktopk"),
        ("dgc", "--reeval", "4", "oktopk"),
        ("topk", "--sample", "0.5", "dgc"),
        ("oktopk", "--sample", "0.5", "dgc"),
    ] {
        let (c, e) = run(&["--method", method, "--k", "2", flag, value, ts, "-o", os]);
        assert_eq!(c, 2, "{method} {flag}: {e}");
        assert!(
            e.starts_with(&format!(
                "error: {flag} applies to --method {applies} only, not --method {method}"
            )),
            "{e}"
        );
        assert!(!out.exists());
    }
    // The defaults never trip the check; the flags are taken where they apply, even when
    // the value given equals the default.
    for args in [
        &["--method", "topk", "--k", "2"][..],
        &["--method", "dgc", "--k", "2"],
        &["--method", "oktopk", "--k", "2", "--reeval", "32"],
        &["--method", "dgc", "--k", "2", "--sample", "0.01"],
    ] {
        let mut a = args.to_vec();
        a.extend([ts, "-o", os, "-q"]);
        let (c, e) = run(&a);
        assert_eq!(c, 0, "{args:?}: {e}");
    }
}
