//! The tests of comm in one binary (one link instead of one per file):
//! each module is one file of this directory; run one with `cargo test --release --locked
//! --workspace --test comm MODULE::`.

mod collectives;
mod conformance;
mod native_allreduce_release;
