//! A table that is readable while it grows: [`LiveTable`].
//!
//! A long run's metrics must survive the run being killed, and a user may want to read them
//! while it goes on; rewriting the whole file at every update made that cost grow with the run
//! (quadratic over the run). A Parquet file ends with its footer (the row groups' metadata,
//! its length and `PAR1`), so rows can be appended in place: the new row group is written
//! where the old footer began, followed by a footer that lists every row group so far, in one
//! positioned write. Small updates share a row group (the open one, rewritten until it is
//! full), so each update costs at most one row group plus the footer, not the file.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow_schema::SchemaRef;
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use parquet::arrow::{add_encoded_arrow_schema_to_metadata, ArrowSchemaConverter, ArrowWriter};
use parquet::basic::ColumnOrder;
use parquet::file::metadata::{
    FileMetaData, KeyValue, ParquetMetaData, ParquetMetaDataWriter, RowGroupMetaData,
};
use parquet::file::properties::WriterProperties;
use parquet::schema::types::SchemaDescPtr;

/// A Parquet file's first (and last) four bytes.
const MAGIC: &[u8] = b"PAR1";

use crate::io::Meta;
use crate::paths::TempFile;
use crate::tables::Table;

/// Rows of the open row group rewritten at each append, at most: a row group is closed (never
/// rewritten again) once it holds this many. Each append then costs at most this many rows
/// (encoded without compression: creating a compressor per column cost more than the rest)
/// and a footer that grows by one row group per this many rows.
const OPEN_ROWS: usize = 4096;

/// Where the table lives.
enum Home {
    /// Not yet given its name: created next to `PATH`, named at the first
    /// [`LiveTable::append`] (an atomic rename over whatever was there).
    Pending(TempFile),
    /// At its path (or, for a table with no path, an unnamed temporary file).
    Open(std::fs::File),
}

/// A `metrics/1` (or any) table appended to in place, a valid Parquet file after every
/// [`LiveTable::append`].
///
/// - The first append gives the file its name atomically (replacing an older file); each later
///   one writes the open row group (the rows since the last closed one, at most
///   [`OPEN_ROWS`]) and a new footer over the old open group and footer, in one `pwrite`, so a
///   run killed between two appends leaves the file of the last one.
/// - A table with no path ([`LiveTable::unnamed`]) lives in an unnamed temporary file, never
///   seen by anyone, for what is copied elsewhere ([`LiveTable::copy_to`]).
pub struct LiveTable<T: Table> {
    home: Home,
    target: Option<PathBuf>,
    schema: SchemaRef,
    /// The file's properties (closed row groups), and those of the open one (uncompressed).
    props: WriterProperties,
    open_props: WriterProperties,
    descr: SchemaDescPtr,
    /// The row groups closed so far (offsets in the file) and where the last one ends.
    closed: Vec<RowGroupMetaData>,
    closed_end: u64,
    closed_rows: u64,
    /// The CRC-32 of each column chunk of the closed row groups (`gradkit.crc32`, written in
    /// every footer with the open group's: crate::io::checksum).
    closed_crcs: Vec<u32>,
    /// The open row group's rows.
    open: Vec<T>,
    /// Rows the file holds (as of the last successful write).
    published: u64,
}

impl<T: Table + Clone> LiveTable<T> {
    /// A table that appears at `path` at the first append.
    pub fn create(path: &Path, meta: &Meta) -> Result<Self> {
        let tmp = TempFile::create(path)?;
        Self::new(Home::Pending(tmp), Some(path.to_path_buf()), meta)
    }

    /// A table in an unnamed temporary file (in the system's temporary directory).
    pub fn unnamed(meta: &Meta) -> Result<Self> {
        let dir = std::env::temp_dir();
        let f = crate::io::anonymous_file(&dir)
            .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
        Self::new(Home::Open(f), None, meta)
    }

    fn new(home: Home, target: Option<PathBuf>, meta: &Meta) -> Result<Self> {
        let mut schema_meta: std::collections::HashMap<String, String> =
            meta.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        schema_meta.insert("gradkit.schema".into(), T::KIND.name().to_string());
        let schema = Arc::new(T::schema().as_ref().clone().with_metadata(schema_meta));
        let mut props = crate::io::writer_properties(T::KIND);
        add_encoded_arrow_schema_to_metadata(&schema, &mut props);
        let mut kv = props.key_value_metadata().cloned().unwrap_or_default();
        kv.push(KeyValue::new(
            "gradkit.schema".into(),
            T::KIND.name().to_string(),
        ));
        kv.extend(
            meta.0
                .iter()
                .filter(|(k, _)| *k != "gradkit.schema" && *k != crate::io::checksum::KEY)
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        );
        let props = props
            .into_builder()
            .set_key_value_metadata(Some(kv))
            .build();
        let open_props = props
            .clone()
            .into_builder()
            .set_compression(parquet::basic::Compression::UNCOMPRESSED)
            .build();
        let descr = Arc::new(ArrowSchemaConverter::new().convert(&schema)?);
        Ok(LiveTable {
            home,
            target,
            schema,
            props,
            open_props,
            descr,
            closed: Vec::new(),
            closed_end: MAGIC.len() as u64,
            closed_rows: 0,
            closed_crcs: Vec::new(),
            open: Vec::new(),
            published: 0,
        })
    }

    fn name(&self) -> String {
        self.target
            .as_ref()
            .map_or("a temporary file".into(), |p| p.display().to_string())
    }

    /// Appends `rows` and makes the file show them (a no-op for no rows).
    pub fn append(&mut self, rows: &[T]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let name = self.name();
        let open = self.open.len();
        self.open.extend_from_slice(rows);
        let res = self
            .publish(false)
            .with_context(|| format!("appending to {name}"));
        if res.is_err() {
            // The file holds the rows before these (`put` put it back); so does the table.
            self.open.truncate(open);
        }
        res
    }

    /// Writes the open row group and the footer after the closed row groups, and closes the
    /// open group once it is full (or when `close`).
    fn publish(&mut self, close: bool) -> Result<()> {
        let close = close || self.open.len() >= OPEN_ROWS;
        let (group, meta) = self.encode_open(close)?;
        let open_crcs = match &meta {
            Some(m) => crate::io::checksum::chunk_crcs(m, &group, self.closed_end)
                .ok_or_else(|| anyhow::anyhow!("internal: a column chunk outside its row group"))?,
            None => Vec::new(),
        };
        let mut crcs = self.closed_crcs.clone();
        crcs.extend(&open_crcs);
        let mut groups = self.closed.clone();
        groups.extend(meta.clone());
        let mut bytes = Vec::with_capacity(MAGIC.len() + group.len() + 4096);
        if self.closed_end == MAGIC.len() as u64 {
            bytes.extend_from_slice(MAGIC);
        }
        bytes.extend_from_slice(&group);
        bytes.extend(self.footer(groups, &crcs)?);
        let at = if self.closed_end == MAGIC.len() as u64 {
            0
        } else {
            self.closed_end
        };
        self.put(&bytes, at)?;
        if close {
            self.closed_crcs.extend(open_crcs);
            self.closed.extend(meta);
            self.closed_end += group.len() as u64;
            self.closed_rows += self.open.len() as u64;
            self.open.clear();
        }
        Ok(())
    }

    /// The open rows as one row group placed at `closed_end` (`close`: compressed as the
    /// file's closed groups are): its bytes and its metadata (none for no rows).
    fn encode_open(&self, close: bool) -> Result<(Vec<u8>, Option<RowGroupMetaData>)> {
        if self.open.is_empty() {
            return Ok((Vec::new(), None));
        }
        let props = if close { &self.props } else { &self.open_props };
        let options = ArrowWriterOptions::new()
            .with_properties(props.clone())
            .with_skip_arrow_metadata(true);
        let mut w = ArrowWriter::try_new_with_options(Vec::new(), self.schema.clone(), options)?;
        w.write(&T::to_batch(&self.open)?)?;
        w.flush()?;
        let rg = w.flushed_row_groups()[0].clone();
        let mut bytes = w.into_inner()?;
        bytes.drain(..MAGIC.len());
        let delta = self.closed_end as i64 - MAGIC.len() as i64;
        let shift = |o: i64| o + delta;
        let columns = rg
            .columns()
            .iter()
            .map(|c| {
                c.clone()
                    .into_builder()
                    .set_data_page_offset(shift(c.data_page_offset()))
                    .set_dictionary_page_offset(c.dictionary_page_offset().map(shift))
                    .set_index_page_offset(c.index_page_offset().map(shift))
                    .set_bloom_filter_offset(None)
                    .set_offset_index_offset(None)
                    .set_column_index_offset(None)
                    .build()
            })
            .collect::<parquet::errors::Result<Vec<_>>>()?;
        let ordinal = self.closed.len() as i32;
        let meta = rg
            .into_builder()
            .set_column_metadata(columns)
            .set_file_offset(self.closed_end as i64)
            .set_ordinal(ordinal)
            .build()?;
        Ok((bytes, Some(meta)))
    }

    /// The footer listing `groups`, with their chunks' checksums `crcs`.
    fn footer(&self, groups: Vec<RowGroupMetaData>, crcs: &[u32]) -> Result<Vec<u8>> {
        let orders = self
            .descr
            .columns()
            .iter()
            .map(|c| {
                ColumnOrder::column_order_for_type(
                    c.logical_type_ref(),
                    c.converted_type(),
                    c.physical_type(),
                )
            })
            .collect();
        let rows = self.closed_rows + self.open.len() as u64;
        let mut kv = self.props.key_value_metadata().cloned().unwrap_or_default();
        kv.push(KeyValue::new(
            crate::io::checksum::KEY.into(),
            crate::io::checksum::encode(crcs),
        ));
        let file = FileMetaData::new(
            self.props.writer_version().as_num(),
            rows as i64,
            Some(self.props.created_by().to_string()),
            Some(kv),
            self.descr.clone(),
            Some(orders),
        );
        let meta = ParquetMetaData::new(file, groups);
        let mut buf = Vec::new();
        ParquetMetaDataWriter::new(&mut buf, &meta).finish()?;
        Ok(buf)
    }

    /// Writes `bytes` at `at` in one positioned write and cuts the file after them; the first
    /// time, gives the file its name. A write that fails (a full disk, the file-size limit),
    /// possibly part-way, is undone: the file is cut back to its old length and the bytes it
    /// overwrote (the old open row group and footer) are written back, so the file stays the
    /// complete table of the last append. Both steps stay within the old length, so they need
    /// no space the file did not hold.
    fn put(&mut self, bytes: &[u8], at: u64) -> Result<()> {
        let file = self.file()?;
        let len = file.metadata()?.len();
        let mut old = vec![0u8; len.saturating_sub(at) as usize];
        file.read_exact_at(&mut old, at)?;
        let written = file
            .write_all_at(bytes, at)
            .and_then(|()| file.set_len(at + bytes.len() as u64));
        if let Err(e) = written {
            let undone = file.set_len(len).and_then(|()| file.write_all_at(&old, at));
            let kept = self.published;
            return Err(match undone {
                Ok(()) => anyhow::anyhow!("{e}; the file keeps the {kept} rows written before"),
                Err(u) => anyhow::anyhow!(
                    "{e}; putting back the {kept} rows written before failed too ({u})"
                ),
            });
        }
        self.published = self.rows();
        if let Home::Pending(tmp) = &self.home {
            let f = tmp.file().try_clone()?;
            let Home::Pending(tmp) = std::mem::replace(&mut self.home, Home::Open(f)) else {
                unreachable!("pending")
            };
            tmp.persist()?;
        }
        Ok(())
    }

    /// Copies the table as it stands (a valid file after any append; written first if there
    /// was none yet) to `to`, atomically.
    pub fn copy_to(&mut self, to: &Path) -> Result<()> {
        if matches!(self.home, Home::Pending(_)) || self.file()?.metadata()?.len() == 0 {
            self.publish(false)?;
        }
        let file = self.file()?;
        let len = file.metadata()?.len();
        crate::io::write_file_atomic_with(to, |w| {
            let mut buf = vec![0u8; 1 << 20];
            let mut at = 0u64;
            while at < len {
                let n = (len - at).min(buf.len() as u64) as usize;
                file.read_exact_at(&mut buf[..n], at)?;
                w.write_all(&buf[..n])?;
                at += n as u64;
            }
            Ok(())
        })
    }

    fn file(&self) -> Result<&std::fs::File> {
        Ok(match &self.home {
            Home::Pending(tmp) => tmp.file(),
            Home::Open(f) => f,
        })
    }

    /// Rows appended so far.
    pub fn rows(&self) -> u64 {
        self.closed_rows + self.open.len() as u64
    }

    /// Completes the file: the open row group is written compressed as the others (and a
    /// table with no rows is written: the schema and no row group).
    pub fn finish(mut self) -> Result<()> {
        let name = self.name();
        self.publish(true)
            .with_context(|| format!("writing {name}"))
    }
}
