//! The data-parallel step loop: P ranks (threads or MPI processes) each train on their
//! shard and exchange gradients (or, for 1-bit optimisers, momenta) through
//! gradkit-collectives every step.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use gradkit_collectives::onebit::{OneBitState, Variant};
/// Ok-Topk's threshold-reuse policy (`gradtrain --adjust`).
pub use gradkit_collectives::registry::Adjust;
use gradkit_collectives::{dense, make_reducer, Flat, Op, Params, Reducer};
use gradkit_comm::{dist, Comm, CommExt, World};
use gradkit_core::trace::{unflatten_dense, MetricSink};
use gradkit_core::{MetricRow, TensorRow};

use crate::checkpoint::{self, RankState};
use crate::data::{self, DataSpec, Dataset, Shard};
use crate::metrics_log::MetricsLog;
use crate::model::{Model, ModelSpec};
use crate::optim::{lr_at, Decay, Opt, OptConfig, Optimizer, Sgd};

/// `--exchange` values: (name, the `make_reducer` algorithm, description).
pub const EXCHANGES: &[(&str, &str, &str)] = &[
    ("dense", "ring", "ring allreduce of the gradients, mean"),
    (
        "topk",
        "topka",
        "local top-k of residual+gradient, allgatherv (TopkA)",
    ),
    (
        "gaussiank",
        "gaussiank",
        "Gaussian-threshold selection, TopkA communication",
    ),
    (
        "topkdsa",
        "topkdsa",
        "SparCML's static regions, sparse/dense allgatherv (TopkDSA)",
    ),
    (
        "gtopk",
        "gtopk",
        "gTop-k reduction tree keeping top-k per level",
    ),
    (
        "oktopk",
        "oktopk",
        "Ok-Topk: split_and_reduce + balance_and_allgatherv (Algorithm 2)",
    ),
    (
        "deft",
        "deft",
        "DEFT: disjoint per-worker partitions, no build-up",
    ),
    (
        "onebit",
        "onebit",
        "1-bit compressed allreduce of the momentum (with --optimizer onebit-lamb/onebit-adam)",
    ),
    (
        "embrace",
        "alltoall",
        "EmbRace: token embedding sharded by columns, AlltoAll lookups and row gradients, ring for the rest (--schedule)",
    ),
    (
        "allgather",
        "alltoall",
        "sparse baseline: row-sparse embedding gradients (duplicate rows coalesced first) allgathered onto full replicas, ring for the rest",
    ),
    (
        "allgather-raw",
        "alltoall",
        "Horovod/DDP sparse baseline: one embedding-gradient row per token (uncoalesced) allgathered onto full replicas, ring for the rest",
    ),
];

/// Everything a run needs.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub model: ModelSpec,
    pub data: DataSpec,
    pub exchange: String,
    pub density: f64,
    /// Sparse exchanges: the first `dense_warmup` steps exchange densely (ring allreduce,
    /// mean, the optimiser on it exactly as `--exchange dense`), then the sparse exchange
    /// starts with zero residuals. The Ok-Topk reference code uses 512 (VGG), 128 (LSTM).
    pub dense_warmup: u32,
    /// Ok-Topk τ and τ'.
    pub period: u32,
    pub reeval: u32,
    /// Ok-Topk: the threshold-reuse policy (`--adjust`; default ladder).
    pub adjust: Adjust,
    pub opt: OptConfig,
    pub lr: f32,
    pub warmup: u32,
    pub decay: Decay,
    pub steps: u32,
    /// Examples (sequences) per rank per step.
    pub batch: usize,
    pub seed: u64,
    /// 0: evaluate only at the end.
    pub eval_every: u32,
    /// 0: check parameters only at the end.
    pub check_every: u32,
    pub checkpoint: Option<PathBuf>,
    pub checkpoint_every: u32,
    pub resume: bool,
    /// Stop (as if interrupted) after this many steps; for tests of `--resume`.
    pub stop_after: Option<u32>,
    pub quiet: bool,
    pub run_name: String,
    /// Keep every rank's local gradient of every step ([`dump_gradients`]).
    pub record_gradients: bool,
    /// Test hook: perturb rank 1's parameters after this step (checks the checksum).
    pub corrupt_at: Option<u32>,
    /// `--exchange embrace`: communication schedule, `fifo` or `embrace` (crate::embrace).
    pub schedule: String,
    /// The `--metrics` file: rank 0 rewrites it atomically every `metrics_every` steps (0:
    /// never) and at each checkpoint, so a killed run keeps its finished steps. The caller
    /// writes the final table from [`TrainReport::metrics`].
    pub metrics_path: Option<PathBuf>,
    pub metrics_every: u32,
    /// Key-value metadata of those rewrites and of a checkpoint's `metrics.parquet`.
    pub metrics_meta: gradkit_core::Meta,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: ModelSpec::default(),
            data: DataSpec::default(),
            exchange: "dense".into(),
            density: 0.01,
            dense_warmup: 0,
            period: 64,
            reeval: 32,
            adjust: Default::default(),
            opt: OptConfig::default(),
            lr: 0.1,
            warmup: 0,
            decay: Decay::None,
            steps: 100,
            batch: 32,
            seed: 0,
            eval_every: 0,
            check_every: 50,
            checkpoint: None,
            checkpoint_every: 0,
            resume: false,
            stop_after: None,
            quiet: true,
            run_name: "run".into(),
            record_gradients: false,
            corrupt_at: None,
            schedule: "embrace".into(),
            metrics_path: None,
            metrics_every: 0,
            metrics_meta: gradkit_core::Meta::default(),
        }
    }
}

/// What a run returns on the I/O rank.
#[derive(Clone, Debug, Default)]
pub struct TrainReport {
    /// `metrics/1` rows of every rank.
    pub metrics: Vec<MetricRow>,
    /// Final parameters (identical on every rank).
    pub params: Vec<f32>,
    pub n_params: usize,
    pub first_step: u32,
    pub last_step: u32,
    /// Mean training loss over ranks of the last min(10, steps) steps.
    pub final_loss: f64,
    pub eval_loss: f64,
    pub eval_accuracy: f64,
    /// The data's best achievable loss (synthetic-lm's entropy rate).
    pub best_loss: Option<f64>,
    pub is_lm: bool,
    /// Means over steps and ranks.
    pub bytes_sent_per_step: f64,
    pub time_compute_s: f64,
    pub time_select_s: f64,
    pub time_comm_s: f64,
    pub time_update_s: f64,
    pub nnz_per_step: f64,
    /// Per-rank local gradients (with `record_gradients`).
    pub gradients: Vec<TensorRow>,
}

/// How gradients travel.
enum Exchange {
    Dense,
    Sparse {
        reducer: Box<dyn Reducer>,
        residual: Vec<f32>,
        /// SGD: Ok-Topk Algorithm 2 (lr folded into the accumulator, w -= u/P, momentum on u/P).
        fold_lr: Option<Sgd>,
    },
    OneBit(OneBitState),
}

/// Validates the combination of flags before any work.
pub fn check_config(cfg: &TrainConfig) -> Result<()> {
    crate::model::check_name(&cfg.model.name)?;
    let Some(_) = EXCHANGES.iter().find(|e| e.0 == cfg.exchange) else {
        let names: Vec<&str> = EXCHANGES.iter().map(|e| e.0).collect();
        bail!(
            "unknown --exchange `{}` (known: {})",
            cfg.exchange,
            names.join(", ")
        );
    };
    if !crate::optim::OPTIMIZERS.iter().any(|o| o.0 == cfg.opt.name) {
        let names: Vec<&str> = crate::optim::OPTIMIZERS.iter().map(|o| o.0).collect();
        bail!(
            "unknown --optimizer `{}` (known: {}) (flag --optimizer)",
            cfg.opt.name,
            names.join(", ")
        );
    }
    let onebit_opt = matches!(cfg.opt.name.as_str(), "onebit-lamb" | "onebit-adam");
    if cfg.exchange == "onebit" && !onebit_opt {
        bail!(
            "--exchange onebit compresses the momentum of a 1-bit optimiser; it needs --optimizer onebit-lamb or onebit-adam, not `{}` (flag --optimizer)",
            cfg.opt.name
        );
    }
    if onebit_opt && cfg.exchange != "onebit" {
        bail!(
            "--optimizer {} needs --exchange onebit, not `{}` (flag --exchange)",
            cfg.opt.name,
            cfg.exchange
        );
    }
    if !(cfg.density > 0.0 && cfg.density <= 1.0) {
        bail!(
            "--density must be in (0, 1], got {} (flag --density)",
            cfg.density
        );
    }
    if cfg.steps == 0 {
        bail!("--steps must be at least 1 (flag --steps)");
    }
    if !(cfg.lr.is_finite() && cfg.lr > 0.0) {
        bail!("--lr must be a positive number, got {} (flag --lr)", cfg.lr);
    }
    if cfg.resume && cfg.checkpoint.is_none() {
        bail!("--resume needs --checkpoint DIR (flag --resume)");
    }
    if cfg.checkpoint_every > 0 && cfg.checkpoint.is_none() {
        bail!("--checkpoint-every needs --checkpoint DIR to write into (flag --checkpoint-every)");
    }
    check_ranges(cfg)?;
    if cfg.dense_warmup > 0 && (cfg.exchange == "onebit" || crate::embrace::handles(&cfg.exchange))
    {
        bail!(
            "--dense-warmup applies to the sparse exchanges (topk, gaussiank, topkdsa, gtopk, oktopk, deft), not `{}`; 1-bit optimisers warm up with --freeze-step (flag --dense-warmup)",
            cfg.exchange
        );
    }
    if crate::embrace::handles(&cfg.exchange) {
        crate::embrace::check_config(cfg)?;
    }
    Ok(())
}

/// No output (`--metrics`, `--checkpoint`) may be the `--data` file or each other; checked
/// before anything is read (a runtime error, exit 1, as in every tool: it depends on the files).
pub fn check_paths(cfg: &TrainConfig) -> Result<()> {
    let data = (!matches!(cfg.data.name.as_str(), "digits" | "synthetic-lm"))
        .then(|| std::path::Path::new(&cfg.data.name));
    gradkit_core::paths::check_distinct(
        &[("--data", data)],
        &[
            ("--metrics", cfg.metrics_path.as_deref()),
            ("--checkpoint", cfg.checkpoint.as_deref()),
        ],
    )
}

/// The numeric flags' ranges (each names its flag): checked before any rank starts, so a
/// value that would panic, divide by zero or train nonsense never reaches the step loop.
fn check_ranges(cfg: &TrainConfig) -> Result<()> {
    let o = &cfg.opt;
    let unit = |v: f32, flag: &str, what: &str| -> Result<()> {
        if !(0.0..1.0).contains(&v) {
            bail!("--{flag} must be in [0, 1) ({what}), got {v} (flag --{flag})");
        }
        Ok(())
    };
    unit(
        o.momentum,
        "momentum",
        "the fraction of the previous update kept",
    )?;
    unit(o.beta1, "beta1", "the decay of the first-moment average")?;
    unit(o.beta2, "beta2", "the decay of the second-moment average")?;
    if !(o.eps.is_finite() && o.eps > 0.0) {
        bail!(
            "--eps must be a positive number (it keeps the division by √v finite), got {} (flag --eps)",
            o.eps
        );
    }
    if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
        bail!(
            "--weight-decay must be a finite number ≥ 0, got {} (flag --weight-decay)",
            o.weight_decay
        );
    }
    if !(o.lamb_min.is_finite() && o.lamb_min >= 0.0) {
        bail!(
            "--lamb-min must be a finite number ≥ 0, got {} (flag --lamb-min)",
            o.lamb_min
        );
    }
    if !(o.lamb_max.is_finite() && o.lamb_max > 0.0) {
        bail!(
            "--lamb-max must be a finite number > 0, got {} (flag --lamb-max)",
            o.lamb_max
        );
    }
    if o.lamb_min > o.lamb_max {
        bail!(
            "--lamb-min {} is larger than --lamb-max {}: the trust-ratio clip needs min ≤ max (flag --lamb-min)",
            o.lamb_min,
            o.lamb_max
        );
    }
    if o.nesterov && o.momentum == 0.0 {
        bail!("--nesterov needs --momentum > 0 (flag --nesterov)");
    }
    for (v, flag) in [(cfg.period, "period"), (cfg.reeval, "reeval")] {
        if v == 0 {
            bail!("--{flag} must be at least 1 (flag --{flag})");
        }
    }
    if cfg.batch == 0 {
        bail!("--batch must be at least 1 (flag --batch)");
    }
    let m = &cfg.model;
    for (v, flag) in [
        (m.hidden, "hidden"),
        (m.d_model, "d-model"),
        (m.layers, "layers"),
        (m.heads, "heads"),
        (m.seq_len, "seq-len"),
        (cfg.data.tokens, "tokens"),
    ] {
        if v == 0 {
            bail!("--{flag} must be at least 1, got 0 (flag --{flag})");
        }
    }
    Ok(())
}

pub(crate) fn checksum(v: &[f32]) -> u64 {
    // FNV-1a over the bit patterns: any difference in any parameter changes it.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in v {
        for b in x.to_bits().to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn run_meta(cfg: &TrainConfig, p: usize, n: usize) -> Vec<(String, String)> {
    let mut meta = vec![
        ("model".into(), cfg.model.name.clone()),
        ("data".into(), cfg.data.name.clone()),
        ("exchange".into(), cfg.exchange.clone()),
        ("optimizer".into(), cfg.opt.name.clone()),
        ("ranks".into(), p.to_string()),
        ("n_params".into(), n.to_string()),
        ("seed".into(), cfg.seed.to_string()),
        ("batch".into(), cfg.batch.to_string()),
    ];
    if cfg.dense_warmup > 0 {
        // Only when set, so checkpoints written before the flag existed still resume.
        meta.push(("dense_warmup".into(), cfg.dense_warmup.to_string()));
    }
    meta
}

/// Trains on every rank of `world`; returns the report on the I/O rank (`None` elsewhere
/// under MPI).
pub fn train(world: &World, cfg: &TrainConfig) -> Result<Option<TrainReport>> {
    // An agreement point: every rank checks the configuration and loads the data; a mistake
    // is reported once (by the lowest rank that saw it) before any training starts.
    let data = world.agree(prepare(world, cfg))?;
    let out = if crate::embrace::handles(&cfg.exchange) {
        world.run(|comm| crate::embrace::rank_main(comm, cfg, &data))?
    } else {
        world.run(|comm| rank_main(comm, cfg, &data))?
    };
    Ok(out.into_iter().next().flatten())
}

/// Ok-Topk's exchange keeps state that a checkpoint does not hold (region boundaries, the
/// reused local threshold), recomputed on its own schedule: every τ (`--period`) and τ'
/// (`--reeval`) calls, counted from its first sparse step (after `--dense-warmup`). A resumed
/// run starts that count afresh at its first step, so it matches the uninterrupted run only
/// when that step is on both schedules; otherwise this warning says so.
pub fn oktopk_resume_warning(cfg: &TrainConfig, first: u32) -> Option<String> {
    if cfg.exchange != "oktopk" || first <= cfg.dense_warmup {
        return None;
    }
    let since = first - cfg.dense_warmup;
    if since.is_multiple_of(cfg.period.max(1)) && since.is_multiple_of(cfg.reeval.max(1)) {
        return None;
    }
    Some(format!(
        "warning: resuming Ok-Topk at step {first}, which is not on its schedule (a multiple of --period {} and of --reeval {} after --dense-warmup {}): its region boundaries and threshold are recomputed at step {first}, so the run will differ from an uninterrupted one; checkpoint at such multiples (e.g. --checkpoint-every {}) to resume exactly",
        cfg.period,
        cfg.reeval,
        cfg.dense_warmup,
        lcm(cfg.period.max(1), cfg.reeval.max(1))
    ))
}

fn lcm(a: u32, b: u32) -> u64 {
    let (mut x, mut y) = (a as u64, b as u64);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a as u64 / x * b as u64
}

/// With `--resume`: the step of the latest checkpoint when it is already at (or past)
/// `--steps`, so there is nothing to train; `None` otherwise. The tool then says so and exits
/// 0 without touching `--metrics` (docs/gradtrain.md).
pub fn resume_finished(cfg: &TrainConfig) -> Result<Option<u32>> {
    let (true, Some(root)) = (cfg.resume, cfg.checkpoint.as_ref()) else {
        return Ok(None);
    };
    let Some(dir) = checkpoint::latest(root)? else {
        return Ok(None); // reported by `train` with its own message
    };
    let step = checkpoint::step_of(&dir)?;
    Ok((step >= cfg.steps).then_some(step))
}

/// The checks made before any rank starts: configuration, data, shards, checkpoint.
fn prepare(world: &World, cfg: &TrainConfig) -> Result<Dataset> {
    check_config(cfg)?;
    let data = data::load(&cfg.data)?;
    let p = world.size();
    // Bounded memory: the model the flags and data describe must fit before any rank builds it.
    let ranks_here = if world.backend() == "local" { p } else { 1 };
    crate::model::check_memory(&cfg.model, &data, cfg.batch, ranks_here)?;
    // Fail early (before threads start) on a shard that cannot hold a batch.
    for r in 0..p {
        Shard::new(&data, r, p, cfg.batch, cfg.model.seq_len)?;
    }
    if cfg.resume {
        let root = cfg.checkpoint.as_ref().unwrap();
        if checkpoint::latest(root)?.is_none() {
            bail!(
                "--resume: no checkpoint in {} (no `latest` file) (flag --checkpoint)",
                root.display()
            );
        }
    }
    Ok(data)
}

/// The real per-rank gradients of `cfg.steps` training steps as dense `tensor/1` rows
/// (one row per step × rank × layer), gathered on the I/O rank. Training proceeds as
/// `cfg` says (exchange, optimiser), so later steps see trained parameters.
pub fn dump_gradients(world: &World, cfg: &TrainConfig) -> Result<Vec<TensorRow>> {
    let mut c = cfg.clone();
    c.record_gradients = true;
    c.eval_every = 0;
    Ok(train(world, &c)?.map(|r| r.gradients).unwrap_or_default())
}

/// The exchange `cfg.exchange` names, with its state sized for `n` parameters on `p` ranks.
fn make_exchange(cfg: &TrainConfig, p: usize, n: usize) -> Result<Exchange> {
    let algo = EXCHANGES.iter().find(|e| e.0 == cfg.exchange).unwrap().1;
    Ok(match cfg.exchange.as_str() {
        "dense" => Exchange::Dense,
        "onebit" => Exchange::OneBit(OneBitState::new(Variant::Server, p, n)),
        _ => {
            let params = Params {
                op: Op::Sum,
                density: cfg.density,
                period: cfg.period,
                reeval: cfg.reeval,
                adjust: cfg.adjust,
                residual: false, // the trainer keeps the residuals (Algorithm 2)
                seed: cfg.seed,
                ..Params::default()
            };
            let fold_lr = (cfg.opt.name == "sgd").then(|| Sgd {
                momentum: cfg.opt.momentum,
                nesterov: cfg.opt.nesterov,
                weight_decay: 0.0,
                buf: vec![0.0; n],
            });
            Exchange::Sparse {
                reducer: make_reducer(algo, &params)
                    .with_context(|| format!("--exchange {}", cfg.exchange))?,
                residual: vec![0.0; n],
                fold_lr,
            }
        }
    })
}
/// `--resume`: loads this rank's checkpoint (parameters, optimiser and exchange state) after
/// checking it was written by the same configuration; returns the step to go on from.
fn restore(
    cfg: &TrainConfig,
    rank: usize,
    meta: &[(String, String)],
    model: &Model,
    opt: &mut Opt,
    exchange: &mut Exchange,
    params: &mut Vec<f32>,
) -> Result<u32> {
    let root = cfg.checkpoint.as_ref().unwrap();
    let dir = checkpoint::latest(root)?.context("no checkpoint to resume")?;
    let st = checkpoint::read_rank(&dir, rank)?;
    for (k, v) in meta {
        let have = st
            .meta
            .iter()
            .find(|(a, _)| a == k)
            .map(|(_, b)| b.as_str());
        if have != Some(v.as_str()) {
            bail!(
                "checkpoint {} was written with {k} = {}, this run has {k} = {v} (flag --resume)",
                dir.display(),
                have.unwrap_or("(none)")
            );
        }
    }
    *params = st
        .get("params")
        .context("checkpoint lacks `params`")?
        .clone();
    if let Some(i) = params.iter().position(|x| !x.is_finite()) {
        bail!(
            "checkpoint file {} holds the non-finite parameter {i} = {}: the file is corrupt, or the run had diverged when it was written",
            dir.join(format!("rank-{rank}.safetensors")).display(),
            params[i]
        );
    }
    let ost: Vec<(String, Vec<f32>)> = st
        .tensors
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("opt.").map(|s| (s.to_string(), v.clone())))
        .collect();
    opt.load_state(&ost)?;
    match exchange {
        Exchange::Sparse {
            residual, fold_lr, ..
        } => {
            *residual = st
                .get("residual")
                .context("checkpoint lacks `residual`")?
                .clone();
            if let Some(s) = fold_lr {
                s.buf = st
                    .get("fold.momentum_buffer")
                    .context("checkpoint lacks momentum")?
                    .clone();
            }
        }
        Exchange::OneBit(ob) => {
            ob.worker_error = st
                .get("onebit.worker_error")
                .context("checkpoint lacks 1-bit worker error")?
                .clone();
            ob.server_error = st
                .get("onebit.server_error")
                .context("checkpoint lacks 1-bit server error")?
                .clone();
        }
        Exchange::Dense => {}
    }
    model.set_flat(params)?;
    Ok(st.step)
}

fn rank_main(comm: &dyn Comm, cfg: &TrainConfig, data: &Dataset) -> Result<Option<TrainReport>> {
    let (rank, p) = (comm.rank(), comm.size());
    let model = Model::new(&cfg.model, data, cfg.seed)?;
    let layout = model.layout().clone();
    let n = model.n_params();
    let segments: Vec<(usize, usize)> = layout
        .layers
        .iter()
        .map(|l| (l.offset as usize, l.numel as usize))
        .collect();
    let shard = Shard::new(data, rank, p, cfg.batch, cfg.model.seq_len)?;
    let mut opt = Opt::new(&cfg.opt, segments)?;
    let mut exchange = make_exchange(cfg, p, n)?;
    let mut params = model.get_flat()?;
    let meta = run_meta(cfg, p, n);
    let mut first = 0u32;
    let mut log = MetricsLog::new(cfg, p, data);
    if cfg.resume {
        first = restore(
            cfg,
            rank,
            &meta,
            &model,
            &mut opt,
            &mut exchange,
            &mut params,
        )?;
        if rank == 0 {
            let root = cfg.checkpoint.as_ref().unwrap();
            let dir = checkpoint::latest(root)?.context("no checkpoint to resume")?;
            log.resume(&dir, first, cfg.quiet)?;
            if let Some(w) = oktopk_resume_warning(cfg, first) {
                gradkit_core::cli::report_line(&w);
            }
        }
    }
    let last = cfg.stop_after.map_or(cfg.steps, |s| s.min(cfg.steps));
    let eval_set = if rank == 0 {
        data::eval_batches(data, cfg.model.seq_len, 256, 512)
    } else {
        Vec::new()
    };
    let mut sink = MetricSink::new(&cfg.run_name, "gradtrain", &cfg.exchange, p as u32);
    let mut grads_rec: Vec<TensorRow> = Vec::new();
    let pb = gradkit_core::cli::progress(
        "gradtrain",
        (last.saturating_sub(first)) as u64,
        cfg.quiet || rank != 0,
    );
    let t_run = Instant::now();
    let mut last_eval = None;
    for step in first..last {
        let t0 = Instant::now();
        let batch = shard.batch(cfg.seed, step, cfg.batch);
        let (loss, g) = model.loss_and_grad(&batch)?;
        if !loss.is_finite() {
            bail!("training diverged: loss is {loss} at step {step} on rank {rank} (try a smaller --lr)");
        }
        if cfg.record_gradients {
            grads_rec.extend(unflatten_dense(&g, &layout, step, rank as u32));
        }
        let t_compute = t0.elapsed().as_secs_f64();
        let lr = lr_at(cfg.lr, step, cfg.warmup, cfg.steps, cfg.decay);
        let before = comm.traffic().total();
        let t1 = Instant::now();
        let mut select_s = 0.0;
        let mut extra: Vec<(String, f64)> = Vec::new();
        let mut update_s = 0.0;
        let warming = step < cfg.dense_warmup;
        match &mut exchange {
            Exchange::Sparse { fold_lr, .. } if warming => {
                // Dense warm-up of a sparse exchange: exactly the `Exchange::Dense` step.
                let mut g = g;
                dense::allreduce(comm, "ring", Op::Mean, &mut g)?;
                let tu = Instant::now();
                opt.step(&mut params, &g, lr, step);
                if step + 1 == cfg.dense_warmup {
                    if let Some(sgd) = fold_lr {
                        // Hand the momentum over to the lr-folded SGD of Algorithm 2, whose
                        // buffer holds lr-scaled updates (exact for a constant lr).
                        if let Some((_, b)) = opt
                            .state()
                            .into_iter()
                            .find(|(k, _)| k == "momentum_buffer")
                        {
                            sgd.buf = b.iter().map(|x| x * lr).collect();
                        }
                    }
                }
                update_s = tu.elapsed().as_secs_f64();
                extra.push(("dense_warmup".into(), 1.0));
            }
            Exchange::Dense => {
                let mut g = g;
                dense::allreduce(comm, "ring", Op::Mean, &mut g)?;
                let tu = Instant::now();
                opt.step(&mut params, &g, lr, step);
                update_s = tu.elapsed().as_secs_f64();
            }
            Exchange::Sparse {
                reducer,
                residual,
                fold_lr,
            } => {
                // Ok-Topk Algorithm 2: acc = ε + α·G (α folded in for SGD), u = sparse
                // allreduce(acc), ε = acc − acc(local ∩ global), w -= u/P.
                let scale = if fold_lr.is_some() { lr } else { 1.0 };
                let wd = if fold_lr.is_some() {
                    cfg.opt.weight_decay
                } else {
                    0.0
                };
                let acc: Vec<f32> = residual
                    .iter()
                    .zip(&g)
                    .zip(&params)
                    .map(|((e, gi), w)| e + scale * (gi + wd * w))
                    .collect();
                let out = reducer.reduce(comm, step, &layout, Flat::Dense(acc.clone()))?;
                for (k, v) in &out.metrics {
                    if k == "time_select_s" {
                        select_s += v;
                    } else if k == "nnz" {
                        // counted below from the result itself
                    } else {
                        extra.push((k.clone(), *v));
                    }
                }
                *residual = acc;
                let mut u = vec![0.0f32; n];
                let mut in_result = vec![false; n];
                match &out.result {
                    Flat::Sparse(s) => {
                        for (&i, &v) in s.indices.iter().zip(&s.values) {
                            u[i as usize] += v;
                            in_result[i as usize] = true;
                        }
                    }
                    Flat::Dense(d) => {
                        u.copy_from_slice(d);
                        in_result.iter_mut().for_each(|x| *x = true);
                    }
                }
                // DEFT (Algorithm 1): every rank sends its values at *all* gathered indices,
                // so all of them leave every residual; `contributed` is only its own selection.
                let sent_all = cfg.exchange == "deft";
                match out.contributed.as_ref().filter(|_| !sent_all) {
                    Some(c) => {
                        for &i in c {
                            if in_result[i as usize] {
                                residual[i as usize] = 0.0;
                            }
                        }
                    }
                    None => {
                        // No selection reported: everything in the result was sent.
                        for (r, &inr) in residual.iter_mut().zip(&in_result) {
                            if inr {
                                *r = 0.0;
                            }
                        }
                    }
                }
                extra.push((
                    "nnz".into(),
                    in_result.iter().filter(|x| **x).count() as f64,
                ));
                let inv_p = 1.0 / p as f32;
                u.iter_mut().for_each(|x| *x *= inv_p);
                let tu = Instant::now();
                match fold_lr {
                    Some(sgd) => sgd.step(&mut params, &u, 1.0, step),
                    None => opt.step(&mut params, &u, lr, step),
                }
                update_s = tu.elapsed().as_secs_f64();
            }
            Exchange::OneBit(state) => {
                if opt.compressing(step) {
                    let tu = Instant::now();
                    let mut m = match &mut opt {
                        Opt::OnebitLamb(o) => o.local_momentum(&g),
                        Opt::OnebitAdam(o) => o.local_momentum(&g),
                        Opt::Plain(_) => unreachable!(),
                    };
                    update_s += tu.elapsed().as_secs_f64();
                    state.allreduce(comm, &mut m)?;
                    let tu = Instant::now();
                    match &mut opt {
                        Opt::OnebitLamb(o) => o.compressed_step(&mut params, m, lr),
                        Opt::OnebitAdam(o) => o.compressed_step(&mut params, m, lr),
                        Opt::Plain(_) => unreachable!(),
                    }
                    update_s += tu.elapsed().as_secs_f64();
                    extra.push(("compressed".into(), 1.0));
                } else {
                    let mut g = g;
                    dense::allreduce(comm, "ring", Op::Mean, &mut g)?;
                    let tu = Instant::now();
                    opt.step(&mut params, &g, lr, step);
                    update_s = tu.elapsed().as_secs_f64();
                    extra.push(("compressed".into(), 0.0));
                }
            }
        }
        let comm_s = (t1.elapsed().as_secs_f64() - select_s - update_s).max(0.0);
        let after = comm.traffic().total();
        if cfg.corrupt_at == Some(step) && rank == 1 {
            params[0] += 1e-3;
        }
        model.set_flat(&params)?;
        let s = step;
        let r = rank as u32;
        sink.push(s, r, "loss", loss as f64);
        sink.push(s, r, "lr", lr as f64);
        sink.push(
            s,
            r,
            "bytes_sent",
            (after.bytes_sent - before.bytes_sent) as f64,
        );
        sink.push(
            s,
            r,
            "bytes_recv",
            (after.bytes_recv - before.bytes_recv) as f64,
        );
        sink.push(
            s,
            r,
            "messages",
            (after.msgs_sent - before.msgs_sent) as f64,
        );
        sink.push(s, r, "time_compute_s", t_compute);
        sink.push(s, r, "time_select_s", select_s);
        sink.push(s, r, "time_comm_s", comm_s);
        sink.push(s, r, "time_update_s", update_s);
        if !extra.iter().any(|(k, _)| k == "nnz") {
            sink.push(s, r, "nnz", n as f64); // dense and 1-bit exchanges carry every entry
        }
        for (k, v) in extra {
            sink.push(s, r, &k, v);
        }
        let done = step + 1;
        let check = (cfg.check_every > 0 && done % cfg.check_every == 0) || done == last;
        if check {
            let _ph = comm.phase("check");
            let sums = comm.allgather_one::<u64>(checksum(&params));
            if let Some((bad, v)) = sums.iter().enumerate().find(|(_, v)| **v != sums[0]) {
                bail!(
                    "parameters differ across ranks after step {step}: rank {bad} has checksum {v:016x}, rank 0 has {:016x} (flag --check-every)",
                    sums[0]
                );
            }
        }
        if rank == 0 && ((cfg.eval_every > 0 && done % cfg.eval_every == 0) || done == last) {
            let ev = model.evaluate(&eval_set)?;
            sink.push(s, 0, "eval_loss", ev.loss);
            sink.push(s, 0, "eval_accuracy", ev.accuracy);
            if matches!(data, Dataset::Lm(_)) {
                sink.push(s, 0, "eval_perplexity", ev.loss.exp());
            }
            last_eval = Some(ev);
        }
        // A run stopped by `stop_after` acts as if killed: no final checkpoint.
        let checkpointing = cfg.checkpoint.is_some()
            && ((cfg.checkpoint_every > 0 && done.is_multiple_of(cfg.checkpoint_every))
                || done == cfg.steps);
        if done < last || checkpointing {
            log.after_step(comm, &mut sink, done, checkpointing)?;
        }
        if let Some(root) = &cfg.checkpoint {
            if checkpointing {
                let mut tensors = vec![("params".to_string(), params.clone())];
                for (k, v) in opt.state() {
                    tensors.push((format!("opt.{k}"), v));
                }
                match &exchange {
                    Exchange::Sparse {
                        residual, fold_lr, ..
                    } => {
                        tensors.push(("residual".into(), residual.clone()));
                        if let Some(sgd) = fold_lr {
                            tensors.push(("fold.momentum_buffer".into(), sgd.buf.clone()));
                        }
                    }
                    Exchange::OneBit(ob) => {
                        tensors.push(("onebit.worker_error".into(), ob.worker_error.clone()));
                        tensors.push(("onebit.server_error".into(), ob.server_error.clone()));
                    }
                    Exchange::Dense => {}
                }
                let st = RankState {
                    step: done,
                    tensors,
                    meta: meta.clone(),
                };
                let res = checkpoint::write_rank(root, rank, &st).and_then(|()| {
                    // The metrics so far travel with the checkpoint (rank 0 holds them).
                    if rank == 0 {
                        log.save_to(&checkpoint::staging_dir(root, done))
                    } else {
                        Ok(())
                    }
                });
                // Everyone must have written before rank 0 commits; agree on failure.
                let ok = comm.allgather_one::<u8>(res.is_ok() as u8);
                res?;
                if ok.contains(&0) {
                    bail!("another rank failed to write its checkpoint at step {done}");
                }
                if rank == 0 {
                    checkpoint::commit(root, done)?;
                }
                comm.barrier();
            }
        }
        if rank == 0 {
            let el = t_run.elapsed().as_secs_f64().max(1e-9);
            let sps = (done - first) as f64 * (cfg.batch * p) as f64 / el;
            pb.set_message(format!("loss {loss:.4} · {sps:.0} samples/s"));
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let rows = log.finish(comm, &mut sink)?;
    let grads = if cfg.record_gradients {
        dist::gather(comm, grads_rec)?
    } else {
        None
    };
    let Some(rows) = rows else {
        return Ok(None);
    };
    let mut rep = summarize(rows, first, last, p, data);
    rep.params = params;
    rep.n_params = n;
    if let Some(ev) = last_eval {
        rep.eval_loss = ev.loss;
        rep.eval_accuracy = ev.accuracy;
    }
    rep.gradients = grads.unwrap_or_default();
    Ok(Some(rep))
}

pub(crate) fn summarize(
    rows: Vec<MetricRow>,
    first: u32,
    last: u32,
    p: usize,
    data: &Dataset,
) -> TrainReport {
    let mean = |name: &str, from: u32| -> f64 {
        let v: Vec<f64> = rows
            .iter()
            .filter(|r| r.metric == name && r.step >= from)
            .map(|r| r.value)
            .collect();
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let tail = last.saturating_sub(10).max(first);
    let _ = p;
    let (best, is_lm) = match data {
        Dataset::Lm(l) => (l.entropy_rate, true),
        Dataset::Class(_) => (None, false),
    };
    TrainReport {
        first_step: first,
        last_step: last,
        final_loss: mean("loss", tail),
        best_loss: best,
        is_lm,
        bytes_sent_per_step: mean("bytes_sent", first),
        time_compute_s: mean("time_compute_s", first),
        time_select_s: mean("time_select_s", first),
        time_comm_s: mean("time_comm_s", first),
        time_update_s: mean("time_update_s", first),
        nnz_per_step: mean("nnz", first),
        metrics: rows,
        ..Default::default()
    }
}
