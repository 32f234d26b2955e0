//! Running a tool's binary in a directory and checking what it did there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Every regular file of `dir` with its bytes.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect()
}

/// Runs `bin args…` in `dir` with stdin closed and asserts it refused as gradkit refuses a
/// runtime mistake: exit 1, exactly one `error:` line that names every string of `names`,
/// no panic, and not one byte of the directory changed.
pub fn refused(bin: &str, dir: &Path, args: &[&str], names: &[&str]) {
    refused_with_env(bin, dir, args, &[], names);
}

/// [`refused`] with environment variables set for the run (e.g. a stand-in library path).
pub fn refused_with_env(
    bin: &str,
    dir: &Path,
    args: &[&str],
    envs: &[(&str, &Path)],
    names: &[&str],
) {
    let before = snapshot(dir);
    let mut c = Command::new(bin);
    c.current_dir(dir).args(args).stdin(Stdio::null());
    for (k, v) in envs {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for f in names {
        assert!(lines[0].contains(f), "{args:?}: `{f}` not named in {err}");
    }
    assert_eq!(snapshot(dir), before, "{args:?} changed the directory");
}

/// Runs `bin args…`: its exit code (-1 when killed by a signal) and its stderr.
pub fn run(bin: &str, args: &[&str]) -> (i32, String) {
    let o = Command::new(bin).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Runs `bin` with `args`, `stdin` (a file's bytes) piped in or no stdin: exit code (−1 when
/// killed by a signal), stdout and stderr.
pub fn run_with_stdin(bin: &str, args: &[&str], stdin: Option<&Path>) -> (i32, String, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut c = Command::new(bin);
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    c.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = c.spawn().unwrap();
    if let Some(p) = stdin {
        let bytes = std::fs::read(p).unwrap();
        child.stdin.take().unwrap().write_all(&bytes).unwrap();
    }
    let o = child.wait_with_output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The names of the temporary files (`.tmp-` in the name: what an atomic write makes before it
/// renames) left in `dir`: a failed or stopped run must leave none.
pub fn temp_files(dir: impl AsRef<std::path::Path>) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read the directory")
        .map(|e| {
            e.expect("directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.contains(".tmp-"))
        .collect()
}

/// Runs `cmd` to the end (stdout and stderr captured) and returns its output and its peak
/// resident memory in KiB.
///
/// The peak is `wait4`'s `ru_maxrss` of the command, taken by a small intermediate process
/// (`python3`, which the project needs anyway) that starts it and reports it. Measured from
/// this process, it would not be the command's own: Linux carries the high-water mark of the
/// memory a child was spawned from across `exec`, so a child of a test binary reports at
/// least the test process's own peak, which grows with whatever its other tests (run in
/// parallel threads) allocated. The intermediate's own few MiB are the floor instead. The
/// command's exit status comes back as its exit code (128 + the signal for a signal).
#[cfg(target_os = "linux")]
pub fn run_peak_rss(cmd: &mut std::process::Command) -> (std::process::Output, u64) {
    use std::process::Stdio;
    const REPORT: &str = "import os, subprocess, sys\n\
        p = subprocess.Popen(sys.argv[2:])\n\
        _, status, ru = os.wait4(p.pid, 0)\n\
        open(sys.argv[1], 'w').write(str(ru.ru_maxrss))\n\
        code = os.waitstatus_to_exitcode(status)\n\
        sys.exit(code if code >= 0 else 128 - code)\n";
    let report = tempfile::NamedTempFile::new().expect("a temporary file for the peak");
    let mut via = std::process::Command::new("python3");
    via.arg("-c")
        .arg(REPORT)
        .arg(report.path())
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => via.env(k, v),
            None => via.env_remove(k),
        };
    }
    if let Some(d) = cmd.get_current_dir() {
        via.current_dir(d);
    }
    let o = via
        .stdin(Stdio::null())
        .output()
        .expect("spawn python3 (it reports the command's peak memory)");
    let kib = std::fs::read_to_string(report.path())
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak reported: {}", String::from_utf8_lossy(&o.stderr)));
    (o, kib)
}

/// Environment variables set wrong, for [`env_refused`]: (variable, value, words of the
/// message saying what it accepts).
pub const BAD_ENV: &[(&str, &str, &str)] = &[
    ("GRADKIT_COMM_TIMEOUT", "abc", "a number of seconds from 0"),
    ("GRADKIT_COMM_TIMEOUT", "-1", "a number of seconds from 0"),
    (
        "GRADKIT_COMM_TIMEOUT",
        "99999999999999999999",
        "a number of seconds from 0",
    ),
    ("GRADKIT_MAX_MEMORY", "abc", "is not a size (e.g. 4096, 64K"),
    ("GRADKIT_MAX_MEMORY", "0", "must be more than 0"),
];

/// Runs `bin args…` (a command line that is fine on its own) in `dir` with the environment
/// variable `var` set to `value` and asserts that it was refused as a usage error: exit 2,
/// one `error: VAR=VALUE: …` line naming what the variable accepts (`accepts`), no panic,
/// and not one byte of `dir` changed.
pub fn env_refused(bin: &str, dir: &Path, args: &[&str], var: &str, value: &str, accepts: &str) {
    let before = snapshot(dir);
    let out = Command::new(bin)
        .current_dir(dir)
        .args(args)
        .env(var, value)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let what = format!("{var}={value} {bin} {args:?}");
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{what}: {err}");
    assert!(
        errors[0].starts_with(&format!("error: {var}={value}: ")),
        "{what}: {err}"
    );
    assert!(
        errors[0].contains(accepts),
        "{what}: `{accepts}` not in {err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("internal error"),
        "{what}: {err}"
    );
    assert_eq!(snapshot(dir), before, "{what} changed the directory");
}

/// The names in `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read the directory")
        .map(|e| {
            e.expect("a directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}

/// `bin` run under a file-size limit of `blocks` (`ulimit -f`: blocks of 512 bytes or 1 KiB,
/// as the shell counts them) with SIGXFSZ ignored, so a write past the limit fails with EFBIG
/// as it would with ENOSPC: a full disk, portably and without root.
pub fn with_file_size_limit(bin: &str, blocks: u32) -> Command {
    let mut c = Command::new("sh");
    c.args([
        "-c",
        &format!("trap '' XFSZ; ulimit -f {blocks} && exec \"$0\" \"$@\""),
        bin,
    ]);
    c
}

/// A file a tool's command line names, for [`refuses_every_shared_file`]: its flag as the
/// tool's messages name it (`IN` for a positional input), and whether the tool reads it and
/// whether it writes it (a state file does both).
#[derive(Clone, Copy, Debug)]
pub struct FileFlag {
    pub flag: &'static str,
    pub reads: bool,
    pub writes: bool,
}

/// Builds a tool's command line from (flag, path) pairs ([`refuses_every_shared_file`]).
pub type CommandLine<'a> = dyn Fn(&[(&str, &str)]) -> Option<Vec<String>> + 'a;

/// The table-driven same-file check of a tool: for every pair of `flags` of which one is
/// written, the pair given one file — by the same path, by another spelling (`./x`) and
/// through a symlink; an input's file `existing` (a file in `dir`, of the caller's), and
/// for two outputs also a file not yet there — must be refused as [`refused`] checks: exit
/// 1, one `error:` line naming both flags, not one byte of `dir` changed. `args` builds the
/// command line from (flag, path) pairs; `None` where the two flags cannot go together.
/// Returns the number of command lines run.
pub fn refuses_every_shared_file(
    bin: &str,
    dir: &Path,
    flags: &[FileFlag],
    existing: &str,
    args: &CommandLine<'_>,
) -> usize {
    let link = format!("{existing}-link");
    let _ = std::fs::remove_file(dir.join(&link));
    std::os::unix::fs::symlink(existing, dir.join(&link)).expect("symlink");
    let _ = std::fs::remove_file(dir.join("new-link"));
    std::os::unix::fs::symlink("new.out", dir.join("new-link")).expect("symlink");
    let dotted = format!("./{existing}");
    let mut runs = 0;
    for (i, a) in flags.iter().enumerate() {
        for b in &flags[i + 1..] {
            if !(a.writes || b.writes) {
                continue; // two inputs may share a file: reading destroys nothing
            }
            let mut names = vec![
                [existing, existing],
                [existing, dotted.as_str()],
                [existing, link.as_str()],
                [link.as_str(), existing],
            ];
            if !(a.reads || b.reads) {
                names.extend([["new.out", "./new.out"], ["new-link", "new.out"]]);
            }
            for [x, y] in names {
                let Some(line) = args(&[(a.flag, x), (b.flag, y)]) else {
                    continue;
                };
                let line: Vec<&str> = line.iter().map(String::as_str).collect();
                refused(bin, dir, &line, &[a.flag, b.flag]);
                runs += 1;
            }
        }
    }
    runs
}
