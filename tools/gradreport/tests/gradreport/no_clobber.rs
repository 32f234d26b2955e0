//! Never destroy data: `gradreport plot -o` refuses to write its SVG over one of the metrics
//! files it reads, and `simulate -o` its table over the recording (docs/RELIABILITY.md).

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
            settings: Default::default(),
        })
        .collect();
    let p = d.path();
    write_table(&Output::Path(p.join("m.parquet")), &Meta::default(), &rows).unwrap();
    // Metrics files whose names carry a figure's extension: `-o` picks the format from the
    // extension, so only such a name can reach the write, and it is refused there.
    write_table(&Output::Path(p.join("m.svg")), &Meta::default(), &rows).unwrap();
    write_table(&Output::Path(p.join("n.pdf")), &Meta::default(), &rows).unwrap();
    refused(
        p,
        &["plot", "loss", "m.svg", "-o", "m.svg"],
        &["-o", "METRICS", "m.svg"],
    );
    refused(
        p,
        &["plot", "loss", "m.svg", "n.pdf", "-o", "./n.pdf"],
        &["-o", "METRICS"],
    );
    // A Parquet name is no figure: a usage error (exit 2), the metrics untouched.
    let before = std::fs::read(p.join("m.parquet")).unwrap();
    let out = Command::new(BIN)
        .current_dir(p)
        .args(["plot", "loss", "m.parquet", "-o", "m.parquet"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(std::fs::read(p.join("m.parquet")).unwrap(), before);
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

/// A 2-rank recording (commtrace/1) of one exchange, at `path`.
fn recording(path: &Path) {
    use gradkit_core::{CommRow, EventKind};
    let ev = |rank: u32, event: u64, kind: EventKind| CommRow {
        step: 0,
        rank,
        event,
        call: 0,
        kind,
        peer: 1 - rank,
        tag: 0,
        seq: 0,
        bytes: 64,
        fixed_bytes: 0,
        phase: "p".into(),
        label: "x".into(),
        start_s: 0.0,
        end_s: 1e-3,
    };
    let rows = [
        ev(0, 0, EventKind::Send),
        ev(0, 1, EventKind::Recv),
        ev(1, 0, EventKind::Send),
        ev(1, 1, EventKind::Recv),
    ];
    gradkit_core::write_comm_trace(path, Meta::default(), 2, &rows).unwrap();
}

#[test]
fn a_replay_never_overwrites_its_recording() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    recording(&p.join("rv.parquet"));
    std::os::unix::fs::symlink("rv.parquet", p.join("link.parquet")).unwrap();
    for out in ["rv.parquet", "./rv.parquet", "link.parquet"] {
        refused(
            p,
            &["simulate", "rv.parquet", "--compute", "none", "-o", out],
            &["-o", "RECORDING", "rv.parquet"],
        );
    }
    // The recording named through the symlink.
    refused(
        p,
        &[
            "simulate",
            "link.parquet",
            "--compute",
            "none",
            "-o",
            "rv.parquet",
        ],
        &["-o", "RECORDING"],
    );
}
