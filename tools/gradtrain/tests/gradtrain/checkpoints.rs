//! The checkpoint directory: a failed checkpoint write leaves nothing behind and the previous
//! checkpoint stays `latest`; a fresh run refuses a directory that holds another run's
//! checkpoints unless told to `--resume` it or to `--overwrite-checkpoint` it.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_gradtrain");

/// A small, deterministic dense MLP run on 2 ranks.
const BASE: [&str; 9] = [
    "--model", "mlp", "--ranks", "2", "--lr", "0.1", "--batch", "16", "-q",
];

fn gradtrain(dir: &Path, extra: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(dir)
        .args(BASE)
        .args(extra)
        .output()
        .unwrap()
}

fn ok(dir: &Path, extra: &[&str]) {
    let o = gradtrain(dir, extra);
    assert!(
        o.status.success(),
        "{extra:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn latest(ck: &Path) -> String {
    std::fs::read_to_string(ck.join("latest"))
        .unwrap()
        .trim()
        .to_string()
}

/// The lock file a run holds in its checkpoint directory (it stays, holding the pid of the
/// last run that took it).
const LOCK: &str = ".gradtrain.lock";

/// The names in a checkpoint directory but the lock file's.
fn entries(dir: &Path) -> Vec<String> {
    let mut v = gradkit_testkit::cli::names(dir);
    v.retain(|n| n != LOCK);
    v
}

/// Every regular file under `dir` (its lock file aside) with its bytes (one level of
/// subdirectories).
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    for n in entries(dir) {
        let p = dir.join(&n);
        if p.is_dir() {
            for m in gradkit_testkit::cli::names(&p) {
                v.push((format!("{n}/{m}"), std::fs::read(p.join(&m)).unwrap()));
            }
        } else {
            v.push((n, std::fs::read(&p).unwrap()));
        }
    }
    v
}

#[test]
fn a_failed_checkpoint_write_leaves_nothing_and_keeps_the_previous_one() {
    let d = gradkit_testkit::tempdir("gradtrain-ckfail");
    let p = d.path();
    ok(p, &["--steps", "10", "--checkpoint", "ck"]);
    assert_eq!(entries(&p.join("ck")), ["latest", "step-10"]);
    let before = tree(&p.join("ck"));
    // A full disk, portably: the file-size limit (RLIMIT_FSIZE, 60 blocks of 512 bytes or
    // 1 KiB) is far below one rank's file (the MLP's 26,122 parameters alone are 104 KB) and
    // above the metrics table the resumed run keeps for its checkpoints (a few KB), and
    // SIGXFSZ ignored turns the signal into the write error EFBIG, as ENOSPC would be.
    let o = gradkit_testkit::cli::with_file_size_limit(BIN, 60)
        .current_dir(p)
        .args(BASE)
        .args([
            "--steps",
            "20",
            "--checkpoint",
            "ck",
            "--checkpoint-every",
            "5",
            "--resume",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("cannot write checkpoint"),
        "{err}"
    );
    assert_eq!(
        entries(&p.join("ck")),
        ["latest", "step-10"],
        "a staging directory or a partial checkpoint was left"
    );
    assert_eq!(
        tree(&p.join("ck")),
        before,
        "the previous checkpoint changed"
    );
    // And it still resumes.
    ok(p, &["--steps", "12", "--checkpoint", "ck", "--resume"]);
    assert_eq!(latest(&p.join("ck")), "step-12");
}

#[test]
fn a_checkpoint_write_failing_on_one_rank_is_reported_by_that_rank() {
    let d = gradkit_testkit::tempdir("gradtrain-ckfail1");
    let p = d.path();
    // Rank 1 cannot create its file (a directory has its name); rank 0 writes its own.
    let blocked = p.join("ck/.staging-step-5/rank-1.safetensors");
    std::fs::create_dir_all(&blocked).unwrap();
    let o = gradtrain(p, &["--steps", "5", "--checkpoint", "ck"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("rank-1.safetensors"),
        "the failing rank's own error is reported: {err}"
    );
    assert!(
        entries(&p.join("ck")).is_empty(),
        "{:?}",
        entries(&p.join("ck"))
    );
}

/// A directory holding the checkpoints of a dense run at steps 10, 20, 30, 40, and a file
/// of the user's.
fn earlier_run(p: &Path) {
    ok(
        p,
        &[
            "--steps",
            "40",
            "--checkpoint",
            "ck",
            "--checkpoint-every",
            "10",
        ],
    );
    std::fs::write(p.join("ck/notes.txt"), "mine").unwrap();
    assert_eq!(
        entries(&p.join("ck")),
        [
            "latest",
            "notes.txt",
            "step-10",
            "step-20",
            "step-30",
            "step-40"
        ]
    );
}

#[test]
fn a_fresh_run_refuses_a_directory_holding_another_runs_checkpoints() {
    let d = gradkit_testkit::tempdir("gradtrain-cktake");
    let p = d.path();
    earlier_run(p);
    let before = tree(&p.join("ck"));
    let o = gradtrain(
        p,
        &["--steps", "10", "--exchange", "topka", "--checkpoint", "ck"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    for name in ["error: ", "ck", "--resume", "--overwrite-checkpoint"] {
        assert!(err.contains(name), "`{name}` not named: {err}");
    }
    assert_eq!(tree(&p.join("ck")), before, "the directory changed");
    // `latest` alone (its step directory removed by hand) still marks another run's.
    let d2 = gradkit_testkit::tempdir("gradtrain-cktake2");
    std::fs::create_dir(d2.path().join("ck")).unwrap();
    std::fs::write(d2.path().join("ck/latest"), "step-10\n").unwrap();
    let o = gradtrain(d2.path(), &["--steps", "10", "--checkpoint", "ck"]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn a_fresh_run_writes_into_an_empty_or_unrelated_directory() {
    let d = gradkit_testkit::tempdir("gradtrain-ckempty");
    let p = d.path();
    std::fs::create_dir(p.join("ck")).unwrap();
    std::fs::write(p.join("ck/notes.txt"), "mine").unwrap();
    std::fs::create_dir(p.join("ck/step-x")).unwrap();
    ok(p, &["--steps", "5", "--checkpoint", "ck"]);
    assert_eq!(
        entries(&p.join("ck")),
        ["latest", "notes.txt", "step-5", "step-x"]
    );
}

#[test]
fn overwrite_checkpoint_replaces_the_other_runs_checkpoints_and_nothing_else() {
    let d = gradkit_testkit::tempdir("gradtrain-ckover");
    let p = d.path();
    earlier_run(p);
    ok(
        p,
        &[
            "--steps",
            "10",
            "--exchange",
            "topka",
            "--checkpoint",
            "ck",
            "--overwrite-checkpoint",
        ],
    );
    assert_eq!(entries(&p.join("ck")), ["latest", "notes.txt", "step-10"]);
    assert_eq!(latest(&p.join("ck")), "step-10");
    assert_eq!(std::fs::read(p.join("ck/notes.txt")).unwrap(), b"mine");
    // step-10 is the new (topk) run's: it resumes as topk, and refuses dense.
    let resume = ["--steps", "12", "--checkpoint", "ck", "--resume"];
    let o = gradtrain(p, &resume);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("exchange = topka"));
    ok(p, &[&resume[..], &["--exchange", "topka"]].concat());
}

#[test]
fn overwrite_checkpoint_is_a_usage_error_with_resume_or_without_checkpoint() {
    let d = gradkit_testkit::tempdir("gradtrain-ckoveruse");
    let p = d.path();
    for args in [
        &["--steps", "5", "--overwrite-checkpoint"][..],
        &[
            "--steps",
            "5",
            "--checkpoint",
            "ck",
            "--resume",
            "--overwrite-checkpoint",
        ],
    ] {
        let o = gradtrain(p, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("--overwrite-checkpoint"), "{err}");
        assert!(
            gradkit_testkit::cli::names(p).is_empty(),
            "{args:?} wrote {:?}",
            gradkit_testkit::cli::names(p)
        );
    }
}

/// Under `ulimit -f` with SIGXFSZ at its default action (as a user's shell leaves it) a
/// checkpoint too large for the limit is a write error, not the signal's kill: one line,
/// exit 1, and no staging directory left.
#[test]
fn a_checkpoint_past_the_file_size_limit_is_one_line_and_leaves_nothing() {
    let d = gradkit_testkit::tempdir("gradtrain-ckxfsz");
    let p = d.path();
    // 60 blocks (30 or 60 KiB) is far below one rank's file (the MLP's parameters alone are
    // 104 KB).
    let o = Command::new("sh")
        .args(["-c", "ulimit -f 60 && exec \"$0\" \"$@\"", BIN])
        .current_dir(p)
        .args(BASE)
        .args(["--steps", "10", "--checkpoint", "ck"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "killed by SIGXFSZ? {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("cannot write checkpoint"),
        "{err}"
    );
    assert!(
        entries(&p.join("ck")).is_empty(),
        "{:?}",
        entries(&p.join("ck"))
    );
}

/// Two runs in one checkpoint directory: the second, started while the first runs, is
/// refused with one line naming the first's process; the first's checkpoints are complete
/// (every rank's file in every step), and once it has ended the directory is free again.
#[test]
fn a_second_run_in_a_checkpoint_directory_in_use_is_refused() {
    let d = gradkit_testkit::tempdir("gradtrain-cklock");
    let p = d.path();
    let mut first = Command::new(BIN)
        .current_dir(p)
        .args(BASE)
        .args([
            "--steps",
            "20000",
            "--checkpoint",
            "ck",
            "--checkpoint-every",
            "10",
        ])
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    while !p.join("ck/latest").exists() {
        assert!(first.try_wait().unwrap().is_none(), "the first run ended");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let pid = first.id().to_string();
    for extra in [&[][..], &["--resume"], &["--overwrite-checkpoint"]] {
        // More steps than the first run will reach: a resume has steps to train.
        let o = gradtrain(
            p,
            &[&["--steps", "30000", "--checkpoint", "ck"][..], extra].concat(),
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        for name in ["error: --checkpoint ck", "in use by another run", &pid] {
            assert!(err.contains(name), "{extra:?}: `{name}` not named: {err}");
        }
    }
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    first.wait().unwrap();
    let steps: Vec<String> = entries(&p.join("ck"))
        .into_iter()
        .filter(|n| n.starts_with("step-"))
        .collect();
    assert!(!steps.is_empty());
    for s in &steps {
        assert_eq!(
            entries(&p.join("ck").join(s)),
            [
                "metrics.parquet",
                "rank-0.safetensors",
                "rank-1.safetensors"
            ],
            "{s}"
        );
    }
    let at: u32 = latest(&p.join("ck"))["step-".len()..].parse().unwrap();
    let next = (at + 2).to_string();
    ok(p, &["--steps", &next, "--checkpoint", "ck", "--resume"]);
}

/// A checkpoint directory where nothing can be created is found as the run starts, not at
/// its first checkpoint after all the steps: nothing is trained, `--metrics` not written.
/// (`/proc` takes no directory, even from root, whom a read-only mode does not stop.)
#[test]
fn a_checkpoint_directory_that_cannot_be_created_stops_the_run_first() {
    let d = gradkit_testkit::tempdir("gradtrain-ckbad");
    let p = d.path();
    let ck = format!("/proc/gradkit-ck-{}", std::process::id());
    let o = gradtrain(
        p,
        &[
            "--steps",
            "200",
            "--metrics",
            "m.parquet",
            "--checkpoint",
            &ck,
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("error: --checkpoint {ck}: cannot create")),
        "{err}"
    );
    assert!(gradkit_testkit::cli::names(p).is_empty(), "trained first");
}
