//! A live table ([`gradkit_core::live::LiveTable`]) is a complete Parquet file after every
//! append, holding exactly the rows appended so far (checked against the list of rows the test
//! appended, read back by gradkit's reader and by the file's own footer), and each append
//! writes the new rows, not the whole file again.

use gradkit_core::io::{read_table, Input, Meta, ReadOptions};
use gradkit_core::live::LiveTable;
use gradkit_core::MetricRow;

fn row(step: u32, rank: u32, metric: &str, value: f64) -> MetricRow {
    MetricRow {
        run: "r".into(),
        tool: "t".into(),
        algo: "a".into(),
        world_size: 2,
        step,
        rank,
        metric: metric.into(),
        value,
        settings: Default::default(),
    }
}

/// The rows of step `s`: two ranks, three metrics, values that are not round.
fn step_rows(s: u32) -> Vec<MetricRow> {
    let mut v = Vec::new();
    for r in 0..2 {
        for (i, m) in ["loss", "bytes_sent", "time_comm_s"].iter().enumerate() {
            v.push(row(s, r, m, (s as f64 + 0.1 * i as f64) / 3.0 + r as f64));
        }
    }
    v
}

fn read(p: &std::path::Path) -> (Vec<MetricRow>, Meta) {
    let t = read_table::<MetricRow>(&Input::Path(p.to_path_buf()), ReadOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
    (t.rows, t.meta)
}

#[test]
fn every_append_leaves_a_complete_file_of_the_rows_so_far() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.parquet");
    // An older file at the path is replaced at the first append, not before.
    std::fs::write(&p, b"older").unwrap();
    let mut meta = Meta::default();
    meta.set("gradkit.world_size", 2);
    let mut t = LiveTable::<MetricRow>::create(&p, &meta).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"older");
    let mut want = Vec::new();
    // Steps of 6 rows, and one batch of 5000 rows: the open row group closes (4096 rows) in
    // the middle of an append and again later.
    let mut s = 0;
    let mut sizes = Vec::new();
    for batch in 0..40u32 {
        let rows: Vec<MetricRow> = if batch == 20 {
            (0..834).flat_map(|k| step_rows(s + k)).collect()
        } else {
            step_rows(s)
        };
        s += if batch == 20 { 834 } else { 1 };
        want.extend(rows.iter().cloned());
        t.append(&rows).unwrap();
        let (got, m) = read(&p);
        assert_eq!(got, want, "after append {batch}");
        assert_eq!(m.get("gradkit.world_size"), Some("2"));
        sizes.push(std::fs::metadata(&p).unwrap().len());
    }
    t.finish().unwrap();
    let (got, _) = read(&p);
    assert_eq!(got, want);
    // Appends after the big one add a step's bytes and a footer, not the file again: the
    // growth of one small append is far below the file's size.
    let last = sizes[39] - sizes[38];
    assert!(
        last * 4 < sizes[39],
        "a 6-row append grew the file by {last} of {} bytes",
        sizes[39]
    );
    // No temporary file is left beside it.
    let names: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["m.parquet".to_string()]);
}

#[test]
fn a_table_with_no_rows_is_written_at_finish_and_an_unnamed_one_copies() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("empty.parquet");
    let t = LiveTable::<MetricRow>::create(&p, &Meta::default()).unwrap();
    assert!(
        !p.exists(),
        "the file appears only at the first append or at the end"
    );
    t.finish().unwrap();
    assert!(read(&p).0.is_empty());
    // An unnamed table: nothing in any directory, but copies of it are complete files.
    let mut u = LiveTable::<MetricRow>::unnamed(&Meta::default()).unwrap();
    let (a, b) = (d.path().join("a.parquet"), d.path().join("b.parquet"));
    u.copy_to(&a).unwrap();
    assert!(read(&a).0.is_empty());
    u.append(&step_rows(0)).unwrap();
    u.append(&step_rows(1)).unwrap();
    u.copy_to(&b).unwrap();
    let mut want = step_rows(0);
    want.extend(step_rows(1));
    assert_eq!(read(&b).0, want);
    assert_eq!(u.rows(), 12);
}

#[test]
fn a_missing_directory_fails_at_create() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("missing").join("m.parquet");
    assert!(LiveTable::<MetricRow>::create(&p, &Meta::default()).is_err());
}
