//! `gradallreduce bench`: the nccl-tests table for the dense and 1-bit allreduces, with exact
//! bytes/messages per rank from the counters and the α-β model's prediction beside the
//! measurement. Every iteration's result is checked (`wrong` column). Each algorithm runs
//! as the [`Reducer`] a training run uses, one per (algorithm, size) kept across the
//! iterations, on one input buffer kept across them, so the timed steady state allocates
//! what the algorithm allocates and nothing else; the page faults of each call
//! (`getrusage`) are printed beside its time, with the spread of the times (issue 19).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use gradkit_collectives::{cost, dense, make_reducer, Flat, Op, Params, Reducer};
use gradkit_comm::{huge_vec, Backend, Comm, CommExt, World};
use gradkit_core::cli::{fmt_num, Format, TextTable};
use gradkit_core::trace::{Layout, MetricSink};
use gradkit_core::{write_table, Meta, Output};

#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// Comma-separated algorithms: ring, rabenseifner, tree, native, onebit
    #[arg(long, default_value = "ring,rabenseifner,tree,native")]
    pub algo: String,
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
    /// No summary on stderr
    #[arg(short = 'q', long)]
    pub quiet: bool,
    #[command(flatten)]
    pub memory: gradkit_core::budget::MemoryArgs,
}

impl BenchArgs {
    /// Checks made on the command line alone, before any rank starts.
    pub fn check_flags(&self, _m: &clap::ArgMatches) -> Result<()> {
        if self.iters == 0 {
            bail!("--iters must be at least 1: with 0 nothing would be timed or verified (flag --iters)");
        }
        self.cost.check()?;
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

/// One measured (algorithm, size) point, as rank 0 sees it.
struct Point {
    algo: String,
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
    let (a, b) = spec.split_once(':').unwrap_or((spec, spec));
    let (lo, hi) = (crate::parse_size(a)?, crate::parse_size(b)?);
    if lo < 4 || hi < lo || factor < 2 {
        bail!("--sizes {spec} must be MIN:MAX bytes with 4 ≤ MIN ≤ MAX, --factor ≥ 2");
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

/// Stops before any rank starts when the largest size cannot be held by the ranks of this
/// process (all of them in-process, or one under mpirun).
fn check_memory(sizes: &[u64], ranks_here: usize, spec: &str) -> Result<()> {
    let Some(&max) = sizes.iter().max() else {
        return Ok(());
    };
    let bytes = gradkit_core::budget::product(&[max as u128, BUFFERS_PER_RANK, ranks_here as u128]);
    gradkit_core::budget::check(
        &format!(
            "bench size {max} bytes (flag --sizes {spec}) on {ranks_here} rank(s) in this process, {BUFFERS_PER_RANK} buffers each,"
        ),
        bytes,
    )
}

/// Rank r's input: small integers times (r+1), so the exact sum is representable in f32.
/// On huge pages when large ([`huge_vec`]), as numpy allocates the mpi4py baseline's buffer.
fn pattern(r: usize, n: usize) -> Vec<f32> {
    let mut v = huge_vec(n);
    v.extend((0..n).map(|i| ((i % 13) as f32) * (r as f32 + 1.0)));
    v
}

/// One call of the reducer on `data`, which it moves in and back out (no copy).
fn one_iteration(
    comm: &dyn Comm,
    data: &mut Vec<f32>,
    layout: &Layout,
    reducer: &mut dyn Reducer,
) -> Result<()> {
    let out = reducer.reduce(comm, 0, layout, Flat::Dense(std::mem::take(data)))?;
    *data = out.result.into_dense(layout.total() as usize);
    Ok(())
}

/// The reducer for `algo` and whether it is a dense (exact) one; an error for the rest.
fn bench_reducer(algo: &str) -> Result<(Box<dyn Reducer>, bool)> {
    Ok(match algo {
        "onebit" | "onebit-naive" => (make_reducer(algo, &Params::default())?, false),
        a if dense::by_name(a).is_some() => (Box::new(dense::DenseReducer::new(a, Op::Sum)?), true),
        a => bail!("bench supports ring, rabenseifner, tree, native, onebit, onebit-naive; not `{a}` (flag --algo)"),
    })
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

fn measure(comm: &dyn Comm, algo: &str, bytes: u64, args: &BenchArgs) -> Result<Point> {
    let (p, r) = (comm.size(), comm.rank());
    let n = (bytes / 4) as usize;
    let pristine = pattern(r, n);
    let tri = (p * (p + 1) / 2) as f32;
    let layout = Layout::new(vec![(0, "buffer".into(), n as u64, None)]);
    let (mut reducer, exact) = bench_reducer(algo)?;
    let per_thread = comm.backend() != Backend::MPI;
    let mut times = Vec::with_capacity(args.iters);
    let (mut minflt, mut majflt) = (Vec::new(), Vec::new());
    let mut wrong = 0usize;
    let (mut sent, mut msgs) = (0u64, 0u64);
    let mut data = huge_vec(n);
    for it in 0..args.warmup + args.iters {
        data.clear();
        data.extend_from_slice(&pristine);
        comm.barrier()?;
        comm.traffic().reset();
        let f0 = page_faults(per_thread);
        let t0 = std::time::Instant::now();
        one_iteration(comm, &mut data, &layout, reducer.as_mut())?;
        let dt = t0.elapsed().as_secs_f64();
        let f1 = page_faults(per_thread);
        let t = comm.traffic().total();
        (sent, msgs) = (t.bytes_sent, t.msgs_sent);
        if it >= args.warmup {
            times.push(dt);
            minflt.push(f1.0.saturating_sub(f0.0) as f64);
            majflt.push(f1.1.saturating_sub(f0.1) as f64);
            if exact {
                wrong += data
                    .iter()
                    .enumerate()
                    .filter(|(i, v)| **v != (*i % 13) as f32 * tri)
                    .count();
            }
        }
    }
    // Per iteration, the slowest rank's time; then the median over iterations.
    let all = comm.allgatherv(times)?;
    let per_iter: Vec<f64> = (0..args.iters)
        .map(|i| all.iter().map(|t| t[i]).fold(0.0, f64::max))
        .collect();
    let lo = per_iter.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = per_iter.iter().copied().fold(0.0, f64::max);
    let maxes = comm.allreduce_max_f64(&[
        sent as f64,
        msgs as f64,
        wrong as f64,
        median(minflt),
        median(majflt),
    ])?;
    Ok(Point {
        algo: algo.to_string(),
        bytes,
        count: n,
        time_s: median(per_iter),
        max_over_min: if lo > 0.0 { hi / lo } else { f64::NAN },
        faults: (maxes[3], maxes[4]),
        max_bytes_sent: maxes[0] as u64,
        max_msgs: maxes[1] as u64,
        wrong: exact.then_some(maxes[2] as usize),
    })
}

pub fn run(args: BenchArgs) -> Result<()> {
    args.memory.apply();
    let world = World::init(args.ranks)?;
    let p = world.size();
    // An agreement point: a bad flag is reported once under mpirun.
    let algos: Vec<String> = args.algo.split(',').map(|s| s.trim().to_string()).collect();
    let sizes = world.agree((|| {
        for a in &algos {
            bench_reducer(a)?;
        }
        let sizes = sizes(&args.sizes, args.factor)?;
        let ranks_here = world.backend().ranks_per_process(p);
        check_memory(&sizes, ranks_here, &args.sizes)?;
        Ok(sizes)
    })())?;
    let points = world.run(|comm| {
        let mut pts = Vec::new();
        for &b in &sizes {
            for a in &algos {
                pts.push(measure(comm, a, b, &args)?);
            }
        }
        Ok(pts)
    })?;
    if !world.is_io_rank() {
        return Ok(());
    }
    let points = points.into_iter().next().unwrap_or_default();
    let (alpha, beta) = (args.cost.alpha_s(), args.cost.beta_byte_s());
    // --fit: per algorithm, t ≈ α·messages + β·bytes over its sizes (least squares).
    let mut fits: std::collections::BTreeMap<String, (f64, f64)> = Default::default();
    if args.fit {
        for a in &algos {
            let pts: Vec<(f64, f64, f64)> = points
                .iter()
                .filter(|pt| &pt.algo == a && pt.max_msgs > 0)
                .map(|pt| (pt.max_msgs as f64, pt.max_bytes_sent as f64, pt.time_s))
                .collect();
            match cost::fit_alpha_beta(&pts) {
                Some((al, be)) if al > 0.0 && be > 0.0 => {
                    fits.insert(a.clone(), (al, be));
                }
                other if !args.quiet => gradkit_core::noteln!(
                    "gradallreduce bench: {a}: no usable α-β fit ({other:?}); its model column uses the given α and β"
                ),
                _ => {}
            }
        }
    }
    let mut table = TextTable::new([
        "size_B",
        "count",
        "algo",
        "time_us",
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
    for pt in &points {
        let algbw = pt.bytes as f64 / pt.time_s / 1e9;
        let busbw = algbw * 2.0 * (p as f64 - 1.0) / p as f64;
        let (al, be) = fits.get(&pt.algo).copied().unwrap_or((alpha, beta));
        let model = cost::by_name(&pt.algo, p, pt.count as f64, 0.0)
            .map(|c| c.latency * al + c.bytes() * be);
        table.push([
            pt.bytes.to_string(),
            pt.count.to_string(),
            pt.algo.clone(),
            fmt_num(pt.time_s * 1e6, 4),
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
        sink.algo = pt.algo.clone();
        let step = pt.bytes as u32;
        for (m, v) in [
            ("size_bytes", pt.bytes as f64),
            ("time_s", pt.time_s),
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
    table.print(args.format)?;
    if !args.quiet {
        gradkit_core::noteln!(
            "gradallreduce bench: {p} {} ranks; model column: α = {:.2} µs, β = {:.3} ns/byte ({:.2} GB/s) unless fitted",
            world.backend(),
            alpha * 1e6,
            beta * 1e9,
            1e-9 / beta
        );
        for (a, (al, be)) in &fits {
            gradkit_core::noteln!(
                "  fitted {a}: α = {:.2} µs per message, β = {:.3} ns/byte ({:.2} GB/s)",
                al * 1e6,
                be * 1e9,
                1e-9 / be
            );
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
