//! Unit tests of write.rs (a file of their own: write.rs stays under 1,000 lines).

use super::*;
use crate::tables::TensorRow;
use parquet::arrow::ArrowWriter;
use parquet::file::reader::{FileReader, SerializedFileReader};
use std::fs::File;

fn row(step: u32, id: u32, n: usize, sparse: bool, shape: bool) -> TensorRow {
    let values: Vec<f32> = (0..n)
        .map(|i| (i as f32 - 7.5) * (step + 1) as f32)
        .collect();
    TensorRow {
        step,
        rank: 0,
        layer_id: id,
        layer: format!("l{id}"),
        numel: if sparse { 10 * n as u64 + 1 } else { n as u64 },
        shape: shape.then(|| vec![if sparse { 10 * n as u32 + 1 } else { n as u32 }]),
        indices: sparse.then(|| (0..n as u32).map(|i| 10 * i + 1).collect()),
        values,
    }
}

#[test]
fn long_lists_and_many_row_groups_read_back_unchanged() {
    // Rows longer than one low-level write (LEVEL_CHUNK levels), empty sparse rows, rows
    // without shape, and row groups of ~3 MiB so that several are encoded in parallel.
    let n_long = LEVEL_CHUNK + LEVEL_CHUNK / 2;
    let mut rows = Vec::new();
    for step in 0..6 {
        rows.push(row(step, 0, n_long, false, step % 2 == 0));
        rows.push(row(step, 1, 0, true, true));
        rows.push(row(step, 2, 3, true, step % 3 != 0));
        for k in 0..50 {
            rows.push(row(
                step,
                3 + k,
                (k as usize * 37) % 200,
                k % 2 == 0,
                k % 5 != 0,
            ));
        }
    }
    let dir = std::env::temp_dir().join(format!("gradkit-io-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("long.parquet");
    let mut w =
        TableWriter::<TensorRow>::create(&Output::Path(p.clone()), &Meta::default()).unwrap();
    w.row_group_bytes = 3 << 20;
    for chunk in rows.chunks(20) {
        w.write(chunk).unwrap();
    }
    w.finish().unwrap();
    let reader = SerializedFileReader::new(File::open(&p).unwrap()).unwrap();
    let groups = reader.metadata().num_row_groups();
    assert!(groups >= 6, "expected several row groups, got {groups}");
    let total: i64 = reader
        .metadata()
        .row_groups()
        .iter()
        .map(|g| g.num_rows())
        .sum();
    assert_eq!(total as usize, rows.len());
    let back = read_tensor(&Input::Path(p.clone()), ReadOptions::default()).unwrap();
    assert_eq!(back.rows, rows);
    // The consuming path writes the same rows, big ones without a copy.
    let mut w =
        TableWriter::<TensorRow>::create(&Output::Path(p.clone()), &Meta::default()).unwrap();
    w.row_group_bytes = 3 << 20;
    for chunk in rows.chunks(20) {
        w.write_owned(chunk.to_vec()).unwrap();
    }
    w.finish().unwrap();
    let back = read_tensor(&Input::Path(p.clone()), ReadOptions::default()).unwrap();
    assert_eq!(back.rows, rows);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A small dense trace: `steps` × `ranks` × 3 layers, values from (step, rank, layer, i).
fn trace(steps: u32, ranks: u32) -> Vec<TensorRow> {
    let mut rows = Vec::new();
    for step in 0..steps {
        for rank in 0..ranks {
            for (id, n) in [(0u32, 5usize), (1, 300), (2, 2)] {
                let values = (0..n)
                    .map(|i| (step * 1000 + rank * 100 + id * 10) as f32 + i as f32 * 0.5)
                    .collect();
                rows.push(TensorRow {
                    step,
                    rank,
                    layer_id: id,
                    layer: format!("l{id}"),
                    numel: n as u64,
                    shape: (id != 1 || step > 0).then(|| vec![n as u32]),
                    indices: None,
                    values,
                });
            }
        }
    }
    rows
}

/// The reference: every row of the file (the whole-trace reader), grouped by step in file
/// order, steps ascending.
fn by_step_reference(p: &Path) -> Vec<(u32, Vec<TensorRow>)> {
    let all = read_tensor(&Input::Path(p.to_path_buf()), ReadOptions::default()).unwrap();
    let mut m: BTreeMap<u32, Vec<TensorRow>> = BTreeMap::new();
    for r in all.rows {
        m.entry(r.step).or_default().push(r);
    }
    m.into_iter().collect()
}

fn write_rows(p: &Path, rows: &[TensorRow], group_bytes: usize, chunk: usize) {
    let mut w =
        TableWriter::<TensorRow>::create(&Output::Path(p.to_path_buf()), &Meta::default()).unwrap();
    w.row_group_bytes = group_bytes;
    w.step_group_bytes = 0;
    for c in rows.chunks(chunk) {
        w.write(c).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn steps_stream_ordered_and_unordered_traces_as_the_whole_reader_groups_them() {
    let dir = tempfile::tempdir().unwrap();
    let rows = trace(5, 3);
    // Ordered by step, written in chunks that straddle steps.
    let ordered = dir.path().join("ordered.parquet");
    write_rows(&ordered, &rows, 64 << 20, 7);
    let s = TensorStream::open(&Input::Path(ordered.clone()), ReadOptions::default()).unwrap();
    let scan = s.scan().unwrap();
    assert_eq!(scan.steps, vec![0, 1, 2, 3, 4]);
    assert_eq!(scan.ranks, vec![0, 1, 2]);
    assert_eq!(scan.rows, rows.len() as u64);
    assert_eq!(scan.disorder, None);
    // Layer 1 has no shape at step 0: the first shape given, from step 1.
    assert_eq!(scan.shapes.get(&1), Some(&vec![300]));
    let got: Vec<_> = s.steps(&scan).unwrap().map(|x| x.unwrap()).collect();
    assert_eq!(got, by_step_reference(&ordered));
    // Rank-major (each rank's steps in turn): not ordered by step, but each row group holds
    // one step (the writer cuts there), so it is streamed row group by row group.
    let mut rm = rows.clone();
    rm.sort_by_key(|r| (r.rank, r.step));
    let unordered = dir.path().join("rank-major.parquet");
    write_rows(&unordered, &rm, 64 << 20, 1000);
    let s = TensorStream::open(&Input::Path(unordered.clone()), ReadOptions::default()).unwrap();
    let scan = s.scan().unwrap();
    // Rank 1's step 0 is row 5 steps × 3 layers = 15, after rank 0's step 4.
    assert_eq!(scan.disorder, Some((0, 15, 4)));
    assert!(scan
        .group_steps
        .iter()
        .all(|g| matches!(g, Some((a, b)) if a == b)));
    let st = s.steps(&scan).unwrap();
    assert!(st.streamed);
    let got: Vec<_> = st.map(|x| x.unwrap()).collect();
    assert_eq!(got, by_step_reference(&unordered));
    let mut want = by_step_reference(&ordered);
    for (_, v) in &mut want {
        v.sort_by_key(|r| (r.rank, r.layer_id));
    }
    assert_eq!(got, want);
    // The same rows in one row group, as other writers make it: read whole, same steps.
    let mixed = dir.path().join("mixed.parquet");
    let schema = std::sync::Arc::new(TensorRow::schema().as_ref().clone().with_metadata(
        std::collections::HashMap::from([("gradkit.schema".to_string(), "tensor/1".to_string())]),
    ));
    let mut w = ArrowWriter::try_new(File::create(&mixed).unwrap(), schema.clone(), None).unwrap();
    let b = TensorRow::to_batch(&rm).unwrap();
    w.write(&b.with_schema(schema).unwrap()).unwrap();
    w.close().unwrap();
    let s = TensorStream::open(&Input::Path(mixed.clone()), ReadOptions::default()).unwrap();
    let scan = s.scan().unwrap();
    assert_eq!(scan.disorder, Some((0, 15, 4)));
    assert_eq!(scan.group_steps, vec![Some((0, 4))]);
    let st = s.steps(&scan).unwrap();
    assert!(!st.streamed);
    let got: Vec<_> = st.map(|x| x.unwrap()).collect();
    assert_eq!(got, by_step_reference(&mixed));
    assert_eq!(got, want);
}

#[test]
fn chunks_validate_every_row_and_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows = trace(4, 2);
    // A NaN in the last step, and a layer that changes its numel after that: the first
    // failing row in file order is the one reported.
    let bad = rows.len() - 2;
    rows[bad].values[1] = f32::NAN;
    let p = dir.path().join("nan.parquet");
    write_rows(&p, &rows, 64 << 20, 5);
    let whole = read_tensor(&Input::Path(p.clone()), ReadOptions::default())
        .unwrap_err()
        .to_string();
    let mut steps = read_tensor_steps(&Input::Path(p.clone()), ReadOptions::default()).unwrap();
    let mut err = None;
    for s in &mut steps {
        if let Err(e) = s {
            err = Some(e);
            break;
        }
    }
    let e = format!("{:#}", err.expect("the NaN is reported"));
    assert!(e.starts_with(&format!("in {}", p.display())), "{e}");
    assert!(
        e.contains("non-finite value NaN at position 1 (step 3 rank 1 layer `l1`)"),
        "{e}"
    );
    assert!(whole.starts_with("in "), "{whole}");
    // Accepted with allow_nonfinite: every row comes back.
    let opts = ReadOptions {
        allow_nonfinite: true,
    };
    let n: usize = TensorStream::open(&Input::Path(p.clone()), opts)
        .unwrap()
        .chunks()
        .map(|c| c.unwrap().len())
        .sum();
    assert_eq!(n, rows.len());
}

#[test]
fn a_row_group_never_holds_two_steps() {
    let dir = tempfile::tempdir().unwrap();
    let rows = trace(6, 2);
    let p = dir.path().join("groups.parquet");
    // One write call holding every step: the writer still cuts at each step.
    write_rows(&p, &rows, 64 << 20, rows.len());
    let reader = SerializedFileReader::new(File::open(&p).unwrap()).unwrap();
    let mut steps_of_groups = Vec::new();
    for g in reader.metadata().row_groups() {
        let st = g.column(0).statistics().expect("step statistics");
        let (lo, hi) = match st {
            parquet::file::statistics::Statistics::Int32(s) => {
                (*s.min_opt().unwrap(), *s.max_opt().unwrap())
            }
            other => panic!("step stored as {other:?}"),
        };
        assert_eq!(lo, hi, "a row group holds steps {lo}..{hi}");
        steps_of_groups.push(lo);
    }
    assert_eq!(steps_of_groups, vec![0, 1, 2, 3, 4, 5]);
    let back = read_tensor(&Input::Path(p.clone()), ReadOptions::default()).unwrap();
    assert_eq!(back.rows, rows);
    // With the default threshold, these small steps (2 × 307 values) share a row group.
    let mut w =
        TableWriter::<TensorRow>::create(&Output::Path(p.clone()), &Meta::default()).unwrap();
    w.write(&rows).unwrap();
    w.finish().unwrap();
    let reader = SerializedFileReader::new(File::open(&p).unwrap()).unwrap();
    assert_eq!(reader.metadata().num_row_groups(), 1);
}
