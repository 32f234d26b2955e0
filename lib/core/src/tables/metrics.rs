//! `metrics/1` (docs/FORMAT.md § metrics/1): [`MetricRow`] in long form, the run's
//! [`RunSettings`] it carries as columns, the metrics measured per phase
//! ([`PHASE_METRICS`], written as the `phase` column), and their conversion to and from Arrow
//! record batches (files from before the `phase` and settings columns read as null there).

use std::sync::Arc;

use anyhow::Result;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt64Type};
use arrow_array::{
    Array, ArrayRef, Float64Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::columns::{col, no_nulls, optional, strings, u32s};
use super::{SchemaKind, Table};

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
