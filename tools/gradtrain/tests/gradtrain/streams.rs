//! gradtrain with closed, full, `head -1` and broken stdout/stderr: no panic, and the
//! metrics written whole even when the summary on stderr cannot be (docs/RELIABILITY.md).

#[path = "../../../gradtrace/tests/streams/harness.rs"]
mod harness;

use gradkit_core::{read_table, Input, MetricRow};
use harness::*;

const BIN: &str = env!("CARGO_BIN_EXE_gradtrain");

#[test]
fn train_writes_its_metrics_whatever_the_streams() {
    let d = TmpDir::new("train");
    let m = d.path().join("m.parquet");
    let args = [
        "--steps",
        "2",
        "--ranks",
        "2",
        "--batch",
        "8",
        "--metrics",
        m.to_str().unwrap(),
    ];
    check_with_output(BIN, &args, &m, |p| {
        let rows = read_table::<MetricRow>(&Input::Path(p.to_path_buf()), Default::default())
            .unwrap()
            .rows;
        // A loss for each of the 2 steps on each of the 2 ranks.
        let losses = rows.iter().filter(|r| r.metric == "loss").count();
        assert_eq!(losses, 4, "{rows:?}");
    });
}
