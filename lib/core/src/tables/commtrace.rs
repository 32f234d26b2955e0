//! `commtrace/1`: every point-to-point message a run's ranks sent and received, and each
//! rank's compute intervals between them, as the communication layer recorded them
//! (gradkit-comm's recorder; docs/FORMAT.md). `gradreport simulate` replays it on SimGrid.

use std::sync::Arc;

use anyhow::{bail, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt64Type};
use arrow_array::{
    Array, ArrayRef, Float64Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::columns::{col, no_nulls, optional, strings, u32s, u64s};
use super::{SchemaKind, Table};

/// What one row of `commtrace/1` records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// A message this rank posted to `peer`.
    Send,
    /// A message this rank received from `peer`.
    Recv,
    /// Time between two communication calls of one step, or before the first or after the
    /// last (`bytes` 0, `peer` the rank itself).
    Compute,
    /// The backend's own allreduce of `bytes` bytes (opaque: its messages are not seen).
    Allreduce,
}

impl EventKind {
    pub const ALL: [EventKind; 4] = [
        EventKind::Send,
        EventKind::Recv,
        EventKind::Compute,
        EventKind::Allreduce,
    ];
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Send => "send",
            EventKind::Recv => "recv",
            EventKind::Compute => "compute",
            EventKind::Allreduce => "allreduce",
        }
    }
    pub fn parse(s: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// One row of `commtrace/1`.
#[derive(Clone, Debug, PartialEq)]
pub struct CommRow {
    /// The step (gradallreduce, gradtrain) or timed call (bench) the event belongs to.
    pub step: u32,
    pub rank: u32,
    /// Position of the event among this rank's events of the step.
    pub event: u64,
    /// The communication call (one bucket of messages posted together) among this rank's
    /// calls of the step; the messages of one call overlap.
    pub call: u64,
    pub kind: EventKind,
    /// The other rank of a message (the rank itself for compute and allreduce).
    pub peer: u32,
    pub tag: u32,
    /// For a send: how many messages this rank sent to `peer` with `tag` before it in the
    /// whole recording; for a receive: how many it received from `peer` with `tag` before.
    /// The send (r → q, tag, n) is matched by the receive (q ← r, tag, n).
    pub seq: u64,
    pub bytes: u64,
    /// The part of `bytes` that does not grow with the model's size (control messages whole;
    /// 1-bit's scale and its share of padding): a replay at another size scales only the
    /// rest (docs/SIMULATE.md). Files written before the column existed read it as 0.
    pub fixed_bytes: u64,
    /// The phase the traffic counters charged (`bytes_sent:<phase>` in metrics/1).
    pub phase: String,
    /// What the step ran (the algorithm, and for bench its size and input).
    pub label: String,
    /// Seconds since the rank started recording, at the start and end of the call (compute:
    /// of the interval).
    pub start_s: f64,
    pub end_s: f64,
}

const COLUMNS: [&str; 13] = [
    "step", "rank", "event", "call", "kind", "peer", "tag", "seq", "bytes", "phase", "label",
    "start_s", "end_s",
];

impl Table for CommRow {
    const KIND: SchemaKind = SchemaKind::CommTrace;
    fn schema() -> SchemaRef {
        let u32f = |n: &str| Field::new(n, DataType::UInt32, false);
        let u64f = |n: &str| Field::new(n, DataType::UInt64, false);
        let strf = |n: &str| Field::new(n, DataType::Utf8, false);
        let f64f = |n: &str| Field::new(n, DataType::Float64, false);
        Arc::new(Schema::new(vec![
            u32f("step"),
            u32f("rank"),
            u64f("event"),
            u64f("call"),
            strf("kind"),
            u32f("peer"),
            u32f("tag"),
            u64f("seq"),
            u64f("bytes"),
            strf("phase"),
            strf("label"),
            f64f("start_s"),
            f64f("end_s"),
            optional(Field::new("fixed_bytes", DataType::UInt64, false)),
        ]))
    }
    fn to_batch(rows: &[Self]) -> Result<RecordBatch> {
        let u32c = |f: fn(&CommRow) -> u32| -> ArrayRef {
            Arc::new(UInt32Array::from_iter_values(rows.iter().map(f)))
        };
        let u64c = |f: fn(&CommRow) -> u64| -> ArrayRef {
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(f)))
        };
        let f64c = |f: fn(&CommRow) -> f64| -> ArrayRef {
            Arc::new(Float64Array::from_iter_values(rows.iter().map(f)))
        };
        let strc = |f: fn(&CommRow) -> &str| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(rows.iter().map(f)))
        };
        Ok(RecordBatch::try_new(
            Self::schema(),
            vec![
                u32c(|r| r.step),
                u32c(|r| r.rank),
                u64c(|r| r.event),
                u64c(|r| r.call),
                strc(|r| r.kind.name()),
                u32c(|r| r.peer),
                u32c(|r| r.tag),
                u64c(|r| r.seq),
                u64c(|r| r.bytes),
                strc(|r| &r.phase),
                strc(|r| &r.label),
                f64c(|r| r.start_s),
                f64c(|r| r.end_s),
                u64c(|r| r.fixed_bytes),
            ],
        )?)
    }
    fn from_batch(b: &RecordBatch) -> Result<Vec<Self>> {
        no_nulls(b, &COLUMNS)?;
        let (step, rank, peer, tag) = (
            u32s(b, "step")?,
            u32s(b, "rank")?,
            u32s(b, "peer")?,
            u32s(b, "tag")?,
        );
        let (event, call, seq, bytes) = (
            u64s(b, "event")?,
            u64s(b, "call")?,
            u64s(b, "seq")?,
            u64s(b, "bytes")?,
        );
        let (kind, phase, label) = (
            strings(b, "kind")?,
            strings(b, "phase")?,
            strings(b, "label")?,
        );
        let f = |n: &str| -> Result<Vec<f64>> {
            Ok(col(b, n)?.as_primitive::<Float64Type>().values().to_vec())
        };
        let (start, end) = (f("start_s")?, f("end_s")?);
        // Absent (a file from before the column) or null: 0, every byte scales.
        let fixed = col(b, "fixed_bytes")?.as_primitive::<UInt64Type>();
        (0..b.num_rows())
            .map(|i| {
                let Some(k) = EventKind::parse(&kind[i]) else {
                    bail!(
                        "column `kind`: unknown event `{}` (known: send, recv, compute, allreduce)",
                        kind[i]
                    );
                };
                let fixed_bytes = if fixed.is_null(i) { 0 } else { fixed.value(i) };
                if fixed_bytes > bytes[i] {
                    bail!(
                        "column `fixed_bytes`, row {i}: {fixed_bytes} fixed bytes in a message of {} bytes (column `bytes`)",
                        bytes[i]
                    );
                }
                Ok(CommRow {
                    step: step[i],
                    rank: rank[i],
                    event: event[i],
                    call: call[i],
                    kind: k,
                    peer: peer[i],
                    tag: tag[i],
                    seq: seq[i],
                    bytes: bytes[i],
                    fixed_bytes,
                    phase: phase[i].clone(),
                    label: label[i].clone(),
                    start_s: start[i],
                    end_s: end[i],
                })
            })
            .collect()
    }
}
