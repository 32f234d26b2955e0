//! All outputs of a run appear together or none does, and each output path is checked before
//! the first step.

use std::path::Path;

use gradkit_core::{write_table, Meta, Output};

const BIN: &str = env!("CARGO_BIN_EXE_gradselect");

/// A dense trace of 2 ranks whose values do not compress (xorshift bits as floats in
/// [−1, 1)): the residual's file is as large as its values.
fn trace(path: &Path, steps: u32, numel: u64) {
    let mut rows = gradkit_testkit::traces::dense(2, steps, &[("w", numel), ("b", 100)]);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for r in &mut rows {
        for v in &mut r.values {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *v = (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        }
    }
    write_table(&Output::Path(path.to_path_buf()), &Meta::default(), &rows).unwrap();
}

/// A full disk, portably: a file-size limit (RLIMIT_FSIZE; SIGXFSZ ignored turns the signal
/// into the write error EFBIG, as ENOSPC would be) that the selection (5 % of a 300,000-element
/// layer: about 2 × 15,000 × 8 bytes) and the metrics fit in, but not the dense residual
/// (2 × 300,000 floats, about 2.4 MB before compression).
#[test]
fn a_run_that_fails_on_one_output_leaves_none_of_them() {
    let d = gradkit_testkit::tempdir("gradselect-outputs-fsize");
    let p = d.path();
    trace(&p.join("big.parquet"), 1, 300_000);
    let o = gradkit_testkit::cli::with_file_size_limit(BIN, 1200)
        .current_dir(p)
        .args([
            "--method",
            "topk",
            "--density",
            "0.05",
            "-q",
            "big.parquet",
            "-o",
            "o.parquet",
            "--metrics",
            "m.parquet",
            "--residual-out",
            "r.parquet",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("r.parquet"),
        "the residual's write fails: {err}"
    );
    // The system's message once, not once per layer of context that quotes it.
    assert_eq!(err.matches("(os error 27)").count(), 1, "{err}");
    assert_eq!(
        gradkit_testkit::cli::names(p),
        ["big.parquet"],
        "outputs or temporary files were left"
    );
    // Without the limit the same run writes all three: the limit is what failed it.
    let (code, err) = gradkit_testkit::cli::run(
        BIN,
        &[
            "--method",
            "topk",
            "--density",
            "0.05",
            "-q",
            p.join("big.parquet").to_str().unwrap(),
            "-o",
            p.join("o.parquet").to_str().unwrap(),
            "--metrics",
            p.join("m.parquet").to_str().unwrap(),
            "--residual-out",
            p.join("r.parquet").to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let size = |n: &str| std::fs::metadata(p.join(n)).unwrap().len();
    assert!(
        size("r.parquet") > 1200 * 1024,
        "the residual must exceed the limit"
    );
    assert!(size("o.parquet") + size("m.parquet") < 600 * 1024);
}

#[test]
fn every_output_path_is_checked_before_the_first_step() {
    let d = gradkit_testkit::tempdir("gradselect-outputs-paths");
    let t = d.path().join("t.parquet");
    trace(&t, 2, 50);
    let o = d.path().join("o.parquet");
    let missing = d.path().join("missing");
    for flag in ["--metrics", "--residual-out", "-o"] {
        let bad = missing.join("x.parquet");
        let mut args = vec![
            "--method",
            "topk",
            "--density",
            "0.1",
            "-q",
            t.to_str().unwrap(),
        ];
        args.extend([
            "-o",
            if flag == "-o" {
                bad.to_str().unwrap()
            } else {
                o.to_str().unwrap()
            },
        ]);
        if flag != "-o" {
            args.extend([flag, bad.to_str().unwrap()]);
        }
        let (code, err) = gradkit_testkit::cli::run(BIN, &args);
        assert_eq!(code, 1, "{flag}: {err}");
        assert_eq!(
            err.trim_end(),
            format!(
                "error: {flag} {}: the directory {} does not exist",
                bad.display(),
                missing.display()
            ),
            "{flag}"
        );
        assert!(!o.exists(), "{flag}: an output was left");
    }
}
