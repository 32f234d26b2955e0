//! The three tables of the data contract (DESIGN §2, docs/FORMAT.md): `tensor/1`, `plan/1`,
//! `metrics/1`, as typed rows with conversion to and from Arrow record batches.

use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow_array::builder::{ListBuilder, UInt32Builder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, UInt32Type, UInt64Type};
use arrow_array::{
    Array, ArrayRef, Float32Array, Float64Array, ListArray, RecordBatch, StringArray, UInt32Array,
    UInt64Array,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

/// Which table a file holds: the value of its `gradkit.schema` metadata key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaKind {
    Tensor,
    Plan,
    Metrics,
}

impl SchemaKind {
    pub fn name(self) -> &'static str {
        match self {
            SchemaKind::Tensor => "tensor/1",
            SchemaKind::Plan => "plan/1",
            SchemaKind::Metrics => "metrics/1",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "tensor/1" => Some(SchemaKind::Tensor),
            "plan/1" => Some(SchemaKind::Plan),
            "metrics/1" => Some(SchemaKind::Metrics),
            _ => None,
        }
    }
}

/// A row type of one of the three tables.
pub trait Table: Sized + Send + 'static {
    const KIND: SchemaKind;
    fn schema() -> SchemaRef;
    fn to_batch(rows: &[Self]) -> Result<RecordBatch>;
    /// Like [`Table::to_batch`], consuming the rows: a table may move big buffers into the
    /// batch instead of copying them (`TensorRow` moves `values` of a one-row batch).
    fn into_batch(rows: Vec<Self>) -> Result<RecordBatch> {
        Self::to_batch(&rows)
    }
    /// Converts a batch whose columns were already checked against [`Table::schema`].
    fn from_batch(batch: &RecordBatch) -> Result<Vec<Self>>;
}

/// One row of `tensor/1`: the gradient (or selection, or reduced result) of one layer held by
/// one rank at one step. `indices == None` is a dense row.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRow {
    pub step: u32,
    pub rank: u32,
    pub layer_id: u32,
    pub layer: String,
    pub numel: u64,
    pub shape: Option<Vec<u32>>,
    pub indices: Option<Vec<u32>>,
    pub values: Vec<f32>,
}

impl TensorRow {
    pub fn is_dense(&self) -> bool {
        self.indices.is_none()
    }
    /// Number of stored values (numel for a dense row, nnz for a sparse one).
    pub fn stored(&self) -> usize {
        self.values.len()
    }
    /// Number of non-zero values.
    pub fn nnz(&self) -> usize {
        self.values.iter().filter(|v| **v != 0.0).count()
    }
    /// The dense vector this row represents.
    pub fn to_dense(&self) -> Vec<f32> {
        match &self.indices {
            None => self.values.clone(),
            Some(idx) => {
                let mut d = vec![0.0; self.numel as usize];
                for (&i, &v) in idx.iter().zip(&self.values) {
                    d[i as usize] = v;
                }
                d
            }
        }
    }
}

/// One row of `plan/1`: a half-open range of a layer owned by a worker from `step` on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanRow {
    pub step: u32,
    pub worker: u32,
    pub layer_id: u32,
    pub layer: String,
    pub start: u64,
    pub end: u64,
    pub k: Option<u64>,
}

/// One row of `metrics/1` (long form).
#[derive(Clone, Debug, PartialEq)]
pub struct MetricRow {
    pub run: String,
    pub tool: String,
    pub algo: String,
    pub world_size: u32,
    pub step: u32,
    pub rank: u32,
    pub metric: String,
    pub value: f64,
}

fn list_field(name: &str, item: DataType, nullable: bool) -> Field {
    Field::new(
        name,
        DataType::List(Arc::new(Field::new_list_field(item, false))),
        nullable,
    )
}

fn list_array<T: Array + 'static>(
    item: DataType,
    lengths: impl IntoIterator<Item = usize>,
    values: T,
    nulls: Option<arrow_buffer::NullBuffer>,
) -> ArrayRef {
    Arc::new(ListArray::new(
        Arc::new(Field::new_list_field(item, false)),
        OffsetBuffer::from_lengths(lengths),
        Arc::new(values),
        nulls,
    ))
}

fn col<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| anyhow!("missing column `{name}`"))
}

fn u32s(batch: &RecordBatch, name: &str) -> Result<Vec<u32>> {
    Ok(col(batch, name)?
        .as_primitive::<UInt32Type>()
        .values()
        .to_vec())
}
fn u64s(batch: &RecordBatch, name: &str) -> Result<Vec<u64>> {
    Ok(col(batch, name)?
        .as_primitive::<UInt64Type>()
        .values()
        .to_vec())
}
fn strings(batch: &RecordBatch, name: &str) -> Result<Vec<String>> {
    let a = col(batch, name)?.as_string::<i32>();
    Ok((0..a.len()).map(|i| a.value(i).to_string()).collect())
}

/// Rejects nulls in a column the contract declares non-null (pyarrow writes nullable columns).
fn no_nulls(batch: &RecordBatch, names: &[&str]) -> Result<()> {
    for n in names {
        let c = col(batch, n)?;
        if c.null_count() > 0 {
            bail!("column `{n}` has null values; the format requires a value in every row");
        }
        if let DataType::List(_) = c.data_type() {
            if c.as_list::<i32>().values().null_count() > 0 {
                bail!("column `{n}` has null list items");
            }
        }
    }
    Ok(())
}

/// The rows of a list column whose items are primitive `T` (None for a null row).
fn list_rows<T: arrow_array::ArrowPrimitiveType>(
    a: &ListArray,
) -> impl Iterator<Item = Option<Vec<T::Native>>> + '_ {
    // Offsets index the whole child array, also for a sliced list.
    let offs = a.value_offsets();
    let slice = &a.values().as_primitive::<T>().values()[..];
    (0..a.len()).map(move |i| {
        (!a.is_null(i)).then(|| slice[offs[i] as usize..offs[i + 1] as usize].to_vec())
    })
}

impl Table for TensorRow {
    const KIND: SchemaKind = SchemaKind::Tensor;
    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("step", DataType::UInt32, false),
            Field::new("rank", DataType::UInt32, false),
            Field::new("layer_id", DataType::UInt32, false),
            Field::new("layer", DataType::Utf8, false),
            Field::new("numel", DataType::UInt64, false),
            list_field("shape", DataType::UInt32, true),
            list_field("indices", DataType::UInt32, true),
            list_field("values", DataType::Float32, false),
        ]))
    }

    fn to_batch(rows: &[Self]) -> Result<RecordBatch> {
        let step = UInt32Array::from_iter_values(rows.iter().map(|r| r.step));
        let rank = UInt32Array::from_iter_values(rows.iter().map(|r| r.rank));
        let layer_id = UInt32Array::from_iter_values(rows.iter().map(|r| r.layer_id));
        let layer = StringArray::from_iter_values(rows.iter().map(|r| r.layer.as_str()));
        let numel = UInt64Array::from_iter_values(rows.iter().map(|r| r.numel));
        let mut shape = ListBuilder::new(UInt32Builder::new())
            .with_field(Arc::new(Field::new_list_field(DataType::UInt32, false)));
        for r in rows {
            match &r.shape {
                Some(s) => {
                    shape.values().append_slice(s);
                    shape.append(true)
                }
                None => shape.append(false),
            }
        }
        let idx_total: usize = rows
            .iter()
            .map(|r| r.indices.as_ref().map_or(0, |i| i.len()))
            .sum();
        let mut idx = Vec::with_capacity(idx_total);
        for r in rows {
            if let Some(i) = &r.indices {
                idx.extend_from_slice(i);
            }
        }
        let idx_nulls =
            arrow_buffer::NullBuffer::from_iter(rows.iter().map(|r| r.indices.is_some()));
        let indices = list_array(
            DataType::UInt32,
            rows.iter()
                .map(|r| r.indices.as_ref().map_or(0, |i| i.len())),
            UInt32Array::from(idx),
            Some(idx_nulls),
        );
        let val_total: usize = rows.iter().map(|r| r.values.len()).sum();
        let mut vals = Vec::with_capacity(val_total);
        for r in rows {
            vals.extend_from_slice(&r.values);
        }
        let values = list_array(
            DataType::Float32,
            rows.iter().map(|r| r.values.len()),
            Float32Array::from(vals),
            None,
        );
        Ok(RecordBatch::try_new(
            Self::schema(),
            vec![
                Arc::new(step),
                Arc::new(rank),
                Arc::new(layer_id),
                Arc::new(layer),
                Arc::new(numel),
                Arc::new(shape.finish()),
                indices,
                values,
            ],
        )?)
    }

    fn into_batch(mut rows: Vec<Self>) -> Result<RecordBatch> {
        if rows.len() != 1 {
            return Self::to_batch(&rows);
        }
        // One row: its values become the batch's `values` buffer without a copy.
        let values = std::mem::take(&mut rows[0].values);
        let mut b = Self::to_batch(&rows)?;
        let n = values.len();
        let list = list_array(
            DataType::Float32,
            [n],
            Float32Array::new(values.into(), None),
            None,
        );
        let idx = b.schema().index_of("values")?;
        let mut cols = b.columns().to_vec();
        cols[idx] = list;
        b = RecordBatch::try_new(Self::schema(), cols)?;
        Ok(b)
    }

    fn from_batch(b: &RecordBatch) -> Result<Vec<Self>> {
        no_nulls(b, &["step", "rank", "layer_id", "layer", "numel", "values"])?;
        let step = u32s(b, "step")?;
        let rank = u32s(b, "rank")?;
        let layer_id = u32s(b, "layer_id")?;
        let layer = strings(b, "layer")?;
        let numel = u64s(b, "numel")?;
        let shape = col(b, "shape")?.as_list::<i32>();
        let indices = col(b, "indices")?.as_list::<i32>();
        if indices.values().null_count() > 0 || shape.values().null_count() > 0 {
            bail!("columns `indices`/`shape` have null list items");
        }
        let values = col(b, "values")?.as_list::<i32>();
        let rows = step
            .into_iter()
            .zip(rank)
            .zip(layer_id)
            .zip(layer)
            .zip(numel)
            .zip(list_rows::<UInt32Type>(shape))
            .zip(list_rows::<UInt32Type>(indices))
            .zip(list_rows::<Float32Type>(values))
            .map(
                |(((((((step, rank), layer_id), layer), numel), shape), indices), values)| {
                    TensorRow {
                        step,
                        rank,
                        layer_id,
                        layer,
                        numel,
                        shape,
                        indices,
                        values: values.unwrap_or_default(),
                    }
                },
            )
            .collect();
        Ok(rows)
    }
}

impl Table for PlanRow {
    const KIND: SchemaKind = SchemaKind::Plan;
    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("step", DataType::UInt32, false),
            Field::new("worker", DataType::UInt32, false),
            Field::new("layer_id", DataType::UInt32, false),
            Field::new("layer", DataType::Utf8, false),
            Field::new("start", DataType::UInt64, false),
            Field::new("end", DataType::UInt64, false),
            Field::new("k", DataType::UInt64, true),
        ]))
    }
    fn to_batch(rows: &[Self]) -> Result<RecordBatch> {
        Ok(RecordBatch::try_new(
            Self::schema(),
            vec![
                Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.step))),
                Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.worker))),
                Arc::new(UInt32Array::from_iter_values(
                    rows.iter().map(|r| r.layer_id),
                )),
                Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|r| r.layer.as_str()),
                )),
                Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.start))),
                Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.end))),
                Arc::new(UInt64Array::from_iter(rows.iter().map(|r| r.k))),
            ],
        )?)
    }
    fn from_batch(b: &RecordBatch) -> Result<Vec<Self>> {
        no_nulls(b, &["step", "worker", "layer_id", "layer", "start", "end"])?;
        let k = col(b, "k")?.as_primitive::<UInt64Type>();
        let ks: Vec<Option<u64>> = (0..k.len())
            .map(|i| (!k.is_null(i)).then(|| k.value(i)))
            .collect();
        let (step, worker, layer_id, layer, start, end) = (
            u32s(b, "step")?,
            u32s(b, "worker")?,
            u32s(b, "layer_id")?,
            strings(b, "layer")?,
            u64s(b, "start")?,
            u64s(b, "end")?,
        );
        Ok((0..b.num_rows())
            .map(|i| PlanRow {
                step: step[i],
                worker: worker[i],
                layer_id: layer_id[i],
                layer: layer[i].clone(),
                start: start[i],
                end: end[i],
                k: ks[i],
            })
            .collect())
    }
}

impl Table for MetricRow {
    const KIND: SchemaKind = SchemaKind::Metrics;
    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("run", DataType::Utf8, false),
            Field::new("tool", DataType::Utf8, false),
            Field::new("algo", DataType::Utf8, false),
            Field::new("world_size", DataType::UInt32, false),
            Field::new("step", DataType::UInt32, false),
            Field::new("rank", DataType::UInt32, false),
            Field::new("metric", DataType::Utf8, false),
            Field::new("value", DataType::Float64, false),
        ]))
    }
    fn to_batch(rows: &[Self]) -> Result<RecordBatch> {
        let s = |f: fn(&MetricRow) -> &str| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(rows.iter().map(f)))
        };
        Ok(RecordBatch::try_new(
            Self::schema(),
            vec![
                s(|r| &r.run),
                s(|r| &r.tool),
                s(|r| &r.algo),
                Arc::new(UInt32Array::from_iter_values(
                    rows.iter().map(|r| r.world_size),
                )),
                Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.step))),
                Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.rank))),
                s(|r| &r.metric),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.value))),
            ],
        )?)
    }
    fn from_batch(b: &RecordBatch) -> Result<Vec<Self>> {
        no_nulls(
            b,
            &[
                "run",
                "tool",
                "algo",
                "world_size",
                "step",
                "rank",
                "metric",
                "value",
            ],
        )?;
        let (run, tool, algo, metric) = (
            strings(b, "run")?,
            strings(b, "tool")?,
            strings(b, "algo")?,
            strings(b, "metric")?,
        );
        let (ws, step, rank) = (u32s(b, "world_size")?, u32s(b, "step")?, u32s(b, "rank")?);
        let value = col(b, "value")?
            .as_primitive::<Float64Type>()
            .values()
            .to_vec();
        Ok((0..b.num_rows())
            .map(|i| MetricRow {
                run: run[i].clone(),
                tool: tool[i].clone(),
                algo: algo[i].clone(),
                world_size: ws[i],
                step: step[i],
                rank: rank[i],
                metric: metric[i].clone(),
                value: value[i],
            })
            .collect())
    }
}

/// Checks that `actual` has every column of `expected` with the expected Arrow type
/// (list item names and nullability are not compared: pyarrow and arrow-rs differ there).
pub fn check_schema(expected: &Schema, actual: &Schema) -> Result<()> {
    for f in expected.fields() {
        let a = actual.field_with_name(f.name()).map_err(|_| {
            anyhow!(
                "missing column `{}` (expected {})",
                f.name(),
                type_name(f.data_type())
            )
        })?;
        let ok = match (f.data_type(), a.data_type()) {
            (DataType::List(e), DataType::List(g)) => e.data_type() == g.data_type(),
            (e, g) => e == g,
        };
        if !ok {
            bail!(
                "column `{}` has type {}, expected {}",
                f.name(),
                type_name(a.data_type()),
                type_name(f.data_type())
            );
        }
    }
    Ok(())
}

fn type_name(t: &DataType) -> String {
    match t {
        DataType::List(f) => format!("List<{}>", type_name(f.data_type())),
        DataType::LargeList(f) => format!("LargeList<{}>", type_name(f.data_type())),
        other => format!("{other}"),
    }
}

/// Validates the `tensor/1` invariants of one row (everything that does not need other rows).
pub fn validate_tensor_row(r: &TensorRow, allow_nonfinite: bool) -> Result<()> {
    let ctx = || format!("step {} rank {} layer `{}`", r.step, r.rank, r.layer);
    match &r.indices {
        None => {
            if r.values.len() as u64 != r.numel {
                bail!(
                    "column `values`: dense row has {} values but numel is {} ({})",
                    r.values.len(),
                    r.numel,
                    ctx()
                );
            }
        }
        Some(idx) => {
            if idx.len() != r.values.len() {
                bail!(
                    "column `values`: sparse row has {} values but {} indices ({})",
                    r.values.len(),
                    idx.len(),
                    ctx()
                );
            }
            if let Some(w) = idx.windows(2).position(|w| w[0] >= w[1]) {
                bail!(
                    "column `indices`: not strictly ascending at position {} ({} then {}) ({})",
                    w + 1,
                    idx[w],
                    idx[w + 1],
                    ctx()
                );
            }
            if let Some(&last) = idx.last() {
                if last as u64 >= r.numel {
                    bail!(
                        "column `indices`: index {last} out of range for numel {} ({})",
                        r.numel,
                        ctx()
                    );
                }
            }
        }
    }
    if let Some(s) = &r.shape {
        let prod: u64 = s.iter().map(|&d| d as u64).product();
        if prod != r.numel {
            bail!(
                "column `shape`: {:?} has {} elements but numel is {} ({})",
                s,
                prod,
                r.numel,
                ctx()
            );
        }
    }
    if !allow_nonfinite {
        if let Some(p) = r.values.iter().position(|v| !v.is_finite()) {
            bail!(
                "column `values`: non-finite value {} at position {p} ({}); pass --allow-nonfinite to accept",
                r.values[p],
                ctx()
            );
        }
    }
    Ok(())
}

/// Cross-row `tensor/1` check: a layer name has one `layer_id` and one `numel` everywhere.
#[derive(Default)]
pub struct LayerRegistry {
    by_name: std::collections::HashMap<String, (u32, u64)>,
    by_id: std::collections::HashMap<u32, String>,
}

impl LayerRegistry {
    pub fn check(&mut self, r: &TensorRow) -> Result<()> {
        if let Some(&(id, n)) = self.by_name.get(&r.layer) {
            if id != r.layer_id {
                bail!(
                    "column `layer_id`: layer `{}` has layer_id {} in one row and {} in another",
                    r.layer,
                    id,
                    r.layer_id
                );
            }
            if n != r.numel {
                bail!(
                    "column `numel`: layer `{}` has numel {} in one row and {} in another",
                    r.layer,
                    n,
                    r.numel
                );
            }
            return Ok(());
        }
        if let Some(other) = self.by_id.get(&r.layer_id) {
            bail!(
                "column `layer_id`: id {} names both `{}` and `{}`",
                r.layer_id,
                other,
                r.layer
            );
        }
        self.by_name.insert(r.layer.clone(), (r.layer_id, r.numel));
        self.by_id.insert(r.layer_id, r.layer.clone());
        Ok(())
    }
}

/// Checks that a batch's schema matches `T` and converts it, naming the problem on failure.
pub fn batch_to_rows<T: Table>(batch: &RecordBatch) -> Result<Vec<T>> {
    check_schema(&T::schema(), batch.schema().as_ref())?;
    T::from_batch(batch).context("reading rows")
}
