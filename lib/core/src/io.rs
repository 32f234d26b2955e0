//! Parquet I/O for the three tables: inputs from a path or stdin, outputs to a path (written as
//! `PATH.tmp-<pid>` and renamed on success) or to stdout when it is not a terminal.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use std::collections::VecDeque;
use std::thread::JoinHandle;

use anyhow::{anyhow, bail, Context, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, UInt32Type};
use arrow_array::{Array, ListArray, RecordBatch};
use arrow_schema::{DataType, Schema};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
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

use crate::tables::{
    batch_to_rows_at, validate_tensor_row, LayerRegistry, SchemaKind, Table, TensorRow,
};

/// Key-value metadata of a gradkit file (`gradkit.schema`, `gradkit.producer`, parameters…).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Meta(pub BTreeMap<String, String>);

impl Meta {
    /// Metadata naming the producing tool, its version and its full argv.
    pub fn producer(tool: &str) -> Self {
        let argv: Vec<String> = std::env::args().collect();
        let mut m = Meta::default();
        m.set(
            "gradkit.producer",
            format!(
                "{tool} {} argv={}",
                env!("CARGO_PKG_VERSION"),
                argv.join(" ")
            ),
        );
        // Where the ranks ran, set by pipelines/cluster.sh run (e.g. `backend=mpi-tcp hosts=4
        // ranks=4 rate=1gbit id=…`), so every output says which network made its numbers.
        if let Some(info) = std::env::var("GRADKIT_CLUSTER_INFO")
            .ok()
            .filter(|s| !s.is_empty())
        {
            m.set("gradkit.cluster", info);
        }
        m
    }
    /// Sets `key` (a `gradkit.` prefix is added when missing).
    pub fn set(&mut self, key: &str, value: impl ToString) -> &mut Self {
        let key = if key.starts_with("gradkit.") {
            key.to_string()
        } else {
            format!("gradkit.{key}")
        };
        self.0.insert(key, value.to_string());
        self
    }
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .or_else(|| self.0.get(&format!("gradkit.{key}")))
            .map(|s| s.as_str())
    }
}

/// Where a table is read from.
#[derive(Clone, Debug)]
pub enum Input {
    Stdin,
    Path(PathBuf),
}

impl Input {
    /// `None` or `-` means stdin; stdin that is a terminal is refused with a hint.
    pub fn from_arg(arg: Option<&Path>) -> Result<Self> {
        match arg {
            Some(p) if p.as_os_str() != "-" => Ok(Input::Path(p.to_path_buf())),
            _ => {
                if std::io::stdin().is_terminal() {
                    bail!("no input: give a FILE, or pipe a table into stdin (e.g. `gradtrace synthetic … | TOOL`)");
                }
                Ok(Input::Stdin)
            }
        }
    }
    pub fn name(&self) -> String {
        match self {
            Input::Stdin => "<stdin>".into(),
            Input::Path(p) => p.display().to_string(),
        }
    }
    /// The whole input in memory (stdin is buffered: Parquet needs random access to read).
    fn bytes(&self) -> Result<Bytes> {
        match self {
            Input::Stdin => {
                let mut buf = Vec::new();
                std::io::stdin().lock().read_to_end(&mut buf)?;
                Ok(Bytes::from(buf))
            }
            Input::Path(p) => Ok(Bytes::from(
                std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?,
            )),
        }
    }
}

/// Where a table is written.
#[derive(Clone, Debug)]
pub enum Output {
    Stdout,
    Path(PathBuf),
}

impl Output {
    /// `None` or `-` means stdout, refused when stdout is a terminal (Parquet is binary) and
    /// under mpirun: there every rank's stdout is a pseudo-terminal that mpirun forwards, so
    /// rank 0 cannot tell a pipe from the user's terminal, and Open MPI does not promise to
    /// forward binary data unchanged (docs/RELIABILITY.md).
    pub fn from_arg(arg: Option<&Path>) -> Result<Self> {
        match arg {
            Some(p) if p.as_os_str() != "-" => Ok(Output::Path(p.to_path_buf())),
            _ => {
                if crate::cli::under_mpi_launcher() {
                    bail!("under mpirun a table cannot go to stdout (rank 0's stdout is mpirun's pseudo-terminal, so a terminal cannot be told from a pipe): give `-o FILE` (stdin works: rank 0 reads it)");
                }
                if std::io::stdout().is_terminal() {
                    bail!("refusing to write Parquet to a terminal: give `-o FILE`, or pipe into another tool (e.g. `| gradtrace inspect`)");
                }
                Ok(Output::Stdout)
            }
        }
    }
    pub fn name(&self) -> String {
        match self {
            Output::Stdout => "<stdout>".into(),
            Output::Path(p) => p.display().to_string(),
        }
    }
}

/// A table read from a file: its rows and its key-value metadata.
#[derive(Clone, Debug)]
pub struct Loaded<T> {
    pub rows: Vec<T>,
    pub meta: Meta,
    pub source: String,
}

/// Options for reading `tensor/1`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadOptions {
    pub allow_nonfinite: bool,
}

/// Reads a whole table of type `T`, validating the schema (and for `tensor/1` every row).
pub fn read_table<T: Table>(input: &Input, _opts: ReadOptions) -> Result<Loaded<T>> {
    let name = input.name();
    read_table_inner::<T>(input).with_context(|| format!("in {name}"))
}

/// Where the bytes of a file are read from: the file itself (each reading thread opens its
/// own handle) or, for stdin, a buffer in memory.
enum Source {
    File(PathBuf),
    Memory(Bytes),
}

/// The rows of row groups `groups`, read with `batch` rows per record batch.
fn read_row_groups<T: Table>(
    source: &Source,
    metadata: &ArrowReaderMetadata,
    groups: Vec<usize>,
    batch: usize,
) -> Result<Vec<T>> {
    fn rows<T: Table, R: parquet::file::reader::ChunkReader + 'static>(
        r: R,
        metadata: &ArrowReaderMetadata,
        groups: Vec<usize>,
        batch: usize,
    ) -> Result<Vec<T>> {
        // The file row of the first row read, so that a value that does not fit names it.
        let mut first_row: usize = metadata.metadata().row_groups()
            [..groups.first().map_or(0, |g| *g)]
            .iter()
            .map(|g| g.num_rows() as usize)
            .sum();
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(r, metadata.clone())
            .with_row_groups(groups)
            .with_batch_size(batch)
            .build()?;
        let mut rows = Vec::new();
        for b in reader {
            let b = b?;
            rows.extend(batch_to_rows_at::<T>(&b, first_row)?);
            first_row += b.num_rows();
        }
        Ok(rows)
    }
    match source {
        Source::File(p) => rows(
            File::open(p).with_context(|| format!("cannot read {}", p.display()))?,
            metadata,
            groups,
            batch,
        ),
        Source::Memory(b) => rows(b.clone(), metadata, groups, batch),
    }
}

/// A file without the `gradkit.schema` key (pandas and polars drop it): accepted as `T` when
/// its columns are `T`'s and no other table's, with a note on stderr; refused otherwise.
fn schema_from_columns<T: Table>(schema: &Schema, name: &str) -> Result<()> {
    let want = T::KIND.name();
    match SchemaKind::from_columns(schema)[..] {
        [k] if k == T::KIND => {
            crate::noteln!(
                "note: {name} has no `gradkit.schema` metadata key (pandas and polars drop it); \
                 its columns are those of {want}, so it is read as {want}"
            );
            Ok(())
        }
        [k] => bail!(
            "metadata key `gradkit.schema` is absent and the columns are those of `{}`, but \
             `{want}` is expected here",
            k.name()
        ),
        [] => {
            let missing = crate::tables::check_schema(&T::schema(), schema)
                .err()
                .map_or_else(String::new, |e| format!(": {e}"));
            bail!(
                "metadata key `gradkit.schema` is absent (expected `{want}`) and the columns are \
                 not those of any gradkit table{missing}; is this a gradkit file?"
            )
        }
        ref many => bail!(
            "metadata key `gradkit.schema` is absent and the columns are those of {}: set the \
             key to say which (e.g. pyarrow schema metadata {{\"gradkit.schema\": \"{want}\"}})",
            many.iter()
                .map(|k| format!("`{}`", k.name()))
                .collect::<Vec<_>>()
                .join(" and ")
        ),
    }
}

fn read_table_inner<T: Table>(input: &Input) -> Result<Loaded<T>> {
    let source = match input {
        Input::Path(p) => Source::File(p.clone()),
        Input::Stdin => Source::Memory(input.bytes()?),
    };
    let not_parquet = |e: parquet::errors::ParquetError| anyhow!("not a Parquet file ({e})");
    let metadata = match &source {
        Source::File(p) => ArrowReaderMetadata::load(
            &File::open(p).with_context(|| format!("cannot read {}", p.display()))?,
            Default::default(),
        ),
        Source::Memory(b) => ArrowReaderMetadata::load(b, Default::default()),
    }
    .map_err(not_parquet)?;
    let mut meta = Meta::default();
    if let Some(kv) = metadata.metadata().file_metadata().key_value_metadata() {
        for e in kv {
            if let Some(v) = &e.value {
                meta.0.insert(e.key.clone(), v.clone());
            }
        }
    }
    for (k, v) in metadata.schema().metadata() {
        meta.0.entry(k.clone()).or_insert_with(|| v.clone());
    }
    match meta.get("gradkit.schema") {
        None => schema_from_columns::<T>(metadata.schema(), &input.name())?,
        Some(s) if SchemaKind::parse(s) != Some(T::KIND) => bail!(
            "file holds `{s}` (metadata `gradkit.schema`) but `{}` is expected here",
            T::KIND.name()
        ),
        _ => {}
    }
    crate::tables::check_schema(&T::schema(), metadata.schema())?;
    // Record batches of about 8 MiB (decoded): one row of a big dense layer per batch, up to
    // 4096 small rows.
    let groups = metadata.metadata().row_groups();
    let (nrows, bytes) = groups.iter().fold((0i64, 0i64), |(n, b), g| {
        (n + g.num_rows(), b + g.total_byte_size())
    });
    let batch = (8i64 << 20)
        .checked_div(bytes / nrows.max(1))
        .unwrap_or(4096)
        .clamp(1, 4096) as usize;
    // Row groups are decoded on up to one thread per core, each a contiguous range, and the
    // rows concatenated in file order.
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(groups.len())
        .max(1);
    let ranges: Vec<Vec<usize>> = (0..threads)
        .map(|t| (t * groups.len() / threads..(t + 1) * groups.len() / threads).collect())
        .collect();
    let parts: Vec<Result<Vec<T>>> = if threads == 1 {
        ranges
            .into_iter()
            .map(|r| read_row_groups::<T>(&source, &metadata, r, batch))
            .collect()
    } else {
        std::thread::scope(|sc| {
            let handles: Vec<_> = ranges
                .into_iter()
                .map(|r| {
                    let (source, metadata) = (&source, &metadata);
                    sc.spawn(move || read_row_groups::<T>(source, metadata, r, batch))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow!("internal: a reader thread panicked")))
                })
                .collect()
        })
    };
    let mut rows = Vec::with_capacity(nrows.max(0) as usize);
    for p in parts {
        rows.extend(p?);
    }
    Ok(Loaded {
        rows,
        meta,
        source: input.name(),
    })
}

/// Reads and validates a `tensor/1` file (every check of docs/FORMAT.md).
pub fn read_tensor(input: &Input, opts: ReadOptions) -> Result<Loaded<TensorRow>> {
    let t = read_table::<TensorRow>(input, opts)?;
    // The per-value checks run on one thread per core; the first failing row (in file order)
    // is reported, as a sequential check would.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = t.rows.len().div_ceil(threads).max(1);
    let first_bad: Option<(usize, anyhow::Error)> = std::thread::scope(|sc| {
        let handles: Vec<_> = t
            .rows
            .chunks(chunk)
            .enumerate()
            .map(|(c, rows)| {
                sc.spawn(move || {
                    rows.iter().enumerate().find_map(|(i, r)| {
                        validate_tensor_row(r, opts.allow_nonfinite)
                            .err()
                            .map(|e| (c * chunk + i, e))
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().unwrap_or(None))
            .next()
    });
    let mut reg = LayerRegistry::default();
    for (i, r) in t.rows.iter().enumerate() {
        if let Some((bad, _)) = &first_bad {
            if *bad == i {
                let (_, e) = first_bad.expect("checked");
                return Err(e).with_context(|| format!("in {}", t.source));
            }
        }
        reg.check(r).with_context(|| format!("in {}", t.source))?;
    }
    Ok(t)
}

/// A streaming writer for one table: rows go out in row groups as they are written; the file
/// appears at its path only when [`TableWriter::finish`] succeeds.
///
/// Row groups are encoded on background threads (one per core, at most that many in flight)
/// and spliced into the file in order, so the output does not depend on timing: the row-group
/// boundaries depend only on the rows written.
pub struct TableWriter<T: Table> {
    file: Option<SerializedFileWriter<Box<dyn Write + Send>>>,
    factory: Option<ArrowRowGroupWriterFactory>,
    /// Slices of written batches not yet handed to an encoder, and their payload bytes.
    pending: Vec<RecordBatch>,
    pending_bytes: usize,
    in_flight: VecDeque<JoinHandle<Result<Vec<EncodedColumn>>>>,
    max_in_flight: usize,
    row_groups: usize,
    /// [`ROW_GROUP_BYTES`], smaller in tests.
    row_group_bytes: usize,
    tmp: Option<crate::paths::TempFile>,
    out: Output,
    _t: std::marker::PhantomData<T>,
}

/// Payload bytes (list items and 64 per row) per row group: readers parallelise over row
/// groups, and so does the writer.
const ROW_GROUP_BYTES: usize = 64 << 20;
/// Levels per low-level `write_batch` call of a list column; a row is never split.
const LEVEL_CHUNK: usize = 1 << 20;

fn writer_properties(kind: SchemaKind) -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).expect("level 1")))
        .set_dictionary_enabled(false);
    let path = |c: &str| ColumnPath::new(vec![c.into(), "list".into(), "item".into()]);
    for c in ["layer", "run", "tool", "algo", "metric"] {
        b = b.set_column_dictionary_enabled(ColumnPath::from(c), true);
    }
    if kind == SchemaKind::Tensor {
        // Measured 1.5x smaller and no slower (DESIGN §2b).
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
enum EncodedColumn {
    /// Encoded by arrow-rs's column writer (scalar columns).
    Arrow(ArrowColumnChunk),
    /// A list column encoded by the low-level column writer into a buffer of its own.
    Raw(Bytes, ColumnCloseResult),
}

/// How a top-level column is encoded.
#[derive(Clone)]
enum ColumnPlan {
    Arrow,
    /// A list of non-null `f32` or `u32` items: levels are computed here from the offsets
    /// (arrow-rs materialises a `usize` index and two level vectors per item, which costs
    /// more than the encoding itself on long lists).
    List(ColumnDescPtr),
}

fn column_plans(schema: &Schema, descr: &SchemaDescriptor) -> Vec<ColumnPlan> {
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
fn row_bytes(batch: &RecordBatch) -> Vec<usize> {
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
struct Levels {
    def: Vec<i16>,
    rep: Vec<i16>,
}

/// Writes a list column through `w` with levels computed from the offsets: per row a null
/// list, an empty list, or `n` items (repetition 0 then 1s). Rows are grouped into
/// `write_batch` calls of about [`LEVEL_CHUNK`] levels and never split across calls.
fn write_list<P: parquet::data_type::DataType>(
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

/// Encodes one list column of a row group's batches into a buffer of its own.
fn encode_list_column(
    descr: &ColumnDescPtr,
    props: &WriterPropertiesPtr,
    batches: &[RecordBatch],
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

/// Encodes one row group (the job of a background thread).
fn encode_row_group(
    batches: Vec<RecordBatch>,
    writers: Vec<ArrowColumnWriter>,
    plans: Vec<ColumnPlan>,
    props: WriterPropertiesPtr,
) -> Result<Vec<EncodedColumn>> {
    let mut lv = Levels::default();
    let mut out = Vec::with_capacity(writers.len());
    for (col, (mut w, plan)) in writers.into_iter().zip(plans).enumerate() {
        match plan {
            ColumnPlan::List(descr) => {
                out.push(encode_list_column(&descr, &props, &batches, col, &mut lv)?)
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

impl<T: Table> TableWriter<T> {
    /// Opens `out` for a table of type `T` with `meta` (the schema key is added here).
    pub fn create(out: &Output, meta: &Meta) -> Result<Self> {
        let (sink, tmp): (Box<dyn Write + Send>, Option<crate::paths::TempFile>) = match out {
            Output::Stdout => (Box::new(std::io::stdout()), None),
            // A device, FIFO or `/dev/stdout` is written in place: renaming a temporary
            // file over it would replace the device node.
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
        };
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
            if k != "gradkit.schema" {
                writer.append_key_value_metadata(KeyValue::new(k.clone(), v.clone()));
            }
        }
        let (file, factory) = writer.into_serialized_writer()?;
        let max_in_flight = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(TableWriter {
            file: Some(file),
            factory: Some(factory),
            pending: Vec::new(),
            pending_bytes: 0,
            in_flight: VecDeque::new(),
            max_in_flight,
            row_groups: 0,
            row_group_bytes: ROW_GROUP_BYTES,
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
        self.write_batch(T::to_batch(rows)?)
            .with_context(|| format!("writing {}", self.out.name()))
    }

    /// Like [`TableWriter::write`], consuming the rows: a big row's buffers move into the
    /// encoder instead of being copied (what a producer that no longer needs its rows calls).
    pub fn write_owned(&mut self, rows: Vec<T>) -> Result<()> {
        let name = self.out.name();
        self.write_owned_inner(rows)
            .with_context(|| format!("writing {name}"))
    }

    fn write_owned_inner(&mut self, rows: Vec<T>) -> Result<()> {
        let mut small = Vec::new();
        for r in rows {
            if approx_row_bytes(&r) >= 1 << 20 {
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
        let mut start = 0;
        for (i, b) in sizes.iter().enumerate() {
            self.pending_bytes += b;
            if self.pending_bytes >= self.row_group_bytes {
                self.pending.push(batch.slice(start, i + 1 - start));
                start = i + 1;
                self.submit()?;
            }
        }
        if start < batch.num_rows() {
            self.pending
                .push(batch.slice(start, batch.num_rows() - start));
        }
        Ok(())
    }

    /// Hands the pending rows to a background encoder as one row group.
    fn submit(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        while self.in_flight.len() >= self.max_in_flight {
            self.append_oldest()?;
        }
        let batches = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let file = self.file.as_ref().expect("writer open");
        let writers = self
            .factory
            .as_ref()
            .expect("writer open")
            .create_column_writers(self.row_groups)?;
        let plans = column_plans(batches[0].schema_ref(), file.schema_descr());
        let props = file.properties().clone();
        self.row_groups += 1;
        self.in_flight.push_back(std::thread::spawn(move || {
            encode_row_group(batches, writers, plans, props)
        }));
        Ok(())
    }

    /// Waits for the oldest row group in flight and splices it into the file.
    fn append_oldest(&mut self) -> Result<()> {
        let Some(job) = self.in_flight.pop_front() else {
            return Ok(());
        };
        let cols = job
            .join()
            .map_err(|_| anyhow!("internal: a row-group encoder panicked"))??;
        let file = self.file.as_mut().expect("writer open");
        let mut rg = file.next_row_group()?;
        for c in cols {
            match c {
                EncodedColumn::Arrow(chunk) => chunk.append_to_row_group(&mut rg)?,
                EncodedColumn::Raw(bytes, close) => rg.append_column(&bytes, close)?,
            }
        }
        rg.close()?;
        Ok(())
    }

    /// Closes the file and renames it into place.
    pub fn finish(mut self) -> Result<()> {
        let name = self.out.name();
        self.submit().with_context(|| format!("writing {name}"))?;
        while !self.in_flight.is_empty() {
            self.append_oldest()
                .with_context(|| format!("writing {name}"))?;
        }
        let file = self.file.take().expect("writer open");
        let mut sink = file
            .into_inner()
            .with_context(|| format!("writing {name}"))?;
        sink.flush().with_context(|| format!("writing {name}"))?;
        drop(sink);
        if let Some(tmp) = self.tmp.take() {
            tmp.persist()?;
        }
        Ok(())
    }
}

impl<T: Table> Drop for TableWriter<T> {
    fn drop(&mut self) {
        // Not finished: an error happened; leave nothing half-written behind.
        if let Some(tmp) = self.tmp.take() {
            self.file.take();
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
            bytes += approx_row_bytes(&rows[end]);
            end += 1;
        }
        w.write(&rows[start..end])?;
        start = end;
    }
    w.finish()
}

fn approx_row_bytes<T: 'static>(r: &T) -> usize {
    let any: &dyn std::any::Any = r;
    match any.downcast_ref::<TensorRow>() {
        Some(t) => 64 + 4 * (t.values.len() + t.indices.as_ref().map_or(0, |i| i.len())),
        None => 64,
    }
}

/// Writes a whole file atomically: `PATH.tmp-<pid>`, then a rename, so a failed or killed
/// run never leaves a half-written file at `path`. A path that exists and is not a regular
/// file (a device, a FIFO, `/dev/stdout`) is written in place instead.
pub fn write_file_atomic(path: &Path, data: &[u8]) -> Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return std::fs::write(path, data)
            .with_context(|| format!("cannot write {}", path.display()));
    }
    let tmp = crate::paths::TempFile::create(path)?;
    let mut f = tmp.file();
    f.write_all(data)
        .with_context(|| format!("cannot write {}", path.display()))?;
    tmp.persist()
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    fn row(step: u32, id: u32, n: usize, sparse: bool, shape: bool) -> TensorRow {
        let values: Vec<f32> = (0..n)
            .map(|i| (i as f32 - 7.5) * (step + 1) as f32)
            .collect();
        TensorRow {
            step,
            rank: 0,
            layer_id: id,
            layer: format!("l{id}"),
            numel: if sparse { 10 * n as u64 + 1 } else { n as u64 },
            shape: shape.then(|| vec![if sparse { 10 * n as u32 + 1 } else { n as u32 }]),
            indices: sparse.then(|| (0..n as u32).map(|i| 10 * i + 1).collect()),
            values,
        }
    }

    #[test]
    fn long_lists_and_many_row_groups_read_back_unchanged() {
        // Rows longer than one low-level write (LEVEL_CHUNK levels), empty sparse rows, rows
        // without shape, and row groups of ~3 MiB so that several are encoded in parallel.
        let n_long = LEVEL_CHUNK + LEVEL_CHUNK / 2;
        let mut rows = Vec::new();
        for step in 0..6 {
            rows.push(row(step, 0, n_long, false, step % 2 == 0));
            rows.push(row(step, 1, 0, true, true));
            rows.push(row(step, 2, 3, true, step % 3 != 0));
            for k in 0..50 {
                rows.push(row(
                    step,
                    3 + k,
                    (k as usize * 37) % 200,
                    k % 2 == 0,
                    k % 5 != 0,
                ));
            }
        }
        let dir = std::env::temp_dir().join(format!("gradkit-io-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("long.parquet");
        let mut w =
            TableWriter::<TensorRow>::create(&Output::Path(p.clone()), &Meta::default()).unwrap();
        w.row_group_bytes = 3 << 20;
        for chunk in rows.chunks(20) {
            w.write(chunk).unwrap();
        }
        w.finish().unwrap();
        let reader = SerializedFileReader::new(File::open(&p).unwrap()).unwrap();
        let groups = reader.metadata().num_row_groups();
        assert!(groups >= 6, "expected several row groups, got {groups}");
        let total: i64 = reader
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows())
            .sum();
        assert_eq!(total as usize, rows.len());
        let back = read_tensor(&Input::Path(p.clone()), ReadOptions::default()).unwrap();
        assert_eq!(back.rows, rows);
        // The consuming path writes the same rows, big ones without a copy.
        let mut w =
            TableWriter::<TensorRow>::create(&Output::Path(p.clone()), &Meta::default()).unwrap();
        w.row_group_bytes = 3 << 20;
        for chunk in rows.chunks(20) {
            w.write_owned(chunk.to_vec()).unwrap();
        }
        w.finish().unwrap();
        let back = read_tensor(&Input::Path(p.clone()), ReadOptions::default()).unwrap();
        assert_eq!(back.rows, rows);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
