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
