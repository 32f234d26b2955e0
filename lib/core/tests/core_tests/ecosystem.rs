//! The physical variants other writers use for the same columns (docs/RELIABILITY.md),
//! built here with arrow-rs so that each is covered alone: LargeUtf8, Utf8View, dictionary
//! strings, LargeList, FixedSizeList, a Null column, Int64 and whole-number floats where the
//! format has unsigned integers, Float32 metrics, a missing `gradkit.schema` key, and the
//! gzip/LZ4/Brotli codecs. Each must read as the rows it was built from; values that do not
//! fit are refused naming the column and the row. (tools/gradtrace/tests/gradtrace/ecosystem.rs reads
//! files written by pandas, polars and pyarrow themselves.)

use crate::common;

use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::ListBuilder;
use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, UInt32Type};
use arrow_array::{
    Array, ArrayRef, DictionaryArray, FixedSizeListArray, Float32Array, Float64Array, Int64Array,
    LargeListArray, LargeStringArray, ListArray, NullArray, RecordBatch, StringViewArray,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Schema};
use gradkit_core::io::{read_table, read_tensor, Input, ReadOptions};
use gradkit_core::{MetricRow, PlanRow, Table, TensorRow};
use parquet::arrow::ArrowWriter;
use parquet::basic::{BrotliLevel, Compression, GzipLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

const KEY: (&str, &str) = ("gradkit.schema", "tensor/1");

/// `batch` with the named columns replaced (types taken from the new arrays, all nullable,
/// as pyarrow and polars declare them).
fn replace(batch: &RecordBatch, new: &[(&str, ArrayRef)]) -> RecordBatch {
    let mut fields = Vec::new();
    let mut cols = Vec::new();
    for (i, f) in batch.schema().fields().iter().enumerate() {
        let c = new
            .iter()
            .find(|(n, _)| n == f.name())
            .map_or_else(|| batch.column(i).clone(), |(_, c)| c.clone());
        fields.push(Field::new(f.name(), c.data_type().clone(), true));
        cols.push(c);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
}

fn write(path: &Path, batch: &RecordBatch, kv: &[(&str, &str)], props: WriterProperties) {
    let f = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(f, batch.schema(), Some(props)).unwrap();
    for (k, v) in kv {
        w.append_key_value_metadata(KeyValue::new(k.to_string(), v.to_string()));
    }
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// Row groups of two rows, so that a reported row number must count the rows before its group.
fn small_groups() -> WriterProperties {
    WriterProperties::builder()
        .set_max_row_group_row_count(Some(2))
        .build()
}

fn large_list(a: &ArrayRef) -> ArrayRef {
    let l = a.as_list::<i32>();
    let offsets: Vec<i64> = l.value_offsets().iter().map(|&o| o as i64).collect();
    Arc::new(LargeListArray::new(
        Arc::new(Field::new_list_field(l.value_type(), true)),
        OffsetBuffer::new(offsets.into()),
        l.values().clone(),
        l.nulls().cloned(),
    ))
}

/// A List<UInt32> column as List<Int64> with the same values.
fn int64_list(a: &ArrayRef) -> ArrayRef {
    let l = a.as_list::<i32>();
    let items = Int64Array::from_iter_values(
        l.values()
            .as_primitive::<UInt32Type>()
            .values()
            .iter()
            .map(|&v| v as i64),
    );
    Arc::new(ListArray::new(
        Arc::new(Field::new_list_field(DataType::Int64, true)),
        l.offsets().clone(),
        Arc::new(items),
        l.nulls().cloned(),
    ))
}

fn int64(a: &ArrayRef) -> ArrayRef {
    let v: Vec<i64> = match a.data_type() {
        DataType::UInt32 => a
            .as_primitive::<UInt32Type>()
            .values()
            .iter()
            .map(|&v| v as i64)
            .collect(),
        _ => a
            .as_primitive::<arrow_array::types::UInt64Type>()
            .values()
            .iter()
            .map(|&v| v as i64)
            .collect(),
    };
    Arc::new(Int64Array::from(v))
}

fn read(path: &Path) -> anyhow::Result<Vec<TensorRow>> {
    Ok(read_tensor(&Input::Path(path.to_path_buf()), ReadOptions::default())?.rows)
}

fn err(path: &Path) -> String {
    format!("{:#}", read(path).expect_err("must be refused"))
}

#[test]
fn large_view_dictionary_and_int64_variants_read_as_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let rows = common::good_rows();
    let b = TensorRow::to_batch(&rows).unwrap();
    let layers: Vec<String> = rows.iter().map(|r| r.layer.clone()).collect();
    let col = |n: &str| b.column_by_name(n).unwrap().clone();
    let variants: Vec<(&str, Vec<(&str, ArrayRef)>)> = vec![
        (
            "large (polars)",
            vec![
                (
                    "layer",
                    Arc::new(LargeStringArray::from_iter_values(&layers)) as ArrayRef,
                ),
                ("shape", large_list(&col("shape"))),
                ("indices", large_list(&col("indices"))),
                ("values", large_list(&col("values"))),
            ],
        ),
        (
            "string view",
            vec![(
                "layer",
                Arc::new(StringViewArray::from_iter_values(&layers)) as ArrayRef,
            )],
        ),
        (
            "dictionary (pandas category)",
            vec![(
                "layer",
                Arc::new(
                    layers
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<DictionaryArray<Int32Type>>(),
                ) as ArrayRef,
            )],
        ),
        (
            "int64 (Python ints)",
            vec![
                ("step", int64(&col("step"))),
                ("rank", int64(&col("rank"))),
                ("layer_id", int64(&col("layer_id"))),
                ("numel", int64(&col("numel"))),
                ("shape", int64_list(&col("shape"))),
                ("indices", int64_list(&col("indices"))),
            ],
        ),
        (
            "whole-number float64 step",
            vec![(
                "step",
                Arc::new(Float64Array::from_iter_values(
                    rows.iter().map(|r| r.step as f64),
                )) as ArrayRef,
            )],
        ),
    ];
    for (name, cols) in variants {
        for with_key in [true, false] {
            let p = dir.path().join("v.parquet");
            let kv: &[(&str, &str)] = if with_key { &[KEY] } else { &[] };
            write(&p, &replace(&b, &cols), kv, small_groups());
            let got = read(&p).unwrap_or_else(|e| panic!("{name} (key {with_key}): {e:#}"));
            assert_eq!(got, rows, "{name} (key {with_key})");
        }
    }
}

#[test]
fn null_typed_and_fixed_size_list_columns_read() {
    let dir = tempfile::tempdir().unwrap();
    // Dense rows only: pandas writes the all-None `indices` (and `shape`) as type Null; a
    // numpy 2-D column becomes a FixedSizeList.
    let dense: Vec<TensorRow> = common::good_rows()
        .into_iter()
        .filter(|r| r.indices.is_none())
        .map(|r| TensorRow { shape: None, ..r })
        .collect();
    let b = TensorRow::to_batch(&dense).unwrap();
    let n = dense.len();
    let flat: Vec<f32> = dense.iter().flat_map(|r| r.values.clone()).collect();
    let fixed = FixedSizeListArray::new(
        Arc::new(Field::new_list_field(DataType::Float32, true)),
        4,
        Arc::new(Float32Array::from(flat)),
        None,
    );
    let p = dir.path().join("dense.parquet");
    let cols: Vec<(&str, ArrayRef)> = vec![
        ("indices", Arc::new(NullArray::new(n))),
        ("shape", Arc::new(NullArray::new(n))),
        ("values", Arc::new(fixed)),
    ];
    write(&p, &replace(&b, &cols), &[], small_groups());
    assert_eq!(read(&p).unwrap(), dense);
    // A Null column where nulls are not allowed is a type error, not a crash.
    let cols: Vec<(&str, ArrayRef)> = vec![("values", Arc::new(NullArray::new(n)))];
    write(&p, &replace(&b, &cols), &[KEY], small_groups());
    let e = err(&p);
    assert!(
        e.contains("column `values` has type Null, expected List<Float32>"),
        "{e}"
    );
}

#[test]
fn values_that_do_not_fit_name_the_column_and_the_row() {
    let dir = tempfile::tempdir().unwrap();
    let rows = common::good_rows();
    let b = TensorRow::to_batch(&rows).unwrap();
    let p = dir.path().join("bad.parquet");
    // Row 5 lies in the third row group of two rows.
    let mut step: Vec<i64> = rows.iter().map(|r| r.step as i64).collect();
    step[5] = -1;
    let cols: Vec<(&str, ArrayRef)> = vec![("step", Arc::new(Int64Array::from(step)))];
    write(&p, &replace(&b, &cols), &[KEY], small_groups());
    let e = err(&p);
    assert!(
        e.contains("column `step`, row 5: value -1 does not fit UInt32 (the file stores Int64)"),
        "{e}"
    );
    // An index of 2^32 in row 3, item 1 (List<Int64>).
    let mut idx = ListBuilder::new(arrow_array::builder::Int64Builder::new());
    for r in &rows {
        match &r.indices {
            Some(i) => {
                for (j, &v) in i.iter().enumerate() {
                    let v = if r.step == 0 && r.rank == 1 && j == 1 {
                        1i64 << 32
                    } else {
                        v as i64
                    };
                    idx.values().append_value(v);
                }
                idx.append(true);
            }
            None => idx.append(false),
        }
    }
    let cols: Vec<(&str, ArrayRef)> = vec![("indices", Arc::new(idx.finish()))];
    write(&p, &replace(&b, &cols), &[KEY], small_groups());
    let e = err(&p);
    assert!(
        e.contains("column `indices`, row 3, item 1: value 4294967296 does not fit UInt32"),
        "{e}"
    );
    // numel above u32 is fine (UInt64), negative is not.
    let mut numel: Vec<i64> = rows.iter().map(|r| r.numel as i64).collect();
    numel[0] = -4;
    let cols: Vec<(&str, ArrayRef)> = vec![("numel", Arc::new(Int64Array::from(numel)))];
    write(&p, &replace(&b, &cols), &[KEY], small_groups());
    let e = err(&p);
    assert!(e.contains("column `numel`, row 0: value -4"), "{e}");
}

#[test]
fn float64_gradients_are_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let rows = common::good_rows();
    let b = TensorRow::to_batch(&rows).unwrap();
    let mut vals = ListBuilder::new(arrow_array::builder::Float64Builder::new());
    for r in &rows {
        for &v in &r.values {
            vals.values().append_value(v as f64);
        }
        vals.append(true);
    }
    let p = dir.path().join("f64.parquet");
    let cols: Vec<(&str, ArrayRef)> = vec![("values", Arc::new(vals.finish()))];
    write(&p, &replace(&b, &cols), &[KEY], small_groups());
    let e = err(&p);
    assert!(
        e.contains("column `values` has type List<Float64>, expected List<Float32>")
            && e.contains(".astype(np.float32)"),
        "{e}"
    );
}

#[test]
fn missing_schema_key_is_inferred_only_when_the_columns_say_which_table() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("k.parquet");
    let plan = vec![
        PlanRow {
            step: 0,
            worker: 0,
            layer_id: 0,
            layer: "w".into(),
            start: 0,
            end: 3,
            k: Some(2),
        },
        PlanRow {
            step: 0,
            worker: 1,
            layer_id: 0,
            layer: "w".into(),
            start: 3,
            end: 6,
            k: None,
        },
    ];
    // pandas: `k` with a null becomes Float64; the key is gone. Read as plan/1 …
    let b = PlanRow::to_batch(&plan).unwrap();
    let k: ArrayRef = Arc::new(Float64Array::from(vec![Some(2.0), None]));
    write(&p, &replace(&b, &[("k", k)]), &[], small_groups());
    let got = read_table::<PlanRow>(&Input::Path(p.clone()), ReadOptions::default()).unwrap();
    assert_eq!(got.rows, plan);
    // … refused as tensor/1, naming the table the columns are.
    let e = err(&p);
    assert!(
        e.contains("`gradkit.schema` is absent")
            && e.contains("those of `plan/1`")
            && e.contains("`tensor/1` is expected"),
        "{e}"
    );
    // A fractional `k` is not an integer.
    let k: ArrayRef = Arc::new(Float64Array::from(vec![Some(2.0), Some(2.5)]));
    write(&p, &replace(&b, &[("k", k)]), &[], small_groups());
    let e = format!(
        "{:#}",
        read_table::<PlanRow>(&Input::Path(p.clone()), ReadOptions::default()).unwrap_err()
    );
    assert!(
        e.contains("column `k`, row 1: value 2.5 is not a whole number"),
        "{e}"
    );
    // Columns of two tables at once: ambiguous without the key.
    let t = TensorRow::to_batch(&common::good_rows()[..2]).unwrap();
    let pb = PlanRow::to_batch(&plan).unwrap();
    let mut fields: Vec<Field> = t
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut cols = t.columns().to_vec();
    for n in ["worker", "start", "end", "k"] {
        let i = pb.schema().index_of(n).unwrap();
        fields.push(pb.schema().field(i).clone());
        cols.push(pb.column(i).clone());
    }
    let both = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
    write(&p, &both, &[], small_groups());
    let e = err(&p);
    assert!(
        e.contains("`tensor/1` and `plan/1`") && e.contains("set the key"),
        "{e}"
    );
}

#[test]
fn metrics_with_large_strings_and_float32_values_read() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<MetricRow> = (0..5)
        .map(|i| MetricRow {
            run: format!("r{i}"),
            tool: "gradtrain".into(),
            algo: "dense".into(),
            world_size: 2,
            step: i,
            rank: 0,
            metric: "loss".into(),
            value: 0.5 + i as f64 * 0.25, // exact in f32
            settings: Default::default(),
        })
        .collect();
    let b = MetricRow::to_batch(&rows).unwrap();
    let strs = |f: fn(&MetricRow) -> &str| -> ArrayRef {
        Arc::new(LargeStringArray::from_iter_values(rows.iter().map(f)))
    };
    let cols: Vec<(&str, ArrayRef)> = vec![
        ("run", strs(|r| &r.run)),
        ("tool", strs(|r| &r.tool)),
        ("algo", strs(|r| &r.algo)),
        ("metric", strs(|r| &r.metric)),
        (
            "value",
            Arc::new(Float32Array::from_iter_values(
                rows.iter().map(|r| r.value as f32),
            )),
        ),
    ];
    let p = dir.path().join("m.parquet");
    write(&p, &replace(&b, &cols), &[], small_groups());
    let got = read_table::<MetricRow>(&Input::Path(p), ReadOptions::default()).unwrap();
    assert_eq!(got.rows, rows);
}

#[test]
fn gzip_lz4_and_brotli_files_read() {
    let dir = tempfile::tempdir().unwrap();
    let rows = common::good_rows();
    let b = TensorRow::to_batch(&rows).unwrap();
    for c in [
        Compression::GZIP(GzipLevel::default()),
        Compression::LZ4,
        Compression::LZ4_RAW,
        Compression::BROTLI(BrotliLevel::default()),
    ] {
        let p = dir.path().join("c.parquet");
        let props = WriterProperties::builder().set_compression(c).build();
        write(&p, &b, &[KEY], props);
        assert_eq!(
            read(&p).unwrap_or_else(|e| panic!("{c:?}: {e:#}")),
            rows,
            "{c:?}"
        );
    }
    // The canonical batch itself is untouched by the casts (no copy, same rows).
    let same = gradkit_core::tables::conform(&TensorRow::schema(), &b, 0).unwrap();
    for (x, y) in same.columns().iter().zip(b.columns()) {
        assert!(Arc::ptr_eq(x, y));
    }
}
