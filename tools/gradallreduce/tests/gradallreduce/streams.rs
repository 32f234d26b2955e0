//! gradallreduce with closed, full, `head -1` and broken stdout/stderr: no panic, the reduced
//! trace and metrics written whole, and `bench`'s table never a panic (docs/RELIABILITY.md).

#[path = "../../../gradtrace/tests/streams/harness.rs"]
mod harness;

use gradkit_core::{read_table, read_tensor, Input, MetricRow};
use harness::*;

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

#[test]
fn reduce_writes_its_files_whatever_the_streams() {
    let d = TmpDir::new("reduce");
    let t = d.path().join("t.parquet");
    tiny_trace(&t, 2, 2);
    let want = read_tensor(&Input::Path(t.clone()), Default::default()).unwrap();
    let (out, m) = (d.path().join("r.parquet"), d.path().join("m.parquet"));
    let args = [
        "--algo",
        "ring",
        "--ranks",
        "2",
        t.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--metrics",
        m.to_str().unwrap(),
    ];
    check_with_output(BIN, &args, &out, |p| {
        let r = read_tensor(&Input::Path(p.to_path_buf()), Default::default()).unwrap();
        // The sum of the two ranks' rows, computed here (small integers: exact in f32).
        for row in &r.rows {
            let sum: Vec<f32> = (0..row.numel as usize)
                .map(|i| {
                    want.rows
                        .iter()
                        .filter(|w| w.step == row.step && w.layer_id == row.layer_id)
                        .map(|w| w.values[i])
                        .sum()
                })
                .collect();
            assert_eq!(row.to_dense(), sum);
        }
        assert_eq!(r.rows.len(), 4);
        let m = read_table::<MetricRow>(&Input::Path(m.clone()), Default::default()).unwrap();
        assert!(!m.rows.is_empty());
    });
}

#[test]
fn bench_table_never_panics() {
    check_stdout_tool(
        BIN,
        &[
            "bench", "--algo", "ring", "--ranks", "2", "--sizes", "1K:4K", "--iters", "1",
            "--warmup", "0",
        ],
    );
}
