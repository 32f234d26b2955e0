//! gradpartition: decide which worker works on which part of the gradient (`plan/1`).

/// Large blocks mapped on huge pages and handed back when freed (docs/MEMORY.md).
#[global_allocator]
static ALLOC: gradkit_core::alloc::BigAlloc = gradkit_core::alloc::BigAlloc;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use gradkit_core::cli::{self, fmt_num, Format, IoArgs, TextTable};
use gradkit_core::io::Meta;
use gradkit_core::io::{check_ranks, check_step, TableWriter, TensorStream};
use gradkit_core::trace::{self, Layout, MetricSink};
use gradkit_core::{MetricRow, PlanRow, TensorRow};
use gradkit_partition::{deft, oktopk};

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
#[command(name = "gradpartition", version, about = ABOUT, long_about = ABOUT, after_help = AFTER)]
struct Cli {
    /// Which partition to compute
    #[arg(long, value_enum)]
    method: Method,
    /// Number of workers P the plan is for, i.e. the ranks of the job that uses it, as
    /// gradallreduce/gradtrain --ranks (default: the trace's number of ranks)
    #[arg(long, visible_alias = "ranks", value_name = "P")]
    workers: Option<usize>,
    /// DEFT: fraction of the model's elements selected per step, k = floor(D·n), in (0, 1]
    #[arg(long, value_name = "D")]
    density: Option<f64>,
    /// DEFT: hand leftover k to the highest-norm pieces (and take back an overshoot) so Σk_x = k
    #[arg(long)]
    topup: bool,
    /// DEFT: no error feedback (norms taken on each step's raw gradient)
    #[arg(long)]
    no_residual: bool,
    /// DEFT: skip plain top-k on every rank (the build-up comparison; the slowest part)
    #[arg(long)]
    no_buildup: bool,
    /// Ok-Topk: recompute the boundaries every τ steps, counted from the trace's first step
    #[arg(long, value_name = "TAU", default_value_t = 64)]
    period: u32,
    /// Ok-Topk: equal-size regions instead of balanced ones
    #[arg(long)]
    naive: bool,
    /// Also write the metrics (metrics/1) to this Parquet file (`-`: stdout)
    #[arg(long, value_name = "M.parquet")]
    metrics: Option<PathBuf>,
    /// Run name in the metrics table (default: the input file's stem)
    #[arg(long, value_name = "NAME")]
    run: Option<String>,
    /// Format of the summary: md (Markdown, on stderr, for people); csv or json (on stdout,
    /// for programs: the plan then goes to -o FILE)
    #[arg(long, value_enum, default_value_t = Format::Md)]
    format: Format,
    #[command(flatten)]
    io: IoArgs,
}

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
            let d = a
                .density
                .context("--method deft needs --density D (0 < D ≤ 1)")?;
            if !(d > 0.0 && d <= 1.0) {
                bail!("--density must lie in (0, 1], got {d}");
            }
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
    )?;
    let input = a.io.input()?;
    let output = a.io.output()?;
    let metrics_out = cli::output_flag("--metrics", a.metrics.as_deref())?;
    // The trace is read one step at a time (docs/MEMORY.md): DEFT plans each step from that
    // step's gradients (and residuals it keeps), Ok-Topk's boundaries come from each plan
    // step's selections; only the layout, the residuals and running sums live across steps.
    let stream = TensorStream::open(&input, a.io.read_options())?;
    let scan = stream.scan()?;
    let source = stream.source.clone();
    if scan.rows == 0 {
        bail!("the input has no rows ({source})");
    }
    let want_dense = a.method == Method::Deft;
    let needs = || {
        format!(
            "--method {} needs {} ({})",
            if want_dense { "deft" } else { "oktopk" },
            if want_dense {
                "a dense tensor/1 trace"
            } else {
                "a sparse tensor/1 of local selections, e.g. from gradselect"
            },
            source
        )
    };
    check_ranks(&scan.ranks).with_context(needs)?;
    let ranks = scan.ranks.len();
    let mut trace_steps = stream.steps(&scan)?;
    let first = trace_steps
        .next_step()?
        .with_context(|| format!("the input has no rows ({source})"))?;
    let mut layout = Layout::of_rows(&first.1);
    scan.complete_shapes(&mut layout);
    check_step(&first.1, &layout, ranks, Some(want_dense)).with_context(needs)?;
    let p = a.workers.unwrap_or(ranks);
    let n = layout.total();
    if p as u64 > n {
        bail!("--workers {p} is larger than the number of gradient elements ({n})");
    }
    if n > u32::MAX as u64 {
        bail!("the model has {n} elements; the flat index space is u32");
    }
    let run = a.run.clone().unwrap_or_else(|| match &a.io.input {
        Some(p) if p.as_os_str() != "-" => p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        _ => "stdin".into(),
    });
    let mut meta = Meta::producer("gradpartition");
    meta.set("world_size", p);
    let mut sink = MetricSink::new(&run, "gradpartition", "", p as u32);
    let d = a.density.unwrap_or(1.0);
    let k = ((d * n as f64).floor() as u64).clamp(1, n);
    match a.method {
        Method::Deft => {
            meta.set("method", "deft")
                .set("density", d)
                .set("k", k)
                .set("topup", a.topup)
                .set("residual", !a.no_residual);
            sink.algo = "deft".into();
        }
        Method::Oktopk => {
            meta.set("method", "oktopk")
                .set("period", a.period)
                .set("naive", a.naive);
            sink.algo = if a.naive { "oktopk-naive" } else { "oktopk" }.into();
        }
    }
    // The plan and the metrics are written as the steps complete; each file appears at its
    // path only when finished.
    let mut out = Outputs {
        metrics: match &metrics_out {
            Some(m) => {
                let mut mm = Meta::producer("gradpartition");
                mm.set("method", &sink.algo);
                Some(TableWriter::<MetricRow>::create(m, &mm)?)
            }
            None => None,
        },
        plan: TableWriter::<PlanRow>::create(&output, &meta)?,
    };
    let mut first = Some(first);
    let layout_ref = &layout;
    let mut next = || -> Result<Option<(u32, Vec<TensorRow>)>> {
        if let Some(f) = first.take() {
            return Ok(Some(f));
        }
        let s = trace_steps.next_step()?;
        if let Some((_, rows)) = &s {
            check_step(rows, layout_ref, ranks, Some(want_dense)).with_context(needs)?;
        }
        Ok(s)
    };
    match a.method {
        Method::Deft => run_deft(
            a,
            &mut next,
            &scan.steps,
            ranks,
            &layout,
            p,
            k,
            &mut sink,
            &mut out,
        )?,
        Method::Oktopk => run_oktopk(a, &mut next, &scan.steps, &layout, p, &mut sink, &mut out)?,
    }
    // Both outputs appear together or neither does.
    let mut files = Vec::new();
    if let Some(m) = out.metrics {
        files.extend(m.close()?);
    }
    files.extend(out.plan.close()?);
    gradkit_core::paths::commit_all(files)?;
    print_summary(a)
}

/// The next step of the trace and its rows (checked), or `None` after the last.
type NextStep<'a> = dyn FnMut() -> Result<Option<(u32, Vec<TensorRow>)>> + 'a;

/// The outputs, written step by step.
struct Outputs {
    metrics: Option<TableWriter<MetricRow>>,
    plan: TableWriter<PlanRow>,
}

impl Outputs {
    /// Writes a step's plan rows and the metrics gathered so far.
    fn step(&mut self, plan: Vec<PlanRow>, sink: &mut MetricSink) -> Result<()> {
        self.plan.write_owned(plan)?;
        let rows = std::mem::take(&mut sink.rows);
        match &mut self.metrics {
            Some(m) => m.write_owned(rows),
            None => Ok(()),
        }
    }
}

/// One step's flat dense gradients, one per rank (ranks 0..R, checked complete), each rank's
/// rows dropped as soon as they are copied.
fn step_grads(rows: Vec<TensorRow>, ranks: usize, n: usize) -> Vec<Vec<f32>> {
    let mut by_rank: Vec<Vec<TensorRow>> = (0..ranks).map(|_| Vec::new()).collect();
    for r in rows {
        by_rank[r.rank as usize].push(r);
    }
    by_rank
        .into_iter()
        .map(|rows| gradkit_core::trace::take_flat(rows, n))
        .collect()
}

/// Indices of the k largest |x| (gradkit-sparsify's exact top-k, ties to the lower index).
fn topk(x: &[f32], k: usize) -> Vec<u32> {
    gradkit_sparsify::topk::topk_indices(x, k)
}

#[allow(clippy::too_many_arguments)]
fn run_deft(
    a: &Cli,
    next: &mut NextStep<'_>,
    steps: &[u32],
    ranks: usize,
    layout: &Layout,
    p: usize,
    k: u64,
    sink: &mut MetricSink,
    out: &mut Outputs,
) -> Result<()> {
    let mut planner = deft::DeftPlanner::new(layout, p, k, a.topup, !a.no_residual);
    let n = layout.total();
    let topk_cost = deft::topk_cost(n, k);
    let pb = cli::progress("deft", steps.len() as u64, a.io.quiet);
    let mut sum_loads = vec![0.0; p];
    let (mut sum_imb, mut sum_cmax, mut sum_bd, mut sum_bt) = (0.0, 0.0, 0.0, 0.0);
    // per-step measured speedups; the summary shows their median (one preempted step on a
    // loaded machine would dominate a ratio of sums)
    let mut measured: Vec<f64> = Vec::new();
    let mut worst_imb: f64 = 0.0;
    while let Some((step, rows)) = next()? {
        let grads = step_grads(rows, ranks, n as usize);
        let st = planner.step_owned(step, grads, &topk, !a.no_buildup);
        let step = &step;
        let cmax = st.loads.iter().cloned().fold(0.0, f64::max);
        let mean = st.loads.iter().sum::<f64>() / p as f64;
        let imb = if mean > 0.0 { cmax / mean } else { 1.0 };
        for (w, total) in sum_loads.iter_mut().enumerate() {
            sink.push(*step, w as u32, "cost_load", st.loads[w]);
            sink.push(*step, w as u32, "k_assigned", st.worker_k[w] as f64);
            sink.push(*step, w as u32, "k_selected", st.worker_selected[w] as f64);
            sink.push(*step, w as u32, "time_select_s", st.worker_select_s[w]);
            sink.push(
                *step,
                w as u32,
                "elements_assigned",
                st.worker_elements[w] as f64,
            );
            *total += st.loads[w];
        }
        let bd = st.union_deft as f64 / k as f64;
        sink.push(*step, 0, "leader", st.leader as f64);
        sink.push(*step, 0, "pieces", st.ks.len() as f64);
        sink.push(*step, 0, "cost_max", cmax);
        sink.push(*step, 0, "cost_imbalance", imb);
        sink.push(*step, 0, "cost_topk", topk_cost);
        sink.push(*step, 0, "selection_speedup_predicted", topk_cost / cmax);
        let tmax = st.worker_select_s.iter().cloned().fold(0.0, f64::max);
        if let Some(tt) = st.topk_select_s {
            sink.push(*step, 0, "time_select_topk_s", tt);
            sink.push(*step, 0, "time_select_deft_max_s", tmax);
            if tmax > 0.0 {
                sink.push(*step, 0, "selection_speedup_measured", tt / tmax);
                measured.push(tt / tmax);
            }
        }
        sink.push(*step, 0, "k_total", st.ks.iter().sum::<u64>() as f64);
        sink.push(*step, 0, "buildup_deft", bd);
        if let Some(u) = st.union_topk {
            let bt = u as f64 / k as f64;
            sink.push(*step, 0, "buildup_topk", bt);
            sum_bt += bt;
        }
        sum_imb += imb;
        sum_cmax += cmax;
        sum_bd += bd;
        worst_imb = worst_imb.max(imb);
        out.step(st.rows, sink)?;
        pb.inc(1);
    }
    pb.finish_and_clear();
    if !a.io.quiet {
        let s = steps.len() as f64;
        let mean_load = sum_loads.iter().sum::<f64>() / (p as f64 * s);
        gradkit_core::noteln!(
            "deft: {} steps, P = {p}, n = {n}, k = {k}, {} pieces",
            steps.len(),
            planner.pieces.len()
        );
        let mut t = TextTable::new(["worker", "mean_cost_load", "load/mean"]);
        for (w, l) in sum_loads.iter().enumerate() {
            t.push([
                w.to_string(),
                fmt_num(l / s, 4),
                fmt_num(l / s / mean_load, 4),
            ]);
        }
        summary(a, &t)?;
        let mut t = TextTable::new(["quantity", "value"]);
        t.push([
            "imbalance max/mean (mean over steps)".into(),
            fmt_num(sum_imb / s, 4),
        ]);
        t.push([
            "imbalance max/mean (worst step)".into(),
            fmt_num(worst_imb, 4),
        ]);
        t.push([
            "DEFT cost max_i C_i (mean)".into(),
            fmt_num(sum_cmax / s, 4),
        ]);
        t.push(["Top-k cost n·log2 k".into(), fmt_num(topk_cost, 4)]);
        t.push([
            "selection speedup, predicted n·log2 k / max_i C_i".into(),
            fmt_num(topk_cost * s / sum_cmax, 4),
        ]);
        if !measured.is_empty() {
            measured.sort_by(f64::total_cmp);
            t.push([
                "selection speedup, measured top-k time / max worker time (median)".into(),
                fmt_num(measured[measured.len() / 2], 4),
            ]);
        }
        t.push([
            "build-up DEFT union/k (mean)".to_string(),
            fmt_num(sum_bd / s, 4),
        ]);
        if !a.no_buildup {
            t.push([
                "build-up Top-k union/k (mean)".to_string(),
                fmt_num(sum_bt / s, 4),
            ]);
        }
        summary(a, &t)?;
    }
    Ok(())
}

fn run_oktopk(
    a: &Cli,
    next: &mut NextStep<'_>,
    steps: &[u32],
    layout: &Layout,
    p: usize,
    sink: &mut MetricSink,
    out: &mut Outputs,
) -> Result<()> {
    let n = layout.total();
    let recompute = oktopk::period_steps(steps, a.period);
    let naive = oktopk::naive_boundaries(p, n);
    let mut bounds = naive.clone();
    let mut few = 0usize;
    let (mut sum_imb_b, mut sum_imb_n, mut max_words_b, mut max_words_n) = (0.0, 0.0, 0u64, 0u64);
    let mut sum_counts = vec![0u64; p];
    let mut recompute_it = recompute.iter();
    while let Some((step, rows)) = next()? {
        let new = *recompute_it
            .next()
            .context("internal: a step the first pass did not see")?;
        let step = &step;
        // Each rank's sorted flat selection.
        let sels: Vec<Vec<u32>> = trace::group_step_rank(&rows)
            .iter()
            .map(|g| trace::flatten_sparse(&g.rows, layout).indices)
            .collect();
        drop(rows);
        let refs: Vec<&[u32]> = sels.iter().map(|s| s.as_slice()).collect();
        let mut plan = Vec::new();
        if new {
            few += refs.iter().filter(|s| s.len() < p).count();
            bounds = if a.naive {
                naive.clone()
            } else {
                oktopk::balanced_boundaries(&refs, p, n)
            };
            plan.extend(oktopk::region_rows(layout, &bounds, *step));
            for w in 0..p {
                let (s, e) = oktopk::region(&bounds, w, n);
                sink.push(*step, w as u32, "region_size", (e - s) as f64);
            }
        }
        let mut imbs = [0.0; 2];
        for (which, b) in [&bounds, &naive].into_iter().enumerate() {
            let mut counts = vec![0u64; p];
            for s in &refs {
                for (c, x) in counts.iter_mut().zip(oktopk::region_counts(b, s)) {
                    *c += x;
                }
            }
            let words = oktopk::recv_words(b, &refs);
            let suffix = if which == 0 { "" } else { "_naive" };
            for w in 0..p {
                sink.push(
                    *step,
                    w as u32,
                    &format!("region_entries{suffix}"),
                    counts[w] as f64,
                );
                sink.push(
                    *step,
                    w as u32,
                    &format!("recv_words{suffix}"),
                    words[w] as f64,
                );
            }
            let mean = counts.iter().sum::<u64>() as f64 / p as f64;
            let max = counts.iter().copied().max().unwrap_or(0) as f64;
            imbs[which] = if mean > 0.0 { max / mean } else { 1.0 };
            sink.push(*step, 0, &format!("region_imbalance{suffix}"), imbs[which]);
            let wmax = words.iter().copied().max().unwrap_or(0);
            if which == 0 {
                max_words_b = max_words_b.max(wmax);
                for (s, c) in sum_counts.iter_mut().zip(&counts) {
                    *s += c;
                }
            } else {
                max_words_n = max_words_n.max(wmax);
            }
        }
        sum_imb_b += imbs[0];
        sum_imb_n += imbs[1];
        out.step(plan, sink)?;
    }
    if !a.io.quiet {
        let s = steps.len() as f64;
        gradkit_core::noteln!(
            "oktopk{}: {} steps, {} plan steps, P = {p}, n = {n}",
            if a.naive { " --naive" } else { "" },
            steps.len(),
            recompute.iter().filter(|r| **r).count()
        );
        if few > 0 {
            gradkit_core::noteln!(
                "note: {few} (plan step, rank) pairs selected fewer than P = {p} entries; those ranks contributed equal-size cut points"
            );
        }
        let mut t = TextTable::new(["worker", "mean_region_entries"]);
        for (w, c) in sum_counts.iter().enumerate() {
            t.push([w.to_string(), fmt_num(*c as f64 / s, 4)]);
        }
        summary(a, &t)?;
        let mut t = TextTable::new(["quantity", "planned", "equal-size"]);
        t.push([
            "imbalance max/mean (mean over steps)".to_string(),
            fmt_num(sum_imb_b / s, 4),
            fmt_num(sum_imb_n / s, 4),
        ]);
        t.push([
            "max words received in split-and-reduce".to_string(),
            max_words_b.to_string(),
            max_words_n.to_string(),
        ]);
        summary(a, &t)?;
    }
    Ok(())
}
