//! `--schedule 2d`, vertical + horizontal scheduling (embrace.md §2.1, §5.1;
//! [`crate::schedule`]): after BP every operation of the step goes into a priority queue keyed
//! by FP order (prior rows, the next step's lookup, each dense block with its optimiser
//! update, delayed rows); the next step pops the prior rows and the lookup, then runs its
//! forward on a compute thread that waits before each block for that block's update only,
//! while this thread serves the rest of the queue.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use gradkit_collectives::{dense, Op};
use gradkit_comm::Comm;

use crate::config::TrainConfig;
use crate::data::Batch;
use crate::exchange::StepIo;
use crate::model::Model;
use crate::optim::Opt;
use crate::schedule::{fp_groups, key, Class, PriorityQueue, Ready};

use super::rows::{pick_rows, split_prior};
use super::{Embrace, DENSE, HEAD};

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
pub(super) struct TwoD {
    queue: PriorityQueue<Op2>,
    groups: Vec<(String, Vec<GroupLayer>)>,
    /// Seconds the last forward waited before each group.
    waits: Vec<f64>,
}

impl TwoD {
    /// Groups of `model`'s layout in FP order ([`crate::schedule::fp_groups`]), `e` the
    /// sharded embedding. The dense part is the layout minus `e`, in layout order.
    pub(super) fn new(cfg: &TrainConfig, model: &Model, e: usize) -> Result<Self> {
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
    pub(super) fn compute_2d(
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
    pub(super) fn update_2d(&mut self, io: &mut StepIo, g: Vec<f32>) -> Result<()> {
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
    pub(super) fn flush_2d(&mut self, comm: &dyn Comm) -> Result<()> {
        let Some(mut tw) = self.two_d.take() else {
            return Ok(());
        };
        let ready = Ready::new(tw.groups.len());
        let r = self.run_ops(&mut tw, comm, None, &ready, false);
        self.two_d = Some(tw);
        r
    }
}
