//! The tests of collectives in one binary (one link instead of one per file):
//! each module is one file of this directory; run one with `cargo test --release --locked
//! --workspace --test collectives MODULE::`.

#[path = "../common/mod.rs"]
mod common;

mod algo;
mod alltoall;
mod cltk;
mod dense;
mod dense_release_order;
mod dense_reuse;
mod equivalence;
mod oktopk_one_reuse;
mod oktopk_reeval_step_d;
mod onebit;
mod onebit_state_moved;
mod props;
mod resident;
mod select_breakdown;
mod sparse_baselines;
mod sparse_deft;
mod sparse_error_feedback;
mod sparse_oktopk;
mod step_in_place;
mod topk_union;
