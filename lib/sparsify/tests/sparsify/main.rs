//! The tests of sparsify in one binary (one link instead of one per file):
//! each module is one file of this directory; run one with `cargo test --release --locked
//! --workspace --test sparsify MODULE::`.

mod kernels;
mod large_inputs;
mod methods;
mod oktopk_onepass;
mod oktopk_reuse;
mod onebit;
mod residual_absorb;
mod topk_threshold;
