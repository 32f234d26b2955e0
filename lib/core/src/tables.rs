//! The three tables of the data contract (docs/FORMAT.md): `tensor/1`, `plan/1`,
//! `metrics/1`, as typed rows with conversion to and from Arrow record batches.

use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow_array::builder::{ListBuilder, UInt32Builder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, UInt32Type, UInt64Type};
use arrow_array::{
    Array, ArrayRef, ArrowPrimitiveType, Float32Array, Float64Array, ListArray, PrimitiveArray,
    RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

mod commtrace;
pub use commtrace::{CommRow, EventKind};

/// Which table a file holds: the value of its `gradkit.schema` metadata key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaKind {
    Tensor,
    Plan,
    Metrics,
    CommTrace,
}

impl SchemaKind {
    pub fn name(self) -> &'static str {
        match self {
            SchemaKind::Tensor => "tensor/1",
            SchemaKind::Plan => "plan/1",
            SchemaKind::Metrics => "metrics/1",
            SchemaKind::CommTrace => "commtrace/1",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "tensor/1" => Some(SchemaKind::Tensor),
            "plan/1" => Some(SchemaKind::Plan),
            "metrics/1" => Some(SchemaKind::Metrics),
            "commtrace/1" => Some(SchemaKind::CommTrace),
            _ => None,
        }
    }
    /// The table's columns and their canonical Arrow types.
    pub fn schema(self) -> SchemaRef {
        match self {
            SchemaKind::Tensor => TensorRow::schema(),
            SchemaKind::Plan => PlanRow::schema(),
            SchemaKind::Metrics => MetricRow::schema(),
            SchemaKind::CommTrace => CommRow::schema(),
        }
    }
    /// The tables whose every column `schema` has, by name: how a file without the
    /// `gradkit.schema` key (pandas and polars drop it) is recognised. The three tables'
    /// column sets differ, so a file matches at most one unless it carries extra columns.
    pub fn from_columns(schema: &Schema) -> Vec<SchemaKind> {
        [
            SchemaKind::Tensor,
            SchemaKind::Plan,
            SchemaKind::Metrics,
            SchemaKind::CommTrace,
        ]
        .into_iter()
        .filter(|k| {
            k.schema()
                .fields()
                .iter()
                .all(|f| is_optional(f) || schema.field_with_name(f.name()).is_ok())
        })
        .collect()
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
    /// The row as a `tensor/1` row, for the writer's page encoder of the `values` column
    /// (io/write.rs): only [`TensorRow`] has one.
    fn as_tensor(&self) -> Option<&TensorRow> {
        None
    }
    /// Payload bytes of the row as the writer budgets them (64 per row, 4 per list item).
    fn payload_bytes(&self) -> usize {
        64
    }
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
    /// This row without its values (a sparse row keeps an empty `indices`, so it still reads
    /// as sparse): what the whole-step checks (`io::check_step`) look at, for a step whose
    /// values are handed out as they are read.
    pub fn key(&self) -> TensorRow {
        TensorRow {
            layer: self.layer.clone(),
            shape: self.shape.clone(),
            indices: self.indices.as_ref().map(|_| Vec::new()),
            values: Vec::new(),
            ..*self
        }
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
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricRow {
    pub run: String,
    pub tool: String,
    pub algo: String,
    pub world_size: u32,
    pub step: u32,
    pub rank: u32,
    /// The metric's name, with its phase after a colon where it is measured per phase of an
    /// algorithm (`bytes_sent:split_and_reduce`): in the file the phase is its own column,
    /// `phase` (empty for the step's totals), so a filter on `metric` never mixes the two.
    pub metric: String,
    pub value: f64,
    /// The run's settings, the same in every row of a run (the file's `density`,
    /// `optimizer`, `model`, `seed` columns).
    pub settings: Arc<RunSettings>,
}

/// The settings of a run that every `metrics/1` row carries as columns, so that runs are
/// compared by a filter or a group-by instead of by their names; `None` (null) where the
/// run has no such setting (a dense allreduce has no density).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunSettings {
    /// The fraction of entries a sparse method keeps (`--density`).
    pub density: Option<f64>,
    /// The optimiser (`gradtrain --optimizer`).
    pub optimizer: Option<String>,
    /// The model (`gradtrain --model`).
    pub model: Option<String>,
    /// The seed of the run's randomness (`--seed`).
    pub seed: Option<u64>,
}

/// Metrics measured per phase of an algorithm: written as a `phase` column beside the metric,
/// `name:phase` in [`MetricRow::metric`]. Other names with a colon (`lamb_coeff:<tensor>`)
/// are whole metric names.
pub const PHASE_METRICS: &[&str] = &[
    "bytes_sent",
    "bytes_recv",
    "messages",
    "time_s",
    "wait_s",
    "sim_time_s",
    "recorded_time_s",
    "model_time_s",
];

impl MetricRow {
    /// The metric's name and its phase (`""` for a step's total): the file's `metric` and
    /// `phase` columns.
    pub fn name_and_phase(&self) -> (&str, &str) {
        match self.metric.split_once(':') {
            Some((name, phase)) if PHASE_METRICS.contains(&name) => (name, phase),
            _ => (&self.metric, ""),
        }
    }
}

/// A column a reader does without: older files lack it (read as null) and new writers
/// always write it. Marked by the field metadata key `gradkit.optional`.
fn optional(f: Field) -> Field {
    f.with_metadata(std::collections::HashMap::from([(
        "gradkit.optional".to_string(),
        "1".to_string(),
    )]))
}

/// Whether a column of a table's schema may be absent from a file (see [`optional`]).
pub fn is_optional(f: &Field) -> bool {
    f.metadata().contains_key("gradkit.optional")
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
    fn as_tensor(&self) -> Option<&TensorRow> {
        Some(self)
    }
    fn payload_bytes(&self) -> usize {
        64 + 4 * (self.values.len() + self.indices.as_ref().map_or(0, |i| i.len()))
    }
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
            optional(Field::new("phase", DataType::Utf8, false)),
            Field::new("value", DataType::Float64, false),
            optional(Field::new("density", DataType::Float64, true)),
            optional(Field::new("optimizer", DataType::Utf8, true)),
            optional(Field::new("model", DataType::Utf8, true)),
            optional(Field::new("seed", DataType::UInt64, true)),
        ]))
    }
    fn to_batch(rows: &[Self]) -> Result<RecordBatch> {
        let s = |f: fn(&MetricRow) -> &str| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(rows.iter().map(f)))
        };
        let opt_s = |f: fn(&RunSettings) -> Option<&str>| -> ArrayRef {
            Arc::new(StringArray::from_iter(rows.iter().map(|r| f(&r.settings))))
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
                s(|r| r.name_and_phase().0),
                s(|r| r.name_and_phase().1),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.value))),
                Arc::new(Float64Array::from_iter(
                    rows.iter().map(|r| r.settings.density),
                )),
                opt_s(|s| s.optimizer.as_deref()),
                opt_s(|s| s.model.as_deref()),
                Arc::new(UInt64Array::from_iter(rows.iter().map(|r| r.settings.seed))),
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
        let phase = col(b, "phase")?.as_string::<i32>();
        let settings = run_settings(b)?;
        Ok((0..b.num_rows())
            .map(|i| MetricRow {
                run: run[i].clone(),
                tool: tool[i].clone(),
                algo: algo[i].clone(),
                world_size: ws[i],
                step: step[i],
                rank: rank[i],
                // A file from before the `phase` column holds `name:phase` in `metric`.
                metric: match phase.is_valid(i).then(|| phase.value(i)) {
                    Some(p) if !p.is_empty() => format!("{}:{p}", metric[i]),
                    _ => metric[i].clone(),
                },
                value: value[i],
                settings: settings[i].clone(),
            })
            .collect())
    }
}

/// Each row's [`RunSettings`], shared between the rows of a run (consecutive rows with the
/// same settings share one allocation).
fn run_settings(b: &RecordBatch) -> Result<Vec<Arc<RunSettings>>> {
    let density = col(b, "density")?.as_primitive::<Float64Type>();
    let optimizer = col(b, "optimizer")?.as_string::<i32>();
    let model = col(b, "model")?.as_string::<i32>();
    let seed = col(b, "seed")?.as_primitive::<UInt64Type>();
    let s = |a: &arrow_array::StringArray, i: usize| a.is_valid(i).then(|| a.value(i).to_string());
    let mut out: Vec<Arc<RunSettings>> = Vec::with_capacity(b.num_rows());
    for i in 0..b.num_rows() {
        let r = RunSettings {
            density: density.is_valid(i).then(|| density.value(i)),
            optimizer: s(optimizer, i),
            model: s(model, i),
            seed: seed.is_valid(i).then(|| seed.value(i)),
        };
        match out.last() {
            Some(prev) if **prev == r => out.push(prev.clone()),
            _ => out.push(Arc::new(r)),
        }
    }
    Ok(out)
}

/// Checks that `actual` has every column of `expected` with the expected Arrow type or one
/// that [`conform`] casts to it without changing a value (list item names and nullability
/// are not compared: pyarrow and arrow-rs differ there). Extra columns are ignored.
pub fn check_schema(expected: &Schema, actual: &Schema) -> Result<()> {
    for f in expected.fields() {
        if is_optional(f) && actual.field_with_name(f.name()).is_err() {
            continue;
        }
        let a = actual.field_with_name(f.name()).map_err(|_| {
            anyhow!(
                "missing column `{}` (expected {})",
                f.name(),
                type_name(f.data_type())
            )
        })?;
        if !castable(f.data_type(), a.data_type(), f.is_nullable()) {
            bail!(
                "column `{}` has type {}, expected {}{}",
                f.name(),
                type_name(a.data_type()),
                type_name(f.data_type()),
                narrowing_hint(f.data_type(), a.data_type())
            );
        }
    }
    Ok(())
}

// ---- Other writers' physical types --------------------------------------------------------
//
// pandas, polars and pyarrow write the same logical columns with other Arrow types: LargeUtf8
// and LargeList (polars), a column typed Null when every row is null (pandas, e.g. `indices`
// of a dense-only trace), Int64 for integers (a DataFrame built from Python ints), Float64 for
// an integer column with nulls (pandas). Every reader casts them here, once per record batch,
// and only where no value changes: integers are range-checked, whole-number floats become
// integers, Float32 widens to Float64; Float64 never narrows to Float32 (the format stores
// gradients as float32, and a silent rounding would make two "equal" files differ).

/// `t` with the representation-only variants replaced by the canonical type: LargeUtf8,
/// Utf8View and dictionary-encoded strings read as Utf8; LargeList and FixedSizeList as List.
fn canonical_type(t: &DataType) -> DataType {
    match t {
        DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        DataType::Dictionary(_, v) if canonical_type(v) == DataType::Utf8 => DataType::Utf8,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            DataType::List(Arc::new(Field::new_list_field(
                canonical_type(f.data_type()),
                true,
            )))
        }
        other => other.clone(),
    }
}

/// Whether [`conform`] turns a column of type `actual` into `expected` (data permitting).
fn castable(expected: &DataType, actual: &DataType, nullable: bool) -> bool {
    match (expected, &canonical_type(actual)) {
        (_, DataType::Null) => nullable,
        (DataType::List(e), DataType::List(g)) => castable(e.data_type(), g.data_type(), false),
        (DataType::UInt32 | DataType::UInt64, g) => {
            g.is_integer() || matches!(g, DataType::Float32 | DataType::Float64)
        }
        (DataType::Float64, DataType::Float32) => true,
        (e, g) => e == g,
    }
}

/// What to do about a Float64 column where Float32 is expected.
fn narrowing_hint(expected: &DataType, actual: &DataType) -> &'static str {
    let item = |t: &DataType| match canonical_type(t) {
        DataType::List(f) => f.data_type().clone(),
        other => other,
    };
    if item(expected) == DataType::Float32 && item(actual) == DataType::Float64 {
        " (gradkit stores gradients as float32 and does not round them on read: cast before \
         writing, e.g. numpy `.astype(np.float32)`, pyarrow `pa.list_(pa.float32())`, polars \
         `pl.List(pl.Float32)`)"
    } else {
        ""
    }
}

/// `a` in its canonical representation (see [`canonical_type`]); every value unchanged.
/// Also what readers of files other than the three tables use (gradtrain's `--data`).
pub fn normalize_array(a: &ArrayRef) -> Result<ArrayRef> {
    Ok(match a.data_type() {
        DataType::LargeUtf8 => {
            let s = a.as_string::<i64>();
            check_offset(s.value_offsets()[s.len()] - s.value_offsets()[0])?;
            Arc::new(s.iter().collect::<StringArray>())
        }
        DataType::Utf8View => {
            let s = a.as_string_view();
            let bytes: usize = s.iter().map(|v| v.map_or(0, str::len)).sum();
            check_offset(bytes as i64)?;
            Arc::new(s.iter().collect::<StringArray>())
        }
        DataType::Dictionary(..) => {
            let d = a.as_any_dictionary();
            let values = normalize_array(d.values())?;
            let Some(strs) = values.as_string_opt::<i32>() else {
                return Ok(a.clone());
            };
            let keys = d.normalized_keys();
            let out: StringArray = (0..a.len())
                .map(|i| (a.is_valid(i) && strs.is_valid(keys[i])).then(|| strs.value(keys[i])))
                .collect();
            check_offset(out.value_offsets()[out.len()] as i64)?;
            Arc::new(out)
        }
        DataType::List(f) => {
            let l = a.as_list::<i32>();
            let child = normalize_array(l.values())?;
            if child.data_type() == f.data_type() {
                return Ok(a.clone());
            }
            Arc::new(ListArray::try_new(
                Arc::new(Field::new_list_field(child.data_type().clone(), true)),
                l.offsets().clone(),
                child,
                l.nulls().cloned(),
            )?)
        }
        DataType::LargeList(_) => {
            let l = a.as_list::<i64>();
            let o = l.value_offsets();
            let (o0, on) = (o[0], o[l.len()]);
            check_offset(on - o0)?;
            let child = normalize_array(&l.values().slice(o0 as usize, (on - o0) as usize))?;
            let offsets: Vec<i32> = o.iter().map(|x| (x - o0) as i32).collect();
            Arc::new(ListArray::try_new(
                Arc::new(Field::new_list_field(child.data_type().clone(), true)),
                OffsetBuffer::new(offsets.into()),
                child,
                l.nulls().cloned(),
            )?)
        }
        DataType::FixedSizeList(_, n) => {
            let l = a.as_fixed_size_list();
            let n = *n as usize;
            check_offset((n * l.len()) as i64)?;
            let child = normalize_array(&l.values().slice(l.offset() * n, n * l.len()))?;
            Arc::new(ListArray::try_new(
                Arc::new(Field::new_list_field(child.data_type().clone(), true)),
                OffsetBuffer::from_lengths(std::iter::repeat_n(n, l.len())),
                child,
                l.nulls().cloned(),
            )?)
        }
        _ => a.clone(),
    })
}

/// Batches are decoded a few MiB at a time, so 32-bit offsets always suffice; checked anyway.
fn check_offset(len: i64) -> Result<()> {
    if len > i32::MAX as i64 {
        bail!("a record batch holds {len} list items or string bytes, more than 2^31 - 1");
    }
    Ok(())
}

/// Where a value sits, for a message: `column `x`, row R` (and `item I` inside a list).
type Place<'a> = &'a dyn Fn(usize) -> String;

/// Integers of type `S` as `U`, each range-checked (a null slot keeps a zero under its null).
fn narrow_ints<S, U>(a: &dyn Array, at: Place) -> Result<ArrayRef>
where
    S: ArrowPrimitiveType,
    S::Native: Into<i128>,
    U: ArrowPrimitiveType,
    U::Native: TryFrom<i128>,
{
    let p = a.as_primitive::<S>();
    let mut out = Vec::with_capacity(p.len());
    for (i, v) in p.values().iter().enumerate() {
        let x: i128 = (*v).into();
        match U::Native::try_from(x) {
            Ok(y) => out.push(y),
            Err(_) if p.is_null(i) => out.push(U::Native::default()),
            Err(_) => bail!(
                "{}: value {x} does not fit {} (the file stores {})",
                at(i),
                U::DATA_TYPE,
                S::DATA_TYPE
            ),
        }
    }
    Ok(Arc::new(PrimitiveArray::<U>::new(
        out.into(),
        p.nulls().cloned(),
    )))
}

/// Floats of type `S` holding whole numbers (pandas' integer column with nulls) as `U`.
fn whole_floats<S, U>(a: &dyn Array, at: Place) -> Result<ArrayRef>
where
    S: ArrowPrimitiveType,
    S::Native: Into<f64>,
    U: ArrowPrimitiveType,
    U::Native: TryFrom<i128>,
{
    let p = a.as_primitive::<S>();
    let mut out = Vec::with_capacity(p.len());
    for (i, v) in p.values().iter().enumerate() {
        let x: f64 = (*v).into();
        // Below 2^64 a whole f64 converts to i128 exactly.
        let y = (x.fract() == 0.0 && x.abs() < 2f64.powi(64))
            .then(|| U::Native::try_from(x as i128).ok())
            .flatten();
        match y {
            Some(y) => out.push(y),
            None if p.is_null(i) => out.push(U::Native::default()),
            None => bail!(
                "{}: value {x} is not a whole number that fits {} (the file stores {})",
                at(i),
                U::DATA_TYPE,
                S::DATA_TYPE
            ),
        }
    }
    Ok(Arc::new(PrimitiveArray::<U>::new(
        out.into(),
        p.nulls().cloned(),
    )))
}

/// Any integer (or whole-number float) array as `U` (UInt32 or UInt64), range-checked.
fn to_unsigned<U>(a: &dyn Array, at: Place) -> Result<ArrayRef>
where
    U: ArrowPrimitiveType,
    U::Native: TryFrom<i128>,
{
    use arrow_array::types::*;
    match a.data_type() {
        DataType::Int8 => narrow_ints::<Int8Type, U>(a, at),
        DataType::Int16 => narrow_ints::<Int16Type, U>(a, at),
        DataType::Int32 => narrow_ints::<Int32Type, U>(a, at),
        DataType::Int64 => narrow_ints::<Int64Type, U>(a, at),
        DataType::UInt8 => narrow_ints::<UInt8Type, U>(a, at),
        DataType::UInt16 => narrow_ints::<UInt16Type, U>(a, at),
        DataType::UInt32 => narrow_ints::<UInt32Type, U>(a, at),
        DataType::UInt64 => narrow_ints::<UInt64Type, U>(a, at),
        DataType::Float32 => whole_floats::<Float32Type, U>(a, at),
        DataType::Float64 => whole_floats::<Float64Type, U>(a, at),
        other => bail!("{}: type {other} is not an integer", at(0)),
    }
}

/// One column (already normalised) as `expected`; `at` names a row of the column.
fn cast_values(expected: &DataType, a: &ArrayRef, at: Place) -> Result<ArrayRef> {
    if a.data_type() == expected {
        return Ok(a.clone());
    }
    Ok(match (expected, a.data_type()) {
        (e, DataType::Null) => arrow_array::new_null_array(e, a.len()),
        (DataType::UInt32, _) => to_unsigned::<UInt32Type>(a.as_ref(), at)?,
        (DataType::UInt64, _) => to_unsigned::<UInt64Type>(a.as_ref(), at)?,
        (DataType::Float64, DataType::Float32) => {
            let p = a.as_primitive::<Float32Type>();
            Arc::new(PrimitiveArray::<Float64Type>::new(
                p.values().iter().map(|&v| v as f64).collect(),
                p.nulls().cloned(),
            ))
        }
        (DataType::List(e), DataType::List(g)) if e.data_type() == g.data_type() => a.clone(),
        (DataType::List(e), DataType::List(_)) => {
            let l = a.as_list::<i32>();
            let o = l.value_offsets();
            let o0 = o[0];
            let child = l.values().slice(o0 as usize, (o[l.len()] - o0) as usize);
            // Item j of the child lies in the last row whose list starts at or before it.
            let item_at = |j: usize| {
                let row = o.partition_point(|&x| ((x - o0) as usize) <= j) - 1;
                format!("{}, item {}", at(row), j - (o[row] - o0) as usize)
            };
            let child = cast_values(e.data_type(), &child, &item_at)?;
            let offsets: Vec<i32> = o.iter().map(|x| x - o0).collect();
            Arc::new(ListArray::try_new(
                Arc::new(Field::new_list_field(child.data_type().clone(), true)),
                OffsetBuffer::new(offsets.into()),
                child,
                l.nulls().cloned(),
            )?)
        }
        (e, g) => bail!(
            "{}: type {} cannot be read as {}",
            at(0),
            type_name(g),
            type_name(e)
        ),
    })
}

/// `batch` with the columns of `expected`, in its order, each cast to the canonical type
/// (see the section comment); `first_row` is the batch's first row in the file, so that a
/// value that does not fit is reported by column and row. Batches already in canonical types
/// (every gradkit file) pass through without a copy.
pub fn conform(expected: &Schema, batch: &RecordBatch, first_row: usize) -> Result<RecordBatch> {
    check_schema(expected, batch.schema().as_ref())?;
    let mut fields = Vec::with_capacity(expected.fields().len());
    let mut cols = Vec::with_capacity(expected.fields().len());
    for f in expected.fields() {
        if is_optional(f) && batch.column_by_name(f.name()).is_none() {
            fields.push(Field::new(f.name(), f.data_type().clone(), true));
            cols.push(arrow_array::new_null_array(f.data_type(), batch.num_rows()));
            continue;
        }
        let a = normalize_array(col(batch, f.name())?)?;
        let at = |i: usize| format!("column `{}`, row {}", f.name(), first_row + i);
        let a = cast_values(f.data_type(), &a, &at)?;
        // Nullable fields: the tables' own checks (`no_nulls`) name a null where it is not
        // allowed, which a RecordBatch constructor would only report as a generic error.
        fields.push(Field::new(f.name(), a.data_type().clone(), true));
        cols.push(a);
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?)
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
    batch_to_rows_at(batch, 0)
}

/// [`batch_to_rows`] of a batch whose first row is row `first_row` of its file: the other
/// writers' types are cast here ([`conform`]), and a value that does not fit names its row.
pub fn batch_to_rows_at<T: Table>(batch: &RecordBatch, first_row: usize) -> Result<Vec<T>> {
    let batch = conform(&T::schema(), batch, first_row)?;
    T::from_batch(&batch).context("reading rows")
}
