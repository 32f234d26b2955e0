//! The tests of gradtrace in one binary (one link instead of one per file):
//! each module is one file of this directory; run one with `cargo test --release --locked
//! --workspace --test gradtrace MODULE::`.

#[path = "../../../../lib/core/tests/common/mod.rs"]
mod common;

mod cli;
mod ecosystem;
mod expand;
mod interop;
mod memory;
mod model;
mod signals;
mod stream_steps;
mod streams;
mod validation;
