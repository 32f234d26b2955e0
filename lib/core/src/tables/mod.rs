//! The three tables of the data contract (docs/FORMAT.md): `tensor/1`, `plan/1`,
//! `metrics/1`, and the recording `commtrace/1`, as typed rows with conversion to and from
//! Arrow record batches.
//!
//! This module holds what the tables share: [`SchemaKind`] (which table a file holds) and the
//! [`Table`] trait of their row types. The rows are in their own modules: `tensor`
//! ([`TensorRow`] and its checks), `plan` ([`PlanRow`]), `metrics` ([`MetricRow`],
//! [`RunSettings`]) and `commtrace` ([`CommRow`]); `columns` holds the Arrow column helpers
//! they use, and `conform` the schema check and the casts of other writers' types on read
//! (docs/FORMAT.md § What a reader checks).

use anyhow::Result;
use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};

mod columns;
mod commtrace;
mod conform;
mod metrics;
mod plan;
mod tensor;

pub use columns::is_optional;
pub use commtrace::{CommRow, EventKind};
pub use conform::{batch_to_rows, batch_to_rows_at, check_schema, conform, normalize_array};
pub use metrics::{MetricRow, RunSettings, PHASE_METRICS};
pub use plan::PlanRow;
pub use tensor::{validate_tensor_row, LayerRegistry, TensorRow};

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
