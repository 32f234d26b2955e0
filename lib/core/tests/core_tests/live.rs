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

/// Issue 41: a live metrics file (and its checkpoint copies) carries the checksums of its
/// column chunks, the closed row groups' and the open one's, in every footer it writes: 4 bytes
/// flipped anywhere inside its chunks are refused by the reader with one line naming the row
/// group; the intact file reads as appended, and so does a copy (`copy_to`).
#[test]
fn live_files_and_their_copies_are_checksummed() {
    use parquet::file::reader::FileReader;
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.parquet");
    let mut t = LiveTable::<MetricRow>::create(&p, &Meta::default()).unwrap();
    let mut want = Vec::new();
    for s in 0..700 {
        // 4,200 rows: one closed row group (4096) and an open one.
        let rows = step_rows(s);
        t.append(&rows).unwrap();
        want.extend(rows);
    }
    let copy = d.path().join("copy.parquet");
    t.copy_to(&copy).unwrap();
    assert_eq!(read(&p).0, want);
    assert_eq!(read(&copy).0, want);
    let f = std::fs::File::open(&p).unwrap();
    let r = parquet::file::serialized_reader::SerializedFileReader::new(f).unwrap();
    let md = r.metadata();
    assert_eq!(md.num_row_groups(), 2);
    let kv = md.file_metadata().key_value_metadata().unwrap();
    assert!(kv.iter().any(|e| e.key == "gradkit.crc32"));
    let bytes = std::fs::read(&p).unwrap();
    for g in 0..md.num_row_groups() {
        for c in 0..md.row_group(g).num_columns() {
            let (s, l) = md.row_group(g).column(c).byte_range();
            let at = (s + l / 2) as usize;
            let mut bad = bytes.clone();
            for b in &mut bad[at..at + 4.min(l as usize)] {
                *b ^= 0x24;
            }
            let q = d.path().join(format!("bad-{g}-{c}.parquet"));
            std::fs::write(&q, &bad).unwrap();
            let err = read_table::<MetricRow>(&Input::Path(q.clone()), ReadOptions::default())
                .map(|_| ())
                .map_err(|e| format!("{e:#}"))
                .expect_err(&format!("row group {g} column {c} damaged, read"));
            assert!(err.contains(&format!("row group {g} of 2")), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }
}
