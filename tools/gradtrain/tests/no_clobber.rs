//! Never destroy data: gradtrain refuses `--metrics` or `--checkpoint` naming its `--data` file
//! or each other (issue 13, item 4).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_gradtrain");

/// Every file of `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
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

/// Runs the tool in `dir`: exit 1, one `error:` line naming `flags`, nothing changed.
fn refused(dir: &Path, args: &[&str], flags: &[&str]) {
    let before = snapshot(dir);
    let out = Command::new(BIN)
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    for f in flags {
        assert!(lines[0].contains(f), "{args:?}: `{f}` not named in {err}");
    }
    assert_eq!(snapshot(dir), before, "{args:?} changed the directory");
}

#[test]
fn outputs_never_overwrite_the_data_or_each_other() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    std::fs::write(p.join("data.parquet"), b"not read").unwrap();
    let a = ["--steps", "1", "--ranks", "2", "-q"];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        a.iter().copied().chain(extra.iter().copied()).collect()
    };
    refused(
        p,
        &with(&["--data", "data.parquet", "--metrics", "data.parquet"]),
        &["--metrics", "--data"],
    );
    refused(
        p,
        &with(&["--metrics", "ck", "--checkpoint", "./ck"]),
        &["--metrics", "--checkpoint"],
    );
}
