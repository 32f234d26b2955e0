//! The `values` column of `tensor/1` encoded here, page by page, straight from the rows'
//! slices (docs/MEMORY.md): Parquet data pages V1 (format spec, "Data Pages") holding repetition
//! and definition levels in the RLE/bit-packing hybrid ("Encodings: Run Length Encoding /
//! Bit-Packing Hybrid", 4-byte length prefix), the items in BYTE_STREAM_SPLIT ("Encodings:
//! Byte Stream Split": byte `k` of every value in stream `k`) and the whole page compressed
//! with zstd, as arrow-rs's column writer would write them with the settings of docs/FORMAT.md
//! (`writer_properties` in `io.rs`), minus its copies: the rows are not copied into an Arrow
//! batch, nor the items into the column writer's buffer, nor the levels and items into one
//! page buffer. The pages of a write call are encoded on all cores.
//!
//! A page holds whole rows (the offset index written beside it requires pages to start on
//! row boundaries): a row of [`PAGE_BYTES`] or more is a page of its own, encoded from the
//! caller's slice; smaller rows are copied into the open page until it reaches
//! [`PAGE_BYTES`]. Page boundaries depend only on the rows and the row-group boundaries, not
//! on how rows are split into write calls nor on timing.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Result};
use bytes::Bytes;
use parquet::basic::{Compression, Encoding, EncodingMask, PageType};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ColumnChunkMetaData, PageEncodingStats};
use parquet::file::page_index::offset_index::{OffsetIndexMetaData, PageLocation};
use parquet::file::properties::WriterPropertiesPtr;
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;

/// Uncompressed item bytes at which a page is closed (arrow-rs's default page size limit).
pub(crate) const PAGE_BYTES: usize = 1 << 20;

type Zstd = zstd::bulk::Compressor<'static>;

/// Scratch buffers up to this size (a page of a 16 MiB row) are kept between pages.
const KEEP_SCRATCH: usize = 32 << 20;

/// One compressed data page and what its header and the chunk's metadata need.
pub(crate) struct EncodedPage {
    data: Bytes,
    uncompressed: usize,
    num_values: u32,
    num_rows: usize,
}

/// The items of one page to encode: one big row borrowed from the caller, or small rows
/// copied into a buffer of their own (`rows` holds their lengths).
pub(crate) enum PageTask<'a> {
    Row(&'a [f32]),
    Copied { items: Vec<f32>, rows: Vec<usize> },
}

impl EncodedPage {
    /// Bytes of the page before compression (levels and items).
    pub(crate) fn uncompressed(&self) -> usize {
        self.uncompressed
    }
    /// Bytes of the compressed page.
    pub(crate) fn compressed(&self) -> usize {
        self.data.len()
    }
}

impl PageTask<'_> {
    fn parts(&self) -> (&[f32], &[usize]) {
        match self {
            PageTask::Row(v) => (v, &[]),
            PageTask::Copied { items, rows } => (items, rows),
        }
    }
}

/// The `values` column's state in a `TableWriter`: the open page (small rows, copied) and
/// the encoded pages of the pending row group.
pub(crate) struct ValuesWriter {
    /// Index of the column among the table's top-level columns.
    pub(crate) col: usize,
    descr: ColumnDescPtr,
    level: i32,
    open: Vec<f32>,
    open_rows: Vec<usize>,
    pages: Vec<EncodedPage>,
    /// Per encoding thread, reused: a scratch buffer (the uncompressed page) and a zstd
    /// context (made at its first page).
    scratch: Vec<(Vec<u8>, Option<Zstd>)>,
}

impl ValuesWriter {
    /// A writer for column `col` (`descr`), when its settings in `props` are the ones encoded
    /// here (zstd, BYTE_STREAM_SPLIT, no statistics, a non-null list of f32); `None` otherwise.
    pub(crate) fn new(
        col: usize,
        descr: ColumnDescPtr,
        props: &WriterPropertiesPtr,
    ) -> Option<Self> {
        let path = descr.path();
        let level = match props.compression(path) {
            Compression::ZSTD(l) => l.compression_level(),
            _ => return None,
        };
        let ok = props.encoding(path) == Some(Encoding::BYTE_STREAM_SPLIT)
            && props.statistics_enabled(path) == parquet::file::properties::EnabledStatistics::None
            && descr.physical_type() == parquet::basic::Type::FLOAT
            && descr.max_rep_level() == 1
            && descr.max_def_level() >= 1
            && props.writer_version() == parquet::file::properties::WriterVersion::PARQUET_1_0;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        ok.then(|| ValuesWriter {
            col,
            descr,
            level,
            open: Vec::new(),
            open_rows: Vec::new(),
            pages: Vec::new(),
            scratch: (0..threads).map(|_| (Vec::new(), None)).collect(),
        })
    }

    /// Adds a row to the page plan: a big row becomes a task of its own (after the open page),
    /// a small one is copied into the open page, which becomes a task once full.
    pub(crate) fn plan_row<'a>(&mut self, values: &'a [f32], tasks: &mut Vec<PageTask<'a>>) {
        if 4 * values.len() >= PAGE_BYTES {
            self.close_open(tasks);
            tasks.push(PageTask::Row(values));
        } else {
            self.open.extend_from_slice(values);
            self.open_rows.push(values.len());
            if 4 * self.open.len() >= PAGE_BYTES {
                self.close_open(tasks);
            }
        }
    }

    /// Ends the open page (at a row-group boundary, or when full).
    pub(crate) fn close_open<'a>(&mut self, tasks: &mut Vec<PageTask<'a>>) {
        if !self.open_rows.is_empty() {
            tasks.push(PageTask::Copied {
                items: std::mem::take(&mut self.open),
                rows: std::mem::take(&mut self.open_rows),
            });
        }
    }

    /// Encodes `tasks` on all cores; the pages come back in task order.
    pub(crate) fn encode(&mut self, tasks: &[PageTask<'_>]) -> Result<Vec<EncodedPage>> {
        let max_def = self.descr.max_def_level();
        let level = self.level;
        let next = AtomicUsize::new(0);
        let done: Mutex<Vec<(usize, EncodedPage)>> = Mutex::new(Vec::with_capacity(tasks.len()));
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let work = |(scratch, zstd): &mut (Vec<u8>, Option<Zstd>)| -> Result<()> {
            let zstd = match zstd {
                Some(z) => z,
                None => zstd.insert(Zstd::new(level)?),
            };
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(t) = tasks.get(i) else {
                    return Ok(());
                };
                let (items, rows) = t.parts();
                let page = encode_page(items, rows, max_def, scratch, zstd)?;
                done.lock()
                    .map_err(|_| anyhow!("internal: poisoned"))?
                    .push((i, page));
            }
        };
        let workers = self.scratch.len().min(tasks.len());
        std::thread::scope(|s| -> Result<()> {
            let (first, rest) = self.scratch.split_first_mut().expect("one scratch buffer");
            let handles: Vec<_> = rest[..workers.saturating_sub(1)]
                .iter_mut()
                .map(|sc| s.spawn(|| work(sc)))
                .collect();
            let mine = work(first);
            for h in handles {
                h.join()
                    .map_err(|_| anyhow!("internal: a page encoder panicked"))??;
            }
            mine
        })?;
        // A page of one huge row leaves a huge buffer: not kept for the next pages.
        for sc in self
            .scratch
            .iter_mut()
            .filter(|s| s.0.capacity() > KEEP_SCRATCH)
        {
            sc.0 = Vec::new();
        }
        let mut done = done
            .into_inner()
            .map_err(|_| anyhow!("internal: poisoned"))?;
        done.sort_by_key(|p| p.0);
        Ok(done.into_iter().map(|p| p.1).collect())
    }

    /// Adds encoded pages to the pending row group.
    pub(crate) fn push_pages(&mut self, pages: impl IntoIterator<Item = EncodedPage>) {
        self.pages.extend(pages);
    }

    /// The pending row group's pages, handed to [`assemble_chunk`].
    pub(crate) fn take_pages(&mut self) -> (ColumnDescPtr, Vec<EncodedPage>) {
        (self.descr.clone(), std::mem::take(&mut self.pages))
    }
}

/// Encodes one data page V1 of `rows` (item counts; a single row of all `items` when empty).
fn encode_page(
    items: &[f32],
    rows: &[usize],
    max_def: i16,
    scratch: &mut Vec<u8>,
    zstd: &mut Zstd,
) -> Result<EncodedPage> {
    let one = [items.len()];
    let rows = if rows.is_empty() { &one[..] } else { rows };
    scratch.clear();
    // Repetition levels: 0 at a row's first item (or its empty list), 1 after.
    let rep = rows
        .iter()
        .flat_map(|&n| [(0u8, 1usize), (1, n.saturating_sub(1))]);
    let width = 16 - (max_def as u16).leading_zeros() as u8;
    write_levels(scratch, rep, 1);
    // Definition levels: max for an item, max - 1 for an empty list (`values` is never null).
    let def = rows.iter().map(|&n| {
        if n == 0 {
            (max_def as u8 - 1, 1)
        } else {
            (max_def as u8, n)
        }
    });
    write_levels(scratch, def, width);
    let start = scratch.len();
    scratch.resize(start + 4 * items.len(), 0);
    split_streams(items, &mut scratch[start..]);
    let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(scratch.len()));
    zstd.compress_to_buffer(&scratch[..], &mut out)?;
    let num_values = items.len() + rows.iter().filter(|&&n| n == 0).count();
    Ok(EncodedPage {
        data: Bytes::from(out),
        uncompressed: scratch.len(),
        num_values: u32::try_from(num_values)
            .map_err(|_| anyhow!("page of {num_values} levels"))?,
        num_rows: rows.len(),
    })
}

/// BYTE_STREAM_SPLIT of f32 items: byte `k` of item `i` goes to `out[k * n + i]`.
pub(crate) fn split_streams(items: &[f32], out: &mut [u8]) {
    let n = items.len();
    let (s0, rest) = out.split_at_mut(n);
    let (s1, rest) = rest.split_at_mut(n);
    let (s2, s3) = rest.split_at_mut(n);
    const B: usize = 64;
    let mut chunks = items.chunks_exact(B);
    let mut i = 0;
    for c in &mut chunks {
        let (o0, o1, o2, o3) = (
            &mut s0[i..i + B],
            &mut s1[i..i + B],
            &mut s2[i..i + B],
            &mut s3[i..i + B],
        );
        for j in 0..B {
            let b = c[j].to_bits().to_le_bytes();
            o0[j] = b[0];
            o1[j] = b[1];
            o2[j] = b[2];
            o3[j] = b[3];
        }
        i += B;
    }
    for (j, v) in chunks.remainder().iter().enumerate() {
        let b = v.to_bits().to_le_bytes();
        s0[i + j] = b[0];
        s1[i + j] = b[1];
        s2[i + j] = b[2];
        s3[i + j] = b[3];
    }
}

/// Appends levels given as runs `(value, count)` in the RLE/bit-packing hybrid of `width`
/// bits, with the 4-byte little-endian length prefix of data page V1. Runs of 8 or more equal
/// levels (after the 8-level groups of a bit-packed run are filled) are RLE runs; shorter ones
/// are bit-packed, the last group padded with zeros (the page header's count says where the
/// levels end).
pub(crate) fn write_levels(out: &mut Vec<u8>, runs: impl Iterator<Item = (u8, usize)>, width: u8) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut packed: Vec<u8> = Vec::new();
    let mut merged: Option<(u8, usize)> = None;
    let emit = |out: &mut Vec<u8>, packed: &mut Vec<u8>, (v, mut c): (u8, usize)| {
        // Fill the bit-packed groups up to a multiple of 8 first.
        let fill = ((8 - packed.len() % 8) % 8).min(c);
        if c - fill >= 8 {
            packed.extend(std::iter::repeat_n(v, fill));
            c -= fill;
            flush_packed(out, packed, width);
            varint(out, (c as u64) << 1);
            out.push(v);
        } else {
            packed.extend(std::iter::repeat_n(v, c));
        }
    };
    for (v, c) in runs.filter(|r| r.1 > 0) {
        merged = match merged {
            Some((mv, mc)) if mv == v => Some((v, mc + c)),
            Some(m) => {
                emit(out, &mut packed, m);
                Some((v, c))
            }
            None => Some((v, c)),
        };
    }
    if let Some(m) = merged {
        emit(out, &mut packed, m);
    }
    flush_packed(out, &mut packed, width);
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// Writes the levels in `packed` as one bit-packed run (padded to groups of 8) and clears it.
fn flush_packed(out: &mut Vec<u8>, packed: &mut Vec<u8>, width: u8) {
    if packed.is_empty() {
        return;
    }
    packed.resize(packed.len().div_ceil(8) * 8, 0);
    let groups = packed.len() / 8;
    varint(out, ((groups as u64) << 1) | 1);
    let mut acc = 0u64;
    let mut bits = 0;
    for &v in packed.iter() {
        acc |= (v as u64) << bits;
        bits += width as u32;
        while bits >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            bits -= 8;
        }
    }
    // 8 levels of `width` bits are exactly `width` bytes: nothing is left over.
    debug_assert_eq!(bits, 0);
    packed.clear();
}

fn varint(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

/// A column chunk as its pages' own buffers between their headers, read once, from its
/// start, by the file writer's `append_column`: each page is dropped once copied into the file,
/// so a row group's encoded values are not copied into a buffer of their own first (docs/MEMORY.md:
/// the copy and the pages were held together while the I/O rank wrote a step).
pub(crate) struct Chunk {
    len: u64,
    segs: Mutex<Option<VecDeque<Bytes>>>,
}

impl Length for Chunk {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for Chunk {
    type T = Segments;
    fn get_read(&self, start: u64) -> parquet::errors::Result<Segments> {
        let segs = match start {
            0 => self.segs.lock().ok().and_then(|mut s| s.take()),
            _ => None,
        };
        segs.map(Segments)
            .ok_or_else(|| ParquetError::General("internal: a chunk read twice".into()))
    }
    fn get_bytes(&self, _: u64, _: usize) -> parquet::errors::Result<Bytes> {
        Err(ParquetError::General(
            "internal: a chunk is only read in order".into(),
        ))
    }
}

/// The bytes of a [`Chunk`] in order, each buffer dropped once read.
pub(crate) struct Segments(VecDeque<Bytes>);

impl Read for Segments {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while let Some(front) = self.0.front_mut() {
            let n = front.len().min(out.len());
            out[..n].copy_from_slice(&front[..n]);
            *front = front.slice(n..);
            if front.is_empty() {
                self.0.pop_front();
            }
            if n > 0 || out.is_empty() {
                return Ok(n);
            }
        }
        Ok(0)
    }
}

/// What the page writer writes, as [`Chunk`] segments: a page's data (`expect`) is kept as
/// the page's own buffer, everything else (headers) copied.
#[derive(Default)]
struct SegState {
    segs: VecDeque<Bytes>,
    head: Vec<u8>,
    expect: Option<Bytes>,
}

struct SegSink(Arc<Mutex<SegState>>);

impl SegState {
    fn end_head(&mut self) {
        if !self.head.is_empty() {
            let head = std::mem::take(&mut self.head);
            self.segs.push_back(head.into());
        }
    }
}

impl Write for SegSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut st = self
            .0
            .lock()
            .map_err(|_| std::io::Error::other("internal: poisoned"))?;
        let page = st
            .expect
            .take_if(|d| !buf.is_empty() && d.as_ptr() == buf.as_ptr() && d.len() == buf.len());
        match page {
            Some(data) => {
                st.end_head();
                st.segs.push_back(data);
            }
            None => st.head.extend_from_slice(buf),
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Makes `pages` (one row group's) a column chunk ([`Chunk`]: the pages themselves, not a
/// copy), with the metadata and offset index arrow-rs's column writer would give it.
pub(crate) fn assemble_chunk(
    descr: ColumnDescPtr,
    pages: Vec<EncodedPage>,
    props: &WriterPropertiesPtr,
) -> Result<(Chunk, ColumnCloseResult)> {
    if pages.is_empty() {
        bail!("internal: a row group without pages of {}", descr.path());
    }
    let state = Arc::new(Mutex::new(SegState::default()));
    let mut sink = TrackedWrite::new(SegSink(state.clone()));
    let mut locations = Vec::with_capacity(pages.len());
    let (mut compressed, mut uncompressed, mut values, mut rows) = (0i64, 0i64, 0i64, 0u64);
    let count = pages.len() as i32;
    {
        let mut w = SerializedPageWriter::new(&mut sink);
        for p in pages {
            state
                .lock()
                .map_err(|_| anyhow!("internal: poisoned"))?
                .expect = Some(p.data.clone());
            let page = Page::DataPage {
                buf: p.data,
                num_values: p.num_values,
                encoding: Encoding::BYTE_STREAM_SPLIT,
                def_level_encoding: Encoding::RLE,
                rep_level_encoding: Encoding::RLE,
                statistics: None,
            };
            let spec = w.write_page(CompressedPage::new(page, p.uncompressed))?;
            locations.push(PageLocation {
                offset: spec.offset as i64,
                compressed_page_size: spec.compressed_size as i32,
                first_row_index: rows as i64,
            });
            compressed += spec.compressed_size as i64;
            uncompressed += spec.uncompressed_size as i64;
            values += spec.num_values as i64;
            rows += p.num_rows as u64;
        }
        w.close()?;
    }
    let metadata = ColumnChunkMetaData::builder(descr.clone())
        .set_compression(props.compression(descr.path()))
        .set_encodings_mask(EncodingMask::new_from_encodings(
            [Encoding::RLE, Encoding::BYTE_STREAM_SPLIT].iter(),
        ))
        .set_page_encoding_stats(vec![PageEncodingStats {
            page_type: PageType::DATA_PAGE,
            encoding: Encoding::BYTE_STREAM_SPLIT,
            count,
        }])
        .set_total_compressed_size(compressed)
        .set_total_uncompressed_size(uncompressed)
        .set_num_values(values)
        .set_data_page_offset(0)
        .build()?;
    let len = sink.bytes_written() as u64;
    drop(sink.into_inner()?);
    let mut st = std::mem::take(&mut *state.lock().map_err(|_| anyhow!("internal: poisoned"))?);
    st.end_head();
    let chunk = Chunk {
        len,
        segs: Mutex::new(Some(st.segs)),
    };
    let close = ColumnCloseResult {
        bytes_written: len,
        rows_written: rows,
        metadata,
        bloom_filter: None,
        column_index: None,
        offset_index: Some(OffsetIndexMetaData {
            page_locations: locations,
            unencoded_byte_array_data_bytes: None,
        }),
    };
    Ok((chunk, close))
}
