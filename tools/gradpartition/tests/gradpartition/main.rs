//! The tests of gradpartition in one binary (one link instead of one per file):
//! each module is one file of this directory; run one with `cargo test --release --locked
//! --workspace --test gradpartition MODULE::`.

mod cli;
mod no_clobber;
mod stream_steps;
mod streams;
mod validation;
