//! Never destroy data: `gradreport plot -o` refuses to write its SVG over one of the metrics
//! files it reads (docs/RELIABILITY.md).

use std::path::Path;
use std::process::Command;

use gradkit_core::io::{Meta, Output};
use gradkit_core::write_table;
use gradkit_core::MetricRow;

const BIN: &str = env!("CARGO_BIN_EXE_gradreport");

/// Runs the tool in `dir`: exit 1, one `error:` line naming `flags`, nothing changed.
fn refused(dir: &Path, args: &[&str], flags: &[&str]) {
    gradkit_testkit::cli::refused(BIN, dir, args, flags);
}

#[test]
fn a_figure_never_overwrites_its_metrics() {
    let d = tempfile::tempdir().unwrap();
    let rows: Vec<MetricRow> = (0..3u32)
        .map(|step| MetricRow {
            run: "r".into(),
            tool: "gradtrain".into(),
            algo: "dense".into(),
            world_size: 1,
            step,
            rank: 0,
            metric: "loss".into(),
            value: 1.0 / (step + 1) as f64,
        })
        .collect();
    let p = d.path();
    write_table(&Output::Path(p.join("m.parquet")), &Meta::default(), &rows).unwrap();
    write_table(&Output::Path(p.join("n.parquet")), &Meta::default(), &rows).unwrap();
    refused(
        p,
        &["plot", "loss", "m.parquet", "-o", "m.parquet"],
        &["-o", "METRICS", "m.parquet"],
    );
    refused(
        p,
        &[
            "plot",
            "loss",
            "m.parquet",
            "n.parquet",
            "-o",
            "./n.parquet",
        ],
        &["-o", "METRICS"],
    );
    let out = Command::new(BIN)
        .current_dir(p)
        .args(["plot", "loss", "m.parquet", "-o", "loss.svg"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
