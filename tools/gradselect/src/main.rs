//! gradselect: sparsify a dense `tensor/1` gradient trace per (step, rank) with any selection
//! method of the papers, with error feedback; writes a sparse `tensor/1` and metrics.

/// Large blocks mapped on huge pages and handed back when freed (docs/MEMORY.md).
#[global_allocator]
static ALLOC: gradkit_core::alloc::BigAlloc = gradkit_core::alloc::BigAlloc;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use gradkit_core::cli::{self, IoArgs};
use gradkit_sparsify::{k_for, Adjust, Method as SMethod};

const ABOUT: &str =
    "Sparsify a dense gradient trace: select entries per (step, rank) with a method of the papers.

Reads a dense tensor/1 trace (e.g. from `gradtrace synthetic`), and for every rank, steps in
order, forms the error-compensated accumulator acc_t = residual_{t-1} + g_t, selects entries of
acc_t, writes them as a sparse tensor/1 (indices strictly ascending per row; a layer with no
selected entry gets an empty row) and keeps residual_t = acc_t with the selected entries zeroed
(--no-residual: acc_t = g_t). k = floor(density·n), at least 1, or --k K; n is the whole model
(layers concatenated by layer_id, --scope global) or each layer (--scope layer).

Methods:
  topk       exact k largest |acc|, ties to the lower index
  threshold  every entry with |acc| > --threshold T
  oktopk     Ok-Topk (PPoPP'22 §3.1.3): exact k-th largest |acc| every --reeval steps (an exact
             top-k step), reused as the threshold |acc| > th in the steps between, adjusted by
             --adjust: ladder (default; the ×1.06 rung whose count is closest to k with at
             most 4k/3 passing), paper (Algorithm 1: unchanged), reference (the authors' ×1.03
             loop and count bands; vgg = reference, lstm, bert) (docs/gradselect.md)
  gaussiank  threshold |mean| + z(1-density/2)·std of a Gaussian fit, halved until ≥ 3k/4 pass
  dgc        DGC: threshold from a strided sample (--sample), ×0.8 while < 0.8k pass, exact
             top-k among the passing entries when more than 1.3k pass
  randomk    k uniform indices from (--seed, step, layer): the same on every rank
  deft       DEFT (ICPP'23): each rank selects only in its own ranges of the plan (--plan from
             `gradpartition --method deft`, or computed here with the same library code),
             with its own per-range k from the norms of its own accumulator

Every threshold method selects exactly {i : |acc_i| > threshold} for the threshold it records;
steps that ran an exact top-k are marked with the metric exact_topk = 1.";

const AFTER: &str = "Examples:
  # exact top-1% of the whole model, per step and rank, with metrics
  gradtrace synthetic --shape vgg16 --scale 0.1 --ranks 4 --steps 8 --seed 1 \\
    | gradselect --method topk --density 0.01 --metrics sel-m.parquet -o sel.parquet

  # Ok-Topk's reused thresholds with the reference code's VGG bands, per layer
  gradselect --method oktopk --density 0.01 --reeval 32 --adjust reference --scope layer \\
    trace.parquet -o ok.parquet

  # the metrics straight into a table: `-` is stdout for any output flag
  gradselect --method topk --density 0.01 trace.parquet -o sel.parquet --metrics - \\
    | gradreport table --metric nnz,threshold

  # Ok-Topk's threshold reuse exactly as Algorithm 1 writes it
  gradselect --method oktopk --density 0.01 --adjust paper trace.parquet -o ok-paper.parquet

  # DEFT with a plan from gradpartition, keeping the final residuals
  gradpartition --method deft --density 0.01 trace.parquet -o plan.parquet
  gradselect --method deft --density 0.01 --plan plan.parquet --residual-out res.parquet \\
    trace.parquet -o deft.parquet

Metrics (--metrics, metrics/1, per step and rank): k_target, nnz, threshold, density_achieved,
time_select_s, residual_norm, exact_topk (docs/gradselect.md).";

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum MethodArg {
    Topk,
    Threshold,
    Oktopk,
    Gaussiank,
    Dgc,
    Randomk,
    Deft,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    /// k of the whole model, layers concatenated by layer_id
    Global,
    /// k of each layer, selected in each layer separately
    Layer,
}

#[derive(Parser, Debug)]
#[command(name = "gradselect", version = gradkit_core::tool_version!(), about = ABOUT.split("\n\n").next(), long_about = ABOUT)]
#[command(after_help = "The other options, the methods and the examples: gradselect --help", after_long_help = AFTER)]
struct Cli {
    /// Selection method
    #[arg(long, value_enum)]
    method: MethodArg,
    /// Fraction kept: k = floor(D·n), at least 1; in (0, 1] [default: 0.01, as gradallreduce's
    /// and gradtrain's, unless --k]
    #[arg(long, value_name = "D", conflicts_with = "k")]
    density: Option<f64>,
    /// Number kept per (step, rank) (per layer with --scope layer; clamped to the size)
    #[arg(long, value_name = "K")]
    k: Option<usize>,
    /// Index space of k: the whole model or each layer
    #[arg(long, value_enum, default_value_t = Scope::Global)]
    scope: Scope,
    /// threshold: keep |acc| > T
    #[arg(long, value_name = "T")]
    threshold: Option<f32>,
    /// oktopk: exact threshold every τ' steps (1 = exact top-k every step)
    #[arg(hide_short_help = true, long, value_name = "TAU", default_value_t = 32)]
    reeval: u32,
    /// oktopk: threshold reuse policy: ladder (default), paper, reference (= vgg; lstm, bert pick the reference code's bands; bare `--adjust` = reference)
    #[arg(hide_short_help = true, long, value_name = "POLICY", num_args = 0..=1, default_missing_value = "reference", value_parser = clap::builder::PossibleValuesParser::new(gradkit_sparsify::Adjust::NAMES))]
    adjust: Option<String>,
    /// dgc: fraction of entries sampled for the threshold estimate, in (0, 1]
    #[arg(hide_short_help = true, long, value_name = "F", default_value_t = 0.01)]
    sample: f64,
    /// randomk: seed shared by all ranks
    #[arg(hide_short_help = true, long, default_value_t = 0)]
    seed: u64,
    /// deft: plan/1 from `gradpartition --method deft` (absent: computed in-process)
    #[arg(long, value_name = "PLAN")]
    plan: Option<PathBuf>,
    /// deft (in-process plan): hand leftover k to the highest-norm pieces, as gradpartition --topup
    #[arg(hide_short_help = true, long)]
    topup: bool,
    /// No error feedback: select from each step's gradient alone
    #[arg(hide_short_help = true, long)]
    no_residual: bool,
    /// Write every rank's final residual as a dense tensor/1 to this file (`-`: stdout)
    #[arg(long, value_name = "FILE", conflicts_with = "no_residual")]
    residual_out: Option<PathBuf>,
    /// Also write per-(step, rank) metrics (metrics/1) to this Parquet file (`-`: stdout)
    #[arg(long, value_name = "M.parquet")]
    metrics: Option<PathBuf>,
    /// Run name in the metrics table [default: the method and what it keeps: `topk-d0.01`,
    /// `topk-k1000`]
    #[arg(long, value_name = "NAME")]
    run: Option<String>,
    /// Where the selection kernels run: cpu, or cuda / cuda:N (a build with `--features cuda`
    /// on a GPU node: gradkit's CUDA kernels; without a usable GPU it stops with one line
    /// saying why — docs/GPU.md)
    #[arg(long, value_name = "cpu|cuda[:N]", default_value = "cpu", value_parser = device)]
    device: gradkit_cuda::Device,
    #[command(flatten)]
    io: IoArgs,
}

/// `--device`'s parser: a typo is a usage error (exit 2) listing the values.
fn device(s: &str) -> std::result::Result<gradkit_cuda::Device, String> {
    s.parse()
}

mod select;

/// `--density` when neither it nor `--k` is given: gradallreduce's and gradtrain's default.
const DEFAULT_DENSITY: f64 = 0.01;

fn main() -> ExitCode {
    gradkit_core::cli::one_process_under_mpirun("gradselect");
    gradkit_core::paths::install_signal_cleanup();
    let matches = Cli::command().get_matches();
    let args = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cli::check_env();
    // A command line that is wrong on its own is a usage error (exit 2), before any I/O.
    let (method, kspec) =
        check_args(&args, &matches).unwrap_or_else(|e| cli::usage_error::<Cli>(e));
    cli::run(|| select::body(&args, method, kspec))
}

/// How k is given.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KSpec {
    Density(f64),
    Count(usize),
    None,
}

impl KSpec {
    pub(crate) fn k(self, n: usize) -> usize {
        match self {
            KSpec::Density(d) => k_for(d, n),
            KSpec::Count(k) => k.min(n),
            KSpec::None => 0,
        }
    }
}

fn method_name(m: MethodArg) -> String {
    m.to_possible_value()
        .map_or_else(|| format!("{m:?}"), |v| v.get_name().to_string())
}

/// Checks the flags against each other and their ranges; a flag given for a method that does
/// not read it is refused rather than ignored.
fn check_args(a: &Cli, m: &clap::ArgMatches) -> Result<(SMethod, KSpec)> {
    let kspec = match (a.density, a.k) {
        (Some(d), _) => {
            if !(d > 0.0 && d <= 1.0) {
                bail!("--density must lie in (0, 1], got {d}");
            }
            KSpec::Density(d)
        }
        (None, Some(0)) => bail!("--k must be at least 1"),
        (None, Some(k)) => KSpec::Count(k),
        // Every tool's default density; the threshold method needs none.
        (None, None) if a.method == MethodArg::Threshold => KSpec::None,
        (None, None) => KSpec::Density(DEFAULT_DENSITY),
    };
    let only = |set: bool, flag: &str, m: MethodArg| -> Result<()> {
        if set && a.method != m {
            bail!(
                "{flag} applies to --method {} only, not --method {} (it would be ignored)",
                method_name(m),
                method_name(a.method)
            );
        }
        Ok(())
    };
    only(a.threshold.is_some(), "--threshold", MethodArg::Threshold)?;
    only(a.adjust.is_some(), "--adjust", MethodArg::Oktopk)?;
    only(a.plan.is_some(), "--plan", MethodArg::Deft)?;
    only(a.topup, "--topup", MethodArg::Deft)?;
    only(cli::given(m, "reeval"), "--reeval", MethodArg::Oktopk)?;
    only(cli::given(m, "sample"), "--sample", MethodArg::Dgc)?;
    let m = match a.method {
        MethodArg::Topk => SMethod::Topk,
        MethodArg::Threshold => {
            let t = a
                .threshold
                .context("--method threshold needs --threshold T")?;
            if !t.is_finite() || t < 0.0 {
                bail!("--threshold must be a finite number ≥ 0, got {t}");
            }
            SMethod::Threshold(t)
        }
        MethodArg::Oktopk => {
            if a.reeval == 0 {
                bail!("--reeval must be at least 1");
            }
            let adjust = match &a.adjust {
                None => Adjust::default(),
                Some(name) => Adjust::parse(name).with_context(|| {
                    format!(
                        "--adjust: unknown policy `{name}` (use {})",
                        Adjust::NAMES.join(", ")
                    )
                })?,
            };
            SMethod::OkTopk {
                reeval: a.reeval,
                adjust,
            }
        }
        MethodArg::Gaussiank => SMethod::GaussianK,
        MethodArg::Dgc => {
            if !(a.sample > 0.0 && a.sample <= 1.0) {
                bail!("--sample must lie in (0, 1], got {}", a.sample);
            }
            SMethod::Dgc { sample: a.sample }
        }
        MethodArg::Randomk => SMethod::RandomK { seed: a.seed },
        MethodArg::Deft => {
            if a.scope == Scope::Layer {
                bail!("--method deft plans over the whole model; drop --scope layer");
            }
            SMethod::Topk // placeholder: DEFT runs its own path
        }
    };
    Ok((m, kspec))
}
