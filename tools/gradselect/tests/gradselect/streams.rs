//! gradselect with closed, full, `head -1` and broken stdout/stderr: no panic, and the `-o`,
//! `--metrics` and `--residual-out` files written whole (docs/RELIABILITY.md).

#[path = "../../../gradtrace/tests/streams/harness.rs"]
mod harness;

use gradkit_core::{read_table, read_tensor, Input, MetricRow};
use harness::*;

const BIN: &str = env!("CARGO_BIN_EXE_gradselect");

#[test]
fn select_writes_its_files_whatever_the_streams() {
    let d = TmpDir::new("select");
    let t = d.path().join("t.parquet");
    tiny_trace(&t, 2, 2);
    let (out, m) = (d.path().join("sel.parquet"), d.path().join("m.parquet"));
    let args = [
        "--method",
        "topk",
        "--density",
        "0.1",
        t.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--metrics",
        m.to_str().unwrap(),
    ];
    check_with_output(BIN, &args, &out, |p| {
        let s = read_tensor(&Input::Path(p.to_path_buf()), Default::default()).unwrap();
        // 2 steps × 2 ranks × 2 layers, each keeping its selection.
        assert_eq!(s.rows.len(), 8);
        let m = read_table::<MetricRow>(&Input::Path(m.clone()), Default::default()).unwrap();
        assert!(!m.rows.is_empty());
    });
    // The selection to stdout: a full or closed stdout is an error line, never a panic.
    for mode in ALL {
        let r = run(BIN, &args[..5], mode);
        assert_no_panic("gradselect to stdout", mode, &r);
    }
}
