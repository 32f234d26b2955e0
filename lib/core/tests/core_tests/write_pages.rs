//! The `values` pages that `TableWriter` encodes itself (src/write_pages.rs: data pages V1,
//! RLE/bit-packed levels, BYTE_STREAM_SPLIT, zstd) read back bit for bit through readers that
//! share none of that code: the parquet crate's generic row reader (its own level, byte-stream
//! and zstd decoders), its Arrow reader skipping pages through the offset index, and pyarrow
//! when the venv of `make deps` is there. Edge cases: empty lists, rows of 1–17 items (level
//! runs shorter and longer than a bit-packed group), NaN payloads, ±inf, −0.0, subnormals,
//! sparse rows, one row bigger than a page and than a row group, many small rows sharing
//! pages across write calls, and changes of step.

use crate::common;

use std::fs::File;
use std::path::{Path, PathBuf};

use gradkit_core::io::{Meta, Output, TableWriter};
use gradkit_core::{Table, TensorRow};
use parquet::arrow::arrow_reader::{
    ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use parquet::file::metadata::PageIndexPolicy;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;

/// Bit patterns no arithmetic produces: NaNs with payloads (quiet and signalling, both signs),
/// infinities, −0.0, the smallest subnormal, the largest finite.
const SPECIAL: [u32; 10] = [
    0x7fc0_0000,
    0xffc0_0001,
    0x7f80_0001,
    0xff80_1234,
    0x7f80_0000,
    0xff80_0000,
    0x8000_0000,
    0x0000_0001,
    0x7f7f_ffff,
    0x8080_0000,
];

/// Deterministic values of every exponent and sign (an LCG over the bit patterns), with the
/// special patterns sprinkled in.
fn values(n: usize, seed: u64) -> Vec<f32> {
    common::lcg(n, seed)
        .enumerate()
        .map(|(i, x)| {
            let bits = if i % 97 == 13 {
                SPECIAL[(x >> 60) as usize % SPECIAL.len()]
            } else {
                (x >> 32) as u32
            };
            f32::from_bits(bits)
        })
        .collect()
}

/// The trace of the tests: about 30 MB, so at least two row groups of 16 MiB and pages of
/// every kind.
fn edge_rows() -> Vec<TensorRow> {
    let mut rows = Vec::new();
    // Step 0: short rows of every length around a bit-packed group of 8 levels, empty rows
    // (dense and sparse), the special values alone, a sparse row.
    for (i, n) in [0usize, 1, 2, 3, 7, 8, 9, 15, 16, 17, 0, 0, 1]
        .into_iter()
        .enumerate()
    {
        rows.push(common::dense(0, 0, i as u32, "short", values(n, i as u64)));
    }
    let special: Vec<f32> = SPECIAL.iter().map(|&b| f32::from_bits(b)).collect();
    rows.push(common::dense(0, 0, 20, "special", special));
    rows.push(common::sparse(0, 0, 21, "empty", 10, vec![], vec![]));
    rows.push(common::sparse(
        0,
        0,
        22,
        "sparse",
        1 << 20,
        (0..5000).map(|i| i * 200 + 3).collect(),
        values(5000, 22),
    ));
    // One row of 5 Mi values: bigger than a page (1 MiB) and than a row group (16 MiB).
    rows.push(common::dense(0, 1, 0, "huge", values(5 << 20, 99)));
    // Step 1: many small rows that share pages (and pages that span write calls).
    for i in 0..700u32 {
        let n = 300 + (i as usize * 37) % 2000;
        rows.push(common::dense(
            1,
            i % 4,
            i,
            "small",
            values(n, 1000 + i as u64),
        ));
    }
    // Step 2: rows just below and at a page, then sparse rows.
    rows.push(common::dense(2, 0, 0, "below", values((1 << 18) - 1, 7)));
    rows.push(common::dense(2, 0, 1, "at", values(1 << 18, 8)));
    for i in 0..40u32 {
        let k = 100 + 50 * i as usize;
        let idx = (0..k as u32).map(|j| j * 3 + i).collect();
        rows.push(common::sparse(
            2,
            1,
            i,
            "sp",
            1 << 20,
            idx,
            values(k, 5000 + i as u64),
        ));
    }
    // Step 3: dense rows of 2 Mi values (8 MiB), two per row group.
    for r in 0..3 {
        rows.push(common::dense(
            3,
            r,
            0,
            "big",
            values(2 << 20, 300 + r as u64),
        ));
    }
    rows
}

/// Writes `rows` with one `write` call per `chunk` rows.
fn write(path: &Path, rows: &[TensorRow], chunk: usize) {
    let mut w =
        TableWriter::<TensorRow>::create(&Output::Path(path.into()), &Meta::default()).unwrap();
    for c in rows.chunks(chunk) {
        w.write(c).unwrap();
    }
    w.finish().unwrap();
}

fn u32_list(f: &Field) -> Option<Vec<u32>> {
    match f {
        Field::Null => None,
        Field::ListInternal(l) => Some(
            l.elements()
                .iter()
                .map(|e| match e {
                    Field::UInt(x) => *x,
                    other => panic!("not a u32: {other:?}"),
                })
                .collect(),
        ),
        other => panic!("not a list: {other:?}"),
    }
}

/// Every row of `path` through the parquet crate's generic row reader, values as bits.
fn read_rows_generic(path: &Path) -> Vec<(TensorRow, Vec<u32>)> {
    let reader = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
    let mut out = Vec::new();
    for row in reader.get_row_iter(None).unwrap() {
        let row = row.unwrap();
        let mut t = common::dense(0, 0, 0, "", vec![]);
        let mut bits = Vec::new();
        for (name, f) in row.get_column_iter() {
            match (name.as_str(), f) {
                ("step", Field::UInt(x)) => t.step = *x,
                ("rank", Field::UInt(x)) => t.rank = *x,
                ("layer_id", Field::UInt(x)) => t.layer_id = *x,
                ("layer", Field::Str(s)) => t.layer = s.clone(),
                ("numel", Field::ULong(x)) => t.numel = *x,
                ("shape", f) => t.shape = u32_list(f),
                ("indices", f) => t.indices = u32_list(f),
                ("values", Field::ListInternal(l)) => {
                    bits = l
                        .elements()
                        .iter()
                        .map(|e| match e {
                            Field::Float(v) => v.to_bits(),
                            other => panic!("not an f32: {other:?}"),
                        })
                        .collect()
                }
                (n, f) => panic!("unexpected column {n}: {f:?}"),
            }
        }
        out.push((t, bits));
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `got` holds the rows of `want`, values compared bit for bit.
fn assert_same(want: &[TensorRow], got: &[(TensorRow, Vec<u32>)]) {
    assert_eq!(want.len(), got.len());
    for (i, (w, (g, gbits))) in want.iter().zip(got).enumerate() {
        let ctx = format!("row {i} ({} {} {})", w.step, w.rank, w.layer);
        assert_eq!(
            (w.step, w.rank, w.layer_id, &w.layer, w.numel),
            (g.step, g.rank, g.layer_id, &g.layer, g.numel),
            "{ctx}"
        );
        assert_eq!(w.shape, g.shape, "{ctx}");
        assert_eq!(w.indices, g.indices, "{ctx}");
        assert!(bits(&w.values) == *gbits, "{ctx}: values differ");
    }
}

#[test]
fn edge_rows_read_back_bit_for_bit_whatever_the_write_calls() {
    let dir = tempfile::tempdir().unwrap();
    let rows = edge_rows();
    let (one, each, odd) = (
        dir.path().join("one.parquet"),
        dir.path().join("each.parquet"),
        dir.path().join("odd.parquet"),
    );
    write(&one, &rows, rows.len());
    write(&each, &rows, 1);
    write(&odd, &rows, 7);
    assert_same(&rows, &read_rows_generic(&one));
    // Pages and row groups depend only on the rows: the same bytes however they are handed in.
    let bytes = std::fs::read(&one).unwrap();
    assert!(
        bytes == std::fs::read(&each).unwrap(),
        "1 call vs 1 row per call"
    );
    assert!(
        bytes == std::fs::read(&odd).unwrap(),
        "1 call vs 7 rows per call"
    );
    // More than one row group, and the values column of each has pages on row boundaries.
    let reader = SerializedFileReader::new(File::open(&one).unwrap()).unwrap();
    assert!(reader.metadata().num_row_groups() >= 2);
}

#[test]
fn pages_skipped_through_the_offset_index_leave_the_selected_rows() {
    let dir = tempfile::tempdir().unwrap();
    let rows = edge_rows();
    let path = dir.path().join("t.parquet");
    write(&path, &rows, 16);
    // Row ranges inside shared pages, across page and row-group boundaries.
    let n = rows.len();
    for (skip, take) in [
        (0, 3),
        (5, 20),
        (17, 1),
        (100, 250),
        (n - 45, 44),
        (n - 3, 3),
    ] {
        let opts = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Required);
        let b =
            ParquetRecordBatchReaderBuilder::try_new_with_options(File::open(&path).unwrap(), opts)
                .unwrap();
        let sel = RowSelection::from(vec![RowSelector::skip(skip), RowSelector::select(take)]);
        let mut got = Vec::new();
        for batch in b.with_row_selection(sel).build().unwrap() {
            got.extend(TensorRow::from_batch(&batch.unwrap()).unwrap());
        }
        let got: Vec<(TensorRow, Vec<u32>)> = got
            .into_iter()
            .map(|r| {
                let b = bits(&r.values);
                (r, b)
            })
            .collect();
        assert_same(&rows[skip..skip + take], &got);
    }
}

/// pyarrow reads the file and writes every row's values as raw little-endian bytes.
#[test]
fn pyarrow_reads_the_pages_bit_for_bit() {
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    if !py.exists() {
        eprintln!("skipped: no {} (make deps)", py.display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rows = edge_rows();
    let path = dir.path().join("t.parquet");
    let out = dir.path().join("values.bin");
    write(&path, &rows, 5);
    let script = r#"
import sys
import pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
with open(sys.argv[2], "wb") as f:
    for v in t.column("values").to_pylist():
        f.write(len(v).to_bytes(8, "little"))
    for c in t.column("values").chunks:
        f.write(c.flatten().to_numpy(zero_copy_only=False).tobytes())
print(t.num_rows)
"#;
    let o = std::process::Command::new(&py)
        .args(["-c", script])
        .arg(&path)
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let raw = std::fs::read(&out).unwrap();
    let (lens, data) = raw.split_at(8 * rows.len());
    let mut want = Vec::new();
    for (r, l) in rows.iter().zip(lens.chunks(8)) {
        assert_eq!(
            u64::from_le_bytes(l.try_into().unwrap()),
            r.values.len() as u64
        );
        want.extend(r.values.iter().flat_map(|v| v.to_bits().to_le_bytes()));
    }
    assert!(data == &want[..], "pyarrow's values differ");
}
