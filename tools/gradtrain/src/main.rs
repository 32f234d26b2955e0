//! gradtrain: data-parallel training with every gradient exchange and optimiser of the papers.

/// Large blocks mapped on huge pages and handed back when freed (docs/MEMORY.md).
#[global_allocator]
static ALLOC: gradkit_core::alloc::BigAlloc = gradkit_core::alloc::BigAlloc;

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use gradkit_collectives::Knob;
use gradkit_comm::World;
use gradkit_core::cli::{self, fmt_num};
use gradkit_core::io::{write_table, Meta, Output};
use gradkit_train::data::DataSpec;
use gradkit_train::model::ModelSpec;
use gradkit_train::optim::{Decay, Method, OptConfig};
use gradkit_train::{Exchange, TrainConfig, TrainReport};

const ABOUT: &str =
    "Train a model data-parallel on P ranks, exchanging gradients through gradkit's collectives.

Every rank holds the same model (candle, real backpropagation), trains on its own shard of
the data, and exchanges gradients every step: a dense ring allreduce, a sparse allreduce with
error feedback (Ok-Topk Algorithm 2: the trainer keeps residuals; entries that were both
selected locally and kept globally leave the residual; w -= u/P), or — with the 1-bit
optimisers — a 1-bit compressed allreduce of the momentum (1-bit LAMB Algorithm 1). A
checksum of the parameters across ranks every --check-every steps stops a run whose ranks
diverge. Ranks are threads (--ranks N) or MPI processes (mpirun -np N gradtrain ...).";

const AFTER: &str = "Models and data:
  mlp, cnn                on --data digits (UCI handwritten digits, 1,437 train / 360 test, shipped)
  transformer-lm, lstm-lm on --data synthetic-lm (a seeded Zipf/Markov corpus whose entropy
                          rate, the best achievable loss, is printed beside the model's)
  --data FILE.parquet     your own: `features` (List<Float32>) + `label` (integer) [+ `split`],
                          or `tokens` (List<integer>); see data/README.md

{exchanges}
Optimisers: sgd (--momentum, --nesterov, --weight-decay), adam, adamw, lamb, onebit-lamb,
onebit-adam (--freeze-step); schedules: --warmup N, --decay none|linear|cosine.

Examples:
  # dense baseline on 4 ranks, metrics for gradreport
  gradtrain --model mlp --data digits --ranks 4 --steps 300 --lr 0.1 \\
      --run dense --metrics dense.parquet

  # Ok-Topk at 1 % density; compare bytes and accuracy with the baseline
  gradtrain --model mlp --ranks 4 --steps 300 --lr 0.1 --exchange oktopk --density 0.01 \\
      --run oktopk --metrics oktopk.parquet
  gradreport table dense.parquet oktopk.parquet --by run \\
      --metric loss,eval_accuracy,bytes_sent --stat last

  # 1-bit LAMB on the tiny GPT, with checkpoints every 100 steps
  gradtrain --model transformer-lm --data synthetic-lm --ranks 4 --steps 400 --lr 0.01 \\
      --optimizer onebit-lamb --exchange onebit --freeze-step 80 \\
      --checkpoint ck --checkpoint-every 100
  # the same command with --resume continues from the last checkpoint (here: to step 600)
  gradtrain --model transformer-lm --data synthetic-lm --ranks 4 --steps 600 --lr 0.01 \\
      --optimizer onebit-lamb --exchange onebit --freeze-step 80 \\
      --checkpoint ck --checkpoint-every 100 --resume

  # EmbRace vs its baselines on a 50k-token Zipf vocabulary (bytes per rank in the metrics)
  gradtrain --model transformer-lm --data synthetic-lm --vocab 50000 --ranks 4 --steps 20 \\
      --exchange embrace --schedule embrace --metrics embrace.parquet

  # the same run on 4 MPI processes
  mpirun -np 4 gradtrain --model cnn --steps 200 --lr 0.05 --momentum 0.9";

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DecayArg {
    None,
    Linear,
    Cosine,
}

#[derive(Parser, Debug)]
#[command(name = "gradtrain", version = gradkit_core::tool_version!(), about = ABOUT.split("\n\n").next(), long_about = ABOUT)]
#[command(after_help = "The other options, the examples and the metrics: gradtrain --help", after_long_help = after_long_help())]
struct Cli {
    /// mlp | cnn | transformer-lm | lstm-lm
    #[arg(long, default_value = "mlp")]
    model: String,
    /// digits | synthetic-lm | FILE.parquet
    #[arg(long, default_value = "digits")]
    data: String,
    #[arg(long, default_value = "ring", help = exchange_help())]
    exchange: String,
    /// --exchange embrace: fifo (gradient-generation order) | embrace (vertical split only:
    /// prior rows first, delayed rows overlapped with the next step's compute) | 2d (vertical
    /// and horizontal: also each dense block allreduced and updated while the next forward
    /// runs, which waits per block; embrace.md §2.1)
    #[arg(
        hide_short_help = true,
        long,
        value_name = "fifo|embrace|2d",
        default_value = "embrace"
    )]
    schedule: String,
    /// --exchange embrace: the forward lookup AlltoAll sends per-token rows (the paper's) or
    /// unique rows (one per distinct token of the receiver, expanded there)
    #[arg(
        hide_short_help = true,
        long,
        value_name = "per-token|unique",
        default_value = "per-token"
    )]
    lookup: String,
    /// Record the metric peak_rss_bytes: this process's peak resident set size after every
    /// step (per rank under mpirun; shared by all ranks with --ranks)
    #[arg(hide_short_help = true, long)]
    rss: bool,
    /// Wire format of the dense allreduces (dense exchange, warm-ups, EmbRace's dense
    /// part): f32, or fp16 as mixed-precision training sends (half the bytes; sums rounded
    /// to fp16)
    #[arg(hide_short_help = true, long, value_name = "f32|fp16", value_parser = ["f32", "fp16"], default_value = "f32")]
    wire: String,
    /// sgd | adam | adamw | lamb | onebit-lamb | onebit-adam
    #[arg(long, default_value = "sgd")]
    optimizer: String,
    /// Fraction of gradient entries a sparse exchange keeps (k = density·n)
    #[arg(long, default_value_t = 0.01)]
    density: f64,
    /// Sparse exchanges: exchange densely (ring allreduce) for the first N steps, then switch
    /// to --exchange with zero residuals (Ok-Topk's reference code uses 512 for VGG, 128 for
    /// LSTM)
    #[arg(hide_short_help = true, long, default_value_t = 0, value_name = "N")]
    dense_warmup: u32,
    /// Sparse exchanges: record the metric `xi`, Ok-Topk's Assumption 1 constant
    /// ‖Top_k(mean accumulator) − u/P‖ / ‖mean gradient‖, every step (one extra allreduce of
    /// 2n floats, counted in no step's bytes)
    #[arg(hide_short_help = true, long)]
    xi: bool,
    /// Ok-Topk: space repartition period τ
    #[arg(hide_short_help = true, long, default_value_t = 64)]
    period: u32,
    /// Ok-Topk: threshold re-evaluation period τ'
    #[arg(hide_short_help = true, long, default_value_t = 32)]
    reeval: u32,
    /// Ok-Topk: threshold reuse between re-evaluations: ladder (default), paper (Algorithm 1:
    /// unchanged), reference (the authors' ×1.03 loop and bands; vgg, lstm, bert pick the bands)
    #[arg(hide_short_help = true, long, value_name = "POLICY", value_parser = clap::builder::PossibleValuesParser::new(gradkit_train::train::Adjust::NAMES))]
    adjust: Option<String>,
    /// Ok-Topk: Step D on the re-evaluation steps (every --reeval steps): skip (default; the
    /// authors' code: the exact top-k of the gathered values is the result) or run
    /// (Algorithm 1 line 13 on every step)
    #[arg(hide_short_help = true, long, value_name = "POLICY", value_parser = clap::builder::PossibleValuesParser::new(gradkit_train::train::ReevalStepD::ALL.iter().map(|v| v.name())))]
    reeval_step_d: Option<String>,
    /// Training steps
    #[arg(long, default_value_t = 200)]
    steps: u32,
    /// Examples (sequences) per rank per step
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Peak learning rate
    #[arg(long, default_value_t = 0.1)]
    lr: f32,
    /// Linear learning-rate warm-up steps
    #[arg(hide_short_help = true, long, default_value_t = 0)]
    warmup: u32,
    /// Learning-rate decay after warm-up (to 0 at --steps)
    #[arg(hide_short_help = true, long, value_enum, default_value = "none")]
    decay: DecayArg,
    /// SGD momentum
    #[arg(hide_short_help = true, long, default_value_t = 0.0)]
    momentum: f32,
    /// Nesterov momentum (SGD)
    #[arg(hide_short_help = true, long)]
    nesterov: bool,
    /// Weight decay (L2 for sgd/adam/lamb, decoupled for adamw)
    #[arg(hide_short_help = true, long, default_value_t = 0.0)]
    weight_decay: f32,
    #[arg(hide_short_help = true, long, default_value_t = 0.9)]
    beta1: f32,
    #[arg(hide_short_help = true, long, default_value_t = 0.999)]
    beta2: f32,
    #[arg(hide_short_help = true, long, default_value_t = 1e-8)]
    eps: f32,
    /// LAMB trust-ratio clip, lower bound
    #[arg(hide_short_help = true, long, default_value_t = 0.01)]
    lamb_min: f32,
    /// LAMB trust-ratio clip, upper bound
    #[arg(hide_short_help = true, long, default_value_t = 10.0)]
    lamb_max: f32,
    /// 1-bit LAMB/Adam: warm-up steps with uncompressed exchange before compression
    #[arg(hide_short_help = true, long, default_value_t = 100)]
    freeze_step: u32,
    /// 1-bit LAMB/Adam compressed stage: clip m/(√v_frozen+η) to Adam's bound (on, the
    /// default: finite on digits with η = 1e-8) or not (off: Algorithm 1 / DeepSpeed)
    #[arg(hide_short_help = true, long, value_name = "on|off", value_parser = ["on", "off"])]
    onebit_clip: Option<String>,
    /// 1-bit LAMB/Adam: zero the averaged momentum where the frozen variance is 0 (auto, the
    /// default) or apply no mask (none: DeepSpeed without a user `exp_avg_mask`)
    #[arg(hide_short_help = true, long, value_name = "auto|none", value_parser = ["auto", "none"])]
    onebit_mask: Option<String>,
    /// 1-bit LAMB/Adam exactly as DeepSpeed's OnebitLamb/OnebitAdam compute the update:
    /// --onebit-clip off --onebit-mask none
    #[arg(hide_short_help = true, long, conflicts_with_all = ["onebit_clip", "onebit_mask"])]
    onebit_exact: bool,
    /// 1-bit LAMB: the paper's "LAMB + basic 1-bit" ablation (§3.4) — the coefficient stays
    /// frozen at its warm-up average in the compression stage (no variance ratio)
    #[arg(hide_short_help = true, long)]
    onebit_basic: bool,
    /// Seed of initialisation and batches
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Evaluate on the test set every N steps (0: only at the end)
    #[arg(hide_short_help = true, long, default_value_t = 0)]
    eval_every: u32,
    /// Compare parameter checksums across ranks every N steps (0: only at the end)
    #[arg(hide_short_help = true, long, default_value_t = 50)]
    check_every: u32,
    /// Ranks P to run: in-process ranks (threads) when not started by mpirun, where MPI
    /// gives the count
    #[arg(long, value_name = "P")]
    ranks: Option<usize>,
    /// Write metrics/1 rows (loss, eval_accuracy, lr, bytes, times, nnz, thresholds) here
    /// (`-`: stdout)
    #[arg(long, value_name = "RUN.parquet")]
    metrics: Option<PathBuf>,
    /// Record every message of every step (commtrace/1) here, for `gradreport simulate`
    #[arg(long, value_name = "PATH")]
    comm_trace: Option<PathBuf>,
    /// Append the rows so far to --metrics every N steps (the file is complete after each
    /// append), so a killed run keeps the finished steps (0: only at the end and at checkpoints)
    #[arg(hide_short_help = true, long, default_value_t = 50, value_name = "N")]
    metrics_every: u32,
    /// Checkpoint directory
    #[arg(long, value_name = "DIR")]
    checkpoint: Option<PathBuf>,
    /// Checkpoint every N steps (and at the end)
    #[arg(hide_short_help = true, long, default_value_t = 0)]
    checkpoint_every: u32,
    /// Continue from the latest checkpoint in --checkpoint DIR
    #[arg(long)]
    resume: bool,
    /// Start afresh in a --checkpoint DIR that holds another run's checkpoints: they (its
    /// step-N directories and latest, nothing else) are removed when this run writes its
    /// first checkpoint. Without it such a directory is refused
    #[arg(
        hide_short_help = true,
        long,
        requires = "checkpoint",
        conflicts_with = "resume"
    )]
    overwrite_checkpoint: bool,
    /// synthetic-lm: vocabulary size (default 1024). A token file: its declared vocabulary,
    /// every token id must be below it (default: the file's `gradkit.vocab`, else max id + 1)
    #[arg(hide_short_help = true, long, value_name = "N")]
    vocab: Option<usize>,
    /// synthetic-lm: training tokens
    #[arg(hide_short_help = true, long, default_value_t = 200_000)]
    tokens: usize,
    /// synthetic-lm: corpus seed (independent of --seed)
    #[arg(hide_short_help = true, long, default_value_t = 0)]
    corpus_seed: u64,
    /// Language models: context length
    #[arg(hide_short_help = true, long, default_value_t = 32)]
    seq_len: usize,
    /// mlp hidden width / LSTM hidden size
    #[arg(hide_short_help = true, long, default_value_t = 128)]
    hidden: usize,
    /// transformer/LSTM embedding width
    #[arg(hide_short_help = true, long, default_value_t = 64)]
    d_model: usize,
    /// transformer blocks
    #[arg(hide_short_help = true, long, default_value_t = 2)]
    layers: usize,
    /// attention heads
    #[arg(hide_short_help = true, long, default_value_t = 4)]
    heads: usize,
    /// Name of the run in the metrics table [default: the exchange, its density where it
    /// selects, the optimiser unless sgd, the schedule unless fifo: `oktopk-d0.01`,
    /// `ring-adam`, `onebit-lamb`, `embrace-2d`]
    #[arg(long)]
    run: Option<String>,
    /// Where the exchange selects and compresses: cpu, or cuda / cuda:N (a build with
    /// `--features cuda` on a GPU node: gradkit's CUDA kernels, the sparse and 1-bit
    /// exchanges' tensors kept on the GPU; without a usable GPU it stops with one line saying
    /// why — docs/GPU.md). The model: candle CPU, or GPU 0 in a `candle-cuda` build
    #[arg(long, value_name = "cpu|cuda[:N]", default_value = "cpu", value_parser = gradkit_cuda::Device::parse_flag)]
    device: gradkit_cuda::Device,
    /// Which backend carries the run's messages: mpi (MPI under mpirun, in-process threads
    /// otherwise) or nccl (a `--features cuda` build on a GPU node with NCCL, one GPU per
    /// rank by local rank, opened over MPI — docs/GPU.md)
    #[arg(long, value_name = "mpi|nccl", default_value = "mpi", value_parser = gradkit_cuda::backend::parse)]
    backend: gradkit_cuda::backend::CommBackend,
    /// No progress bar or summary
    #[arg(short = 'q', long)]
    quiet: bool,
    #[command(flatten)]
    memory: gradkit_core::budget::MemoryArgs,
}

/// The `Comm` each rank trains over for `--backend`: NCCL's, opened over the world's.
fn open_comm(b: gradkit_cuda::backend::CommBackend) -> Option<gradkit_train::config::OpenComm> {
    use gradkit_cuda::backend::{open, CommBackend};
    match b {
        CommBackend::Mpi => None,
        CommBackend::Nccl => Some(|host| open(CommBackend::Nccl, host)),
    }
}

/// The algorithm whose fp16-wire variant `--exchange` names (`ring-fp16`, gradallreduce's
/// name of the fp16-wire ring, is `ring` with `--wire fp16`), or `None`.
fn fp16_variant_of(a: &Cli) -> Option<gradkit_collectives::Algo> {
    gradkit_collectives::dense::fp16_wire_of(a.exchange.parse().ok()?)
}

/// `--exchange` as an exchange's name (see [`fp16_variant_of`]).
fn exchange_name(a: &Cli) -> &str {
    fp16_variant_of(a).map_or(a.exchange.as_str(), |x| x.name())
}

/// `--exchange`'s help: the names, and the old spellings.
fn exchange_help() -> String {
    let names: Vec<&str> = Exchange::all().iter().map(|e| e.name()).collect();
    let mut old: Vec<String> = Exchange::aliases()
        .iter()
        .map(|(o, e)| format!("{o} = {e}"))
        .collect();
    let fp16 = gradkit_collectives::dense::with_fp16_wire;
    for e in Exchange::all()
        .iter()
        .filter(|e| fp16(e.algo()) != e.algo())
    {
        old.push(format!("{} = {e} --wire fp16", fp16(e.algo())));
    }
    format!(
        "{}; gradallreduce --algo's names (old spellings: {})",
        names.join(" | "),
        old.join(", ")
    )
}

/// `--help`'s text after the options: [`AFTER`] with the exchanges' list, one line each.
fn after_long_help() -> String {
    let mut list = String::from(
        "Exchanges (the sparse ones take --density and keep residuals, error feedback; EmbRace's
take --optimizer sgd (no momentum) or adam, applied lazily to the embedding rows a step touches):\n",
    );
    for e in Exchange::all() {
        // Wrapped here with a hanging indent (clap would wrap it flush left).
        let mut line = format!("  {:<14}", e.name());
        for word in e.description().split(' ') {
            if line.len() + 1 + word.len() > 100 {
                list += &(line + "\n");
                line = " ".repeat(16);
            }
            line = line + " " + word;
        }
        list += &(line + "\n");
    }
    AFTER.replace("{exchanges}\n", &(list + "\n"))
}

/// The optimiser's knobs from the flags (`--onebit-exact` is clip off and mask none).
fn opt_config(a: &Cli) -> anyhow::Result<OptConfig> {
    Ok(OptConfig {
        method: a.optimizer.parse().map_err(anyhow::Error::msg)?,
        momentum: a.momentum,
        nesterov: a.nesterov,
        weight_decay: a.weight_decay,
        beta1: a.beta1,
        beta2: a.beta2,
        eps: a.eps,
        lamb_min: a.lamb_min,
        lamb_max: a.lamb_max,
        freeze_step: a.freeze_step,
        onebit_clip: !a.onebit_exact && a.onebit_clip.as_deref() != Some("off"),
        onebit_mask: !a.onebit_exact && a.onebit_mask.as_deref() != Some("none"),
        onebit_basic: a.onebit_basic,
        ..OptConfig::default()
    })
}

/// The run's configuration; the names (--exchange, --schedule, --lookup) parsed here, once.
fn config(a: &Cli) -> anyhow::Result<TrainConfig> {
    let mut cfg = TrainConfig {
        model: ModelSpec {
            name: a.model.clone(),
            hidden: a.hidden,
            d_model: a.d_model,
            layers: a.layers,
            heads: a.heads,
            seq_len: a.seq_len,
        },
        data: DataSpec {
            name: a.data.clone(),
            vocab: a.vocab.unwrap_or(1024),
            declared_vocab: a.vocab,
            corpus_seed: a.corpus_seed,
            tokens: a.tokens,
        },
        exchange: exchange_name(a).parse().map_err(anyhow::Error::msg)?,
        density: a.density,
        dense_warmup: a.dense_warmup,
        period: a.period,
        reeval: a.reeval,
        adjust: a
            .adjust
            .as_deref()
            .and_then(gradkit_train::train::Adjust::parse)
            .unwrap_or_default(),
        reeval_step_d: a
            .reeval_step_d
            .as_deref()
            .and_then(|s| s.parse().ok())
            .unwrap_or_default(),
        opt: opt_config(a)?,
        lr: a.lr,
        warmup: a.warmup,
        decay: match a.decay {
            DecayArg::None => Decay::None,
            DecayArg::Linear => Decay::Linear,
            DecayArg::Cosine => Decay::Cosine,
        },
        steps: a.steps,
        batch: a.batch,
        seed: a.seed,
        eval_every: a.eval_every,
        check_every: a.check_every,
        checkpoint: a.checkpoint.clone(),
        checkpoint_every: a.checkpoint_every,
        resume: a.resume,
        overwrite_checkpoint: a.overwrite_checkpoint,
        quiet: a.quiet,
        run_name: a.run.clone().unwrap_or_default(),
        schedule: a.schedule.parse().map_err(anyhow::Error::msg)?,
        lookup: a.lookup.parse().map_err(anyhow::Error::msg)?,
        record_rss: a.rss,
        fp16_wire: a.wire == "fp16" || fp16_variant_of(a).is_some(),
        metrics_path: a.metrics.clone(),
        metrics_every: a.metrics_every,
        comm_trace: a.comm_trace.clone(),
        xi: a.xi,
        // The run appends the --metrics file itself; the rows are not held for a final write.
        keep_metrics: false,
        ..TrainConfig::default()
    };
    gradkit_core::cli::note_old_spelling("--exchange", exchange_name(a), cfg.exchange.name());
    if a.run.is_none() {
        cfg.run_name = cfg.default_run_name();
    }
    cfg.metrics_meta = metrics_meta(&cfg);
    Ok(cfg)
}

fn summary(cfg: &TrainConfig, r: &TrainReport, p: usize) {
    gradkit_core::noteln!(
        "gradtrain: {} on {} · {} ranks · exchange {} · optimizer {} · {} parameters · steps {}..{}",
        cfg.model.name, cfg.data.name, p, cfg.exchange, cfg.opt.method, r.n_params, r.first_step, r.last_step
    );
    gradkit_core::noteln!(
        "  train loss (last 10 steps, mean over ranks): {}",
        fmt_num(r.final_loss, 4)
    );
    if r.is_lm {
        gradkit_core::note!(
            "  test loss {} nats/token · perplexity {}",
            fmt_num(r.eval_loss, 4),
            fmt_num(r.eval_loss.exp(), 4)
        );
        match r.best_loss {
            Some(b) => gradkit_core::noteln!(
                " · best achievable (entropy rate) {} nats/token, perplexity {}",
                fmt_num(b, 4),
                fmt_num(b.exp(), 4)
            ),
            None => gradkit_core::noteln!(),
        }
        gradkit_core::noteln!("  next-token accuracy {:.2} %", 100.0 * r.eval_accuracy);
    } else {
        gradkit_core::noteln!(
            "  test loss {} · test accuracy {:.2} %",
            fmt_num(r.eval_loss, 4),
            100.0 * r.eval_accuracy
        );
    }
    let total = r.time_compute_s + r.time_select_s + r.time_comm_s + r.time_update_s;
    gradkit_core::noteln!(
        "  per step per rank: {} bytes sent (dense fp32 ring would be {}) · nnz {} · time {} ms = compute {} + select {} + comm {} + update {}",
        fmt_num(r.bytes_sent_per_step, 4),
        fmt_num(2.0 * (p as f64 - 1.0) / p as f64 * 4.0 * r.n_params as f64, 4),
        fmt_num(r.nnz_per_step, 4),
        fmt_num(total * 1e3, 3),
        fmt_num(r.time_compute_s * 1e3, 3),
        fmt_num(r.time_select_s * 1e3, 3),
        fmt_num(r.time_comm_s * 1e3, 3),
        fmt_num(r.time_update_s * 1e3, 3)
    );
}

/// candle's CPU kernels use every core per call; with several ranks per machine that
/// oversubscribes the cores (measured 2× slower for 4 ranks on 2 cores). Unless the user set
/// RAYON_NUM_THREADS, give each rank its share of the cores.
fn limit_threads(ranks: Option<usize>) {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return;
    }
    let local = std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .or(ranks)
        .unwrap_or(1)
        .max(1);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::env::set_var("RAYON_NUM_THREADS", (cores / local).max(1).to_string());
}

/// The library's configuration check, and the flags the tool refuses rather than ignores.
fn check_flags(a: &Cli, given: &clap::ArgMatches) -> anyhow::Result<()> {
    gradkit_comm::launch::check_ranks_flag(a.ranks)?;
    // The flags parsed once; the checks below read the typed configuration.
    let cfg = config(a)?;
    gradkit_train::train::check_config(&cfg)?;
    ignored_flags(a, given, &cfg)?;
    let method = cfg.opt.method;
    if (a.onebit_exact || a.onebit_clip.is_some() || a.onebit_mask.is_some()) && !method.is_onebit()
    {
        let flag = if a.onebit_exact {
            "--onebit-exact"
        } else if a.onebit_clip.is_some() {
            "--onebit-clip"
        } else {
            "--onebit-mask"
        };
        anyhow::bail!(
            "{flag} applies to --optimizer onebit-lamb or onebit-adam only, not `{}` (flag {flag})",
            a.optimizer
        );
    }
    if a.onebit_basic && method != Method::OnebitLamb {
        anyhow::bail!(
            "--onebit-basic is an ablation of 1-bit LAMB; it needs --optimizer onebit-lamb, not `{}` (flag --onebit-basic)",
            a.optimizer
        );
    }
    if (a.momentum != 0.0 || a.nesterov) && method != Method::Sgd {
        anyhow::bail!(
            "--momentum and --nesterov apply to --optimizer sgd only, not `{}` (it uses --beta1) (flag --momentum)",
            a.optimizer
        );
    }
    Ok(())
}

/// A flag given on the command line that the chosen exchange, optimiser, model or data never
/// reads is refused, as `--lookup unique`, `--adjust` and `--wire fp16` are, rather than
/// silently ignored (also when it is given its default value: it still does nothing).
fn ignored_flags(a: &Cli, given: &clap::ArgMatches, cfg: &TrainConfig) -> anyhow::Result<()> {
    let exchange = cfg.exchange;
    let ex = exchange.name();
    let sparse = exchange.is_sparse();
    let sparse_list = format!("the sparse exchanges ({})", Exchange::sparse_names());
    let emb = exchange.is_embedding();
    let dense_part = exchange.is_dense() || exchange.is_compressed() || emb || a.dense_warmup > 0;
    // The exchanges the algorithm-specific flags apply to, by what they read.
    let embrace = Exchange::all().iter().find(|e| e.is_embrace()).copied();
    let embrace_only = format!("--exchange {}", embrace.map_or("", |e| e.name()));
    // Ok-Topk's knobs: each applies to the exchanges that read it (their descriptors say).
    let knobs = [Knob::Period, Knob::Reeval, Knob::Adjust, Knob::ReevalStepD];
    let readers = knobs.map(|k| format!("--exchange {}", k.readers().join(" or ")));
    let knob_rules =
        (knobs.iter().zip(&readers)).map(|(k, to)| (k.id(), exchange.reads(*k), to.as_str(), ex));
    // (argument id, whether it has an effect, what it applies to, the value it lacks)
    let rules: [(&str, bool, &str, &str); 5] = [
        ("schedule", exchange.is_embrace(), &embrace_only, ex),
        ("lookup", exchange.is_embrace(), &embrace_only, ex),
        ("density", sparse, &sparse_list, ex),
        ("dense_warmup", sparse, &sparse_list, ex),
        (
            "wire",
            dense_part,
            "dense allreduces (--exchange dense, onebit, embrace, allgather, allgather-raw, or a --dense-warmup)",
            ex,
        ),
    ];
    let all = rules
        .into_iter()
        .chain(knob_rules)
        .chain(optimizer_rules(cfg.opt.method))
        .chain(model_rules(a));
    for (id, applies, to, have) in all {
        if !applies && given.value_source(id) == Some(clap::parser::ValueSource::CommandLine) {
            let flag = format!("--{}", id.replace('_', "-"));
            anyhow::bail!(
                "{flag} applies to {to} only, not `{have}` (it would be ignored) (flag {flag})"
            );
        }
    }
    if a.data == "digits" && a.vocab.is_some() {
        anyhow::bail!(
            "--vocab applies to --data synthetic-lm or a token file only, not `digits` (it would be ignored) (flag --vocab)"
        );
    }
    Ok(())
}

/// [`ignored_flags`]' rules for the optimiser's flags: (argument id, whether `method` reads
/// it, what it applies to, its name).
fn optimizer_rules(method: Method) -> [(&'static str, bool, &'static str, &'static str); 6] {
    let opt = method.name();
    let (sgd, lamb) = (
        method == Method::Sgd,
        matches!(method, Method::Lamb | Method::OnebitLamb),
    );
    [
        (
            "freeze_step",
            method.is_onebit(),
            "--optimizer onebit-lamb or onebit-adam",
            opt,
        ),
        (
            "beta1",
            !sgd,
            "the Adam-family optimisers (adam, adamw, lamb, onebit-lamb, onebit-adam)",
            opt,
        ),
        (
            "beta2",
            !sgd,
            "the Adam-family optimisers (adam, adamw, lamb, onebit-lamb, onebit-adam)",
            opt,
        ),
        (
            "eps",
            !sgd,
            "the Adam-family optimisers (adam, adamw, lamb, onebit-lamb, onebit-adam)",
            opt,
        ),
        ("lamb_min", lamb, "--optimizer lamb or onebit-lamb", opt),
        ("lamb_max", lamb, "--optimizer lamb or onebit-lamb", opt),
    ]
}

/// [`ignored_flags`]' rules for the model's and the data's flags: (argument id, whether it has
/// an effect, what it applies to, the value it lacks).
fn model_rules(a: &Cli) -> [(&'static str, bool, &'static str, &str); 7] {
    let model = a.model.as_str();
    let lm = matches!(model, "transformer-lm" | "lstm-lm");
    [
        (
            "hidden",
            matches!(model, "mlp" | "lstm-lm"),
            "--model mlp or lstm-lm",
            model,
        ),
        ("d_model", lm, "--model transformer-lm or lstm-lm", model),
        (
            "layers",
            model == "transformer-lm",
            "--model transformer-lm",
            model,
        ),
        (
            "heads",
            model == "transformer-lm",
            "--model transformer-lm",
            model,
        ),
        ("seq_len", lm, "--model transformer-lm or lstm-lm", model),
        (
            "tokens",
            a.data == "synthetic-lm",
            "--data synthetic-lm",
            &a.data,
        ),
        (
            "corpus_seed",
            a.data == "synthetic-lm",
            "--data synthetic-lm",
            &a.data,
        ),
    ]
}

fn main() -> std::process::ExitCode {
    gradkit_core::paths::install_signal_cleanup();
    let (args, given) = gradkit_comm::launch::parse_matches::<Cli>();
    // The configuration (every flag's range, flags that do not go together) is checked here,
    // once, before MPI starts or any rank runs: a mistake is a usage error (exit 2).
    if let Err(e) = check_flags(&args, &given) {
        gradkit_comm::launch::usage_error::<Cli>(gradkit_core::cli::chain_text(&e));
    }
    limit_threads(args.ranks);
    args.memory.apply();
    cli::run(|| {
        let world = World::init(args.ranks)?;
        // `--device cuda` without a usable GPU stops here, an agreement point before any file
        // is touched; the exchange then runs on the device's kernels.
        let kernels = world.agree(gradkit_cuda::kernels_for(args.device).map_err(Into::into))?;
        let resident = world.agree(gradkit_cuda::resident_for(args.device).map_err(Into::into))?;
        world.agree(gradkit_cuda::backend::check(args.backend))?;
        let cfg = TrainConfig {
            kernels,
            resident,
            open_comm: open_comm(args.backend),
            ..config(&args)?
        };
        world.agree(gradkit_train::train::check_paths(&cfg))?;
        // Resuming a run that already reached --steps: nothing to train, nothing overwritten.
        if let Some(at) = world.agree(gradkit_train::train::resume_finished(&cfg))? {
            if world.is_io_rank() && !args.quiet {
                gradkit_core::noteln!(
                    "gradtrain: nothing to do: the checkpoint in {} is at step {at} and --steps is {}; give a larger --steps to train further (--metrics was not written)",
                    cfg.checkpoint.as_deref().unwrap_or(std::path::Path::new("")).display(),
                    cfg.steps
                );
            }
            return world.agree(Ok(()));
        }
        // An agreement point: a bad flag is reported once under mpirun, by rank 0.
        let out = world.agree(
            gradkit_train::train::check_config(&cfg)
                .and_then(|()| cli::output_flag("--metrics", args.metrics.as_deref())),
        )?;
        let Some(rep) = gradkit_train::train(&world, &cfg)? else {
            // A non-I/O MPI rank: wait at the last agreement point while rank 0 writes.
            return world.agree(Ok(()));
        };
        // The last agreement point: the other ranks wait here while rank 0 writes.
        world.agree(write_report(&args, &cfg, &world, out, &rep))
    })
}

/// The metrics table's key-value metadata (gradkit-train adds `world_size` and `best_loss`
/// to its rewrites during the run, as [`write_report`] does at the end).
fn metrics_meta(cfg: &TrainConfig) -> Meta {
    let mut meta = Meta::producer("gradtrain");
    meta.set("model", &cfg.model.name)
        .set("data", &cfg.data.name)
        .set("exchange", cfg.exchange)
        .set("optimizer", cfg.opt.method.name())
        .set("density", cfg.density)
        .set("seed", cfg.seed);
    meta
}

/// The I/O rank's outputs: the metrics table (a regular file was appended to and completed by
/// the run; stdout or a device is written here) and the summary on stderr.
fn write_report(
    args: &Cli,
    cfg: &TrainConfig,
    world: &World,
    out: Option<Output>,
    rep: &TrainReport,
) -> anyhow::Result<()> {
    {
        if let Some(out) = out.filter(|_| gradkit_train::metrics_log::live_path(cfg).is_none()) {
            let mut meta = metrics_meta(cfg);
            meta.set("world_size", world.size());
            if let Some(b) = rep.best_loss {
                meta.set("best_loss", b);
            }
            write_table(&out, &meta, &rep.metrics)?;
        }
        if !args.quiet {
            summary(cfg, rep, world.size());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }
}
