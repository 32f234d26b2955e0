//! Parquet I/O for the three tables: inputs from a path or stdin, outputs to a path (written as
//! `PATH.tmp-<pid>` and renamed on success) or to stdout when it is not a terminal.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::tables::{
    batch_to_rows, validate_tensor_row, LayerRegistry, SchemaKind, Table, TensorRow,
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
    /// `None` or `-` means stdout, refused when stdout is a terminal (Parquet is binary).
    pub fn from_arg(arg: Option<&Path>) -> Result<Self> {
        match arg {
            Some(p) if p.as_os_str() != "-" => Ok(Output::Path(p.to_path_buf())),
            _ => {
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

fn read_table_inner<T: Table>(input: &Input) -> Result<Loaded<T>> {
    let bytes = input.bytes()?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(|e| anyhow!("not a Parquet file ({e})"))?;
    let mut meta = Meta::default();
    if let Some(kv) = builder.metadata().file_metadata().key_value_metadata() {
        for e in kv {
            if let Some(v) = &e.value {
                meta.0.insert(e.key.clone(), v.clone());
            }
        }
    }
    for (k, v) in builder.schema().metadata() {
        meta.0.entry(k.clone()).or_insert_with(|| v.clone());
    }
    match meta.get("gradkit.schema") {
        None => bail!(
            "metadata key `gradkit.schema` is absent (expected `{}`); is this a gradkit file?",
            T::KIND.name()
        ),
        Some(s) if SchemaKind::parse(s) != Some(T::KIND) => bail!(
            "file holds `{s}` (metadata `gradkit.schema`) but `{}` is expected here",
            T::KIND.name()
        ),
        _ => {}
    }
    crate::tables::check_schema(&T::schema(), builder.schema())?;
    let reader = builder.with_batch_size(4096).build()?;
    let mut rows = Vec::new();
    for batch in reader {
        rows.extend(batch_to_rows::<T>(&batch?)?);
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
    let mut reg = LayerRegistry::default();
    for r in &t.rows {
        validate_tensor_row(r, opts.allow_nonfinite)
            .and_then(|_| reg.check(r))
            .with_context(|| format!("in {}", t.source))?;
    }
    Ok(t)
}

/// A streaming writer for one table: rows go out in row groups as they are written; the file
/// appears at its path only when [`TableWriter::finish`] succeeds.
pub struct TableWriter<T: Table> {
    writer: Option<ArrowWriter<Box<dyn Write + Send>>>,
    tmp: Option<PathBuf>,
    out: Output,
    _t: std::marker::PhantomData<T>,
}

/// Bytes buffered before a row group is flushed (readers can parallelise over row groups).
const ROW_GROUP_BYTES: usize = 64 << 20;

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

impl<T: Table> TableWriter<T> {
    /// Opens `out` for a table of type `T` with `meta` (the schema key is added here).
    pub fn create(out: &Output, meta: &Meta) -> Result<Self> {
        let (sink, tmp): (Box<dyn Write + Send>, Option<PathBuf>) = match out {
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
                let mut name = p.as_os_str().to_owned();
                name.push(format!(".tmp-{}", std::process::id()));
                let tmp = PathBuf::from(name);
                let f = File::create(&tmp)
                    .with_context(|| format!("cannot create {}", tmp.display()))?;
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
        Ok(TableWriter {
            writer: Some(writer),
            tmp,
            out: out.clone(),
            _t: std::marker::PhantomData,
        })
    }

    /// Appends rows; a row group is flushed once enough bytes are buffered.
    pub fn write(&mut self, rows: &[T]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let w = self.writer.as_mut().expect("writer open");
        w.write(&T::to_batch(rows)?)
            .with_context(|| format!("writing {}", self.out.name()))?;
        if w.in_progress_size() >= ROW_GROUP_BYTES {
            w.flush()?;
        }
        Ok(())
    }

    /// Closes the file and renames it into place.
    pub fn finish(mut self) -> Result<()> {
        let w = self.writer.take().expect("writer open");
        let mut sink = w
            .into_inner()
            .with_context(|| format!("writing {}", self.out.name()))?;
        sink.flush()
            .with_context(|| format!("writing {}", self.out.name()))?;
        drop(sink);
        if let (Some(tmp), Output::Path(p)) = (self.tmp.take(), &self.out) {
            std::fs::rename(&tmp, p)
                .with_context(|| format!("cannot rename {} to {}", tmp.display(), p.display()))?;
        }
        Ok(())
    }
}

impl<T: Table> Drop for TableWriter<T> {
    fn drop(&mut self) {
        // Not finished: an error happened; leave nothing half-written behind.
        if let Some(tmp) = self.tmp.take() {
            self.writer.take();
            let _ = std::fs::remove_file(tmp);
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
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let res = std::fs::write(&tmp, data)
        .with_context(|| format!("cannot write {}", tmp.display()))
        .and_then(|_| {
            std::fs::rename(&tmp, path)
                .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
        });
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}
