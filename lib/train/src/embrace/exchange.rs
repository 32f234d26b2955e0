//! [`Embrace`] as an [`Exchange`] of the one training loop (embrace.md §1, §2): its
//! construction (the column shard or full replica, the dense part), the forward lookup
//! (embrace.md §1.2 steps 1–2, `--lookup`), the `fifo` and `embrace` (vertical, §2.2,
//! Algorithm 1) schedules of the embedding-gradient rows and the dense allreduces, EmbRace's
//! per-step metrics, evaluation through the forward AlltoAll, and the full parameters for the
//! report. `--schedule 2d` is in `two_d`.

use std::ops::Range;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use gradkit_collectives::alltoall::{
    embedding_forward, embedding_forward_unique, slice, sparse_allgather_raw, Rows,
};
use gradkit_collectives::{dense, Op};
use gradkit_comm::{Comm, CommExt};

use crate::config::TrainConfig;
use crate::config::{Exchange as ExchangeName, Lookup, Schedule};
use crate::data::{Batch, Dataset, Shard};
use crate::exchange::{Exchange, StepIo};
use crate::model::{Eval, Model};
use crate::optim::Opt;

use super::rows::{full_table, grad_exchange, rows_of, split_prior, unique, RowOpt};
use super::two_d::TwoD;
use super::{check_config, check_lookup, Embrace, Pending, DENSE, FWD, GRAD, HEAD};

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
        let allgather = matches!(cfg.exchange, ExchangeName::AllGather { .. });
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
        let adam = (cfg.opt.method == crate::optim::Method::Adam).then_some((
            cfg.opt.beta1,
            cfg.opt.beta2,
            cfg.opt.eps,
        ));
        let ex = Embrace {
            allgather,
            raw: cfg.exchange == ExchangeName::AllGather { raw: true },
            embrace_sched: !allgather && cfg.schedule == Schedule::Embrace,
            // The row's `method`: EXCHANGE[-unique]-SCHEDULE (the lookup only changes EmbRace's).
            method: format!(
                "{}{}-{}",
                cfg.exchange,
                if !allgather && cfg.lookup == Lookup::Unique {
                    "-unique"
                } else {
                    ""
                },
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
        Ok(ex)
    }

    /// Keeps the per-token row gradients of a forward/backward for `update`; returns the
    /// loss and the dense gradient.
    pub(super) fn keep_row_grads(
        &mut self,
        r: Result<(f32, Vec<f32>, Vec<f32>)>,
    ) -> Result<(f32, Vec<f32>)> {
        let (loss, g, gr) = r?;
        self.g_rows = gr;
        Ok((loss, g))
    }

    /// This rank's coalesced embedding gradient (ids ascending, duplicates summed in token
    /// order, embrace.md §2.2) from the per-token row gradients of the last backward.
    pub(super) fn coalesced_grad(&mut self) -> Result<Rows> {
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
    pub(super) fn begin_step(&mut self, step: u32) -> Result<()> {
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
    pub(super) fn grad_exchange(
        &mut self,
        comm: &dyn Comm,
        ids: &[u32],
        grads: &[f32],
    ) -> Result<Rows> {
        let s0 = comm.traffic().total().bytes_sent;
        let got = grad_exchange(comm, self.allgather, self.v, self.d, ids, grads);
        self.bytes[GRAD] += comm.traffic().total().bytes_sent - s0;
        got
    }

    /// Applies summed rows to the table with the row-wise optimiser (mean over ranks).
    pub(super) fn apply(&mut self, got: &Rows, lr: f32, step: u32) {
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
    pub(super) fn lookup(&mut self, comm: &dyn Comm) -> Result<()> {
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
    pub(super) fn metrics(&self, io: &mut StepIo, step_s: f64, rows: (usize, usize, usize)) {
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
