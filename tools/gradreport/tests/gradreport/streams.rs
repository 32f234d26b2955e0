//! gradreport with closed, full, `head -1` and broken stdout/stderr: its tables on stdout
//! are an error line or quiet success, never a panic, and a figure given with `-o` is
//! written whole (docs/RELIABILITY.md).

#[path = "../../../gradtrace/tests/streams/harness.rs"]
mod harness;

use harness::*;

const BIN: &str = env!("CARGO_BIN_EXE_gradreport");

#[test]
fn tables_never_panic_on_stdout() {
    let d = TmpDir::new("report");
    let m = d.path().join("m.parquet");
    tiny_metrics(&m);
    let t = d.path().join("t.parquet");
    tiny_trace(&t, 2, 1);
    check_stdout_tool(BIN, &["table", m.to_str().unwrap(), "--by", "run"]);
    check_stdout_tool(BIN, &["tensor", t.to_str().unwrap()]);
}

#[test]
fn plot_writes_its_figure_whatever_the_streams() {
    let d = TmpDir::new("report-plot");
    let m = d.path().join("m.parquet");
    tiny_metrics(&m);
    let fig = d.path().join("f.svg");
    check_with_output(
        BIN,
        &[
            "plot",
            "loss",
            m.to_str().unwrap(),
            "-o",
            fig.to_str().unwrap(),
        ],
        &fig,
        |p| {
            let svg = std::fs::read_to_string(p).unwrap();
            assert!(
                svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
                "{svg}"
            );
        },
    );
}
