//! Validation that agrees across tools (issue 13, items 8 and 10), as gradallreduce sees it:
//! `--plan` is checked for deft and oktopk with the validator gradselect uses (the same cases
//! and expected words as gradselect's tests/validation.rs), before any rank starts; flags
//! that the algorithm would ignore, and values with nothing to do, are usage errors.

use std::path::{Path, PathBuf};
use std::process::Command;

use gradkit_core::io::{Meta, Output};
use gradkit_core::{write_table, PlanRow, TensorRow};

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

/// A fresh directory for one test (no tempfile dev-dependency in this crate).
fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "gradallreduce-validation-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

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
    let o = Command::new(BIN)
        .args(args)
        .env_remove("OMPI_COMM_WORLD_SIZE")
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn every_plan_that_does_not_fit_the_trace_is_refused_by_deft_and_oktopk() {
    let d = tmpdir("plans");
    let t = d.join("t.parquet");
    write_trace(&t, &dense_trace());
    let (plan, out) = (d.join("plan.parquet"), d.join("out.parquet"));
    let (ts, ps, os) = (
        t.to_str().unwrap(),
        plan.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    for (algo, k) in [("deft", Some(1)), ("oktopk", None)] {
        let args = [
            "--algo", algo, "--ranks", "2", "--plan", ps, ts, "-o", os, "-q",
        ];
        for (what, rows, needle) in bad_plans(k) {
            write_plan(&plan, &rows, Some(algo));
            let (c, e) = run(&args);
            assert_eq!(c, 1, "{algo}, {what}: {e}");
            assert!(
                e.starts_with("error: --plan ") && e.contains(needle),
                "{algo}, {what}: {e}"
            );
            assert!(!out.exists(), "{algo}, {what}: output left behind");
        }
        // A plan of the other method.
        let other = if k.is_some() { None } else { Some(1) };
        write_plan(&plan, &good_plan(other), None);
        let (c, e) = run(&args);
        assert_eq!(c, 1, "{algo}: {e}");
        assert!(e.contains("plan step 0: a row with"), "{algo}: {e}");
        // The tiling plan is accepted.
        write_plan(&plan, &good_plan(k), Some(algo));
        let (c, e) = run(&args);
        assert_eq!(c, 0, "{algo}: {e}");
        std::fs::remove_file(&out).unwrap();
    }
    // Ok-Topk regions must be contiguous in worker order.
    let rows = vec![
        pr(0, 1, "a", 0, 5, None),
        pr(0, 0, "a", 5, 10, None),
        pr(0, 1, "b", 0, 6, None),
    ];
    write_plan(&plan, &rows, Some("oktopk"));
    let (c, e) = run(&[
        "--algo", "oktopk", "--ranks", "2", "--plan", ps, ts, "-o", os,
    ]);
    assert_eq!(c, 1, "{e}");
    assert!(e.contains("not contiguous in worker order"), "{e}");
}

#[test]
fn flags_that_do_not_apply_are_usage_errors() {
    let d = tmpdir("flags");
    let t = d.join("t.parquet");
    write_trace(&t, &dense_trace());
    let out = d.join("out.parquet");
    let (ts, os) = (t.to_str().unwrap(), out.to_str().unwrap());
    for (args, needle) in [
        (
            &["--algo", "ring", "--state", "s.bin"][..],
            "error: --state applies to --algo onebit or onebit-naive only, not --algo ring",
        ),
        (
            &["--algo", "topka", "--state", "s.bin"],
            "error: --state applies to --algo onebit or onebit-naive only, not --algo topka",
        ),
        (
            &["--algo", "ring", "--plan", "p.parquet"],
            "error: --plan applies to --algo deft or oktopk only, not --algo ring",
        ),
        (
            &["--algo", "topka", "--period", "4"],
            "error: --period applies to --algo oktopk only",
        ),
        (
            &["--algo", "ring", "--split", "rows"],
            "error: --split applies to --algo alltoall only",
        ),
        (
            &["--algo", "onebit", "--op", "mean"],
            "error: --op does not apply to --algo onebit",
        ),
        (
            &["--algo", "topka", "--k", "0"],
            "error: --k must be at least 1",
        ),
        (
            &["--algo", "topka", "--density", "0"],
            "error: --density must lie in (0, 1], got 0",
        ),
    ] {
        let mut a = args.to_vec();
        a.extend(["--ranks", "2", ts, "-o", os]);
        let (c, e) = run(&a);
        assert_eq!(c, 2, "{args:?}: {e}");
        assert!(e.starts_with(needle), "{args:?}: {e}");
        assert!(!out.exists(), "{args:?}");
    }
    // bench --iters 0 would time and verify nothing.
    let (c, e) = run(&["bench", "--ranks", "2", "--iters", "0", "--sizes", "1K:1K"]);
    assert_eq!(c, 2, "{e}");
    assert!(e.starts_with("error: --iters must be at least 1"), "{e}");
    // Defaults never trip a check; --op mean is honoured by the sparse algorithms (a mean is
    // the sum over P), so it is accepted there.
    for args in [
        &["--algo", "ring"][..],
        &["--algo", "onebit"],
        &["--algo", "topka", "--op", "mean"],
        &["--algo", "oktopk", "--period", "64", "--reeval", "32"],
    ] {
        let mut a = args.to_vec();
        a.extend(["--ranks", "2", ts, "-o", os, "-q"]);
        let (c, e) = run(&a);
        assert_eq!(c, 0, "{args:?}: {e}");
    }
    let (c, e) = run(&[
        "bench", "--ranks", "2", "--iters", "1", "--sizes", "1K:1K", "-q",
    ]);
    assert_eq!(c, 0, "{e}");
}
