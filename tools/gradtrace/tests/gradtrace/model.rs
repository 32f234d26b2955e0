//! `gradtrace model`: real gradients of gradtrain's models, as a dense trace.

use std::process::Command;

use gradkit_core::{read_tensor, Input};

#[test]
fn model_dumps_one_dense_row_per_step_rank_and_parameter() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("g.parquet");
    let st = Command::new(env!("CARGO_BIN_EXE_gradtrace"))
        .args([
            "model", "--model", "mlp", "--ranks", "2", "--steps", "3", "-q", "-o",
        ])
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    let rows = read_tensor(&Input::Path(out), Default::default())
        .unwrap()
        .rows;
    let layers: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.layer.as_str()).collect();
    assert!(layers.len() >= 4, "{layers:?}");
    assert_eq!(rows.len(), 3 * 2 * layers.len());
    for r in &rows {
        assert!(r.is_dense());
        let shape = r.shape.as_ref().expect("parameter shape recorded");
        assert_eq!(shape.iter().map(|&d| d as u64).product::<u64>(), r.numel);
        assert!(r.values.iter().all(|v| v.is_finite()));
    }
    // Each rank trains on its own shard, so the two ranks' gradients differ at a step, and
    // training moves the parameters, so a rank's gradient changes between steps.
    let g = |step, rank| -> Vec<f32> {
        rows.iter()
            .filter(|r| r.step == step && r.rank == rank)
            .flat_map(|r| r.values.clone())
            .collect()
    };
    assert_ne!(g(0, 0), g(0, 1));
    assert_ne!(g(0, 0), g(1, 0));
    assert!(g(0, 0).iter().any(|v| *v != 0.0));
}
