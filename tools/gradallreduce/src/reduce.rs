//! `gradallreduce [--algo …] IN -o OUT`: reduce a trace step by step.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::Args;
use gradkit_collectives::registry::{Adjust, Balance, Split};
use gradkit_collectives::{cost, reducer_for, Algo, Flat, Op, Params};
use gradkit_comm::{dist, Comm, PhaseCounts, World};
use gradkit_core::cli::IoArgs;
use gradkit_core::trace::{self, Layout, MetricSink};
use gradkit_core::{
    read_table, read_tensor, write_table, Input, Meta, MetricRow, Output, PlanRow, TensorRow,
};

use crate::state;

#[derive(Args, Clone, Debug)]
pub struct ReduceArgs {
    #[command(flatten)]
    pub io: IoArgs,
    /// Allreduce algorithm (see the list below)
    #[arg(long, default_value_t = Algo::Ring, value_parser = AlgoParser)]
    pub algo: Algo,
    /// sum or mean (the sum divided by P); not for the 1-bit algorithms, which always average
    #[arg(long, default_value_t = Op::Sum, value_parser = named(Op::ALL, Op::name, Op::help))]
    pub op: Op,
    /// Ranks P to run: in-process ranks (threads) when not started by mpirun, where MPI
    /// gives the count; must equal the trace's ranks
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Write per-rank, per-step traffic and timing (metrics/1) here (`-`: stdout)
    #[arg(long, value_name = "PATH")]
    pub metrics: Option<PathBuf>,
    /// Run name recorded in the metrics (default: the algorithm)
    #[arg(long)]
    pub run: Option<String>,
    /// Density for algorithms that select from dense input (0 < d ≤ 1)
    #[arg(long, default_value_t = 0.01)]
    pub density: f64,
    /// Select exactly K entries instead of --density
    #[arg(long)]
    pub k: Option<u64>,
    /// Ok-Topk: space repartition period τ, in steps
    #[arg(long, default_value_t = 64)]
    pub period: u32,
    /// Ok-Topk: global threshold re-evaluation period τ', in steps
    #[arg(long, default_value_t = 32)]
    pub reeval: u32,
    /// Ok-Topk: threshold reuse between re-evaluations: ladder (default: count ladder, global
    /// count closest to k with ≤ 4k/3 passing, one integer allreduce per reuse step), paper
    /// (Algorithm 1: reused unchanged), reference (the authors' ×1.03 loop and count bands;
    /// vgg = reference, lstm, bert pick the bands)
    #[arg(long, value_name = "POLICY", default_value = "ladder", value_parser = clap::builder::PossibleValuesParser::new(Adjust::NAMES))]
    pub adjust: String,
    /// Ok-Topk: data balancing in balance_and_allgatherv
    #[arg(long, default_value_t = Balance::Auto, value_parser = named(Balance::ALL, Balance::name, Balance::help))]
    pub balance: Balance,
    /// A plan/1 file (gradpartition) for oktopk regions or DEFT ranges
    #[arg(long, value_name = "PLAN")]
    pub plan: Option<PathBuf>,
    /// No error feedback in the algorithms' own selection of dense input
    #[arg(long)]
    pub no_residual: bool,
    /// 1-bit: load and save worker/server error buffers here
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// AlltoAll: split embedding tables by columns (the paper) or rows
    #[arg(long, default_value_t = Split::Columns, value_parser = named(Split::ALL, Split::name, Split::help))]
    pub split: Split,
    /// Seed for algorithms with randomness
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub memory: gradkit_core::budget::MemoryArgs,
}

/// `--algo`'s values, from [`Algo::ALL`]: `--help` lists every name with its family and
/// description; a typo is a usage error (exit 2) that lists the known names.
#[derive(Clone)]
struct AlgoParser;

impl TypedValueParser for AlgoParser {
    type Value = Algo;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> std::result::Result<Algo, clap::Error> {
        value.to_string_lossy().parse::<Algo>().map_err(|e| {
            clap::Error::raw(clap::error::ErrorKind::InvalidValue, format!("{e}\n")).with_cmd(cmd)
        })
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(Algo::ALL.iter().map(|a| {
            PossibleValue::new(a.name()).help(format!("{}: {}", a.family(), a.description()))
        })))
    }
}

/// A value parser over the names of one of the collectives' enums (`ALL`, `name`, `help`):
/// `--help` lists them, a typo is clap's usage error listing them.
fn named<T>(
    all: &'static [T],
    name: fn(T) -> &'static str,
    help: fn(T) -> Option<&'static str>,
) -> impl TypedValueParser<Value = T>
where
    T: Copy + Send + Sync + 'static + std::str::FromStr<Err = String>,
{
    PossibleValuesParser::new(all.iter().map(move |v| {
        let pv = PossibleValue::new(name(*v));
        match help(*v) {
            Some(h) => pv.help(h),
            None => pv,
        }
    }))
    .try_map(|s| s.parse::<T>())
}

/// The algorithms that read each algorithm-specific flag (anything else would ignore it).
const FLAG_ALGOS: &[(&str, &str, &[Algo])] = &[
    ("state", "--state", &[Algo::OneBit, Algo::OneBitNaive]),
    ("plan", "--plan", &[Algo::Deft, Algo::OkTopk]),
    ("period", "--period", &[Algo::OkTopk]),
    ("reeval", "--reeval", &[Algo::OkTopk]),
    ("adjust", "--adjust", &[Algo::OkTopk]),
    ("balance", "--balance", &[Algo::OkTopk]),
    ("split", "--split", &[Algo::AllToAll]),
];

impl ReduceArgs {
    /// Checks made on the command line alone, before any rank starts: ranges, and flags given
    /// for an algorithm that does not read them (refused rather than silently ignored).
    pub fn check_flags(&self, m: &clap::ArgMatches) -> Result<()> {
        if !(self.density > 0.0 && self.density <= 1.0) {
            bail!(
                "--density must lie in (0, 1], got {} (flag --density)",
                self.density
            );
        }
        if self.k == Some(0) {
            bail!("--k must be at least 1 (flag --k)");
        }
        if self.state.as_deref().is_some_and(|p| p.as_os_str() == "-") {
            bail!("--state names a file that is read and written back, which stdin/stdout cannot be: give --state FILE (flag --state)");
        }
        if self.period == 0 || self.reeval == 0 {
            bail!("--period and --reeval must be at least 1");
        }
        let algo = self.algo;
        for (id, flag, algos) in FLAG_ALGOS {
            if gradkit_core::cli::given(m, id) && !algos.contains(&algo) {
                let names: Vec<&str> = algos.iter().map(|a| a.name()).collect();
                bail!(
                    "{flag} applies to --algo {} only, not --algo {algo} (it would be ignored)",
                    names.join(" or ")
                );
            }
        }
        if gradkit_core::cli::given(m, "op") && matches!(algo, Algo::OneBit | Algo::OneBitNaive) {
            bail!("--op does not apply to --algo {algo}: the 1-bit allreduce always averages (its result is the mean)");
        }
        Ok(())
    }

    fn params(&self) -> Result<Params> {
        let plan = match &self.plan {
            None => None,
            Some(p) => {
                Some(read_table::<PlanRow>(&Input::Path(p.clone()), Default::default())?.rows)
            }
        };
        Ok(Params {
            op: self.op,
            density: self.density,
            k: self.k,
            period: self.period,
            reeval: self.reeval,
            adjust: Adjust::parse(&self.adjust).context("--adjust")?,
            balance: self.balance,
            plan,
            residual: !self.no_residual,
            split: self.split,
            seed: self.seed,
            ..Params::default()
        })
    }
}

/// What the I/O rank reads before any rank starts.
struct Prepared {
    trace: gradkit_core::Loaded<TensorRow>,
    /// Elements of the flat index space (the 1-bit state file records it).
    n: u64,
    /// `--state`: every rank's saved 1-bit errors ([`state::to_rows`]; none when the file
    /// does not exist yet); `None` without `--state`.
    state: Option<Vec<TensorRow>>,
}

/// Checks the trace on the I/O rank: complete steps, ranks equal to the world's size; reads
/// the `--state` file when it exists and checks it fits this run.
fn load(args: &ReduceArgs, world: &World) -> Result<Prepared> {
    let input = args.io.input()?;
    let t = read_tensor(&input, args.io.read_options())?;
    if t.rows.is_empty() {
        bail!("{}: the trace has no rows", t.source);
    }
    let layout = Layout::of_rows(&t.rows);
    trace::check_complete(&t.rows, &layout, None).with_context(|| format!("in {}", t.source))?;
    if args.algo == Algo::AllToAll {
        gradkit_collectives::alltoall::check_embedding_rows(&t.rows)
            .with_context(|| format!("in {}", t.source))?;
    }
    let (steps, ranks) = trace::steps_and_ranks(&t.rows);
    if ranks.len() != world.size() {
        bail!(
            "{} holds {} ranks but this run has {} (flag --ranks, or mpirun -np)",
            t.source,
            ranks.len(),
            world.size()
        );
    }
    let ranks_here = world.backend().ranks_per_process(world.size());
    check_memory(
        args.algo.name(),
        &t.rows,
        &layout,
        steps.len(),
        ranks_here,
        world.size(),
    )
    .with_context(|| format!("in {}", t.source))?;
    if let Some(path) = &args.plan {
        check_plan(path, args.algo, &layout, world.size(), steps[0])
            .with_context(|| format!("--plan {}", path.display()))?;
    }
    let n = layout.total();
    let state = match (&args.state, state::variant_of(args.algo)) {
        (Some(path), Some(variant)) if path.exists() => Some(state::to_rows(
            state::StateFile::load(path, variant, world.size(), n as usize)?,
        )),
        (Some(_), Some(_)) => Some(Vec::new()),
        _ => None,
    };
    Ok(Prepared { trace: t, n, state })
}

/// Checks a `--plan` against the trace with the validator every plan consumer shares
/// (gradkit-partition's `plan::check`, as gradselect does), before any rank starts.
fn check_plan(
    path: &std::path::Path,
    algo: Algo,
    layout: &Layout,
    world: usize,
    first_step: u32,
) -> Result<()> {
    use gradkit_collectives::plan::{check, PlanKind};
    let kind = match algo {
        Algo::Deft => PlanKind::Deft,
        Algo::OkTopk => PlanKind::Oktopk,
        _ => return Ok(()), // refused by check_flags
    };
    let loaded = read_table::<PlanRow>(&Input::Path(path.to_path_buf()), Default::default())?;
    check(
        loaded.rows,
        Some(&loaded.meta),
        kind,
        layout,
        world,
        first_step,
    )?;
    Ok(())
}

/// Stops before any rank starts when the trace's layer sizes (column `numel`) would need
/// more memory than the run may use, or a flat index space that u32 indices cannot address.
/// Estimate: algorithms with a dense result hold 4 dense buffers of the model per rank
/// (input, working copy, received chunks, result; 1-bit: error buffers) and rank 0 keeps one
/// result per step; sparse algorithms densify their region (n/P; counted twice for the
/// temporaries) and, for dense input, keep a residual of the model per rank.
fn check_memory(
    algo: &str,
    rows: &[TensorRow],
    layout: &Layout,
    steps: usize,
    ranks_here: usize,
    world: usize,
) -> Result<()> {
    use gradkit_core::budget;
    let n: u128 = layout.layers.iter().map(|l| l.numel as u128).sum();
    let dense_result = matches!(
        algo,
        "ring" | "rabenseifner" | "tree" | "native" | "onebit" | "onebit-naive" | "alltoall"
    );
    let any_sparse = rows.iter().any(|r| !r.is_dense());
    if (!dense_result || any_sparse) && n > u32::MAX as u128 + 1 {
        bail!(
            "the layers hold {n} elements in all (column `numel`), more than the 2^32 positions sparse indices (UInt32) can address"
        );
    }
    let bytes = if dense_result {
        budget::product(&[n, 4, 4 * ranks_here as u128 + steps as u128])
    } else {
        let regions = budget::product(&[n, 4, 2, ranks_here as u128]) / world.max(1) as u128;
        let residuals = if any_sparse {
            0
        } else {
            budget::product(&[n, 4, ranks_here as u128])
        };
        regions.saturating_add(residuals)
    };
    budget::check(
        &format!(
            "--algo {algo} on {ranks_here} rank(s) in this process over layers of {n} elements in all (column `numel`)"
        ),
        bytes,
    )
}

/// No output may overwrite an input or another output; `--state` is read and written back on
/// purpose, so it may only name itself.
fn check_paths(args: &ReduceArgs) -> Result<()> {
    gradkit_core::paths::check_distinct(
        &[
            ("IN", args.io.input.as_deref()),
            ("--plan", args.plan.as_deref()),
            ("--state", args.state.as_deref()),
        ],
        &[
            (
                "-o",
                gradkit_core::cli::stdout_if_absent(args.io.output.as_deref()),
            ),
            ("--metrics", args.metrics.as_deref()),
            ("--state", args.state.as_deref()),
        ],
    )
}

/// What one rank returns: result rows (rank 0 only), its metrics rows, and (rank 0 only,
/// with `--state`) every rank's state rows after the last step.
type RankOut = (Vec<TensorRow>, Vec<MetricRow>, Vec<TensorRow>);

pub fn run(args: ReduceArgs) -> Result<()> {
    args.memory.apply();
    let world = World::init(args.ranks)?;
    // Checks every rank makes alike (flags, the algorithm's parameters), then the I/O rank's
    // (output, input): each is an agreement point, so a mistake is reported once under mpirun.
    world.agree(check_paths(&args))?;
    let params = world.agree(args.params().and_then(|params| {
        // Validate the algorithm's parameters before reading anything.
        reducer_for(args.algo, &params)?;
        Ok(params)
    }))?;
    let prepared = if world.is_io_rank() {
        args.io.output().and_then(|out| {
            let metrics = gradkit_core::cli::output_flag("--metrics", args.metrics.as_deref())?;
            Ok(Some(((out, metrics), load(&args, &world)?)))
        })
    } else {
        Ok(None)
    };
    let (out, loaded) = world.agree(prepared)?.unzip();
    let meta_in = loaded.as_ref().map(|p| p.trace.meta.clone());
    let n = loaded.as_ref().map_or(0, |p| p.n);
    let (rows, state_in) = loaded.map(|p| (p.trace.rows, p.state)).unzip();
    let state_in = state_in.flatten();
    let run_name = args.run.clone().unwrap_or_else(|| args.algo.to_string());
    let quiet = args.io.quiet;

    let results = world.run(|comm| {
        let inputs = RankIn {
            rows: rows.as_deref(),
            state: state_in.as_deref(),
        };
        reduce_rank(comm, &args, &params, inputs, &run_name, quiet)
    })?;

    let written = match (out, results.into_iter().reduce(merge)) {
        (Some(out), Some((result_rows, metric_rows, state_rows))) => write_outputs(
            &args,
            &world,
            meta_in.as_ref(),
            &out,
            &result_rows,
            &metric_rows,
            (n, state_rows),
        ),
        _ => Ok(()),
    };
    // The last agreement point: the other ranks wait here while rank 0 writes.
    world.agree(written)
}

/// The I/O rank's outputs: the `--state` file, the reduced tensor, the metrics, the summary
/// on stderr.
fn write_outputs(
    args: &ReduceArgs,
    world: &World,
    meta_in: Option<&Meta>,
    (out, metrics_out): &(Output, Option<Output>),
    result_rows: &[TensorRow],
    metric_rows: &[MetricRow],
    (n, state_rows): (u64, Vec<TensorRow>),
) -> Result<()> {
    if let (Some(path), Some(variant)) = (&args.state, state::variant_of(args.algo)) {
        let errors = state::errors_by_rank(state_rows, world.size())?;
        state::StateFile::save(path, variant, n as usize, &errors)?;
    }
    let mut meta = Meta::producer("gradallreduce");
    meta.set("world_size", world.size())
        .set("method", args.algo)
        .set("algo", args.algo)
        .set("op", args.op)
        .set("density", args.density)
        .set("backend", world.backend());
    if let Some(m) = meta_in.and_then(|m| m.get("gradkit.method")) {
        meta.set("input_method", m);
    }
    if let Some(m) = metrics_out {
        let mut mm = Meta::producer("gradallreduce");
        mm.set("algo", args.algo).set("world_size", world.size());
        write_table(m, &mm, metric_rows)?;
    }
    write_table(out, &meta, result_rows)?;
    if !args.io.quiet {
        summarize(metric_rows, world.size());
    }
    Ok(())
}

fn merge(mut a: RankOut, b: RankOut) -> RankOut {
    a.0.extend(b.0);
    a.1.extend(b.1);
    a.2.extend(b.2);
    a
}

/// What the I/O rank read, as every rank sees it (in-process ranks share it; under mpirun
/// only rank 0 holds it and scatters it).
#[derive(Clone, Copy)]
struct RankIn<'a> {
    rows: Option<&'a [TensorRow]>,
    state: Option<&'a [TensorRow]>,
}

fn reduce_rank(
    comm: &dyn Comm,
    args: &ReduceArgs,
    params: &Params,
    inputs: RankIn<'_>,
    run_name: &str,
    quiet: bool,
) -> Result<RankOut> {
    let mine = dist::scatter(comm, inputs.rows, |r: &TensorRow| r.rank as usize)?;
    let layout = Layout::of_rows(&mine);
    let mut reducer = reducer_for(args.algo, params)?;
    // --state: this rank's saved errors, before the first step (none on a fresh start).
    if let Some(path) = &args.state {
        let saved = dist::scatter(comm, inputs.state, |r: &TensorRow| r.rank as usize)?;
        reducer
            .load_state(&state::from_rows(saved))
            .with_context(|| format!("--state {}", path.display()))?;
    }
    let algo = args.algo.name();
    let mut sink = MetricSink::new(run_name, "gradallreduce", algo, comm.size() as u32);
    let mut results = Vec::new();
    let groups = trace::group_step_rank(&mine);
    let bar = gradkit_core::cli::progress("reduce", groups.len() as u64, quiet || comm.rank() != 0);
    let rank = comm.rank() as u32;
    // EmbRace's exchange takes sparse embedding rows beside dense layers: the layers given
    // sparse are the embedding tables (their 2-D shape stays in the layout the reducer sees).
    let hybrid = args.algo == Algo::AllToAll;
    let reducer_layout = if hybrid {
        let mut l = layout.clone();
        for info in &mut l.layers {
            if mine
                .iter()
                .any(|r| r.layer_id == info.layer_id && r.is_dense())
            {
                info.shape = None;
            }
        }
        l
    } else {
        layout.clone()
    };
    for g in groups {
        let dense = g.rows.iter().all(|r| r.is_dense()) && !hybrid;
        let sparse = g.rows.iter().all(|r| !r.is_dense()) || hybrid;
        if !dense && !sparse {
            bail!(
                "step {} rank {}: mixed dense and sparse rows (column `indices`); give all-dense or all-sparse input",
                g.step,
                g.rank
            );
        }
        let n = layout.total();
        let k_in = if dense {
            params.k_for(n)
        } else {
            g.rows.iter().map(|r| r.stored() as u64).sum()
        };
        let input = if dense {
            Flat::Dense(trace::flatten_dense(&g.rows))
        } else {
            Flat::Sparse(trace::flatten_sparse(&g.rows, &layout))
        };
        let before = comm.traffic().snapshot();
        let t0 = std::time::Instant::now();
        let out = reducer
            .reduce(comm, g.step, &reducer_layout, input)
            .with_context(|| format!("step {}", g.step))?;
        let wall = t0.elapsed().as_secs_f64();
        let after = comm.traffic().snapshot();
        record(&mut sink, g.step, rank, &before, &after, wall);
        for (name, v) in &out.metrics {
            sink.push(g.step, rank, name, *v);
        }
        let nnz = match &out.result {
            Flat::Dense(v) => v.iter().filter(|x| **x != 0.0).count(),
            Flat::Sparse(s) => s.len(),
        };
        sink.push(g.step, rank, "nnz", nnz as f64);
        // The paper's formula beside the measurement (Ok-Topk Table 1: TopkDSA's best case,
        // Ok-Topk's worst case; k = the target for dense input, the input's nnz for sparse).
        if let Some(c) = cost::by_algo(args.algo, comm.size(), n as f64, k_in as f64) {
            sink.push(g.step, rank, "model_bytes_sent", c.bytes());
        }
        if comm.rank() == 0 {
            results.extend(match &out.result {
                Flat::Dense(v) => trace::unflatten_dense(v, &layout, g.step, 0),
                Flat::Sparse(s) => trace::unflatten_sparse(s, &layout, g.step, 0),
            });
        }
        bar.inc(1);
    }
    reducer.finish(comm)?;
    bar.finish_and_clear();
    // --state: every rank's errors after the last step, to the I/O rank, which saves them.
    let saved = if args.state.is_some() {
        dist::gather(comm, state::rank_rows(rank, reducer.state()))?.unwrap_or_default()
    } else {
        Vec::new()
    };
    let metrics = dist::gather(comm, sink.rows)?.unwrap_or_default();
    Ok((results, metrics, saved))
}

/// Writes the step's traffic: totals and one row per phase (`bytes_sent:<phase>`, …).
fn record(
    sink: &mut MetricSink,
    step: u32,
    rank: u32,
    before: &BTreeMap<String, PhaseCounts>,
    after: &BTreeMap<String, PhaseCounts>,
    wall: f64,
) {
    let mut total = PhaseCounts::default();
    for (phase, a) in after {
        if phase == dist::IO_PHASE {
            continue;
        }
        let b = before.get(phase).copied().unwrap_or_default();
        let d = PhaseCounts {
            bytes_sent: a.bytes_sent - b.bytes_sent,
            bytes_recv: a.bytes_recv - b.bytes_recv,
            msgs_sent: a.msgs_sent - b.msgs_sent,
            msgs_recv: a.msgs_recv - b.msgs_recv,
            seconds: a.seconds - b.seconds,
        };
        if d == PhaseCounts::default() {
            continue;
        }
        total.add(&d);
        if phase != "default" {
            sink.push(
                step,
                rank,
                &format!("bytes_sent:{phase}"),
                d.bytes_sent as f64,
            );
            sink.push(
                step,
                rank,
                &format!("bytes_recv:{phase}"),
                d.bytes_recv as f64,
            );
            sink.push(step, rank, &format!("messages:{phase}"), d.msgs_sent as f64);
            sink.push(step, rank, &format!("time_s:{phase}"), d.seconds);
        }
    }
    sink.push(step, rank, "bytes_sent", total.bytes_sent as f64);
    sink.push(step, rank, "bytes_recv", total.bytes_recv as f64);
    sink.push(step, rank, "messages", total.msgs_sent as f64);
    sink.push(step, rank, "messages_recv", total.msgs_recv as f64);
    sink.push(step, rank, "time_comm_s", wall);
}

/// A short human summary on stderr: median bytes and time per step over ranks.
fn summarize(rows: &[MetricRow], p: usize) {
    let pick = |m: &str| -> Vec<f64> {
        let mut v: Vec<f64> = rows
            .iter()
            .filter(|r| r.metric == m)
            .map(|r| r.value)
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let med = |v: &[f64]| if v.is_empty() { 0.0 } else { v[v.len() / 2] };
    let (b, t) = (pick("bytes_sent"), pick("time_comm_s"));
    gradkit_core::noteln!(
        "gradallreduce: {} ranks, {} steps; per rank and step: median {} bytes sent (max {}), median {:.3} ms",
        p,
        b.len() / p.max(1),
        med(&b) as u64,
        b.last().copied().unwrap_or(0.0) as u64,
        med(&t) * 1e3
    );
}
