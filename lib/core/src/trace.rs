//! Views over a `tensor/1` trace that every tool needs: the model's layer layout, rows grouped
//! by (step, rank), and the flat index space that concatenates layers by `layer_id`.

use std::collections::BTreeMap;

use std::sync::Arc;

use anyhow::{bail, Result};

use crate::tables::{MetricRow, RunSettings, TensorRow};

/// One layer of the model, as the trace describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerInfo {
    pub layer_id: u32,
    pub name: String,
    pub numel: u64,
    pub shape: Option<Vec<u32>>,
    /// Offset of the layer's first element in the flat index space.
    pub offset: u64,
}

/// The layers of a model in `layer_id` order, with their offsets in the flat index space.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Layout {
    pub layers: Vec<LayerInfo>,
}

impl Layout {
    /// Builds a layout from (layer_id, name, numel, shape) in any order.
    pub fn new(mut layers: Vec<(u32, String, u64, Option<Vec<u32>>)>) -> Self {
        layers.sort_by_key(|l| l.0);
        layers.dedup_by_key(|l| l.0);
        let mut offset = 0;
        let layers = layers
            .into_iter()
            .map(|(layer_id, name, numel, shape)| {
                let l = LayerInfo {
                    layer_id,
                    name,
                    numel,
                    shape,
                    offset,
                };
                offset += numel;
                l
            })
            .collect();
        Layout { layers }
    }
    /// The layout of the layers that appear in `rows`.
    pub fn of_rows(rows: &[TensorRow]) -> Self {
        let mut seen: BTreeMap<u32, (String, u64, Option<Vec<u32>>)> = BTreeMap::new();
        for r in rows {
            let e = seen
                .entry(r.layer_id)
                .or_insert_with(|| (r.layer.clone(), r.numel, r.shape.clone()));
            if e.2.is_none() {
                e.2 = r.shape.clone();
            }
        }
        Layout::new(
            seen.into_iter()
                .map(|(id, (n, s, sh))| (id, n, s, sh))
                .collect(),
        )
    }
    /// Total number of elements (the flat index space's size).
    pub fn total(&self) -> u64 {
        self.layers.iter().map(|l| l.numel).sum()
    }
    /// Index of the layer holding flat position `pos`.
    pub fn layer_of(&self, pos: u64) -> usize {
        self.layers.partition_point(|l| l.offset + l.numel <= pos)
    }
    pub fn by_id(&self, layer_id: u32) -> Option<&LayerInfo> {
        self.layers
            .binary_search_by_key(&layer_id, |l| l.layer_id)
            .ok()
            .map(|i| &self.layers[i])
    }
}

/// A sparse vector in COO form: strictly ascending indices with one value each.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sparse {
    pub indices: Vec<u32>,
    pub values: Vec<f32>,
}

impl Sparse {
    pub fn len(&self) -> usize {
        self.indices.len()
    }
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
    pub fn to_dense(&self, n: usize) -> Vec<f32> {
        let mut d = vec![0.0; n];
        for (&i, &v) in self.indices.iter().zip(&self.values) {
            d[i as usize] += v;
        }
        d
    }
}

/// The rows of one (step, rank) pair, in `layer_id` order.
#[derive(Clone, Debug)]
pub struct StepRank<'a> {
    pub step: u32,
    pub rank: u32,
    pub rows: Vec<&'a TensorRow>,
}

/// Groups rows by (step, rank), both ascending, each group in `layer_id` order.
pub fn group_step_rank(rows: &[TensorRow]) -> Vec<StepRank<'_>> {
    let mut map: BTreeMap<(u32, u32), Vec<&TensorRow>> = BTreeMap::new();
    for r in rows {
        map.entry((r.step, r.rank)).or_default().push(r);
    }
    map.into_iter()
        .map(|((step, rank), mut rows)| {
            rows.sort_by_key(|r| r.layer_id);
            StepRank { step, rank, rows }
        })
        .collect()
}

/// The sorted distinct steps and ranks of a trace.
pub fn steps_and_ranks(rows: &[TensorRow]) -> (Vec<u32>, Vec<u32>) {
    let mut steps: Vec<u32> = rows.iter().map(|r| r.step).collect();
    let mut ranks: Vec<u32> = rows.iter().map(|r| r.rank).collect();
    steps.sort_unstable();
    steps.dedup();
    ranks.sort_unstable();
    ranks.dedup();
    (steps, ranks)
}

/// Checks that every (step, rank) holds exactly the layers of `layout`, that ranks are
/// `0..P`, and that rows are all dense or all sparse when `want_dense` says so.
pub fn check_complete(rows: &[TensorRow], layout: &Layout, want_dense: Option<bool>) -> Result<()> {
    let (steps, ranks) = steps_and_ranks(rows);
    if let Some((i, r)) = ranks.iter().enumerate().find(|(i, r)| **r as usize != *i) {
        bail!(
            "column `rank`: ranks must be 0..P without gaps, but rank {i} is missing (next is {r})"
        );
    }
    let groups = group_step_rank(rows);
    let mut have: BTreeMap<u32, usize> = BTreeMap::new();
    for g in &groups {
        *have.entry(g.step).or_default() += 1;
        let ids: Vec<u32> = g.rows.iter().map(|r| r.layer_id).collect();
        let want: Vec<u32> = layout.layers.iter().map(|l| l.layer_id).collect();
        if ids != want {
            bail!(
                "step {} rank {}: layers {:?} differ from the trace's layers {:?} (column `layer_id`)",
                g.step,
                g.rank,
                ids,
                want
            );
        }
    }
    for s in &steps {
        if have.get(s).copied().unwrap_or(0) != ranks.len() {
            bail!(
                "step {s}: only {} of {} ranks have rows (a rank is missing this step)",
                have.get(s).copied().unwrap_or(0),
                ranks.len()
            );
        }
    }
    if let Some(d) = want_dense {
        if let Some(r) = rows.iter().find(|r| r.is_dense() != d) {
            bail!(
                "step {} rank {} layer `{}` is {} but this needs {} input (column `indices`)",
                r.step,
                r.rank,
                r.layer,
                if r.is_dense() { "dense" } else { "sparse" },
                if d { "dense" } else { "sparse" }
            );
        }
    }
    Ok(())
}

/// Concatenates dense rows (in `layer_id` order) into one flat vector.
pub fn flatten_dense(rows: &[&TensorRow]) -> Vec<f32> {
    let n: usize = rows.iter().map(|r| r.numel as usize).sum();
    let mut out = Vec::with_capacity(n);
    for r in rows {
        extend_dense(&mut out, r);
    }
    out
}

/// Appends the dense values of `r` (a sparse row scattered into its `numel` zeros).
fn extend_dense(out: &mut Vec<f32>, r: &TensorRow) {
    match &r.indices {
        None => out.extend_from_slice(&r.values),
        Some(_) => out.extend_from_slice(&r.to_dense()),
    }
}

/// One rank's rows of a step (every layer, checked complete) as one flat vector of `n`
/// values in `layer_id` order, consuming the rows: each row is dropped once copied, so the
/// rank's rows and its flat vector are not both held (docs/MEMORY.md).
pub fn take_flat(mut rows: Vec<TensorRow>, n: usize) -> Vec<f32> {
    rows.sort_by_key(|r| r.layer_id);
    let mut flat = Vec::with_capacity(n);
    for r in rows {
        extend_dense(&mut flat, &r);
    }
    flat
}

/// Concatenates sparse rows (in `layer_id` order) into one flat sparse vector.
pub fn flatten_sparse(rows: &[&TensorRow], layout: &Layout) -> Sparse {
    let mut s = Sparse::default();
    for r in rows {
        let off = layout.by_id(r.layer_id).map_or(0, |l| l.offset) as u32;
        match &r.indices {
            Some(idx) => {
                s.indices.extend(idx.iter().map(|i| i + off));
                s.values.extend_from_slice(&r.values);
            }
            None => {
                for (i, v) in r.values.iter().enumerate() {
                    if *v != 0.0 {
                        s.indices.push(off + i as u32);
                        s.values.push(*v);
                    }
                }
            }
        }
    }
    s
}

/// Splits a flat dense vector into dense rows, one per layer.
pub fn unflatten_dense(flat: &[f32], layout: &Layout, step: u32, rank: u32) -> Vec<TensorRow> {
    dense_keys(layout, step, rank)
        .into_iter()
        .map(|(mut row, range)| {
            row.values = flat[range].to_vec();
            row
        })
        .collect()
}

/// The rows [`unflatten_dense`] gives, without their values, each with the range of the flat
/// vector its values are: what `TableWriter::write_dense_step` writes from the flat vector
/// itself, so that a step is not held twice (docs/MEMORY.md).
pub fn dense_keys(
    layout: &Layout,
    step: u32,
    rank: u32,
) -> Vec<(TensorRow, std::ops::Range<usize>)> {
    layout
        .layers
        .iter()
        .map(|l| {
            let key = layer_row(l, step, rank, None, Vec::new());
            (key, l.offset as usize..(l.offset + l.numel) as usize)
        })
        .collect()
}

/// Layer `l`'s row of `(step, rank)` holding `indices` (`None`: dense) and `values`.
fn layer_row(
    l: &LayerInfo,
    step: u32,
    rank: u32,
    indices: Option<Vec<u32>>,
    values: Vec<f32>,
) -> TensorRow {
    TensorRow {
        step,
        rank,
        layer_id: l.layer_id,
        layer: l.name.clone(),
        numel: l.numel,
        shape: l.shape.clone(),
        indices,
        values,
    }
}

/// Splits a flat sparse vector into sparse rows, one per layer (empty layers get empty rows).
pub fn unflatten_sparse(s: &Sparse, layout: &Layout, step: u32, rank: u32) -> Vec<TensorRow> {
    let mut out = Vec::with_capacity(layout.layers.len());
    let mut pos = 0usize;
    for l in &layout.layers {
        let end = l.offset + l.numel;
        let stop = pos + s.indices[pos..].partition_point(|&i| (i as u64) < end);
        let indices = s.indices[pos..stop]
            .iter()
            .map(|&i| i - l.offset as u32)
            .collect();
        out.push(layer_row(
            l,
            step,
            rank,
            Some(indices),
            s.values[pos..stop].to_vec(),
        ));
        pos = stop;
    }
    out
}

/// Builds `metrics/1` rows that share run, tool, algo and world size.
#[derive(Clone, Debug)]
pub struct MetricSink {
    pub run: String,
    pub tool: String,
    pub algo: String,
    pub world_size: u32,
    pub rows: Vec<MetricRow>,
    /// The run's settings, carried by every row ([`MetricSink::with_settings`]).
    pub settings: Arc<RunSettings>,
}

impl MetricSink {
    pub fn new(run: &str, tool: &str, algo: &str, world_size: u32) -> Self {
        MetricSink {
            run: run.into(),
            tool: tool.into(),
            algo: algo.into(),
            world_size,
            rows: Vec::new(),
            settings: Arc::default(),
        }
    }
    /// The run's settings, written as columns beside every row it pushes from now on.
    pub fn with_settings(mut self, settings: RunSettings) -> Self {
        self.settings = Arc::new(settings);
        self
    }
    pub fn push(&mut self, step: u32, rank: u32, metric: &str, value: f64) {
        self.rows.push(MetricRow {
            run: self.run.clone(),
            tool: self.tool.clone(),
            algo: self.algo.clone(),
            world_size: self.world_size,
            step,
            rank,
            metric: metric.into(),
            value,
            settings: self.settings.clone(),
        });
    }
}
