//! gradkit-core: the data contract and the shared command-line layer.
//!
//! It owns the three tables of docs/FORMAT.md (`tensor/1` gradients and selections, `plan/1`
//! partition plans, `metrics/1` measurements) as typed rows, their validated Parquet I/O
//! (atomic writes, stdin/stdout pipes), and the CLI plumbing every `grad…` tool shares.
//! It knows nothing of communication or algorithms.

pub mod alloc;
pub mod budget;
pub mod cli;
pub mod env;
pub mod expand;
pub mod io;
pub mod keep;
pub mod live;
pub mod named;
pub mod paths;
pub mod process;
mod read_values;
pub mod synth;
pub mod tables;
pub mod trace;
mod write_pages;

pub use io::{
    read_table, read_tensor, write_comm_trace, write_table, Input, Loaded, Meta, Output,
    ReadOptions, TableWriter,
};
pub use tables::{
    CommRow, EventKind, MetricRow, PlanRow, RunSettings, SchemaKind, Table, TensorRow,
};
