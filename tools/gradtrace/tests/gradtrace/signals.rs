//! An interrupted write leaves nothing behind: SIGINT, SIGTERM or SIGHUP during
//! `gradtrace synthetic -o FILE` removes `FILE.tmp-<pid>` and exits with 128 + the signal
//! number (docs/RELIABILITY.md); even `kill -9` leaves nothing where the output is written to an
//! unnamed file until it is complete (Linux `O_TMPFILE`), and never a half-written FILE.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gradtrace");

/// Whether the writer has created its output file: a named `FILE.tmp-<pid>`, or an unnamed
/// one (`O_TMPFILE`: an open descriptor into the directory, shown as `DIR/#N (deleted)`).
fn writing(dir: &Path, pid: u32) -> (bool, bool) {
    let named = dir.join(format!("out.parquet.tmp-{pid}")).exists();
    let dir = dir.canonicalize().unwrap();
    let unnamed = std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .any(|t| t.starts_with(&dir))
    });
    (named, unnamed)
}

/// Starts a write far too long to finish, waits until its output file exists (named or not),
/// sends `sig`, and returns the exit code, what is left in the directory, and whether the
/// file was unnamed.
fn interrupt(sig: &str) -> (Option<i32>, Vec<String>, bool) {
    let d = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .current_dir(d.path())
        .args([
            "synthetic",
            "--shape",
            "vgg16",
            "--scale",
            "0.25",
            "--ranks",
            "4",
            "--steps",
            "100000",
            "-q",
            "-o",
            "out.parquet",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A hang guard only: the file appears as soon as the writer is created.
    let start = Instant::now();
    let unnamed = loop {
        match writing(d.path(), child.id()) {
            (true, _) => break false,
            (false, true) => break true,
            _ => {}
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "gradtrace ended before writing"
        );
        assert!(start.elapsed() < Duration::from_secs(600), "no output file");
        std::thread::sleep(Duration::from_millis(5));
    };
    let kill = Command::new("kill")
        .args([format!("-{sig}"), child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    (
        out.status.code(),
        gradkit_testkit::cli::names(d.path()),
        unnamed,
    )
}

#[test]
fn sigterm_removes_the_temporary_file() {
    let (code, left, _) = interrupt("TERM");
    assert_eq!((code, left), (Some(128 + 15), vec![]));
}

#[test]
fn sigint_removes_the_temporary_file() {
    let (code, left, _) = interrupt("INT");
    assert_eq!((code, left), (Some(128 + 2), vec![]));
}

#[test]
fn sighup_removes_the_temporary_file() {
    let (code, left, _) = interrupt("HUP");
    assert_eq!((code, left), (Some(128 + 1), vec![]));
}

#[test]
fn sigkill_never_leaves_a_half_written_output() {
    let (code, left, unnamed) = interrupt("KILL");
    assert_eq!(code, None, "killed by the signal");
    assert!(!left.contains(&"out.parquet".to_string()), "{left:?}");
    if unnamed {
        // Written to an unnamed file: nothing at all is left.
        assert_eq!(left, Vec::<String>::new());
    } else {
        eprintln!("note: this filesystem has no O_TMPFILE; a killed writer leaves {left:?}");
    }
}
