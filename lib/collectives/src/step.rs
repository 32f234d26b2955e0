//! One step of a reducer as every caller runs it, with its measurements: `gradallreduce`'s
//! ranks (offline, on a trace) and the Python module's reducers (online, inside a training
//! loop: `python/native`, docs/PYTORCH.md § Train with it) both call [`reduce_step`], so the
//! same input gives the same result and the same `metrics/1` rows in both worlds.
//!
//! A step's rows, per rank: its traffic (`bytes_sent`, `bytes_recv`, `messages`,
//! `messages_recv`, and `bytes_sent:<phase>`… for every phase but the I/O feed's), the wall
//! time of the reduction (`time_comm_s`), the reducer's own metrics (threshold, density…),
//! `nnz` of the result and the paper's formula beside the measurement (`model_bytes_sent`).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use gradkit_comm::{dist, Comm, PhaseCounts};
use gradkit_core::trace::{Layout, MetricSink};

use crate::{Algo, Flat, Reducer};

/// Reduces this rank's `input` for `step` and pushes the step's metric rows to `sink`; gives
/// the result. `k_in` is the k the cost model takes: the target for dense input
/// ([`crate::Params::k_for`]), the input's entries for sparse.
#[allow(clippy::too_many_arguments)]
pub fn reduce_step(
    comm: &dyn Comm,
    reducer: &mut dyn Reducer,
    algo: Algo,
    layout: &Layout,
    step: u32,
    input: Flat,
    k_in: u64,
    sink: &mut MetricSink,
) -> Result<Flat> {
    let timer = Timer::start(comm, algo, step);
    let out = reducer.reduce(comm, step, layout, input);
    timer.stop(comm).settle(out, sink, algo, layout, k_in)
}

/// [`reduce_step`] of dense input reduced where it lies: `data` holds this rank's input and
/// is overwritten with the result. Reducers that can ([`Reducer::reduce_in_place`]: the dense
/// ones) touch no other copy of it; the others get a copy, as `reduce_step` would. Same
/// result bits and metric rows as `reduce_step` of `Flat::Dense(data.to_vec())`.
#[allow(clippy::too_many_arguments)]
pub fn reduce_step_in_place(
    comm: &dyn Comm,
    reducer: &mut dyn Reducer,
    algo: Algo,
    layout: &Layout,
    step: u32,
    data: &mut [f32],
    k_in: u64,
    sink: &mut MetricSink,
) -> Result<()> {
    let timer = Timer::start(comm, algo, step);
    if let Some(out) = reducer.reduce_in_place(comm, step, layout, data) {
        let measured = timer.stop(comm);
        let out = out.with_context(|| format!("step {step}"))?;
        let nnz = out.nnz.unwrap_or_else(|| nonzeros(data));
        measured.push(sink, algo, layout, k_in, &out.metrics, nnz);
        return Ok(());
    }
    let out = reducer.reduce(comm, step, layout, Flat::Dense(data.to_vec()));
    match timer.stop(comm).settle(out, sink, algo, layout, k_in)? {
        Flat::Dense(v) => data.copy_from_slice(&v[..data.len()]),
        Flat::Sparse(s) => {
            data.fill(0.0);
            for (i, v) in s.indices.iter().zip(&s.values) {
                data[*i as usize] = *v;
            }
        }
    }
    Ok(())
}

/// The entries of a dense result that are not zero (the `nnz` row).
fn nonzeros(v: &[f32]) -> usize {
    v.iter().filter(|x| **x != 0.0).count()
}

/// A step being measured: the traffic counters before the reduction and its start.
struct Timer {
    step: u32,
    before: BTreeMap<String, PhaseCounts>,
    t0: std::time::Instant,
}

/// A step measured: the counters before and after the reduction and its wall time
/// (`time_comm_s`: the reduction alone, not the caller's copies nor the `nnz` count).
struct Measured {
    step: u32,
    rank: u32,
    size: usize,
    before: BTreeMap<String, PhaseCounts>,
    after: BTreeMap<String, PhaseCounts>,
    wall: f64,
}

impl Timer {
    fn start(comm: &dyn Comm, algo: Algo, step: u32) -> Timer {
        let before = comm.traffic().snapshot();
        let t0 = std::time::Instant::now();
        comm.traffic().begin_step(step, algo.name());
        Timer { step, before, t0 }
    }

    fn stop(self, comm: &dyn Comm) -> Measured {
        comm.traffic().end_step();
        Measured {
            step: self.step,
            rank: comm.rank() as u32,
            size: comm.size(),
            wall: self.t0.elapsed().as_secs_f64(),
            after: comm.traffic().snapshot(),
            before: self.before,
        }
    }
}

impl Measured {
    /// The step's reduction `out` done: its rows pushed (with `nnz` of its result), its
    /// result given.
    fn settle(
        &self,
        out: Result<crate::StepOutput>,
        sink: &mut MetricSink,
        algo: Algo,
        layout: &Layout,
        k_in: u64,
    ) -> Result<Flat> {
        let out = out.with_context(|| format!("step {}", self.step))?;
        let nnz = match &out.result {
            Flat::Dense(v) => nonzeros(v),
            Flat::Sparse(s) => s.len(),
        };
        self.push(sink, algo, layout, k_in, &out.metrics, nnz);
        Ok(out.result)
    }

    /// Pushes the step's rows: its traffic, `time_comm_s`, the reducer's `metrics`, `nnz`,
    /// and the paper's formula beside the measurement.
    fn push(
        &self,
        sink: &mut MetricSink,
        algo: Algo,
        layout: &Layout,
        k_in: u64,
        metrics: &[(String, f64)],
        nnz: usize,
    ) {
        let (step, rank) = (self.step, self.rank);
        record(sink, step, rank, &self.before, &self.after, self.wall);
        for (name, v) in metrics {
            sink.push(step, rank, name, *v);
        }
        sink.push(step, rank, "nnz", nnz as f64);
        // The paper's formula beside the measurement (the descriptor's: Table 1's best case
        // where it gives an interval, Ok-Topk's worst; k = the target for dense input, the
        // input's nnz for sparse).
        if let Some(c) = algo.cost(self.size, layout.total() as f64, k_in as f64) {
            sink.push(step, rank, "model_bytes_sent", c.bytes());
        }
    }
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
            let mut push =
                |what: &str, v: f64| sink.push(step, rank, &format!("{what}:{phase}"), v);
            push("bytes_sent", d.bytes_sent as f64);
            push("bytes_recv", d.bytes_recv as f64);
            push("messages", d.msgs_sent as f64);
            push("time_s", d.seconds);
        }
    }
    sink.push(step, rank, "bytes_sent", total.bytes_sent as f64);
    sink.push(step, rank, "bytes_recv", total.bytes_recv as f64);
    sink.push(step, rank, "messages", total.msgs_sent as f64);
    sink.push(step, rank, "messages_recv", total.msgs_recv as f64);
    sink.push(step, rank, "time_comm_s", wall);
}
