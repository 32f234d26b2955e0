//! Whole-table reads: the checked footer and schema, every row validated, damaged pages
//! located; stdin spooled to an unnamed file.

use super::*;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use arrow_schema::Schema;
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::file::reader::Length;

use crate::tables::{
    batch_to_rows_at, validate_tensor_row, LayerRegistry, SchemaKind, Table, TensorRow,
};
/// Where the bytes of a file are read from: the file itself (each reading thread opens its
/// own handle) or, for stdin, a buffer in memory.
pub(super) enum Source {
    File(PathBuf),
    /// An open file read by one thread only (stdin spooled to an unnamed temporary file).
    Handle(File),
    Memory(Bytes),
}

/// Data the Parquet decoder could not read (a garbled page). The Arrow reader wraps the
/// decoder's message twice (`Parquet argument error: Parquet error: …`); this says it once.
#[derive(Debug)]
pub(super) struct Damaged(String);

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
pub(super) fn group_starts(metadata: &ArrowReaderMetadata) -> Vec<usize> {
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
pub(super) fn damage_at(
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
                source.chunk_reader(metadata)?,
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
pub(super) fn groups_of_rows(metadata: &ArrowReaderMetadata, row: usize, len: usize) -> Vec<usize> {
    let starts = group_starts(metadata);
    let group = |r: usize| starts.partition_point(|&s| s <= r).max(1) - 1;
    (group(row)..=group(row + len.max(1) - 1)).collect()
}

/// The rows of row groups `groups`, read with `batch` rows per record batch.
pub(super) fn read_row_groups<T: Table>(
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
    let read = rows(
        source.chunk_reader(metadata)?,
        metadata,
        groups.clone(),
        batch,
    );
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
pub(super) fn schema_from_columns<T: Table>(schema: &Schema, name: &str) -> Result<()> {
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
pub(super) fn checked_metadata<T: Table>(
    source: &Source,
    name: &str,
) -> Result<(ArrowReaderMetadata, Meta)> {
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
    super::checksum::of(metadata.metadata()).map_err(|e| anyhow!(e))?;
    let mut meta = Meta::default();
    if let Some(kv) = metadata.metadata().file_metadata().key_value_metadata() {
        // The chunks' checksums describe this file's bytes only: never carried to an output.
        for e in kv.iter().filter(|e| e.key != super::checksum::KEY) {
            if let Some(v) = &e.value {
                meta.0.insert(e.key.clone(), v.clone());
            }
        }
    }
    for (k, v) in metadata.schema().metadata() {
        if k != super::checksum::KEY {
            meta.0.entry(k.clone()).or_insert_with(|| v.clone());
        }
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
    claimed_rows(&metadata, source.chunk_reader(&metadata)?.len())?;
    Ok((metadata, meta))
}

/// The rows the footer's row groups claim (field `num_rows`), checked against the values of
/// their columns that are not lists (as many as rows) and against what a file of `file_len`
/// bytes can encode: a data page holds at most 2^31 − 1 values and takes more than 8 bytes
/// (its header), so such a file has fewer than (file_len / 8 + 1) · (2^31 − 1) rows.
/// A claim beyond that (a damaged or forged footer) is refused before anything is allocated
/// for it; a smaller false claim is found when the rows are read ([`read_table_inner`]).
pub(super) fn claimed_rows(metadata: &ArrowReaderMetadata, file_len: u64) -> Result<u64> {
    let mut total: u64 = 0;
    for (g, group) in metadata.metadata().row_groups().iter().enumerate() {
        let n = u64::try_from(group.num_rows()).map_err(|_| {
            anyhow!(
                "footer field `num_rows` of row group {g} is {}: a damaged footer",
                group.num_rows()
            )
        })?;
        // A column that is not a list has one value per row in every row group.
        if let Some(c) = group.columns().iter().find(|c| {
            c.column_descr().max_rep_level() == 0 && u64::try_from(c.num_values()) != Ok(n)
        }) {
            bail!(
                "footer field `num_rows` of row group {g} is {n}, but its column `{}` holds {} values (field `num_values`): a damaged footer",
                c.column_path(),
                c.num_values()
            );
        }
        total = total.saturating_add(n);
    }
    let most = (file_len / 8 + 1).saturating_mul(i32::MAX as u64);
    if total > most {
        bail!(
            "footer field `num_rows` claims {total} rows, more than a file of {file_len} bytes can encode (at most {most}): a damaged footer"
        );
    }
    Ok(total)
}

/// What `rows` rows of `T` take in memory, about: the struct and one heap block per text
/// column (a `String`'s allocation is 32 bytes or more), checked against the memory budget
/// (`GRADKIT_MAX_MEMORY`, lib/core/src/budget.rs) before any is read.
fn check_row_memory<T: Table>(rows: u64) -> Result<()> {
    let texts = T::schema()
        .fields()
        .iter()
        .filter(|f| matches!(f.data_type(), arrow_schema::DataType::Utf8))
        .count();
    let per_row = std::mem::size_of::<T>() + 32 * texts;
    crate::budget::check(
        &format!("its {rows} rows of `{}`", T::KIND.name()),
        crate::budget::product(&[rows as u128, per_row as u128]),
    )
}

/// Rows per record batch: about 8 MiB decoded, i.e. one row of a big dense layer per batch,
/// up to 4096 small rows.
pub(super) fn batch_rows(metadata: &ArrowReaderMetadata) -> usize {
    batch_rows_of(metadata, 8 << 20)
}

/// Rows per record batch of about `target` bytes decoded (at least 1, at most 4096).
/// Rows per record batch of the key passes ([`TensorStream::scan`], `step_layout`).
pub(super) const KEY_BATCH: usize = 1 << 16;

pub(super) fn batch_rows_of(metadata: &ArrowReaderMetadata, target: i64) -> usize {
    let groups = metadata.metadata().row_groups();
    // Saturating: a damaged footer's numbers must not overflow.
    let (nrows, bytes) = groups.iter().fold((0i64, 0i64), |(n, b), g| {
        (
            n.saturating_add(g.num_rows().max(0)),
            b.saturating_add(g.total_byte_size().max(0)),
        )
    });
    target
        .checked_div(bytes / nrows.max(1))
        .unwrap_or(4096)
        .clamp(1, 4096) as usize
}

pub(super) fn read_table_inner<T: Table>(input: &Input) -> Result<Loaded<T>> {
    let source = match input {
        Input::Path(p) => Source::File(p.clone()),
        Input::Stdin => Source::Memory(input.bytes()?),
    };
    let (metadata, meta) = checked_metadata::<T>(&source, &input.name())?;
    let nrows = claimed_rows(&metadata, source.chunk_reader(&metadata)?.len())?;
    check_row_memory::<T>(nrows)?;
    let batch = batch_rows(&metadata);
    let groups = metadata.metadata().row_groups();
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
    let parts = parts.into_iter().collect::<Result<Vec<_>>>()?;
    // Allocated for the rows read, never for the footer's claim alone.
    let got: usize = parts.iter().map(Vec::len).sum();
    if got as u64 != nrows {
        bail!(
            "footer field `num_rows` claims {nrows} rows, but the file's pages hold {got}: a damaged footer"
        );
    }
    let mut rows = Vec::with_capacity(got);
    for p in parts {
        rows.extend(p);
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

impl Source {
    /// A reader of the bytes for one thread, which checks every column chunk it reads against
    /// the checksums in the footer `metadata` (where the file has them: [`super::checksum`]).
    pub(super) fn chunk_reader(&self, metadata: &ArrowReaderMetadata) -> Result<SourceReader> {
        let raw = match self {
            Source::File(p) => {
                Raw::File(File::open(p).with_context(|| format!("cannot read {}", p.display()))?)
            }
            Source::Handle(f) => Raw::File(f.try_clone().context("cannot read the input")?),
            Source::Memory(b) => Raw::Memory(b.clone()),
        };
        let m = metadata.metadata();
        let verify = super::checksum::of(m)
            .ok()
            .flatten()
            .map(|sums| super::checksum::Verified::new(m.clone(), sums));
        Ok(SourceReader { raw, verify })
    }
}

/// [`Source`] as one `ChunkReader` type, verifying the chunks it serves.
pub(super) struct SourceReader {
    raw: Raw,
    verify: Option<super::checksum::Verified>,
}

enum Raw {
    File(File),
    Memory(Bytes),
}

impl Raw {
    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        use parquet::file::reader::ChunkReader;
        match self {
            Raw::File(f) => f.get_bytes(start, length),
            Raw::Memory(b) => b.get_bytes(start, length),
        }
    }
}

impl parquet::file::reader::Length for SourceReader {
    fn len(&self) -> u64 {
        match &self.raw {
            Raw::File(f) => Length::len(f),
            Raw::Memory(b) => Length::len(b),
        }
    }
}

impl parquet::file::reader::ChunkReader for SourceReader {
    type T = Box<dyn Read + Send>;
    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let checked = self
            .verify
            .as_ref()
            .and_then(|v| v.read_from(start, |s, l| self.raw.get_bytes(s, l)));
        if let Some(b) = checked {
            return Ok(Box::new(std::io::Cursor::new(b?)));
        }
        Ok(match &self.raw {
            Raw::File(f) => Box::new(f.get_read(start)?),
            Raw::Memory(b) => Box::new(b.get_read(start)?),
        })
    }
    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let checked = self
            .verify
            .as_ref()
            .and_then(|v| v.bytes(start, length, |s, l| self.raw.get_bytes(s, l)));
        checked.unwrap_or_else(|| self.raw.get_bytes(start, length))
    }
}

/// Stdin copied into an unnamed temporary file under the temporary directory ($TMPDIR), so
/// that a trace larger than memory can be piped; in memory when no such file can be created.
pub(super) fn spool_stdin() -> Result<Source> {
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
