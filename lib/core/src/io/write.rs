//! The streaming table writer: row groups encoded on background threads and spliced into the
//! file in order; the file appears at its path only when it is complete.

use super::*;
use std::io::Write;

use std::collections::VecDeque;
use std::thread::JoinHandle;

use anyhow::{anyhow, bail, Context, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, UInt32Type};
use arrow_array::{Array, ListArray, RecordBatch};
use arrow_schema::{DataType, Schema};
use bytes::Bytes;
use parquet::arrow::arrow_writer::{
    compute_leaves, ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory,
};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::column::writer::{
    get_column_writer, ColumnCloseResult, ColumnWriter, ColumnWriterImpl,
};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterPropertiesPtr};
use parquet::file::writer::{SerializedFileWriter, SerializedPageWriter, TrackedWrite};
use parquet::schema::types::{ColumnDescPtr, ColumnPath, SchemaDescriptor};

use crate::tables::{SchemaKind, Table, TensorRow};
use crate::write_pages::{assemble_chunk, EncodedPage, PageTask, ValuesWriter};
/// A streaming writer for one table: rows go out in row groups as they are written; the file
/// appears at its path only when [`TableWriter::finish`] succeeds.
///
/// Row groups are encoded on background threads (one per core, at most that many in flight)
/// and spliced into the file in order, so the output does not depend on timing: the row-group
/// boundaries depend only on the rows written.
pub struct TableWriter<T: Table> {
    file: std::sync::Arc<Splice>,
    factory: Option<ArrowRowGroupWriterFactory>,
    /// How each column is encoded, and the file's writer properties.
    plans: Vec<ColumnPlan>,
    props: WriterPropertiesPtr,
    /// Slices of written batches not yet handed to an encoder, and their payload bytes.
    pending: Vec<RecordBatch>,
    pending_bytes: usize,
    /// Pending batches that are joins of smaller ones ([`TableWriter::coalesce_pending`]).
    coalesced: usize,
    /// Row groups being encoded or appended, oldest first, with their payload bytes.
    in_flight: VecDeque<(JoinHandle<Result<()>>, usize)>,
    max_in_flight: usize,
    row_groups: usize,
    /// The step of the last row written (`tensor/1`): a new step starts a new row group
    /// once the row group holds [`STEP_GROUP_BYTES`].
    last_step: Option<u32>,
    /// The step [`TableWriter::end_step`] ended last, until the next row is written: that row
    /// must be of another step.
    ended: Option<u32>,
    /// [`STEP_GROUP_BYTES`], 0 in tests.
    step_group_bytes: usize,
    /// [`ROW_GROUP_BYTES`], smaller in tests.
    row_group_bytes: usize,
    /// `tensor/1`: the `values` column, encoded by write_pages.rs from the rows themselves.
    values: Option<ValuesWriter>,
    tmp: Option<crate::paths::TempFile>,
    out: Output,
    _t: std::marker::PhantomData<T>,
}

pub(super) type FileWriter = SerializedFileWriter<Box<dyn Write + Send>>;

/// The file being written, shared with the row-group encoders: each appends its own row group
/// when `next` is its index, so row groups land in order while the calling thread goes on
/// encoding (docs/MEMORY.md: the appends were a serial step of the calling thread).
pub(super) struct Splice {
    state: std::sync::Mutex<SpliceState>,
    turn: std::sync::Condvar,
}

pub(super) struct SpliceState {
    file: Option<FileWriter>,
    /// A copy of the bytes reaching the sink (a row group at a time), and the column chunks' CRCs so far
    /// (super::checksum: written to the footer by `close`).
    tee: super::checksum::Tee,
    crcs: Vec<u32>,
    /// The next row group to append.
    next: usize,
    /// A row group failed (or the writer was dropped): the later ones are not appended.
    failed: bool,
}

impl Splice {
    fn state(&self) -> Result<std::sync::MutexGuard<'_, SpliceState>> {
        self.state
            .lock()
            .map_err(|_| anyhow!("internal: a row-group writer panicked"))
    }

    /// Waits for row group `index`'s turn, then appends `cols` (or records the failure).
    fn append(&self, index: usize, cols: Result<Vec<EncodedColumn>>) -> Result<()> {
        let mut st = self.state()?;
        while !st.failed && st.next != index {
            st = self
                .turn
                .wait(st)
                .map_err(|_| anyhow!("internal: a row-group writer panicked"))?;
        }
        let done = match st.failed {
            true => Err(anyhow!("an earlier row group was not written")),
            false => cols.and_then(|c| {
                let st = &mut *st;
                let file = st.file.as_mut().expect("open");
                append_row_group(file, c, &st.tee, &mut st.crcs)
            }),
        };
        match done {
            Ok(()) => st.next += 1,
            Err(_) => st.failed = true,
        }
        self.turn.notify_all();
        done
    }
}

/// Splices one encoded row group into the file, and pushes the CRC of each of its column
/// chunks to `crcs` (super::checksum): the file is flushed before and after, so the sink's
/// copy `tee` then holds exactly the row group's bytes.
pub(super) fn append_row_group(
    file: &mut FileWriter,
    cols: Vec<EncodedColumn>,
    tee: &super::checksum::Tee,
    crcs: &mut Vec<u32>,
) -> Result<()> {
    file.flush()?;
    tee.take();
    let base = file.bytes_written() as u64;
    let mut rg = file.next_row_group()?;
    for c in cols {
        match c {
            EncodedColumn::Arrow(chunk) => chunk.append_to_row_group(&mut rg)?,
            EncodedColumn::Raw(bytes, close) => rg.append_column(&bytes, close)?,
            EncodedColumn::Pages(chunk, close) => rg.append_column(&chunk, close)?,
        }
    }
    let group = rg.close()?;
    file.flush()?;
    let sums = super::checksum::chunk_crcs(&group, &tee.take(), base)
        .ok_or_else(|| anyhow!("internal: a column chunk outside its row group's bytes"))?;
    crcs.extend(sums);
    Ok(())
}

/// Payload bytes (list items and 64 per row) per row group: readers parallelise over row
/// groups, and so does the writer. It bounds the writer's memory (docs/MEMORY.md): the row
/// group being filled, plus those being encoded (their rows and their encoded copy) up to
/// [`IN_FLIGHT_BYTES`]. 64 MiB made `gradtrace cat` of a 56 MiB step peak at 5 × a step;
/// 16 MiB costs nothing measurable in file size (a row group's metadata is ~1 KiB).
pub(super) const ROW_GROUP_BYTES: usize = 16 << 20;
/// Payload bytes of the row groups being encoded in the background at once (at least one row
/// group, however big; at most one per core).
pub(super) const IN_FLIGHT_BYTES: usize = 2 * ROW_GROUP_BYTES;
/// `tensor/1`: bytes of the row groups whose `values` pages the calling thread encoded
/// (write_pages.rs) that may be in flight at once: encoded pages and the other columns'
/// payload (at least one row group). The background threads only assemble and append them;
/// under mpirun with busy-waiting ranks they may wait long for a core, and each group held
/// there is a step's encoded copy (docs/MEMORY.md).
pub(super) const ENCODED_IN_FLIGHT_BYTES: usize = ROW_GROUP_BYTES;
/// `tensor/1`: bytes of rows whose `values` pages are encoded in one go, on all cores.
pub(super) const ENCODE_WINDOW_BYTES: usize = ROW_GROUP_BYTES;
/// `tensor/1`: a row group holding at least this many payload bytes ends where the step
/// changes. Measured: a row group per 48 KiB step of a small model makes the file 12 % bigger
/// and its footer 13 MB for 2000 steps; at 1 MiB the cost is below 1 %.
pub(super) const STEP_GROUP_BYTES: usize = 1 << 20;

/// Pending batches joined into one ([`TableWriter::coalesce_pending`]).
pub(super) const COALESCE_BATCHES: usize = 64;
/// Levels per low-level `write_batch` call of a list column; a row is never split.
pub(super) const LEVEL_CHUNK: usize = 1 << 20;

pub(crate) fn writer_properties(kind: SchemaKind) -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).expect("level 1")))
        .set_dictionary_enabled(false);
    let path = |c: &str| ColumnPath::new(vec![c.into(), "list".into(), "item".into()]);
    for c in ["layer", "run", "tool", "algo", "metric"] {
        b = b.set_column_dictionary_enabled(ColumnPath::from(c), true);
    }
    if kind == SchemaKind::Tensor {
        // Measured 1.5x smaller and no slower (docs/FORMAT.md).
        b = b
            .set_column_encoding(path("values"), Encoding::BYTE_STREAM_SPLIT)
            .set_column_encoding(path("indices"), Encoding::DELTA_BINARY_PACKED)
            // Min/max of gradient values and positions prune nothing, and computing them
            // costs a fifth of the write time (docs/results/io.md); step/rank/layer keep theirs.
            .set_column_statistics_enabled(path("values"), EnabledStatistics::None)
            .set_column_statistics_enabled(path("indices"), EnabledStatistics::None)
            // Bigger mini-batches through the column writers: 1.3x faster on long lists.
            .set_write_batch_size(1 << 16);
    }
    b.build()
}

/// One encoded column chunk of a row group, ready to be spliced into the file.
pub(super) enum EncodedColumn {
    /// Encoded by arrow-rs's column writer (scalar columns).
    Arrow(ArrowColumnChunk),
    /// A list column encoded by the low-level column writer into a buffer of its own.
    Raw(Bytes, ColumnCloseResult),
    /// `values`, its pages encoded by write_pages.rs.
    Pages(crate::write_pages::Chunk, ColumnCloseResult),
}

/// How a top-level column is encoded.
#[derive(Clone)]
pub(super) enum ColumnPlan {
    Arrow,
    /// A list of non-null `f32` or `u32` items: levels are computed here from the offsets
    /// (arrow-rs materialises a `usize` index and two level vectors per item, which costs
    /// more than the encoding itself on long lists).
    List(ColumnDescPtr),
}

pub(super) fn column_plans(schema: &Schema, descr: &SchemaDescriptor) -> Vec<ColumnPlan> {
    if descr.num_columns() != schema.fields().len() {
        return vec![ColumnPlan::Arrow; schema.fields().len()];
    }
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| match f.data_type() {
            DataType::List(item)
                if !item.is_nullable()
                    && matches!(item.data_type(), DataType::Float32 | DataType::UInt32) =>
            {
                ColumnPlan::List(descr.column(i))
            }
            _ => ColumnPlan::Arrow,
        })
        .collect()
}

/// Payload bytes of each row of a batch: 64 plus 4 per list item.
pub(super) fn row_bytes(batch: &RecordBatch) -> Vec<usize> {
    let mut bytes = vec![64usize; batch.num_rows()];
    for c in batch.columns() {
        if let Some(l) = c.as_list_opt::<i32>() {
            for (b, w) in bytes.iter_mut().zip(l.value_offsets().windows(2)) {
                *b += 4 * (w[1] - w[0]) as usize;
            }
        }
    }
    bytes
}

/// Reusable definition/repetition level buffers.
#[derive(Default)]
pub(super) struct Levels {
    def: Vec<i16>,
    rep: Vec<i16>,
}

/// Writes a list column through `w` with levels computed from the offsets: per row a null
/// list, an empty list, or `n` items (repetition 0 then 1s). Rows are grouped into
/// `write_batch` calls of about [`LEVEL_CHUNK`] levels and never split across calls.
pub(super) fn write_list<P: parquet::data_type::DataType>(
    w: &mut ColumnWriterImpl<'_, P>,
    list: &ListArray,
    values: &[P::T],
    max_def: i16,
    lv: &mut Levels,
) -> Result<()> {
    let offs = list.value_offsets();
    lv.def.clear();
    lv.rep.clear();
    let mut seg = offs[0] as usize;
    let mut flush = |lv: &mut Levels, seg: usize, end: usize| -> Result<()> {
        if !lv.def.is_empty() {
            w.write_batch(&values[seg..end], Some(&lv.def), Some(&lv.rep))?;
            lv.def.clear();
            lv.rep.clear();
        }
        Ok(())
    };
    for j in 0..list.len() {
        let (a, b) = (offs[j] as usize, offs[j + 1] as usize);
        let n = b - a;
        if !lv.def.is_empty() && lv.def.len() + n.max(1) > LEVEL_CHUNK {
            flush(lv, seg, a)?;
            seg = a;
        }
        if list.is_null(j) {
            // A null slot may still span items in Arrow; they are not written.
            flush(lv, seg, a)?;
            seg = b;
            lv.def.push(max_def - 2);
            lv.rep.push(0);
        } else if n == 0 {
            lv.def.push(max_def - 1);
            lv.rep.push(0);
        } else {
            lv.def.resize(lv.def.len() + n, max_def);
            lv.rep.push(0);
            lv.rep.resize(lv.rep.len() + n - 1, 1);
        }
    }
    flush(lv, seg, offs[list.len()] as usize)
}

/// Encodes one list column of a row group's batches into a buffer of its own. Each batch is
/// dropped once written: for the last column (`values`) that frees the rows as their encoded
/// copy grows, so a row group is held about once, not twice (docs/MEMORY.md).
pub(super) fn encode_list_column(
    descr: &ColumnDescPtr,
    props: &WriterPropertiesPtr,
    batches: Vec<RecordBatch>,
    col: usize,
    lv: &mut Levels,
) -> Result<EncodedColumn> {
    // Room for the uncompressed items: the buffer does not grow (and copy) while encoding.
    let items: usize = batches
        .iter()
        .map(|b| {
            let o = b.column(col).as_list::<i32>().value_offsets();
            (o[o.len() - 1] - o[0]) as usize
        })
        .sum();
    let mut sink = TrackedWrite::new(Vec::with_capacity(4 * items + (64 << 10)));
    let mut w = get_column_writer(
        descr.clone(),
        props.clone(),
        Box::new(SerializedPageWriter::new(&mut sink)),
    );
    let max_def = descr.max_def_level();
    for b in batches {
        let list = b.column(col).as_list::<i32>();
        match &mut w {
            ColumnWriter::FloatColumnWriter(w) => {
                let v = list.values().as_primitive::<Float32Type>().values();
                write_list(w, list, &v[..], max_def, lv)?;
            }
            ColumnWriter::Int32ColumnWriter(w) => {
                // UInt32 is stored as INT32 with an unsigned logical type: same bits.
                let v = list.values().as_primitive::<UInt32Type>().values();
                write_list(w, list, v.inner().typed_data::<i32>(), max_def, lv)?;
            }
            _ => bail!("internal: list column {col} has an unexpected physical type"),
        }
    }
    let close = w.close()?;
    let bytes = Bytes::from(sink.into_inner()?);
    Ok(EncodedColumn::Raw(bytes, close))
}

/// The encoded pages of a column (its index among the top-level columns) of a row group.
pub(super) type PagesOf = (usize, ColumnDescPtr, Vec<EncodedPage>);

/// Encodes one row group (the job of a background thread); the column in `pages`, if any,
/// is already encoded (write_pages.rs) and only assembled here.
pub(super) fn encode_row_group(
    batches: Vec<RecordBatch>,
    writers: Vec<ArrowColumnWriter>,
    plans: Vec<ColumnPlan>,
    props: WriterPropertiesPtr,
    pages: Option<PagesOf>,
) -> Result<Vec<EncodedColumn>> {
    let mut lv = Levels::default();
    let mut out = Vec::with_capacity(writers.len());
    let last = writers.len().saturating_sub(1);
    let mut batches = batches;
    let mut pages = pages;
    for (col, (mut w, plan)) in writers.into_iter().zip(plans).enumerate() {
        if let Some((_, descr, p)) = pages.take_if(|p| p.0 == col) {
            let (chunk, close) = assemble_chunk(descr, p, &props)?;
            out.push(EncodedColumn::Pages(chunk, close));
            continue;
        }
        match plan {
            ColumnPlan::List(descr) => {
                // The last column takes the batches themselves (see encode_list_column).
                let these = if col == last {
                    std::mem::take(&mut batches)
                } else {
                    batches.clone()
                };
                out.push(encode_list_column(&descr, &props, these, col, &mut lv)?)
            }
            ColumnPlan::Arrow => {
                for b in &batches {
                    let field = b.schema_ref().field(col).clone();
                    for leaf in compute_leaves(&field, b.column(col))? {
                        w.write(&leaf)?;
                    }
                }
                out.push(EncodedColumn::Arrow(w.close()?));
            }
        }
    }
    Ok(out)
}

/// The sink of `out` ([`open_raw_sink`]) keeping a copy of what passes for the chunks'
/// checksums ([`super::checksum::CrcSink`]), that copy, and the temporary file it writes when
/// `out` is a path.
#[allow(clippy::type_complexity)]
fn open_sink(
    out: &Output,
) -> Result<(
    Box<dyn Write + Send>,
    super::checksum::Tee,
    Option<crate::paths::TempFile>,
)> {
    let (inner, tmp) = open_raw_sink(out)?;
    let tee = super::checksum::Tee::default();
    let sink = super::checksum::CrcSink {
        inner,
        tee: tee.clone(),
    };
    Ok((Box::new(sink), tee, tmp))
}

/// Where a table's bytes go: stdout; a device, FIFO or `/dev/stdout` in place (renaming a
/// temporary file over it would replace the device node); or a temporary file beside the path,
/// renamed when the table is complete.
fn open_raw_sink(out: &Output) -> Result<(Box<dyn Write + Send>, Option<crate::paths::TempFile>)> {
    Ok(match out {
        Output::Stdout => (Box::new(std::io::stdout()), None),
        Output::Path(p) if std::fs::metadata(p).is_ok_and(|m| !m.is_file()) => {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .with_context(|| format!("cannot open {}", p.display()))?;
            (
                Box::new(std::io::BufWriter::with_capacity(1 << 20, f)),
                None,
            )
        }
        Output::Path(p) => {
            let tmp = crate::paths::TempFile::create(p)?;
            let f = tmp
                .file()
                .try_clone()
                .with_context(|| format!("cannot write {}", p.display()))?;
            (
                Box::new(std::io::BufWriter::with_capacity(1 << 20, f)),
                Some(tmp),
            )
        }
    })
}

impl<T: Table> TableWriter<T> {
    /// Opens `out` for a table of type `T` with `meta` (the schema key is added here).
    pub fn create(out: &Output, meta: &Meta) -> Result<Self> {
        let (sink, tee, tmp) = open_sink(out)?;
        // The metadata also goes into the Arrow schema stored in the file, so that pyarrow's
        // `read_table(...).schema.metadata` (and pandas, polars) show it, not only the footer.
        let mut schema_meta: std::collections::HashMap<String, String> =
            meta.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        schema_meta.insert("gradkit.schema".into(), T::KIND.name().to_string());
        let schema = std::sync::Arc::new(T::schema().as_ref().clone().with_metadata(schema_meta));
        let mut writer = ArrowWriter::try_new(sink, schema, Some(writer_properties(T::KIND)))?;
        writer.append_key_value_metadata(KeyValue::new(
            "gradkit.schema".into(),
            T::KIND.name().to_string(),
        ));
        for (k, v) in &meta.0 {
            if k != "gradkit.schema" && k != super::checksum::KEY {
                writer.append_key_value_metadata(KeyValue::new(k.clone(), v.clone()));
            }
        }
        let (file, factory) = writer.into_serialized_writer()?;
        let max_in_flight = std::thread::available_parallelism().map_or(1, |n| n.get());
        let values = if T::KIND == SchemaKind::Tensor {
            let (fields, descr) = (T::schema(), file.schema_descr());
            fields
                .index_of("values")
                .ok()
                .filter(|_| descr.num_columns() == fields.fields().len())
                .and_then(|i| ValuesWriter::new(i, descr.column(i), file.properties()))
        } else {
            None
        };
        let plans = column_plans(&T::schema(), file.schema_descr());
        let props = file.properties().clone();
        let file = std::sync::Arc::new(Splice {
            state: std::sync::Mutex::new(SpliceState {
                file: Some(file),
                tee,
                crcs: Vec::new(),
                next: 0,
                failed: false,
            }),
            turn: std::sync::Condvar::new(),
        });
        Ok(TableWriter {
            file,
            factory: Some(factory),
            plans,
            props,
            pending: Vec::new(),
            pending_bytes: 0,
            coalesced: 0,
            in_flight: VecDeque::new(),
            max_in_flight,
            row_groups: 0,
            last_step: None,
            ended: None,
            step_group_bytes: STEP_GROUP_BYTES,
            row_group_bytes: ROW_GROUP_BYTES,
            values,
            tmp,
            out: out.clone(),
            _t: std::marker::PhantomData,
        })
    }

    /// Appends rows; a row group is handed to an encoder once enough bytes are buffered.
    pub fn write(&mut self, rows: &[T]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let done = match tensor_rows(rows).filter(|_| self.values.is_some()) {
            Some(rows) => self.write_tensor_rows(&rows),
            None => T::to_batch(rows).and_then(|b| self.write_batch(b)),
        };
        done.with_context(|| format!("writing {}", self.out.name()))
    }

    /// Like [`TableWriter::write`], consuming the rows: a big row's buffers move into the
    /// encoder instead of being copied (what a producer that no longer needs its rows calls).
    pub fn write_owned(&mut self, rows: Vec<T>) -> Result<()> {
        let name = self.out.name();
        self.write_owned_inner(rows)
            .with_context(|| format!("writing {name}"))
    }

    fn write_owned_inner(&mut self, rows: Vec<T>) -> Result<()> {
        if let Some(refs) = tensor_rows(&rows).filter(|_| self.values.is_some()) {
            // Encoded from the rows in place; then freed on another thread, as they were by
            // the encoders: unmapping big buffers costs about as much as compressing them.
            self.write_tensor_rows(&refs)?;
            if refs.iter().map(|r| r.values.len()).sum::<usize>() >= 1 << 20 {
                std::thread::spawn(move || drop(rows));
            }
            return Ok(());
        }
        let mut small = Vec::new();
        for r in rows {
            if r.payload_bytes() >= 1 << 20 {
                if !small.is_empty() {
                    self.write_batch(T::to_batch(&std::mem::take(&mut small))?)?;
                }
                self.write_batch(T::into_batch(vec![r])?)?;
            } else {
                small.push(r);
            }
        }
        if !small.is_empty() {
            self.write_batch(T::to_batch(&small)?)?;
        }
        Ok(())
    }

    fn write_batch(&mut self, batch: RecordBatch) -> Result<()> {
        let sizes = row_bytes(&batch);
        let steps = match T::KIND {
            SchemaKind::Tensor => batch
                .column_by_name("step")
                .and_then(|c| c.as_primitive_opt::<UInt32Type>())
                .cloned(),
            _ => None,
        };
        let cuts = self.group_cuts(&sizes, steps.as_ref().map(|s| &s.values()[..]))?;
        let mut start = 0;
        for (pos, bytes) in cuts {
            if pos > start {
                self.pending.push(batch.slice(start, pos - start));
                start = pos;
            }
            self.submit(bytes)?;
        }
        if start < batch.num_rows() {
            self.pending
                .push(batch.slice(start, batch.num_rows() - start));
        }
        self.coalesce_pending()
    }

    /// Joins the last [`COALESCE_BATCHES`] pending batches into one whenever that many were
    /// added since the last join: a row group of many tiny steps (a 10-element layer over
    /// 10^5 steps) was held as one batch per step, each kilobytes of buffers and array headers
    /// for tens of bytes of data. The rows, hence the file, are the same.
    fn coalesce_pending(&mut self) -> Result<()> {
        if self.pending.len() >= self.coalesced + COALESCE_BATCHES {
            let tail = self.pending.split_off(self.coalesced);
            let one = arrow_select::concat::concat_batches(&tail[0].schema(), &tail)?;
            self.pending.push(one);
            self.coalesced = self.pending.len();
        }
        Ok(())
    }

    /// Where row groups end among new rows of payload `sizes` (and `steps`, `tensor/1`) that
    /// follow the pending rows: `(row before which a group ends, the group's payload bytes)`.
    /// Updates the pending bytes and the last step.
    ///
    /// `tensor/1`: a change of step ends a row group that holds STEP_GROUP_BYTES or more, so
    /// that when the rows of a step come in runs of that size (one rank of a model of 256 Ki
    /// parameters) every row group holds one step: a reader can stream the trace by step in
    /// any row order and find a step from the row groups' statistics (docs/MEMORY.md).
    /// Smaller runs share row groups: one per step of a tiny model would make the file
    /// bigger and its footer huge.
    ///
    /// After [`TableWriter::end_step`] the next row must be of another step (the row group may
    /// have ended already): an error otherwise.
    fn group_cuts(
        &mut self,
        sizes: &[usize],
        steps: Option<&[u32]>,
    ) -> Result<Vec<(usize, usize)>> {
        let mut cuts = Vec::new();
        if let (Some(e), Some(&first)) = (self.ended.take(), steps.and_then(|s| s.first())) {
            if e == first {
                bail!("internal: rows of step {e} written after the step was ended");
            }
        }
        for (i, &b) in sizes.iter().enumerate() {
            if let Some(step) = steps.map(|s| s[i]) {
                if self.last_step.is_some_and(|l| l != step)
                    && self.pending_bytes >= self.step_group_bytes
                    && self.pending_bytes > 0
                {
                    cuts.push((i, std::mem::take(&mut self.pending_bytes)));
                }
                self.last_step = Some(step);
            }
            self.pending_bytes += b;
            if self.pending_bytes >= self.row_group_bytes {
                cuts.push((i + 1, std::mem::take(&mut self.pending_bytes)));
            }
        }
        Ok(cuts)
    }

    /// `tensor/1`: every row of `step` was written; the next rows written are of another step
    /// (an error otherwise). The row group ends now if it holds [`STEP_GROUP_BYTES`], as it
    /// would at the next step's first row (the row groups are the same), and is in the file
    /// when this returns: the step's encoded pages are not held while the caller computes the
    /// next step (docs/MEMORY.md).
    pub fn end_step(&mut self, step: u32) -> Result<()> {
        let name = self.out.name();
        self.end_step_inner(step)
            .with_context(|| format!("writing {name}"))
    }

    fn end_step_inner(&mut self, step: u32) -> Result<()> {
        match self.last_step {
            None => return Ok(()),
            Some(l) if l != step => {
                bail!("internal: step {step} ended after rows of step {l}")
            }
            Some(_) => {}
        }
        self.ended = Some(step);
        if self.pending_bytes >= self.step_group_bytes && self.pending_bytes > 0 {
            self.drain()?;
        }
        Ok(())
    }

    /// Ends the open row group and waits until every row group is in the file.
    fn drain(&mut self) -> Result<()> {
        self.flush_open()?;
        let bytes = std::mem::take(&mut self.pending_bytes);
        self.submit(bytes)?;
        while !self.in_flight.is_empty() {
            self.join_oldest()?;
        }
        Ok(())
    }

    /// `tensor/1`: encodes the open page of small rows (the end of a row group).
    fn flush_open(&mut self) -> Result<()> {
        if let Some(vw) = self.values.as_mut() {
            let mut tasks = Vec::new();
            vw.close_open(&mut tasks);
            let pages = vw.encode(&tasks)?;
            vw.push_pages(pages);
        }
        Ok(())
    }

    /// [`TableWriter::write_tensor`] of whole rows.
    fn write_tensor_rows(&mut self, rows: &[&TensorRow]) -> Result<()> {
        let keys = rows.iter().map(|r| without_values(r)).collect();
        let values: Vec<&[f32]> = rows.iter().map(|r| &r.values[..]).collect();
        self.write_tensor(keys, &values)
    }

    /// `tensor/1` rows given as their `keys` (rows without values) and their `values`:
    /// `values` is encoded into pages here, from the caller's slices, a window of at most
    /// [`ENCODE_WINDOW_BYTES`] at a time on all cores (write_pages.rs); the other columns go
    /// into a batch and are encoded with the row group as for any table.
    fn write_tensor(&mut self, keys: Vec<TensorRow>, values: &[&[f32]]) -> Result<()> {
        let sizes: Vec<usize> = keys
            .iter()
            .zip(values)
            .map(|(k, v)| tensor_row_bytes(k) + 4 * v.len())
            .collect();
        let steps: Vec<u32> = keys.iter().map(|r| r.step).collect();
        let mut cuts = self
            .group_cuts(&sizes, Some(&steps))?
            .into_iter()
            .peekable();
        let batch = TensorRow::to_batch(&keys)?;
        drop(keys);
        let n = values.len();
        // First row of `batch` not yet pending, first row of the next window.
        let (mut start, mut a) = (0, 0);
        while a < n {
            let (mut b, mut bytes) = (a, 0);
            while b < n && (b == a || bytes + sizes[b] <= ENCODE_WINDOW_BYTES) {
                bytes += sizes[b];
                b += 1;
            }
            self.wait_in_flight(bytes)?;
            let vw = self.values.as_mut().expect("tensor writer");
            let mut tasks: Vec<PageTask<'_>> = Vec::new();
            // (pages before the cut, row before which the group ends, its payload bytes).
            let mut marks = Vec::new();
            // Rows a..b, each after the cuts before it, then the cuts at b.
            let window = values[a..b].iter().map(Some).chain([None]);
            for (i, row) in (a..=b).zip(window) {
                while let Some(&(pos, gb)) = cuts.peek().filter(|c| c.0 == i && (i < b || b == n)) {
                    vw.close_open(&mut tasks);
                    marks.push((tasks.len(), pos, gb));
                    cuts.next();
                }
                if let Some(v) = row {
                    vw.plan_row(v, &mut tasks);
                }
            }
            let mut pages = vw.encode(&tasks)?.into_iter();
            drop(tasks);
            let mut taken = 0;
            for (k, pos, gb) in marks {
                let vw = self.values.as_mut().expect("tensor writer");
                vw.push_pages(pages.by_ref().take(k - taken));
                taken = k;
                if pos > start {
                    self.pending.push(batch.slice(start, pos - start));
                    start = pos;
                }
                self.submit(gb)?;
            }
            self.values
                .as_mut()
                .expect("tensor writer")
                .push_pages(pages);
            a = b;
        }
        if start < n {
            self.pending.push(batch.slice(start, n - start));
        }
        self.coalesce_pending()
    }

    /// Hands the pending rows (of `bytes` of payload) to a background encoder as one row
    /// group. It waits first while the row groups in flight hold [`IN_FLIGHT_BYTES`] of
    /// payload, or, when `values` is already encoded, [`ENCODED_IN_FLIGHT_BYTES`] of its
    /// encoded pages and the other columns' payload.
    fn submit(&mut self, bytes: usize) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let pages = self.values.as_mut().map(|v| {
            let (descr, pages) = v.take_pages();
            (v.col, descr, pages)
        });
        let (bytes, limit) = match &pages {
            Some((_, _, p)) => {
                let raw: usize = p.iter().map(|p| p.uncompressed()).sum();
                let held: usize = p.iter().map(|p| p.compressed()).sum();
                (bytes.saturating_sub(raw) + held, ENCODED_IN_FLIGHT_BYTES)
            }
            None => (bytes, IN_FLIGHT_BYTES),
        };
        self.wait_room(bytes, limit, self.max_in_flight)?;
        let batches = std::mem::take(&mut self.pending);
        self.coalesced = 0;
        let writers = self
            .factory
            .as_ref()
            .expect("writer open")
            .create_column_writers(self.row_groups)?;
        let (plans, props) = (self.plans.clone(), self.props.clone());
        let (index, file) = (self.row_groups, self.file.clone());
        self.row_groups += 1;
        self.in_flight.push_back((
            std::thread::spawn(move || {
                file.append(
                    index,
                    encode_row_group(batches, writers, plans, props, pages),
                )
            }),
            bytes,
        ));
        Ok(())
    }

    /// `tensor/1`: before a window of `bytes` of rows is encoded, waits for the row groups in
    /// flight while they and the window (counted at its size before encoding) would hold more
    /// than [`ENCODED_IN_FLIGHT_BYTES`]: a step's pages are not encoded while the previous
    /// step's are still being appended (docs/MEMORY.md).
    fn wait_in_flight(&mut self, bytes: usize) -> Result<()> {
        self.wait_room(bytes, ENCODED_IN_FLIGHT_BYTES, usize::MAX)
    }

    /// Waits for the oldest row groups in flight while there are `jobs` of them or they and
    /// `bytes` more would hold more than `limit` (at least one may always be in flight).
    fn wait_room(&mut self, bytes: usize, limit: usize, jobs: usize) -> Result<()> {
        while !self.in_flight.is_empty()
            && (self.in_flight.len() >= jobs
                || self.in_flight.iter().map(|j| j.1).sum::<usize>() + bytes > limit)
        {
            self.join_oldest()?;
        }
        Ok(())
    }

    /// Waits for the oldest row group in flight to be encoded and spliced into the file.
    fn join_oldest(&mut self) -> Result<()> {
        let Some((job, _)) = self.in_flight.pop_front() else {
            return Ok(());
        };
        job.join()
            .map_err(|_| anyhow!("internal: a row-group encoder panicked"))?
    }

    /// Closes the file and renames it into place.
    pub fn finish(self) -> Result<()> {
        match self.close()? {
            Some(tmp) => tmp.persist(),
            None => Ok(()),
        }
    }

    /// Closes the file without giving it its name: the complete file, to be committed with
    /// the run's other outputs by [`crate::paths::commit_all`] (None for stdout or a device,
    /// written in place). Dropping it leaves nothing.
    pub fn close(mut self) -> Result<Option<crate::paths::TempFile>> {
        let name = self.out.name();
        let mut closed = || -> Result<()> {
            self.drain()?;
            let mut st = self.file.state()?;
            let mut file = st.file.take().expect("writer open");
            file.append_key_value_metadata(KeyValue::new(
                super::checksum::KEY.into(),
                super::checksum::encode(&st.crcs),
            ));
            file.into_inner()?.flush()?;
            Ok(())
        };
        closed().with_context(|| format!("writing {name}"))?;
        Ok(self.tmp.take())
    }
}

impl TableWriter<TensorRow> {
    /// Writes a whole dense step from its flat vector (`layout`'s layers in order, as
    /// [`crate::trace::unflatten_dense`] splits it): the rows `unflatten_dense` gives, encoded
    /// from `flat` itself, so that the step is not copied into rows (docs/MEMORY.md); then
    /// [`TableWriter::end_step`]. The file is the one `write` of those rows and the next
    /// step's would give.
    pub fn write_dense_step(
        &mut self,
        flat: &[f32],
        layout: &crate::trace::Layout,
        step: u32,
        rank: u32,
    ) -> Result<()> {
        let name = self.out.name();
        self.write_dense_inner(flat, layout, step, rank)
            .with_context(|| format!("writing {name}"))
    }

    fn write_dense_inner(
        &mut self,
        flat: &[f32],
        layout: &crate::trace::Layout,
        step: u32,
        rank: u32,
    ) -> Result<()> {
        if flat.len() as u64 != layout.total() {
            bail!(
                "internal: a dense step of {} values for layers of {}",
                flat.len(),
                layout.total()
            );
        }
        let (keys, ranges): (Vec<_>, Vec<_>) = crate::trace::dense_keys(layout, step, rank)
            .into_iter()
            .unzip();
        if keys.is_empty() {
            return Ok(());
        }
        if self.values.is_some() {
            let values: Vec<&[f32]> = ranges.into_iter().map(|r| &flat[r]).collect();
            self.write_tensor(keys, &values)?;
        } else {
            let rows = crate::trace::unflatten_dense(flat, layout, step, rank);
            self.write_batch(TensorRow::to_batch(&rows)?)?;
        }
        self.end_step_inner(step)
    }
}

impl<T: Table> Drop for TableWriter<T> {
    fn drop(&mut self) {
        // Not finished: an error happened; leave nothing half-written behind. Row groups still
        // in flight stop at their turn.
        if let Ok(mut st) = self.file.state.lock() {
            st.failed = true;
            st.file.take();
        }
        self.file.turn.notify_all();
        if let Some(tmp) = self.tmp.take() {
            self.in_flight.clear();
            drop(tmp);
        }
    }
}

/// Writes a whole table in one call.
pub fn write_table<T: Table>(out: &Output, meta: &Meta, rows: &[T]) -> Result<()> {
    let mut w = TableWriter::<T>::create(out, meta)?;
    // Keep batches moderate so memory stays bounded for large traces.
    let mut start = 0;
    while start < rows.len() {
        let mut end = start;
        let mut bytes = 0usize;
        while end < rows.len() && (end == start || bytes < 32 << 20) {
            bytes += rows[end].payload_bytes();
            end += 1;
        }
        w.write(&rows[start..end])?;
        start = end;
    }
    w.finish()
}

/// The rows as `TensorRow`s, when `T` is `TensorRow`.
pub(super) fn tensor_rows<T: Table>(rows: &[T]) -> Option<Vec<&TensorRow>> {
    rows.iter().map(Table::as_tensor).collect()
}

/// Payload bytes of a row, as [`row_bytes`] counts them in its batch.
pub(super) fn tensor_row_bytes(r: &TensorRow) -> usize {
    let n = |v: &Option<Vec<u32>>| v.as_ref().map_or(0, |v| v.len());
    64 + 4 * (n(&r.shape) + n(&r.indices) + r.values.len())
}

/// A copy of `r` without its values (they are encoded from `r` itself).
pub(super) fn without_values(r: &TensorRow) -> TensorRow {
    TensorRow {
        step: r.step,
        rank: r.rank,
        layer_id: r.layer_id,
        layer: r.layer.clone(),
        numel: r.numel,
        shape: r.shape.clone(),
        indices: r.indices.clone(),
        values: Vec::new(),
    }
}

#[cfg(test)]
#[path = "write_tests.rs"]
mod tests;
