//! Validation that agrees across tools (docs/RELIABILITY.md), as gradallreduce sees it:
//! `--plan` is checked for deft and oktopk with the validator gradselect uses (the same cases
//! and expected words as gradselect's tests/validation.rs), before any rank starts; flags
//! that the algorithm would ignore, and values with nothing to do, are usage errors.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

/// A fresh directory for one test, removed when the guard drops.
fn tmpdir(name: &str) -> gradkit_testkit::TempDir {
    gradkit_testkit::tempdir(&format!("gradallreduce-validation-{name}-"))
}

use gradkit_testkit::plans::{bad_plans, dense_trace, good_plan, pr, write_plan, write_trace};

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
    let d_dir = tmpdir("plans");
    let d = d_dir.path().to_path_buf();
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
    let d_dir = tmpdir("flags");
    let d = d_dir.path().to_path_buf();
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
            "error: --split applies to --algo embrace only",
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

/// The environment variables gradkit reads are checked like flags, with in-process ranks too
/// (where `GRADKIT_COMM_TIMEOUT` has no effect): a usage error naming the variable and its
/// values.
#[test]
fn a_bad_environment_variable_is_a_usage_error() {
    let d = tmpdir("env");
    write_trace(&d.path().join("t.parquet"), &dense_trace());
    let args = [
        "--algo",
        "ring",
        "--ranks",
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

/// `model`'s flags are bounded like every other flag: out of range is a usage error (exit 2)
/// naming the flag and its range, never a panic or a number from an overflow.
#[test]
fn model_flags_out_of_range_are_usage_errors() {
    for (args, needle) in [
        (
            &["--ranks", "4294967296"][..],
            "--ranks must be from 1 to 16777216",
        ),
        (&["--ranks", "0"], "--ranks must be from 1 to 16777216"),
        (
            &["--n", "18446744073709551615"],
            "--n must be from 1 to 9007199254740992",
        ),
        (&["--n", "0"], "--n must be from 1 to 9007199254740992"),
        (&["--n", "12x"], "flag --n"),
        (&["--density", "0"], "--density must lie in (0, 1]"),
        (&["--alpha-us=-1"], "flag --alpha-us"),
    ] {
        let mut a = vec!["model"];
        a.extend_from_slice(args);
        let (code, err) = run(&a);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: `{needle}` not in {err}");
        assert!(!err.contains("internal error"), "{args:?}: {err}");
    }
}

/// At the largest bounds the prediction is still the model's: every algorithm's words per
/// rank at least its volume lower bound, so no speedup over dense beyond what the
/// compression gives (1-bit: 32× at most; the sparse ones at density 0.01: 1/0.01 = 100× at
/// most).
#[test]
fn model_at_the_bounds_predicts_no_overflowed_speedup() {
    let o = Command::new(BIN)
        .args([
            "model",
            "--ranks",
            "16777216",
            "--n",
            "9007199254740992",
            "--format",
            "csv",
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut names = Vec::new();
    for line in out.lines().skip(1) {
        let cells: Vec<&str> = line.split(',').collect();
        let speedup: f64 = cells[7].parse().unwrap();
        assert!(
            speedup.is_finite() && speedup > 0.0 && speedup <= 100.0,
            "{line}"
        );
        names.push(cells[0].to_string());
    }
    // Every formula of Table 1 and the 1-bit volume is there, both ends of each interval.
    for want in [
        "rabenseifner",
        "topka",
        "topkdsa best",
        "topkdsa worst",
        "gtopk",
        "gaussiank",
        "oktopk best",
        "oktopk worst",
        "onebit",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {out}");
    }
}

/// In-process ranks are threads: more than 1024 is refused at once, naming the flag and the
/// way to run more (mpirun), instead of a run that prints nothing for minutes.
#[test]
fn too_many_in_process_ranks_are_a_usage_error() {
    let d = tmpdir("ranks");
    write_trace(&d.path().join("t.parquet"), &dense_trace());
    let t = d.path().join("t.parquet");
    let o = d.path().join("o.parquet");
    for args in [
        &["bench", "--ranks", "100000", "--sizes", "1K:1K"][..],
        &["bench", "--ranks", "1025", "--sizes", "1K:1K"],
        &[
            "--algo",
            "ring",
            "--ranks",
            "100000",
            t.to_str().unwrap(),
            "-o",
            o.to_str().unwrap(),
        ],
    ] {
        let (code, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.starts_with("error: --ranks ") && err.contains("1024") && err.contains("mpirun"),
            "{args:?}: {err}"
        );
        assert!(err.contains("(flag --ranks)"), "{args:?}: {err}");
        assert!(!o.exists());
    }
}

/// Exit codes and messages that agree: `--ranks 0` is a usage error like every other bad
/// value (exit 2), `--factor 1` is blamed on `--factor`, and a subcommand's flag errors print
/// the subcommand's usage line.
#[test]
fn usage_errors_name_their_flag_and_their_subcommand() {
    let d = tmpdir("usage");
    write_trace(&d.path().join("t.parquet"), &dense_trace());
    let t = d.path().join("t.parquet");
    let o = d.path().join("o.parquet");
    let (t, o) = (t.to_str().unwrap(), o.to_str().unwrap());
    for (args, needle, usage) in [
        (
            &["--algo", "ring", "--ranks", "0", t, "-o", o][..],
            "error: --ranks must be at least 1 (flag --ranks)",
            "Usage: gradallreduce [OPTIONS] [IN]",
        ),
        (
            &["bench", "--ranks", "0", "--sizes", "1K:1K"],
            "error: --ranks must be at least 1 (flag --ranks)",
            "Usage: gradallreduce bench",
        ),
        (
            &["bench", "--ranks", "2", "--sizes", "1K:4K", "--factor", "1"],
            "error: --factor must be at least 2, got 1 (flag --factor)",
            "Usage: gradallreduce bench",
        ),
        (
            &["bench", "--ranks", "2", "--sizes", "8:4"],
            "error: --sizes 8:4 must be MIN:MAX bytes with 4 ≤ MIN ≤ MAX (flag --sizes)",
            "Usage: gradallreduce bench",
        ),
        (
            &["bench", "--ranks", "2", "--algo", "foo"],
            "not `foo` (flag --algo)",
            "Usage: gradallreduce bench",
        ),
        (
            &["model", "--n", "0"],
            "error: --n must be from 1",
            "Usage: gradallreduce model",
        ),
    ] {
        let (code, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: `{needle}` not in {err}");
        assert!(err.contains(usage), "{args:?}: `{usage}` not in {err}");
        assert_eq!(err.matches("error:").count(), 1, "{args:?}: {err}");
        assert!(!Path::new(o).exists());
    }
    // --factor 1 is not blamed on --sizes.
    let (_, err) = run(&["bench", "--ranks", "2", "--sizes", "1K:4K", "--factor", "1"]);
    assert!(!err.contains("--sizes 1K:4K"), "{err}");
}
