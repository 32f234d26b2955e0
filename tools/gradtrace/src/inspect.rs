//! `gradtrace inspect`: a per-layer summary of a `tensor/1` trace.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use gradkit_core::cli::{fmt_num, Format, TextTable};
use gradkit_core::io::{Input, ReadOptions, TensorStream};
use gradkit_core::TensorRow;

/// Per-layer accumulators over all rows of the layer.
#[derive(Default)]
struct LayerStats {
    name: String,
    numel: u64,
    shape: Option<Vec<u32>>,
    rows: u64,
    steps: BTreeSet<u32>,
    ranks: BTreeSet<u32>,
    nnz: u64,
    norm_sum: f64,
    min: f32,
    max: f32,
    dense: u64,
}

impl LayerStats {
    fn add(&mut self, r: &TensorRow) {
        if self.rows == 0 {
            self.name = r.layer.clone();
            self.numel = r.numel;
            self.min = f32::INFINITY;
            self.max = f32::NEG_INFINITY;
        }
        if self.shape.is_none() {
            self.shape = r.shape.clone();
        }
        self.rows += 1;
        self.dense += r.is_dense() as u64;
        self.steps.insert(r.step);
        self.ranks.insert(r.rank);
        self.nnz += r.nnz() as u64;
        self.norm_sum += r
            .values
            .iter()
            .map(|&v| v as f64 * v as f64)
            .sum::<f64>()
            .sqrt();
        // A sparse row's absent coordinates are zeros, so they count in the range.
        let implicit_zero = !r.is_dense() && (r.values.len() as u64) < r.numel;
        for &v in r.values.iter().chain(implicit_zero.then_some(&0.0)) {
            // NaN (accepted with --allow-nonfinite) does not move min/max.
            self.min = self.min.min(v);
            self.max = self.max.max(v);
        }
    }
}

/// What the summary needs of the whole trace, gathered row by row.
#[derive(Default)]
struct Totals {
    rows: u64,
    dense: u64,
    steps: BTreeSet<u32>,
    ranks: BTreeSet<u32>,
}

pub fn run(input: &Input, opts: ReadOptions, format: Format) -> Result<()> {
    // The rows stream through in file order, a record batch at a time (docs/MEMORY.md): every
    // number below is a sum, a count, a min/max or a set of steps and ranks.
    let mut chunks = TensorStream::open(input, opts)?.chunks();
    let mut layers: BTreeMap<u32, LayerStats> = BTreeMap::new();
    let mut totals = Totals::default();
    while let Some(rows) = chunks.next_chunk()? {
        for r in &rows {
            layers.entry(r.layer_id).or_default().add(r);
            totals.rows += 1;
            totals.dense += r.is_dense() as u64;
            totals.steps.insert(r.step);
            totals.ranks.insert(r.rank);
        }
    }
    let mut table = TextTable::new([
        "layer_id", "layer", "shape", "numel", "rows", "steps", "ranks", "nnz", "density",
        "l2_norm", "min", "max",
    ]);
    for (id, l) in &layers {
        let shape = l.shape.as_ref().map_or("-".to_string(), |s| {
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("x")
        });
        let density = l.nnz as f64 / (l.numel as f64 * l.rows as f64).max(1.0);
        table.push([
            id.to_string(),
            l.name.clone(),
            shape,
            l.numel.to_string(),
            l.rows.to_string(),
            l.steps.len().to_string(),
            l.ranks.len().to_string(),
            l.nnz.to_string(),
            fmt_num(density, 4),
            fmt_num(l.norm_sum / l.rows as f64, 4),
            range(l.min, l.max, l.min),
            range(l.min, l.max, l.max),
        ]);
    }
    if format == Format::Md {
        print_summary(&chunks.source, &chunks.meta, &totals, &layers)?;
    }
    table.print(format)
}

/// `v`, the min or the max of a layer's values, or `-` where the layer held none (no entries,
/// or only NaN): min > max is the empty range, not the infinities it starts from.
fn range(min: f32, max: f32, v: f32) -> String {
    if min > max {
        "-".into()
    } else {
        fmt_num(v as f64, 4)
    }
}

/// The one-paragraph header of the Markdown output.
/// Written with errors returned (never `println!`, which panics on a full or closed stdout).
fn print_summary(
    source: &str,
    meta: &gradkit_core::Meta,
    t: &Totals,
    layers: &BTreeMap<u32, LayerStats>,
) -> Result<()> {
    use std::fmt::Write as _;
    let steps: Vec<u32> = t.steps.iter().copied().collect();
    let ranks: Vec<u32> = t.ranks.iter().copied().collect();
    let numel: u64 = layers.values().map(|l| l.numel).sum();
    let kind = match (t.dense, t.rows) {
        (_, 0) => "empty",
        (d, n) if d == n => "dense",
        (0, _) => "sparse",
        _ => "dense and sparse",
    };
    let range = |v: &[u32]| match (v.first(), v.last()) {
        (Some(a), Some(b)) if a != b => format!(" ({a}..{b})"),
        (Some(a), _) => format!(" ({a})"),
        _ => String::new(),
    };
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{}: {} rows ({kind}), {} steps{}, {} ranks{}, {} layers, {} elements per step and rank",
        source,
        t.rows,
        steps.len(),
        range(&steps),
        ranks.len(),
        range(&ranks),
        layers.len(),
        numel
    );
    for key in ["gradkit.producer", "gradkit.method", "gradkit.world_size"] {
        if let Some(v) = meta.get(key) {
            let _ = writeln!(text, "{key}: {v}");
        }
    }
    text.push('\n');
    let mut o = std::io::stdout().lock();
    std::io::Write::write_all(&mut o, text.as_bytes())
        .map_err(|e| anyhow::Error::new(e).context("writing <stdout>"))
}
