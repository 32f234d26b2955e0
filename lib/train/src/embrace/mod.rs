//! EmbRace in training (embrace.md): `--exchange embrace` (the token embedding table sharded
//! by columns, AlltoAll lookups and AlltoAll row-sparse gradients, ring allreduce for every
//! other layer) and the AllGather baselines (full replica everywhere, every rank's row-sparse
//! gradient allgathered): `--exchange allgather` coalesces duplicate rows before sending (one
//! row per distinct token), `--exchange allgather-raw` sends one row per token, duplicates
//! included, as Horovod's and PyTorch DDP's sparse allreduce do; with
//! `--schedule fifo|embrace|2d` (embrace.md §2).
//!
//! `allgather-raw` sends each token's own output gradient row (the model returns per-token
//! row gradients, see below), tokens·(1 + d) words per rank, as Horovod does.
//!
//! ## How the model sees a sharded table (docs/gradtrain.md: shard only)
//! Under these exchanges the candle model is built **without** its token embedding
//! ([`Model::new_sharded`]): no rank allocates the V × d table, a V × d lookup buffer or a
//! V × d gradient. The forward AlltoAll returns the rows this rank's batch reads (`E[X_r]`,
//! T × d, one row per token), and the model's forward starts from them
//! ([`Model::loss_and_grad_rows`]); its backward returns the gradient of each token's row,
//! which is coalesced here (duplicates summed in token order, embrace.md §2.2). The table's
//! values of record are the shard `E_r = E[:, cols_r]` (V × w_r) and its optimiser state
//! (`allgather`/`allgather-raw`: the full V × d replica, the baseline's memory).
//! Evaluation looks up rank 0's evaluation tokens through the same AlltoAll; only the final
//! report gathers the whole table, on rank 0, after the last step.
//!
//! ## Forward lookup (`--lookup`, docs/gradtrain.md)
//! `per-token` (the paper's): the owner sends one row slice per token;
//! `unique`: one per distinct token of the receiving rank, expanded by the receiver
//! ([`embedding_forward_unique`]; no index map travels).
//!
//! ## The output head
//! `lm_head` is an untied dense V × d layer (plus bias): it is ring-allreduced with the
//! other dense layers, as its own allreduce so its bytes are reported apart
//! (`bytes_lm_head`; `bytes_dense` is all dense layers, `bytes_dense_other` the rest).
//!
//! ## Row-wise optimiser (embrace.md §2.3, §6)
//! The embedding rows are updated by a row-local ("lazy") rule applied only to rows that
//! received a gradient this step: plain SGD (`w -= lr·g`) or lazy Adam (moments and update only
//! on touched rows, bias correction from the global step). SGD without momentum or weight
//! decay leaves untouched rows unchanged, so it equals dense training exactly (up to float
//! order); lazy Adam equals the `allgather` baseline but not `--exchange dense` with dense
//! Adam (whose moments keep moving untouched rows). Momentum and weight decay are refused
//! for these exchanges. Dense layers use the normal optimiser on the mean gradient.
//!
//! ## Scheduling (embrace.md §2)
//! - `fifo`: forward AlltoAll → forward/backward → dense allreduce → embedding-gradient
//!   AlltoAll of all coalesced rows → next step.
//! - `embrace`: the next step's gathered batch is prefetched; the coalesced rows are split
//!   into *prior* rows (∈ next batch of any rank) and *delayed* rows. Prior rows go first
//!   (and are applied), then the dense allreduce; the delayed rows are exchanged in the next
//!   step **while the forward/backward of that step runs on a compute thread** (the rank's
//!   own thread, which owns the `Comm`, acts as the communication thread). Delayed rows are not
//!   read by the next forward (they are not in its batch), and every row's update uses its own
//!   step's learning rate and bias correction, so the parameters equal the fifo run's.
//!   This is the vertical schedule only (embrace.md §2.2, Algorithm 1).
//! - `2d` (vertical + horizontal, embrace.md §2.1, [`crate::schedule`]): after BP every
//!   operation of the step goes into a priority queue keyed by FP order: prior rows, the next
//!   step's lookup, each dense block (embedding level, block 1 … L, final LN + head: one
//!   allreduce each, then that block's optimiser update), delayed rows. The next step pops
//!   the prior rows and the lookup (its first FP stage needs both), then runs its forward on
//!   a compute thread that waits before each block for that block's update only, while this
//!   thread (the communication thread) serves the rest of the queue. Every rank pushes the
//!   same operations at once, so every rank pops the same order.
//!
//! What this is not: there is one fused backward (candle gives no per-block hooks), so dense
//! allreduces cannot overlap the backward pass; in `2d` they overlap the next forward.
//!
//! ## Where the code is
//! This module: the flag checks, [`Embrace`]'s state and the delayed rows it carries
//! (`Pending`). `rows`: the row bookkeeping (the row-wise optimiser [`RowOpt`], the vertical
//! split [`split_prior`], the gradient-row exchange and the final gather of the table);
//! `exchange`: [`Embrace`] as an [`Exchange`] (construction, the lookup, the `fifo` and
//! `embrace` schedules, the metrics, evaluation); `two_d`: `--schedule 2d`'s priority queue
//! (embrace.md §2.1).
//!
//! [`Model::new_sharded`]: crate::model::Model::new_sharded
//! [`Model::loss_and_grad_rows`]: crate::model::Model::loss_and_grad_rows
//! [`embedding_forward_unique`]: gradkit_collectives::alltoall::embedding_forward_unique
//! [`Exchange`]: crate::exchange::Exchange

use std::ops::Range;
use std::time::Instant;

use anyhow::{bail, Result};

use crate::config::Lookup;
use crate::config::TrainConfig;
use crate::data::Shard;
use crate::optim::{Method, Opt};

mod exchange;
mod rows;
mod two_d;

pub use rows::{per_token_rows, split_prior, unique, RowOpt};
use two_d::TwoD;

/// Flag checks for `--exchange embrace|allgather|allgather-raw`.
pub fn check_config(cfg: &TrainConfig) -> Result<()> {
    if !matches!(cfg.model.name.as_str(), "transformer-lm" | "lstm-lm") {
        bail!(
            "--exchange {} shards the token embedding of a language model; use --model transformer-lm or lstm-lm, not `{}` (flag --model)",
            cfg.exchange,
            cfg.model.name
        );
    }
    match cfg.opt.method {
        Method::Sgd if cfg.opt.momentum == 0.0 && !cfg.opt.nesterov => {}
        Method::Adam => {}
        Method::Sgd => bail!(
            "--exchange {} updates embedding rows lazily and supports plain SGD only (no --momentum/--nesterov) (flag --momentum)",
            cfg.exchange
        ),
        other => bail!(
            "--exchange {} supports --optimizer sgd or adam (row-wise lazy update of the embedding), not `{other}` (flag --optimizer)",
            cfg.exchange
        ),
    }
    if cfg.opt.weight_decay != 0.0 {
        bail!(
            "--exchange {} does not support --weight-decay (a lazy row update cannot decay untouched rows) (flag --weight-decay)",
            cfg.exchange
        );
    }
    if cfg.checkpoint.is_some() {
        bail!(
            "--exchange {} does not write checkpoints yet (flag --checkpoint)",
            cfg.exchange
        );
    }
    Ok(())
}

/// `--lookup` other than `per-token` only with `--exchange embrace`.
pub fn check_lookup(cfg: &TrainConfig) -> Result<()> {
    if cfg.lookup != Lookup::PerToken && !cfg.exchange.is_embrace() {
        bail!(
            "--lookup {} applies to --exchange embrace only, not `{}` (flag --lookup)",
            cfg.lookup,
            cfg.exchange
        );
    }
    Ok(())
}

/// Peak resident set size of this process so far, in bytes (`VmHWM` of /proc/self/status,
/// what getrusage's `ru_maxrss` reports); `None` where that file does not exist.
pub fn peak_rss_bytes() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = s.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    let kb: f64 = kb.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024.0)
}

/// Delayed rows of one step, waiting for their exchange.
struct Pending {
    ids: Vec<u32>,
    grads: Vec<f32>,
    lr: f32,
    step: u32,
}

/// `--exchange embrace|allgather|allgather-raw` as an [`Exchange`] of the one training loop:
/// the embedding table of record (a column shard, or the full replica for the AllGather
/// baselines) with its row-wise optimiser, and every other layer replicated and allreduced.
///
/// [`Exchange`]: crate::exchange::Exchange
pub struct Embrace {
    allgather: bool,
    raw: bool,
    /// `--schedule embrace` (prior rows first, delayed rows overlapped with compute).
    embrace_sched: bool,
    method: String,
    rank: usize,
    p: usize,
    /// Offset of the embedding in the full model's flat layout; its rows and width.
    eoff: usize,
    v: usize,
    d: usize,
    /// `--lookup unique`: the deduplicated forward AlltoAll.
    lookup_unique: bool,
    /// The output head (`lm_head.*`) in the dense part.
    head: Range<usize>,
    /// Every rank's shard (batches are deterministic, so no id exchange is needed).
    shards: Vec<Shard>,
    seed: u64,
    batch: usize,
    /// The dense part: the parameters the candle model holds (every layer but the token
    /// embedding, [`Model::new_sharded`]), in its layout order.
    ///
    /// [`Model::new_sharded`]: crate::model::Model::new_sharded
    dparams: Vec<f32>,
    /// This step's looked-up rows (`T × d`, token order), then their per-token gradients.
    rows: Vec<f32>,
    g_rows: Vec<f32>,
    dopt: Opt,
    table: Vec<f32>,
    row_opt: RowOpt,
    pending: Option<Pending>,
    /// The dense part's allreduce (`ring` or `ring-fp16`).
    dense_algo: gradkit_collectives::Algo,
    /// Token ids of every rank for the step being trained, and for the next one.
    ids_now: Vec<Vec<u32>>,
    ids_next: Option<Vec<Vec<u32>>>,
    /// `--schedule 2d`: the block-level priority queue and its dense groups.
    two_d: Option<TwoD>,
    /// Per-step accounting carried from `compute` to `update`.
    t_step: Option<Instant>,
    wait_s: f64,
    overlap_s: f64,
    bytes: [u64; 4],
}

/// Indices into [`Embrace::bytes`]: forward lookups, embedding gradients, the dense layers
/// but the output head, the output head.
const FWD: usize = 0;
const GRAD: usize = 1;
const DENSE: usize = 2;
const HEAD: usize = 3;
