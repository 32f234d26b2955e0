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
use gradkit_core::trace::MetricSink;

use crate::data::{Batch, Dataset, Shard};
use crate::model::Model;
use crate::optim::{lr_at, Opt};
use crate::train::{checksum, summarize, TrainConfig, TrainReport};

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

/// The per-rank loop of `--exchange embrace|allgather|allgather-raw`.
pub fn rank_main(
    comm: &dyn Comm,
    cfg: &TrainConfig,
    data: &Dataset,
) -> Result<Option<TrainReport>> {
    check_config(cfg)?;
    let (rank, p) = (comm.rank(), comm.size());
    let allgather = cfg.exchange.starts_with("allgather");
    let raw = cfg.exchange == "allgather-raw";
    let embrace_sched = !allgather && cfg.schedule == "embrace";
    let model = Model::new(&cfg.model, data, cfg.seed)?;
    let layout = model.layout().clone();
    let n = model.n_params();
    let e = embedding_layer(&model)?;
    let (eoff, enumel) = (
        layout.layers[e].offset as usize,
        layout.layers[e].numel as usize,
    );
    let shape = layout.layers[e].shape.clone().unwrap_or_default();
    let (v, d) = (shape[0] as usize, shape[1] as usize);
    // Dense part: every other layer, concatenated in layout order.
    let mut dsegs = Vec::new();
    let mut dsrc = Vec::new();
    let mut nd = 0usize;
    for (i, l) in layout.layers.iter().enumerate() {
        if i != e {
            dsegs.push((nd, l.numel as usize));
            dsrc.push((l.offset as usize, l.numel as usize));
            nd += l.numel as usize;
        }
    }
    let gather_dense = |flat: &[f32]| -> Vec<f32> {
        let mut out = Vec::with_capacity(nd);
        for &(o, len) in &dsrc {
            out.extend_from_slice(&flat[o..o + len]);
        }
        out
    };
    let scatter_dense = |flat: &mut [f32], dv: &[f32]| {
        let mut at = 0;
        for &(o, len) in &dsrc {
            flat[o..o + len].copy_from_slice(&dv[at..at + len]);
            at += len;
        }
    };
    let shards: Vec<Shard> = (0..p)
        .map(|j| Shard::new(data, j, p, cfg.batch, cfg.model.seq_len))
        .collect::<Result<_>>()?;
    let mut params = model.get_flat()?;
    let mut dparams = gather_dense(&params);
    let cols = slice(d, p, rank);
    let w = cols.len();
    // The table of record: this rank's column shard (embrace) or the full replica (allgather).
    let mut table: Vec<f32> = if allgather {
        params[eoff..eoff + enumel].to_vec()
    } else {
        let mut t = Vec::with_capacity(v * w);
        for row in params[eoff..eoff + enumel].chunks_exact(d) {
            t.extend_from_slice(&row[cols.clone()]);
        }
        t
    };
    let twidth = if allgather { d } else { w };
    let adam = (cfg.opt.name == "adam").then_some((cfg.opt.beta1, cfg.opt.beta2, cfg.opt.eps));
    let mut row_opt = RowOpt::new(adam, v, twidth);
    let mut dopt = Opt::new(&cfg.opt, dsegs)?;
    let inv_p = 1.0 / p as f32;
    let method = format!(
        "{}-{}",
        cfg.exchange,
        if allgather { "fifo" } else { &cfg.schedule }
    );
    let mut sink = MetricSink::new(&cfg.run_name, "gradtrain", &method, p as u32);
    let mut log = crate::metrics_log::MetricsLog::new(cfg, p, data);
    let eval_set = if rank == 0 {
        crate::data::eval_batches(data, cfg.model.seq_len, 256, 512)
    } else {
        Vec::new()
    };
    let mut pending: Option<Pending> = None;
    let mut last_eval = None;
    let last = cfg.stop_after.map_or(cfg.steps, |s| s.min(cfg.steps));
    let apply = |table: &mut Vec<f32>, row_opt: &mut RowOpt, got: &Rows, lr: f32, step: u32| {
        row_opt.apply(table, &got.ids, &got.values, inv_p, lr, step)
    };
    let mut batches: Vec<Batch> = shards
        .iter()
        .map(|s| s.batch(cfg.seed, 0, cfg.batch))
        .collect();
    for step in 0..last {
        let t_step = Instant::now();
        let r = rank as u32;
        let lr = lr_at(cfg.lr, step, cfg.warmup, cfg.steps, cfg.decay);
        let ids_all: Vec<Vec<u32>> = batches
            .iter()
            .map(|b| lm_ids(b).map(<[u32]>::to_vec))
            .collect::<Result<_>>()?;
        // Prefetch: the next step's gathered batch (deterministic sharded loading, so no id
        // exchange is needed).
        let next: Vec<Batch> = shards
            .iter()
            .map(|s| s.batch(cfg.seed, step + 1, cfg.batch))
            .collect();
        let tot0 = comm.traffic().total();
        let sent = || comm.traffic().total().bytes_sent;
        let (mut b_fwd, mut b_grad, mut b_dense) = (0u64, 0u64, 0u64);
        // 1. Embedding forward: full rows of this rank's tokens.
        let mut wait_s = 0.0;
        let t = Instant::now();
        let my_ids = &ids_all[rank];
        let rows: Vec<f32> = if allgather {
            rows_of(&table, 0, d, my_ids)
        } else {
            let s0 = sent();
            let r = embedding_forward(comm, &table, v, d, &ids_all)?;
            b_fwd += sent() - s0;
            r
        };
        wait_s += t.elapsed().as_secs_f64();
        for (k, &id) in my_ids.iter().enumerate() {
            let a = eoff + id as usize * d;
            params[a..a + d].copy_from_slice(&rows[k * d..(k + 1) * d]);
        }
        scatter_dense(&mut params, &dparams);
        model.set_flat(&params)?;
        // 2. Forward/backward; the delayed rows of the previous step travel meanwhile.
        let batch = &batches[rank];
        let (res, compute_s, overlap_s) = match pending.take() {
            Some(pd) => {
                let (res, compute_s, dl) = std::thread::scope(|s| {
                    let h = s.spawn(|| {
                        let t = Instant::now();
                        let r = model.loss_and_grad(batch);
                        (r, t.elapsed().as_secs_f64())
                    });
                    let t = Instant::now();
                    let s0 = sent();
                    let got = grad_exchange(comm, false, v, d, &pd.ids, &pd.grads);
                    b_grad += sent() - s0;
                    let ex = t.elapsed().as_secs_f64();
                    let (r, c) = h.join().expect("compute thread panicked");
                    (r, c, got.map(|g| (g, ex)))
                });
                let (got, ex) = dl?;
                apply(&mut table, &mut row_opt, &got, pd.lr, pd.step);
                (res, compute_s, ex)
            }
            None => {
                let t = Instant::now();
                let r = model.loss_and_grad(batch);
                (r, t.elapsed().as_secs_f64(), 0.0)
            }
        };
        let t_after_compute = Instant::now();
        let (loss, g) = res?;
        if !loss.is_finite() {
            bail!("training diverged: loss is {loss} at step {step} on rank {rank} (try a smaller --lr)");
        }
        let u = unique(my_ids);
        let gu = rows_of(&g, eoff, d, &u);
        let mut gd = gather_dense(&g);
        drop(g);
        let next_ids: Vec<Vec<u32>> = next
            .iter()
            .map(|b| lm_ids(b).map(<[u32]>::to_vec))
            .collect::<Result<_>>()?;
        let mut update_s = 0.0;
        let (mut n_prior, mut n_delayed) = (u.len(), 0usize);
        if embrace_sched {
            // Prior rows first (highest priority), then dense, delayed rows next step.
            let (prior, delayed) = split_prior(&u, &next_ids);
            n_prior = prior.len();
            n_delayed = delayed.len();
            let pos = |set: &[u32]| -> Vec<f32> {
                let mut out = Vec::with_capacity(set.len() * d);
                for &i in set {
                    let k = u.binary_search(&i).expect("subset");
                    out.extend_from_slice(&gu[k * d..(k + 1) * d]);
                }
                out
            };
            let pg = pos(&prior);
            let t = Instant::now();
            let s0 = sent();
            let got = grad_exchange(comm, false, v, d, &prior, &pg)?;
            b_grad += sent() - s0;
            wait_s += t.elapsed().as_secs_f64();
            let tu = Instant::now();
            apply(&mut table, &mut row_opt, &got, lr, step);
            update_s += tu.elapsed().as_secs_f64();
            let t = Instant::now();
            let s0 = sent();
            dense::allreduce(comm, "ring", Op::Mean, &mut gd)?;
            b_dense += sent() - s0;
            wait_s += t.elapsed().as_secs_f64();
            let dg = pos(&delayed);
            pending = Some(Pending {
                ids: delayed,
                grads: dg,
                lr,
                step,
            });
        } else {
            // FIFO: gradient-generation order (dense blocks, then the embedding).
            let t = Instant::now();
            let s0 = sent();
            dense::allreduce(comm, "ring", Op::Mean, &mut gd)?;
            b_dense += sent() - s0;
            let s0 = sent();
            let got = if raw {
                sparse_allgather_raw(comm, &per_token_rows(my_ids, &u, &gu, d)?)?
            } else {
                grad_exchange(comm, allgather, v, d, &u, &gu)?
            };
            b_grad += sent() - s0;
            wait_s += t.elapsed().as_secs_f64();
            let tu = Instant::now();
            apply(&mut table, &mut row_opt, &got, lr, step);
            update_s += tu.elapsed().as_secs_f64();
        }
        let tu = Instant::now();
        dopt.step(&mut dparams, &gd, lr, step);
        update_s += tu.elapsed().as_secs_f64();
        let _ = t_after_compute;
        let step_s = t_step.elapsed().as_secs_f64();
        let tot1 = comm.traffic().total();
        // Metrics.
        sink.push(step, r, "loss", loss as f64);
        sink.push(step, r, "lr", lr as f64);
        sink.push(
            step,
            r,
            "bytes_sent",
            (tot1.bytes_sent - tot0.bytes_sent) as f64,
        );
        sink.push(
            step,
            r,
            "bytes_recv",
            (tot1.bytes_recv - tot0.bytes_recv) as f64,
        );
        sink.push(
            step,
            r,
            "messages",
            (tot1.msgs_sent - tot0.msgs_sent) as f64,
        );
        let (fwd, grad) = (b_fwd as f64, b_grad as f64);
        sink.push(step, r, "bytes_emb_forward", fwd);
        sink.push(step, r, "bytes_emb_grad", grad);
        sink.push(step, r, "bytes_emb", fwd + grad);
        sink.push(step, r, "bytes_dense", b_dense as f64);
        sink.push(step, r, "time_compute_s", compute_s);
        sink.push(step, r, "time_comm_s", wait_s + overlap_s);
        sink.push(step, r, "time_overlapped_s", overlap_s);
        sink.push(step, r, "time_update_s", update_s);
        sink.push(step, r, "time_step_s", step_s);
        // Communication stall: the step's wall time not spent computing or updating.
        sink.push(step, r, "stall_s", (step_s - compute_s - update_s).max(0.0));
        sink.push(step, r, "tokens", my_ids.len() as f64);
        sink.push(step, r, "rows_coalesced", u.len() as f64);
        sink.push(step, r, "rows_prior", n_prior as f64);
        sink.push(step, r, "rows_delayed", n_delayed as f64);
        sink.push(step, r, "nnz", (nd + u.len() * d) as f64);
        // Load of this rank as owner (values it serves: forward lookups + gradient rows)
        // under the column split and under a row split of the same table.
        let rr = slice(v, p, rank);
        let (mut lc, mut lr_) = (0f64, 0f64);
        for ids in &ids_all {
            let uj = unique(ids);
            lc += (ids.len() * w + uj.len() * w) as f64;
            let fw = ids.iter().filter(|&&i| rr.contains(&(i as usize))).count();
            let bw = uj.iter().filter(|&&i| rr.contains(&(i as usize))).count();
            lr_ += ((fw + bw) * d) as f64;
        }
        sink.push(step, r, "load_col", lc);
        sink.push(step, r, "load_row", lr_);
        if step == 0 {
            sink.push(step, r, "emb_width", twidth as f64);
            sink.push(step, r, "mem_emb_table_bytes", (4 * table.len()) as f64);
            sink.push(step, r, "mem_emb_state_bytes", row_opt.state_bytes() as f64);
            sink.push(step, r, "mem_emb_dense_equiv_bytes", (4 * v * d) as f64);
        }
        let done = step + 1;
        if (cfg.check_every > 0 && done % cfg.check_every == 0) || done == last {
            let _ph = comm.phase("check");
            let sums = comm.allgather_one::<u64>(checksum(&dparams));
            if let Some((bad, x)) = sums.iter().enumerate().find(|(_, x)| **x != sums[0]) {
                bail!(
                    "dense parameters differ across ranks after step {step}: rank {bad} has checksum {x:016x}, rank 0 has {:016x} (flag --check-every)",
                    sums[0]
                );
            }
        }
        let eval_now = (cfg.eval_every > 0 && done % cfg.eval_every == 0) || done == last;
        if eval_now {
            // Evaluation needs the whole current table: flush delayed rows, gather the shards.
            if let Some(pd) = pending.take() {
                let got = grad_exchange(comm, false, v, d, &pd.ids, &pd.grads)?;
                apply(&mut table, &mut row_opt, &got, pd.lr, pd.step);
            }
            let full = full_table(comm, allgather, &table, v, d)?;
            params[eoff..eoff + enumel].copy_from_slice(&full);
            scatter_dense(&mut params, &dparams);
            if rank == 0 {
                model.set_flat(&params)?;
                let ev = model.evaluate(&eval_set)?;
                sink.push(step, 0, "eval_loss", ev.loss);
                sink.push(step, 0, "eval_accuracy", ev.accuracy);
                sink.push(step, 0, "eval_perplexity", ev.loss.exp());
                last_eval = Some(ev);
            }
        }
        if done < last {
            log.after_step(comm, &mut sink, done, false)?;
        }
        batches = next;
    }
    if let Some(pd) = pending.take() {
        let got = grad_exchange(comm, false, v, d, &pd.ids, &pd.grads)?;
        apply(&mut table, &mut row_opt, &got, pd.lr, pd.step);
    }
    let full = full_table(comm, allgather, &table, v, d)?;
    params[eoff..eoff + enumel].copy_from_slice(&full);
    scatter_dense(&mut params, &dparams);
    let rows = log.finish(comm, &mut sink)?;
    let Some(rows) = rows else {
        return Ok(None);
    };
    let mut rep = summarize(rows, 0, last, p, data);
    rep.params = params;
    rep.n_params = n;
    if let Some(ev) = last_eval {
        rep.eval_loss = ev.loss;
        rep.eval_accuracy = ev.accuracy;
    }
    Ok(Some(rep))
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
        comm.allgatherv(table.iter().map(|x| x.to_bits()).collect::<Vec<u32>>())
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
