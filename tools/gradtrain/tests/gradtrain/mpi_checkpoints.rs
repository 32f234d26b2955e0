//! gradtrain's checkpoint checks under mpirun (docs/RELIABILITY.md): a `--resume` that does
//! not match the checkpoint (world size, exchange) and a fresh run into another run's
//! checkpoint directory are agreement points: exactly one `error:` line, a non-zero status
//! on every rank, no `MPI_Abort`, nothing trained or written. So is a recording that would
//! overwrite the training data; and one process of a run (rank 0's) locks its checkpoint
//! directory, so an mpirun run is not refused by its own ranks.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_gradtrain");

/// A checkpoint at step 10 of a dense MLP run on 2 in-process ranks (the same files as
/// `mpirun -np 2` writes).
fn checkpoint_of_2_ranks(ck: &Path) {
    let o = Command::new(BIN)
        .args(["--model", "mlp", "--ranks", "2", "--steps", "10", "-q"])
        .arg("--checkpoint")
        .arg(ck)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The names in a checkpoint directory but its lock file's (`.gradtrain.lock`, which stays).
fn entries(ck: &Path) -> Vec<String> {
    let mut v = gradkit_testkit::cli::names(ck);
    v.retain(|n| n != ".gradtrain.lock");
    v
}

/// `mpirun -np P gradtrain args…`: exit status and stderr (a hang fails the test).
fn mpirun(p: usize, args: &[&str]) -> (Option<i32>, String) {
    let mut cmd = gradkit_testkit::mpi::command(p);
    cmd.arg(BIN).args(args);
    let child = cmd.spawn().expect("start mpirun");
    let what = format!("mpirun -np {p} {args:?}");
    let (status, _, stderr) =
        gradkit_testkit::mpi::wait_bounded(child, Duration::from_secs(300), &what);
    (status.code(), stderr)
}

/// Exactly one `error:` line naming every string of `names`, a non-zero exit, no MPI_Abort.
fn one_error(code: Option<i32>, err: &str, names: &[&str]) {
    assert!(code.is_some_and(|c| c != 0), "exit {code:?}: {err}");
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    assert!(!err.contains("MPI_ABORT"), "{err}");
    let line = err.lines().find(|l| l.contains("error:")).unwrap();
    for n in names {
        assert!(line.contains(n), "`{n}` not named: {err}");
    }
}

#[test]
fn resuming_a_checkpoint_of_another_world_size_prints_one_line() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let d = gradkit_testkit::tempdir("gradtrain-mpick-np");
    let ck = d.path().join("ck");
    checkpoint_of_2_ranks(&ck);
    let m = d.path().join("m.parquet");
    let (code, err) = mpirun(
        3,
        &[
            "--model",
            "mlp",
            "--steps",
            "30",
            "--checkpoint",
            ck.to_str().unwrap(),
            "--resume",
            "-q",
            "--metrics",
            m.to_str().unwrap(),
        ],
    );
    one_error(code, &err, &["ranks = 2", "ranks = 3", "--resume"]);
    assert_eq!(entries(&ck), ["latest", "step-10"]);
    assert!(!m.exists(), "--metrics written");
}

#[test]
fn resuming_with_another_exchange_prints_one_line() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let d = gradkit_testkit::tempdir("gradtrain-mpick-ex");
    let ck = d.path().join("ck");
    checkpoint_of_2_ranks(&ck);
    let (code, err) = mpirun(
        2,
        &[
            "--model",
            "mlp",
            "--steps",
            "30",
            "--exchange",
            "topka",
            "--checkpoint",
            ck.to_str().unwrap(),
            "--resume",
            "-q",
        ],
    );
    one_error(code, &err, &["exchange = ring", "exchange = topka"]);
    assert_eq!(entries(&ck), ["latest", "step-10"]);
}

#[test]
fn a_fresh_run_into_another_runs_checkpoints_prints_one_line() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let d = gradkit_testkit::tempdir("gradtrain-mpick-fresh");
    let ck = d.path().join("ck");
    checkpoint_of_2_ranks(&ck);
    let (code, err) = mpirun(
        2,
        &[
            "--model",
            "mlp",
            "--steps",
            "5",
            "--checkpoint",
            ck.to_str().unwrap(),
            "-q",
        ],
    );
    one_error(code, &err, &["--resume", "--overwrite-checkpoint"]);
    assert_eq!(entries(&ck), ["latest", "step-10"]);
}

#[test]
fn a_recording_over_the_data_is_refused_once_and_the_data_kept() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let d = gradkit_testkit::tempdir("gradtrain-mpi-noclobber");
    let data = d.path().join("d.parquet");
    std::fs::write(&data, b"the training data").unwrap();
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&data, &link).unwrap();
    let (code, err) = mpirun(
        2,
        &[
            "--model",
            "mlp",
            "--steps",
            "5",
            "--data",
            data.to_str().unwrap(),
            "--comm-trace",
            link.to_str().unwrap(),
            "-q",
        ],
    );
    one_error(code, &err, &["--comm-trace", "--data"]);
    assert_eq!(std::fs::read(&data).unwrap(), b"the training data");
    assert_eq!(gradkit_testkit::cli::names(d.path()), ["d.parquet", "link"]);
}

#[test]
fn an_mpi_run_takes_its_checkpoint_directorys_lock_once() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let d = gradkit_testkit::tempdir("gradtrain-mpick-lock");
    let ck = d.path().join("ck");
    let (code, err) = mpirun(
        2,
        &[
            "--model",
            "mlp",
            "--steps",
            "10",
            "--checkpoint",
            ck.to_str().unwrap(),
            "-q",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(entries(&ck), ["latest", "step-10"]);
    assert_eq!(
        entries(&ck.join("step-10")),
        [
            "metrics.parquet",
            "rank-0.safetensors",
            "rank-1.safetensors"
        ]
    );
}
