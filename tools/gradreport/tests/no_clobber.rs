//! Never destroy data: `gradreport plot -o` refuses to write its SVG over one of the metrics
//! files it reads (issue 13, item 4).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gradkit_core::io::{Meta, Output};
use gradkit_core::write_table;
use gradkit_core::MetricRow;

const BIN: &str = env!("CARGO_BIN_EXE_gradreport");

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
