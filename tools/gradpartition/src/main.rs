//! gradpartition: decide which worker works on which part of the gradient (`plan/1`).

/// Large blocks mapped on huge pages and handed back when freed (docs/MEMORY.md).
#[global_allocator]
static ALLOC: gradkit_core::alloc::BigAlloc = gradkit_core::alloc::BigAlloc;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use gradkit_core::cli::{self, Format, IoArgs, TextTable};
use gradkit_core::io::{Expect, Meta, Output, TableWriter, TraceReader};
use gradkit_core::keep::{Keep, DEFAULT_DENSITY};
use gradkit_core::trace::MetricSink;
use gradkit_core::{MetricRow, PlanRow};

const ABOUT: &str = "Decide which worker works on which part of the gradient: write a plan/1 table.

--method deft (DEFT, Yoon & Oh, ICPP'23): layers larger than n/P are cut into P pieces; every
step the leader (rank step mod P) gives each piece a share of k proportional to the L2 norm of
its error-compensated gradient, and packs the pieces into P bins of equal selection cost
(size·log2 k_x, greedy longest-processing-time first). Worker r takes bin (step + r) mod P and
selects k_x entries in each of its pieces, so the workers' selections are disjoint and their
union stays at k (no gradient build-up). Input: a dense tensor/1 trace. Error feedback is on:
entries not selected by any worker accumulate per rank into the next step (--no-residual).

--method oktopk (Ok-Topk, Li & Hoefler, PPoPP'22, balanced space partition): every --period
steps each rank cuts its sorted selected indices into P equal-count groups; the P−1 region
boundaries are the integer average of the ranks' cut points. Region i of the flat index space
(layers concatenated by layer_id) is reduced by worker i; a region spanning layers becomes one
row per layer. Input: a sparse tensor/1 (the ranks' local selections, e.g. from gradselect).
--naive gives equal-size regions instead, for comparison.

A summary goes to stderr (load per worker, imbalance max/mean, build-up or received words);
--metrics writes the same numbers as a metrics/1 table (docs/gradpartition.md lists them).";

const AFTER: &str = "Examples:
  # DEFT plans for 8 workers at density 0.01, with load and build-up metrics
  gradtrace synthetic --shape lstm --scale 0.01 --ranks 8 --steps 20 --overlap 0.2 --seed 1 \\
    | gradpartition --method deft --density 0.01 --metrics deft-m.parquet -o deft-plan.parquet

  # Ok-Topk regions from local top-k selections, recomputed every 16 steps
  gradtrace synthetic --shape vgg16 --scale 0.1 --ranks 4 --steps 32 --seed 1 \\
    | gradselect --method topk --density 0.01 -o sel.parquet
  gradpartition --method oktopk --period 16 sel.parquet -o regions.parquet

  # the same with equal-size regions, to compare the imbalance
  gradpartition --method oktopk --naive sel.parquet -o naive.parquet

  # the summary as JSON on stdout, for a program (Markdown on stderr is the default)
  gradpartition --method oktopk sel.parquet -o regions.parquet --format json > summary.json";

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    /// DEFT: norm-based k allocation and LPT bin-packing of layer pieces (dense input)
    Deft,
    /// Ok-Topk: balanced reduce regions from local selections (sparse input)
    Oktopk,
}

#[derive(Parser, Debug)]
#[command(name = "gradpartition", version, about = ABOUT.split("\n\n").next(), long_about = ABOUT)]
#[command(after_help = "The other options, the methods and the examples: gradpartition --help", after_long_help = AFTER)]
struct Cli {
    /// Which partition to compute
    #[arg(long, value_enum)]
    method: Method,
    /// Number of workers P the plan is for, i.e. the ranks of the job that uses it, as
    /// gradallreduce/gradtrain --ranks (default: the trace's number of ranks)
    #[arg(long, visible_alias = "ranks", value_name = "P")]
    workers: Option<usize>,
    /// DEFT: fraction of the model's elements selected per step, k = floor(D·n), in (0, 1]
    /// [default: 0.01, as gradselect, gradallreduce and gradtrain]
    #[arg(long, value_name = "D")]
    density: Option<f64>,
    /// DEFT: hand leftover k to the highest-norm pieces (and take back an overshoot) so Σk_x = k
    #[arg(hide_short_help = true, long)]
    topup: bool,
    /// DEFT: no error feedback (norms taken on each step's raw gradient)
    #[arg(hide_short_help = true, long)]
    no_residual: bool,
    /// DEFT: skip plain top-k on every rank (the build-up comparison; the slowest part)
    #[arg(hide_short_help = true, long)]
    no_buildup: bool,
    /// Ok-Topk: recompute the boundaries every τ steps, counted from the trace's first step
    #[arg(hide_short_help = true, long, value_name = "TAU", default_value_t = 64)]
    period: u32,
    /// Ok-Topk: equal-size regions instead of balanced ones
    #[arg(hide_short_help = true, long)]
    naive: bool,
    /// Also write the metrics (metrics/1) to this Parquet file (`-`: stdout)
    #[arg(long, value_name = "M.parquet")]
    metrics: Option<PathBuf>,
    /// Run name in the metrics table [default: the method, and DEFT's density: `deft-d0.01`,
    /// `oktopk`]
    #[arg(long, value_name = "NAME")]
    run: Option<String>,
    /// Format of the summary: md (Markdown, on stderr, for people); csv or json (on stdout,
    /// for programs: the plan then goes to -o FILE)
    #[arg(long, value_enum, default_value_t = Format::Md)]
    format: Format,
    #[command(flatten)]
    io: IoArgs,
}

mod deft_run;
mod oktopk_run;

fn main() -> ExitCode {
    gradkit_core::cli::one_process_under_mpirun("gradpartition");
    gradkit_core::paths::install_signal_cleanup();
    let matches = Cli::command().get_matches();
    let args = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cli::check_env();
    // Argument checks first: a command line that is wrong on its own is a usage error
    // (exit 2), and nothing is read or written.
    if let Err(e) = check_args(&args, &matches) {
        cli::usage_error::<Cli>(e);
    }
    cli::run(|| body(&args))
}

/// Checks the flags' ranges, and refuses a flag given for a method that does not read it.
fn check_args(a: &Cli, m: &clap::ArgMatches) -> Result<()> {
    if a.workers == Some(0) {
        bail!("--workers must be at least 1");
    }
    match a.method {
        Method::Deft => {
            Keep::density(a.density.unwrap_or(DEFAULT_DENSITY))?;
            for (set, flag) in [(a.naive, "--naive"), (cli::given(m, "period"), "--period")] {
                if set {
                    bail!("{flag} applies to --method oktopk only, not --method deft (it would be ignored)");
                }
            }
        }
        Method::Oktopk => {
            if a.period == 0 {
                bail!("--period must be at least 1");
            }
            for (set, flag) in [
                (a.density.is_some(), "--density"),
                (a.topup, "--topup"),
                (a.no_residual, "--no-residual"),
                (a.no_buildup, "--no-buildup"),
            ] {
                if set {
                    bail!("{flag} applies to --method deft only, not --method oktopk (it would be ignored)");
                }
            }
        }
    }
    Ok(())
}

/// Whether the summary tables go to stdout: csv and json are for programs (Markdown is for
/// people, on stderr); `-q` prints none.
fn summary_on_stdout(a: &Cli) -> bool {
    a.format != Format::Md && !a.io.quiet
}

fn summary_flag(f: Format) -> &'static str {
    match f {
        Format::Csv => "--format csv",
        _ => "--format json",
    }
}

/// The summary tables for stdout, printed together by [`print_summary`] so that they form
/// one document.
static SUMMARY: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// One summary table: Markdown to stderr at once; csv/json kept for [`print_summary`].
fn summary(a: &Cli, t: &TextTable) -> Result<()> {
    if summary_on_stdout(a) {
        SUMMARY
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(t.render(a.format));
    } else {
        gradkit_core::note!("{}", t.render(a.format));
    }
    Ok(())
}

/// The csv/json summary on stdout, one document: json, an array of the tables (each an array
/// of row objects); csv, the tables separated by a blank line.
fn print_summary(a: &Cli) -> Result<()> {
    use std::io::Write;
    let tables = std::mem::take(&mut *SUMMARY.lock().unwrap_or_else(|e| e.into_inner()));
    if tables.is_empty() {
        return Ok(());
    }
    let text = match a.format {
        Format::Json => format!("[\n{}]\n", tables.join(",\n")),
        _ => tables.join("\n"),
    };
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes())
        .and_then(|()| o.flush())
        .map_err(|e| anyhow::Error::new(e).context("writing <stdout>"))
}

fn body(a: &Cli) -> Result<()> {
    check_paths(a)?;
    let input = a.io.input()?;
    let output = a.io.output()?;
    let metrics_out = cli::output_flag("--metrics", a.metrics.as_deref())?;
    // The trace is read one step at a time (docs/MEMORY.md): DEFT plans each step from that
    // step's gradients (and residuals it keeps), Ok-Topk's boundaries come from each plan
    // step's selections; only the layout, the residuals and running sums live across steps.
    let expect = match a.method {
        Method::Deft => Expect::dense("--method deft needs a dense tensor/1 trace"),
        Method::Oktopk => Expect::sparse(
            "--method oktopk needs a sparse tensor/1 of local selections, e.g. from gradselect",
        ),
    };
    let mut trace = TraceReader::open(&input, a.io.read_options(), expect)?;
    let p = a.workers.unwrap_or(trace.ranks());
    let n = trace.layout.total();
    if p as u64 > n {
        bail!("--workers {p} is larger than the number of gradient elements ({n})");
    }
    trace.flat_len()?;
    let d = a.density.unwrap_or(DEFAULT_DENSITY);
    let k = Keep::Density(d).k(n);
    let (meta, algo) = out_meta(a, p, d, k);
    // Ok-Topk's partition balances a selection whatever its density: no density to name.
    let density = (a.method == Method::Deft).then_some(d);
    let run = a
        .run
        .clone()
        .unwrap_or_else(|| cli::default_run_name(algo, density.map(cli::Keep::Density)));
    let mut sink = MetricSink::new(&run, "gradpartition", algo, p as u32).with_settings(
        gradkit_core::RunSettings {
            density,
            ..Default::default()
        },
    );
    // The plan and the metrics are written as the steps complete; each file appears at its
    // path only when finished.
    let mut out = Outputs::create(&output, metrics_out.as_ref(), &meta, algo)?;
    match a.method {
        Method::Deft => deft_run::run(a, &mut trace, p, k, &mut sink, &mut out)?,
        Method::Oktopk => oktopk_run::run(a, &mut trace, p, &mut sink, &mut out)?,
    }
    out.commit()?;
    print_summary(a)
}

/// No output may overwrite an input or another output (the summary on stdout included).
fn check_paths(a: &Cli) -> Result<()> {
    gradkit_core::paths::check_distinct(
        &[("IN", a.io.input.as_deref())],
        &[
            ("-o", cli::stdout_if_absent(a.io.output.as_deref())),
            ("--metrics", a.metrics.as_deref()),
            (
                summary_flag(a.format),
                summary_on_stdout(a).then_some(std::path::Path::new("-")),
            ),
        ],
    )
}

/// The plan's metadata and the `algo` of the metrics.
fn out_meta(a: &Cli, p: usize, d: f64, k: u64) -> (Meta, &'static str) {
    let mut meta = Meta::producer("gradpartition");
    meta.set("world_size", p);
    match a.method {
        Method::Deft => {
            meta.set("method", "deft")
                .set("density", d)
                .set("k", k)
                .set("topup", a.topup)
                .set("residual", !a.no_residual);
            (meta, "deft")
        }
        Method::Oktopk => {
            meta.set("method", "oktopk")
                .set("period", a.period)
                .set("naive", a.naive);
            (meta, if a.naive { "oktopk-naive" } else { "oktopk" })
        }
    }
}

/// The outputs, written step by step.
struct Outputs {
    metrics: Option<TableWriter<MetricRow>>,
    plan: TableWriter<PlanRow>,
}

impl Outputs {
    fn create(output: &Output, metrics: Option<&Output>, meta: &Meta, algo: &str) -> Result<Self> {
        let metrics = match metrics {
            Some(m) => {
                let mut mm = Meta::producer("gradpartition");
                mm.set("method", algo);
                Some(TableWriter::<MetricRow>::create(m, &mm)?)
            }
            None => None,
        };
        let plan = TableWriter::<PlanRow>::create(output, meta)?;
        Ok(Outputs { metrics, plan })
    }

    /// Writes a step's plan rows and the metrics gathered so far.
    fn step(&mut self, plan: Vec<PlanRow>, sink: &mut MetricSink) -> Result<()> {
        self.plan.write_owned(plan)?;
        let rows = std::mem::take(&mut sink.rows);
        match &mut self.metrics {
            Some(m) => m.write_owned(rows),
            None => Ok(()),
        }
    }

    /// Both outputs appear together or neither does.
    fn commit(self) -> Result<()> {
        let mut files = Vec::new();
        if let Some(m) = self.metrics {
            files.extend(m.close()?);
        }
        files.extend(self.plan.close()?);
        gradkit_core::paths::commit_all(files)
    }
}
