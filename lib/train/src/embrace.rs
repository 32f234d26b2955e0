//! EmbRace in training (embrace.md): `--exchange embrace` (the token embedding table sharded
//! by columns, AlltoAll lookups and AlltoAll row-sparse gradients, ring allreduce for every
//! other layer) and the AllGather baselines (full replica everywhere, every rank's row-sparse
//! gradient allgathered): `--exchange allgather` coalesces duplicate rows before sending (one
//! row per distinct token), `--exchange allgather-raw` sends one row per token, duplicates
//! included, as Horovod's and PyTorch DDP's sparse allreduce do; with
//! `--schedule fifo|embrace` (embrace.md §2).
//!
//! `allgather-raw`'s values: candle returns the table gradient (duplicates already summed),
//! not the per-token output gradients, so the first occurrence of a row in the rank's token
//! order carries the row's summed gradient and each later occurrence a zero row. The message
//! (ids and row count: tokens·(1 + d) words) and the reduced result are those of the raw
//! exchange; only the split of a row's sum among its duplicate slots differs from Horovod's.
//!
//! ## How the model sees a sharded table
//! The candle model keeps its `Embedding` layer. Before the forward pass the rows this rank's
//! batch reads (`E[X_r]`, returned by the forward AlltoAll) are written into that layer, so
//! the model's forward and backward are exactly those of a full table; the gradient of the
//! layer is nonzero only on those rows and is read back as the coalesced row gradient
//! (candle's autodiff scatter-adds duplicate tokens, which is embrace.md §2.2's coalescing).
//! The other rows of the candle layer are a stale lookup buffer, never read. The table's
//! values of record are the shard `E_r = E[:, cols_r]` (V × w_r) and its optimiser state.
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
//!
//! What this is not: there is one fused backward (candle gives no per-block hooks), so dense
//! allreduces cannot overlap the backward pass; the priority queue reduces to the fixed order
//! above, which every rank follows (a dynamic queue would need rank agreement on readiness).

use std::collections::BTreeSet;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use gradkit_collectives::alltoall::{
    embedding_backward, embedding_forward, slice, sparse_allgather, sparse_allgather_raw, Rows,
};
use gradkit_collectives::{dense, Op};
use gradkit_comm::{Comm, CommExt};

use crate::data::{Batch, Dataset, Shard};
use crate::exchange::{Exchange, StepIo};
use crate::model::Model;
use crate::optim::Opt;
use crate::train::TrainConfig;

/// `--schedule` values.
pub const SCHEDULES: &[(&str, &str)] = &[
    (
        "fifo",
        "gradient-generation order; the next forward waits for every exchange",
    ),
    (
        "embrace",
        "2D: prior embedding rows first, dense next, delayed rows overlapped with the next step's compute",
    ),
];

/// The exchanges this module runs.
pub fn handles(exchange: &str) -> bool {
    matches!(exchange, "embrace" | "allgather" | "allgather-raw")
}

/// Flag checks for `--exchange embrace|allgather|allgather-raw`.
pub fn check_config(cfg: &TrainConfig) -> Result<()> {
    if !matches!(cfg.model.name.as_str(), "transformer-lm" | "lstm-lm") {
        bail!(
            "--exchange {} shards the token embedding of a language model; use --model transformer-lm or lstm-lm, not `{}` (flag --model)",
            cfg.exchange,
            cfg.model.name
        );
    }
    if !SCHEDULES.iter().any(|s| s.0 == cfg.schedule) {
        bail!(
            "unknown --schedule `{}` (known: fifo, embrace) (flag --schedule)",
            cfg.schedule
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

/// Index of the token embedding in the layout.
fn embedding_layer(model: &Model) -> Result<usize> {
    model
        .layout()
        .layers
        .iter()
        .position(|l| l.name == "wte.weight" || l.name == "emb.weight")
        .context("the model has no token embedding (`wte.weight` or `emb.weight`)")
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

/// `allgather-raw`'s message: one row per token of `tokens` (in token order, duplicates
/// included); the first occurrence of a row carries its summed gradient (from the coalesced
/// `u`/`gu`), later occurrences zero rows (see the module docs).
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
    /// Offset and size of the embedding in the flat layout; its rows and width.
    eoff: usize,
    enumel: usize,
    v: usize,
    d: usize,
    /// The dense part: every other layer, (offset, numel) in layout order.
    dsrc: Vec<(usize, usize)>,
    /// Every rank's shard (batches are deterministic, so no id exchange is needed).
    shards: Vec<Shard>,
    seed: u64,
    batch: usize,
    /// The full flat vector the candle model reads (embedding rows filled per batch).
    params: Vec<f32>,
    dparams: Vec<f32>,
    dopt: Opt,
    table: Vec<f32>,
    row_opt: RowOpt,
    pending: Option<Pending>,
    /// The dense part's allreduce (`ring` or `ring-fp16`).
    dense_algo: &'static str,
    /// Token ids of every rank for the step being trained, and for the next one.
    ids_now: Vec<Vec<u32>>,
    ids_next: Option<Vec<Vec<u32>>>,
    /// Per-step accounting carried from `compute` to `update`.
    t_step: Option<Instant>,
    wait_s: f64,
    overlap_s: f64,
    bytes: [u64; 3],
}

/// Indices into [`Embrace::bytes`].
const FWD: usize = 0;
const GRAD: usize = 1;
const DENSE: usize = 2;

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
        let allgather = cfg.exchange.starts_with("allgather");
        let layout = model.layout();
        let e = embedding_layer(model)?;
        let (eoff, enumel) = (
            layout.layers[e].offset as usize,
            layout.layers[e].numel as usize,
        );
        let shape = layout.layers[e].shape.clone().unwrap_or_default();
        let (v, d) = (shape[0] as usize, shape[1] as usize);
        let (mut dsegs, mut dsrc, mut nd) = (Vec::new(), Vec::new(), 0usize);
        for (i, l) in layout.layers.iter().enumerate() {
            if i != e {
                dsegs.push((nd, l.numel as usize));
                dsrc.push((l.offset as usize, l.numel as usize));
                nd += l.numel as usize;
            }
        }
        let shards: Vec<Shard> = (0..p)
            .map(|j| Shard::new(data, j, p, cfg.batch, cfg.model.seq_len))
            .collect::<Result<_>>()?;
        let params = model.get_flat()?;
        let full = &params[eoff..eoff + enumel];
        // The table of record: this rank's column shard (embrace) or the full replica.
        let table: Vec<f32> = if allgather {
            full.to_vec()
        } else {
            let cols = slice(d, p, rank);
            full.chunks_exact(d)
                .flat_map(|row| row[cols.clone()].iter().copied())
                .collect()
        };
        let twidth = if allgather {
            d
        } else {
            slice(d, p, rank).len()
        };
        let adam = (cfg.opt.name == "adam").then_some((cfg.opt.beta1, cfg.opt.beta2, cfg.opt.eps));
        let mut ex = Embrace {
            allgather,
            raw: cfg.exchange == "allgather-raw",
            embrace_sched: !allgather && cfg.schedule == "embrace",
            method: format!(
                "{}-{}",
                cfg.exchange,
                if allgather { "fifo" } else { &cfg.schedule }
            ),
            rank,
            p,
            eoff,
            enumel,
            v,
            d,
            dsrc,
            shards,
            seed: cfg.seed,
            batch: cfg.batch,
            dparams: Vec::new(),
            dopt: Opt::new(&cfg.opt, dsegs)?,
            table,
            row_opt: RowOpt::new(adam, v, twidth),
            params,
            pending: None,
            dense_algo: crate::exchange::dense_algo(cfg),
            ids_now: Vec::new(),
            ids_next: None,
            t_step: None,
            wait_s: 0.0,
            overlap_s: 0.0,
            bytes: [0; 3],
        };
        ex.dparams = ex.gather_dense(&ex.params);
        Ok(ex)
    }

    /// The dense part of a flat vector, layers concatenated in layout order.
    fn gather_dense(&self, flat: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.dparams.len());
        for &(o, len) in &self.dsrc {
            out.extend_from_slice(&flat[o..o + len]);
        }
        out
    }

    /// Writes the dense part into `self.params`.
    fn scatter_dense(&mut self) {
        let mut at = 0;
        for &(o, len) in &self.dsrc {
            self.params[o..o + len].copy_from_slice(&self.dparams[at..at + len]);
            at += len;
        }
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
        if let Some(pd) = self.pending.take() {
            let got = grad_exchange(comm, false, self.v, self.d, &pd.ids, &pd.grads)?;
            self.apply(&got, pd.lr, pd.step);
        }
        Ok(())
    }

    /// Forward lookup: the full rows of this rank's tokens, written into the model's buffer.
    fn lookup(&mut self, comm: &dyn Comm) -> Result<()> {
        let t = Instant::now();
        let my_ids = &self.ids_now[self.rank];
        let rows: Vec<f32> = if self.allgather {
            rows_of(&self.table, 0, self.d, my_ids)
        } else {
            let s0 = comm.traffic().total().bytes_sent;
            let r = embedding_forward(comm, &self.table, self.v, self.d, &self.ids_now)?;
            self.bytes[FWD] += comm.traffic().total().bytes_sent - s0;
            r
        };
        self.wait_s += t.elapsed().as_secs_f64();
        let d = self.d;
        for (k, &id) in self.ids_now[self.rank].iter().enumerate() {
            let a = self.eoff + id as usize * d;
            self.params[a..a + d].copy_from_slice(&rows[k * d..(k + 1) * d]);
        }
        self.scatter_dense();
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
    ) -> Result<(usize, usize)> {
        let d = self.d;
        let dense = |me: &mut Self, gd: &mut [f32]| -> Result<()> {
            let t = Instant::now();
            let s0 = comm.traffic().total().bytes_sent;
            dense::allreduce(comm, me.dense_algo, Op::Mean, gd)?;
            me.bytes[DENSE] += comm.traffic().total().bytes_sent - s0;
            me.wait_s += t.elapsed().as_secs_f64();
            Ok(())
        };
        if !self.embrace_sched {
            // FIFO: gradient-generation order (dense blocks, then the embedding).
            dense(self, gd)?;
            let t = Instant::now();
            let got = if self.raw {
                let s0 = comm.traffic().total().bytes_sent;
                let msg = per_token_rows(&self.ids_now[self.rank], &u, &gu, d)?;
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
        let [fwd, grad, dn] = self.bytes.map(|b| b as f64);
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
            ("bytes_dense", dn),
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
        self.t_step = Some(Instant::now());
        (self.wait_s, self.overlap_s, self.bytes) = (0.0, 0.0, [0; 3]);
        self.ids_now = match self.ids_next.take() {
            Some(ids) => ids,
            None => self.ids_at(io.step)?,
        };
        // Prefetch: the next step's gathered batch.
        self.ids_next = Some(self.ids_at(io.step + 1)?);
        // 1. Embedding forward: full rows of this rank's tokens.
        self.lookup(comm)?;
        model.set_flat(&self.params)?;
        // 2. Forward/backward; the delayed rows of the previous step travel meanwhile.
        let Some(pd) = self.pending.take() else {
            return crate::exchange::timed_loss_and_grad(io, model, batch);
        };
        let (res, compute_s, got) = std::thread::scope(|s| {
            let h = s.spawn(|| {
                let t = Instant::now();
                let r = model.loss_and_grad(batch);
                (r, t.elapsed().as_secs_f64())
            });
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
        res
    }

    fn update(&mut self, comm: &dyn Comm, io: &mut StepIo, g: Vec<f32>) -> Result<()> {
        let d = self.d;
        let u = unique(&self.ids_now[self.rank]);
        let gu = rows_of(&g, self.eoff, d, &u);
        let mut gd = self.gather_dense(&g);
        drop(g);
        let n_u = u.len();
        let (n_prior, n_delayed) = self.exchange_rows(comm, io, u, gu, &mut gd)?;
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

    /// Evaluation and the report need the whole current table: the delayed rows are
    /// flushed and the column shards gathered.
    fn full_params(&mut self, comm: &dyn Comm) -> Result<Vec<f32>> {
        self.flush(comm)?;
        let full = full_table(comm, self.allgather, &self.table, self.v, self.d)?;
        self.params[self.eoff..self.eoff + self.enumel].copy_from_slice(&full);
        self.scatter_dense();
        Ok(self.params.clone())
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

/// The whole V × d table on every rank (allgather of the column shards; phase `final_gather`,
/// outside the per-step counters).
fn full_table(
    comm: &dyn Comm,
    allgather: bool,
    table: &[f32],
    v: usize,
    d: usize,
) -> Result<Vec<f32>> {
    if allgather {
        return Ok(table.to_vec());
    }
    let p = comm.size();
    let parts = {
        let _ph = comm.phase("final_gather");
        comm.allgatherv(table.iter().map(|x| x.to_bits()).collect::<Vec<u32>>())?
    };
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
    Ok(full)
}
