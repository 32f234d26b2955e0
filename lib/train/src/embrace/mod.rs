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

use std::collections::BTreeSet;
use std::time::Instant;

use std::ops::Range;

use anyhow::{bail, Context, Result};
use gradkit_collectives::alltoall::{
    embedding_backward, embedding_forward, embedding_forward_unique, slice, sparse_allgather,
    sparse_allgather_raw, Rows,
};
use gradkit_collectives::{dense, Op};
use gradkit_comm::{Comm, CommExt};

use crate::config::TrainConfig;
use crate::config::{Exchange as ExchangeName, Lookup, Schedule};
use crate::data::{Batch, Dataset, Shard};
use crate::exchange::{Exchange, StepIo};
use crate::model::{Eval, Model};
use crate::optim::Opt;
use crate::schedule::{fp_groups, key, Class, PriorityQueue, Ready};

/// Flag checks for `--exchange embrace|allgather|allgather-raw`.
pub fn check_config(cfg: &TrainConfig) -> Result<()> {
    if !matches!(cfg.model.name.as_str(), "transformer-lm" | "lstm-lm") {
        bail!(
            "--exchange {} shards the token embedding of a language model; use --model transformer-lm or lstm-lm, not `{}` (flag --model)",
            cfg.exchange,
            cfg.model.name
        );
    }
    match cfg.opt.name.as_str() {
        "sgd" if cfg.opt.momentum == 0.0 && !cfg.opt.nesterov => {}
        "adam" => {}
        "sgd" => bail!(
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
    if cfg.lookup != Lookup::PerToken && cfg.exchange != ExchangeName::Embrace {
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

/// Row-local optimiser for embedding rows (see the module docs).
#[derive(Clone, Debug)]
pub struct RowOpt {
    pub adam: Option<(f32, f32, f32)>,
    pub width: usize,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

impl RowOpt {
    /// `adam = Some((β1, β2, ε))` for lazy Adam, `None` for SGD; state for `rows × width`.
    pub fn new(adam: Option<(f32, f32, f32)>, rows: usize, width: usize) -> Self {
        let n = if adam.is_some() { rows * width } else { 0 };
        RowOpt {
            adam,
            width,
            m: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    /// Bytes of optimiser state.
    pub fn state_bytes(&self) -> usize {
        4 * (self.m.len() + self.v.len())
    }

    /// Updates rows `ids` of `table` (row-major, `width` columns) with gradient rows `grads`
    /// multiplied by `scale` (1/P: the mean), learning rate `lr`, 0-based `step`.
    /// Same arithmetic as `optim::Sgd`/`optim::Adam` element by element.
    pub fn apply(
        &mut self,
        table: &mut [f32],
        ids: &[u32],
        grads: &[f32],
        scale: f32,
        lr: f32,
        step: u32,
    ) {
        let w = self.width;
        for (k, &id) in ids.iter().enumerate() {
            let base = id as usize * w;
            for j in 0..w {
                let g = grads[k * w + j] * scale;
                let i = base + j;
                match self.adam {
                    None => table[i] -= lr * g,
                    Some((b1, b2, eps)) => {
                        let t = step as i32 + 1;
                        let bc1 = 1.0 - b1.powi(t);
                        let bc2 = 1.0 - b2.powi(t);
                        self.m[i] = b1 * self.m[i] + (1.0 - b1) * g;
                        self.v[i] = b2 * self.v[i] + (1.0 - b2) * g * g;
                        let mh = self.m[i] / bc1;
                        let vh = self.v[i] / bc2;
                        table[i] -= lr * mh / (vh.sqrt() + eps);
                    }
                }
            }
        }
    }
}

/// Sorted distinct ids.
pub fn unique(ids: &[u32]) -> Vec<u32> {
    let s: BTreeSet<u32> = ids.iter().copied().collect();
    s.into_iter().collect()
}

/// Vertical split (embrace.md Algorithm 1): `coalesced` (sorted distinct rows of this step)
/// into prior rows (those in `next_all`, the next step's gathered batch of all ranks) and
/// delayed rows (the rest); both sorted.
pub fn split_prior(coalesced: &[u32], next_all: &[Vec<u32>]) -> (Vec<u32>, Vec<u32>) {
    let next: BTreeSet<u32> = next_all.iter().flatten().copied().collect();
    coalesced.iter().partition(|i| next.contains(i))
}

/// Gradient rows `ids` (sorted) of the table at `off` (width d) in the flat gradient `g`.
fn rows_of(g: &[f32], off: usize, d: usize, ids: &[u32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(ids.len() * d);
    for &i in ids {
        let a = off + i as usize * d;
        out.extend_from_slice(&g[a..a + d]);
    }
    out
}

/// The rows `ids` (a subset of `co.ids`, any order) of the coalesced gradient `co`.
fn pick_rows(co: &Rows, ids: &[u32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(ids.len() * co.width);
    for i in ids {
        let k = co
            .ids
            .binary_search(i)
            .expect("a subset of the coalesced rows");
        out.extend_from_slice(co.row(k));
    }
    out
}

/// The output head's parameters (`lm_head.*`, adjacent in the sorted layout) as a range
/// of the model's flat vector (empty if it has none).
fn lm_head_range(model: &Model) -> Range<usize> {
    let heads: Vec<_> = model
        .layout()
        .layers
        .iter()
        .filter(|l| l.name.starts_with("lm_head."))
        .map(|l| l.offset as usize..(l.offset + l.numel) as usize)
        .collect();
    let lo = heads.iter().map(|r| r.start).min().unwrap_or(0);
    let hi = heads.iter().map(|r| r.end).max().unwrap_or(0);
    lo..hi.max(lo)
}

fn lm_ids(b: &Batch) -> Result<&[u32]> {
    match b {
        Batch::Lm { x, .. } => Ok(x),
        Batch::Class { .. } => bail!("--exchange embrace needs token batches"),
    }
}

/// One exchange of embedding-gradient rows `ids` (sorted, with full-width rows `grads`); returns the summed rows this rank must apply (its columns for embrace,
/// all columns for allgather).
fn grad_exchange(
    comm: &dyn Comm,
    allgather: bool,
    v: usize,
    d: usize,
    ids: &[u32],
    grads: &[f32],
) -> Result<Rows> {
    if allgather {
        sparse_allgather(comm, &Rows::new(ids.to_vec(), d, grads.to_vec())?)
    } else {
        embedding_backward(comm, v, d, ids, grads)
    }
}

/// A raw (one row per token, duplicates included) message rebuilt from coalesced rows
/// `u`/`gu` when only the table gradient is known: the first occurrence of a row carries
/// its summed gradient, later occurrences zero rows. `allgather-raw` itself now sends each
/// token's own row gradient (the model returns them); this keeps the same volume and sum.
pub fn per_token_rows(tokens: &[u32], u: &[u32], gu: &[f32], d: usize) -> Result<Rows> {
    let mut seen = BTreeSet::new();
    let mut vals = Vec::with_capacity(tokens.len() * d);
    for &t in tokens {
        if seen.insert(t) {
            let k = u
                .binary_search(&t)
                .map_err(|_| anyhow::anyhow!("token {t} has no coalesced gradient row"))?;
            vals.extend_from_slice(&gu[k * d..(k + 1) * d]);
        } else {
            vals.extend(std::iter::repeat_n(0.0f32, d));
        }
    }
    Rows::new(tokens.to_vec(), d, vals)
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
    dparams: Vec<f32>,
    /// This step's looked-up rows (`T × d`, token order), then their per-token gradients.
    rows: Vec<f32>,
    g_rows: Vec<f32>,
    dopt: Opt,
    table: Vec<f32>,
    row_opt: RowOpt,
    pending: Option<Pending>,
    /// The dense part's allreduce (`ring` or `ring-fp16`).
    dense_algo: &'static str,
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

impl Embrace {
    /// Rank `rank` of `p`: its column shard of the model's embedding (or the full replica),
    /// the dense part, and every rank's data shard.
    pub fn new(
        cfg: &TrainConfig,
        rank: usize,
        p: usize,
        model: &Model,
        data: &Dataset,
    ) -> Result<Self> {
        check_config(cfg)?;
        check_lookup(cfg)?;
        let allgather = matches!(
            cfg.exchange,
            ExchangeName::AllGather | ExchangeName::AllGatherRaw
        );
        let ext = model.external_embedding().context(
            "--exchange embrace needs the model built without its token embedding (Model::new_sharded)",
        )?;
        let (eoff, v, d) = (ext.offset, ext.vocab, ext.width);
        let dsegs = model.segments();
        let shards: Vec<Shard> = (0..p)
            .map(|j| Shard::new(data, j, p, cfg.batch, cfg.model.seq_len))
            .collect::<Result<_>>()?;
        // The table of record: this rank's column shard (embrace) or the full replica,
        // drawn directly (the full table is never formed).
        let cols = if allgather { 0..d } else { slice(d, p, rank) };
        let twidth = cols.len();
        let table = model.embedding_init(cols)?;
        let adam = (cfg.opt.name == "adam").then_some((cfg.opt.beta1, cfg.opt.beta2, cfg.opt.eps));
        let mut ex = Embrace {
            allgather,
            raw: cfg.exchange == ExchangeName::AllGatherRaw,
            embrace_sched: !allgather && cfg.schedule == Schedule::Embrace,
            method: format!(
                "{}-{}",
                cfg.exchange,
                if allgather {
                    "fifo"
                } else {
                    cfg.schedule.name()
                }
            ),
            rank,
            p,
            eoff,
            v,
            d,
            lookup_unique: cfg.lookup == Lookup::Unique,
            head: lm_head_range(model),
            shards,
            seed: cfg.seed,
            batch: cfg.batch,
            dparams: model.get_flat()?,
            rows: Vec::new(),
            g_rows: Vec::new(),
            dopt: Opt::new(&cfg.opt, dsegs)?,
            table,
            row_opt: RowOpt::new(adam, v, twidth),
            pending: None,
            dense_algo: crate::exchange::dense_algo(cfg),
            ids_now: Vec::new(),
            ids_next: None,
            two_d: (!allgather && cfg.schedule == Schedule::TwoD)
                .then(|| TwoD::new(cfg, model, usize::MAX))
                .transpose()?,
            t_step: None,
            wait_s: 0.0,
            overlap_s: 0.0,
            bytes: [0; 4],
        };
        if ex.method.starts_with("embrace") && ex.lookup_unique {
            ex.method = ex.method.replacen("embrace", "embrace-unique", 1);
        }
        Ok(ex)
    }

    /// Keeps the per-token row gradients of a forward/backward for `update`; returns the
    /// loss and the dense gradient.
    fn keep_row_grads(&mut self, r: Result<(f32, Vec<f32>, Vec<f32>)>) -> Result<(f32, Vec<f32>)> {
        let (loss, g, gr) = r?;
        self.g_rows = gr;
        Ok((loss, g))
    }

    /// This rank's coalesced embedding gradient (ids ascending, duplicates summed in token
    /// order, embrace.md §2.2) from the per-token row gradients of the last backward.
    fn coalesced_grad(&mut self) -> Result<Rows> {
        Ok(self.token_rows()?.coalesce())
    }

    /// The per-token row gradients of the last backward (one row per token, duplicates
    /// included), taken out of `self`.
    fn token_rows(&mut self) -> Result<Rows> {
        let ids = self.ids_now[self.rank].clone();
        Rows::new(ids, self.d, std::mem::take(&mut self.g_rows))
    }

    /// A step begins: its clock and counters reset, its gathered batch (prefetched by the last
    /// step, or read now) current, the next step's prefetched.
    fn begin_step(&mut self, step: u32) -> Result<()> {
        self.t_step = Some(Instant::now());
        (self.wait_s, self.overlap_s, self.bytes) = (0.0, 0.0, [0; 4]);
        self.ids_now = match self.ids_next.take() {
            Some(ids) => ids,
            None => self.ids_at(step)?,
        };
        self.ids_next = Some(self.ids_at(step + 1)?);
        Ok(())
    }

    /// Every rank's token ids at `step`.
    fn ids_at(&self, step: u32) -> Result<Vec<Vec<u32>>> {
        self.shards
            .iter()
            .map(|s| lm_ids(&s.batch(self.seed, step, self.batch)).map(<[u32]>::to_vec))
            .collect()
    }

    /// One exchange of gradient rows; the bytes it sent are counted as embedding gradient.
    fn grad_exchange(&mut self, comm: &dyn Comm, ids: &[u32], grads: &[f32]) -> Result<Rows> {
        let s0 = comm.traffic().total().bytes_sent;
        let got = grad_exchange(comm, self.allgather, self.v, self.d, ids, grads);
        self.bytes[GRAD] += comm.traffic().total().bytes_sent - s0;
        got
    }

    /// Applies summed rows to the table with the row-wise optimiser (mean over ranks).
    fn apply(&mut self, got: &Rows, lr: f32, step: u32) {
        let inv_p = 1.0 / self.p as f32;
        self.row_opt
            .apply(&mut self.table, &got.ids, &got.values, inv_p, lr, step);
    }

    /// Exchanges and applies the delayed rows still waiting (before evaluation or the end).
    fn flush(&mut self, comm: &dyn Comm) -> Result<()> {
        self.flush_2d(comm)?;
        if let Some(pd) = self.pending.take() {
            let got = grad_exchange(comm, false, self.v, self.d, &pd.ids, &pd.grads)?;
            self.apply(&got, pd.lr, pd.step);
        }
        Ok(())
    }

    /// Forward lookup (embrace.md §1.2 steps 1–2): the full rows of this rank's tokens
    /// (`T × d`, token order) into `self.rows`, the model's input.
    fn lookup(&mut self, comm: &dyn Comm) -> Result<()> {
        let t = Instant::now();
        let my_ids = &self.ids_now[self.rank];
        self.rows = if self.allgather {
            rows_of(&self.table, 0, self.d, my_ids)
        } else {
            let s0 = comm.traffic().total().bytes_sent;
            let f = if self.lookup_unique {
                embedding_forward_unique
            } else {
                embedding_forward
            };
            let r = f(comm, &self.table, self.v, self.d, &self.ids_now)?;
            self.bytes[FWD] += comm.traffic().total().bytes_sent - s0;
            r
        };
        self.wait_s += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// The embedding rows of this step: prior rows now and delayed rows pending
    /// (`--schedule embrace`), or all rows now (fifo), with the dense allreduce between
    /// or before them.
    fn exchange_rows(
        &mut self,
        comm: &dyn Comm,
        io: &mut StepIo,
        u: Vec<u32>,
        gu: Vec<f32>,
        gd: &mut [f32],
        raw: Option<Rows>,
    ) -> Result<(usize, usize)> {
        let d = self.d;
        // The dense layers: the output head as its own allreduce (its bytes apart), the
        // layers before and after it as two more.
        let dense = |me: &mut Self, gd: &mut [f32]| -> Result<()> {
            let t = Instant::now();
            let (h, n) = (me.head.clone(), gd.len());
            for (k, r) in [(DENSE, 0..h.start), (HEAD, h.clone()), (DENSE, h.end..n)] {
                if !r.is_empty() {
                    let s0 = comm.traffic().total().bytes_sent;
                    dense::allreduce(comm, me.dense_algo, Op::Mean, &mut gd[r])?;
                    me.bytes[k] += comm.traffic().total().bytes_sent - s0;
                }
            }
            me.wait_s += t.elapsed().as_secs_f64();
            Ok(())
        };
        if !self.embrace_sched {
            // FIFO: gradient-generation order (dense blocks, then the embedding).
            dense(self, gd)?;
            let t = Instant::now();
            let got = if let Some(msg) = raw {
                let s0 = comm.traffic().total().bytes_sent;
                let got = sparse_allgather_raw(comm, &msg)?;
                self.bytes[GRAD] += comm.traffic().total().bytes_sent - s0;
                got
            } else {
                self.grad_exchange(comm, &u, &gu)?
            };
            self.wait_s += t.elapsed().as_secs_f64();
            let tu = Instant::now();
            self.apply(&got, io.lr, io.step);
            io.update_s += tu.elapsed().as_secs_f64();
            return Ok((u.len(), 0));
        }
        // Prior rows first (highest priority), then dense, delayed rows next step.
        let next = self.ids_next.as_ref().context("the next step's ids")?;
        let (prior, delayed) = split_prior(&u, next);
        let pos = |set: &[u32]| -> Vec<f32> {
            let mut out = Vec::with_capacity(set.len() * d);
            for &i in set {
                let k = u.binary_search(&i).expect("subset");
                out.extend_from_slice(&gu[k * d..(k + 1) * d]);
            }
            out
        };
        let (pg, dg) = (pos(&prior), pos(&delayed));
        let t = Instant::now();
        let got = self.grad_exchange(comm, &prior, &pg)?;
        self.wait_s += t.elapsed().as_secs_f64();
        let tu = Instant::now();
        self.apply(&got, io.lr, io.step);
        io.update_s += tu.elapsed().as_secs_f64();
        dense(self, gd)?;
        let counts = (prior.len(), delayed.len());
        self.pending = Some(Pending {
            ids: delayed,
            grads: dg,
            lr: io.lr,
            step: io.step,
        });
        Ok(counts)
    }

    /// EmbRace's own per-step metrics (bytes by kind, overlap, rows, owner load, memory).
    fn metrics(&self, io: &mut StepIo, step_s: f64, rows: (usize, usize, usize)) {
        let (u, n_prior, n_delayed) = rows;
        let (v, d, p, rank) = (self.v, self.d, self.p, self.rank);
        let [fwd, grad, dn, head] = self.bytes.map(|b| b as f64);
        let my_ids = &self.ids_now[rank];
        let w = slice(d, p, rank).len();
        // Load of this rank as owner (values it serves: forward lookups + gradient rows)
        // under the column split and under a row split of the same table.
        let rr = slice(v, p, rank);
        let (mut lc, mut lr_) = (0f64, 0f64);
        for ids in &self.ids_now {
            let uj = unique(ids);
            lc += (ids.len() * w + uj.len() * w) as f64;
            let fw = ids.iter().filter(|&&i| rr.contains(&(i as usize))).count();
            let bw = uj.iter().filter(|&&i| rr.contains(&(i as usize))).count();
            lr_ += ((fw + bw) * d) as f64;
        }
        let mut m = vec![
            ("bytes_emb_forward", fwd),
            ("bytes_emb_grad", grad),
            ("bytes_emb", fwd + grad),
            ("bytes_dense", dn + head),
            ("bytes_dense_other", dn),
            ("bytes_lm_head", head),
            ("time_overlapped_s", self.overlap_s),
            ("time_step_s", step_s),
            // Communication stall: the step's wall time not spent computing or updating.
            ("stall_s", (step_s - io.compute_s - io.update_s).max(0.0)),
            ("tokens", my_ids.len() as f64),
            ("rows_coalesced", u as f64),
            ("rows_prior", n_prior as f64),
            ("rows_delayed", n_delayed as f64),
            ("load_col", lc),
            ("load_row", lr_),
        ];
        if io.step == 0 {
            m.extend([
                ("emb_width", self.row_opt.width as f64),
                ("mem_emb_table_bytes", (4 * self.table.len()) as f64),
                ("mem_emb_state_bytes", self.row_opt.state_bytes() as f64),
                ("mem_emb_dense_equiv_bytes", (4 * v * d) as f64),
            ]);
        }
        io.extra
            .extend(m.into_iter().map(|(k, x)| (k.to_string(), x)));
        io.nnz = Some((self.dparams.len() + u * d) as f64);
        io.comm_s = Some(self.wait_s + self.overlap_s);
    }
}

impl Exchange for Embrace {
    fn method(&self) -> String {
        self.method.clone()
    }

    fn compute(
        &mut self,
        comm: &dyn Comm,
        io: &mut StepIo,
        model: &Model,
        batch: &Batch,
    ) -> Result<(f32, Vec<f32>)> {
        if self.two_d.is_some() {
            return self.compute_2d(comm, io, model, batch);
        }
        self.begin_step(io.step)?;
        // 1. Embedding forward: full rows of this rank's tokens.
        self.lookup(comm)?;
        model.set_flat(&self.dparams)?;
        let rows = std::mem::take(&mut self.rows);
        let fwd = || {
            let t = Instant::now();
            let r = model.loss_and_grad_rows(batch, &rows, &mut |_| Ok(()));
            (r, t.elapsed().as_secs_f64())
        };
        // 2. Forward/backward; the delayed rows of the previous step travel meanwhile.
        let Some(pd) = self.pending.take() else {
            let (r, c) = fwd();
            io.compute_s = c;
            return self.keep_row_grads(r);
        };
        let (res, compute_s, got) = std::thread::scope(|s| {
            let h = s.spawn(fwd);
            let t = Instant::now();
            let got = self.grad_exchange(comm, &pd.ids, &pd.grads);
            let ex = t.elapsed().as_secs_f64();
            let (r, c) = h.join().expect("compute thread panicked");
            (r, c, got.map(|g| (g, ex)))
        });
        let (got, ex) = got?;
        self.apply(&got, pd.lr, pd.step);
        self.overlap_s = ex;
        io.compute_s = compute_s;
        self.keep_row_grads(res)
    }

    fn update(&mut self, comm: &dyn Comm, io: &mut StepIo, g: Vec<f32>) -> Result<()> {
        if self.two_d.is_some() {
            return self.update_2d(io, g);
        }
        let tokens = self.token_rows()?;
        let co = tokens.coalesce();
        // allgather-raw's message: each token's own row gradient, duplicates included.
        let raw = self.raw.then_some(tokens);
        let mut gd = g;
        let n_u = co.ids.len();
        let (n_prior, n_delayed) = self.exchange_rows(comm, io, co.ids, co.values, &mut gd, raw)?;
        let tu = Instant::now();
        self.dopt.step(&mut self.dparams, &gd, io.lr, io.step);
        io.update_s += tu.elapsed().as_secs_f64();
        let step_s = self.t_step.map_or(0.0, |t| t.elapsed().as_secs_f64());
        self.metrics(io, step_s, (n_u, n_prior, n_delayed));
        Ok(())
    }

    fn replicated(&self) -> &[f32] {
        &self.dparams
    }
    fn replicated_mut(&mut self) -> &mut [f32] {
        &mut self.dparams
    }
    fn replicated_label(&self) -> &'static str {
        "dense parameters"
    }

    /// The report needs the whole current table: the delayed rows are flushed and the
    /// column shards gathered **on rank 0 only** (the full model's flat layout there; the
    /// other ranks get an empty vector, so no other rank ever holds V × d).
    fn full_params(&mut self, comm: &dyn Comm) -> Result<Vec<f32>> {
        self.flush(comm)?;
        let Some(full) = full_table(comm, self.allgather, &self.table, self.v, self.d)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(self.dparams.len() + full.len());
        out.extend_from_slice(&self.dparams[..self.eoff]);
        out.extend_from_slice(&full);
        out.extend_from_slice(&self.dparams[self.eoff..]);
        Ok(out)
    }

    /// Evaluation without the whole table: rank 0's evaluation tokens are looked up through
    /// the (deduplicated) forward AlltoAll, and rank 0 evaluates from those rows.
    fn evaluate(
        &mut self,
        comm: &dyn Comm,
        model: &Model,
        batches: &[Batch],
    ) -> Result<Option<Eval>> {
        self.flush(comm)?;
        let mine: Vec<u32> = batches
            .iter()
            .map(lm_ids)
            .collect::<Result<Vec<_>>>()?
            .concat();
        let rows = if self.allgather {
            rows_of(&self.table, 0, self.d, &mine)
        } else {
            // Every owner needs rank 0's ids: they travel once, in phase `eval`.
            let all = {
                let _ph = comm.phase("eval");
                comm.allgatherv(mine)?
            };
            let mut req = vec![Vec::new(); self.p];
            req[0] = all.into_iter().next().unwrap_or_default();
            embedding_forward_unique(comm, &self.table, self.v, self.d, &req)?
        };
        if comm.rank() != 0 {
            return Ok(None);
        }
        let mut per_batch = Vec::with_capacity(batches.len());
        let mut at = 0;
        for b in batches {
            let n = lm_ids(b)?.len() * self.d;
            per_batch.push(rows[at..at + n].to_vec());
            at += n;
        }
        model.set_flat(&self.dparams)?;
        Ok(Some(model.evaluate_rows(batches, Some(&per_batch))?))
    }

    fn state(&self) -> Vec<(String, Vec<f32>)> {
        Vec::new() // refused by `check_config` (no --checkpoint with these exchanges)
    }
    fn load_state(&mut self, _tensors: &[(String, Vec<f32>)]) -> Result<()> {
        bail!(
            "--exchange {} does not resume from checkpoints yet",
            self.method
        )
    }
}

/// The whole V × d table on rank 0, `None` on the others (the column shards sent to rank
/// 0 by one AlltoAll in which only rank 0 receives; phase `final_gather`, outside the
/// per-step counters).
fn full_table(
    comm: &dyn Comm,
    allgather: bool,
    table: &[f32],
    v: usize,
    d: usize,
) -> Result<Option<Vec<f32>>> {
    if allgather {
        return Ok((comm.rank() == 0).then(|| table.to_vec()));
    }
    let p = comm.size();
    let mut sends = vec![Vec::new(); p];
    sends[0] = table.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let parts = {
        let _ph = comm.phase("final_gather");
        comm.alltoallv(sends)?
    };
    if comm.rank() != 0 {
        return Ok(None);
    }
    let mut full = vec![0f32; v * d];
    for (k, part) in parts.iter().enumerate() {
        let c = slice(d, p, k);
        let wk = c.len();
        if part.len() != v * wk {
            bail!(
                "column shard of rank {k} has {} values, expected {}",
                part.len(),
                v * wk
            );
        }
        for (row, src) in full.chunks_exact_mut(d).zip(part.chunks_exact(wk.max(1))) {
            for (o, b) in row[c.clone()].iter_mut().zip(src) {
                *o = f32::from_bits(*b);
            }
        }
    }
    Ok(Some(full))
}

/// One operation of `--schedule 2d`'s queue ([`crate::schedule::Class`] gives its priority).
enum Op2 {
    /// Embedding-gradient rows (prior or delayed) of step `step`.
    Rows {
        ids: Vec<u32>,
        grads: Vec<f32>,
        lr: f32,
        step: u32,
    },
    /// The next step's forward AlltoAll (run when the next step starts: it needs that step's ids).
    Lookup,
    /// Dense group `k`'s gradient, its layers concatenated.
    Dense {
        k: usize,
        grad: Vec<f32>,
        lr: f32,
        step: u32,
    },
}

/// A dense layer of a group: its index in the layout, offset in the flat gradient, size,
/// offset in the dense part, and its own optimiser (SGD and Adam are elementwise, so one
/// optimiser per layer computes exactly what one optimiser over the dense part does).
struct GroupLayer {
    li: usize,
    off: usize,
    numel: usize,
    at: usize,
    opt: Opt,
}

/// `--schedule 2d`'s state: the queue, the dense groups in FP order, the last step's waits.
struct TwoD {
    queue: PriorityQueue<Op2>,
    groups: Vec<(String, Vec<GroupLayer>)>,
    /// Seconds the last forward waited before each group.
    waits: Vec<f64>,
}

impl TwoD {
    /// Groups of `model`'s layout in FP order ([`crate::schedule::fp_groups`]), `e` the
    /// sharded embedding. The dense part is the layout minus `e`, in layout order.
    fn new(cfg: &TrainConfig, model: &Model, e: usize) -> Result<Self> {
        let layers = &model.layout().layers;
        let names: Vec<String> = layers.iter().map(|l| l.name.clone()).collect();
        let mut at_of = vec![0usize; layers.len()];
        let mut at = 0;
        for (i, l) in layers.iter().enumerate() {
            if i != e {
                at_of[i] = at;
                at += l.numel as usize;
            }
        }
        let mut groups = Vec::new();
        for (name, idx) in fp_groups(&names, e) {
            let mut gl = Vec::with_capacity(idx.len());
            for li in idx {
                let numel = layers[li].numel as usize;
                gl.push(GroupLayer {
                    li,
                    off: layers[li].offset as usize,
                    numel,
                    at: at_of[li],
                    opt: Opt::new(&cfg.opt, vec![(0, numel)])?,
                });
            }
            groups.push((name, gl));
        }
        Ok(TwoD {
            queue: PriorityQueue::new(),
            waits: vec![0.0; groups.len()],
            groups,
        })
    }
}

impl Embrace {
    /// Runs queued operations until the queue is empty, or (`until_lookup`) until the
    /// lookup has run. A dense group's allreduce is followed by its optimiser update, its
    /// layers written into `model` and its [`Ready`] slot set. Without a model (a flush
    /// before evaluation) the lookup is dropped: the next step looks up afresh.
    fn run_ops(
        &mut self,
        tw: &mut TwoD,
        comm: &dyn Comm,
        model: Option<&Model>,
        ready: &Ready,
        until_lookup: bool,
    ) -> Result<()> {
        while let Some(op) = tw.queue.try_pop() {
            match op {
                Op2::Rows {
                    ids,
                    grads,
                    lr,
                    step,
                } => {
                    let got = self.grad_exchange(comm, &ids, &grads)?;
                    self.apply(&got, lr, step);
                }
                Op2::Lookup => {
                    if let Some(m) = model {
                        self.lookup(comm)?;
                        m.set_flat(&self.dparams)?;
                    }
                    if until_lookup {
                        return Ok(());
                    }
                }
                Op2::Dense {
                    k,
                    mut grad,
                    lr,
                    step,
                } => {
                    if !grad.is_empty() {
                        let s0 = comm.traffic().total().bytes_sent;
                        dense::allreduce(comm, self.dense_algo, Op::Mean, &mut grad)?;
                        // The group holding the output head counts as `bytes_lm_head`
                        // (transformer-lm: lm_head + the final LN's 2·d values).
                        let h = &self.head;
                        let has_head = tw.groups[k]
                            .1
                            .iter()
                            .any(|l| l.at < h.end && h.start < l.at + l.numel);
                        let kind = if has_head { HEAD } else { DENSE };
                        self.bytes[kind] += comm.traffic().total().bytes_sent - s0;
                    }
                    let mut from = 0;
                    for l in &mut tw.groups[k].1 {
                        let w = &mut self.dparams[l.at..l.at + l.numel];
                        l.opt.step(w, &grad[from..from + l.numel], lr, step);
                        if let Some(m) = model {
                            m.set_layer(l.li, w)?;
                        }
                        from += l.numel;
                    }
                    ready.set(k);
                }
            }
        }
        if until_lookup {
            // First step (or after a flush): nothing queued; look up and mark every block.
            if let Some(m) = model {
                self.lookup(comm)?;
                m.set_flat(&self.dparams)?;
            }
            (0..tw.groups.len()).for_each(|k| ready.set(k));
        }
        Ok(())
    }

    /// `--schedule 2d`, forward and backward of step `io.step`: the prior rows and lookup
    /// first, then the forward on a compute thread waiting per block while this thread
    /// serves the dense blocks and delayed rows of the previous step.
    fn compute_2d(
        &mut self,
        comm: &dyn Comm,
        io: &mut StepIo,
        model: &Model,
        batch: &Batch,
    ) -> Result<(f32, Vec<f32>)> {
        self.begin_step(io.step)?;
        let mut tw = self.two_d.take().context("--schedule 2d state")?;
        let n = tw.groups.len();
        let ready = Ready::new(n);
        let t0 = Instant::now();
        let first = self.run_ops(&mut tw, comm, Some(model), &ready, true);
        let lead_s = t0.elapsed().as_secs_f64();
        let res = first.and_then(|()| {
            // The looked-up rows are the forward's input (the model holds no embedding).
            let rows = std::mem::take(&mut self.rows);
            std::thread::scope(|s| {
                let (ready, rows) = (&ready, &rows);
                let h = s.spawn(move || {
                    let t = Instant::now();
                    let mut waits = vec![0.0f64; n];
                    let mut seen = vec![false; n];
                    let r = model.loss_and_grad_rows(batch, rows, &mut |k| {
                        waits[k] += ready.wait(k)?.as_secs_f64();
                        seen[k] = true;
                        Ok(())
                    });
                    (r, t.elapsed().as_secs_f64(), Instant::now(), waits, seen)
                });
                let t = Instant::now();
                let ops = self.run_ops(&mut tw, comm, Some(model), ready, false);
                if let Err(e) = &ops {
                    ready.fail(&format!("{e:#}"));
                }
                let (busy, end) = (t.elapsed().as_secs_f64(), Instant::now());
                let (r, comp_s, comp_end, waits, seen) = h.join().expect("compute thread panicked");
                ops?;
                if let Some(k) = seen.iter().position(|s| !s) {
                    bail!("--schedule 2d: the forward pass never waited for block {k}");
                }
                let fwd_wait: f64 = waits.iter().sum();
                let tail = end.saturating_duration_since(comp_end).as_secs_f64();
                io.compute_s = comp_s - fwd_wait;
                // Stall: what the compute thread waited for plus the queue's tail after BP.
                self.wait_s = lead_s + fwd_wait + tail;
                self.overlap_s = (busy - fwd_wait - tail).max(0.0);
                tw.waits = waits;
                r
            })
        });
        self.two_d = Some(tw);
        self.keep_row_grads(res)
    }

    /// `--schedule 2d` after BP of step `io.step`: every operation of the step into the
    /// queue at once (the next step runs them), no communication here.
    fn update_2d(&mut self, io: &mut StepIo, g: Vec<f32>) -> Result<()> {
        let co = self.coalesced_grad()?;
        let u = &co.ids;
        let next = self.ids_next.as_ref().context("the next step's ids")?;
        let (prior, delayed) = split_prior(u, next);
        let (n_prior, n_delayed) = (prior.len(), delayed.len());
        let (lr, step) = (io.lr, io.step);
        let rows = |ids: Vec<u32>| Op2::Rows {
            grads: pick_rows(&co, &ids),
            ids,
            lr,
            step,
        };
        let mut ops = vec![
            (key(step, Class::PriorGrad), rows(prior)),
            (key(step, Class::Lookup), Op2::Lookup),
            (key(step, Class::DelayedGrad), rows(delayed)),
        ];
        let tw = self.two_d.as_mut().context("--schedule 2d state")?;
        for (k, (_, layers)) in tw.groups.iter().enumerate() {
            let mut grad = Vec::with_capacity(layers.iter().map(|l| l.numel).sum());
            for l in layers {
                grad.extend_from_slice(&g[l.off..l.off + l.numel]);
            }
            ops.push((key(step, Class::Dense(k)), Op2::Dense { k, grad, lr, step }));
        }
        drop(g);
        tw.queue.push_all(ops);
        let waits: Vec<(String, f64)> = tw
            .groups
            .iter()
            .zip(&tw.waits)
            .map(|((name, _), w)| (format!("wait_s:{name}"), *w))
            .collect();
        let step_s = self.t_step.map_or(0.0, |t| t.elapsed().as_secs_f64());
        self.metrics(io, step_s, (u.len(), n_prior, n_delayed));
        io.extra.push((
            "time_fwd_wait_s".into(),
            waits.iter().map(|w| w.1).sum::<f64>(),
        ));
        io.extra.extend(waits);
        Ok(())
    }

    /// Runs what `--schedule 2d` still has queued (before evaluation and at the end).
    fn flush_2d(&mut self, comm: &dyn Comm) -> Result<()> {
        let Some(mut tw) = self.two_d.take() else {
            return Ok(());
        };
        let ready = Ready::new(tw.groups.len());
        let r = self.run_ops(&mut tw, comm, None, &ready, false);
        self.two_d = Some(tw);
        r
    }
}
