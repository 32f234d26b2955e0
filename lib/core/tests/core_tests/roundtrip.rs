//! Every schema survives a write and a read unchanged: rows (dense and sparse, null and
//! present shapes, empty rows), metadata, and many record batches.

use crate::common;

use gradkit_core::io::{
    read_table, read_tensor, write_table, Input, Meta, Output, ReadOptions, TableWriter,
};
use gradkit_core::{MetricRow, PlanRow, TensorRow};

fn tmp(dir: &tempfile::TempDir, name: &str) -> std::path::PathBuf {
    dir.path().join(name)
}

fn leftovers(dir: &tempfile::TempDir) -> Vec<String> {
    std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect()
}

#[test]
fn tensor_rows_round_trip_dense_and_sparse() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows = common::good_rows();
    // Edge cases: an empty sparse row, a dense row without shape, a 2-D shape, extreme values.
    rows.push(common::sparse(2, 0, 1, "b", 6, vec![], vec![]));
    let mut d = common::dense(
        2,
        0,
        0,
        "w",
        vec![f32::MIN_POSITIVE, -0.0, f32::MAX, -3.0e-38],
    );
    d.shape = Some(vec![2, 2]);
    rows.push(d);
    let mut d = common::dense(2, 1, 0, "w", vec![1.0, 2.0, 3.0, 4.0]);
    d.shape = None;
    rows.push(d);
    let p = tmp(&dir, "t.parquet");
    let mut meta = Meta::producer("test");
    meta.set("method", "fixture").set("density", 0.01);
    write_table(&Output::Path(p.clone()), &meta, &rows).unwrap();
    let t = read_tensor(&Input::Path(p), ReadOptions::default()).unwrap();
    assert_eq!(t.rows.len(), rows.len());
    for (a, b) in t.rows.iter().zip(&rows) {
        assert_eq!(a, b);
        // Bit for bit (PartialEq would let -0.0 == 0.0 pass).
        let bits = |r: &TensorRow| r.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(b));
    }
    assert_eq!(t.meta.get("gradkit.schema"), Some("tensor/1"));
    assert_eq!(t.meta.get("gradkit.method"), Some("fixture"));
    assert_eq!(t.meta.get("gradkit.density"), Some("0.01"));
    assert!(t.meta.get("gradkit.producer").unwrap().starts_with("test "));
    assert!(leftovers(&dir).is_empty());
}

#[test]
fn streamed_writes_concatenate_and_many_batches_read_back() {
    // More rows than one read batch (4096), written in uneven pieces.
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<TensorRow> = (0..10_000u32)
        .map(|i| {
            if i % 3 == 0 {
                common::sparse(i / 2, i % 2, 1, "b", 100, vec![i % 100], vec![i as f32])
            } else {
                common::dense(i / 2, i % 2, 0, "w", vec![i as f32, -(i as f32)])
            }
        })
        .collect();
    let p = tmp(&dir, "s.parquet");
    let mut w =
        TableWriter::<TensorRow>::create(&Output::Path(p.clone()), &Meta::default()).unwrap();
    let mut start = 0;
    for n in [1usize, 7, 4096, 3000, 2896] {
        w.write(&rows[start..start + n]).unwrap();
        start += n;
    }
    assert_eq!(start, rows.len());
    assert!(!p.exists(), "the file must appear only on finish");
    w.finish().unwrap();
    let t = read_tensor(&Input::Path(p), ReadOptions::default()).unwrap();
    assert_eq!(t.rows, rows);
}

#[test]
fn an_unfinished_writer_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let p = tmp(&dir, "never.parquet");
    {
        let mut w =
            TableWriter::<TensorRow>::create(&Output::Path(p.clone()), &Meta::default()).unwrap();
        w.write(&common::good_rows()).unwrap();
        // Writes go to an unnamed file (Linux O_TMPFILE) or to a `.tmp-` file, never to p.
        assert!(leftovers(&dir).len() <= 1);
        assert!(!p.exists(), "the file must appear only on finish");
    }
    assert!(!p.exists());
    assert!(leftovers(&dir).is_empty());
}

#[test]
fn plan_rows_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<PlanRow> = (0..50u32)
        .map(|i| PlanRow {
            step: i / 10,
            worker: i % 4,
            layer_id: i % 3,
            layer: format!("layer{}", i % 3),
            start: i as u64 * 100,
            end: i as u64 * 100 + 100,
            k: (i % 2 == 0).then_some(i as u64),
        })
        .collect();
    let p = tmp(&dir, "p.parquet");
    let mut meta = Meta::producer("test");
    meta.set("method", "deft");
    write_table(&Output::Path(p.clone()), &meta, &rows).unwrap();
    let t = read_table::<PlanRow>(&Input::Path(p.clone()), ReadOptions::default()).unwrap();
    assert_eq!(t.rows, rows);
    assert_eq!(t.meta.get("gradkit.schema"), Some("plan/1"));
    assert_eq!(t.meta.get("method"), Some("deft"));
    // A plan is not a tensor table.
    let err = read_table::<TensorRow>(&Input::Path(p), ReadOptions::default()).unwrap_err();
    assert!(format!("{err:#}").contains("holds `plan/1`"));
}

#[test]
fn metric_rows_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<MetricRow> = (0..30u32)
        .map(|i| MetricRow {
            run: "r1".into(),
            tool: "gradallreduce".into(),
            algo: ["ring", "oktopk", "deft"][i as usize % 3].into(),
            world_size: 4,
            step: i / 4,
            rank: i % 4,
            metric: "bytes_sent".into(),
            value: i as f64 * 1.5e9 + 0.125,
            settings: Default::default(),
        })
        .collect();
    let p = tmp(&dir, "m.parquet");
    write_table(&Output::Path(p.clone()), &Meta::producer("test"), &rows).unwrap();
    let t = read_table::<MetricRow>(&Input::Path(p), ReadOptions::default()).unwrap();
    assert_eq!(t.rows, rows);
    assert_eq!(t.meta.get("gradkit.schema"), Some("metrics/1"));
}
