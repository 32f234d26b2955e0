//! The tests of partition in one binary (one link instead of one per file):
//! each module is one file of this directory; run one with `cargo test --release --locked
//! --workspace --test partition MODULE::`.

#[path = "../common/mod.rs"]
mod common;

mod deft;
mod deft_buildup;
mod oktopk;
mod props;
