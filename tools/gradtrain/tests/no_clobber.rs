//! Never destroy data: gradtrain refuses `--metrics` or `--checkpoint` naming its `--data` file
//! or each other (docs/RELIABILITY.md).

use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_gradtrain");

/// Runs the tool in `dir`: exit 1, one `error:` line naming `flags`, nothing changed.
fn refused(dir: &Path, args: &[&str], flags: &[&str]) {
    gradkit_testkit::cli::refused(BIN, dir, args, flags);
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
