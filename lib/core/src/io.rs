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
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::column::writer::{
    get_column_writer, ColumnCloseResult, ColumnWriter, ColumnWriterImpl,
};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterPropertiesPtr};
use parquet::file::reader::Length;
use parquet::file::writer::{SerializedFileWriter, SerializedPageWriter, TrackedWrite};
use parquet::schema::types::{ColumnDescPtr, ColumnPath, SchemaDescriptor};

use crate::tables::{
    batch_to_rows_at, validate_tensor_row, LayerRegistry, SchemaKind, Table, TensorRow,
};
use crate::write_pages::{assemble_chunk, EncodedPage, PageTask, ValuesWriter};

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
    ///
    /// A file path is checked at once ([`crate::paths::check_creatable`]): a missing or
    /// read-only directory stops the run before it does any work, not after.
    pub fn from_arg(arg: Option<&Path>) -> Result<Self> {
        Self::for_flag("-o", arg)
    }

    /// [`Output::from_arg`] for the output given by `flag` (named in its errors).
    pub fn for_flag(flag: &str, arg: Option<&Path>) -> Result<Self> {
        match arg {
            Some(p) if p.as_os_str() != "-" => {
                crate::paths::check_creatable(flag, p)?;
                Ok(Output::Path(p.to_path_buf()))
            }
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
    /// An open file read by one thread only (stdin spooled to an unnamed temporary file).
    Handle(File),
    Memory(Bytes),
}

/// Data the Parquet decoder could not read (a garbled page). The Arrow reader wraps the
/// decoder's message twice (`Parquet argument error: Parquet error: …`); this says it once.
#[derive(Debug)]
struct Damaged(String);

impl std::fmt::Display for Damaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Parquet error: {}", self.0)
    }
}

impl std::error::Error for Damaged {}

/// A batch's decoding error: the decoder's own said once (`Parquet error: …`), the rest as
/// they are. For every reader of Parquet batches, here and in the other crates.
pub fn decode_error(e: arrow_schema::ArrowError) -> anyhow::Error {
    match e {
        arrow_schema::ArrowError::ParquetError(m) => {
            let m = m.strip_prefix("Parquet error: ").unwrap_or(&m).to_string();
            anyhow::Error::new(Damaged(m))
        }
        e => e.into(),
    }
}

/// The file row where each row group starts.
fn group_starts(metadata: &ArrowReaderMetadata) -> Vec<usize> {
    metadata
        .metadata()
        .row_groups()
        .iter()
        .scan(0usize, |acc, g| {
            let s = *acc;
            *acc += g.num_rows().max(0) as usize;
            Some(s)
        })
        .collect()
}

/// Where a read of row groups `candidates` met damaged data, for its message: a batch may span
/// several row groups, so on that error path each is read again on its own, every column, and
/// the first that fails is named (`row group 4 of 6 (file rows from 32)`, from `row` when that
/// is later); only when none fails alone are the candidates named as a range.
fn damage_at(
    source: &Source,
    metadata: &ArrowReaderMetadata,
    candidates: &[usize],
    row: usize,
) -> String {
    let starts = group_starts(metadata);
    let total = starts.len();
    let fails = |g: usize| -> bool {
        let read = || -> Result<()> {
            let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(
                source.chunk_reader()?,
                metadata.clone(),
            )
            .with_row_groups(vec![g])
            .build()?;
            for b in reader {
                b?;
            }
            Ok(())
        };
        read().is_err()
    };
    let named = match candidates {
        [g] => Some(*g),
        _ => candidates.iter().copied().find(|&g| fails(g)),
    };
    match (named, candidates.first(), candidates.last()) {
        (Some(g), _, _) => {
            let from = starts.get(g).map_or(row, |&s| s.max(row));
            format!("row group {g} of {total} (file rows from {from})")
        }
        (None, Some(a), Some(b)) => format!("row groups {a}–{b} of {total} (file rows from {row})"),
        _ => format!("file rows from {row}"),
    }
}

/// The row groups that file rows `row .. row + len` fall in.
fn groups_of_rows(metadata: &ArrowReaderMetadata, row: usize, len: usize) -> Vec<usize> {
    let starts = group_starts(metadata);
    let group = |r: usize| starts.partition_point(|&s| s <= r).max(1) - 1;
    (group(row)..=group(row + len.max(1) - 1)).collect()
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
            let b = b.map_err(decode_error)?;
            rows.extend(batch_to_rows_at::<T>(&b, first_row)?);
            first_row += b.num_rows();
        }
        Ok(rows)
    }
    let read = match source {
        Source::File(p) => rows(
            File::open(p).with_context(|| format!("cannot read {}", p.display()))?,
            metadata,
            groups.clone(),
            batch,
        ),
        Source::Handle(f) => rows(
            f.try_clone().context("cannot read the buffered input")?,
            metadata,
            groups.clone(),
            batch,
        ),
        Source::Memory(b) => rows(b.clone(), metadata, groups.clone(), batch),
    };
    read.map_err(|e| {
        if e.is::<Damaged>() {
            let starts = group_starts(metadata);
            let first = groups.first().and_then(|&g| starts.get(g)).copied();
            e.context(damage_at(source, metadata, &groups, first.unwrap_or(0)))
        } else {
            e
        }
    })
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

/// The footer of `source`, checked to hold a table of type `T` (schema key or columns, column
/// types), and its key-value metadata.
fn checked_metadata<T: Table>(source: &Source, name: &str) -> Result<(ArrowReaderMetadata, Meta)> {
    let not_parquet = |e: parquet::errors::ParquetError| anyhow!("not a Parquet file ({e})");
    let metadata = match source {
        Source::File(p) => ArrowReaderMetadata::load(
            &File::open(p).with_context(|| format!("cannot read {}", p.display()))?,
            Default::default(),
        ),
        Source::Handle(f) => ArrowReaderMetadata::load(f, Default::default()),
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
        None => schema_from_columns::<T>(metadata.schema(), name)?,
        Some(s) if SchemaKind::parse(s) != Some(T::KIND) => bail!(
            "file holds `{s}` (metadata `gradkit.schema`) but `{}` is expected here",
            T::KIND.name()
        ),
        _ => {}
    }
    crate::tables::check_schema(&T::schema(), metadata.schema())?;
    Ok((metadata, meta))
}

/// Rows per record batch: about 8 MiB decoded, i.e. one row of a big dense layer per batch,
/// up to 4096 small rows.
fn batch_rows(metadata: &ArrowReaderMetadata) -> usize {
    batch_rows_of(metadata, 8 << 20)
}

/// Rows per record batch of about `target` bytes decoded (at least 1, at most 4096).
/// Rows per record batch of the key passes ([`TensorStream::scan`], `step_layout`).
const KEY_BATCH: usize = 1 << 16;

fn batch_rows_of(metadata: &ArrowReaderMetadata, target: i64) -> usize {
    let groups = metadata.metadata().row_groups();
    let (nrows, bytes) = groups.iter().fold((0i64, 0i64), |(n, b), g| {
        (n + g.num_rows(), b + g.total_byte_size())
    });
    target
        .checked_div(bytes / nrows.max(1))
        .unwrap_or(4096)
        .clamp(1, 4096) as usize
}

fn read_table_inner<T: Table>(input: &Input) -> Result<Loaded<T>> {
    let source = match input {
        Input::Path(p) => Source::File(p.clone()),
        Input::Stdin => Source::Memory(input.bytes()?),
    };
    let (metadata, meta) = checked_metadata::<T>(&source, &input.name())?;
    let batch = batch_rows(&metadata);
    let groups = metadata.metadata().row_groups();
    let nrows: i64 = groups.iter().map(|g| g.num_rows()).sum();
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

// ---------------------------------------------------------------------------------------------
// Streaming reads of `tensor/1` (docs/MEMORY.md): rows in file order, a chunk at a time, or one
// step (every rank and layer of it) at a time, so that a tool holds one step, not the trace.

/// Record batches decoded ahead of the consumer by the reading thread.
const READ_AHEAD: usize = 1;
/// Decoded bytes per record batch when streaming: a batch is decoded, its levels and a copy
/// into rows exist at once, and [`READ_AHEAD`] more wait, so this bounds the reader's memory.
const STREAM_BATCH_BYTES: i64 = 2 << 20;

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
            self.src.chunk_reader()?,
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
                // `values` decoded into reused buffers where its layout allows (issue 19).
                let layout = crate::read_values::ValuesLayout::of(&metadata);
                for (groups, mut first_row) in parts {
                    let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(
                        src.chunk_reader()?,
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
                            let r = src.chunk_reader()?;
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

impl Source {
    /// A reader of the bytes for one thread.
    fn chunk_reader(&self) -> Result<SourceReader> {
        Ok(match self {
            Source::File(p) => SourceReader::File(
                File::open(p).with_context(|| format!("cannot read {}", p.display()))?,
            ),
            Source::Handle(f) => {
                SourceReader::File(f.try_clone().context("cannot read the input")?)
            }
            Source::Memory(b) => SourceReader::Memory(b.clone()),
        })
    }
}

/// [`Source`] as one `ChunkReader` type.
enum SourceReader {
    File(File),
    Memory(Bytes),
}

impl parquet::file::reader::Length for SourceReader {
    fn len(&self) -> u64 {
        match self {
            SourceReader::File(f) => Length::len(f),
            SourceReader::Memory(b) => Length::len(b),
        }
    }
}

impl parquet::file::reader::ChunkReader for SourceReader {
    type T = Box<dyn Read + Send>;
    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(match self {
            SourceReader::File(f) => Box::new(f.get_read(start)?),
            SourceReader::Memory(b) => Box::new(b.get_read(start)?),
        })
    }
    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        match self {
            SourceReader::File(f) => f.get_bytes(start, length),
            SourceReader::Memory(b) => b.get_bytes(start, length),
        }
    }
}

/// Stdin copied into an unnamed temporary file under the temporary directory ($TMPDIR), so
/// that a trace larger than memory can be piped; in memory when no such file can be created.
fn spool_stdin() -> Result<Source> {
    let dir = std::env::temp_dir();
    let Ok(mut f) = anonymous_file(&dir) else {
        return Ok(Source::Memory(Input::Stdin.bytes()?));
    };
    std::io::copy(&mut std::io::stdin().lock(), &mut f).with_context(|| {
        format!(
            "cannot buffer <stdin> in a temporary file in {} (set TMPDIR to a directory with \
             room, or give the input as a FILE)",
            dir.display()
        )
    })?;
    Ok(Source::Handle(f))
}

/// A read-write file in `dir` that has no name (`O_TMPFILE`, or created and unlinked at once),
/// so that it disappears when closed, whatever ends the process.
pub(crate) fn anonymous_file(dir: &Path) -> std::io::Result<File> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        if let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE)
            .open(dir)
        {
            return Ok(f);
        }
    }
    let path = dir.join(format!(".gradkit-stdin-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(f)
}

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

type FileWriter = SerializedFileWriter<Box<dyn Write + Send>>;

/// The file being written, shared with the row-group encoders: each appends its own row group
/// when `next` is its index, so row groups land in order while the calling thread goes on
/// encoding (issue 19: the appends were a serial step of the calling thread).
struct Splice {
    state: std::sync::Mutex<SpliceState>,
    turn: std::sync::Condvar,
}

struct SpliceState {
    file: Option<FileWriter>,
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
            false => cols.and_then(|c| append_row_group(st.file.as_mut().expect("open"), c)),
        };
        match done {
            Ok(()) => st.next += 1,
            Err(_) => st.failed = true,
        }
        self.turn.notify_all();
        done
    }
}

/// Splices one encoded row group into the file.
fn append_row_group(file: &mut FileWriter, cols: Vec<EncodedColumn>) -> Result<()> {
    let mut rg = file.next_row_group()?;
    for c in cols {
        match c {
            EncodedColumn::Arrow(chunk) => chunk.append_to_row_group(&mut rg)?,
            EncodedColumn::Raw(bytes, close) => rg.append_column(&bytes, close)?,
            EncodedColumn::Pages(chunk, close) => rg.append_column(&chunk, close)?,
        }
    }
    rg.close()?;
    Ok(())
}

/// Payload bytes (list items and 64 per row) per row group: readers parallelise over row
/// groups, and so does the writer. It bounds the writer's memory (docs/MEMORY.md): the row
/// group being filled, plus those being encoded (their rows and their encoded copy) up to
/// [`IN_FLIGHT_BYTES`]. 64 MiB made `gradtrace cat` of a 56 MiB step peak at 5 × a step;
/// 16 MiB costs nothing measurable in file size (a row group's metadata is ~1 KiB).
const ROW_GROUP_BYTES: usize = 16 << 20;
/// Payload bytes of the row groups being encoded in the background at once (at least one row
/// group, however big; at most one per core).
const IN_FLIGHT_BYTES: usize = 2 * ROW_GROUP_BYTES;
/// `tensor/1`: bytes of the row groups whose `values` pages the calling thread encoded
/// (write_pages.rs) that may be in flight at once: encoded pages and the other columns'
/// payload (at least one row group). The background threads only assemble and append them;
/// under mpirun with busy-waiting ranks they may wait long for a core, and each group held
/// there is a step's encoded copy (docs/MEMORY.md).
const ENCODED_IN_FLIGHT_BYTES: usize = ROW_GROUP_BYTES;
/// `tensor/1`: bytes of rows whose `values` pages are encoded in one go, on all cores.
const ENCODE_WINDOW_BYTES: usize = ROW_GROUP_BYTES;
/// `tensor/1`: a row group holding at least this many payload bytes ends where the step
/// changes. Measured: a row group per 48 KiB step of a small model makes the file 12 % bigger
/// and its footer 13 MB for 2000 steps; at 1 MiB the cost is below 1 %.
const STEP_GROUP_BYTES: usize = 1 << 20;

/// Pending batches joined into one ([`TableWriter::coalesce_pending`]).
const COALESCE_BATCHES: usize = 64;
/// Levels per low-level `write_batch` call of a list column; a row is never split.
const LEVEL_CHUNK: usize = 1 << 20;

pub(crate) fn writer_properties(kind: SchemaKind) -> WriterProperties {
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
    /// `values`, its pages encoded by write_pages.rs.
    Pages(crate::write_pages::Chunk, ColumnCloseResult),
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

/// Encodes one list column of a row group's batches into a buffer of its own. Each batch is
/// dropped once written: for the last column (`values`) that frees the rows as their encoded
/// copy grows, so a row group is held about once, not twice (docs/MEMORY.md).
fn encode_list_column(
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
type PagesOf = (usize, ColumnDescPtr, Vec<EncodedPage>);

/// Encodes one row group (the job of a background thread); the column in `pages`, if any,
/// is already encoded (write_pages.rs) and only assembled here.
fn encode_row_group(
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
        let values = if std::any::TypeId::of::<T>() == std::any::TypeId::of::<TensorRow>() {
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
            let file = self.file.state()?.file.take().expect("writer open");
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
            bytes += approx_row_bytes(&rows[end]);
            end += 1;
        }
        w.write(&rows[start..end])?;
        start = end;
    }
    w.finish()
}

/// The rows as `TensorRow`s, when `T` is `TensorRow`.
fn tensor_rows<T: 'static>(rows: &[T]) -> Option<Vec<&TensorRow>> {
    rows.iter()
        .map(|r| (r as &dyn std::any::Any).downcast_ref::<TensorRow>())
        .collect()
}

/// Payload bytes of a row, as [`row_bytes`] counts them in its batch.
fn tensor_row_bytes(r: &TensorRow) -> usize {
    let n = |v: &Option<Vec<u32>>| v.as_ref().map_or(0, |v| v.len());
    64 + 4 * (n(&r.shape) + n(&r.indices) + r.values.len())
}

/// A copy of `r` without its values (they are encoded from `r` itself).
fn without_values(r: &TensorRow) -> TensorRow {
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
    write_file_atomic_with(path, |w| w.write_all(data))
}

/// [`write_file_atomic`] of the bytes `fill` writes, through a buffer: a big file is not held
/// whole in memory first.
pub fn write_file_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    match write_file_staged(path, fill)? {
        Some(tmp) => tmp.persist(),
        None => Ok(()),
    }
}

/// [`write_file_atomic_with`] without the rename: the complete file, to be committed with a
/// run's other outputs ([`crate::paths::commit_all`]); None when `path` is a device or FIFO,
/// written in place.
pub fn write_file_staged(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<Option<crate::paths::TempFile>> {
    let ctx = || format!("cannot write {}", path.display());
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        let mut f = std::io::BufWriter::new(File::create(path).with_context(ctx)?);
        fill(&mut f).and_then(|_| f.flush()).with_context(ctx)?;
        return Ok(None);
    }
    let tmp = crate::paths::TempFile::create(path)?;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, tmp.file());
    fill(&mut f).and_then(|_| f.flush()).with_context(ctx)?;
    drop(f);
    Ok(Some(tmp))
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

    /// A small dense trace: `steps` × `ranks` × 3 layers, values from (step, rank, layer, i).
    fn trace(steps: u32, ranks: u32) -> Vec<TensorRow> {
        let mut rows = Vec::new();
        for step in 0..steps {
            for rank in 0..ranks {
                for (id, n) in [(0u32, 5usize), (1, 300), (2, 2)] {
                    let values = (0..n)
                        .map(|i| (step * 1000 + rank * 100 + id * 10) as f32 + i as f32 * 0.5)
                        .collect();
                    rows.push(TensorRow {
                        step,
                        rank,
                        layer_id: id,
                        layer: format!("l{id}"),
                        numel: n as u64,
                        shape: (id != 1 || step > 0).then(|| vec![n as u32]),
                        indices: None,
                        values,
                    });
                }
            }
        }
        rows
    }

    /// The reference: every row of the file (the whole-trace reader), grouped by step in file
    /// order, steps ascending.
    fn by_step_reference(p: &Path) -> Vec<(u32, Vec<TensorRow>)> {
        let all = read_tensor(&Input::Path(p.to_path_buf()), ReadOptions::default()).unwrap();
        let mut m: BTreeMap<u32, Vec<TensorRow>> = BTreeMap::new();
        for r in all.rows {
            m.entry(r.step).or_default().push(r);
        }
        m.into_iter().collect()
    }

    fn write_rows(p: &Path, rows: &[TensorRow], group_bytes: usize, chunk: usize) {
        let mut w =
            TableWriter::<TensorRow>::create(&Output::Path(p.to_path_buf()), &Meta::default())
                .unwrap();
        w.row_group_bytes = group_bytes;
        w.step_group_bytes = 0;
        for c in rows.chunks(chunk) {
            w.write(c).unwrap();
        }
        w.finish().unwrap();
    }

    #[test]
    fn steps_stream_ordered_and_unordered_traces_as_the_whole_reader_groups_them() {
        let dir = tempfile::tempdir().unwrap();
        let rows = trace(5, 3);
        // Ordered by step, written in chunks that straddle steps.
        let ordered = dir.path().join("ordered.parquet");
        write_rows(&ordered, &rows, 64 << 20, 7);
        let s = TensorStream::open(&Input::Path(ordered.clone()), ReadOptions::default()).unwrap();
        let scan = s.scan().unwrap();
        assert_eq!(scan.steps, vec![0, 1, 2, 3, 4]);
        assert_eq!(scan.ranks, vec![0, 1, 2]);
        assert_eq!(scan.rows, rows.len() as u64);
        assert_eq!(scan.disorder, None);
        // Layer 1 has no shape at step 0: the first shape given, from step 1.
        assert_eq!(scan.shapes.get(&1), Some(&vec![300]));
        let got: Vec<_> = s.steps(&scan).unwrap().map(|x| x.unwrap()).collect();
        assert_eq!(got, by_step_reference(&ordered));
        // Rank-major (each rank's steps in turn): not ordered by step, but each row group holds
        // one step (the writer cuts there), so it is streamed row group by row group.
        let mut rm = rows.clone();
        rm.sort_by_key(|r| (r.rank, r.step));
        let unordered = dir.path().join("rank-major.parquet");
        write_rows(&unordered, &rm, 64 << 20, 1000);
        let s =
            TensorStream::open(&Input::Path(unordered.clone()), ReadOptions::default()).unwrap();
        let scan = s.scan().unwrap();
        // Rank 1's step 0 is row 5 steps × 3 layers = 15, after rank 0's step 4.
        assert_eq!(scan.disorder, Some((0, 15, 4)));
        assert!(scan
            .group_steps
            .iter()
            .all(|g| matches!(g, Some((a, b)) if a == b)));
        let st = s.steps(&scan).unwrap();
        assert!(st.streamed);
        let got: Vec<_> = st.map(|x| x.unwrap()).collect();
        assert_eq!(got, by_step_reference(&unordered));
        let mut want = by_step_reference(&ordered);
        for (_, v) in &mut want {
            v.sort_by_key(|r| (r.rank, r.layer_id));
        }
        assert_eq!(got, want);
        // The same rows in one row group, as other writers make it: read whole, same steps.
        let mixed = dir.path().join("mixed.parquet");
        let schema = std::sync::Arc::new(TensorRow::schema().as_ref().clone().with_metadata(
            std::collections::HashMap::from([(
                "gradkit.schema".to_string(),
                "tensor/1".to_string(),
            )]),
        ));
        let mut w =
            ArrowWriter::try_new(File::create(&mixed).unwrap(), schema.clone(), None).unwrap();
        let b = TensorRow::to_batch(&rm).unwrap();
        w.write(&b.with_schema(schema).unwrap()).unwrap();
        w.close().unwrap();
        let s = TensorStream::open(&Input::Path(mixed.clone()), ReadOptions::default()).unwrap();
        let scan = s.scan().unwrap();
        assert_eq!(scan.disorder, Some((0, 15, 4)));
        assert_eq!(scan.group_steps, vec![Some((0, 4))]);
        let st = s.steps(&scan).unwrap();
        assert!(!st.streamed);
        let got: Vec<_> = st.map(|x| x.unwrap()).collect();
        assert_eq!(got, by_step_reference(&mixed));
        assert_eq!(got, want);
    }

    #[test]
    fn chunks_validate_every_row_and_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut rows = trace(4, 2);
        // A NaN in the last step, and a layer that changes its numel after that: the first
        // failing row in file order is the one reported.
        let bad = rows.len() - 2;
        rows[bad].values[1] = f32::NAN;
        let p = dir.path().join("nan.parquet");
        write_rows(&p, &rows, 64 << 20, 5);
        let whole = read_tensor(&Input::Path(p.clone()), ReadOptions::default())
            .unwrap_err()
            .to_string();
        let mut steps = read_tensor_steps(&Input::Path(p.clone()), ReadOptions::default()).unwrap();
        let mut err = None;
        for s in &mut steps {
            if let Err(e) = s {
                err = Some(e);
                break;
            }
        }
        let e = format!("{:#}", err.expect("the NaN is reported"));
        assert!(e.starts_with(&format!("in {}", p.display())), "{e}");
        assert!(
            e.contains("non-finite value NaN at position 1 (step 3 rank 1 layer `l1`)"),
            "{e}"
        );
        assert!(whole.starts_with("in "), "{whole}");
        // Accepted with allow_nonfinite: every row comes back.
        let opts = ReadOptions {
            allow_nonfinite: true,
        };
        let n: usize = TensorStream::open(&Input::Path(p.clone()), opts)
            .unwrap()
            .chunks()
            .map(|c| c.unwrap().len())
            .sum();
        assert_eq!(n, rows.len());
    }

    #[test]
    fn a_row_group_never_holds_two_steps() {
        let dir = tempfile::tempdir().unwrap();
        let rows = trace(6, 2);
        let p = dir.path().join("groups.parquet");
        // One write call holding every step: the writer still cuts at each step.
        write_rows(&p, &rows, 64 << 20, rows.len());
        let reader = SerializedFileReader::new(File::open(&p).unwrap()).unwrap();
        let mut steps_of_groups = Vec::new();
        for g in reader.metadata().row_groups() {
            let st = g.column(0).statistics().expect("step statistics");
            let (lo, hi) = match st {
                parquet::file::statistics::Statistics::Int32(s) => {
                    (*s.min_opt().unwrap(), *s.max_opt().unwrap())
                }
                other => panic!("step stored as {other:?}"),
            };
            assert_eq!(lo, hi, "a row group holds steps {lo}..{hi}");
            steps_of_groups.push(lo);
        }
        assert_eq!(steps_of_groups, vec![0, 1, 2, 3, 4, 5]);
        let back = read_tensor(&Input::Path(p.clone()), ReadOptions::default()).unwrap();
        assert_eq!(back.rows, rows);
        // With the default threshold, these small steps (2 × 307 values) share a row group.
        let mut w =
            TableWriter::<TensorRow>::create(&Output::Path(p.clone()), &Meta::default()).unwrap();
        w.write(&rows).unwrap();
        w.finish().unwrap();
        let reader = SerializedFileReader::new(File::open(&p).unwrap()).unwrap();
        assert_eq!(reader.metadata().num_row_groups(), 1);
    }
}
