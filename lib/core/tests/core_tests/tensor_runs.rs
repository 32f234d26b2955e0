//! `TensorSteps::next_run` (rank 0's reading under mpirun, docs/MEMORY.md): the runs are the
//! file's rows in order, cut where `(step, rank)` changes or once a run holds `max_bytes`,
//! and `peek_step` names the next run's step. Checked against the rows read whole
//! (`read_tensor`), for a trace grouped by rank, one with ranks interleaved, and one not
//! ordered by step (read whole, then handed out by step).

use gradkit_core::io::read_tensor_steps;
use gradkit_core::{read_tensor, write_table, Input, Meta, Output, TensorRow};

fn row(step: u32, rank: u32, layer_id: u32, n: usize) -> TensorRow {
    TensorRow {
        step,
        rank,
        layer_id,
        layer: format!("l{layer_id}"),
        numel: n as u64,
        shape: None,
        indices: None,
        values: (0..n)
            .map(|i| (i as u32 + step * 7 + rank * 3 + layer_id) as f32)
            .collect(),
    }
}

fn key(r: &TensorRow) -> (u32, u32, u32, Vec<f32>) {
    (r.step, r.rank, r.layer_id, r.values.clone())
}

/// Every run of `rows` (written to a file) with `max_bytes`, checked against the file read
/// whole; the rows in step order (a stable sort of the file's rows by step).
fn check(rows: &[TensorRow], max_bytes: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    write_table(&Output::Path(path.clone()), &Meta::default(), rows).unwrap();
    let input = Input::Path(path);
    let mut whole = read_tensor(&input, Default::default()).unwrap().rows;
    whole.sort_by_key(|r| r.step);
    let mut steps = read_tensor_steps(&input, Default::default()).unwrap();
    let mut got: Vec<TensorRow> = Vec::new();
    let mut prev: Option<(u32, u32, usize)> = None;
    loop {
        let peek = steps.peek_step().unwrap();
        let Some(run) = steps.next_run(max_bytes).unwrap() else {
            assert_eq!(peek, None);
            break;
        };
        assert!(!run.is_empty());
        let (s, r) = (run[0].step, run[0].rank);
        assert_eq!(peek, Some(s));
        assert!(
            run.iter().all(|x| (x.step, x.rank) == (s, r)),
            "one (step, rank)"
        );
        // Every row but the last was taken below the limit.
        let bytes: Vec<usize> = run.iter().map(|x| 4 * x.values.len()).collect();
        let before_last: usize = bytes[..bytes.len() - 1].iter().sum();
        assert!(before_last < max_bytes, "cut at {max_bytes} bytes");
        // A run ends where (step, rank) changes, or at the limit.
        if let Some((ps, pr, pb)) = prev {
            assert!((ps, pr) != (s, r) || pb >= max_bytes, "maximal runs");
        }
        prev = Some((s, r, bytes.iter().sum()));
        got.extend(run);
    }
    let got: Vec<_> = got.iter().map(key).collect();
    let want: Vec<_> = whole.iter().map(key).collect();
    assert_eq!(got, want);
}

#[test]
fn runs_are_the_rows_cut_by_step_rank_and_size() {
    let mut grouped = Vec::new();
    for step in 0..3 {
        for rank in 0..3 {
            for layer in 0..4 {
                grouped.push(row(step, rank, layer, 10 + 40 * layer as usize));
            }
        }
    }
    let mut interleaved = grouped.clone();
    interleaved.sort_by_key(|r| (r.step, r.layer_id, r.rank));
    // Steps out of order within row groups: read whole, handed out by step.
    let mut unordered = grouped.clone();
    unordered.sort_by_key(|r| (r.rank, r.step, r.layer_id));
    for rows in [&grouped, &interleaved, &unordered] {
        for max in [1, 200, 500, usize::MAX] {
            check(rows, max);
        }
    }
}
