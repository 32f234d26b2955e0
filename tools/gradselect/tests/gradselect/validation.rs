//! Validation that agrees across tools (docs/RELIABILITY.md), as gradselect sees it:
//! every plan/1 that does not fit the trace is refused with the shared validator's message
//! (gradallreduce's tests/validation.rs holds the same cases and the same expected words),
//! and a flag for another method is a usage error, while its default never trips the check.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_gradselect");

use gradkit_testkit::plans::{bad_plans, dense_trace, good_plan, write_plan, write_trace};

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

/// The environment variables gradkit reads are checked like flags, here too (where
/// `GRADKIT_COMM_TIMEOUT` has no effect, and `GRADKIT_MAX_MEMORY` may have none): a usage
/// error naming the variable and its values.
#[test]
fn a_bad_environment_variable_is_a_usage_error() {
    let d = tempfile::tempdir().unwrap();
    write_trace(&d.path().join("t.parquet"), &dense_trace());
    let args = [
        "--method",
        "topk",
        "--k",
        "2",
        "t.parquet",
        "-o",
        "o.parquet",
        "-q",
    ];
    for (var, v, accepts) in gradkit_testkit::cli::BAD_ENV {
        gradkit_testkit::cli::env_refused(BIN, d.path(), &args, var, v, accepts);
    }
}
