//! `gradallreduce [--algo …] IN -o OUT`: reduce a trace step by step.

use anyhow::{bail, Context, Result};
use gradkit_collectives::feed::{hand_over_metrics, IoRank, MetricsOut, METRICS_EVERY};
use gradkit_collectives::{reducer_for, Algo, Family, Flat, Params, Reducer};
use gradkit_comm::dist::{self, Piece, Round};
use gradkit_comm::{Comm, World};
use gradkit_core::io::{Expect, KeyScan, TableWriter, TraceReader};
use gradkit_core::paths::TempFile;
use gradkit_core::trace::{self, Layout, MetricSink};
use gradkit_core::{read_table, Input, Meta, Output, PlanRow, TensorRow};

use crate::state;

mod args;

pub use args::ReduceArgs;

/// What the I/O rank prepares before any rank starts: the trace opened and its first run of
/// rows read (the whole first step is checked as it is handed out), the `--state` file, the
/// output opened (docs/MEMORY.md).
struct Prepared {
    /// Elements of the flat index space (the 1-bit state file records it).
    n: u64,
    /// `--state`: the saved 1-bit errors, checked and not read yet (read one buffer at a
    /// time as the feed hands them out: [`state::StateReader::piece`]); `None` without
    /// `--state` or when the file does not exist yet.
    state: Option<state::StateReader>,
    /// The trace and the output, for rank 0 while the ranks run.
    io: IoRank,
}

/// Opens the trace on the I/O rank and checks what can be checked before any rank starts:
/// ranks equal to the world's size, the first step complete (the others are checked as they
/// are read), the memory the run needs, `--plan`; reads the `--state` file when it exists and
/// checks it fits this run; opens the output. The trace is read one step at a time
/// ([`TensorStream`]); a trace not ordered by step may be read whole (docs/MEMORY.md).
fn load(
    args: &ReduceArgs,
    world: &World,
    out: &Output,
    metrics: Option<&Output>,
) -> Result<Prepared> {
    let input = args.io.input()?;
    let mut trace = TraceReader::open(&input, args.io.read_options(), Expect::any())?;
    let source = trace.source.clone();
    let p = trace.ranks();
    let meta_in = trace.meta.clone();
    let first_step = trace.first_step();
    // The first run of rows (one rank's rows of the first step): whether the input is sparse,
    // for the memory check; the whole first step is checked as it is handed out.
    let first = trace.next_run(usize::MAX)?.unwrap_or_default();
    let layout = trace.layout.clone();
    if p != world.size() {
        bail!(
            "{source} holds {p} ranks but this run has {} (flag --ranks, or mpirun -np)",
            world.size()
        );
    }
    let ranks_here = world.backend().ranks_per_process(world.size());
    check_memory(args.algo, &first, &layout, ranks_here, world.size())
        .with_context(|| format!("in {source}"))?;
    if let Some(path) = &args.plan {
        check_plan(path, args.algo, &layout, world.size(), first_step)
            .with_context(|| format!("--plan {}", path.display()))?;
    }
    let n = layout.total();
    let state = match (&args.state, state::variant_of(args.algo)) {
        (Some(path), Some(variant)) if path.exists() => Some(state::StateFile::open(
            path,
            variant,
            world.size(),
            n as usize,
        )?),
        _ => None,
    };
    // Last, once every check passed: rows go out as the steps complete.
    let writer = TableWriter::create(out, &out_meta(args, world, &meta_in))?;
    let metrics = MetricsOut {
        writer: match metrics {
            Some(m) => {
                let mut mm = Meta::producer("gradallreduce");
                mm.set("algo", args.algo).set("world_size", world.size());
                Some(TableWriter::create(m, &mm)?)
            }
            None => None,
        },
        bytes_sent: Vec::new(),
        time_comm_s: Vec::new(),
    };
    Ok(Prepared {
        n,
        state,
        io: IoRank::new(trace, first, args.algo, p, writer, metrics),
    })
}

/// In-process ranks when `--ranks` is not given: as many as the input trace holds (a file;
/// stdin cannot be read twice, so it runs 1 unless told). None under mpirun, which gives the
/// count, and where the trace cannot be read: `load` then says why, with its checks.
fn trace_ranks(args: &ReduceArgs) -> Option<usize> {
    if gradkit_core::process::under_mpi_launcher() {
        return None;
    }
    let path = args.io.input.as_ref().filter(|p| p.as_os_str() != "-")?;
    let input = gradkit_core::Input::Path(path.clone());
    let stream = gradkit_core::io::TensorStream::open(&input, args.io.read_options()).ok()?;
    let p = stream.scan().ok()?.ranks.len();
    (1..=gradkit_comm::launch::MAX_LOCAL_RANKS)
        .contains(&p)
        .then_some(p)
}

/// The reduced tensor's metadata.
fn out_meta(args: &ReduceArgs, world: &World, meta_in: &Meta) -> Meta {
    let mut meta = Meta::producer("gradallreduce");
    meta.set("world_size", world.size())
        .set("method", args.algo)
        .set("algo", args.algo)
        .set("op", args.op)
        .set("density", args.density)
        .set("backend", world.backend());
    if let Some(m) = meta_in.get("gradkit.method") {
        meta.set("input_method", m);
    }
    meta
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
    use gradkit_collectives::plan::check;
    let Some(kind) = algo.plan_kind() else {
        return Ok(()); // refused by check_flags
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
/// (input, working copy, received chunks, result; 1-bit: error buffers) and rank 0 one more,
/// the result being written (the trace streams one step at a time: docs/MEMORY.md); sparse
/// algorithms densify their region (n/P; counted twice for the temporaries) and, for dense
/// input, keep a residual of the model per rank. `rows`: the first step.
fn check_memory(
    algo: Algo,
    rows: &[TensorRow],
    layout: &Layout,
    ranks_here: usize,
    world: usize,
) -> Result<()> {
    use gradkit_core::budget;
    let n: u128 = layout.layers.iter().map(|l| l.numel as u128).sum();
    // Every family but the sparse one gives a dense result.
    let dense_result = algo.family() != Family::Sparse;
    let any_sparse = rows.iter().any(|r| !r.is_dense());
    if (!dense_result || any_sparse) && n > u32::MAX as u128 + 1 {
        bail!(
            "the layers hold {n} elements in all (column `numel`), more than the 2^32 positions sparse indices (UInt32) can address"
        );
    }
    let bytes = if dense_result {
        budget::product(&[n, 4, 4 * ranks_here as u128 + 1])
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
    // --state is read when it exists and written after the last step: where it cannot be
    // created the run stops now, not after every step.
    if let Some(state) = &args.state {
        gradkit_core::paths::check_creatable("--state", state)?;
    }
    if let Some(path) = &args.comm_trace {
        gradkit_core::paths::check_creatable("--comm-trace", path)?;
    }
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
            ("--comm-trace", args.comm_trace.as_deref()),
        ],
    )
}

/// What one rank returns: with `--state` (rank 0) the state file written after the last step
/// (complete, not yet named), and (rank 0) the outputs being written, or why the I/O rank
/// stopped.
struct RankOut {
    /// Rank 0: the `--state` file (it is written before the last metrics are handed over,
    /// while every rank is still there to send its errors).
    saved: Result<Option<TempFile>>,
    io: Option<Result<(TableWriter<TensorRow>, MetricsOut)>>,
}

pub fn run(args: ReduceArgs) -> Result<()> {
    args.memory.apply();
    let world = World::init(args.ranks.or_else(|| trace_ranks(&args)))?;
    // The device's kernels first (`--device cuda` without CUDA stops here, before any file is
    // touched), then the checks every rank makes alike (flags, the algorithm's parameters),
    // then the I/O rank's (output, input): each is an agreement point, so a mistake is
    // reported once under mpirun.
    let kernels = world.agree(gradkit_cuda::kernels_for(args.device).map_err(Into::into))?;
    world.agree(gradkit_cuda::backend::check(args.backend))?;
    world.agree(check_paths(&args))?;
    let params = world.agree(args.params().and_then(|mut params| {
        params.kernels = kernels;
        // The sparse reducers keep their tensors on the GPU (docs/GPU.md §7).
        params.resident = gradkit_cuda::resident_for(args.device)?;
        // Validate the algorithm's parameters before reading anything.
        reducer_for(args.algo, &params)?;
        Ok(params)
    }))?;
    let prepared = if world.is_io_rank() {
        args.io.output().and_then(|out| {
            let metrics = gradkit_core::cli::output_flag("--metrics", args.metrics.as_deref())?;
            let loaded = load(&args, &world, &out, metrics.as_ref())?;
            Ok(Some(loaded))
        })
    } else {
        Ok(None)
    };
    let loaded = world.agree(prepared)?;
    let n = loaded.as_ref().map_or(0, |p| p.n);
    let (io, state_in) = loaded.map(|p| (p.io, p.state)).unzip();
    // The --state file, read by rank 0 as the feed hands each rank its buffers (moved, not
    // copied, in-process).
    let state_in = std::sync::Mutex::new(state_in.flatten());
    // Rank 0 streams the trace to every rank, step by step, and writes the output.
    let io = std::sync::Mutex::new(io);
    let feed = dist::Feed::<TensorRow>::new(world.backend(), world.size());
    let run_name = args
        .run
        .clone()
        .unwrap_or_else(|| gradkit_core::cli::default_run_name(args.algo.name(), args.keep()));
    let quiet = args.io.quiet;

    let results = world.run(|comm| {
        let inputs = RankIn {
            feed: &feed,
            state: &state_in,
            n,
        };
        let io = match comm.rank() {
            0 => io.lock().unwrap_or_else(|e| e.into_inner()).take(),
            _ => None,
        };
        reduce_rank(comm, &args, &params, inputs, io, &run_name, quiet)
    })?;

    let written = match results.into_iter().reduce(merge) {
        Some(r) if world.is_io_rank() => match (r.io, r.saved) {
            (Some(Ok((writer, metrics))), Ok(state)) => {
                write_outputs(&args, &world, writer, metrics, state)
            }
            (Some(Ok(_)), Err(e)) => Err(e),
            // A bad step or a failed write: the I/O rank stopped every rank.
            (Some(Err(e)), _) => Err(e),
            (None, _) => Err(anyhow::anyhow!("internal: rank 0 returned no output")),
        },
        _ => Ok(()),
    };
    // The last agreement point: the other ranks wait here while rank 0 writes, and learn of
    // an error the I/O rank met while streaming (printed once, by it).
    world.agree(written)
}

/// The I/O rank's outputs, every row already written as the steps completed: the reduced
/// tensor, the metrics and the `--state` file are closed and then committed together
/// ([`gradkit_core::paths::commit_all`]: none appears unless all can), then the summary on
/// stderr.
fn write_outputs(
    args: &ReduceArgs,
    world: &World,
    writer: TableWriter<TensorRow>,
    metrics: MetricsOut,
    state: Option<TempFile>,
) -> Result<()> {
    let MetricsOut {
        writer: metrics_writer,
        bytes_sent,
        time_comm_s,
    } = metrics;
    let mut files: Vec<TempFile> = writer.close()?.into_iter().collect();
    if let Some(w) = metrics_writer {
        files.extend(w.close()?);
    }
    files.extend(state);
    gradkit_core::paths::commit_all(files)?;
    if !args.io.quiet {
        summarize(bytes_sent, time_comm_s, world.size());
        if let Some(line) = gradkit_cuda::transfer_note("gradallreduce", args.device) {
            gradkit_core::noteln!("{line}");
        }
    }
    Ok(())
}

fn merge(mut a: RankOut, b: RankOut) -> RankOut {
    a.saved = match (a.saved, b.saved) {
        (Err(e), _) | (_, Err(e)) => Err(e),
        (Ok(x), Ok(y)) => Ok(x.or(y)),
    };
    a.io = a.io.or(b.io);
    a
}

/// What every rank gets from the I/O rank: the feed of the trace's steps, and the `--state`
/// file (rank 0 takes it and hands each rank its own buffers in the feed's first round, read
/// one buffer at a time).
#[derive(Clone, Copy)]
struct RankIn<'a> {
    feed: &'a dist::Feed<TensorRow>,
    /// Elements of the flat index space (rank 0; what the `--state` file records).
    n: u64,
    state: &'a std::sync::Mutex<Option<state::StateReader>>,
}

/// One rank's reduction, step by step: in every round rank 0 (`io`) reads the next step and
/// hands each rank its rows ([`dist::Feed`]), every rank reduces them with its long-lived
/// reducer, and rank 0 writes the result before the next round. When the I/O rank stops (a
/// bad step, a failed write) every rank leaves the loop at the same round and skips the
/// collectives that follow; the error travels in the result to the last agreement point.
fn reduce_rank(
    comm: &dyn Comm,
    args: &ReduceArgs,
    params: &Params,
    inputs: RankIn<'_>,
    mut io: Option<IoRank>,
    run_name: &str,
    quiet: bool,
) -> Result<RankOut> {
    let mut reducer = reducer_for(args.algo, params)?;
    // `--backend nccl`: the reducer's messages over NCCL, the trace's feed on the host.
    let nccl = gradkit_cuda::backend::open(args.backend, comm)?;
    let host = comm;
    let comm: &dyn Comm = nccl.as_deref().unwrap_or(host);
    if args.comm_trace.is_some() {
        comm.traffic().start_recording(comm.rank());
    }
    if let Some(path) = &args.state {
        load_state(host, path, &inputs, io.as_mut(), reducer.as_mut())?;
    }
    let algo = args.algo.name();
    let mut sink = MetricSink::new(run_name, "gradallreduce", algo, comm.size() as u32)
        .with_settings(gradkit_core::RunSettings {
            density: match args.keep() {
                Some(gradkit_core::cli::Keep::Density(d)) => Some(d),
                _ => None,
            },
            ..Default::default()
        });
    let steps = io.as_ref().map_or(0, |io| io.trace.steps().len());
    let bar = gradkit_core::cli::progress("reduce", steps as u64, quiet || comm.rank() != 0);
    let mut layouts: Option<Layouts> = None;
    // Steps done, for the metrics' hand-overs (every rank counts the same rounds).
    let mut handed = 0u32;
    loop {
        let round = match io.as_mut() {
            Some(io) => inputs.feed.round_from(host, Some(&mut || io.piece()))?,
            None => inputs.feed.round_from(host, None)?,
        };
        let mine = match round {
            Round::Rows(rows) => rows,
            Round::End => break,
            Round::Stop => {
                // Every rank left at the same round: none runs the collectives below.
                bar.finish_and_clear();
                return Ok(RankOut {
                    saved: Ok(None),
                    io: io.map(|io| {
                        Err(io.failed.unwrap_or_else(|| {
                            anyhow::anyhow!("internal: stopped without an error")
                        }))
                    }),
                });
            }
        };
        let mut step = StepCtx {
            comm,
            args,
            params,
            sink: &mut sink,
            layouts: &mut layouts,
        };
        step.reduce(reducer.as_mut(), mine, io.as_mut())?;
        handed += 1;
        if handed.is_multiple_of(METRICS_EVERY) {
            hand_over_metrics(comm, &mut sink, io.as_mut())?;
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    finish_rank(comm, args, &inputs, reducer, sink, io)
}

/// After the last step: the reducer's last messages, `--comm-trace`, every rank's `--state`
/// errors to the I/O rank (which saves them), the last metrics; the I/O rank's outputs.
fn finish_rank(
    comm: &dyn Comm,
    args: &ReduceArgs,
    inputs: &RankIn<'_>,
    mut reducer: Box<dyn Reducer>,
    mut sink: MetricSink,
    mut io: Option<IoRank>,
) -> Result<RankOut> {
    let algo = args.algo.name();
    reducer.finish(comm)?;
    if let Some(path) = &args.comm_trace {
        save_comm_trace(comm, path, algo)?;
    }
    // --state: every rank's errors after the last step, to the I/O rank, which saves them.
    // The reducer's buffers are moved out (not copied) and it is dropped.
    let state = args.state.is_some().then(|| reducer.take_state());
    drop(reducer);
    let saved = match (state, &args.state, state::variant_of(args.algo)) {
        (Some(st), Some(path), Some(variant)) => {
            let target = (comm.rank() == 0).then_some((path.as_path(), variant, inputs.n as usize));
            state::save_gathered(comm, st, target)
        }
        _ => Ok(None),
    };
    hand_over_metrics(comm, &mut sink, io.as_mut())?;
    Ok(RankOut {
        saved,
        io: io.map(|io| match io.failed {
            Some(e) => Err(e),
            None => Ok((io.writer, io.metrics)),
        }),
    })
}

/// --state: this rank's saved errors, before the first step (none on a fresh start). Rank 0
/// reads the file as the feed's round asks for it and hands each piece to its rank (under
/// mpirun sent before the next is read, 2 MiB at most; in-process whole buffers, moved), so no
/// process holds every rank's errors twice; every rank takes part. A failed read stops every
/// rank at the first step (`IoRank::failed`).
fn load_state(
    comm: &dyn Comm,
    path: &std::path::Path,
    inputs: &RankIn<'_>,
    io: Option<&mut IoRank>,
    reducer: &mut dyn Reducer,
) -> Result<()> {
    let round = match io {
        Some(io) => {
            let mut file = inputs
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            let max = match comm.backend().in_process() {
                true => usize::MAX,
                false => state::PIECE_VALUES,
            };
            let failed = &mut io.failed;
            let mut source = || match file.as_mut() {
                Some(f) => f.piece(max, failed),
                None => Piece::Done,
            };
            inputs.feed.round_from(comm, Some(&mut source))?
        }
        None => inputs.feed.round_from(comm, None)?,
    };
    let saved = match round {
        Round::Rows(rows) => rows,
        Round::End | Round::Stop => Vec::new(),
    };
    reducer
        .load_state_owned(state::from_rows(saved))
        .with_context(|| format!("--state {}", path.display()))
}

/// (layout, reducer_layout), from this rank's rows of the first step: every step has the same
/// layers (the I/O rank checks each); rank 0 takes the shapes the whole trace gives.
type Layouts = (Layout, Layout);

/// What one step of one rank needs besides its rows.
struct StepCtx<'a> {
    comm: &'a dyn Comm,
    args: &'a ReduceArgs,
    params: &'a Params,
    sink: &'a mut MetricSink,
    layouts: &'a mut Option<Layouts>,
}

impl StepCtx<'_> {
    /// Reduces this rank's rows of one step, records its traffic and metrics, and (rank 0)
    /// writes the result.
    fn reduce(
        &mut self,
        reducer: &mut dyn Reducer,
        mut mine: Vec<TensorRow>,
        io: Option<&mut IoRank>,
    ) -> Result<()> {
        let (comm, rank) = (self.comm, self.comm.rank() as u32);
        // Each rank's rows of a step in `layer_id` order, as `trace::group_step_rank` gives them.
        mine.sort_by_key(|r| r.layer_id);
        let step = mine
            .first()
            .map(|r| r.step)
            .context("internal: a step without rows for this rank")?;
        // EmbRace's exchange takes sparse embedding rows beside dense layers: the layers given
        // sparse are the embedding tables (their 2-D shape stays in the layout the reducer sees).
        let hybrid = self.args.algo.family() == Family::Embedding;
        let scan = io.as_ref().map(|io| &io.trace.scan);
        let (layout, reducer_layout) = self
            .layouts
            .get_or_insert_with(|| layouts_of(&mine, scan, hybrid));
        let (input, k_in) = flat_input(mine, layout, hybrid, self.params, step, rank)?;
        let result = gradkit_collectives::step::reduce_step(
            comm,
            reducer,
            self.args.algo,
            reducer_layout,
            step,
            input,
            k_in,
            self.sink,
        )?;
        if let Some(io) = io {
            io.write(result, layout, step);
        }
        Ok(())
    }
}

/// The layouts of [`Layouts`] from this rank's rows of the first step.
fn layouts_of(mine: &[TensorRow], scan: Option<&KeyScan>, hybrid: bool) -> Layouts {
    let mut layout = Layout::of_rows(mine);
    if let Some(scan) = scan {
        scan.complete_shapes(&mut layout);
    }
    let mut reducer_layout = layout.clone();
    if hybrid {
        for info in &mut reducer_layout.layers {
            if mine
                .iter()
                .any(|r| r.layer_id == info.layer_id && r.is_dense())
            {
                info.shape = None;
            }
        }
    }
    (layout, reducer_layout)
}

/// This rank's rows of a step as the reducer's flat input (the rows and the flat input are
/// not both held: docs/MEMORY.md), and the k the cost model takes: the target for dense input,
/// the input's entries for sparse.
fn flat_input(
    mine: Vec<TensorRow>,
    layout: &Layout,
    hybrid: bool,
    params: &Params,
    step: u32,
    rank: u32,
) -> Result<(Flat, u64)> {
    let dense = mine.iter().all(|r| r.is_dense()) && !hybrid;
    let sparse = mine.iter().all(|r| !r.is_dense()) || hybrid;
    if !dense && !sparse {
        bail!(
            "step {step} rank {rank}: mixed dense and sparse rows (column `indices`); give all-dense or all-sparse input"
        );
    }
    let n = layout.total();
    if dense {
        return Ok((
            Flat::Dense(trace::take_flat(mine, n as usize)),
            params.k_for(n),
        ));
    }
    let k_in = mine.iter().map(|r| r.stored() as u64).sum();
    let rows: Vec<&TensorRow> = mine.iter().collect();
    let s = Flat::Sparse(trace::flatten_sparse(&rows, layout));
    Ok((s, k_in))
}

/// `--comm-trace`: every rank's recorded messages gathered to rank 0, which writes them
/// (commtrace/1, atomically) with the algorithm and the backend (collective: every rank calls
/// it).
pub(crate) fn save_comm_trace(comm: &dyn Comm, path: &std::path::Path, algo: &str) -> Result<()> {
    if let Some(rows) = gradkit_comm::record::gather_recording(comm)? {
        let mut meta = gradkit_core::Meta::producer("gradallreduce");
        meta.set("algo", algo).set("backend", comm.backend());
        gradkit_core::write_comm_trace(path, meta, comm.size(), &rows)?;
    }
    Ok(())
}

/// A short human summary on stderr: median bytes and time per step over ranks.
fn summarize(mut b: Vec<f64>, mut t: Vec<f64>, p: usize) {
    b.sort_by(f64::total_cmp);
    t.sort_by(f64::total_cmp);
    let med = |v: &[f64]| if v.is_empty() { 0.0 } else { v[v.len() / 2] };
    gradkit_core::noteln!(
        "gradallreduce: {} ranks, {} steps; per rank and step: median {} bytes sent (max {}), median {:.3} ms",
        p,
        b.len() / p.max(1),
        med(&b) as u64,
        b.last().copied().unwrap_or(0.0) as u64,
        med(&t) * 1e3
    );
}
