//! gradkit-train: data-parallel training end to end — real models with real backpropagation
//! (candle), trained on P ranks that exchange gradients through gradkit-collectives, with the
//! papers' optimisers.
//!
//! - [`data`]: the shipped UCI digits, a seeded Markov language source with an exactly
//!   known entropy rate, user Parquet files; per-rank shards and deterministic batches.
//! - [`model`]: `mlp`, `cnn`, `transformer-lm`, `lstm-lm` on candle-nn, parameters as one
//!   flat vector in the collectives' flat index space.
//! - [`optim`]: SGD, Adam/AdamW, LAMB, 1-bit LAMB (Algorithm 1), 1-bit Adam; lr schedules.
//! - [`train`]: the step loop (dense, sparse with error feedback per Ok-Topk Algorithm 2,
//!   1-bit compressed momentum), checksums across ranks, metrics, checkpoints;
//!   [`train::dump_gradients`] for `gradtrace model`.
//! - [`embrace`]: `--exchange embrace|allgather` (EmbRace's column-sharded embedding with
//!   AlltoAll, the AllGather baseline, `--schedule fifo|embrace|2d`).
//! - [`schedule`]: EmbRace's block-level priority queue (embrace.md §2.1, `--schedule 2d`).
//! - [`xi`]: ξ of Ok-Topk's Assumption 1 measured in the run (`gradtrain --xi`).
//!
//! Not here: the collectives themselves (gradkit-collectives), file formats (gradkit-core).

pub mod checkpoint;
pub mod config;
pub mod data;
pub mod embrace;
pub mod exchange;
pub mod metrics_log;
pub mod model;
pub mod optim;
pub mod schedule;
pub mod train;
pub mod xi;

pub use config::{Exchange, Lookup, Schedule};
pub use train::{dump_gradients, train, TrainConfig, TrainReport};
