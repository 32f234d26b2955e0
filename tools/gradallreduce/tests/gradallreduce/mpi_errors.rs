//! Errors under mpirun (docs/RELIABILITY.md): whatever fails, on whichever rank, the job ends
//! with exactly one copy of the message and a non-zero status, and no rank waits forever.
//! `pipelines/stress-mpi-errors.sh` runs the same cases hundreds of times under load.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use gradkit_core::{write_table, Meta, Output, TensorRow};

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

/// A fresh directory for one test, removed when the guard drops.
fn tmpdir(name: &str) -> gradkit_testkit::TempDir {
    gradkit_testkit::tempdir(&format!("gradallreduce-mpierr-{name}-"))
}

/// A dense trace of `p` ranks, 2 steps, one layer of 257 entries.
fn write_trace(path: &Path, p: u32) {
    let mut rows = Vec::new();
    for step in 0..2u32 {
        for rank in 0..p {
            let values: Vec<f32> = (0..257u32)
                .map(|i| ((i * 31 + rank * 7 + step) % 97) as f32 - 48.0)
                .collect();
            rows.push(TensorRow {
                step,
                rank,
                layer_id: 0,
                layer: "w".into(),
                numel: values.len() as u64,
                shape: Some(vec![values.len() as u32]),
                indices: None,
                values,
            });
        }
    }
    write_table(&Output::Path(path.to_path_buf()), &Meta::default(), &rows).unwrap();
}

struct Ran {
    code: Option<i32>,
    stderr: String,
}

/// Runs `mpirun -np P BIN args…` with stdout to `stdout_to` (or null) and a hang guard: a run
/// still going after 300 s is killed and the test fails as a hang.
fn mpirun(p: usize, args: &[&str], env: &[(&str, &str)], stdout_to: Option<&Path>) -> Ran {
    let mut cmd = gradkit_testkit::mpi::command(p);
    cmd.arg(BIN).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    match stdout_to {
        Some(f) => cmd.stdout(std::fs::File::create(f).unwrap()),
        None => cmd.stdout(Stdio::null()),
    };
    let child = cmd.spawn().expect("start mpirun");
    let what = format!("mpirun {args:?}");
    let (status, _, stderr) =
        gradkit_testkit::mpi::wait_bounded(child, Duration::from_secs(300), &what);
    Ran {
        code: status.code(),
        stderr,
    }
}

fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

#[test]
fn table_to_stdout_under_mpirun_is_refused_once_and_never_hangs() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let d_dir = tmpdir("stdout");
    let d = d_dir.path().to_path_buf();
    let t2 = d.join("t2.parquet");
    write_trace(&t2, 2);
    let out = d.join("out.parquet");
    let r = mpirun(
        2,
        &["--algo", "ring", t2.to_str().unwrap()],
        &[],
        Some(&out),
    );
    assert_ne!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(count(&r.stderr, "cannot go to stdout"), 1, "{}", r.stderr);
    assert!(r.stderr.contains("-o FILE"), "{}", r.stderr);
    assert_eq!(
        std::fs::metadata(&out).unwrap().len(),
        0,
        "nothing written to stdout"
    );
    // The same with `-o -`.
    let r = mpirun(
        2,
        &["--algo", "ring", t2.to_str().unwrap(), "-o", "-"],
        &[],
        None,
    );
    assert_ne!(r.code, Some(0));
    assert_eq!(count(&r.stderr, "cannot go to stdout"), 1, "{}", r.stderr);
}

#[test]
fn a_check_failing_on_rank_0_is_reported_once_before_any_rank_exits() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let d_dir = tmpdir("mismatch");
    let d = d_dir.path().to_path_buf();
    let t2 = d.join("t2.parquet");
    write_trace(&t2, 2);
    let out = d.join("o.parquet");
    for _ in 0..3 {
        let r = mpirun(
            4,
            &[t2.to_str().unwrap(), "-o", out.to_str().unwrap()],
            &[],
            None,
        );
        assert_eq!(r.code, Some(1), "{}", r.stderr);
        assert_eq!(
            count(&r.stderr, "holds 2 ranks but this run has 4"),
            1,
            "{}",
            r.stderr
        );
        assert_eq!(count(&r.stderr, "error:"), 1, "{}", r.stderr);
        assert!(!out.exists());
    }
}

#[test]
fn a_usage_error_is_printed_once_under_mpirun() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let d_dir = tmpdir("usage");
    let d = d_dir.path().to_path_buf();
    let t4 = d.join("t4.parquet");
    write_trace(&t4, 4);
    let r = mpirun(
        4,
        &["--k", "0", t4.to_str().unwrap(), "-o", "x.parquet"],
        &[],
        None,
    );
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert_eq!(count(&r.stderr, "error:"), 1, "{}", r.stderr);
    let r = mpirun(4, &["--no-such-flag"], &[], None);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert_eq!(count(&r.stderr, "error:"), 1, "{}", r.stderr);
}

#[test]
fn a_rank_failing_inside_the_collectives_ends_the_job_with_its_message() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let d_dir = tmpdir("fault");
    let d = d_dir.path().to_path_buf();
    let t4 = d.join("t4.parquet");
    write_trace(&t4, 4);
    let out = d.join("o.parquet");
    for algo in ["ring", "oktopk"] {
        let r = mpirun(
            4,
            &[
                "--algo",
                algo,
                t4.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ],
            &[("GRADKIT_FAULT_RANK", "2")],
            None,
        );
        assert_ne!(r.code, Some(0), "{}", r.stderr);
        assert_eq!(
            count(&r.stderr, "error: rank 2: injected fault"),
            1,
            "{}",
            r.stderr
        );
        assert!(!out.exists(), "no output after a failed run");
        let left = gradkit_testkit::cli::temp_files(&d);
        assert!(left.is_empty(), "temporary files left: {left:?}");
    }
}

#[test]
fn a_stuck_rank_is_ended_by_the_watchdog() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let d_dir = tmpdir("stall");
    let d = d_dir.path().to_path_buf();
    let t4 = d.join("t4.parquet");
    write_trace(&t4, 4);
    let out = d.join("o.parquet");
    let r = mpirun(
        4,
        &[
            "--algo",
            "ring",
            t4.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
        &[("GRADKIT_STALL_RANK", "3"), ("GRADKIT_COMM_TIMEOUT", "5")],
        None,
    );
    assert_ne!(r.code, Some(0), "{}", r.stderr);
    // The first rank whose wait passes the limit names the peer it waited on: rank 3 itself,
    // or a rank that is waiting on rank 3 in turn — which one depends on the timing.
    assert!(
        r.stderr.contains("no message from rank") || r.stderr.contains("was not taken"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("(GRADKIT_COMM_TIMEOUT); ending the job"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("GRADKIT_COMM_TIMEOUT"), "{}", r.stderr);
    assert!(!out.exists());
}

/// `GRADKIT_COMM_TIMEOUT` is checked like a flag: garbage, a negative, NaN or a number too
/// large for the watchdog is a usage error (exit 2) printed once per job, naming the variable
/// and what it accepts — not a silent fallback to the default, a wait forever, or a panic on
/// every rank.
#[test]
fn a_bad_comm_timeout_is_one_usage_error_per_job() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let d_dir = tmpdir("timeout");
    let d = d_dir.path().to_path_buf();
    let t2 = d.join("t2.parquet");
    write_trace(&t2, 2);
    let out = d.join("o.parquet");
    for bad in ["abc", "30s", "-1", "NaN", "99999999999999999999"] {
        let r = mpirun(
            2,
            &[
                "--algo",
                "ring",
                t2.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ],
            &[("GRADKIT_COMM_TIMEOUT", bad)],
            None,
        );
        assert_eq!(r.code, Some(2), "{bad}: {}", r.stderr);
        assert_eq!(count(&r.stderr, "error:"), 1, "{bad}: {}", r.stderr);
        assert!(
            r.stderr.contains(&format!(
                "GRADKIT_COMM_TIMEOUT={bad}: must be a number of seconds from 0"
            )),
            "{bad}: {}",
            r.stderr
        );
        assert!(!r.stderr.contains("internal error"), "{bad}: {}", r.stderr);
        assert!(!out.exists());
    }
}
