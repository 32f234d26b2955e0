//! How gradients travel and parameters change: the one seam between the training loop
//! ([`crate::train`]) and the collectives.
//!
//! An [`Exchange`] owns one rank's parameters and optimiser state and, every step, turns the
//! rank's local gradient into its parameter update: dense ring allreduce ([`Dense`]), a
//! sparse reducer with error feedback ([`Sparse`], Ok-Topk Algorithm 2), 1-bit compressed
//! momentum ([`OneBit`], 1-bit LAMB Algorithm 1), or EmbRace's hybrid
//! ([`crate::embrace::Embrace`]). The loop owns everything else: batches, metrics, the
//! cross-rank checksum, evaluation, checkpoints and progress.
//!
//! The reducers are the very objects `gradallreduce` builds ([`reducer_for`]), so the
//! selection, the exchange and the error-feedback rule ([`gradkit_sparsify::Leaves`]) exist
//! once; the trainer only chooses what goes in (the lr-folded accumulator of Algorithm 2
//! for SGD) and applies what comes out.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use gradkit_collectives::{dense, reducer_for, Algo, Flat, Op, Params, Reducer};
use gradkit_comm::Comm;
use gradkit_core::trace::Layout;

use crate::config::TrainConfig;
use crate::data::Batch;
use crate::model::Model;
use crate::optim::{Method, Opt, Sgd};

/// What one step measured, filled by the exchange and written by the loop as metrics.
#[derive(Debug, Default)]
pub struct StepIo {
    pub step: u32,
    pub lr: f32,
    pub compute_s: f64,
    pub select_s: f64,
    pub update_s: f64,
    /// Time spent communicating, when the exchange measures it itself (EmbRace overlaps it
    /// with compute); otherwise the loop counts the exchange's wall time minus selection and
    /// update.
    pub comm_s: Option<f64>,
    /// Entries this rank's update carried (`None`: every parameter).
    pub nnz: Option<f64>,
    /// Further per-step metrics (the reducer's own: threshold, local_nnz, …).
    pub extra: Vec<(String, f64)>,
    /// `--xi`: this rank's vectors for ξ, measured by the loop after the traffic counters.
    pub xi: Option<crate::xi::Parts>,
}

/// One rank's parameters, optimiser and gradient exchange (see the module docs).
pub trait Exchange {
    /// The `method` column of the metrics.
    fn method(&self) -> String;
    /// Forward and backward of this rank's `batch` on the current parameters: the loss and
    /// the flat local gradient. An exchange may communicate before (EmbRace's forward
    /// lookup) or meanwhile (EmbRace's delayed rows). Sets `io.compute_s`.
    fn compute(
        &mut self,
        comm: &dyn Comm,
        io: &mut StepIo,
        model: &Model,
        batch: &Batch,
    ) -> Result<(f32, Vec<f32>)> {
        let _ = comm;
        model.set_flat(self.replicated())?;
        timed_loss_and_grad(io, model, batch)
    }
    /// Exchanges the local gradient `g` with the other ranks and updates the parameters.
    fn update(&mut self, comm: &dyn Comm, io: &mut StepIo, g: Vec<f32>) -> Result<()>;
    /// The parameters every rank holds identically (checked by checksum across ranks).
    fn replicated(&self) -> &[f32];
    /// Mutable access, for the fault-injection hook of the tests (`corrupt_at`).
    fn replicated_mut(&mut self) -> &mut [f32];
    /// How the checksum error names [`Exchange::replicated`].
    fn replicated_label(&self) -> &'static str {
        "parameters"
    }
    /// The whole flat parameter vector (collective: every rank calls it at the same step).
    /// EmbRace returns it on rank 0 only (the others get an empty vector: no other rank
    /// ever holds the whole table).
    fn full_params(&mut self, comm: &dyn Comm) -> Result<Vec<f32>> {
        let _ = comm;
        Ok(self.replicated().to_vec())
    }
    /// Evaluation of `batches` (rank 0's evaluation set; the other ranks pass none) on the
    /// current parameters: `Some` on rank 0 (collective: every rank calls it at the same
    /// step). EmbRace evaluates from looked-up rows, without the whole table.
    fn evaluate(
        &mut self,
        comm: &dyn Comm,
        model: &Model,
        batches: &[Batch],
    ) -> Result<Option<crate::model::Eval>> {
        let full = self.full_params(comm)?;
        if comm.rank() != 0 {
            return Ok(None);
        }
        model.set_flat(&full)?;
        Ok(Some(model.evaluate(batches)?))
    }
    /// Everything a checkpoint must hold to resume this rank, as named tensors.
    fn state(&self) -> Vec<(String, Vec<f32>)>;
    /// Restores [`Exchange::state`].
    fn load_state(&mut self, tensors: &[(String, Vec<f32>)]) -> Result<()>;
}

/// Forward and backward of `batch`, timed as `io.compute_s`.
pub fn timed_loss_and_grad(
    io: &mut StepIo,
    model: &Model,
    batch: &Batch,
) -> Result<(f32, Vec<f32>)> {
    let t = Instant::now();
    let r = model.loss_and_grad(batch);
    io.compute_s = t.elapsed().as_secs_f64();
    r
}

/// The exchange `cfg.exchange` names, for `model` (every exchange but EmbRace's, which
/// [`crate::embrace::Embrace`] runs).
pub fn make(cfg: &TrainConfig, model: &Model) -> Result<Box<dyn Exchange>> {
    let rep = Replica::new(cfg, model)?;
    let algo = cfg.exchange.algo();
    let params = Params {
        op: Op::Sum,
        keep: gradkit_core::keep::Keep::Density(cfg.density),
        period: cfg.period,
        reeval: cfg.reeval,
        adjust: cfg.adjust,
        reeval_step_d: cfg.reeval_step_d,
        residual: true, // Algorithm 2: the reducer keeps this rank's residual
        seed: cfg.seed,
        kernels: cfg.kernels,
        resident: cfg.resident,
        ..Params::default()
    };
    let reducer =
        reducer_for(algo, &params).with_context(|| format!("--exchange {}", cfg.exchange))?;
    Ok(match cfg.exchange {
        e if e.is_dense() => Box::new(Dense { rep }),
        e if e.is_compressed() => {
            let n = rep.params.len() as u64;
            let layout = Layout::new(vec![(0, "momentum".into(), n, None)]);
            Box::new(OneBit {
                rep,
                reducer,
                layout,
            })
        }
        _ => Box::new(Sparse::new(cfg, rep, reducer, model.layout().clone())),
    })
}

/// Replicated parameters and their optimiser: the state of every exchange but EmbRace's.
pub struct Replica {
    pub params: Vec<f32>,
    pub opt: Opt,
    /// `lamb_coeff:<tensor>` metric names, one per tensor (LAMB-family optimisers).
    coeff_names: Vec<String>,
    /// The dense allreduce: `ring`, or `ring-fp16` with `--wire fp16`.
    dense_algo: Algo,
}

impl Replica {
    fn new(cfg: &TrainConfig, model: &Model) -> Result<Self> {
        let segments = model.segments();
        Ok(Replica {
            params: model.get_flat()?,
            opt: Opt::new(&cfg.opt, segments)?,
            coeff_names: model
                .layout()
                .layers
                .iter()
                .map(|l| format!("lamb_coeff:{}", l.name))
                .collect(),
            dense_algo: dense_algo(cfg),
        })
    }

    /// The optimiser's step on the reduced gradient `g`, timed as update.
    fn opt_step(&mut self, io: &mut StepIo, g: &[f32]) {
        let t = Instant::now();
        self.opt.step(&mut self.params, g, io.lr, io.step);
        io.update_s += t.elapsed().as_secs_f64();
        self.push_coefficients(io);
    }

    /// LAMB's per-tensor coefficients c_ℓ of this step as metrics (1-bit LAMB's Figs. 1–3),
    /// and the second moments' norms (`variance_norm`, 1-bit LAMB's `variance_fresh_norm`).
    fn push_coefficients(&self, io: &mut StepIo) {
        if let Some(c) = self.opt.coefficients() {
            for (name, v) in self.coeff_names.iter().zip(c) {
                io.extra.push((name.clone(), *v as f64));
            }
        }
        for (name, v) in self.opt.variance_norms() {
            io.extra.push((name.into(), v));
        }
    }

    /// Ring allreduce (mean) of `g`, then the optimiser's step on it.
    fn dense_step(&mut self, comm: &dyn Comm, io: &mut StepIo, mut g: Vec<f32>) -> Result<()> {
        dense::allreduce(comm, self.dense_algo, Op::Mean, &mut g)?;
        self.opt_step(io, &g);
        Ok(())
    }

    fn state(&self) -> Vec<(String, Vec<f32>)> {
        let mut out = vec![("params".to_string(), self.params.clone())];
        for (k, v) in self.opt.state() {
            out.push((format!("opt.{k}"), v));
        }
        out
    }

    fn load_state(&mut self, tensors: &[(String, Vec<f32>)]) -> Result<()> {
        self.params = get(tensors, "params")?.clone();
        let ost: Vec<(String, Vec<f32>)> = tensors
            .iter()
            .filter_map(|(k, v)| k.strip_prefix("opt.").map(|s| (s.to_string(), v.clone())))
            .collect();
        self.opt.load_state(&ost)
    }
}

/// The dense allreduce of `cfg`: the f32 ring, or its fp16-wire variant (`--wire fp16`).
pub fn dense_algo(cfg: &TrainConfig) -> Algo {
    let ring = Algo(&dense::RING);
    if cfg.fp16_wire {
        dense::with_fp16_wire(ring)
    } else {
        ring
    }
}

/// The tensor `name` of a checkpoint.
fn get<'a>(tensors: &'a [(String, Vec<f32>)], name: &str) -> Result<&'a Vec<f32>> {
    tensors
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
        .with_context(|| format!("checkpoint lacks `{name}`"))
}

/// Delegates the replicated-parameter accessors to `self.rep`.
macro_rules! replica_params {
    () => {
        fn replicated(&self) -> &[f32] {
            &self.rep.params
        }
        fn replicated_mut(&mut self) -> &mut [f32] {
            &mut self.rep.params
        }
    };
}

/// `--exchange ring`: ring allreduce of the gradients (mean), then the optimiser.
pub struct Dense {
    rep: Replica,
}

impl Exchange for Dense {
    fn method(&self) -> String {
        self.rep.dense_algo.name().into()
    }
    fn update(&mut self, comm: &dyn Comm, io: &mut StepIo, g: Vec<f32>) -> Result<()> {
        self.rep.dense_step(comm, io, g)
    }
    replica_params!();
    fn state(&self) -> Vec<(String, Vec<f32>)> {
        self.rep.state()
    }
    fn load_state(&mut self, tensors: &[(String, Vec<f32>)]) -> Result<()> {
        self.rep.load_state(tensors)
    }
}

/// The sparse exchanges (the sparse family's reducers): Ok-Topk Algorithm 2. The reducer selects from `acc = ε + α·G`, exchanges, and keeps
/// `ε = acc − acc(sent ∩ result)` by its rule; the trainer applies `w -= u/P`. With SGD the
/// learning rate (and weight decay) are folded into the accumulator (`α = lr`) and momentum
/// acts on `u/P`, as in the paper; other optimisers get `u/P` as their gradient.
pub struct Sparse {
    rep: Replica,
    reducer: Box<dyn Reducer>,
    layout: Layout,
    name: String,
    /// SGD: the lr-folded momentum SGD of Algorithm 2.
    fold_lr: Option<Sgd>,
    weight_decay: f32,
    /// Steps of dense ring allreduce before the sparse exchange starts (`--dense-warmup`).
    dense_warmup: u32,
    /// `--xi`: keep the accumulator, input and result for [`crate::xi`].
    xi_k: Option<usize>,
}

impl Sparse {
    fn new(cfg: &TrainConfig, rep: Replica, reducer: Box<dyn Reducer>, layout: Layout) -> Self {
        let n = rep.params.len();
        let fold_lr = (cfg.opt.method == Method::Sgd).then(|| Sgd {
            momentum: cfg.opt.momentum,
            nesterov: cfg.opt.nesterov,
            weight_decay: 0.0,
            buf: vec![0.0; n],
        });
        Sparse {
            rep,
            reducer,
            layout,
            name: cfg.exchange.to_string(),
            fold_lr,
            weight_decay: cfg.opt.weight_decay,
            dense_warmup: cfg.dense_warmup,
            xi_k: cfg.xi.then(|| gradkit_sparsify::k_for(cfg.density, n)),
        }
    }

    /// A `--dense-warmup` step; after the last one the momentum is handed over to the
    /// lr-folded SGD, whose buffer holds lr-scaled updates (exact for a constant lr).
    fn warmup_step(&mut self, comm: &dyn Comm, io: &mut StepIo, g: Vec<f32>) -> Result<()> {
        self.rep.dense_step(comm, io, g)?;
        if io.step + 1 == self.dense_warmup {
            if let Some(sgd) = &mut self.fold_lr {
                let st = self.rep.opt.state();
                if let Some((_, b)) = st.iter().find(|(k, _)| k == "momentum_buffer") {
                    sgd.buf = b.iter().map(|x| x * io.lr).collect();
                }
            }
        }
        io.extra.push(("dense_warmup".into(), 1.0));
        Ok(())
    }
}

impl Sparse {
    /// ξ's accumulator ε + αG (the reducer's residual before this step, zero before the
    /// first) and input αG.
    fn xi_inputs(&self, input: &[f32], k: usize) -> crate::xi::Parts {
        let mut acc = input.to_vec();
        if let Some((_, res)) = self
            .reducer
            .state()
            .into_iter()
            .find(|(n, _)| n == "residual")
        {
            for (a, r) in acc.iter_mut().zip(res) {
                *a += r;
            }
        }
        crate::xi::Parts {
            acc,
            grad: input.to_vec(),
            u_over_p: Vec::new(),
            k,
        }
    }
}

impl Exchange for Sparse {
    fn method(&self) -> String {
        self.name.clone()
    }

    fn update(&mut self, comm: &dyn Comm, io: &mut StepIo, g: Vec<f32>) -> Result<()> {
        if io.step < self.dense_warmup {
            return self.warmup_step(comm, io, g);
        }
        let mut input = g;
        if self.fold_lr.is_some() {
            // α·(G + wd·w) in place: the accumulator's input, no second gradient buffer.
            let (lr, wd) = (io.lr, self.weight_decay);
            for (gi, w) in input.iter_mut().zip(&self.rep.params) {
                *gi = lr * (*gi + wd * w);
            }
        }
        let xi_in = self.xi_k.map(|k| self.xi_inputs(&input, k));
        let out = self
            .reducer
            .reduce(comm, io.step, &self.layout, Flat::Dense(input))?;
        for (k, v) in out.metrics {
            match k.as_str() {
                "time_select_s" => io.select_s += v,
                "nnz" => {} // counted below from the result itself
                _ => io.extra.push((k, v)),
            }
        }
        let n = self.rep.params.len();
        let inv_p = 1.0 / comm.size() as f32;
        let u = match out.result {
            Flat::Sparse(s) => {
                io.nnz = Some(s.indices.len() as f64);
                let mut u = vec![0.0f32; n];
                for (&i, &v) in s.indices.iter().zip(&s.values) {
                    u[i as usize] += v * inv_p;
                }
                u
            }
            Flat::Dense(mut d) => {
                d.iter_mut().for_each(|x| *x *= inv_p);
                d
            }
        };
        if let Some(mut parts) = xi_in {
            parts.u_over_p = u.clone();
            io.xi = Some(parts);
        }
        match &mut self.fold_lr {
            Some(sgd) => {
                let t = Instant::now();
                crate::optim::Optimizer::step(sgd, &mut self.rep.params, &u, 1.0, io.step);
                io.update_s += t.elapsed().as_secs_f64();
            }
            None => self.rep.opt_step(io, &u),
        }
        Ok(())
    }

    replica_params!();

    fn state(&self) -> Vec<(String, Vec<f32>)> {
        let mut out = self.rep.state();
        out.extend(self.reducer.state());
        if let Some(sgd) = &self.fold_lr {
            out.push(("fold.momentum_buffer".into(), sgd.buf.clone()));
        }
        out
    }

    fn load_state(&mut self, tensors: &[(String, Vec<f32>)]) -> Result<()> {
        self.rep.load_state(tensors)?;
        let mine: Vec<(String, Vec<f32>)> = tensors
            .iter()
            .filter(|(k, _)| k == "residual")
            .cloned()
            .collect();
        self.reducer.load_state(&mine)?;
        if let Some(sgd) = &mut self.fold_lr {
            sgd.buf = get(tensors, "fold.momentum_buffer")?.clone();
        }
        Ok(())
    }
}

/// `--exchange onebit` with `--optimizer onebit-lamb|onebit-adam`: dense ring allreduce
/// during the warm-up (freeze) stage, then 1-bit LAMB's Algorithm 1: each rank's momentum
/// through DeepSpeed's error-compensated 1-bit allreduce (the `onebit` reducer), frozen
/// variance.
pub struct OneBit {
    rep: Replica,
    reducer: Box<dyn Reducer>,
    /// The momentum as one flat tensor.
    layout: Layout,
}

/// Checkpoint names of the 1-bit reducer's state.
const ONEBIT_PREFIX: &str = "onebit.";

impl Exchange for OneBit {
    fn method(&self) -> String {
        self.reducer.name().into()
    }

    fn update(&mut self, comm: &dyn Comm, io: &mut StepIo, g: Vec<f32>) -> Result<()> {
        if !self.rep.opt.compressing(io.step) {
            io.extra.push(("compressed".into(), 0.0));
            return self.rep.dense_step(comm, io, g);
        }
        let done = onebit_compressed_step(
            comm,
            &mut self.rep.opt,
            self.reducer.as_mut(),
            &self.layout,
            &mut self.rep.params,
            &g,
            io.lr,
            io.step,
        )?;
        io.update_s += done.update_s;
        io.extra.extend(done.metrics);
        self.rep.push_coefficients(io);
        io.extra.push(("compressed".into(), 1.0));
        Ok(())
    }

    replica_params!();

    fn state(&self) -> Vec<(String, Vec<f32>)> {
        let mut out = self.rep.state();
        for (k, v) in self.reducer.state() {
            out.push((format!("{ONEBIT_PREFIX}{k}"), v));
        }
        out
    }

    fn load_state(&mut self, tensors: &[(String, Vec<f32>)]) -> Result<()> {
        self.rep.load_state(tensors)?;
        let mine: Vec<(String, Vec<f32>)> = tensors
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix(ONEBIT_PREFIX)
                    .map(|s| (s.to_string(), v.clone()))
            })
            .collect();
        self.reducer.load_state(&mine)
    }
}

/// What [`onebit_compressed_step`] did: the 1-bit reducer's metrics of the step, and the
/// seconds spent in the optimiser's own arithmetic (momentum and update).
pub struct OnebitDone {
    pub metrics: Vec<(String, f64)>,
    pub update_s: f64,
}

/// One compression-stage step of a 1-bit optimiser (1-bit LAMB's Algorithm 1 lines 5–21, or
/// the 1-bit Adam baseline): this rank's momentum from its own gradient `g`, the
/// error-compensated 1-bit allreduce of it (`reducer`: the `onebit` one, over `layout`, the
/// momentum as one tensor), then the step of `params` with the frozen variance. The one
/// implementation that gradtrain's `--exchange onebit` and the Python module's 1-bit
/// optimizers (`gradkit.torch.OnebitAdam`, `OnebitLamb`) run.
#[allow(clippy::too_many_arguments)]
pub fn onebit_compressed_step(
    comm: &dyn Comm,
    opt: &mut Opt,
    reducer: &mut dyn Reducer,
    layout: &Layout,
    params: &mut [f32],
    g: &[f32],
    lr: f32,
    step: u32,
) -> Result<OnebitDone> {
    let t = Instant::now();
    let m = match opt {
        Opt::OnebitLamb(o) => o.local_momentum(g),
        Opt::OnebitAdam(o) => o.local_momentum(g),
        Opt::Plain(_) => bail!("--exchange onebit needs a 1-bit optimiser"),
    };
    let mut update_s = t.elapsed().as_secs_f64();
    let n = m.len();
    let out = reducer.reduce(comm, step, layout, Flat::Dense(m))?;
    let m = out.result.into_dense(n);
    let t = Instant::now();
    match opt {
        Opt::OnebitLamb(o) => o.compressed_step(params, m, lr),
        Opt::OnebitAdam(o) => o.compressed_step(params, m, lr),
        Opt::Plain(_) => unreachable!("checked above"),
    }
    update_s += t.elapsed().as_secs_f64();
    Ok(OnebitDone {
        metrics: out.metrics,
        update_s,
    })
}
