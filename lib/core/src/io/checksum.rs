//! Checksums of the column chunks a gradkit writer wrote, verified as they are read.
//!
//! Parquet has a CRC field in each page header, but the parquet crate writes none (pyarrow
//! does with `write_page_checksum`; the crate's `crc` feature, enabled here, verifies those
//! where they exist). So every file [`super::TableWriter`] writes carries one CRC-32 (IEEE,
//! the `zlib.crc32` of Python) per column chunk in its footer's key-value metadata,
//! `gradkit.crc32`: 8 lower-case hex digits per chunk, row group by row group, column by
//! column in schema order, over the chunk's bytes (`ColumnChunkMetaData::byte_range`). A
//! reader ([`Verified`]) reads each chunk it needs in one piece, checks its CRC, and serves
//! the pages from that piece: a damaged page is found even where it still decodes (a flipped
//! bit inside a float), and named with its row group and column. Files without the key (other
//! writers, gradkit before 2026-11-28) are read as before.

use std::io::Write;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;

/// The footer key holding the chunks' CRC-32s.
pub const KEY: &str = "gradkit.crc32";

/// A sink that keeps a copy of the bytes written through it since the writer last took
/// them ([`Tee`]): the writer takes a row group's bytes once they are flushed and hashes
/// each of its column chunks (the parquet crate hides an encoded chunk's bytes, and
/// buffers the file, so neither the chunk nor a write call is a unit to hash).
pub(super) struct CrcSink {
    pub(super) inner: Box<dyn Write + Send>,
    pub(super) tee: Tee,
}

/// The bytes a [`CrcSink`] passed on since the last [`Tee::take`], shared with the writer.
#[derive(Clone, Default)]
pub(super) struct Tee(Arc<Mutex<Vec<u8>>>);

impl Tee {
    /// The bytes since the last call (and none kept).
    pub(super) fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The CRC-32 of each column chunk of `group`, from `bytes`, the file's bytes from offset
/// `base` on; `None` when a chunk is not inside them (a writer bug).
pub(crate) fn chunk_crcs(
    group: &parquet::file::metadata::RowGroupMetaData,
    bytes: &[u8],
    base: u64,
) -> Option<Vec<u32>> {
    group
        .columns()
        .iter()
        .map(|c| {
            let (s, l) = c.byte_range();
            let a = usize::try_from(s.checked_sub(base)?).ok()?;
            Some(crc32fast::hash(bytes.get(a..a.checked_add(l as usize)?)?))
        })
        .collect()
}

impl Write for CrcSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.tee
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// `crcs` as the footer value.
pub(crate) fn encode(crcs: &[u32]) -> String {
    crcs.iter().map(|c| format!("{c:08x}")).collect()
}

/// The chunks' CRCs of a file's footer, checked against its chunks: `Ok(None)` without the
/// key; an error naming the key when it does not hold one CRC per column chunk.
pub(super) fn of(m: &ParquetMetaData) -> Result<Option<Checksums>, String> {
    let Some(v) = m
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|e| e.key == KEY))
        .and_then(|e| e.value.as_deref())
    else {
        return Ok(None);
    };
    let chunks: usize = m.row_groups().iter().map(|g| g.num_columns()).sum();
    if v.len() != 8 * chunks || !v.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "metadata `{KEY}` does not hold one checksum for each of the file's {chunks} column chunks: the footer is damaged"
        ));
    }
    // Where each row group's first chunk starts (row groups are in file order).
    let starts = m
        .row_groups()
        .iter()
        .map(|g| g.columns().first().map_or(0, |c| c.byte_range().0))
        .collect();
    Ok(Some(Checksums {
        hex: v.as_bytes().to_vec().into(),
        starts,
        first: m
            .row_groups()
            .iter()
            .scan(0, |a, g| {
                let s = *a;
                *a += g.num_columns();
                Some(s)
            })
            .collect(),
    }))
}

/// A file's chunk CRCs, looked up by the byte offset a read starts at.
#[derive(Clone, Debug)]
pub(super) struct Checksums {
    hex: Arc<[u8]>,
    /// Per row group: the offset of its first chunk.
    starts: Vec<u64>,
    /// Per row group: the index of its first chunk among all.
    first: Vec<usize>,
}

/// One column chunk: row group, column, byte range and expected CRC.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Chunk {
    group: usize,
    column: usize,
    start: u64,
    len: u64,
    crc: u32,
}

impl Checksums {
    /// The chunk holding byte `at`, if any.
    fn chunk_at(&self, m: &ParquetMetaData, at: u64) -> Option<Chunk> {
        let g = self.starts.partition_point(|&s| s <= at).checked_sub(1)?;
        let group = &m.row_groups()[g];
        group.columns().iter().enumerate().find_map(|(c, col)| {
            let (start, len) = col.byte_range();
            (start..start + len).contains(&at).then(|| {
                let i = 8 * (self.first[g] + c);
                let hex = std::str::from_utf8(&self.hex[i..i + 8]).unwrap_or("0");
                Chunk {
                    group: g,
                    column: c,
                    start,
                    len,
                    crc: u32::from_str_radix(hex, 16).unwrap_or(0),
                }
            })
        })
    }
}

/// Verification state of one reader: the file's checksums and the chunks it has read and
/// checked, kept while their row group is being read.
pub(super) struct Verified {
    metadata: Arc<ParquetMetaData>,
    sums: Checksums,
    cache: Mutex<Vec<(Chunk, Bytes)>>,
}

impl Verified {
    pub(super) fn new(metadata: Arc<ParquetMetaData>, sums: Checksums) -> Self {
        Verified {
            metadata,
            sums,
            cache: Mutex::new(Vec::new()),
        }
    }

    /// `len` bytes from `start` from the checked chunk holding them (read whole with `read`
    /// and checked on first use); `None` when no chunk holds them all (footer, indexes).
    pub(super) fn bytes(
        &self,
        start: u64,
        len: usize,
        read: impl FnOnce(u64, usize) -> parquet::errors::Result<Bytes>,
    ) -> Option<parquet::errors::Result<Bytes>> {
        let chunk = self.sums.chunk_at(&self.metadata, start)?;
        if start + len as u64 > chunk.start + chunk.len {
            return None;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let data = match cache.iter().find(|(c, _)| *c == chunk) {
            Some((_, b)) => b.clone(),
            None => {
                let b = match read(chunk.start, chunk.len as usize) {
                    Ok(b) => b,
                    Err(e) => return Some(Err(e)),
                };
                let got = crc32fast::hash(&b);
                if got != chunk.crc {
                    return Some(Err(self.mismatch(&chunk, got)));
                }
                cache.retain(|(c, _)| c.group == chunk.group);
                cache.push((chunk, b.clone()));
                b
            }
        };
        let at = (start - chunk.start) as usize;
        Some(Ok(data.slice(at..at + len)))
    }

    /// The chunk holding `start`, as a reader from `start` to the chunk's end.
    pub(super) fn read_from(
        &self,
        start: u64,
        read: impl FnOnce(u64, usize) -> parquet::errors::Result<Bytes>,
    ) -> Option<parquet::errors::Result<Bytes>> {
        let chunk = self.sums.chunk_at(&self.metadata, start)?;
        self.bytes(start, (chunk.start + chunk.len - start) as usize, read)
    }

    fn mismatch(&self, c: &Chunk, got: u32) -> ParquetError {
        let name = self
            .metadata
            .file_metadata()
            .schema_descr()
            .columns()
            .get(c.column)
            .map_or_else(|| format!("{}", c.column), |d| d.path().string());
        ParquetError::General(format!(
            "checksum mismatch in column `{name}` (bytes {}–{}: CRC-32 {got:08x}, the footer says {:08x}): the file is damaged",
            c.start,
            c.start + c.len,
            c.crc
        ))
    }
}
