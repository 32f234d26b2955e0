//! The tests of gradkit-core in one binary (one link instead of one per file):
//! each module is one file of this directory; run one with `cargo test --release --locked
//! --workspace --test core_tests MODULE::`.

#[path = "../common/mod.rs"]
mod common;

mod commit;
mod ecosystem;
mod live;
mod read_values;
mod roundtrip;
mod step_layout;
mod synth;
mod tensor_runs;
mod validation;
mod write_dense_step;
mod write_pages;
