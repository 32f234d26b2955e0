//! gradtrain as a user runs it: bad input gives one clear line and exit 1, no output left
//! behind; Local and mpirun give the same metrics.

use std::path::Path;
use std::process::{Command, Output};

use gradkit_core::io::{read_table, Input, ReadOptions};
use gradkit_core::MetricRow;

fn gradtrain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gradtrain"))
        .args(args)
        .output()
        .expect("runs")
}

fn fails_with(args: &[&str], needle: &str) {
    let out = gradtrain(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(
        err.starts_with("error: ") && err.contains(needle),
        "{args:?}: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A configuration error is a usage error: exit 2, before any rank starts.
fn usage_fails_with(args: &[&str], needle: &str) {
    let out = gradtrain(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        err.starts_with("error: ") && err.contains(needle),
        "{args:?}: {err}"
    );
}

fn metrics(p: &Path) -> Vec<MetricRow> {
    read_table::<MetricRow>(&Input::Path(p.to_path_buf()), ReadOptions::default())
        .unwrap()
        .rows
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.parquet");
    let ms = m.to_str().unwrap();
    usage_fails_with(
        &[
            "--exchange",
            "onebit",
            "--optimizer",
            "sgd",
            "--metrics",
            ms,
        ],
        "needs --optimizer onebit-lamb",
    );
    usage_fails_with(&["--optimizer", "onebit-lamb"], "needs --exchange onebit");
    fails_with(
        &[
            "--model",
            "transformer-lm",
            "--data",
            "digits",
            "--steps",
            "1",
        ],
        "language model",
    );
    usage_fails_with(&["--model", "resnet"], "unknown --model");
    fails_with(
        &["--ranks", "4", "--batch", "400", "--metrics", ms],
        "larger than rank 0's shard",
    );
    fails_with(&["--data", "nope.parquet"], "--data `nope.parquet`");
    assert!(!m.exists(), "no metrics file after a failed run");
    // a Parquet file with other columns: use a metrics table as "data"
    let ok = gradtrain(&["--steps", "2", "--ranks", "2", "-q", "--metrics", ms]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    fails_with(
        &["--data", ms, "--steps", "1"],
        "no `features`/`label` columns",
    );
    // usage errors are clap's (exit 2)
    assert_eq!(gradtrain(&["--steps", "many"]).status.code(), Some(2));
}

#[test]
fn metrics_are_deterministic_and_complete() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.parquet");
    let b = dir.path().join("b.parquet");
    for p in [&a, &b] {
        let out = gradtrain(&[
            "--steps",
            "6",
            "--ranks",
            "2",
            "--exchange",
            "topk",
            "--density",
            "0.05",
            "-q",
            "--metrics",
            p.to_str().unwrap(),
        ]);
        assert!(out.status.success());
    }
    let (ra, rb) = (metrics(&a), metrics(&b));
    let strip = |r: &[MetricRow]| -> Vec<(u32, u32, String, f64)> {
        r.iter()
            .filter(|m| !m.metric.starts_with("time_"))
            .map(|m| (m.step, m.rank, m.metric.clone(), m.value))
            .collect()
    };
    assert_eq!(strip(&ra), strip(&rb));
    for name in [
        "loss",
        "lr",
        "bytes_sent",
        "time_compute_s",
        "time_select_s",
        "time_comm_s",
        "nnz",
        "eval_accuracy",
    ] {
        assert!(ra.iter().any(|m| m.metric == name), "metric {name} missing");
    }
    assert_eq!(ra.iter().filter(|m| m.metric == "loss").count(), 12); // 6 steps × 2 ranks
}

#[test]
fn local_and_mpirun_give_the_same_metrics() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        eprintln!("mpirun not found: skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let loc = dir.path().join("loc.parquet");
    let mpi = dir.path().join("mpi.parquet");
    let args = [
        "--steps",
        "5",
        "--exchange",
        "oktopk",
        "--density",
        "0.05",
        "-q",
        "--metrics",
    ];
    let mut a: Vec<&str> = vec!["--ranks", "4"];
    a.extend(args);
    a.push(loc.to_str().unwrap());
    assert!(gradtrain(&a).status.success());
    let out = gradkit_testkit::mpi::isolate(&mut Command::new("mpirun"))
        .args(["-np", "4", "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .arg(env!("CARGO_BIN_EXE_gradtrain"))
        .args(args)
        .arg(mpi.to_str().unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = |r: Vec<MetricRow>| -> Vec<(u32, u32, String, f64)> {
        let mut v: Vec<_> = r
            .into_iter()
            .filter(|m| !m.metric.starts_with("time_"))
            .map(|m| (m.step, m.rank, m.metric, m.value))
            .collect();
        v.sort_by(|x, y| (x.0, x.1, &x.2).cmp(&(y.0, y.1, &y.2)));
        v
    };
    assert_eq!(key(metrics(&loc)), key(metrics(&mpi)));
}
