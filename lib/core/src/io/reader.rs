//! The one way a tool opens its input trace (gradselect, gradpartition, gradallreduce): the
//! checks every tool makes before its first step — rows at all, ranks `0..P`, the first
//! step's layers — and each step checked as it is read, with the same messages in every tool.
//! Like xsv's `Config`, it is opened once with what the tool expects of its input.

use anyhow::{bail, Context, Result};

use super::TensorSteps;
use super::{check_ranks, check_step, Input, KeyScan, Meta, ReadOptions, TensorStream};
use crate::tables::TensorRow;
use crate::trace::Layout;

/// What a tool expects of its input trace, for the checks and their messages.
#[derive(Clone, Debug, Default)]
pub struct Expect {
    /// `Some(true)`: dense rows only; `Some(false)`: sparse rows only; `None`: either.
    pub dense: Option<bool>,
    /// What the tool needs, said when a check fails (e.g. "gradselect needs a dense tensor/1
    /// trace, e.g. from `gradtrace synthetic`"); without it the message names the input.
    pub needs: Option<String>,
}

impl Expect {
    /// Dense rows, e.g. gradselect's and DEFT's input.
    pub fn dense(needs: impl Into<String>) -> Self {
        Expect {
            dense: Some(true),
            needs: Some(needs.into()),
        }
    }

    /// Sparse rows, e.g. Ok-Topk's partition of local selections.
    pub fn sparse(needs: impl Into<String>) -> Self {
        Expect {
            dense: Some(false),
            needs: Some(needs.into()),
        }
    }

    /// Dense or sparse rows.
    pub fn any() -> Self {
        Expect::default()
    }
}

/// A `tensor/1` input opened and checked up to its first step, then read one step (or one run
/// of a `(step, rank)`) at a time ([`TensorSteps`], docs/MEMORY.md).
pub struct TraceReader {
    /// The input's name, for messages (`<stdin>` or the path).
    pub source: String,
    /// The file's key-value metadata.
    pub meta: Meta,
    /// The first pass over the key columns: steps, ranks, row groups.
    pub scan: KeyScan,
    /// The first step's layers (from the key columns alone: no values are read), each with the
    /// first shape the trace gives it. Every step is checked against it.
    pub layout: Layout,
    steps: TensorSteps,
    expect: Expect,
}

impl TraceReader {
    /// Opens `input`, reads its key columns and checks what can be checked before a step is
    /// read: the trace has rows, its ranks are `0..P` without gaps, the first step's layers.
    pub fn open(input: &Input, opts: ReadOptions, expect: Expect) -> Result<Self> {
        let stream = TensorStream::open(input, opts)?;
        let scan = stream.scan()?;
        let source = stream.source.clone();
        let Some(&first) = scan.steps.first().filter(|_| scan.rows > 0) else {
            bail!("{source}: the trace has no rows");
        };
        check_ranks(&scan.ranks).with_context(|| context(&expect, &source))?;
        let mut layout = stream.step_layout(&scan, first)?;
        scan.complete_shapes(&mut layout);
        Ok(TraceReader {
            source,
            meta: stream.meta.clone(),
            steps: stream.steps(&scan)?,
            scan,
            layout,
            expect,
        })
    }

    /// The trace's ranks (`P`).
    pub fn ranks(&self) -> usize {
        self.scan.ranks.len()
    }

    /// The trace's steps, ascending.
    pub fn steps(&self) -> &[u32] {
        &self.scan.steps
    }

    /// The first step.
    pub fn first_step(&self) -> u32 {
        self.scan.steps[0]
    }

    /// The flat index space's size, refused when u32 indices cannot address it (every tool
    /// that selects or partitions needs them; dense collectives check their own bound).
    pub fn flat_len(&self) -> Result<usize> {
        let n = self.layout.total();
        if n > u32::MAX as u64 {
            bail!("the model has {n} elements; the flat index space is u32");
        }
        Ok(n as usize)
    }

    /// The whole-step check (every rank has rows, each exactly the layers of the first step,
    /// dense or sparse as expected) on one step's rows or their keys ([`TensorRow::key`]),
    /// with the tool's message.
    pub fn check(&self, rows: &[TensorRow]) -> Result<()> {
        check_step(rows, &self.layout, self.ranks(), self.expect.dense)
            .with_context(|| context(&self.expect, &self.source))
    }

    /// The next step whole (every rank and layer), checked; `None` after the last.
    pub fn next_step(&mut self) -> Result<Option<(u32, Vec<TensorRow>)>> {
        match self.steps.next_step()? {
            Some((step, rows)) => {
                self.check(&rows)?;
                Ok(Some((step, rows)))
            }
            None => Ok(None),
        }
    }

    /// The step of the next rows; `None` at the end of the trace.
    pub fn peek_step(&mut self) -> Result<Option<u32>> {
        self.steps.peek_step()
    }

    /// The next run of rows of one `(step, rank)` (at most about `max_bytes` of values),
    /// unchecked: the caller checks the step's keys with [`TraceReader::check`] when it ends.
    pub fn next_run(&mut self, max_bytes: usize) -> Result<Option<Vec<TensorRow>>> {
        self.steps.next_run(max_bytes)
    }

    /// Step `step` handed out rank by rank ([`RankRows`]); read as the ranks are asked for.
    pub fn by_rank(&self, step: u32) -> RankRows {
        RankRows {
            step,
            keys: Vec::new(),
            held: (0..self.ranks()).map(|_| Vec::new()).collect(),
        }
    }
}

/// One step read rank by rank from the trace's runs of one `(step, rank)`: a rank is handed out
/// as soon as its rows are complete, so that with a trace ordered by (step, rank) only one
/// rank's rows are held, not the step's. The whole-step check runs on the rows' keys at the end
/// of the step; a rank whose rows are not complete when the step ends is reported by it.
pub struct RankRows {
    step: u32,
    /// The step's rows without their values, for the check.
    keys: Vec<TensorRow>,
    /// Per rank: rows read and not handed out yet.
    held: Vec<Vec<TensorRow>>,
}

impl RankRows {
    /// Rank `r`'s dense rows of the step (read from `trace` as needed), every layer of the
    /// trace's layout.
    pub fn rank(&mut self, r: usize, trace: &mut TraceReader) -> Result<Vec<TensorRow>> {
        while !complete(&self.held[r], &trace.layout) {
            if trace.peek_step()? != Some(self.step) {
                // The step ended without every layer of rank r: the check says what is wrong.
                trace.check(&self.keys)?;
                bail!(
                    "internal: step {} rank {r} incomplete after its check",
                    self.step
                );
            }
            self.read_run(trace)?;
        }
        Ok(std::mem::take(&mut self.held[r]))
    }

    /// Reads what is left of the step and runs the whole-step check on its keys.
    pub fn finish(mut self, trace: &mut TraceReader) -> Result<()> {
        while trace.peek_step()? == Some(self.step) {
            self.read_run(trace)?;
        }
        trace.check(&self.keys)
    }

    /// Reads the next run of one `(step, rank)`: its keys to `keys`, its rows to `held[rank]`.
    fn read_run(&mut self, trace: &mut TraceReader) -> Result<()> {
        let run = trace
            .next_run(usize::MAX)?
            .context("internal: a run went missing")?;
        self.keys.extend(run.iter().map(TensorRow::key));
        let p = self.held.len();
        if let Some(first) = run.first() {
            self.held[first.rank as usize % p].extend(run);
        }
        Ok(())
    }
}

/// What a failed check adds to its message: what the tool needs, and the input.
fn context(expect: &Expect, source: &str) -> String {
    match &expect.needs {
        Some(needs) => format!("{needs} ({source})"),
        None => format!("in {source}"),
    }
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
