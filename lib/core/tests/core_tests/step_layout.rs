//! `TensorStream::step_layout`: the layers of one step read from the key columns alone (what
//! gradselect needs before it reads the first step rank by rank, docs/MEMORY.md). Checked
//! against the layout built by hand from the step's rows read whole (`read_tensor`): each
//! layer's name and `numel` from its first row in file order, its first non-null shape, the
//! offsets in `layer_id` order; for a trace in one row group, one with a row group per step,
//! and one with ranks and layers interleaved.

use std::collections::BTreeMap;

use gradkit_core::io::TensorStream;
use gradkit_core::{read_tensor, write_table, Input, Meta, Output, TensorRow};

fn row(step: u32, rank: u32, layer_id: u32, n: usize, shape: Option<Vec<u32>>) -> TensorRow {
    TensorRow {
        step,
        rank,
        layer_id,
        layer: format!("layer{layer_id}"),
        numel: n as u64,
        shape,
        indices: None,
        values: (0..n).map(|i| (i as u32 + step + rank) as f32).collect(),
    }
}

/// (layer_id, name, numel, shape, offset) of `step`, from the rows read whole.
type Expected = Vec<(u32, String, u64, Option<Vec<u32>>, u64)>;

fn expected(rows: &[TensorRow], step: u32) -> Expected {
    let mut by_id: BTreeMap<u32, (String, u64, Option<Vec<u32>>)> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.step == step) {
        let e = by_id
            .entry(r.layer_id)
            .or_insert((r.layer.clone(), r.numel, None));
        if e.2.is_none() {
            e.2 = r.shape.clone();
        }
    }
    let mut offset = 0;
    by_id
        .into_iter()
        .map(|(id, (name, numel, shape))| {
            let at = offset;
            offset += numel;
            (id, name, numel, shape, at)
        })
        .collect()
}

fn check(rows: &[TensorRow]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    write_table(&Output::Path(path.clone()), &Meta::default(), rows).unwrap();
    let input = Input::Path(path);
    let whole = read_tensor(&input, Default::default()).unwrap().rows;
    let stream = TensorStream::open(&input, Default::default()).unwrap();
    let scan = stream.scan().unwrap();
    for &step in &scan.steps {
        let got = stream.step_layout(&scan, step).unwrap();
        let got: Expected = got
            .layers
            .iter()
            .map(|l| {
                (
                    l.layer_id,
                    l.name.clone(),
                    l.numel,
                    l.shape.clone(),
                    l.offset,
                )
            })
            .collect();
        assert_eq!(got, expected(&whole, step), "step {step}");
    }
}

#[test]
fn layers_of_each_step_ordered_by_rank() {
    let mut rows = Vec::new();
    for step in [3, 5] {
        for rank in 0..2 {
            // Layer 2's shape is given by rank 1 only: the first non-null one counts.
            let shape2 = (rank == 1).then(|| vec![2, 3]);
            rows.push(row(step, rank, 2, 6, shape2));
            rows.push(row(step, rank, 0, 4, Some(vec![4])));
            rows.push(row(step, rank, 7, 5, None));
            if step == 5 {
                // A layer of the later step only, in the same row group.
                rows.push(row(step, rank, 11, 2, None));
            }
        }
    }
    check(&rows);
}

#[test]
fn layers_of_a_step_in_its_own_row_groups() {
    // Steps of more than 1 MiB: the writer starts a row group where the step changes, so
    // each step is read from its own row group; the steps have different layers.
    let big = 300_000;
    let mut rows = Vec::new();
    for rank in 0..2 {
        rows.push(row(0, rank, 1, big, None));
        rows.push(row(0, rank, 4, 3, None));
    }
    for rank in 0..2 {
        rows.push(row(1, rank, 1, big, None));
        rows.push(row(1, rank, 9, 2, Some(vec![1, 2])));
    }
    check(&rows);
}

#[test]
fn layers_with_ranks_interleaved() {
    let mut rows = Vec::new();
    for step in 0..2 {
        for layer in [5, 1, 3] {
            for rank in [1, 0, 2] {
                rows.push(row(step, rank, layer, 1 + layer as usize, None));
            }
        }
    }
    check(&rows);
}
