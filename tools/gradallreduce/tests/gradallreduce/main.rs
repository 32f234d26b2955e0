//! The tests of gradallreduce in one binary (one link instead of one per file):
//! each module is one file of this directory; run one with `cargo test --release --locked
//! --workspace --test gradallreduce MODULE::`.

mod bench_goals;
mod bench_reuse;
mod bench_sparse_input;
mod cli;
mod cluster;
mod comm_trace;
mod cost_model;
mod fixed_bytes;
mod memory;
mod mpi_errors;
mod no_clobber;
mod outputs;
mod state;
mod state_file_pieces;
mod stream_ranks;
mod stream_steps;
mod streams;
mod validation;
mod values;
