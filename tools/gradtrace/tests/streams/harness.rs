//! Shared by every tool's `tests/streams.rs` (included with `#[path]`): runs a tool with
//! its stdout and stderr closed, full (/dev/full), piped into a reader that goes away after
//! one line (`| head -1`), and broken, and checks that no panic or abort reaches the user
//! and that an output file given with `-o` is written whole whatever happens to the streams
//! (docs/RELIABILITY.md).
#![allow(dead_code)]

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use gradkit_core::{write_table, Meta, MetricRow, Output, TensorRow};

/// What happens to the tool's standard streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    StdoutClosed,
    StdoutFull,
    StdoutHead1,
    StderrClosed,
    StderrFull,
    StderrBroken,
}

pub const ALL: [Mode; 6] = [
    Mode::StdoutClosed,
    Mode::StdoutFull,
    Mode::StdoutHead1,
    Mode::StderrClosed,
    Mode::StderrFull,
    Mode::StderrBroken,
];

pub struct Run {
    pub status: ExitStatus,
    /// Captured stderr (empty where stderr itself was the stream under test).
    pub stderr: String,
}

/// Runs `bin args` with the streams as `mode` says.
pub fn run(bin: &str, args: &[&str], mode: Mode) -> Run {
    let dir = TmpDir::new("run");
    let err_path = dir.path().join("stderr.txt");
    // Closing a descriptor needs the shell (`>&-`): the child starts with fd 1 or 2 closed.
    let mut cmd = match mode {
        Mode::StdoutClosed | Mode::StderrClosed => {
            let redirect = if mode == Mode::StdoutClosed {
                "exec \"$@\" >&-"
            } else {
                "exec \"$@\" 2>&-"
            };
            let mut c = Command::new("/bin/sh");
            c.args(["-c", redirect, "sh", bin]).args(args);
            c
        }
        _ => {
            let mut c = Command::new(bin);
            c.args(args);
            c
        }
    };
    cmd.env_remove("GRADKIT_DEBUG").stdin(Stdio::null());
    let full = || {
        File::options()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full")
    };
    match mode {
        Mode::StdoutClosed | Mode::StdoutHead1 => {}
        Mode::StdoutFull => {
            cmd.stdout(full());
        }
        _ => {
            cmd.stdout(Stdio::null());
        }
    }
    match mode {
        Mode::StderrFull => {
            cmd.stderr(full());
        }
        Mode::StderrBroken => {
            cmd.stderr(Stdio::piped());
        }
        Mode::StderrClosed => {}
        _ => {
            cmd.stderr(File::create(&err_path).unwrap());
        }
    }
    if mode == Mode::StdoutHead1 {
        cmd.stdout(Stdio::piped());
    }
    if mode == Mode::StdoutClosed {
        cmd.stdout(Stdio::null()); // replaced by `>&-` in the shell
    }
    let mut child = cmd.spawn().expect("spawn");
    if mode == Mode::StderrBroken {
        drop(child.stderr.take()); // the reader is gone before the tool writes
    }
    if mode == Mode::StdoutHead1 {
        let mut r = BufReader::new(child.stdout.take().unwrap());
        let mut line = Vec::new();
        let _ = r.read_until(b'\n', &mut line);
        drop(r); // `head -1` exits
    }
    let status = child.wait().expect("wait");
    let mut stderr = String::new();
    if let Ok(mut f) = File::open(&err_path) {
        let _ = f.read_to_string(&mut stderr);
    }
    Run { status, stderr }
}

/// No panic (exit 101), no abort (134, or death by a signal), no "panicked" text.
pub fn assert_no_panic(what: &str, mode: Mode, r: &Run) {
    let code = r.status.code();
    assert!(
        code.is_some() && code != Some(101) && code != Some(134),
        "{what} with {mode:?}: status {:?}, stderr: {}",
        r.status,
        r.stderr
    );
    assert!(
        !r.stderr.contains("panicked") && !r.stderr.contains("RUST_BACKTRACE"),
        "{what} with {mode:?}: {}",
        r.stderr
    );
}

/// Runs `args` (which write `output` with `-o`) in every mode: each run succeeds and leaves
/// an output file that `valid` accepts, whatever happened to stdout and stderr.
pub fn check_with_output(bin: &str, args: &[&str], output: &Path, valid: impl Fn(&Path)) {
    for mode in ALL {
        let _ = std::fs::remove_file(output);
        let r = run(bin, args, mode);
        assert_no_panic(&format!("{args:?}"), mode, &r);
        assert!(
            r.status.success(),
            "{args:?} with {mode:?}: {:?}, stderr: {}",
            r.status,
            r.stderr
        );
        assert!(output.exists(), "{args:?} with {mode:?}: no output file");
        valid(output);
    }
}

/// Runs `args` (whose output is stdout) in every mode: never a panic; a closed or full
/// stdout is one `error:` line (exit 1); the reader going away after one line is success.
pub fn check_stdout_tool(bin: &str, args: &[&str]) {
    for mode in ALL {
        let r = run(bin, args, mode);
        assert_no_panic(&format!("{args:?}"), mode, &r);
        match mode {
            Mode::StdoutFull => {
                assert_eq!(
                    r.status.code(),
                    Some(1),
                    "{args:?} with {mode:?}: {}",
                    r.stderr
                );
                assert!(
                    r.stderr.starts_with("error: ") && r.stderr.contains("No space left"),
                    "{args:?} with {mode:?}: {}",
                    r.stderr
                );
            }
            // Rust's runtime reopens a closed fd 1 on /dev/null, so writes succeed; a clean
            // error line is acceptable too.
            Mode::StdoutClosed => assert!(
                r.status.success()
                    || (r.status.code() == Some(1) && r.stderr.starts_with("error: ")),
                "{args:?} with {mode:?}: {:?} {}",
                r.status,
                r.stderr
            ),
            _ => assert!(
                r.status.success(),
                "{args:?} with {mode:?}: {:?} {}",
                r.status,
                r.stderr
            ),
        }
    }
}

/// A dense trace of `p` ranks × `steps` steps × two layers (200 and 17 elements).
pub fn tiny_trace(path: &Path, p: u32, steps: u32) {
    let mut rows = Vec::new();
    for step in 0..steps {
        for rank in 0..p {
            for (id, n) in [(0u32, 200u64), (1, 17)] {
                rows.push(TensorRow {
                    step,
                    rank,
                    layer_id: id,
                    layer: format!("fc{id}.weight"),
                    numel: n,
                    shape: Some(vec![n as u32]),
                    indices: None,
                    values: (0..n)
                        .map(|i| ((i * 31 + rank as u64 * 7 + step as u64) % 23) as f32 - 11.0)
                        .collect(),
                });
            }
        }
    }
    let mut meta = Meta::default();
    meta.set("world_size", p);
    write_table(&Output::Path(path.to_path_buf()), &meta, &rows).unwrap();
}

/// A metrics/1 file: two runs, three steps, `loss` and `bytes_sent`.
pub fn tiny_metrics(path: &Path) {
    let mut rows = Vec::new();
    for run in ["a", "b"] {
        for step in 0..3 {
            for (metric, value) in [("loss", 1.0 / (step + 1) as f64), ("bytes_sent", 1000.0)] {
                rows.push(MetricRow {
                    run: run.into(),
                    tool: "gradtrain".into(),
                    algo: run.into(),
                    world_size: 2,
                    step,
                    rank: 0,
                    metric: metric.into(),
                    value,
                    settings: Default::default(),
                });
            }
        }
    }
    write_table(&Output::Path(path.to_path_buf()), &Meta::default(), &rows).unwrap();
}

/// A fresh directory under the system's temp dir, removed when dropped (no tempfile crate:
/// not every tool has it as a dev-dependency).
pub struct TmpDir(PathBuf);

impl TmpDir {
    pub fn new(tag: &str) -> TmpDir {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("gradkit-streams-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TmpDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
