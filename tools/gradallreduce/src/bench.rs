//! `gradallreduce bench`: the nccl-tests table for the dense and 1-bit allreduces, with exact
//! bytes/messages per rank from the counters and the α-β model's prediction beside the
//! measurement. Every iteration's result is checked (`wrong` column). Each algorithm runs
//! as the [`Reducer`] a training run uses, one per (algorithm, size) kept across the
//! iterations, on one input buffer kept across them, so the timed steady state allocates
//! what the algorithm allocates and nothing else; the page faults of each call
//! (`getrusage`) are printed beside its time, with the spread of the times (docs/MEMORY.md).
//!
//! The sparse algorithms (Ok-Topk Table 1, DEFT, CLT-k) run on a gradient each rank makes for
//! itself, step after step (`gradtrace synthetic`'s model, one layer of the row's size,
//! [`Generator::for_rank`]), so nothing is fed from rank 0 and the time is the allreduce's
//! own, under mpirun and across hosts alike. `--input dense` gives the algorithm the gradient
//! (it selects, with its own error feedback, inside the timed call); `--input topk` gives it
//! each rank's exact local top-k of `g + residual`, selected before the clock starts, as
//! `gradselect topk | gradallreduce` does. Both run in the same step, one after the other, on
//! the same gradient: their ratio is the cost of the algorithm's own selection (docs/MEMORY.md).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use gradkit_collectives::{cost, reducer_for, Algo, Family, Flat, Op, Params, Reducer};
use gradkit_comm::{huge_vec, Backend, Comm, CommExt, World};
use gradkit_core::cli::{fmt_num, Format, TextTable};
use gradkit_core::keep::{Keep, DEFAULT_DENSITY};
use gradkit_core::synth::{Generator, LayerSpec, SynthSpec};
use gradkit_core::trace::{Layout, MetricSink, Sparse};
use gradkit_core::{write_table, Meta, Output};
use gradkit_sparsify::{Leaves, Residual};

/// What a sparse algorithm is given (`--input`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Input {
    /// Each rank's dense gradient: the algorithm selects (and keeps its residual) in the call.
    Dense,
    /// Each rank's exact top-k of gradient + residual, selected before the call is timed.
    Topk,
}

impl Input {
    fn name(self) -> &'static str {
        match self {
            Input::Dense => "dense",
            Input::Topk => "top-k",
        }
    }
}

/// `--algo`'s help: the registry's dense, 1-bit and sparse algorithms (EmbRace's needs an
/// embedding layer a size sweep does not have).
fn algo_help() -> String {
    use gradkit_collectives::{Algo, Family};
    let of = |f: Family| {
        let names: Vec<&str> = Algo::ALL
            .iter()
            .filter(|a| a.family() == f)
            .map(|a| a.name())
            .collect();
        names.join(", ")
    };
    format!(
        "Comma-separated algorithms: dense ({}), 1-bit ({}) or sparse ({})",
        of(Family::Dense),
        of(Family::Compressed),
        of(Family::Sparse)
    )
}

#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    #[arg(long, default_value = "ring,rabenseifner,tree,native", help = algo_help())]
    pub algo: String,
    /// What the sparse algorithms are given, comma-separated: dense (each rank's gradient;
    /// the algorithm selects inside the timed call) and/or topk (its exact top-k of the
    /// gradient plus residual, selected before the clock starts). DEFT, CLT-k and topk-union
    /// select for themselves and run on dense input only
    #[arg(long, value_enum, value_delimiter = ',', default_value = "dense,topk")]
    pub input: Vec<Input>,
    /// The sparse algorithms' density: k = ⌊density · count⌋
    #[arg(long, default_value_t = DEFAULT_DENSITY)]
    pub density: f64,
    /// Seed of the sparse algorithms' synthetic gradients
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Ranks P to run: in-process ranks (threads) when not started by mpirun, where MPI
    /// gives the count
    #[arg(long, value_name = "P")]
    pub ranks: Option<usize>,
    /// Byte sizes MIN:MAX of the f32 buffer (e.g. 1K:64M)
    #[arg(long, default_value = "1K:16M")]
    pub sizes: String,
    /// Multiply the size by this much between rows
    #[arg(long, default_value_t = 4)]
    pub factor: u64,
    /// Timed iterations per size
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
    /// Untimed warm-up iterations per size
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Fit α and β to the measured points (t ≈ α·messages + β·bytes) and print them
    #[arg(long)]
    pub fit: bool,
    /// The model column's α and β (unless --fit)
    #[command(flatten)]
    pub cost: gradkit_core::cli::CostArgs,
    /// How the table is printed (on stdout)
    #[arg(long, value_enum, default_value_t = Format::Md)]
    pub format: Format,
    /// Also write the measurements as metrics/1 rows to this file (not `-`: stdout holds the
    /// table)
    #[arg(long, value_name = "PATH")]
    pub metrics: Option<PathBuf>,
    /// Record every message of every timed call (commtrace/1) here, for `gradreport simulate`
    #[arg(long, value_name = "PATH")]
    pub comm_trace: Option<PathBuf>,
    /// No summary on stderr
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Where the algorithms' selection and 1-bit kernels run: cpu, or cuda / cuda:N (a
    /// `--features cuda` build on a GPU node; docs/GPU.md). Communication stays on the host
    #[arg(long, value_name = "cpu|cuda[:N]", default_value = "cpu", value_parser = gradkit_cuda::Device::parse_flag)]
    pub device: gradkit_cuda::Device,
    /// Which backend carries the timed calls' messages: mpi (MPI under mpirun, in-process
    /// threads otherwise) or nccl (a `--features cuda` build on a GPU node with NCCL, one
    /// GPU per rank by local rank, opened over MPI — docs/GPU.md)
    #[arg(long, value_name = "mpi|nccl", default_value = "mpi", value_parser = gradkit_cuda::backend::parse)]
    pub backend: gradkit_cuda::backend::CommBackend,
    #[command(flatten)]
    pub memory: gradkit_core::budget::MemoryArgs,
}

/// The kernels of `--device` (opened at the agreement point of [`run`], so this cannot fail
/// afterwards: `kernels_for` keeps its outcome).
fn kernels(args: &BenchArgs) -> &'static dyn gradkit_sparsify::kernels::Kernels {
    gradkit_cuda::kernels_for(args.device).unwrap_or_else(|_| gradkit_sparsify::kernels::cpu())
}

impl BenchArgs {
    /// `--algo`'s algorithms, in the order given: the command line's names turned into the
    /// registry's handles once, here; nothing past this point reads a name.
    pub fn algos(&self) -> Result<Vec<Algo>> {
        self.algo
            .split(',')
            .map(str::trim)
            .map(|name| match name.parse::<Algo>() {
                Ok(a) if a.family() != Family::Embedding => Ok(a),
                _ => bail!("bench supports {SUPPORTED}; not `{name}` (flag --algo)"),
            })
            .collect()
    }

    /// Checks made on the command line alone, before any rank starts.
    pub fn check_flags(&self, _m: &clap::ArgMatches) -> Result<()> {
        gradkit_comm::launch::check_ranks_flag(self.ranks)?;
        sizes(&self.sizes, self.factor)?;
        if self.iters == 0 {
            bail!("--iters must be at least 1: with 0 nothing would be timed or verified (flag --iters)");
        }
        self.cost.check()?;
        for a in self.algos()? {
            if kind(a) == Kind::Sparse && !takes_selection(a) && !self.input.contains(&Input::Dense)
            {
                bail!("{a} selects for itself and runs on dense input only: give --input dense (flag --input)");
            }
        }
        if let Err(e) = Keep::density(self.density) {
            bail!("{e} (flag --density)");
        }
        if self
            .metrics
            .as_deref()
            .is_some_and(|p| p.as_os_str() == "-")
        {
            bail!("--metrics - would write to stdout, which holds bench's table: give --metrics FILE (flag --metrics)");
        }
        Ok(())
    }
}

/// One measured (algorithm, input, size) point, as rank 0 sees it.
struct Point {
    algo: Algo,
    /// What a sparse algorithm was given; `None` for the dense and 1-bit ones.
    input: Option<Input>,
    /// Median over iterations of the slowest rank's `time_select_s` (sparse algorithms
    /// selecting from dense input).
    select_s: Option<f64>,
    bytes: u64,
    count: usize,
    /// Median over iterations of the slowest rank's time.
    time_s: f64,
    /// Slowest over fastest iteration (each the slowest rank's time).
    max_over_min: f64,
    /// Page faults per call (minor, major): the median over iterations, max over ranks.
    faults: (f64, f64),
    max_bytes_sent: u64,
    max_msgs: u64,
    wrong: Option<usize>,
}

fn sizes(spec: &str, factor: u64) -> Result<Vec<u64>> {
    if factor < 2 {
        bail!("--factor must be at least 2, got {factor} (flag --factor)");
    }
    let (a, b) = spec.split_once(':').unwrap_or((spec, spec));
    let size =
        |x: &str| crate::parse_size(x).with_context(|| format!("--sizes {spec} (flag --sizes)"));
    let (lo, hi) = (size(a)?, size(b)?);
    if lo < 4 || hi < lo {
        bail!("--sizes {spec} must be MIN:MAX bytes with 4 ≤ MIN ≤ MAX (flag --sizes)");
    }
    let mut v = Vec::new();
    let mut s = Some(lo);
    // Checked: a size past 2^64 − 1 ends the list instead of wrapping around below MAX.
    while let Some(b) = s.filter(|b| *b <= hi) {
        v.push(b);
        s = b.checked_mul(factor);
    }
    Ok(v)
}

/// Buffers one rank holds per size: the pristine input, the working copy, the reducer's
/// kept message buffer and up to two receive buffers kept by the backend (MPI; a tree's
/// messages are the whole buffer), or (1-bit) the error buffers and the decompressed result.
const BUFFERS_PER_RANK: u128 = 5;
/// The same for a sparse algorithm: the generator's two AR(1) states and its row, the dense
/// input's copy, the two reducers' residuals (one per `--input`), the pre-selection's
/// residual, and the result and messages (up to one more).
const SPARSE_BUFFERS_PER_RANK: u128 = 8;

/// Stops before any rank starts when the largest size cannot be held by the ranks of this
/// process (all of them in-process, or one under mpirun).
fn check_memory(sizes: &[u64], ranks_here: usize, spec: &str, sparse: bool) -> Result<()> {
    let Some(&max) = sizes.iter().max() else {
        return Ok(());
    };
    let buffers = if sparse {
        SPARSE_BUFFERS_PER_RANK
    } else {
        BUFFERS_PER_RANK
    };
    let bytes = gradkit_core::budget::product(&[max as u128, buffers, ranks_here as u128]);
    gradkit_core::budget::check(
        &format!(
            "bench size {max} bytes (flag --sizes {spec}) on {ranks_here} rank(s) in this process, {buffers} buffers each,"
        ),
        bytes,
    )
}

/// Rank r's input: (i mod 13)·(1 + r mod 4), small integers whose sum over the ranks, taken
/// in any order, is exact in f32 up to [`EXACT_RANKS`] ranks (every partial sum is then an
/// integer below 2^24); [`wrong_elements`] checks it.
/// On huge pages when large ([`huge_vec`]), as numpy allocates the mpi4py baseline's buffer.
fn pattern(r: usize, n: usize) -> Vec<f32> {
    let w = (r % 4 + 1) as f32;
    let mut v = huge_vec(n);
    v.extend((0..n).map(|i| ((i % 13) as f32) * w));
    v
}

/// Σ over P ranks of [`pattern`]'s rank weight 1 + r mod 4, exactly.
fn weight_sum(p: usize) -> u64 {
    let (full, rest) = ((p / 4) as u64, (p % 4) as u64);
    full * 10 + rest * (rest + 1) / 2
}

/// The most ranks whose sum of [`pattern`] is exact in f32: 12 · Σ weights ≤ 2^24.
const EXACT_RANKS: usize = 559_241;

/// How many elements of `data`, an allreduce's sum of [`pattern`] over P ranks, are not that
/// sum. The reference is the exact sum (integers, in f64). Up to [`EXACT_RANKS`] ranks every
/// partial sum of a float32 sum is exact, so the result must equal it; beyond, a float32 sum
/// of P terms in any order is within (P−1)·ε·Σ|x_i| of it (ε = 2^−23, the standard bound with
/// room for its second-order term), so only an element off by more counts.
fn wrong_elements(data: &[f32], p: usize) -> usize {
    let w = weight_sum(p) as f64;
    let rounding = (p.saturating_sub(1) as f64) * f64::from(f32::EPSILON);
    let exact = p <= EXACT_RANKS;
    data.iter()
        .enumerate()
        .filter(|(i, v)| {
            let want = (*i % 13) as f64 * w;
            // Σ|x_i| = the sum itself: every term is ≥ 0.
            let bound = if exact { 0.0 } else { rounding * want };
            let off = (f64::from(**v) - want).abs();
            off.is_nan() || off > bound
        })
        .count()
}

/// How an algorithm is benchmarked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Dense and exact: on [`pattern`], every result element checked.
    Exact,
    /// 1-bit: on [`pattern`], lossy (not checked).
    OneBit,
    /// Sparse: on each rank's synthetic gradient, as `--input` says.
    Sparse,
}

const SUPPORTED: &str =
    "ring, rabenseifner, tree, native, onebit, onebit-naive and the sparse algorithms";

/// How `algo` (one of [`BenchArgs::algos`]) is measured, from its family.
fn kind(algo: Algo) -> Kind {
    match algo.family() {
        Family::Dense => Kind::Exact,
        Family::Compressed => Kind::OneBit,
        Family::Sparse | Family::Embedding => Kind::Sparse,
    }
}

/// Whether the sparse `algo` takes a selection as input (the ones that select for themselves
/// from dense input do not: its descriptor's `dense_input_only`).
fn takes_selection(algo: Algo) -> bool {
    !algo.descriptor().dense_input_only
}

/// The sparse algorithms' parameters: `--density`, error feedback on (as gradselect and
/// gradallreduce run them), the rest at their defaults.
fn sparse_params(args: &BenchArgs) -> Params {
    Params {
        keep: Keep::Density(args.density),
        residual: true,
        seed: args.seed,
        kernels: kernels(args),
        // The sparse reducers' tensors on the device: the gradient's upload is in the timed
        // call, as in a reduction (docs/GPU.md §7).
        resident: gradkit_cuda::resident_for(args.device).ok().flatten(),
        ..Params::default()
    }
}

/// The reducer for `algo`.
fn bench_reducer(algo: Algo, args: &BenchArgs) -> Result<Box<dyn Reducer>> {
    let params = match kind(algo) {
        Kind::Exact => Params {
            op: Op::Sum,
            ..Params::default()
        },
        Kind::OneBit => Params {
            kernels: kernels(args),
            // The errors on the device, as in a reduction (docs/GPU.md §7).
            resident: gradkit_cuda::resident_for(args.device).ok().flatten(),
            ..Params::default()
        },
        Kind::Sparse => sparse_params(args),
    };
    reducer_for(algo, &params)
}

/// Page faults (minor, major) so far, from `getrusage`: of the calling thread when ranks are
/// threads of one process, of the whole process when each rank is a process (MPI, whose
/// library may fault in threads of its own).
fn page_faults(thread: bool) -> (u64, u64) {
    #[cfg(target_os = "linux")]
    let who = if thread {
        libc::RUSAGE_THREAD
    } else {
        libc::RUSAGE_SELF
    };
    #[cfg(not(target_os = "linux"))]
    let who = {
        let _ = thread;
        libc::RUSAGE_SELF
    };
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct, and getrusage
    // writes only into the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(who, &mut u) } != 0 {
        return (0, 0);
    }
    (u.ru_minflt as u64, u.ru_majflt as u64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The timed iterations of one (algorithm, input) on one rank, and what rank 0 makes of
/// every rank's.
struct Timing {
    per_thread: bool,
    times: Vec<f64>,
    select: Vec<f64>,
    minflt: Vec<f64>,
    majflt: Vec<f64>,
    /// What a recorded call ran (--comm-trace).
    label: String,
    sent: u64,
    msgs: u64,
    wrong: usize,
}

impl Timing {
    fn new(comm: &dyn Comm, iters: usize, label: String) -> Self {
        Timing {
            label,
            per_thread: comm.backend() != Backend::MPI,
            times: Vec::with_capacity(iters),
            select: Vec::with_capacity(iters),
            minflt: Vec::with_capacity(iters),
            majflt: Vec::with_capacity(iters),
            sent: 0,
            msgs: 0,
            wrong: 0,
        }
    }

    /// One call of `reducer` on `input`, between two barriers, with the traffic counters reset:
    /// timed, its page faults and traffic kept when `timed` (not a warm-up). Returns the
    /// result.
    fn call(
        &mut self,
        comm: &dyn Comm,
        reducer: &mut dyn Reducer,
        step: u32,
        layout: &Layout,
        input: Flat,
        timed: bool,
    ) -> Result<Flat> {
        comm.barrier()?;
        comm.traffic().reset();
        // The algorithm's own selection runs on dense input only (given a selection, a
        // reducer may still report the ~0 s it took to take it).
        let selects = input.is_dense();
        let f0 = page_faults(self.per_thread);
        if timed {
            let n = comm.traffic().steps_recorded();
            comm.traffic().begin_step(n, &self.label);
        }
        let t0 = std::time::Instant::now();
        let out = reducer.reduce(comm, step, layout, input)?;
        let dt = t0.elapsed().as_secs_f64();
        comm.traffic().end_step();
        // Every rank leaves the call before any starts its next iteration's work: a rank
        // that computes while a peer still waits for its last message holds that message
        // back by milliseconds on the shaped cluster (hosts sharing cores; measured 2–5 ms
        // on a 40 KiB message at 1 Gbit/s, ~0.5 ms with this barrier), which is not the
        // network's time (docs/SIMULATE.md, "Calibration").
        comm.barrier()?;
        let f1 = page_faults(self.per_thread);
        let t = comm.traffic().total();
        (self.sent, self.msgs) = (t.bytes_sent, t.msgs_sent);
        if timed {
            self.times.push(dt);
            self.minflt.push(f1.0.saturating_sub(f0.0) as f64);
            self.majflt.push(f1.1.saturating_sub(f0.1) as f64);
            let own = out
                .metrics
                .iter()
                .find(|m| selects && m.0 == "time_select_s");
            if let Some((_, s)) = own {
                self.select.push(*s);
            }
        }
        Ok(out.result)
    }

    /// The point rank 0 reports (every rank calls this): per iteration the slowest rank's
    /// time, then the median over iterations; faults, traffic and wrong elements the most of
    /// any rank.
    fn point(
        self,
        comm: &dyn Comm,
        algo: Algo,
        input: Option<Input>,
        bytes: u64,
        checked: bool,
    ) -> Result<Point> {
        let iters = self.times.len();
        let slowest = |v: Vec<f64>| -> Result<Vec<f64>> {
            let all = comm.allgatherv(v)?;
            let len = all.iter().map(Vec::len).min().unwrap_or(0);
            Ok((0..len)
                .map(|i| all.iter().map(|t| t[i]).fold(0.0, f64::max))
                .collect())
        };
        let per_iter = slowest(self.times)?;
        let select = slowest(self.select)?;
        let lo = per_iter.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = per_iter.iter().copied().fold(0.0, f64::max);
        let maxes = comm.allreduce_max_f64(&[
            self.sent as f64,
            self.msgs as f64,
            self.wrong as f64,
            median(self.minflt),
            median(self.majflt),
        ])?;
        Ok(Point {
            algo,
            input,
            select_s: (select.len() == iters && iters > 0).then(|| median(select)),
            bytes,
            count: (bytes / 4) as usize,
            time_s: median(per_iter),
            max_over_min: if lo > 0.0 { hi / lo } else { f64::NAN },
            faults: (maxes[3], maxes[4]),
            max_bytes_sent: maxes[0] as u64,
            max_msgs: maxes[1] as u64,
            wrong: checked.then_some(maxes[2] as usize),
        })
    }
}

/// A dense or 1-bit algorithm on [`pattern`], the same input every call.
fn measure(comm: &dyn Comm, algo: Algo, bytes: u64, args: &BenchArgs) -> Result<Point> {
    let (p, r) = (comm.size(), comm.rank());
    let n = (bytes / 4) as usize;
    let pristine = pattern(r, n);
    let layout = Layout::new(vec![(0, "buffer".into(), n as u64, None)]);
    let exact = kind(algo) == Kind::Exact;
    let mut reducer = bench_reducer(algo, args)?;
    let mut timing = Timing::new(comm, args.iters, format!("{algo} {bytes}B"));
    let mut data = huge_vec(n);
    for it in 0..args.warmup + args.iters {
        data.clear();
        data.extend_from_slice(&pristine);
        let timed = it >= args.warmup;
        let input = Flat::Dense(std::mem::take(&mut data));
        data = timing
            .call(comm, reducer.as_mut(), 0, &layout, input, timed)?
            .into_dense(n);
        if timed && exact {
            timing.wrong += wrong_elements(&data, p);
        }
    }
    timing.point(comm, algo, None, bytes, exact)
}

/// A sparse algorithm on each rank's own synthetic gradient, one step per iteration, once
/// per `--input` in each step (side by side, on the same gradient, first one then the other
/// first).
fn measure_sparse(comm: &dyn Comm, algo: Algo, bytes: u64, args: &BenchArgs) -> Result<Vec<Point>> {
    let (p, r) = (comm.size(), comm.rank());
    let n = (bytes / 4) as usize;
    let layout = Layout::new(vec![(0, "buffer".into(), n as u64, None)]);
    let steps = (args.warmup + args.iters) as u32;
    let spec = SynthSpec::new(
        vec![LayerSpec::new("buffer", &[n as u32])],
        p as u32,
        steps,
        args.seed,
    );
    let mut gen = Generator::for_rank(&spec, r as u32)?;
    let params = sparse_params(args);
    let k = params.k_for(n as u64) as usize;
    let mut runs = Vec::new();
    for &input in &args.input {
        if input == Input::Topk && !takes_selection(algo) {
            continue;
        }
        runs.push((
            input,
            bench_reducer(algo, args)?,
            Timing::new(
                comm,
                args.iters,
                format!("{algo} {bytes}B {}", input.name()),
            ),
        ));
    }
    // The pre-selection's own error feedback, as gradselect keeps it: acc = g + residual,
    // residual = acc with the selected entries zeroed.
    let mut residual = Residual::default();
    for step in 0..steps {
        let Some(g) = gen
            .next()
            .and_then(|mut rows| rows.pop())
            .map(|row| row.values)
        else {
            bail!("the synthetic gradient ended before step {step}");
        };
        let timed = step as usize >= args.warmup;
        // Every other step in the other order, so that neither input always goes first (into
        // caches left warm, or a rate limiter's burst left full, by the step before).
        let order: Vec<usize> = match step % 2 {
            0 => (0..runs.len()).collect(),
            _ => (0..runs.len()).rev().collect(),
        };
        for i in order {
            let (input, reducer, timing) = &mut runs[i];
            let x = match input {
                Input::Dense => {
                    // On huge pages, as the dense algorithms' input: the copy's page faults
                    // happen here, before the clock starts.
                    let mut v = huge_vec(n);
                    v.extend_from_slice(&g);
                    Flat::Dense(v)
                }
                Input::Topk => {
                    let acc = residual.absorb(g.clone());
                    let (indices, values, _) = params.kernels.topk_with_values(&acc, k);
                    residual.settle(acc, Leaves::Sent, &indices, &[]);
                    Flat::Sparse(Sparse { indices, values })
                }
            };
            timing.call(comm, reducer.as_mut(), step, &layout, x, timed)?;
        }
    }
    let mut pts = Vec::new();
    for (input, mut reducer, timing) in runs {
        reducer.finish(comm)?;
        pts.push(timing.point(comm, algo, Some(input), bytes, false)?);
    }
    Ok(pts)
}

/// bench's outputs: not one file (the later write would replace the other), and each
/// creatable before any work.
fn check_outputs(args: &BenchArgs) -> Result<()> {
    gradkit_core::paths::check_distinct(
        &[],
        &[
            ("--metrics", args.metrics.as_deref()),
            ("--comm-trace", args.comm_trace.as_deref()),
        ],
    )?;
    if let Some(path) = &args.metrics {
        gradkit_core::paths::check_creatable("--metrics", path)?;
    }
    if let Some(path) = &args.comm_trace {
        gradkit_core::paths::check_creatable("--comm-trace", path)?;
    }
    Ok(())
}

pub fn run(args: BenchArgs) -> Result<()> {
    args.memory.apply();
    let world = World::init(args.ranks)?;
    let p = world.size();
    // An agreement point: a bad flag is reported once under mpirun.
    let (algos, sizes) = world.agree((|| {
        let algos = args.algos()?;
        gradkit_cuda::kernels_for(args.device)?;
        gradkit_cuda::backend::check(args.backend)?;
        let mut sparse = false;
        for &a in &algos {
            sparse |= kind(a) == Kind::Sparse;
            bench_reducer(a, &args)?;
        }
        let sizes = sizes(&args.sizes, args.factor)?;
        let ranks_here = world.backend().ranks_per_process(p);
        check_memory(&sizes, ranks_here, &args.sizes, sparse)?;
        check_outputs(&args)?;
        Ok((algos, sizes))
    })())?;
    let points = world.run(|host| {
        // `--backend nccl`: every call (and its barriers) over NCCL.
        let nccl = gradkit_cuda::backend::open(args.backend, host)?;
        let comm: &dyn Comm = nccl.as_deref().unwrap_or(host);
        if args.comm_trace.is_some() {
            comm.traffic().start_recording(comm.rank());
        }
        let mut pts = Vec::new();
        for &b in &sizes {
            for &a in &algos {
                if kind(a) == Kind::Sparse {
                    pts.extend(measure_sparse(comm, a, b, &args)?);
                } else {
                    pts.push(measure(comm, a, b, &args)?);
                }
            }
        }
        if let Some(path) = &args.comm_trace {
            crate::reduce::save_comm_trace(comm, path, &args.algo)?;
        }
        Ok(pts)
    })?;
    if !world.is_io_rank() {
        return Ok(());
    }
    let points = points.into_iter().next().unwrap_or_default();
    let fits = fits(&args, &algos, &points);
    let sink = report(&args, &points, &fits, p)?;
    let (alpha, beta) = (args.cost.alpha_s(), args.cost.beta_byte_s());
    if !args.quiet {
        let backend = match args.backend {
            gradkit_cuda::backend::CommBackend::Mpi => world.backend().to_string(),
            nccl => format!("{nccl} (over {})", world.backend()),
        };
        model_note(&args, &fits, p, backend);
        if let Some(line) = gradkit_cuda::transfer_note("gradallreduce bench", args.device) {
            gradkit_core::noteln!("{line}");
        }
    }
    if let Some(path) = &args.metrics {
        let mut meta = Meta::producer("gradallreduce");
        meta.set("world_size", p)
            .set("alpha_s", alpha)
            .set("beta_s_per_byte", beta);
        write_table(&Output::Path(path.clone()), &meta, &sink.rows)?;
    }
    let bad: usize = points.iter().filter_map(|p| p.wrong).sum();
    if bad > 0 {
        bail!("{bad} wrong elements in the results (column `wrong`)");
    }
    Ok(())
}

/// What the model column assumed: the given α and β, and each algorithm's fit.
fn model_note(
    args: &BenchArgs,
    fits: &BTreeMap<&'static str, (f64, f64)>,
    p: usize,
    backend: impl std::fmt::Display,
) {
    let (alpha, beta) = (args.cost.alpha_s(), args.cost.beta_byte_s());
    gradkit_core::noteln!(
        "gradallreduce bench: {p} {backend} ranks; model column: α = {:.2} µs, β = {:.3} ns/byte ({:.2} GB/s) unless fitted",
        alpha * 1e6,
        beta * 1e9,
        1e-9 / beta
    );
    for (a, (al, be)) in fits {
        gradkit_core::noteln!(
            "  fitted {a}: α = {:.2} µs per message, β = {:.3} ns/byte ({:.2} GB/s)",
            al * 1e6,
            be * 1e9,
            1e-9 / be
        );
    }
}

/// --fit: per algorithm, t ≈ α·messages + β·bytes over its sizes (least squares).
fn fits(args: &BenchArgs, algos: &[Algo], points: &[Point]) -> BTreeMap<&'static str, (f64, f64)> {
    let mut fits = BTreeMap::new();
    if !args.fit {
        return fits;
    }
    for &a in algos {
        let pts: Vec<(f64, f64, f64)> = points
            .iter()
            .filter(|pt| pt.algo == a && pt.max_msgs > 0)
            .map(|pt| (pt.max_msgs as f64, pt.max_bytes_sent as f64, pt.time_s))
            .collect();
        match cost::fit_alpha_beta(&pts) {
            Some((al, be)) if al > 0.0 && be > 0.0 => {
                fits.insert(a.name(), (al, be));
            }
            other if !args.quiet => gradkit_core::noteln!(
                "gradallreduce bench: {a}: no usable α-β fit ({other:?}); its model column uses the given α and β"
            ),
            _ => {}
        }
    }
    fits
}

/// The table (printed) and the metrics of every point.
fn report(
    args: &BenchArgs,
    points: &[Point],
    fits: &BTreeMap<&'static str, (f64, f64)>,
    p: usize,
) -> Result<MetricSink> {
    let (alpha, beta) = (args.cost.alpha_s(), args.cost.beta_byte_s());
    let mut table = TextTable::new([
        "size_B",
        "count",
        "algo",
        "input",
        "time_us",
        "select_us",
        "max/min",
        "minflt",
        "majflt",
        "algbw_GBps",
        "busbw_GBps",
        "bytes_sent",
        "msgs",
        "model_us",
        "wrong",
    ]);
    let mut sink = MetricSink::new("bench", "gradallreduce", "", p as u32);
    for pt in points {
        let algbw = pt.bytes as f64 / pt.time_s / 1e9;
        let busbw = algbw * 2.0 * (p as f64 - 1.0) / p as f64;
        let (al, be) = fits.get(pt.algo.name()).copied().unwrap_or((alpha, beta));
        let k = match pt.input {
            Some(_) => sparse_params(args).k_for(pt.count as u64) as f64,
            None => 0.0,
        };
        let model = pt
            .algo
            .cost(p, pt.count as f64, k)
            .map(|c| c.latency * al + c.bytes() * be);
        table.push([
            pt.bytes.to_string(),
            pt.count.to_string(),
            pt.algo.to_string(),
            pt.input.map_or("-", Input::name).to_string(),
            fmt_num(pt.time_s * 1e6, 4),
            pt.select_s.map_or("-".into(), |t| fmt_num(t * 1e6, 4)),
            fmt_num(pt.max_over_min, 3),
            fmt_num(pt.faults.0, 3),
            fmt_num(pt.faults.1, 3),
            fmt_num(algbw, 3),
            fmt_num(busbw, 3),
            pt.max_bytes_sent.to_string(),
            pt.max_msgs.to_string(),
            model.map_or("-".into(), |m| fmt_num(m * 1e6, 4)),
            pt.wrong.map_or("n/a".into(), |w| w.to_string()),
        ]);
        record_point(&mut sink, pt, algbw, busbw, model);
    }
    table.print(args.format)?;
    Ok(sink)
}

/// One point's metric rows (its size in bytes as the step).
fn record_point(sink: &mut MetricSink, pt: &Point, algbw: f64, busbw: f64, model: Option<f64>) {
    sink.algo = pt.algo.to_string();
    sink.run = match pt.input {
        Some(i) => format!("bench/{}-input", i.name()),
        None => "bench".into(),
    };
    let step = pt.bytes as u32;
    for (m, v) in [
        ("size_bytes", pt.bytes as f64),
        ("time_s", pt.time_s),
        ("time_select_s", pt.select_s.unwrap_or(f64::NAN)),
        ("time_max_over_min", pt.max_over_min),
        ("minflt_per_call", pt.faults.0),
        ("majflt_per_call", pt.faults.1),
        ("algbw_GBps", algbw),
        ("busbw_GBps", busbw),
        ("bytes_sent", pt.max_bytes_sent as f64),
        ("messages", pt.max_msgs as f64),
        ("wrong", pt.wrong.map_or(f64::NAN, |w| w as f64)),
        ("model_time_s", model.unwrap_or(f64::NAN)),
    ] {
        sink.push(step, 0, m, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A float32 sum of every rank's [`pattern`], added in rank order or the reverse (as a
    /// reduction might): what a correct allreduce returns.
    fn f32_sum(p: usize, n: usize, reverse: bool) -> Vec<f32> {
        let mut acc = vec![0f32; n];
        let ranks: Vec<usize> = match reverse {
            false => (0..p).collect(),
            true => (0..p).rev().collect(),
        };
        for r in ranks {
            for (a, x) in acc.iter_mut().zip(pattern(r, n)) {
                *a += x;
            }
        }
        acc
    }

    /// At 2,000 ranks (where sums of the old input passed 2^24 and bench reported a correct
    /// result as wrong) a float32 sum in either order is right, and one rank's input left out
    /// is wrong wherever that input is not 0.
    #[test]
    fn a_correct_sum_is_never_wrong_and_a_missing_rank_is() {
        let (p, n) = (2000, 256);
        assert_eq!(
            weight_sum(p),
            (0..p).map(|r| (r % 4 + 1) as u64).sum::<u64>()
        );
        for reverse in [false, true] {
            assert_eq!(wrong_elements(&f32_sum(p, n, reverse), p), 0);
        }
        let mut missing = f32_sum(p, n, false);
        for (a, x) in missing.iter_mut().zip(pattern(7, n)) {
            *a -= x;
        }
        let nonzero = (0..n).filter(|i| i % 13 != 0).count();
        assert_eq!(wrong_elements(&missing, p), nonzero);
        let mut nan = f32_sum(p, n, false);
        nan[3] = f32::NAN;
        assert_eq!(wrong_elements(&nan, p), 1);
    }

    /// Past [`EXACT_RANKS`] a float32 sum rounds; it stays within the bound, in either order.
    #[test]
    fn past_the_exact_range_rounding_is_within_the_bound() {
        let (p, n) = (1 << 20, 26);
        assert!(p > EXACT_RANKS);
        assert!(12 * weight_sum(EXACT_RANKS) <= 1 << 24);
        assert!(12 * weight_sum(EXACT_RANKS + 1) > 1 << 24);
        for reverse in [false, true] {
            let sum = f32_sum(p, n, reverse);
            let w = weight_sum(p) as f64;
            // It does round here: the check is not vacuous.
            assert!((0..n).any(|i| f64::from(sum[i]) != (i % 13) as f64 * w));
            assert_eq!(wrong_elements(&sum, p), 0);
        }
    }
}
