//! The I/O rank's side of a streamed reduction (gradallreduce; docs/MEMORY.md): rank 0 hands
//! the trace out one run of rows at a time ([`dist::Feed`]), checks each step as it goes, and
//! writes the reduced tensor and the metrics as they arrive.
//!
//! The protocol, per step: [`IoRank::piece`] gives the feed's next piece (a run of one rank's
//! rows, `Done` once the step was read and checked, the end of the trace, or a stop after a
//! failure); every rank reduces its rows; [`IoRank::write`] appends the step's result; every
//! [`METRICS_EVERY`] steps (and after the last) [`hand_over_metrics`] gathers every rank's
//! metric rows to rank 0, which writes them ([`MetricsOut`]). The first failure is kept in
//! [`IoRank::failed`] and stops the feed at its next round, to be reported once.
//!
//! The files are opened by the tool (`TraceReader::open`, `TableWriter::create`) and closed and
//! committed by it: this module only reads the reader and writes the writers it is handed.

use anyhow::{bail, Context, Result};
use gradkit_comm::dist::{self, Piece};
use gradkit_comm::Comm;
use gradkit_core::io::{TableWriter, TraceReader};
use gradkit_core::trace::{self, Layout, MetricSink};
use gradkit_core::{MetricRow, TensorRow};

use crate::{alltoall, Algo, Family, Flat};

/// The I/O rank's side of the reduction: the trace one step at a time, handed out one run of
/// rows (one rank's rows of the step, in a trace ordered by step, rank and layer) at a time
/// ([`dist::Piece`]), each step checked as the whole-trace check did, and the reduced tensor
/// written as each step completes (one row group per step). Memory (docs/MEMORY.md): under
/// mpirun rank 0 holds its own rows of the step, one piece of another rank's rows and its
/// encoding, and less than [`PIECE_BYTES`] per rank held back; in-process ranks one step.
pub struct IoRank {
    /// The trace, checked up to its first step's layers (those every step must have).
    pub trace: TraceReader,
    /// The first run of rows, read by the tool for its checks and not yet handed out.
    first: Option<Vec<TensorRow>>,
    pub algo: Algo,
    /// The trace's ranks (the world's size).
    pub p: usize,
    /// The step being handed out.
    cur: Option<StepCheck>,
    /// The reduced tensor, closed and committed by the tool after the last step.
    pub writer: TableWriter<TensorRow>,
    /// The metrics, streamed as every rank's rows arrive.
    pub metrics: MetricsOut,
    /// Why the I/O rank stopped handing out steps (a bad step, a failed write); reported at
    /// the last agreement point, once, by the I/O rank.
    pub failed: Option<anyhow::Error>,
}

/// The size of the pieces another rank's rows go out in under mpirun (values and indices):
/// rank 0 reads this much of a rank's run of rows and sends it before reading on, and the
/// rows of a step whose ranks are interleaved are held back for their rank up to this size
/// rather than sent one message per short run.
pub const PIECE_BYTES: usize = 2 << 20;

/// What the I/O rank keeps of the step it is handing out, for the checks the whole-step check
/// made: the rows' keys (no values), the first alltoall embedding error, and the rows held
/// back for each rank ([`PIECE_BYTES`]).
struct StepCheck {
    step: u32,
    keys: Vec<TensorRow>,
    embedding: Option<anyhow::Error>,
    /// Per rank: rows not handed out yet, and their bytes.
    held: Vec<(Vec<TensorRow>, usize)>,
}

impl StepCheck {
    fn new(step: u32, p: usize) -> Self {
        StepCheck {
            step,
            keys: Vec::new(),
            embedding: None,
            held: (0..p).map(|_| (Vec::new(), 0)).collect(),
        }
    }

    /// Takes a run of rows of one rank: notes their keys and checks, and gives back the rows
    /// to hand out now (rank 0's at once; another rank's once [`PIECE_BYTES`] are held).
    fn add(&mut self, run: Vec<TensorRow>, algo: Algo) -> Option<(usize, Vec<TensorRow>)> {
        let p = self.held.len();
        let d = run.first().map_or(0, |r| r.rank as usize % p);
        self.keys.extend(run.iter().map(TensorRow::key));
        if algo.family() == Family::Embedding && self.embedding.is_none() {
            self.embedding = alltoall::check_embedding_rows(&run).err();
        }
        let bytes: usize = run
            .iter()
            .map(|r| 4 * (r.values.len() + r.indices.as_ref().map_or(0, Vec::len)))
            .sum();
        let held = &mut self.held[d];
        held.0.extend(run);
        held.1 += bytes;
        (d == 0 || held.1 >= PIECE_BYTES).then(|| (d, std::mem::take(held).0))
    }

    /// Rows still held for some rank (at the end of the step).
    fn take_held(&mut self) -> Option<(usize, Vec<TensorRow>)> {
        let d = self.held.iter().position(|h| !h.0.is_empty())?;
        Some((d, std::mem::take(&mut self.held[d]).0))
    }
}

impl IoRank {
    /// The I/O rank's side, before the first round: `trace` opened and checked up to its
    /// first step's layers, `first` its first run of rows (read for the tool's checks, not
    /// handed out yet), `p` the world's size, the outputs opened.
    pub fn new(
        trace: TraceReader,
        first: Vec<TensorRow>,
        algo: Algo,
        p: usize,
        writer: TableWriter<TensorRow>,
        metrics: MetricsOut,
    ) -> Self {
        IoRank {
            trace,
            first: Some(first),
            algo,
            p,
            cur: None,
            writer,
            metrics,
            failed: None,
        }
    }

    /// The next piece of the feed's round ([`dist::Feed::round_from`]): a run of the next
    /// step's rows for its rank, `Done` once the step was read and checked, the end of the
    /// trace, or a stop once something failed (the rows already sent are then dropped).
    pub fn piece(&mut self) -> Piece<TensorRow> {
        match self.try_piece() {
            Ok(piece) => piece,
            Err(e) => {
                self.failed = Some(e);
                self.cur = None;
                Piece::Stop
            }
        }
    }

    fn try_piece(&mut self) -> Result<Piece<TensorRow>> {
        if self.failed.is_some() {
            return Ok(Piece::Stop);
        }
        loop {
            let next = self.peek_step()?;
            let step = match &self.cur {
                Some(cur) => cur.step,
                None => match next {
                    Some(step) => self.cur.insert(StepCheck::new(step, self.p)).step,
                    None => return Ok(Piece::End),
                },
            };
            let Some(cur) = self.cur.as_mut() else {
                bail!("internal: no step being handed out");
            };
            if next != Some(step) {
                // The step ended: the rows still held go out, then the checks decide.
                if let Some((d, rows)) = cur.take_held() {
                    return Ok(Piece::Rows(d, rows));
                }
                let cur = self.cur.take();
                self.check(cur)?;
                return Ok(Piece::Done);
            }
            let run = match self.first.take() {
                Some(run) => run,
                None => self
                    .trace
                    .next_run(PIECE_BYTES)?
                    .context("internal: a run went missing")?,
            };
            let Some(cur) = self.cur.as_mut() else {
                bail!("internal: no step being handed out");
            };
            if let Some((d, rows)) = cur.add(run, self.algo) {
                return Ok(Piece::Rows(d, rows));
            }
        }
    }

    /// The step of the next run of rows; `None` at the end of the trace.
    fn peek_step(&mut self) -> Result<Option<u32>> {
        match &self.first {
            Some(run) => Ok(run.first().map(|r| r.step)),
            None => self.trace.peek_step(),
        }
    }

    /// What the whole-trace check (`trace::check_complete`, and for alltoall the embedding
    /// rows) said of one step, with its messages: every rank has rows, each the layers of the
    /// first step.
    fn check(&mut self, cur: Option<StepCheck>) -> Result<()> {
        let cur = cur.context("internal: no step being handed out")?;
        self.trace.check(&cur.keys)?;
        let source = &self.trace.source;
        match cur.embedding {
            Some(e) => Err(e.context(format!("in {source}"))),
            None => Ok(()),
        }
    }

    /// Appends a step's reduced tensor to the output as rows of rank 0 (nothing once
    /// something failed), and ends the step, so that its row group goes to the file now: a
    /// dense result is written from the flat vector itself, not copied into rows
    /// (`write_dense_step` ends the step); a sparse one is split into rows and dropped before
    /// they are written (docs/MEMORY.md).
    pub fn write(&mut self, result: Flat, layout: &Layout, step: u32) {
        if self.failed.is_some() {
            return;
        }
        let done = match result {
            Flat::Dense(v) => self.writer.write_dense_step(&v, layout, step, 0),
            Flat::Sparse(s) => {
                let rows = trace::unflatten_sparse(&s, layout, step, 0);
                drop(s);
                self.writer
                    .write_owned(rows)
                    .and_then(|()| self.writer.end_step(step))
            }
        };
        if let Err(e) = done {
            self.failed = Some(e);
        }
    }
}

/// Every rank hands its metric rows to the I/O rank after this many steps (and after the
/// last): what a rank holds of them is bounded by the steps between two hand-overs, not by
/// the length of the run.
pub const METRICS_EVERY: u32 = 64;

/// The I/O rank's side of the metrics: the `--metrics` table, written as the rows arrive in
/// (step, rank) order, and the two numbers per rank and step the closing summary takes its
/// medians of (16 bytes a rank and step, not the rows).
pub struct MetricsOut {
    pub writer: Option<TableWriter<MetricRow>>,
    pub bytes_sent: Vec<f64>,
    pub time_comm_s: Vec<f64>,
}

impl MetricsOut {
    /// Takes one hand-over of every rank's rows (rank order, as [`dist::gather`] gives them).
    pub fn take(&mut self, mut rows: Vec<MetricRow>) -> Result<()> {
        // Stable: a rank's rows of a step stay in the order it pushed them.
        rows.sort_by_key(|r| (r.step, r.rank));
        for r in &rows {
            match r.metric.as_str() {
                "bytes_sent" => self.bytes_sent.push(r.value),
                "time_comm_s" => self.time_comm_s.push(r.value),
                _ => {}
            }
        }
        match &mut self.writer {
            Some(w) => w.write_owned(rows),
            None => Ok(()),
        }
    }
}

/// Collective: every rank's metric rows so far go to the I/O rank, which writes them. A failed
/// write stops the I/O rank's feed at the next round, as a failed output write does.
pub fn hand_over_metrics(
    comm: &dyn Comm,
    sink: &mut MetricSink,
    io: Option<&mut IoRank>,
) -> Result<()> {
    let rows = dist::gather(comm, std::mem::take(&mut sink.rows))?;
    if let (Some(io), Some(rows)) = (io, rows) {
        if io.failed.is_none() {
            if let Err(e) = io.metrics.take(rows) {
                io.failed = Some(e);
            }
        }
    }
    Ok(())
}
