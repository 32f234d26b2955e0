//! Never destroy data: gradpartition refuses an output that names its input or another
//! output, before reading anything (docs/RELIABILITY.md).

use std::path::Path;

use gradkit_core::io::{Meta, Output};
use gradkit_core::write_table;
use gradkit_core::TensorRow;

const BIN: &str = env!("CARGO_BIN_EXE_gradpartition");

/// Runs the tool in `dir`: exit 1, one `error:` line naming `flags`, nothing changed.
fn refused(dir: &Path, args: &[&str], flags: &[&str]) {
    gradkit_testkit::cli::refused(BIN, dir, args, flags);
}

#[test]
fn outputs_never_overwrite_the_input_or_each_other() {
    let d = tempfile::tempdir().unwrap();
    let rows: Vec<TensorRow> = (0..2u32)
        .map(|rank| TensorRow {
            step: 0,
            rank,
            layer_id: 0,
            layer: "w".into(),
            numel: 32,
            shape: None,
            indices: None,
            values: (0..32)
                .map(|i| (i as f32 - 16.0) * (rank + 1) as f32)
                .collect(),
        })
        .collect();
    write_table(
        &Output::Path(d.path().join("in.parquet")),
        &Meta::default(),
        &rows,
    )
    .unwrap();
    let p = d.path();
    let a = ["--method", "deft", "--density", "0.1", "in.parquet"];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        a.iter().copied().chain(extra.iter().copied()).collect()
    };
    refused(p, &with(&["-o", "in.parquet"]), &["-o", "IN", "in.parquet"]);
    refused(
        p,
        &with(&["-o", "plan.parquet", "--metrics", "in.parquet"]),
        &["--metrics", "IN"],
    );
    refused(
        p,
        &with(&["-o", "plan.parquet", "--metrics", "./plan.parquet"]),
        &["-o", "--metrics"],
    );
}

/// Every pair of gradpartition's file flags given one file, by any path: refused, naming
/// both.
#[test]
fn every_pair_of_file_flags_naming_one_file_is_refused() {
    use gradkit_testkit::cli::FileFlag;
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("in.parquet"), b"not read").unwrap();
    std::fs::write(d.path().join("x.parquet"), b"not read").unwrap();
    let f = |flag, reads, writes| FileFlag {
        flag,
        reads,
        writes,
    };
    let flags = [
        f("IN", true, false),
        f("-o", false, true),
        f("--metrics", false, true),
    ];
    let args = |pair: &[(&str, &str)]| {
        let mut v: Vec<String> = ["--method", "deft", "--density", "0.1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let input = pair.iter().find(|(f, _)| *f == "IN");
        v.push(input.map_or("in.parquet", |(_, p)| p).to_string());
        for (flag, path) in pair.iter().filter(|(f, _)| *f != "IN") {
            v.extend([flag.to_string(), path.to_string()]);
        }
        Some(v)
    };
    let runs =
        gradkit_testkit::cli::refuses_every_shared_file(BIN, d.path(), &flags, "x.parquet", &args);
    assert!(runs >= 14, "{runs}");
}
