//! gradpartition with closed, full, `head -1` and broken stdout/stderr: no panic, and the
//! plan written whole even when its stderr tables cannot be (docs/RELIABILITY.md).

#[path = "../../../gradtrace/tests/streams/harness.rs"]
mod harness;

use gradkit_core::{read_table, Input, MetricRow, PlanRow};
use harness::*;

const BIN: &str = env!("CARGO_BIN_EXE_gradpartition");

#[test]
fn partition_writes_its_plan_whatever_the_streams() {
    let d = TmpDir::new("partition");
    let t = d.path().join("t.parquet");
    tiny_trace(&t, 2, 2);
    let (out, m) = (d.path().join("plan.parquet"), d.path().join("m.parquet"));
    let args = [
        "--method",
        "deft",
        "--density",
        "0.1",
        "--workers",
        "2",
        t.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--metrics",
        m.to_str().unwrap(),
    ];
    check_with_output(BIN, &args, &out, |p| {
        let plan =
            read_table::<PlanRow>(&Input::Path(p.to_path_buf()), Default::default()).unwrap();
        // Every step's ranges tile both layers (217 elements) exactly once.
        for step in [0, 1] {
            let covered: u64 = plan
                .rows
                .iter()
                .filter(|r| r.step == step)
                .map(|r| r.end - r.start)
                .sum();
            assert_eq!(covered, 217, "step {step}");
        }
        let m = read_table::<MetricRow>(&Input::Path(m.clone()), Default::default()).unwrap();
        assert!(!m.rows.is_empty());
    });
}
