//! Never destroy data: gradtrain refuses a run two of whose files (`--data`, `--metrics`,
//! `--comm-trace`, `--checkpoint`) are one file, by any path, and a file of the run inside
//! the checkpoint directory's own entries (`latest`, `step-N/`, `.staging-step-N/`, the lock
//! file), before anything is read or written (docs/RELIABILITY.md). The reference is the
//! directory itself: every name and every byte in it before and after.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_gradtrain");

/// Every entry under `dir` (recursively, symlinks not followed) with a regular file's bytes.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let t = std::fs::symlink_metadata(&p).unwrap().file_type();
        if t.is_dir() {
            out.extend(tree(&p));
            out.insert(p, None);
        } else {
            let bytes = t.is_file().then(|| std::fs::read(&p).unwrap());
            out.insert(p, bytes);
        }
    }
    out
}

/// Runs gradtrain in `dir`: exit 1, one `error:` line naming both `flags`, and not one name
/// or byte under `dir` changed (no file written, no directory created).
fn refused(dir: &Path, args: &[&str], flags: [&str; 2]) {
    let before = tree(dir);
    let out = Command::new(BIN)
        .current_dir(dir)
        .args(["--model", "mlp", "--steps", "5", "--ranks", "2", "-q"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    for f in flags {
        assert!(err.contains(f), "{args:?}: `{f}` not named in {err}");
    }
    assert_eq!(tree(dir), before, "{args:?} changed the directory");
}

/// The flags of a run that name a file (`--data` is its input).
const FLAGS: [&str; 4] = ["--data", "--metrics", "--comm-trace", "--checkpoint"];

/// A directory holding `d.parquet` (the training data, never read here), a symlink to it and
/// a dangling symlink to `new.parquet`, which no one has written yet.
fn dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("d.parquet"), b"the training data").unwrap();
    std::os::unix::fs::symlink("d.parquet", d.path().join("d-link")).unwrap();
    std::os::unix::fs::symlink("new.parquet", d.path().join("new-link")).unwrap();
    d
}

#[test]
fn every_pair_of_file_flags_naming_one_file_is_refused() {
    let d = dir();
    let p = d.path();
    for (i, a) in FLAGS.iter().enumerate() {
        for b in &FLAGS[i + 1..] {
            // One existing file (the data) and one not yet written, each by the same path, by
            // another spelling and through a symlink.
            let names: &[[&str; 2]] = if *a == "--data" {
                &[["d.parquet", "d.parquet"], ["d.parquet", "d-link"]]
            } else {
                &[
                    ["d.parquet", "./d.parquet"],
                    ["new.parquet", "./new.parquet"],
                    ["new.parquet", "new-link"],
                    ["new-link", "sub/../new.parquet"],
                ]
            };
            for [x, y] in names {
                let mut args = vec![*a, *x, *b, *y];
                if *a != "--data" {
                    // Real training data, so only the two flags under test name files.
                    args.extend(["--data", "digits"]);
                }
                std::fs::create_dir_all(p.join("sub")).unwrap();
                refused(p, &args, [a, b]);
            }
        }
    }
}

#[test]
fn a_file_inside_the_checkpoint_directorys_entries_is_refused() {
    let d = dir();
    let p = d.path();
    // A checkpoint directory that exists (with a checkpoint) and one that does not yet.
    std::fs::create_dir_all(p.join("ck/step-10")).unwrap();
    std::fs::write(p.join("ck/latest"), "step-10\n").unwrap();
    std::fs::write(p.join("ck/step-10/rank-0.safetensors"), b"state").unwrap();
    std::os::unix::fs::symlink("ck/latest", p.join("latest-link")).unwrap();
    std::os::unix::fs::symlink("ck", p.join("ck-link")).unwrap();
    let inside = [
        "ck/latest",
        "ck/step-10",
        "ck/step-20",
        "ck/step-10/metrics.parquet",
        "ck/.staging-step-20",
        "ck/.staging-step-20/rank-0.safetensors",
        "ck/.gradtrain.lock",
        "ck/latest.tmp-12",
        "./ck/./step-10/../latest",
        "latest-link",
        "ck-link/step-10",
    ];
    for ck in ["ck", "ck-link", "fresh"] {
        for flag in ["--metrics", "--comm-trace", "--data"] {
            for path in inside {
                let path = path.replacen("ck/", &format!("{ck}/"), 1);
                if ck == "fresh" && path.contains("-link") {
                    continue;
                }
                refused(
                    p,
                    &[flag, &path, "--checkpoint", ck],
                    [flag, "--checkpoint"],
                );
            }
        }
    }
    // The checkpoint directory's other names stay the user's: a run may write there.
    std::fs::create_dir(p.join("mine")).unwrap();
    let out = Command::new(BIN)
        .current_dir(p)
        .args(["--model", "mlp", "--steps", "5", "--ranks", "2", "-q"])
        .args(["--checkpoint", "mine", "--metrics", "mine/step-5.parquet"])
        .args(["--comm-trace", "mine/rec.parquet"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    for f in ["step-5.parquet", "rec.parquet", "step-5/rank-1.safetensors"] {
        assert!(p.join("mine").join(f).is_file(), "{f}");
    }
}
