//! Fixtures shared by the tests of gradkit-core and gradtrace: good traces, and one broken
//! file for every validation error of docs/FORMAT.md, each with the words its message must hold.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use gradkit_core::io::{write_table, Meta, Output};
use gradkit_core::{PlanRow, Table, TensorRow};
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;

/// The states of a 64-bit LCG seeded from `seed`, one per value: their high 32 bits are
/// f32 bit patterns of every exponent, sign and NaN payload (the tests' awkward values).
pub fn lcg(n: usize, seed: u64) -> impl Iterator<Item = u64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n).map(move |_| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        x
    })
}

pub fn dense(step: u32, rank: u32, layer_id: u32, layer: &str, values: Vec<f32>) -> TensorRow {
    TensorRow {
        step,
        rank,
        layer_id,
        layer: layer.into(),
        numel: values.len() as u64,
        shape: Some(vec![values.len() as u32]),
        indices: None,
        values,
    }
}

pub fn sparse(
    step: u32,
    rank: u32,
    layer_id: u32,
    layer: &str,
    numel: u64,
    indices: Vec<u32>,
    values: Vec<f32>,
) -> TensorRow {
    TensorRow {
        step,
        rank,
        layer_id,
        layer: layer.into(),
        numel,
        shape: None,
        indices: Some(indices),
        values,
    }
}

/// A small valid trace: 2 steps × 2 ranks × 2 layers, dense and sparse rows mixed.
pub fn good_rows() -> Vec<TensorRow> {
    let mut rows = Vec::new();
    for step in 0..2 {
        for rank in 0..2 {
            let b = (step * 10 + rank) as f32;
            rows.push(dense(step, rank, 0, "w", vec![b, -1.5, 0.0, 2.25]));
            rows.push(sparse(
                step,
                rank,
                1,
                "b",
                6,
                vec![0, 3, 5],
                vec![b + 0.5, -2.0, 1e-7],
            ));
        }
    }
    rows
}

pub fn write_rows(path: &Path, rows: &[TensorRow]) {
    let mut meta = Meta::producer("test");
    meta.set("method", "fixture");
    write_table(&Output::Path(path.to_path_buf()), &meta, rows).unwrap();
}

/// Writes a raw record batch with the given key-value metadata (no checks at all).
pub fn write_batch(path: &Path, batch: &RecordBatch, kv: &[(&str, &str)]) {
    let f = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(f, batch.schema(), None).unwrap();
    for (k, v) in kv {
        w.append_key_value_metadata(KeyValue::new(k.to_string(), v.to_string()));
    }
    w.write(batch).unwrap();
    w.close().unwrap();
}

fn replace_column(
    batch: &RecordBatch,
    name: &str,
    field: Option<Field>,
    col: Option<ArrayRef>,
) -> RecordBatch {
    let schema = batch.schema();
    let mut fields = Vec::new();
    let mut cols = Vec::new();
    for (i, f) in schema.fields().iter().enumerate() {
        if f.name() == name {
            if let (Some(f), Some(c)) = (&field, &col) {
                fields.push(f.clone());
                cols.push(c.clone());
            }
        } else {
            fields.push(f.as_ref().clone());
            cols.push(batch.column(i).clone());
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
}

/// A broken file and the words the error must contain.
pub struct Case {
    pub name: &'static str,
    pub make: fn(&Path),
    pub expect: &'static [&'static str],
}

const TENSOR: (&str, &str) = ("gradkit.schema", "tensor/1");

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "missing_column",
            make: |p| {
                let b = TensorRow::to_batch(&good_rows()).unwrap();
                write_batch(p, &replace_column(&b, "values", None, None), &[TENSOR]);
            },
            expect: &["missing column `values`", "expected List<Float32>"],
        },
        Case {
            name: "wrong_type",
            make: |p| {
                let b = TensorRow::to_batch(&good_rows()).unwrap();
                // Int64 and whole-number floats are cast (range-checked); text is not.
                let n = b.num_rows();
                let b = replace_column(
                    &b,
                    "step",
                    Some(Field::new("step", DataType::Utf8, false)),
                    Some(Arc::new(StringArray::from_iter_values(
                        (0..n).map(|i| i.to_string()),
                    ))),
                );
                write_batch(p, &b, &[TENSOR]);
            },
            expect: &["column `step`", "Utf8", "expected UInt32"],
        },
        Case {
            name: "schema_key_absent",
            // Without the key, a file whose columns are tensor/1's is read (pandas and polars
            // drop the key); one whose columns are no table's is refused.
            make: |p| {
                let b = TensorRow::to_batch(&good_rows()).unwrap();
                write_batch(p, &replace_column(&b, "values", None, None), &[]);
            },
            expect: &[
                "`gradkit.schema`",
                "absent",
                "tensor/1",
                "missing column `values`",
            ],
        },
        Case {
            name: "schema_key_other",
            make: |p| {
                let plan = vec![PlanRow {
                    step: 0,
                    worker: 0,
                    layer_id: 0,
                    layer: "w".into(),
                    start: 0,
                    end: 4,
                    k: None,
                }];
                write_table(
                    &Output::Path(p.to_path_buf()),
                    &Meta::producer("test"),
                    &plan,
                )
                .unwrap();
            },
            expect: &["`plan/1`", "gradkit.schema", "`tensor/1` is expected"],
        },
        Case {
            name: "indices_not_ascending",
            make: |p| {
                let mut r = good_rows();
                r[1].indices = Some(vec![0, 3, 3]);
                write_rows(p, &r);
            },
            expect: &["column `indices`", "not strictly ascending", "layer `b`"],
        },
        Case {
            name: "index_out_of_range",
            make: |p| {
                let mut r = good_rows();
                r[1].indices = Some(vec![0, 3, 6]);
                write_rows(p, &r);
            },
            expect: &["column `indices`", "index 6 out of range for numel 6"],
        },
        Case {
            name: "dense_values_len",
            make: |p| {
                let mut r = good_rows();
                r[2].values.pop();
                write_rows(p, &r);
            },
            expect: &[
                "column `values`",
                "dense row has 3 values but numel is 4",
                "step 0 rank 1",
            ],
        },
        Case {
            name: "sparse_values_len",
            make: |p| {
                let mut r = good_rows();
                r[3].values.push(1.0);
                write_rows(p, &r);
            },
            expect: &["column `values`", "4 values but 3 indices", "layer `b`"],
        },
        Case {
            name: "numel_differs",
            make: |p| {
                let mut r = good_rows();
                r[5].numel = 7;
                write_rows(p, &r);
            },
            expect: &["column `numel`", "layer `b`", "6", "7"],
        },
        Case {
            name: "layer_id_differs",
            make: |p| {
                let mut r = good_rows();
                r[4].layer_id = 5;
                write_rows(p, &r);
            },
            expect: &["column `layer_id`", "layer `w`", "0", "5"],
        },
        Case {
            name: "nan",
            make: |p| {
                let mut r = good_rows();
                r[6].values[2] = f32::NAN;
                write_rows(p, &r);
            },
            expect: &[
                "non-finite value NaN",
                "column `values`",
                "--allow-nonfinite",
            ],
        },
        Case {
            name: "inf",
            make: |p| {
                let mut r = good_rows();
                r[7].values[0] = f32::NEG_INFINITY;
                write_rows(p, &r);
            },
            expect: &[
                "non-finite value -inf",
                "column `values`",
                "--allow-nonfinite",
            ],
        },
    ]
}

/// Cases that only --allow-nonfinite turns into valid files.
pub const NONFINITE: &[&str] = &["nan", "inf"];
