//! The tests of train in one binary (one link instead of one per file):
//! each module is one file of this directory; run one with `cargo test --release --locked
//! --workspace --test train MODULE::`.

mod allgather_raw;
mod data;
mod dense_warmup;
mod embrace;
mod equivalence;
mod grad_fd;
mod onebit_basic;
mod onebit_exact;
mod onebit_frozen;
mod optim_hand;
mod resident;
mod schedule;
mod step_time;
mod system;
mod xi_variance;
