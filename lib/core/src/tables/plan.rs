//! `plan/1` (docs/FORMAT.md § plan/1): [`PlanRow`], one range of a layer owned by a worker,
//! and its conversion to and from Arrow record batches.

use std::sync::Arc;

use anyhow::Result;
use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::{Array, RecordBatch, StringArray, UInt32Array, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::columns::{col, no_nulls, strings, u32s, u64s};
use super::{SchemaKind, Table};

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
