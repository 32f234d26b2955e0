//! gradselect: sparsify a dense `tensor/1` gradient trace per (step, rank) with any selection
//! method of the papers, with error feedback; writes a sparse `tensor/1` and metrics.

/// Large blocks mapped on huge pages and handed back when freed (docs/MEMORY.md).
#[global_allocator]
static ALLOC: gradkit_core::alloc::BigAlloc = gradkit_core::alloc::BigAlloc;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use gradkit_core::cli::{self, IoArgs};
use gradkit_core::keep::{Keep, DEFAULT_DENSITY};
use gradkit_sparsify::selection::{Configured, Needs, Selection};
use gradkit_sparsify::{Adjust, Method};

/// The long `--help` text's opening: what the tool does and the k rule.
const INTRO: &str =
    "Sparsify a dense gradient trace: select entries per (step, rank) with a method of the papers.

Reads a dense tensor/1 trace (e.g. from `gradtrace synthetic`), and for every rank, steps in
order, forms the error-compensated accumulator acc_t = residual_{t-1} + g_t, selects entries of
acc_t, writes them as a sparse tensor/1 (indices strictly ascending per row; a layer with no
selected entry gets an empty row) and keeps residual_t = acc_t with the selected entries zeroed
(--no-residual: acc_t = g_t). k = floor(density·n), at least 1, or --k K; n is the whole model
(layers concatenated by layer_id, --scope global) or each layer (--scope layer).";

/// The long `--help` text's closing note, after the methods.
const CLOSING: &str =
    "Every threshold method selects exactly {i : |acc_i| > threshold} for the threshold it records;
steps that ran an exact top-k are marked with the metric exact_topk = 1.";

/// The long `--help` text: [`INTRO`], one entry per method from [`Selection`]'s table (its
/// name, then its help lines indented under the first), [`CLOSING`].
fn long_about() -> String {
    let methods: Vec<String> = Selection::ALL
        .iter()
        .map(|s| {
            let mut lines = s.help().lines();
            let mut entry = format!("  {:<11}{}", s.name(), lines.next().unwrap_or_default());
            for line in lines {
                entry.push_str("\n             ");
                entry.push_str(line);
            }
            entry
        })
        .collect();
    format!("{INTRO}\n\nMethods:\n{}\n\n{CLOSING}", methods.join("\n"))
}

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
enum Scope {
    /// k of the whole model, layers concatenated by layer_id
    Global,
    /// k of each layer, selected in each layer separately
    Layer,
}

#[derive(Parser, Debug)]
#[command(name = "gradselect", version = gradkit_core::tool_version!(), about = INTRO.split("\n\n").next(), long_about = long_about())]
#[command(after_help = "The other options, the methods and the examples: gradselect --help", after_long_help = AFTER)]
struct Cli {
    /// Selection method
    #[arg(long, value_name = "METHOD", value_parser = method_parser())]
    method: Selection,
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
    #[arg(long, value_name = "cpu|cuda[:N]", default_value = "cpu", value_parser = gradkit_cuda::Device::parse_flag)]
    device: gradkit_cuda::Device,
    #[command(flatten)]
    io: IoArgs,
}

/// `--method`'s values, from [`Selection::ALL`]: a typo is a usage error (exit 2) listing them.
fn method_parser() -> impl TypedValueParser<Value = Selection> {
    PossibleValuesParser::new(Selection::ALL.iter().map(|s| s.name()))
        .try_map(|s| s.parse::<Selection>())
}

mod select;

fn main() -> ExitCode {
    gradkit_core::cli::one_process_under_mpirun("gradselect");
    gradkit_core::paths::install_signal_cleanup();
    let matches = Cli::command().get_matches();
    let args = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cli::check_env();
    // A command line that is wrong on its own is a usage error (exit 2), before any I/O.
    let (configured, keep) =
        check_args(&args, &matches).unwrap_or_else(|e| cli::usage_error::<Cli>(e));
    cli::run(|| select::body(&args, configured, keep))
}

/// Checks the flags against each other and their ranges; a flag given for a method that does
/// not read it is refused rather than ignored. What is kept: `--density` or `--k`, else the
/// default density, or nothing for a method that needs no k (threshold).
fn check_args(a: &Cli, m: &clap::ArgMatches) -> Result<(Configured, Option<Keep>)> {
    let keep = match (a.density, a.k) {
        (Some(d), _) => Some(Keep::density(d)?),
        (None, Some(k)) => Some(Keep::count(k as u64)?),
        (None, None) if a.method.needs() == Needs::Threshold => None,
        (None, None) => Some(Keep::Density(DEFAULT_DENSITY)),
    };
    for (set, flag) in [
        (a.threshold.is_some(), "--threshold"),
        (a.adjust.is_some(), "--adjust"),
        (a.plan.is_some(), "--plan"),
        (a.topup, "--topup"),
        (cli::given(m, "reeval"), "--reeval"),
        (cli::given(m, "sample"), "--sample"),
    ] {
        let owner = Selection::owner_of(flag).expect("a method's own flag");
        if set && a.method != owner {
            bail!(
                "{flag} applies to --method {owner} only, not --method {} (it would be ignored)",
                a.method
            );
        }
    }
    Ok((configured(a)?, keep))
}

/// The method with the parameters its flags give, each checked: the one match over the
/// methods.
fn configured(a: &Cli) -> Result<Configured> {
    let method = match a.method {
        Selection::Topk => Method::Topk,
        Selection::Threshold => {
            let t = a
                .threshold
                .context("--method threshold needs --threshold T")?;
            if !t.is_finite() || t < 0.0 {
                bail!("--threshold must be a finite number ≥ 0, got {t}");
            }
            Method::Threshold(t)
        }
        Selection::Oktopk => {
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
            Method::OkTopk {
                reeval: a.reeval,
                adjust,
            }
        }
        Selection::Gaussiank => Method::GaussianK,
        Selection::Dgc => {
            if !(a.sample > 0.0 && a.sample <= 1.0) {
                bail!("--sample must lie in (0, 1], got {}", a.sample);
            }
            Method::Dgc { sample: a.sample }
        }
        Selection::Randomk => Method::RandomK { seed: a.seed },
        Selection::Deft => {
            if a.scope == Scope::Layer {
                bail!("--method deft plans over the whole model; drop --scope layer");
            }
            return Ok(Configured::Deft { topup: a.topup });
        }
    };
    Ok(Configured::Local(method))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The long help lists every method of [`Selection`]'s table, each once, in its order.
    #[test]
    fn long_help_lists_every_method_from_the_table() {
        let text = long_about();
        let mut from = 0;
        for s in Selection::ALL {
            let at = text[from..]
                .find(&format!("\n  {:<11}", s.name()))
                .unwrap_or_else(|| panic!("{} missing or out of order", s.name()));
            from += at + 1;
        }
        assert!(text.ends_with("exact_topk = 1."));
    }
}
