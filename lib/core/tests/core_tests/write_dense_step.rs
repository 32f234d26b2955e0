//! `TableWriter::write_dense_step` (a dense step written from its flat vector, no rows) and
//! `TableWriter::end_step` (the row group handed to the file at the end of a step): what is
//! written reads back, through the parquet crate's generic row reader, as the rows built here
//! by hand from the same numbers, values bit for bit; the row groups end where the step
//! changes once they hold 1 MiB of payload, as they did when the next step's first row ended
//! them (counted here from the sizes); the file is byte for byte the one `write_table` of the
//! hand-built rows gives; a misuse fails and leaves no file.

use crate::common;

use std::fs::File;
use std::path::Path;

use gradkit_core::io::{write_table, Meta, Output, TableWriter};
use gradkit_core::trace::Layout;
use gradkit_core::TensorRow;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;

/// Deterministic values with every exponent, sign and NaN payload (an LCG over the bits).
fn values(n: usize, seed: u64) -> Vec<f32> {
    common::lcg(n, seed)
        .map(|x| f32::from_bits((x >> 32) as u32))
        .collect()
}

/// Layers `(layer_id, name, numel, shape)`, deliberately not in `layer_id` order.
fn layers(sizes: &[u64]) -> Vec<(u32, String, u64, Option<Vec<u32>>)> {
    sizes
        .iter()
        .enumerate()
        .rev()
        .map(|(i, &n)| (i as u32, format!("layer{i}"), n, Some(vec![n as u32, 1])))
        .collect()
}

/// The rows of one step built by hand: each layer's values cut from `flat` by counting the
/// sizes of the layers before it (layer_id order).
fn rows_by_hand(sizes: &[u64], flat: &[f32], step: u32) -> Vec<TensorRow> {
    let mut at = 0usize;
    let mut rows = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        rows.push(TensorRow {
            step,
            rank: 0,
            layer_id: i as u32,
            layer: format!("layer{i}"),
            numel: n,
            shape: Some(vec![n as u32, 1]),
            indices: None,
            values: flat[at..at + n as usize].to_vec(),
        });
        at += n as usize;
    }
    rows
}

/// Every row through the parquet crate's generic row reader, with its row group.
fn read_rows(path: &Path) -> Vec<(usize, TensorRow)> {
    let reader = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
    let mut out = Vec::new();
    for g in 0..reader.num_row_groups() {
        let group = reader.get_row_group(g).unwrap();
        for row in group.get_row_iter(None).unwrap() {
            let mut t = common::dense(0, 0, 0, "", vec![]);
            for (name, f) in row.unwrap().get_column_iter() {
                let list = |f: &Field| match f {
                    Field::Null => None,
                    Field::ListInternal(l) => Some(l.elements().to_vec()),
                    other => panic!("not a list: {other:?}"),
                };
                match (name.as_str(), f) {
                    ("step", Field::UInt(x)) => t.step = *x,
                    ("rank", Field::UInt(x)) => t.rank = *x,
                    ("layer_id", Field::UInt(x)) => t.layer_id = *x,
                    ("layer", Field::Str(s)) => t.layer = s.clone(),
                    ("numel", Field::ULong(x)) => t.numel = *x,
                    ("shape" | "indices", f) => {
                        let v = list(f).map(|l| {
                            l.iter()
                                .map(|e| match e {
                                    Field::UInt(x) => *x,
                                    other => panic!("not a u32: {other:?}"),
                                })
                                .collect()
                        });
                        if name == "shape" {
                            t.shape = v;
                        } else {
                            t.indices = v;
                        }
                    }
                    ("values", f) => {
                        t.values = list(f)
                            .expect("values is never null")
                            .iter()
                            .map(|e| match e {
                                Field::Float(v) => *v,
                                other => panic!("not an f32: {other:?}"),
                            })
                            .collect()
                    }
                    (n, f) => panic!("unexpected column {n}: {f:?}"),
                }
            }
            out.push((g, t));
        }
    }
    out
}

fn assert_rows_equal(want: &[TensorRow], got: &[TensorRow]) {
    assert_eq!(want.len(), got.len(), "row count");
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        let ctx = format!("row {i} (step {} layer {})", w.step, w.layer_id);
        assert_eq!(
            (w.step, w.rank, w.layer_id, &w.layer, w.numel),
            (g.step, g.rank, g.layer_id, &g.layer, g.numel),
            "{ctx}"
        );
        assert_eq!((&w.shape, &w.indices), (&g.shape, &g.indices), "{ctx}");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(bits(&w.values) == bits(&g.values), "{ctx}: values differ");
    }
}

/// Writes `steps` dense steps of a model of `sizes` with `write_dense_step`, and the same
/// rows built by hand with `write_table`; returns the hand-built rows and both paths.
fn write_both(
    dir: &Path,
    sizes: &[u64],
    steps: u32,
) -> (Vec<TensorRow>, std::path::PathBuf, std::path::PathBuf) {
    let layout = Layout::new(layers(sizes));
    let total: u64 = sizes.iter().sum();
    let (dense, by_rows) = (dir.join("dense.parquet"), dir.join("rows.parquet"));
    let mut w =
        TableWriter::<TensorRow>::create(&Output::Path(dense.clone()), &Meta::default()).unwrap();
    let mut want = Vec::new();
    for s in 0..steps {
        let flat = values(total as usize, 7 + s as u64);
        w.write_dense_step(&flat, &layout, 10 + s, 0).unwrap();
        want.extend(rows_by_hand(sizes, &flat, 10 + s));
    }
    w.finish().unwrap();
    write_table(&Output::Path(by_rows.clone()), &Meta::default(), &want).unwrap();
    (want, dense, by_rows)
}

/// Payload bytes of one step as the writer counts them: 64 per row, 4 per shape item and value.
fn step_bytes(sizes: &[u64]) -> u64 {
    sizes.iter().map(|&n| 64 + 4 * 2 + 4 * n).sum()
}

#[test]
fn big_steps_read_back_bit_for_bit_one_row_group_each() {
    let dir = tempfile::tempdir().unwrap();
    // Rows of a page or more (encoded from the flat vector in place), small rows (copied into
    // shared pages), an empty layer; 1.6 MB a step: above the 1 MiB at which a step change
    // ends a row group, below the 16 MiB at which any row group ends.
    let sizes = [3, 300_000, 0, 1, 70_000, 17, 30_000];
    assert!(step_bytes(&sizes) > 1 << 20 && step_bytes(&sizes) < 16 << 20);
    let (want, dense, by_rows) = write_both(dir.path(), &sizes, 4);
    let got = read_rows(&dense);
    assert_rows_equal(&want, &got.iter().map(|g| g.1.clone()).collect::<Vec<_>>());
    // One row group per step.
    let groups: Vec<(usize, u32)> = got.iter().map(|(g, r)| (*g, r.step)).collect();
    for (g, step) in &groups {
        assert_eq!(*step, 10 + *g as u32, "row group {g} holds step {step}");
    }
    assert_eq!(groups.last().unwrap().0, 3, "4 row groups");
    assert!(
        std::fs::read(&dense).unwrap() == std::fs::read(&by_rows).unwrap(),
        "the file differs from write_table's of the same rows"
    );
}

#[test]
fn small_steps_share_row_groups_until_a_step_change_after_1_mib() {
    let dir = tempfile::tempdir().unwrap();
    // 300,040 bytes a step: the row group reaches 1 MiB with its 4th step and ends at the
    // 5th step's first row, so steps go 4 to a row group, the last group the remainder.
    let sizes = [50_000, 25_000, 1];
    assert_eq!(step_bytes(&sizes), 300_220);
    let steps = 10u32;
    let (want, dense, by_rows) = write_both(dir.path(), &sizes, steps);
    let got = read_rows(&dense);
    assert_rows_equal(&want, &got.iter().map(|g| g.1.clone()).collect::<Vec<_>>());
    for (g, r) in &got {
        assert_eq!(
            *g as u32,
            (r.step - 10) / 4,
            "step {} in row group {g}",
            r.step
        );
    }
    assert!(
        std::fs::read(&dense).unwrap() == std::fs::read(&by_rows).unwrap(),
        "the file differs from write_table's of the same rows"
    );
}

/// No file at `path` and nothing else in `dir` (no temporary file left behind).
fn assert_nothing_left(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn rows_of_an_ended_step_are_an_error_and_leave_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.parquet");
    let sizes = [300_000, 5];
    let layout = Layout::new(layers(&sizes));
    let flat = values(300_005, 1);
    {
        let mut w = TableWriter::<TensorRow>::create(&Output::Path(path.clone()), &Meta::default())
            .unwrap();
        w.write_dense_step(&flat, &layout, 3, 0).unwrap();
        let more = rows_by_hand(&sizes, &flat, 3);
        let err = format!("{:#}", w.write(&more[1..]).unwrap_err());
        assert!(
            err.contains("step 3") && err.contains("out.parquet"),
            "{err}"
        );
    }
    assert_nothing_left(dir.path());
}

#[test]
fn a_flat_vector_of_the_wrong_length_is_an_error_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.parquet");
    let layout = Layout::new(layers(&[10, 20]));
    {
        let mut w = TableWriter::<TensorRow>::create(&Output::Path(path.clone()), &Meta::default())
            .unwrap();
        w.write_dense_step(&values(30, 1), &layout, 0, 0).unwrap();
        let err = format!(
            "{:#}",
            w.write_dense_step(&values(29, 2), &layout, 1, 0)
                .unwrap_err()
        );
        assert!(err.contains("29") && err.contains("30"), "{err}");
    }
    assert_nothing_left(dir.path());
}

#[test]
fn mixed_row_sizes_read_back_bit_for_bit_as_write_table_writes_them() {
    let dir = tempfile::tempdir().unwrap();
    // 7.3 MB a step: rows of several pages with small rows between them.
    let sizes = [3, 700_000, 5, 400_000, 100, 600_000, 20_000, 1];
    let layout = Layout::new(layers(&sizes));
    let total: u64 = sizes.iter().sum();
    let (flat_path, by_rows) = (
        dir.path().join("flat.parquet"),
        dir.path().join("rows.parquet"),
    );
    let mut w =
        TableWriter::<TensorRow>::create(&Output::Path(flat_path.clone()), &Meta::default())
            .unwrap();
    let mut want = Vec::new();
    for s in 0..3 {
        let flat = values(total as usize, 40 + s as u64);
        want.extend(rows_by_hand(&sizes, &flat, s));
        w.write_dense_step(&flat, &layout, s, 0).unwrap();
    }
    w.finish().unwrap();
    let got = read_rows(&flat_path);
    assert_rows_equal(&want, &got.iter().map(|g| g.1.clone()).collect::<Vec<_>>());
    for (g, r) in &got {
        assert_eq!(*g as u32, r.step, "one row group per step");
    }
    write_table(&Output::Path(by_rows.clone()), &Meta::default(), &want).unwrap();
    assert!(
        std::fs::read(&flat_path).unwrap() == std::fs::read(&by_rows).unwrap(),
        "the file differs from write_table's of the same rows"
    );
}
