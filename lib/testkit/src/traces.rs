//! Dense traces for the tools' tests: deterministic values that are not all alike, so sums,
//! selections and orders are exercised.

use gradkit_core::TensorRow;

/// A dense trace: `steps` × `p` ranks × the `layers` (name, numel), values in about [−1, 1]
/// from a fixed pattern of (element, rank, step).
pub fn dense(p: u32, steps: u32, layers: &[(&str, u64)]) -> Vec<TensorRow> {
    let mut rows = Vec::new();
    for step in 0..steps {
        for rank in 0..p {
            for (layer_id, &(name, n)) in layers.iter().enumerate() {
                let values = (0..n)
                    .map(|i| {
                        (((i * 7919 + rank as u64 * 104729 + step as u64 * 31) % 2001) as f32
                            - 1000.0)
                            / 997.0
                    })
                    .collect();
                rows.push(TensorRow {
                    step,
                    rank,
                    layer_id: layer_id as u32,
                    layer: name.into(),
                    numel: n,
                    shape: Some(vec![n as u32]),
                    indices: None,
                    values,
                });
            }
        }
    }
    rows
}
