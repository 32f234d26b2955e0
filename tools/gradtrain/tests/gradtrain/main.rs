//! The tests of gradtrain in one binary (one link instead of one per file):
//! each module is one file of this directory; run one with `cargo test --release --locked
//! --workspace --test gradtrain MODULE::`.

mod checkpoints;
mod cli;
mod comm_trace;
mod ecosystem;
mod memory;
mod mpi_checkpoints;
mod no_clobber;
mod resume_metrics;
mod streams;
mod validation;
