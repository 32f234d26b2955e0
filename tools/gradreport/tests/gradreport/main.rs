//! The tests of gradreport in one binary (one link instead of one per file):
//! each module is one file of this directory; run one with `cargo test --release --locked
//! --workspace --test gradreport MODULE::`.

mod cli;
mod examples;
mod figures;
mod no_clobber;
mod simulate;
mod streams;
mod vocabulary;
