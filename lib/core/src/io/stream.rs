//! Streaming reads of `tensor/1` (docs/MEMORY.md): rows in file order a chunk at a time, or
//! one step (every rank and layer of it) at a time, so that a tool holds one step, not the trace.

use super::*;
use std::collections::BTreeMap;
use std::fs::File;

use std::collections::VecDeque;

use anyhow::{anyhow, bail, Context, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::UInt32Type;
use arrow_array::Array;
use arrow_schema::Schema;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;

use crate::tables::{batch_to_rows_at, validate_tensor_row, LayerRegistry, Table, TensorRow};
// ---------------------------------------------------------------------------------------------
// Streaming reads of `tensor/1` (docs/MEMORY.md): rows in file order, a chunk at a time, or one
// step (every rank and layer of it) at a time, so that a tool holds one step, not the trace.

/// Record batches decoded ahead of the consumer by the reading thread.
pub(super) const READ_AHEAD: usize = 1;
/// Decoded bytes per record batch when streaming: a batch is decoded, its levels and a copy
/// into rows exist at once, and [`READ_AHEAD`] more wait, so this bounds the reader's memory.
pub(super) const STREAM_BATCH_BYTES: i64 = 2 << 20;

/// A `tensor/1` input whose footer and schema are checked (every check [`read_tensor`] makes
/// before it reads a row), not yet read. Stdin is copied into an unnamed temporary file (Parquet
/// needs random access; memory stays flat), or into memory where no temporary file can be made.
pub struct TensorStream {
    /// The file's key-value metadata.
    pub meta: Meta,
    /// The input's name, for messages (`<stdin>` or the path).
    pub source: String,
    /// Rows in the file (from its footer).
    pub num_rows: u64,
    src: Source,
    metadata: ArrowReaderMetadata,
    opts: ReadOptions,
}

/// What the first pass over the `step` and `rank` columns found ([`TensorStream::scan`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyScan {
    /// Distinct steps, ascending.
    pub steps: Vec<u32>,
    /// Distinct ranks, ascending.
    pub ranks: Vec<u32>,
    /// Rows in the file.
    pub rows: u64,
    /// The first place where the file is not ordered by step: `(step, row, after)`, step
    /// `step` at file row `row` after rows of the later step `after`. `None`: ordered.
    pub disorder: Option<(u32, u64, u32)>,
    /// The lowest and highest step of each row group (`None` for an empty one). When each
    /// holds one step (gradkit's writer ends a row group of 1 MiB or more where the step
    /// changes), a trace not ordered by step (e.g. `gradtrace cat` of per-rank files) is still
    /// streamed, row groups in step order.
    pub group_steps: Vec<Option<(u32, u32)>>,
    /// The first `shape` given for each `layer_id` (in file order), for layers that have one:
    /// what [`crate::trace::Layout::of_rows`] of the whole trace would record.
    pub shapes: BTreeMap<u32, Vec<u32>>,
}

impl KeyScan {
    /// `layout` (of one step's rows) with each layer's shape as the whole trace gives it.
    pub fn complete_shapes(&self, layout: &mut crate::trace::Layout) {
        for l in &mut layout.layers {
            if l.shape.is_none() {
                l.shape = self.shapes.get(&l.layer_id).cloned();
            }
        }
    }
}

impl TensorStream {
    /// Opens `input` and checks its footer and schema; no row is read yet.
    pub fn open(input: &Input, opts: ReadOptions) -> Result<Self> {
        let name = input.name();
        Self::open_inner(input, opts).with_context(|| format!("in {name}"))
    }

    fn open_inner(input: &Input, opts: ReadOptions) -> Result<Self> {
        let src = match input {
            Input::Path(p) => Source::Handle(
                File::open(p).with_context(|| format!("cannot read {}", p.display()))?,
            ),
            Input::Stdin => spool_stdin()?,
        };
        let (metadata, meta) = checked_metadata::<TensorRow>(&src, &input.name())?;
        let num_rows = metadata
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows().max(0) as u64)
            .sum();
        Ok(TensorStream {
            meta,
            source: input.name(),
            num_rows,
            src,
            metadata,
            opts,
        })
    }

    /// One pass over the `step`, `rank`, `layer_id` and `shape` columns only (a few bytes per
    /// row): the steps and ranks of the trace, whether it is ordered by step, the layers' shapes. A value that does not fit names
    /// its column and row, as the full read does.
    pub fn scan(&self) -> Result<KeyScan> {
        self.scan_inner()
            .with_context(|| format!("in {}", self.source))
    }

    /// A reader of the columns `cols` alone (of row groups `groups`; all when `None`), in
    /// batches of [`KEY_BATCH`] rows, and the schema [`crate::tables::conform`] makes its batches
    /// fit: what the key passes read instead of the whole rows.
    fn key_columns(
        &self,
        cols: &[&str],
        groups: Option<Vec<usize>>,
    ) -> Result<(
        parquet::arrow::arrow_reader::ParquetRecordBatchReader,
        Schema,
    )> {
        let schema = self.metadata.schema();
        let roots = cols
            .iter()
            .map(|c| schema.index_of(c))
            .collect::<Result<Vec<_>, _>>()?;
        let mask = ProjectionMask::roots(self.metadata.parquet_schema(), roots);
        let full = TensorRow::schema();
        let want = Schema::new(
            cols.iter()
                .map(|c| full.field_with_name(c).cloned())
                .collect::<Result<Vec<_>, _>>()?,
        );
        let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(
            self.src.chunk_reader(&self.metadata)?,
            self.metadata.clone(),
        )
        .with_projection(mask)
        .with_batch_size(KEY_BATCH);
        if let Some(g) = groups {
            builder = builder.with_row_groups(g);
        }
        Ok((builder.build()?, want))
    }

    fn scan_inner(&self) -> Result<KeyScan> {
        let (reader, want) = self.key_columns(&["step", "rank", "layer_id", "shape"], None)?;
        let mut scan = KeyScan::default();
        let (mut steps, mut ranks) = (
            std::collections::BTreeSet::new(),
            std::collections::BTreeSet::new(),
        );
        let mut prev: Option<u32> = None;
        let group_rows: Vec<u64> = self
            .metadata
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows().max(0) as u64)
            .collect();
        scan.group_steps = vec![None; group_rows.len()];
        // The row group of the current row, and the file row where it ends.
        let (mut rg, mut rg_end) = (0usize, group_rows.first().copied().unwrap_or(0));
        for b in reader {
            let b = b.map_err(decode_error).with_context(|| {
                let row = scan.rows as usize;
                let groups = groups_of_rows(&self.metadata, row, KEY_BATCH);
                damage_at(&self.src, &self.metadata, &groups, row)
            })?;
            let b = crate::tables::conform(&want, &b, scan.rows as usize)?;
            for c in ["step", "rank", "layer_id"] {
                if b.column_by_name(c).is_some_and(|a| a.null_count() > 0) {
                    return Err(anyhow!(
                        "column `{c}` has null values; the format requires a value in every row"
                    ))
                    .context("reading rows");
                }
            }
            let s = b.column(0).as_primitive::<UInt32Type>().values();
            let r = b.column(1).as_primitive::<UInt32Type>().values();
            for (i, &step) in s.iter().enumerate() {
                let row = scan.rows + i as u64;
                while row >= rg_end && rg + 1 < group_rows.len() {
                    rg += 1;
                    rg_end += group_rows[rg];
                }
                if let Some(g) = scan.group_steps.get_mut(rg) {
                    *g = Some(g.map_or((step, step), |(a, b)| (a.min(step), b.max(step))));
                }
                if prev != Some(step) {
                    if let (Some(p), None) = (prev, scan.disorder) {
                        if step < p || steps.contains(&step) {
                            scan.disorder = Some((step, scan.rows + i as u64, p));
                        }
                    }
                    steps.insert(step);
                    prev = Some(step);
                }
            }
            ranks.extend(r.iter().copied());
            let ids = b.column(2).as_primitive::<UInt32Type>().values();
            let shape = b.column(3).as_list::<i32>();
            if shape.null_count() < shape.len() {
                let items = shape.values().as_primitive::<UInt32Type>().values();
                let offs = shape.value_offsets();
                for (i, &id) in ids.iter().enumerate() {
                    if !shape.is_null(i) && !scan.shapes.contains_key(&id) {
                        let (a, e) = (offs[i] as usize, offs[i + 1] as usize);
                        scan.shapes.insert(id, items[a..e].to_vec());
                    }
                }
            }
            scan.rows += b.num_rows() as u64;
        }
        scan.steps = steps.into_iter().collect();
        scan.ranks = ranks.into_iter().collect();
        Ok(scan)
    }

    /// The layers of step `step` as [`crate::trace::Layout::of_rows`] of its rows would give
    /// them (each layer's name, `numel` and first shape in file order), read from the key
    /// columns of the row groups that hold the step (`scan`'s), without the `values`: what a
    /// tool needs before it reads the step's values rank by rank (docs/MEMORY.md). The rows
    /// themselves are checked when they are read.
    pub fn step_layout(&self, scan: &KeyScan, step: u32) -> Result<crate::trace::Layout> {
        self.step_layout_inner(scan, step)
            .with_context(|| format!("in {}", self.source))
    }

    fn step_layout_inner(&self, scan: &KeyScan, step: u32) -> Result<crate::trace::Layout> {
        // The row groups that may hold the step.
        let groups: Vec<usize> = (0..scan.group_steps.len())
            .filter(|&g| scan.group_steps[g].is_some_and(|(a, b)| a <= step && step <= b))
            .collect();
        let (reader, want) = self.key_columns(
            &["step", "layer_id", "layer", "numel", "shape"],
            Some(groups.clone()),
        )?;
        let mut seen: BTreeMap<u32, (String, u64, Option<Vec<u32>>)> = BTreeMap::new();
        for b in reader {
            let b = b.map_err(decode_error).with_context(|| {
                let first = groups
                    .first()
                    .map_or(0, |&g| group_starts(&self.metadata)[g]);
                damage_at(&self.src, &self.metadata, &groups, first)
            })?;
            let b = crate::tables::conform(&want, &b, 0)?;
            for c in ["step", "layer_id", "layer", "numel"] {
                if b.column_by_name(c).is_some_and(|a| a.null_count() > 0) {
                    bail!("column `{c}` has null values; the format requires a value in every row");
                }
            }
            let steps = b.column(0).as_primitive::<UInt32Type>().values();
            let ids = b.column(1).as_primitive::<UInt32Type>().values();
            let names = b.column(2).as_string::<i32>();
            let numel = b.column(3).as_primitive::<arrow_array::types::UInt64Type>();
            let shape = b.column(4).as_list::<i32>();
            for i in (0..b.num_rows()).filter(|&i| steps[i] == step) {
                let sh = (!shape.is_null(i)).then(|| {
                    let v = shape.value(i);
                    v.as_primitive::<UInt32Type>().values().to_vec()
                });
                let e = seen
                    .entry(ids[i])
                    .or_insert_with(|| (names.value(i).to_string(), numel.value(i), None));
                if e.2.is_none() {
                    e.2 = sh;
                }
            }
        }
        Ok(crate::trace::Layout::new(
            seen.into_iter()
                .map(|(id, (n, s, sh))| (id, n, s, sh))
                .collect(),
        ))
    }

    /// The rows in file order, a record batch at a time, each row validated as
    /// [`read_tensor`] validates it (the first failing row in file order is reported). Decoding
    /// runs on a thread of its own, at most [`READ_AHEAD`] batches of about
    /// [`STREAM_BATCH_BYTES`] ahead.
    pub fn chunks(self) -> TensorChunks {
        self.chunks_in(None)
    }

    /// [`TensorStream::chunks`], or with `order` the rows of those row groups, in that order.
    fn chunks_in(self, order: Option<Vec<usize>>) -> TensorChunks {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<TensorRow>>>(READ_AHEAD);
        let batch = batch_rows_of(&self.metadata, STREAM_BATCH_BYTES);
        let (src, metadata, opts) = (self.src, self.metadata, self.opts);
        std::thread::spawn(move || {
            let run = || -> Result<()> {
                // (row groups, file row of the first) read by one reader each.
                let starts = group_starts(&metadata);
                let parts: Vec<(Option<Vec<usize>>, usize)> = match order {
                    None => vec![(None, 0)],
                    Some(o) => o.into_iter().map(|g| (Some(vec![g]), starts[g])).collect(),
                };
                let mut reg = LayerRegistry::default();
                // `values` decoded into reused buffers where its layout allows (docs/MEMORY.md).
                let layout = crate::read_values::ValuesLayout::of(&metadata);
                for (groups, mut first_row) in parts {
                    let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(
                        src.chunk_reader(&metadata)?,
                        metadata.clone(),
                    )
                    .with_batch_size(batch);
                    let mut values = match &layout {
                        Some(l) => {
                            builder = builder.with_projection(l.others(&metadata));
                            let g = groups
                                .clone()
                                .unwrap_or_else(|| (0..starts.len()).collect());
                            let m = metadata.metadata().clone();
                            let r = src.chunk_reader(&metadata)?;
                            Some(crate::read_values::ValuesReader::new(l.clone(), r, m, g))
                        }
                        None => None,
                    };
                    let groups_read = groups.clone();
                    if let Some(g) = groups {
                        builder = builder.with_row_groups(g);
                    }
                    // A damaged page is reported with its row group (found among those of
                    // the batch that met it, which may run on into the next ones).
                    let at = |row: usize| {
                        let mut groups = groups_of_rows(&metadata, row, batch);
                        if let Some(g) = &groups_read {
                            groups.retain(|x| g.contains(x));
                        }
                        damage_at(&src, &metadata, &groups, row)
                    };
                    for b in builder.build()? {
                        let b = b.map_err(decode_error).with_context(|| at(first_row))?;
                        let rows = match &mut values {
                            Some(v) => crate::read_values::batch_rows(&b, v, first_row),
                            None => batch_to_rows_at::<TensorRow>(&b, first_row),
                        }
                        .with_context(|| at(first_row))?;
                        first_row += b.num_rows();
                        // The decoded batch goes before the rows wait for the consumer.
                        drop(b);
                        for r in &rows {
                            validate_tensor_row(r, opts.allow_nonfinite)?;
                            reg.check(r)?;
                        }
                        if tx.send(Ok(rows)).is_err() {
                            // The reader was dropped: stop reading.
                            return Ok(());
                        }
                    }
                }
                Ok(())
            };
            if let Err(e) = run() {
                let _ = tx.send(Err(e));
            }
        });
        TensorChunks {
            rx,
            source: self.source,
            meta: self.meta,
            done: false,
        }
    }

    /// The trace one step at a time, steps ascending, using the first pass `scan` (of this
    /// stream); each step's rows in file order. Streamed (one step held at a time): a trace
    /// ordered by step, or one whose every row group holds a single step (what gradkit's
    /// writer makes of steps of 1 MiB or more per run of rows), read row group by row group
    /// in step order. Otherwise (a row group mixes steps
    /// and a step reappears after a later one) the trace is read whole and handed out by step,
    /// with a `note:` on stderr: the same steps and rows, with memory O(trace)
    /// (docs/MEMORY.md).
    pub fn steps(self, scan: &KeyScan) -> Result<TensorSteps> {
        let one_step_groups = scan
            .group_steps
            .iter()
            .all(|g| g.is_none_or(|(a, b)| a == b));
        let streamed = scan.disorder.is_none() || one_step_groups;
        if let (Some((step, row, after)), false) = (scan.disorder, streamed) {
            crate::noteln!(
                "note: {} is not ordered by step (step {step} at row {row} comes after step \
                 {after}), so it is read whole rather than one step at a time (docs/MEMORY.md)",
                self.source
            );
        }
        let mut chunks = if scan.disorder.is_some() && streamed {
            let mut order: Vec<(u32, usize)> = scan
                .group_steps
                .iter()
                .enumerate()
                .filter_map(|(i, g)| g.map(|(s, _)| (s, i)))
                .collect();
            order.sort_unstable();
            self.chunks_in(Some(order.into_iter().map(|(_, i)| i).collect()))
        } else {
            self.chunks()
        };
        let whole = if streamed {
            None
        } else {
            let mut by_step: BTreeMap<u32, Vec<TensorRow>> = BTreeMap::new();
            while let Some(rows) = chunks.next_chunk()? {
                for r in rows {
                    by_step.entry(r.step).or_default().push(r);
                }
            }
            Some(by_step.into_iter())
        };
        Ok(TensorSteps {
            meta: chunks.meta.clone(),
            source: chunks.source.clone(),
            steps: scan.steps.clone(),
            ranks: scan.ranks.clone(),
            streamed,
            chunks,
            pending: VecDeque::new(),
            whole,
            last_run_step: None,
        })
    }
}

/// The rank check of [`crate::trace::check_complete`] on a trace's ranks (e.g.
/// [`KeyScan::ranks`]): ranks are `0..P` without gaps.
pub fn check_ranks(ranks: &[u32]) -> Result<()> {
    if let Some((i, r)) = ranks.iter().enumerate().find(|(i, r)| **r as usize != *i) {
        bail!(
            "column `rank`: ranks must be 0..P without gaps, but rank {i} is missing (next is {r})"
        );
    }
    Ok(())
}

/// [`crate::trace::check_complete`] for the rows of one step of a trace of `p` ranks (checked
/// with [`check_ranks`]) whose layout is `layout`: what the whole-trace check says of this
/// step, with the same messages.
pub fn check_step(
    rows: &[TensorRow],
    layout: &crate::trace::Layout,
    p: usize,
    want_dense: Option<bool>,
) -> Result<()> {
    let Some(first) = rows.first() else {
        return Ok(());
    };
    let mut ranks: Vec<u32> = rows.iter().map(|r| r.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    if ranks.len() != p {
        bail!(
            "step {}: only {} of {p} ranks have rows (a rank is missing this step)",
            first.step,
            ranks.len()
        );
    }
    crate::trace::check_complete(rows, layout, want_dense)
}

/// Opens a `tensor/1` input and reads it one step at a time: [`TensorStream::open`], then
/// [`TensorStream::scan`], then [`TensorStream::steps`].
pub fn read_tensor_steps(input: &Input, opts: ReadOptions) -> Result<TensorSteps> {
    let s = TensorStream::open(input, opts)?;
    let scan = s.scan()?;
    s.steps(&scan)
}

/// Rows of a `tensor/1` file in file order, validated, a record batch at a time
/// ([`TensorStream::chunks`]).
pub struct TensorChunks {
    rx: std::sync::mpsc::Receiver<Result<Vec<TensorRow>>>,
    pub source: String,
    pub meta: Meta,
    done: bool,
}

impl TensorChunks {
    /// The next rows in file order; `None` at the end of the file.
    pub fn next_chunk(&mut self) -> Result<Option<Vec<TensorRow>>> {
        if self.done {
            return Ok(None);
        }
        match self.rx.recv() {
            Ok(Ok(rows)) => Ok(Some(rows)),
            Ok(Err(e)) => {
                self.done = true;
                Err(e).with_context(|| format!("in {}", self.source))
            }
            Err(_) => {
                self.done = true;
                Ok(None)
            }
        }
    }
}

impl Iterator for TensorChunks {
    type Item = Result<Vec<TensorRow>>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_chunk().transpose()
    }
}

/// A `tensor/1` trace one step at a time ([`TensorStream::steps`]): each item is a step and
/// all its rows (every rank and layer) in file order; steps come ascending.
pub struct TensorSteps {
    pub meta: Meta,
    pub source: String,
    /// Every step of the trace, ascending (from the first pass).
    pub steps: Vec<u32>,
    /// Every rank of the trace, ascending (from the first pass).
    pub ranks: Vec<u32>,
    /// Whether the trace is streamed (otherwise it was read whole: see [`TensorStream::steps`]).
    pub streamed: bool,
    chunks: TensorChunks,
    pending: VecDeque<TensorRow>,
    whole: Option<std::collections::btree_map::IntoIter<u32, Vec<TensorRow>>>,
    /// The step of the last row [`TensorSteps::next_run`] handed out.
    last_run_step: Option<u32>,
}

impl TensorSteps {
    /// The next step and its rows; `None` after the last step.
    pub fn next_step(&mut self) -> Result<Option<(u32, Vec<TensorRow>)>> {
        if let Some(w) = &mut self.whole {
            return Ok(w.next());
        }
        let mut cur: Vec<TensorRow> = Vec::new();
        loop {
            while let Some(r) = self.pending.pop_front() {
                if let Some(first) = cur.first() {
                    if r.step != first.step {
                        if r.step < first.step {
                            // The file changed since the first pass.
                            bail!(
                                "in {}: not ordered by step: step {} comes after step {}",
                                self.source,
                                r.step,
                                first.step
                            );
                        }
                        self.pending.push_front(r);
                        return Ok(Some((cur[0].step, cur)));
                    }
                }
                cur.push(r);
            }
            match self.chunks.next_chunk()? {
                Some(rows) => self.pending.extend(rows),
                None => {
                    return Ok(cur.first().map(|r| r.step).map(|s| (s, cur)));
                }
            }
        }
    }
}

impl TensorSteps {
    /// The step of the next row ([`TensorSteps::next_run`]'s), without taking it; `None`
    /// after the last row.
    pub fn peek_step(&mut self) -> Result<Option<u32>> {
        self.fill()?;
        Ok(self.pending.front().map(|r| r.step))
    }

    /// The next run of rows in file order that share one `(step, rank)`, cut once its
    /// values (and indices) reach `max_bytes` (at least one row): what a trace ordered by
    /// (step, rank, layer) holds of one rank in one step, read without the step's other ranks
    /// (docs/MEMORY.md: rank 0 under mpirun). A step whose ranks are interleaved gives several
    /// runs per rank. `None` after the last row. Steps come ascending as from
    /// [`TensorSteps::next_step`] (do not mix the two on one stream).
    pub fn next_run(&mut self, max_bytes: usize) -> Result<Option<Vec<TensorRow>>> {
        let mut run: Vec<TensorRow> = Vec::new();
        let mut bytes = 0usize;
        loop {
            if !self.fill()? {
                return Ok((!run.is_empty()).then_some(run));
            }
            while let Some(r) = self.pending.pop_front() {
                if let Some(first) = run.first() {
                    if (r.step, r.rank) != (first.step, first.rank) || bytes >= max_bytes {
                        self.pending.push_front(r);
                        return Ok(Some(run));
                    }
                } else if let Some(last) = self.last_run_step.filter(|s| r.step < *s) {
                    // The file changed since the first pass.
                    bail!(
                        "in {}: not ordered by step: step {} comes after step {last}",
                        self.source,
                        r.step
                    );
                }
                self.last_run_step = Some(r.step);
                bytes += 4 * (r.values.len() + r.indices.as_ref().map_or(0, Vec::len));
                run.push(r);
            }
        }
    }

    /// Makes `pending` non-empty unless the input ended (`false`): the next chunk, or the
    /// next step of a trace read whole.
    fn fill(&mut self) -> Result<bool> {
        while self.pending.is_empty() {
            let more = match &mut self.whole {
                Some(w) => w.next().map(|(_, rows)| rows),
                None => self.chunks.next_chunk()?,
            };
            match more {
                Some(rows) => self.pending.extend(rows),
                None => return Ok(false),
            }
        }
        Ok(true)
    }
}

impl Iterator for TensorSteps {
    type Item = Result<(u32, Vec<TensorRow>)>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_step().transpose()
    }
}
