//! The outputs of a run: memory that does not grow with the number of steps (the metrics are
//! written as they come, not held to the end), and every output path checked before the first
//! step.

use std::path::Path;
use std::process::Command;

use gradkit_core::{read_table, write_table, Input, Meta, MetricRow, Output, ReadOptions};

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

fn trace(path: &Path, steps: u32) {
    let rows = gradkit_testkit::traces::dense(2, steps, &[("w", 10)]);
    write_table(&Output::Path(path.to_path_buf()), &Meta::default(), &rows).unwrap();
}

/// Peak RSS (KiB) of one run, which must succeed; its metrics table has a row per rank and
/// step for `bytes_sent`.
fn peak(dir: &Path, input: &Path, algo: &str, steps: u32) -> u64 {
    let (o, m) = (dir.join("o.parquet"), dir.join("m.parquet"));
    let (out, kib) = gradkit_testkit::cli::run_peak_rss(
        Command::new(BIN)
            .args(["--algo", algo, "--ranks", "2", "-q", "--metrics"])
            .arg(&m)
            .arg(input)
            .arg("-o")
            .arg(&o)
            .env_remove("GRADKIT_MAX_MEMORY"),
    );
    assert!(
        out.status.success(),
        "{algo}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = read_table::<MetricRow>(&Input::Path(m), ReadOptions::default())
        .unwrap()
        .rows;
    let sent = rows.iter().filter(|r| r.metric == "bytes_sent").count();
    assert_eq!(
        sent,
        2 * steps as usize,
        "{algo}: a bytes_sent row per rank and step"
    );
    kib
}

/// Six times the steps of a 10-element layer: the peak grows by far less than the rows the
/// run writes. Before, every rank held its metric rows to the end (about 7.8 KB per step and
/// rank): ring's peak went from 67 MB at 2,000 steps to 242 MB at 12,000 (now 20 and 50 MB).
#[test]
#[cfg(target_os = "linux")]
fn memory_does_not_grow_with_the_number_of_steps() {
    let d = gradkit_testkit::tempdir("gradallreduce-outputs-mem");
    let (short, long) = (
        d.path().join("short.parquet"),
        d.path().join("long.parquet"),
    );
    let (n_short, n_long) = (2_000, 12_000);
    trace(&short, n_short);
    trace(&long, n_long);
    for algo in ["ring", "oktopk"] {
        let a = peak(d.path(), &short, algo, n_short);
        let b = peak(d.path(), &long, algo, n_long);
        assert!(
            b < a + 80 * 1024,
            "{algo}: peak {a} KiB at {n_short} steps, {b} KiB at {n_long}"
        );
    }
}

/// An output that cannot be created stops the run before the first step, naming its flag
/// (the message of the check made before the work, not of a write after it), and leaves
/// nothing.
#[test]
fn every_output_path_is_checked_before_the_first_step() {
    let d = gradkit_testkit::tempdir("gradallreduce-outputs-paths");
    let t = d.path().join("t.parquet");
    trace(&t, 3);
    let missing = d.path().join("missing");
    let o = d.path().join("o.parquet");
    let cases: [(&str, &[&str]); 3] = [
        ("--metrics", &["--algo", "ring"]),
        ("--state", &["--algo", "onebit"]),
        ("-o", &["--algo", "ring"]),
    ];
    for (flag, extra) in cases {
        let bad = missing.join("x.parquet");
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.extend(["--ranks", "2", "-q"].map(String::from));
        args.push(t.to_str().unwrap().into());
        args.push("-o".into());
        args.push(
            if flag == "-o" { &bad } else { &o }
                .to_str()
                .unwrap()
                .into(),
        );
        if flag != "-o" {
            args.push(flag.into());
            args.push(bad.to_str().unwrap().into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, err) = gradkit_testkit::cli::run(BIN, &args);
        assert_eq!(code, 1, "{flag}: {err}");
        assert_eq!(err.lines().count(), 1, "{flag}: {err}");
        let want = format!(
            "error: {flag} {}: the directory {} does not exist",
            bad.display(),
            missing.display()
        );
        assert_eq!(err.trim_end(), want, "{flag}");
        assert!(!o.exists(), "{flag}: an output was left");
    }
    // A directory that exists but takes no file (root may write anywhere: skipped for root).
    let ro = d.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    if std::fs::write(ro.join("probe"), b"").is_err() {
        let m = ro.join("m.parquet");
        let (code, err) = gradkit_testkit::cli::run(
            BIN,
            &[
                "--algo",
                "ring",
                "--ranks",
                "2",
                "-q",
                t.to_str().unwrap(),
                "-o",
                o.to_str().unwrap(),
                "--metrics",
                m.to_str().unwrap(),
            ],
        );
        assert_eq!(code, 1, "{err}");
        assert!(
            err.starts_with(&format!(
                "error: --metrics {}: cannot create a file in",
                m.display()
            )),
            "{err}"
        );
        assert!(!o.exists());
    }
}
