//! `gradreport tensor`: nnz, density and L2 norm of every layer of a `tensor/1` file, per step
//! and rank (ad hoc looks at traces, selections and reduced results).

use gradkit_core::cli::TextTable;
use gradkit_core::TensorRow;

use crate::metrics::fmt;

/// Statistics of one row of `tensor/1`.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerStats {
    pub step: u32,
    pub rank: u32,
    pub layer_id: u32,
    pub layer: String,
    pub numel: u64,
    /// `dense`, or `sparse` for a row with indices.
    pub kind: &'static str,
    /// Stored values that are not zero.
    pub nnz: u64,
    /// nnz / numel.
    pub density: f64,
    /// sqrt(sum of squares), accumulated in f64.
    pub l2: f64,
}

/// Statistics of one row.
pub fn layer_stats(r: &TensorRow) -> LayerStats {
    let nnz = r.values.iter().filter(|v| **v != 0.0).count() as u64;
    let l2 = r
        .values
        .iter()
        .map(|&v| (v as f64) * (v as f64))
        .sum::<f64>()
        .sqrt();
    LayerStats {
        step: r.step,
        rank: r.rank,
        layer_id: r.layer_id,
        layer: r.layer.clone(),
        numel: r.numel,
        kind: if r.is_dense() { "dense" } else { "sparse" },
        nnz,
        density: if r.numel == 0 {
            0.0
        } else {
            nnz as f64 / r.numel as f64
        },
        l2,
    }
}

/// Statistics of every row that passes the filters, ordered by step, rank, layer_id.
pub fn stats(rows: &[TensorRow], step: Option<u32>, rank: Option<u32>) -> Vec<LayerStats> {
    let mut out: Vec<LayerStats> = rows
        .iter()
        .filter(|r| step.is_none_or(|s| r.step == s) && rank.is_none_or(|k| r.rank == k))
        .map(layer_stats)
        .collect();
    out.sort_by_key(|s| (s.step, s.rank, s.layer_id));
    out
}

/// The statistics as a text table.
pub fn render(stats: &[LayerStats]) -> TextTable {
    let mut t = TextTable::new([
        "step", "rank", "layer_id", "layer", "numel", "kind", "nnz", "density", "l2",
    ]);
    for s in stats {
        t.push([
            s.step.to_string(),
            s.rank.to_string(),
            s.layer_id.to_string(),
            s.layer.clone(),
            s.numel.to_string(),
            s.kind.to_string(),
            s.nnz.to_string(),
            fmt(s.density),
            fmt(s.l2),
        ]);
    }
    t
}
