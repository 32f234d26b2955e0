//! The data-parallel step loop: P ranks (threads or MPI processes) each train on their
//! shard and exchange gradients (or, for 1-bit optimisers, momenta) through
//! gradkit-collectives every step.

use std::path::{Path, PathBuf};
use std::time::Instant;

pub use crate::config::{Adjust, ReevalStepD};
use anyhow::{bail, Context, Result};
use gradkit_comm::{dist, Comm, CommExt, World};
use gradkit_core::trace::{unflatten_dense, MetricSink};
use gradkit_core::{MetricRow, TensorRow};

use crate::checkpoint::{self, RankState};
use crate::config::Exchange as ExchangeName;
pub use crate::config::TrainConfig;
use crate::data::{self, Dataset, Shard};
use crate::exchange::{Exchange, StepIo};
use crate::metrics_log::{MetricsLog, Summary};
use crate::model::Model;
use crate::optim::lr_at;

/// What a run returns on the I/O rank.
#[derive(Clone, Debug, Default)]
pub struct TrainReport {
    /// `metrics/1` rows of every rank (empty unless [`TrainConfig::keep_metrics`], or the
    /// `--metrics` output is stdout or a device).
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

/// Validates the combination of flags before any work.
pub fn check_config(cfg: &TrainConfig) -> Result<()> {
    crate::model::check_name(&cfg.model.name)?;
    let onebit_opt = cfg.opt.method.is_onebit();
    if cfg.exchange.is_compressed() && !onebit_opt {
        bail!(
            "--exchange onebit compresses the momentum of a 1-bit optimiser; it needs --optimizer onebit-lamb or onebit-adam, not `{}` (flag --optimizer)",
            cfg.opt.method
        );
    }
    if onebit_opt && !cfg.exchange.is_compressed() {
        bail!(
            "--optimizer {} needs --exchange onebit, not `{}` (flag --exchange)",
            cfg.opt.method,
            cfg.exchange
        );
    }
    if !gradkit_core::keep::density_in_range(cfg.density) {
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
    if cfg.dense_warmup > 0 && !cfg.exchange.is_sparse() {
        bail!(
            "--dense-warmup applies to the sparse exchanges ({}) only, not `{}`{} (flag --dense-warmup)",
            ExchangeName::sparse_names(),
            cfg.exchange,
            if cfg.exchange.is_compressed() {
                "; 1-bit optimisers warm up with --freeze-step"
            } else {
                " (it would be ignored)"
            }
        );
    }
    crate::xi::check_config(cfg)?;
    crate::embrace::check_lookup(cfg)?;
    if cfg.exchange.is_embedding() {
        crate::embrace::check_config(cfg)?;
    }
    let dense_part = cfg.exchange.is_dense()
        || cfg.exchange.is_compressed()
        || cfg.exchange.is_embedding()
        || cfg.dense_warmup > 0;
    if cfg.fp16_wire && !dense_part {
        bail!(
            "--wire fp16 applies to dense allreduces (--exchange dense, onebit's warm-up, embrace/allgather's dense part, a --dense-warmup); --exchange {} without --dense-warmup has none (flag --wire)",
            cfg.exchange
        );
    }
    Ok(())
}

/// No output (`--metrics`, `--comm-trace`, `--checkpoint`) may be the `--data` file or
/// another output, `--comm-trace` must be creatable, and no file of the run may be the checkpoint directory or lie in one of
/// the entries the run writes there (`latest`, `step-N/`, `.staging-step-N/`, the lock file);
/// checked before anything is read (a runtime error, exit 1, as in every tool: it depends on
/// the files).
pub fn check_paths(cfg: &TrainConfig) -> Result<()> {
    let data = (!matches!(cfg.data.name.as_str(), "digits" | "synthetic-lm"))
        .then(|| std::path::Path::new(&cfg.data.name));
    let files = [
        ("--data", data),
        ("--metrics", cfg.metrics_path.as_deref()),
        ("--comm-trace", cfg.comm_trace.as_deref()),
    ];
    gradkit_core::paths::check_distinct(
        &files[..1],
        &[
            files[1],
            files[2],
            ("--checkpoint", cfg.checkpoint.as_deref()),
        ],
    )?;
    gradkit_core::paths::check_outside(
        "--checkpoint",
        cfg.checkpoint.as_deref(),
        &checkpoint::is_reserved,
        &files,
    )?;
    // Written after the last step: where it cannot be created the run stops now.
    if let Some(path) = &cfg.comm_trace {
        gradkit_core::paths::check_creatable("--comm-trace", path)?;
    }
    Ok(())
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
        ("exchange".into(), cfg.exchange.to_string()),
        ("optimizer".into(), cfg.opt.method.to_string()),
        ("ranks".into(), p.to_string()),
        ("n_params".into(), n.to_string()),
        ("seed".into(), cfg.seed.to_string()),
        ("batch".into(), cfg.batch.to_string()),
    ];
    if cfg.dense_warmup > 0 {
        // Only when set, so checkpoints written before the flag existed still resume.
        meta.push(("dense_warmup".into(), cfg.dense_warmup.to_string()));
    }
    if cfg.fp16_wire {
        meta.push(("wire".into(), "fp16".into()));
    }
    meta
}

/// Trains on every rank of `world`; returns the report on the I/O rank (`None` elsewhere
/// under MPI).
pub fn train(world: &World, cfg: &TrainConfig) -> Result<Option<TrainReport>> {
    // Held until the run ends, before anything looks at the checkpoint directory: a second
    // run there is refused, however the two are started.
    let _lock = world.agree(lock_checkpoint_dir(world, cfg))?;
    // An agreement point: every rank checks the configuration and loads the data; a mistake
    // is reported once (by the lowest rank that saw it) before any training starts.
    let data = world.agree(prepare(world, cfg))?;
    // Another: `--resume` reads and checks every rank's checkpoint file here, so a mismatch
    // (world size, model, exchange, …) is one message, not one per rank and an abort.
    let resume = world.agree(load_resume(world, cfg, &data))?;
    let out = world.run(|host| {
        // `--backend nccl`: every message of the rank's loop over the opened Comm.
        let own = cfg.open_comm.map(|open| open(host)).transpose()?.flatten();
        rank_main(own.as_deref().unwrap_or(host), cfg, &data, resume.as_ref())
    })?;
    Ok(out.into_iter().next().flatten())
}

/// Ok-Topk's exchange keeps state that a checkpoint does not hold (region boundaries, the
/// reused local threshold), recomputed on its own schedule: every τ (`--period`) and τ'
/// (`--reeval`) calls, counted from its first sparse step (after `--dense-warmup`). A resumed
/// run starts that count afresh at its first step, so it matches the uninterrupted run only
/// when that step is on both schedules; otherwise this warning says so.
pub fn oktopk_resume_warning(cfg: &TrainConfig, first: u32) -> Option<String> {
    // The exchange whose state follows a --period schedule (Ok-Topk's).
    if !cfg.exchange.reads(gradkit_collectives::Knob::Period) || first <= cfg.dense_warmup {
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
    check_checkpoint_dir(cfg)?;
    let data = data::load(&cfg.data)?;
    let p = world.size();
    // Bounded memory: the model the flags and data describe must fit before any rank builds it.
    let ranks_here = world.ranks_here().len();
    // EmbRace's exchanges hold the token embedding outside the model: 1/P of it (embrace) or
    // a replica (the AllGather baselines).
    let table_ranks = cfg
        .exchange
        .is_embedding()
        .then_some(if cfg.exchange.is_embrace() { p } else { 1 });
    crate::model::check_memory(&cfg.model, &data, cfg.batch, ranks_here, table_ranks)?;
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

/// The I/O process (rank 0's, one per run under mpirun) locks `--checkpoint DIR`
/// ([`checkpoint::lock`]). `--resume` of a directory that does not exist creates nothing:
/// [`prepare`] says there is no checkpoint.
fn lock_checkpoint_dir(
    world: &World,
    cfg: &TrainConfig,
) -> Result<Option<gradkit_core::paths::FileLock>> {
    match &cfg.checkpoint {
        Some(root) if world.is_io_rank() && (!cfg.resume || root.is_dir()) => {
            checkpoint::lock(root).map(Some)
        }
        _ => Ok(None),
    }
}

/// A fresh run (no `--resume`) must not take over a directory that holds another run's
/// checkpoints: its `latest` would move back and its later steps stay mixed with this run's.
fn check_checkpoint_dir(cfg: &TrainConfig) -> Result<()> {
    let (false, false, Some(root)) = (cfg.resume, cfg.overwrite_checkpoint, &cfg.checkpoint) else {
        return Ok(());
    };
    let held = checkpoint::existing(root)?;
    if held.is_empty() {
        return Ok(());
    }
    let shown = match held.as_slice() {
        [one] => one.clone(),
        [first, .., last] => format!("{first} … {last}"),
        [] => unreachable!(),
    };
    bail!(
        "--checkpoint {} already holds another run's checkpoints ({shown}): give --resume to continue that run, or --overwrite-checkpoint to start afresh and replace them (flag --checkpoint)",
        root.display()
    )
}

/// The real per-rank gradients of `cfg.steps` training steps as dense `tensor/1` rows
/// (one row per step × rank × layer), gathered on the I/O rank. Training proceeds as
/// `cfg` says (exchange, optimiser), so later steps see trained parameters.
pub fn dump_gradients(world: &World, cfg: &TrainConfig) -> Result<Vec<TensorRow>> {
    let mut c = cfg.clone();
    c.record_gradients = true;
    c.eval_every = 0;
    let mut rows = train(world, &c)?.map(|r| r.gradients).unwrap_or_default();
    // Gathered rank by rank; a trace is ordered by step (then rank, layer) so that readers
    // can stream it step by step.
    rows.sort_by_key(|r| (r.step, r.rank, r.layer_id));
    Ok(rows)
}

/// What a `--resume` run starts from: the checkpoint's files of this process's ranks, read
/// and checked before any rank starts.
struct Resume {
    dir: PathBuf,
    step: u32,
    /// Rank `ranks.start + i`'s state in slot `i`, taken by that rank.
    states: Vec<std::sync::Mutex<Option<RankState>>>,
    ranks: std::ops::Range<usize>,
    /// The I/O rank's: the metric rows of the steps before `step`.
    rows: std::sync::Mutex<Vec<MetricRow>>,
}

impl Resume {
    fn take(&self, rank: usize) -> Result<RankState> {
        rank.checked_sub(self.ranks.start)
            .and_then(|i| self.states.get(i))
            .and_then(|m| m.lock().unwrap_or_else(|e| e.into_inner()).take())
            .context("a rank's checkpoint state was not read (bug)")
    }
}

/// `--resume`: reads the latest checkpoint's file of every rank of this process and checks it
/// was written by the same configuration (model, data, exchange, optimiser, world size, model
/// size, seed, batch, …) and holds finite parameters; on the I/O rank also the metric rows it
/// carries. Called at an agreement point, before any model is built.
fn load_resume(world: &World, cfg: &TrainConfig, data: &Dataset) -> Result<Option<Resume>> {
    if !cfg.resume {
        return Ok(None);
    }
    let root = cfg
        .checkpoint
        .as_ref()
        .context("--resume needs --checkpoint")?;
    let dir = checkpoint::latest(root)?.context("no checkpoint to resume")?;
    // The model's exact size from the flags and the data (tested equal to the built model's).
    let n = crate::model::estimate_params(&cfg.model, data);
    let meta = run_meta(cfg, world.size(), usize::try_from(n).unwrap_or(usize::MAX));
    let ranks = world.ranks_here();
    let mut states = Vec::with_capacity(ranks.len());
    for rank in ranks.clone() {
        states.push(read_checked(&dir, rank, &meta)?);
    }
    let step = states.first().map_or(0, |s| s.step);
    let rows = if world.is_io_rank() {
        crate::metrics_log::resumed_rows(&dir, step, cfg.quiet)?
    } else {
        Vec::new()
    };
    Ok(Some(Resume {
        dir,
        step,
        states: states
            .into_iter()
            .map(|s| std::sync::Mutex::new(Some(s)))
            .collect(),
        ranks,
        rows: std::sync::Mutex::new(rows),
    }))
}

/// Rank `rank`'s file of the checkpoint `dir`, checked against this run's `meta`.
fn read_checked(dir: &Path, rank: usize, meta: &[(String, String)]) -> Result<RankState> {
    let st = checkpoint::read_rank(dir, rank)?;
    for (k, v) in meta {
        let have = st
            .meta
            .iter()
            .find(|(a, _)| a == k)
            .map(|(_, b)| b.as_str());
        // A checkpoint written under an exchange's old spelling (`dense`) is the same run.
        let canonical = |s: &str| match (k.as_str(), s.parse::<crate::config::Exchange>()) {
            ("exchange", Ok(e)) => e.name().to_string(),
            _ => s.to_string(),
        };
        if have.map(canonical) != Some(canonical(v)) {
            bail!(
                "checkpoint {} was written with {k} = {}, this run has {k} = {v} (flag --resume)",
                dir.display(),
                have.unwrap_or("(none)")
            );
        }
    }
    let params = st.get("params").with_context(|| {
        format!(
            "checkpoint file {} lacks `params`",
            dir.join(format!("rank-{rank}.safetensors")).display()
        )
    })?;
    if let Some(i) = params.iter().position(|x| !x.is_finite()) {
        bail!(
            "checkpoint file {} holds the non-finite parameter {i} = {}: the file is corrupt, or the run had diverged when it was written",
            dir.join(format!("rank-{rank}.safetensors")).display(),
            params[i]
        );
    }
    Ok(st)
}

/// The one training loop: every `--exchange`, on every rank. The [`Exchange`] moves the
/// gradients and updates the parameters; the loop owns batches, metrics, the checksum
/// across ranks, evaluation, checkpoints and progress.
fn rank_main(
    comm: &dyn Comm,
    cfg: &TrainConfig,
    data: &Dataset,
    resume: Option<&Resume>,
) -> Result<Option<TrainReport>> {
    // EmbRace's exchanges hold the token embedding outside the model (sharded, docs/gradtrain.md).
    let model = if cfg.exchange.is_embedding() {
        Model::new_sharded(&cfg.model, data, cfg.seed)?
    } else {
        Model::new(&cfg.model, data, cfg.seed)?
    };
    let mut run = Run::new(comm, cfg, data, model, resume)?;
    if cfg.comm_trace.is_some() {
        comm.traffic().start_recording(comm.rank());
    }
    let pb = gradkit_core::cli::progress(
        "gradtrain",
        run.last.saturating_sub(run.first) as u64,
        cfg.quiet || comm.rank() != 0,
    );
    let t_run = Instant::now();
    for step in run.first..run.last {
        let loss = run.step(step)?;
        if comm.rank() == 0 {
            let el = t_run.elapsed().as_secs_f64().max(1e-9);
            let done = (step + 1 - run.first) as f64;
            let sps = done * (cfg.batch * comm.size()) as f64 / el;
            pb.set_message(format!("loss {loss:.4} · {sps:.0} samples/s"));
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    if let Some(path) = &cfg.comm_trace {
        if let Some(rows) = gradkit_comm::record::gather_recording(comm)? {
            let mut meta = gradkit_core::Meta::producer("gradtrain");
            meta.set("algo", cfg.exchange)
                .set("backend", comm.backend());
            gradkit_core::write_comm_trace(path, meta, comm.size(), &rows)?;
        }
    }
    run.finish()
}

/// One rank's run: the state of the loop around its [`Exchange`].
struct Run<'a> {
    comm: &'a dyn Comm,
    cfg: &'a TrainConfig,
    data: &'a Dataset,
    model: Model,
    ex: Box<dyn Exchange>,
    shard: Shard,
    meta: Vec<(String, String)>,
    log: MetricsLog,
    sink: MetricSink,
    eval_set: Vec<crate::data::Batch>,
    last_eval: Option<crate::model::Eval>,
    grads_rec: Vec<TensorRow>,
    first: u32,
    last: u32,
    /// `--overwrite-checkpoint`: the earlier run's checkpoints are still to be removed.
    purge: bool,
    /// When this process started the run, for `time_elapsed_s`.
    started: Instant,
}

impl<'a> Run<'a> {
    fn new(
        comm: &'a dyn Comm,
        cfg: &'a TrainConfig,
        data: &'a Dataset,
        model: Model,
        resume: Option<&Resume>,
    ) -> Result<Self> {
        let (rank, p) = (comm.rank(), comm.size());
        let mut ex: Box<dyn Exchange> = match cfg.exchange.is_embedding() {
            true => Box::new(crate::embrace::Embrace::new(cfg, rank, p, &model, data)?),
            false => crate::exchange::make(cfg, &model)?,
        };
        let meta = run_meta(cfg, p, model.n_params_full());
        let last = cfg.stop_after.map_or(cfg.steps, |s| s.min(cfg.steps));
        let mut first = 0u32;
        if let Some(r) = resume {
            // Read and checked against this configuration by `load_resume`.
            let st = r.take(rank)?;
            ex.load_state(&st.tensors)
                .with_context(|| format!("checkpoint {}", r.dir.display()))?;
            first = r.step;
        }
        let mut log = MetricsLog::new(cfg, p, data, rank == 0, Summary::new(first, last))?;
        if let Some(r) = resume {
            if rank == 0 {
                log.take_over(std::mem::take(
                    &mut *r.rows.lock().unwrap_or_else(|e| e.into_inner()),
                ))?;
                if let Some(w) = oktopk_resume_warning(cfg, first) {
                    gradkit_core::cli::report_line(&w);
                }
            }
        }
        let eval_set = if rank == 0 {
            data::eval_batches(data, cfg.model.seq_len, 256, 512)
        } else {
            Vec::new()
        };
        Ok(Run {
            comm,
            cfg,
            data,
            shard: Shard::new(data, rank, p, cfg.batch, cfg.model.seq_len)?,
            sink: MetricSink::new(&cfg.run_name, "gradtrain", &ex.method(), p as u32)
                .with_settings(cfg.run_settings()),
            model,
            ex,
            meta,
            log,
            eval_set,
            last_eval: None,
            grads_rec: Vec::new(),
            first,
            last,
            purge: cfg.overwrite_checkpoint && !cfg.resume,
            started: Instant::now(),
        })
    }

    /// One training step: compute, exchange and update, metrics, then the checks, evaluation
    /// and checkpoint that fall on it. Returns the loss.
    fn step(&mut self, step: u32) -> Result<f32> {
        let (comm, cfg, rank) = (self.comm, self.cfg, self.comm.rank());
        let t_step = Instant::now();
        let batch = self.shard.batch(cfg.seed, step, cfg.batch);
        let lr = lr_at(cfg.lr, step, cfg.warmup, cfg.steps, cfg.decay);
        let mut io = StepIo {
            step,
            lr,
            ..StepIo::default()
        };
        let before = comm.traffic().total();
        comm.traffic().begin_step(step, cfg.exchange.name());
        let (loss, g) = self.ex.compute(comm, &mut io, &self.model, &batch)?;
        if !loss.is_finite() {
            bail!("training diverged: loss is {loss} at step {step} on rank {rank} (try a smaller --lr)");
        }
        if cfg.record_gradients {
            let layout = self.model.layout();
            self.grads_rec
                .extend(unflatten_dense(&g, layout, step, rank as u32));
        }
        let t = Instant::now();
        self.ex.update(comm, &mut io, g)?;
        comm.traffic().end_step();
        let comm_s = io
            .comm_s
            .unwrap_or((t.elapsed().as_secs_f64() - io.select_s - io.update_s).max(0.0));
        let after = comm.traffic().total();
        if let Some(parts) = io.xi.take() {
            let xi = crate::xi::measure(comm, parts)?;
            io.extra.push(("xi".into(), xi));
        }
        if cfg.corrupt_at == Some(step) && rank == 1 {
            self.ex.replicated_mut()[0] += 1e-3;
        }
        let r = rank as u32;
        let nnz = io.nnz.unwrap_or(self.model.n_params() as f64);
        for (k, v) in [
            ("loss", loss as f64),
            ("lr", lr as f64),
            ("bytes_sent", (after.bytes_sent - before.bytes_sent) as f64),
            ("bytes_recv", (after.bytes_recv - before.bytes_recv) as f64),
            ("messages", (after.msgs_sent - before.msgs_sent) as f64),
            ("time_compute_s", io.compute_s),
            ("time_select_s", io.select_s),
            ("time_comm_s", comm_s),
            ("time_update_s", io.update_s),
            ("nnz", nnz),
        ] {
            self.sink.push(step, r, k, v);
        }
        for (k, v) in &io.extra {
            self.sink.push(step, r, k, *v);
        }
        // Every exchange's step time (EmbRace's own, with its overlap, is in `extra`), and
        // the wall time since the run started, evaluations and checkpoints of earlier steps
        // included: loss against wall time needs no sum of phase columns.
        if !io.extra.iter().any(|(k, _)| k == "time_step_s") {
            let step_s = t_step.elapsed().as_secs_f64();
            self.sink.push(step, r, "time_step_s", step_s);
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        self.sink.push(step, r, "time_elapsed_s", elapsed);
        // Peak RSS of this process so far (per rank under mpirun; docs/gradtrain.md).
        if let Some(rss) = cfg
            .record_rss
            .then(crate::embrace::peak_rss_bytes)
            .flatten()
        {
            self.sink.push(step, r, "peak_rss_bytes", rss);
        }
        self.after_step(step + 1)?;
        Ok(loss)
    }

    /// The checksum, evaluation and checkpoint due after `done` steps.
    fn after_step(&mut self, done: u32) -> Result<()> {
        let cfg = self.cfg;
        let last = self.last;
        let due = |every: u32| (every > 0 && done.is_multiple_of(every)) || done == last;
        if due(cfg.check_every) {
            self.check(done - 1)?;
        }
        if due(cfg.eval_every) {
            self.evaluate(done - 1)?;
        }
        // A run stopped by `stop_after` acts as if killed: no final checkpoint.
        let checkpointing = cfg.checkpoint.is_some()
            && ((cfg.checkpoint_every > 0 && done.is_multiple_of(cfg.checkpoint_every))
                || done == cfg.steps);
        if done < last || checkpointing {
            self.log
                .after_step(self.comm, &mut self.sink, done, checkpointing)?;
        }
        if checkpointing {
            self.checkpoint(done)?;
        }
        Ok(())
    }

    /// Every rank must hold the same replicated parameters (`--check-every`).
    fn check(&mut self, step: u32) -> Result<()> {
        let _ph = self.comm.phase("check");
        let sums = self
            .comm
            .allgather_one::<u64>(checksum(self.ex.replicated()))?;
        if let Some((bad, v)) = sums.iter().enumerate().find(|(_, v)| **v != sums[0]) {
            bail!(
                "{} differ across ranks after step {step}: rank {bad} has checksum {v:016x}, rank 0 has {:016x} (flag --check-every)",
                self.ex.replicated_label(),
                sums[0]
            );
        }
        Ok(())
    }

    /// Evaluation on rank 0 (`--eval-every` and the last step).
    fn evaluate(&mut self, step: u32) -> Result<()> {
        let ev = self.ex.evaluate(self.comm, &self.model, &self.eval_set)?;
        let Some(ev) = ev else {
            return Ok(());
        };
        self.sink.push(step, 0, "eval_loss", ev.loss);
        self.sink.push(step, 0, "eval_accuracy", ev.accuracy);
        if matches!(self.data, Dataset::Lm(_)) {
            self.sink.push(step, 0, "eval_perplexity", ev.loss.exp());
        }
        self.last_eval = Some(ev);
        Ok(())
    }

    /// Writes every rank's state and commits the checkpoint of step `done` (all or nothing).
    fn checkpoint(&mut self, done: u32) -> Result<()> {
        let (comm, rank) = (self.comm, self.comm.rank());
        let root = self.cfg.checkpoint.as_ref().context("--checkpoint")?;
        let st = RankState {
            step: done,
            tensors: self.ex.state(),
            meta: self.meta.clone(),
        };
        let res = checkpoint::write_rank(root, rank, &st).and_then(|()| {
            // The metrics so far travel with the checkpoint (rank 0 holds them).
            if rank == 0 {
                self.log.save_to(&checkpoint::staging_dir(root, done))
            } else {
                Ok(())
            }
        });
        // Everyone must have written before rank 0 commits; agree on failure.
        let ok = comm.allgather_one::<u8>(res.is_ok() as u8)?;
        if let Some(failed) = ok.iter().position(|w| *w == 0) {
            // A failed checkpoint leaves nothing (the previous one stays `latest`): rank 0
            // removes the partial files, and no rank reports before it has.
            if rank == 0 {
                checkpoint::discard(root, done);
            }
            comm.barrier()?;
            if rank == failed {
                return res;
            }
            // The lowest failing rank's own error is the one reported: in-process its failure
            // wakes this barrier (a peer failure, never printed), under MPI it ends the job.
            comm.barrier()?;
            bail!("rank {failed} failed to write its checkpoint at step {done}");
        }
        if rank == 0 {
            checkpoint::commit(root, done)?;
            if self.purge {
                checkpoint::remove_others(root, done)?;
            }
        }
        self.purge = false;
        comm.barrier()?;
        Ok(())
    }

    /// After the last step: the final parameters, the metrics and recorded gradients gathered
    /// on the I/O rank, and the report there.
    fn finish(mut self) -> Result<Option<TrainReport>> {
        let params = self.ex.full_params(self.comm)?;
        let logged = self.log.finish(self.comm, &mut self.sink)?;
        let grads = if self.cfg.record_gradients {
            dist::gather(self.comm, std::mem::take(&mut self.grads_rec))?
        } else {
            None
        };
        let Some((summary, rows)) = logged else {
            return Ok(None);
        };
        let mut rep = summarize(&summary, rows, self.first, self.last, self.data);
        rep.n_params = params.len();
        rep.params = params;
        if let Some(ev) = self.last_eval {
            rep.eval_loss = ev.loss;
            rep.eval_accuracy = ev.accuracy;
        }
        rep.gradients = grads.unwrap_or_default();
        Ok(Some(rep))
    }
}

pub(crate) fn summarize(
    summary: &Summary,
    rows: Vec<MetricRow>,
    first: u32,
    last: u32,
    data: &Dataset,
) -> TrainReport {
    let mean = |name: &str| summary.mean(name);
    let (best, is_lm) = match data {
        Dataset::Lm(l) => (l.entropy_rate, true),
        Dataset::Class(_) => (None, false),
    };
    TrainReport {
        first_step: first,
        last_step: last,
        final_loss: mean("loss"),
        best_loss: best,
        is_lm,
        bytes_sent_per_step: mean("bytes_sent"),
        time_compute_s: mean("time_compute_s"),
        time_select_s: mean("time_select_s"),
        time_comm_s: mean("time_comm_s"),
        time_update_s: mean("time_update_s"),
        nnz_per_step: mean("nnz"),
        metrics: rows,
        ..Default::default()
    }
}
