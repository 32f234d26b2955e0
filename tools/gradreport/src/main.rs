//! `gradreport`: tables and SVG figures from metrics/1 files (see docs/gradreport.md).

/// Large blocks mapped on huge pages and handed back when freed (docs/MEMORY.md).
#[global_allocator]
static ALLOC: gradkit_core::alloc::BigAlloc = gradkit_core::alloc::BigAlloc;

mod flags;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use gradkit_core::cli::{self, named, Format};
use gradkit_core::io::TensorStream;
use gradkit_core::MetricRow;
use gradkit_core::{Input, Output, ReadOptions};
use gradkit_report::export::{self, FigFormat};
use gradkit_report::figdata::{self, XAxis};
use gradkit_report::metrics::{self, Stat};
use gradkit_report::model::{self, ModelParams};
use gradkit_report::plot::{self, Kind, PlotOpts};
use gradkit_report::table::{self, TableOpts};
use gradkit_report::{simulate, tensor, volume};
use std::io::{IsTerminal, Write};

#[derive(Parser)]
#[command(
    name = "gradreport",
    version,
    about = "Tables and SVG figures from gradkit metrics/1 files; statistics of tensor/1 files",
    long_about = "Tables and SVG figures from gradkit metrics/1 files; statistics of tensor/1 files.\n\n\
gradreport reads the long-form metrics that gradallreduce, gradselect and gradtrain write \
(one row per run, algorithm, world size, step, rank and metric) and prints what people \
read: medians per algorithm and world size, measured bytes beside the cost model's formula, \
loss curves, time breakdowns and volume/scaling figures.\n\n\
Metric names: a plain name (`bytes_sent`) means the total: its own rows, or the sum of its \
per-phase rows `bytes_sent:<phase>` where a sample has no plain row. `bytes_sent:split_and_reduce` \
selects one phase; `bytes_sent:*` gives one column per phase.",
    after_help = "Examples:\n  \
gradtrace synthetic --shape mlp --ranks 4 --steps 3 -o t.parquet\n  \
gradallreduce --algo oktopk --ranks 4 --density 0.01 t.parquet -o /dev/null --metrics m.parquet\n  \
gradtrain --model mlp --ranks 4 --steps 100 --metrics train.parquet\n  \
gradreport table m*.parquet                         # medians per algo and P, Markdown\n  \
gradreport table m*.parquet --by algo --metric bytes_sent,time_comm_s --format csv\n  \
gradreport table train.parquet --by run --metric loss,eval_accuracy --stat last\n  \
gradreport volume m*.parquet --phases --n 669706 --density 0.01   # measured vs formula\n  \
gradreport plot loss train*.parquet -o loss.svg\n  \
gradreport plot breakdown m*.parquet -o breakdown.svg\n  \
gradreport plot volume m*.parquet --n 669706 --density 0.01 -o volume.svg\n  \
gradtrace synthetic --shape mlp --steps 2 | gradselect --method topk --density 0.01 \\\n    \
| gradreport tensor"
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Replay a --comm-trace recording on SimGrid: simulated time per step and phase beside
    /// the recorded time and the α-β model's (docs/SIMULATE.md)
    #[command(
        after_help = "Example:\n  gradallreduce --algo ring --ranks 4 trace.parquet -o /dev/null --comm-trace rec.parquet\n  \
gradreport simulate rec.parquet --link-rate 1Gbps --latency 50us --compute none\n  \
gradreport simulate rec.parquet --topology dragonfly --link-rate 100Gbps -o sim.csv"
    )]
    Simulate(Box<flags::SimulateArgs>),
    /// Pivot metrics: one row per group of --by columns, one column per metric
    #[command(
        after_help = "Cells are the median over every (run, step, rank) sample of the group, \
with (min–max) beside it in Markdown when the samples differ; csv/json put min and max in \
`<metric>_min`/`<metric>_max` columns. --stat last takes the median over ranks at the group's \
last step (final loss); --stat sum adds every sample (total bytes of all ranks and steps). \
With --per-file each file is one repeat: the statistic is taken in each file alone and the cell \
is the median over the files, (min–max) the files' range.\n\n\
Examples:\n  gradreport table m.parquet --by algo,world_size --metric bytes_sent,bytes_sent:*\n  \
for r in 1 2 3; do gradallreduce trace.parquet -o /dev/null --metrics r$r.parquet; done\n  \
gradreport table r?.parquet --per-file --metric time_comm_s,bytes_sent"
    )]
    Table {
        /// metrics/1 files (stdin when none)
        #[arg(value_name = "METRICS")]
        files: Vec<PathBuf>,
        /// Grouping columns, comma-separated: run, tool, algo, world_size, step, rank
        #[arg(long, value_name = "COLS", default_value = "algo,world_size")]
        by: String,
        /// Metrics to show, comma-separated (`name`, `name:phase`, `name:*`); default: all
        #[arg(long, value_name = "NAMES", value_delimiter = ',')]
        metric: Option<Vec<String>>,
        /// How the samples of a group become one number
        #[arg(long, default_value_t = Stat::Median, value_parser = named(Stat::ALL, Stat::name, Stat::help))]
        stat: Stat,
        /// Do not show min–max beside medians and means
        #[arg(long)]
        no_range: bool,
        /// Each input file is one repeat of the same runs: take --stat within each file alone,
        /// then show the median over the files with their min–max
        #[arg(long)]
        per_file: bool,
        /// Output format
        #[arg(long, value_enum, default_value_t = Format::Md)]
        format: Format,
    },
    /// Draw a figure (SVG, PDF or PNG): loss, breakdown, volume or scaling
    #[command(after_help = "Kinds:\n  \
loss       loss (and accuracy with two or more points) vs step, wall time or bytes (--x), median \
over ranks, one line per run\n  \
breakdown  stacked time_compute_s / time_select_s / time_comm_s per step (median over steps \
and ranks), one bar per algorithm and P\n  \
volume     bytes_sent per rank and step vs P, log-log: measured points (median, min–max \
whiskers) on the cost model's lines (`model_bytes_sent` rows)\n  \
scaling    `model_time_s` (the cost model's projected time per step) vs P, log-log\n\n\
Formats: -o's extension picks SVG, PDF (vector, Helvetica) or PNG (twice the pixel size); \
--also writes others beside it. The legend stands right of the data; --csv writes the \
plotted values.\n\n\
Examples:\n  gradreport plot volume m*.parquet --n 669706 --density 0.01 -o volume.svg\n  \
gradreport plot loss train.parquet --x time --smooth 5 -o loss.pdf --also png --csv loss.csv")]
    Plot(PlotArgs),
    /// Measured bytes per rank and step next to the cost model's formula, and their ratio
    #[command(
        after_help = "The formula's value comes from `model_<metric>` rows in the input or, with \
--n, from each algorithm's formula (Ok-Topk Table 1, DeepSpeed's 1-bit volume; `oktopk` is \
Table 1's worst case 6k(P-1)/P) for the algorithms without such rows; groups with neither \
show `-`. The measured column is the median over steps and ranks, with min and max; \
ratio = measured / model (1.00 means exact).\n\nExample:\n  \
gradreport volume m*.parquet --n 669706 --density 0.01 --phases --format csv"
    )]
    Volume {
        /// metrics/1 files (stdin when none)
        #[arg(value_name = "METRICS")]
        files: Vec<PathBuf>,
        /// Grouping columns, comma-separated
        #[arg(long, value_name = "COLS", default_value = "algo,world_size")]
        by: String,
        /// The measured metric (the model's is model_<metric>)
        #[arg(long, value_name = "NAME", default_value = "bytes_sent")]
        metric: String,
        /// Also one row per phase (<metric>:<phase>)
        #[arg(long)]
        phases: bool,
        /// Output format
        #[arg(long, value_enum, default_value_t = Format::Md)]
        format: Format,
        #[command(flatten)]
        model: ModelArgs,
    },
    /// nnz, density and L2 norm of every layer of a tensor/1 file, per step and rank
    #[command(
        after_help = "Example:\n  gradselect --method topk --density 0.01 trace.parquet | gradreport tensor --step 0"
    )]
    Tensor {
        /// tensor/1 file (stdin when absent)
        #[arg(value_name = "TENSOR")]
        file: Option<PathBuf>,
        /// Only this step
        #[arg(long)]
        step: Option<u32>,
        /// Only this rank
        #[arg(long)]
        rank: Option<u32>,
        /// Accept NaN/Inf values
        #[arg(long)]
        allow_nonfinite: bool,
        /// Output format
        #[arg(long, value_enum, default_value_t = Format::Md)]
        format: Format,
    },
}

/// The cost model's parameters, for inputs without `model_*` rows.
#[derive(clap::Args)]
#[command(next_help_heading = "Cost model (for inputs without model_* rows)")]
struct ModelArgs {
    /// Gradient size n in elements (e.g. 110M = 110,000,000, or 16Mi = 2^24): compute model_bytes_sent and model_time_s with
    /// each algorithm's formula for algorithms whose rows the input lacks
    #[arg(long, value_name = "SIZE")]
    n: Option<String>,
    /// Density k/n of the sparse algorithms
    #[arg(long, default_value_t = 0.01)]
    density: f64,
    #[command(flatten)]
    cost: cli::CostArgs,
    /// Figures: draw the model's lines up to P ranks (a projection: the measured points keep
    /// their own world_size)
    #[arg(long, value_name = "P", default_value_t = 256)]
    project_to: u32,
}

/// Adds computed model rows when `--n` is given (figures: up to `--project-to` ranks).
fn with_model(mut rows: Vec<MetricRow>, a: &ModelArgs, figure: bool) -> Result<Vec<MetricRow>> {
    let Some(n) = &a.n else {
        return Ok(rows);
    };
    let params = ModelParams::new(
        model::parse_size(n)?,
        a.density,
        a.cost.alpha_us,
        a.cost.bandwidth_gbps,
    )?;
    let extra = if figure {
        let lo = rows.iter().map(|r| r.world_size).min().unwrap_or(2).max(2);
        model::powers_of_two(lo, a.project_to)
    } else {
        Vec::new()
    };
    let (add, unknown) = model::complete(&rows, &params, &extra);
    gradkit_core::noteln!(
        "note: cost model (gradkit_cost) with n={} k={} α={} µs bandwidth={} GB/s: {} rows added{}",
        params.n,
        params.k,
        a.cost.alpha_us,
        a.cost.bandwidth_gbps,
        add.len(),
        if unknown.is_empty() {
            String::new()
        } else {
            format!("; not in the model: {}", unknown.join(", "))
        }
    );
    rows.extend(add);
    Ok(rows)
}

#[derive(clap::Args)]
struct PlotArgs {
    /// Which figure
    #[arg(value_parser = named(Kind::ALL, Kind::name, Kind::help))]
    kind: Kind,
    /// metrics/1 files (stdin when none)
    #[arg(value_name = "METRICS")]
    files: Vec<PathBuf>,
    /// The figure to write: FIG.svg, FIG.pdf or FIG.png, by its extension (`-`: SVG on
    /// stdout)
    #[arg(short = 'o', long = "output", value_name = "FIG")]
    output: PathBuf,
    /// Also write these formats beside -o (its name, their extension): svg, pdf, png
    #[arg(long, value_name = "FORMATS", value_delimiter = ',', value_parser = named(FigFormat::ALL, FigFormat::name, FigFormat::help))]
    also: Vec<FigFormat>,
    /// Write the plotted values as CSV (panel, series, x, y, y_min, y_max, y_smooth)
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// plot loss: the x axis (step; time: wall time; bytes: bytes sent per rank, both
    /// summed over the steps)
    #[arg(long = "x", default_value_t = XAxis::Step, value_parser = named(XAxis::ALL, XAxis::name, XAxis::help))]
    x: XAxis,
    /// plot loss: draw the trailing mean over N points (the raw line faint beneath)
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=100000))]
    smooth: u32,
    /// Metrics instead of the kind's defaults, comma-separated
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    metric: Option<Vec<String>>,
    /// Figure title
    #[arg(long)]
    title: Option<String>,
    /// Width and height in pixels
    #[arg(long, value_name = "WxH", default_value = "900x560")]
    size: String,
    #[command(flatten)]
    model: ModelArgs,
}

fn parse_size(s: &str) -> Result<(u32, u32)> {
    let bad = || anyhow::anyhow!("size `{s}` is not WIDTHxHEIGHT, e.g. 900x560 (--size)");
    let (w, h) = s.split_once('x').ok_or_else(bad)?;
    let (w, h): (u32, u32) = (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
    if !(100..=10000).contains(&w) || !(100..=10000).contains(&h) {
        anyhow::bail!("size `{s}` out of range 100..10000 pixels (--size)");
    }
    Ok((w, h))
}

/// The files `gradreport plot` writes, each with its format (usage errors for a format the
/// extension does not name, and for flags that do not apply).
fn plot_targets(
    kind: Kind,
    x: XAxis,
    smooth: u32,
    output: &std::path::Path,
    also: &[FigFormat],
) -> Vec<(PathBuf, FigFormat)> {
    let to_stdout = output.as_os_str() == "-";
    let format = match FigFormat::of_path(output) {
        Some(f) => f,
        None if to_stdout => FigFormat::Svg,
        None => cli::usage_error::<Args>(format!(
            "-o {}: the extension picks the format: .svg, .pdf or .png",
            output.display()
        )),
    };
    if kind != Kind::Loss && (x != XAxis::Step || smooth > 1) {
        cli::usage_error::<Args>("--x and --smooth apply to `plot loss` only");
    }
    if to_stdout && (!also.is_empty() || format != FigFormat::Svg) {
        cli::usage_error::<Args>("-o - writes SVG to stdout; --also needs -o FIG.svg");
    }
    export::targets(output, format, also)
}

/// `gradreport plot`: draws the figure, writes it in each format asked for, and the
/// plotted values with --csv.
fn plot_figure(p: PlotArgs) -> Result<()> {
    let PlotArgs {
        kind,
        files,
        output,
        also,
        csv,
        x,
        smooth,
        metric,
        title,
        size,
        model,
    } = p;
    let to_stdout = output.as_os_str() == "-";
    let targets = plot_targets(kind, x, smooth, &output, &also);
    let inputs: Vec<_> = files
        .iter()
        .map(|f| ("METRICS", Some(f.as_path())))
        .collect();
    let mut outs: Vec<(&str, Option<&std::path::Path>)> = targets
        .iter()
        .map(|(p, _)| ("-o", Some(p.as_path())))
        .collect();
    outs.push(("--csv", csv.as_deref()));
    gradkit_core::paths::check_distinct(&inputs, &outs)?;
    // Every output checked before the figure is drawn: none is written unless all can be.
    for (flag, path) in &outs {
        if let Some(p) = path {
            gradkit_core::paths::check_creatable(flag, p)?;
        }
    }
    if to_stdout {
        if !cli::under_mpi_launcher() && std::io::stdout().is_terminal() {
            anyhow::bail!("refusing to write an SVG figure to a terminal (-o -): give -o FIG.svg, or pipe stdout into a program");
        }
        Output::from_arg(None)?;
    }
    let (width, height) = parse_size(&size)?;
    let opts = PlotOpts {
        kind,
        metrics: metric,
        title,
        width,
        height,
        x,
        smooth: smooth as usize,
    };
    let rows = metrics::load(&files)?;
    let rows = with_model(rows, &model, matches!(kind, Kind::Volume | Kind::Scaling))?;
    let (svg, data) = plot::render(&rows, &opts)?;
    if let (true, Some(path)) = (to_stdout, &csv) {
        figdata::write_csv(path, &data)?;
    }
    if to_stdout {
        let mut o = std::io::stdout().lock();
        return o
            .write_all(svg.as_bytes())
            .and_then(|()| o.flush())
            .map_err(|e| anyhow::Error::new(e).context("writing <stdout>"));
    }
    // Every file encoded before any is written: a figure that fails leaves none.
    let mut files: Vec<(&std::path::Path, Vec<u8>)> = targets
        .iter()
        .map(|(p, f)| Ok((p.as_path(), f.encode(&svg)?)))
        .collect::<Result<_>>()?;
    if let Some(path) = &csv {
        files.push((path, figdata::csv_text(&data).into_bytes()));
    }
    commit_files(&files)
}

/// Writes every file complete under a temporary name, then renames them all
/// (`paths::commit_all`): one that cannot be written leaves none of the others.
fn commit_files(files: &[(&std::path::Path, Vec<u8>)]) -> Result<()> {
    let mut staged = Vec::new();
    for (path, bytes) in files {
        let fill = |w: &mut dyn Write| w.write_all(bytes);
        staged.extend(gradkit_core::io::write_file_staged(path, fill)?);
    }
    gradkit_core::paths::commit_all(staged)?;
    for (path, _) in files {
        gradkit_core::noteln!("wrote {}", path.display());
    }
    Ok(())
}

/// `gradreport table`: the files pooled, or with `--per-file` each file one repeat.
fn table_cmd(files: &[PathBuf], opts: &TableOpts, per_file: bool) -> Result<()> {
    if !per_file {
        return table::table(&metrics::load(files)?, opts)?.print(opts.format);
    }
    if files.len() < 2 {
        bail!("--per-file: give two or more metrics files, one per repeat");
    }
    // One read of each file; each repeat is its rows' range in `rows`.
    let (mut rows, mut repeats) = (Vec::new(), Vec::new());
    for f in files {
        let start = rows.len();
        rows.extend(metrics::load(std::slice::from_ref(f))?);
        repeats.push(start..rows.len());
    }
    table::table_over_repeats(&rows, &repeats, opts)?.print(opts.format)
}

fn body(args: Args) -> Result<()> {
    match args.cmd {
        Cmd::Table {
            files,
            by,
            metric,
            stat,
            no_range,
            per_file,
            format,
        } => {
            let opts = TableOpts {
                by: metrics::parse_cols(&by)?,
                metrics: metric,
                stat,
                range: !no_range,
                format,
            };
            table_cmd(&files, &opts, per_file)
        }
        Cmd::Plot(p) => plot_figure(p),
        Cmd::Volume {
            files,
            by,
            metric,
            phases,
            format,
            model,
        } => {
            let opts = volume::VolumeOpts {
                by: metrics::parse_cols(&by)?,
                metric,
                phases,
            };
            let rows = with_model(metrics::load(&files)?, &model, false)?;
            let lines = volume::volume(&rows, &opts)?;
            if lines.iter().all(|l| l.model.is_none()) {
                gradkit_core::noteln!(
                    "note: no `{}` rows in the input: the model column is empty (give --n SIZE to compute it)",
                    volume::model_name(&opts.metric)
                );
            }
            volume::render(&lines, &opts).print(format)
        }
        // Checked in `main` already (a usage error): this cannot fail.
        Cmd::Simulate(a) => simulate::run(&a.options()?),
        Cmd::Tensor {
            file,
            step,
            rank,
            allow_nonfinite,
            format,
        } => {
            let input = Input::from_arg(file.as_deref())?;
            // Streamed a record batch at a time: memory is one batch plus a line per row.
            let mut chunks = TensorStream::open(&input, ReadOptions { allow_nonfinite })?.chunks();
            let mut stats = Vec::new();
            while let Some(rows) = chunks.next_chunk()? {
                stats.extend(tensor::stats(&rows, step, rank));
            }
            stats.sort_by_key(|s| (s.step, s.rank, s.layer_id));
            if stats.is_empty() {
                anyhow::bail!("no rows match --step/--rank in {}", chunks.source);
            }
            tensor::render(&stats).print(format)
        }
    }
}

fn main() -> ExitCode {
    gradkit_core::cli::one_process_under_mpirun("gradreport");
    gradkit_core::paths::install_signal_cleanup();
    let args = Args::parse();
    if let Cmd::Simulate(a) = &args.cmd {
        // A command line that is wrong on its own is a usage error (exit 2).
        if let Err(e) = a.options() {
            use clap::CommandFactory;
            let mut cmd = Args::command();
            let sub = cmd
                .find_subcommand_mut("simulate")
                .cloned()
                .unwrap_or_default();
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("{}\n", cli::chain_text(&e)),
            )
            .with_cmd(&sub)
            .exit();
        }
    }
    cli::check_env();
    cli::run(|| body(args))
}
