//! gradselect: sparsify a dense `tensor/1` gradient trace per (step, rank) with any selection
//! method of the papers, with error feedback; writes a sparse `tensor/1` and metrics.

/// Large blocks mapped on huge pages and handed back when freed (docs/MEMORY.md).
#[global_allocator]
static ALLOC: gradkit_core::alloc::BigAlloc = gradkit_core::alloc::BigAlloc;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use gradkit_core::cli::{self, IoArgs};
use gradkit_core::io::{Input, Meta, ReadOptions, TableWriter, TensorSteps, TensorStream};
use gradkit_core::trace::{self, Layout, MetricSink, Sparse};
use gradkit_core::{read_table, MetricRow, PlanRow, TensorRow};
use gradkit_partition::deft as pdeft;
use gradkit_partition::plan as pplan;
use gradkit_sparsify::{deft, k_for, Adjust, Leaves, Method as SMethod, Residual, Selector};

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

Metrics (--metrics, metrics/1, per step and rank): k_target, nnz, threshold, density,
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
#[command(name = "gradselect", version, about = ABOUT, long_about = ABOUT, after_help = AFTER)]
struct Cli {
    /// Selection method
    #[arg(long, value_enum)]
    method: MethodArg,
    /// Fraction kept: k = floor(D·n), at least 1; in (0, 1]
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
    #[arg(long, value_name = "TAU", default_value_t = 32)]
    reeval: u32,
    /// oktopk: threshold reuse policy: ladder (default), paper, reference (= vgg; lstm, bert pick the reference code's bands; bare `--adjust` = reference)
    #[arg(long, value_name = "POLICY", num_args = 0..=1, default_missing_value = "reference", value_parser = clap::builder::PossibleValuesParser::new(gradkit_sparsify::Adjust::NAMES))]
    adjust: Option<String>,
    /// dgc: fraction of entries sampled for the threshold estimate, in (0, 1]
    #[arg(long, value_name = "F", default_value_t = 0.01)]
    sample: f64,
    /// randomk: seed shared by all ranks
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// deft: plan/1 from `gradpartition --method deft` (absent: computed in-process)
    #[arg(long, value_name = "PLAN")]
    plan: Option<PathBuf>,
    /// deft (in-process plan): hand leftover k to the highest-norm pieces, as gradpartition --topup
    #[arg(long)]
    topup: bool,
    /// No error feedback: select from each step's gradient alone
    #[arg(long)]
    no_residual: bool,
    /// Write every rank's final residual as a dense tensor/1 to this file (`-`: stdout)
    #[arg(long, value_name = "FILE", conflicts_with = "no_residual")]
    residual_out: Option<PathBuf>,
    /// Also write per-(step, rank) metrics (metrics/1) to this Parquet file (`-`: stdout)
    #[arg(long, value_name = "M.parquet")]
    metrics: Option<PathBuf>,
    /// Run name in the metrics table (default: the input file's stem)
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

fn main() -> ExitCode {
    gradkit_core::cli::one_process_under_mpirun("gradselect");
    gradkit_core::paths::install_signal_cleanup();
    let matches = Cli::command().get_matches();
    let args = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cli::check_env();
    // A command line that is wrong on its own is a usage error (exit 2), before any I/O.
    let (method, kspec) =
        check_args(&args, &matches).unwrap_or_else(|e| cli::usage_error::<Cli>(e));
    cli::run(|| body(&args, method, kspec))
}

/// How k is given.
#[derive(Clone, Copy, Debug)]
enum KSpec {
    Density(f64),
    Count(usize),
    None,
}

impl KSpec {
    fn k(self, n: usize) -> usize {
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
        (None, None) => KSpec::None,
    };
    if a.method != MethodArg::Threshold && matches!(kspec, KSpec::None) {
        bail!(
            "--method {} needs --density D or --k K",
            method_name(a.method)
        );
    }
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

/// Per-rank state: one selector per index space, and the residual.
struct RankState {
    selectors: Vec<Selector>,
    residual: Residual,
}

/// What one (step, rank) selection produced.
struct Out {
    sparse: Sparse,
    k_target: usize,
    threshold: Option<f32>,
    exact_topk: bool,
    time: f64,
}

fn body(a: &Cli, method: SMethod, kspec: KSpec) -> Result<()> {
    gradkit_core::paths::check_distinct(
        &[("IN", a.io.input.as_deref()), ("--plan", a.plan.as_deref())],
        &[
            ("-o", cli::stdout_if_absent(a.io.output.as_deref())),
            ("--residual-out", a.residual_out.as_deref()),
            ("--metrics", a.metrics.as_deref()),
        ],
    )?;
    // Before anything is read or created: `--device cuda` without a usable GPU is one line.
    let kernels = gradkit_cuda::kernels_for(a.device)?;
    let input = a.io.input()?;
    let output = a.io.output()?;
    let metrics_out = cli::output_flag("--metrics", a.metrics.as_deref())?;
    let residual_out = cli::output_flag("--residual-out", a.residual_out.as_deref())?;
    // The trace is read one step at a time (docs/MEMORY.md): a first pass over the keys gives
    // the steps and ranks; the layout comes from the first step and every step is checked
    // against it, as the whole-trace check did.
    let stream = TensorStream::open(&input, a.io.read_options())?;
    let scan = stream.scan()?;
    let source = stream.source.clone();
    let needs_dense = || {
        format!(
            "gradselect needs a dense tensor/1 trace, e.g. from `gradtrace synthetic` ({source})"
        )
    };
    if scan.rows == 0 {
        bail!("the input has no rows ({source})");
    }
    gradkit_core::io::check_ranks(&scan.ranks).with_context(needs_dense)?;
    let steps = scan.steps.clone();
    let p = scan.ranks.len();
    let deft = a.method == MethodArg::Deft;
    // The layers come from the first step: DEFT reads every step whole (its leader plans from
    // every rank's accumulator); every other method reads even the first step rank by rank,
    // its layers taken from the key columns alone (TensorStream::step_layout) and the step
    // checked at its end like every step.
    let Some(&first_step) = steps.first() else {
        bail!("the input has no rows ({source})");
    };
    let keys_layout = match deft {
        true => None,
        false => Some(stream.step_layout(&scan, first_step)?),
    };
    let mut trace_steps = stream.steps(&scan)?;
    let (layout, first) = match keys_layout {
        Some(mut layout) => {
            scan.complete_shapes(&mut layout);
            (layout, StepRows::runs(first_step, p))
        }
        None => {
            let Some((_, first_rows)) = trace_steps.next_step()? else {
                bail!("the input has no rows ({source})");
            };
            let mut layout = Layout::of_rows(&first_rows);
            scan.complete_shapes(&mut layout);
            gradkit_core::io::check_step(&first_rows, &layout, p, Some(true))
                .with_context(needs_dense)?;
            (layout, StepRows::whole(first_rows, p))
        }
    };
    let n = layout.total();
    if n > u32::MAX as u64 {
        bail!("the model has {n} elements; the flat index space is u32");
    }
    let n = n as usize;
    let plan = match &a.plan {
        Some(path) => Some(load_plan(path, &layout, p, &steps)?),
        None => None,
    };
    let run = a.run.clone().unwrap_or_else(|| match &a.io.input {
        Some(p) if p.as_os_str() != "-" => p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        _ => "stdin".into(),
    });
    let algo = match a.method {
        MethodArg::Deft => "deft",
        _ => method.name(),
    };
    let mut sink = MetricSink::new(&run, "gradselect", algo, p as u32);
    let residual_on = !a.no_residual;

    let mut meta = Meta::producer("gradselect");
    meta.set("method", algo)
        .set("world_size", p)
        .set("scope", format!("{:?}", a.scope).to_lowercase())
        .set("residual", residual_on);
    match kspec {
        KSpec::Density(d) => {
            meta.set("density", d);
        }
        KSpec::Count(k) => {
            meta.set("k", k);
        }
        KSpec::None => {}
    }
    match &method {
        SMethod::Threshold(t) if a.method == MethodArg::Threshold => {
            meta.set("threshold", t);
        }
        SMethod::OkTopk { reeval, adjust } => {
            meta.set("reeval", reeval).set("adjust", adjust.label());
        }
        SMethod::Dgc { sample } => {
            meta.set("sample", sample);
        }
        SMethod::RandomK { seed } => {
            meta.set("seed", seed);
        }
        _ => {}
    }
    if a.method == MethodArg::Deft {
        meta.set(
            "plan",
            a.plan
                .as_ref()
                .map_or("in-process".to_string(), |p| p.display().to_string()),
        )
        .set("topup", a.topup);
    }
    // Outputs are written as the steps complete; each appears at its path only when finished.
    let mut metrics_w = match &metrics_out {
        Some(m) => {
            let mut mm = Meta::producer("gradselect");
            mm.set("method", algo);
            Some(TableWriter::<MetricRow>::create(m, &mm)?)
        }
        None => None,
    };
    let mut out_w = TableWriter::<TensorRow>::create(&output, &meta)?;
    // --residual-out is opened now, with the others, though written after the last step: a
    // path it cannot be created at stops the run before any step.
    let residual_w = match &residual_out {
        Some(rout) => {
            let mut rm = meta.clone();
            rm.set("content", "residual");
            Some(TableWriter::<TensorRow>::create(rout, &rm)?)
        }
        None => None,
    };

    let mut states: Vec<RankState> = (0..p)
        .map(|_| RankState {
            selectors: match a.scope {
                Scope::Global => vec![Selector::with_kernels(method.clone(), 0, kernels)],
                Scope::Layer => layout
                    .layers
                    .iter()
                    .map(|l| Selector::with_kernels(method.clone(), l.layer_id as u64, kernels))
                    .collect(),
            },
            residual: Residual::zeros(if residual_on { n } else { 0 }),
        })
        .collect();
    let pieces = pdeft::pieces(&layout, p);
    let pb = cli::progress("gradselect", steps.len() as u64, a.io.quiet);
    let mut total = 0usize;
    let mut last = first_step;
    let mut next = Some((first_step, first));
    while let Some((step, mut rows)) = next.take() {
        last = step;
        // DEFT's leader needs every rank's accumulator before anyone selects; every other
        // method selects rank by rank, with one accumulator alive at a time.
        let mut step_plan: Option<Vec<(pdeft::Piece, usize)>> = None;
        let mut accs: Vec<(Vec<f32>, f64)> = Vec::new();
        if deft {
            for (r, st) in states.iter().enumerate() {
                let rows = rows.rank(r, &mut trace_steps, &layout, &needs_dense)?;
                let mut acc = trace::take_flat(rows, n);
                let sq = if residual_on {
                    st.residual.compensate(&mut acc)
                } else {
                    0.0
                };
                accs.push((acc, sq));
            }
            step_plan = Some(match &plan {
                Some(pl) => plan_for_step(pl, step).to_vec(),
                None => {
                    let k = kspec.k(n) as u64;
                    let leader = step as usize % p;
                    let rows =
                        pdeft::plan_step(&layout, &pieces, &accs[leader].0, k, p, step, a.topup);
                    plan_pieces(&rows, &layout)?
                }
            });
        }
        // `accumulated`: Σ acc² of an accumulator already compensated (DEFT's, above), or
        // None for a gradient compensated here; the residual's norm then needs no pass of
        // its own.
        let mut select_rank =
            |r: usize, mut acc: Vec<f32>, accumulated: Option<f64>| -> Result<()> {
                let st = &mut states[r];
                let acc_sq = match accumulated {
                    Some(sq) => sq,
                    None if residual_on => st.residual.compensate(&mut acc),
                    None => 0.0,
                };
                let o = match &step_plan {
                    Some(sp) => select_deft(&acc, &layout, sp, r, kspec.k(n), a.topup),
                    None => select_plain(&mut st.selectors, step, &acc, &layout, kspec),
                };
                let rn = if residual_on {
                    let idx = &o.sparse.indices;
                    st.residual.settle_norm(acc, Leaves::Sent, idx, &[], acc_sq)
                } else {
                    drop(acc);
                    0.0
                };
                let nnz = o.sparse.len();
                let rank = r as u32;
                sink.push(step, rank, "k_target", o.k_target as f64);
                sink.push(step, rank, "nnz", nnz as f64);
                if let Some(th) = o.threshold {
                    sink.push(step, rank, "threshold", th as f64);
                }
                sink.push(step, rank, "exact_topk", f64::from(u8::from(o.exact_topk)));
                sink.push(
                    step,
                    rank,
                    "density",
                    if n > 0 { nnz as f64 / n as f64 } else { 0.0 },
                );
                sink.push(step, rank, "time_select_s", o.time);
                sink.push(step, rank, "residual_norm", rn);
                total += nnz;
                out_w.write_owned(trace::unflatten_sparse(&o.sparse, &layout, step, rank))
            };
        if deft {
            for (r, (acc, sq)) in accs.into_iter().enumerate() {
                select_rank(r, acc, Some(sq))?;
            }
        } else {
            for r in 0..p {
                let rows = rows.rank(r, &mut trace_steps, &layout, &needs_dense)?;
                select_rank(r, trace::take_flat(rows, n), None)?;
            }
        }
        rows.finish(&mut trace_steps, &layout, &needs_dense)?;
        if let Some(w) = &mut metrics_w {
            w.write_owned(std::mem::take(&mut sink.rows))?;
        } else {
            sink.rows.clear();
        }
        pb.inc(1);
        // DEFT's leader plans from every rank's accumulator: it reads a step whole; every
        // other method reads the next step rank by rank (docs/MEMORY.md).
        next = if deft {
            match trace_steps.next_step()? {
                Some((step, rows)) => {
                    gradkit_core::io::check_step(&rows, &layout, p, Some(true))
                        .with_context(needs_dense)?;
                    Some((step, StepRows::whole(rows, p)))
                }
                None => None,
            }
        } else {
            trace_steps
                .peek_step()?
                .map(|step| (step, StepRows::runs(step, p)))
        };
    }
    pb.finish_and_clear();

    // Every output is complete before any is given its name: they appear together or not
    // at all.
    let mut files = Vec::new();
    if let Some(mut w) = residual_w {
        for (r, st) in states.iter().enumerate() {
            w.write_owned(trace::unflatten_dense(
                &st.residual.values,
                &layout,
                last,
                r as u32,
            ))?;
        }
        files.extend(w.close()?);
    }
    if let Some(w) = metrics_w {
        files.extend(w.close()?);
    }
    files.extend(out_w.close()?);
    gradkit_core::paths::commit_all(files)?;
    if !a.io.quiet {
        gradkit_core::noteln!(
            "gradselect: {algo}: {} steps × {p} ranks, {total} entries selected of {} ({:.4}%)",
            steps.len(),
            steps.len() * p * n,
            100.0 * total as f64 / (steps.len() * p * n).max(1) as f64
        );
    }
    Ok(())
}

/// One step's rows for the ranks in turn: a step read whole (the first step, which gives the
/// layout; every step for DEFT), or one read rank by rank from the trace's runs of one
/// `(step, rank)` (`TensorSteps::next_run`): a rank is handed out as soon as its rows are
/// complete, so that with a trace ordered by (step, rank) only one rank's rows are held, not
/// the step's. The whole-step check (`io::check_step`, its messages) runs on the rows' keys at
/// the end of the step; a rank whose rows are not complete when the step ends is reported by it.
enum StepRows {
    Whole(Vec<Vec<TensorRow>>),
    Runs {
        step: u32,
        /// The step's rows without their values, for the check.
        keys: Vec<TensorRow>,
        /// Per rank: rows read and not handed out yet.
        held: Vec<Vec<TensorRow>>,
    },
}

impl StepRows {
    fn whole(rows: Vec<TensorRow>, p: usize) -> Self {
        let mut by_rank: Vec<Vec<TensorRow>> = (0..p).map(|_| Vec::new()).collect();
        for r in rows {
            by_rank[r.rank as usize % p].push(r);
        }
        StepRows::Whole(by_rank)
    }

    fn runs(step: u32, p: usize) -> Self {
        StepRows::Runs {
            step,
            keys: Vec::new(),
            held: (0..p).map(|_| Vec::new()).collect(),
        }
    }

    /// Rank `r`'s rows of the step (read from `steps` as needed), every layer of `layout`.
    /// `ctx` names the input in a failed check's message.
    fn rank(
        &mut self,
        r: usize,
        steps: &mut TensorSteps,
        layout: &Layout,
        ctx: &dyn Fn() -> String,
    ) -> Result<Vec<TensorRow>> {
        let (step, keys, held) = match self {
            StepRows::Whole(by_rank) => return Ok(std::mem::take(&mut by_rank[r])),
            StepRows::Runs { step, keys, held } => (*step, keys, held),
        };
        while !complete(&held[r], layout) {
            if steps.peek_step()? != Some(step) {
                // The step ended without every layer of rank r: the check says what is wrong.
                gradkit_core::io::check_step(keys, layout, held.len(), Some(true))
                    .with_context(ctx)?;
                bail!("internal: step {step} rank {r} incomplete after its check");
            }
            read_run(steps, keys, held)?;
        }
        Ok(std::mem::take(&mut held[r]))
    }

    /// Reads what is left of the step and runs the whole-step check on its keys.
    fn finish(
        self,
        steps: &mut TensorSteps,
        layout: &Layout,
        ctx: &dyn Fn() -> String,
    ) -> Result<()> {
        let StepRows::Runs {
            step,
            mut keys,
            mut held,
        } = self
        else {
            return Ok(());
        };
        while steps.peek_step()? == Some(step) {
            read_run(steps, &mut keys, &mut held)?;
        }
        gradkit_core::io::check_step(&keys, layout, held.len(), Some(true)).with_context(ctx)
    }
}

/// Reads the next run of one `(step, rank)`: its keys to `keys`, its rows to `held[rank]`.
fn read_run(
    steps: &mut TensorSteps,
    keys: &mut Vec<TensorRow>,
    held: &mut [Vec<TensorRow>],
) -> Result<()> {
    let run = steps
        .next_run(usize::MAX)?
        .context("internal: a run went missing")?;
    keys.extend(run.iter().map(TensorRow::key));
    let p = held.len();
    if let Some(first) = run.first() {
        held[first.rank as usize % p].extend(run);
    }
    Ok(())
}

/// Whether `rows` are one rank's complete step: dense, exactly the layers of `layout`, each
/// with its `numel` values.
fn complete(rows: &[TensorRow], layout: &Layout) -> bool {
    if rows.len() != layout.layers.len() {
        return false;
    }
    let mut ids: Vec<(u32, usize)> = rows
        .iter()
        .filter(|r| r.is_dense())
        .map(|r| (r.layer_id, r.values.len()))
        .collect();
    ids.sort_unstable();
    ids.len() == layout.layers.len()
        && ids
            .iter()
            .zip(&layout.layers)
            .all(|(&(id, len), l)| id == l.layer_id && len as u64 == l.numel)
}

/// Every method but DEFT, global or per layer.
fn select_plain(
    sels: &mut [Selector],
    step: u32,
    acc: &[f32],
    layout: &Layout,
    kspec: KSpec,
) -> Out {
    let t0 = Instant::now();
    if sels.len() == 1 {
        let s = sels[0].select(step, acc, kspec.k(acc.len()));
        return Out {
            time: t0.elapsed().as_secs_f64(),
            k_target: s.info.k_target,
            threshold: s.info.threshold,
            exact_topk: s.info.exact_topk,
            sparse: Sparse {
                indices: s.indices,
                values: s.values,
            },
        };
    }
    let mut sparse = Sparse::default();
    let (mut k_target, mut exact) = (0, true);
    for (sel, l) in sels.iter_mut().zip(&layout.layers) {
        let off = l.offset as usize;
        let slice = &acc[off..off + l.numel as usize];
        let s = sel.select(step, slice, kspec.k(slice.len()));
        k_target += s.info.k_target;
        exact &= s.info.exact_topk;
        sparse
            .indices
            .extend(s.indices.iter().map(|&i| i + off as u32));
        sparse.values.extend(s.values);
    }
    Out {
        time: t0.elapsed().as_secs_f64(),
        k_target,
        // One threshold per layer: not a single number per (step, rank).
        threshold: None,
        exact_topk: exact,
        sparse,
    }
}

/// DEFT (deft.md §1.2–1.4): this rank's own norms over all the plan's pieces give its own
/// per-piece k (Alg. 3); it then runs top-k in the pieces the plan gives it (Alg. 5).
fn select_deft(
    acc: &[f32],
    layout: &Layout,
    plan: &[(pdeft::Piece, usize)],
    rank: usize,
    k: usize,
    topup: bool,
) -> Out {
    let t0 = Instant::now();
    let pieces: Vec<pdeft::Piece> = plan.iter().map(|(pc, _)| *pc).collect();
    let norms = pdeft::piece_norms(layout, &pieces, acc);
    let ks = pdeft::allocate_k(&pieces, &norms, k as u64, topup);
    let ranges: Vec<(usize, usize, usize)> = plan
        .iter()
        .zip(&ks)
        .filter(|((_, w), _)| *w == rank)
        .map(|((pc, _), &kx)| {
            let r = pc.flat_range(layout);
            (r.start, r.end, kx as usize)
        })
        .collect();
    let k_target = ranges.iter().map(|r| r.2.min(r.1 - r.0)).sum();
    let indices = deft::select_in_ranges(acc, &ranges);
    let values = indices.iter().map(|&i| acc[i as usize]).collect();
    Out {
        time: t0.elapsed().as_secs_f64(),
        k_target,
        threshold: None,
        exact_topk: true,
        sparse: Sparse { indices, values },
    }
}

/// A plan as (first step, pieces with their worker), ordered by step.
type Plan = Vec<(u32, Vec<(pdeft::Piece, usize)>)>;

/// The plan in force at `step`: the latest plan step ≤ step.
fn plan_for_step(plan: &Plan, step: u32) -> &[(pdeft::Piece, usize)] {
    let i = plan.partition_point(|(s, _)| *s <= step);
    &plan[i - 1].1
}

/// Pieces of one plan step (rows checked by [`pplan::check`]) in flat order.
fn plan_pieces(rows: &[PlanRow], layout: &Layout) -> Result<Vec<(pdeft::Piece, usize)>> {
    let mut v: Vec<(pdeft::Piece, usize)> = Vec::with_capacity(rows.len());
    for r in rows {
        let li = layout
            .layers
            .binary_search_by_key(&r.layer_id, |l| l.layer_id)
            .ok()
            .with_context(|| {
                format!(
                    "plan step {}: layer_id {} (`{}`) is not in the trace (column `layer_id`)",
                    r.step, r.layer_id, r.layer
                )
            })?;
        v.push((
            pdeft::Piece {
                layer: li,
                start: r.start,
                end: r.end,
            },
            r.worker as usize,
        ));
    }
    v.sort_by_key(|(pc, _)| (pc.layer, pc.start, pc.end));
    v.retain(|(pc, _)| pc.end > pc.start);
    Ok(v)
}

/// Reads a DEFT plan and checks it against the trace's layers, ranks and steps with the
/// validator every plan consumer shares (gradkit-partition's `plan::check`).
fn load_plan(path: &std::path::Path, layout: &Layout, p: usize, steps: &[u32]) -> Result<Plan> {
    load_plan_inner(path, layout, p, steps).with_context(|| format!("--plan {}", path.display()))
}

fn load_plan_inner(
    path: &std::path::Path,
    layout: &Layout,
    p: usize,
    steps: &[u32],
) -> Result<Plan> {
    let input = Input::Path(path.to_path_buf());
    let loaded = read_table::<PlanRow>(&input, ReadOptions::default())?;
    let checked = pplan::check(
        loaded.rows,
        Some(&loaded.meta),
        pplan::PlanKind::Deft,
        layout,
        p,
        steps[0],
    )?;
    checked
        .steps
        .iter()
        .map(|(s, rows)| Ok((*s, plan_pieces(rows, layout)?)))
        .collect()
}
