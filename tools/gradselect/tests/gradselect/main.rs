//! The tests of gradselect in one binary (one link instead of one per file):
//! each module is one file of this directory; run one with `cargo test --release --locked
//! --workspace --test gradselect MODULE::`.

mod cli;
mod equivalence;
mod no_clobber;
mod outputs;
mod stream_steps;
mod streams;
mod validation;
