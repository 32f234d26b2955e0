//! `gradtrace inspect` and `gradtrace cat` stream their input (docs/MEMORY.md): inspect's
//! totals, from a file, from stdin and from a file not ordered by step, are the counts a
//! brute-force pass written here finds; cat writes the same rows with one step per row group.

use std::fs::File;
use std::path::Path;

use gradkit_core::io::{write_table, Meta, Output};
use gradkit_core::{read_tensor, Input, TensorRow};
use parquet::file::reader::{FileReader, SerializedFileReader};

const BIN: &str = env!("CARGO_BIN_EXE_gradtrace");
const BIG: u64 = 100_000;

/// 4 steps × 3 ranks × 3 layers; layer 1 is sparse at odd steps, with a zero kept; layer 2 is
/// big enough (3 × 400 KB per step) that gradkit's writer gives each step its own row group.
fn trace() -> Vec<TensorRow> {
    let mut rows = Vec::new();
    for step in 0..4u32 {
        for rank in 0..3u32 {
            let v = |i: u32| ((step * 31 + rank * 7 + i * 3) % 11) as f32 - 5.0;
            rows.push(TensorRow {
                step,
                rank,
                layer_id: 0,
                layer: "w".into(),
                numel: 6,
                shape: Some(vec![2, 3]),
                indices: None,
                values: (0..6).map(v).collect(),
            });
            let sparse = step % 2 == 1;
            rows.push(TensorRow {
                step,
                rank,
                layer_id: 1,
                layer: "b".into(),
                numel: 9,
                shape: None,
                indices: sparse.then(|| vec![1, 4, 8]),
                values: if sparse {
                    vec![0.0, v(2), v(5)]
                } else {
                    (0..9).map(v).collect()
                },
            });
            rows.push(TensorRow {
                step,
                rank,
                layer_id: 2,
                layer: "big".into(),
                numel: BIG,
                shape: None,
                indices: None,
                values: (0..BIG as u32).map(v).collect(),
            });
        }
    }
    rows
}

fn gradtrace(args: &[&str], stdin: Option<&Path>) -> (i32, String, String) {
    gradkit_testkit::cli::run_with_stdin(BIN, args, stdin)
}

#[test]
fn inspect_totals_match_a_brute_force_count_on_every_input_path() {
    let dir = tempfile::tempdir().unwrap();
    let rows = trace();
    let ordered = dir.path().join("t.parquet");
    write_table::<TensorRow>(&Output::Path(ordered.clone()), &Meta::default(), &rows).unwrap();
    let mut rev = rows.clone();
    rev.reverse();
    let reversed = dir.path().join("rev.parquet");
    write_table::<TensorRow>(&Output::Path(reversed.clone()), &Meta::default(), &rev).unwrap();
    // The reference: per layer_id, rows, distinct steps, distinct ranks, non-zeros.
    let mut want = Vec::new();
    for id in 0..3u32 {
        let of: Vec<&TensorRow> = rows.iter().filter(|r| r.layer_id == id).collect();
        let mut steps: Vec<u32> = of.iter().map(|r| r.step).collect();
        steps.sort_unstable();
        steps.dedup();
        let mut ranks: Vec<u32> = of.iter().map(|r| r.rank).collect();
        ranks.sort_unstable();
        ranks.dedup();
        let nnz: usize = of
            .iter()
            .map(|r| r.values.iter().filter(|v| **v != 0.0).count())
            .sum();
        want.push(format!(
            "{id},{},{},{},{},{},{nnz}",
            of[0].layer,
            of[0].numel,
            of.len(),
            steps.len(),
            ranks.len()
        ));
    }
    for (name, input, stdin) in [
        ("file", ordered.to_str().unwrap(), None),
        ("stdin", "-", Some(ordered.as_path())),
        ("reversed file", reversed.to_str().unwrap(), None),
    ] {
        let (code, out, err) = gradtrace(&["inspect", input, "--format", "csv"], stdin);
        assert_eq!(code, 0, "{name}: {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "layer_id,layer,shape,numel,rows,steps,ranks,nnz,density,l2_norm,min,max"
        );
        let got: Vec<String> = lines[1..]
            .iter()
            .map(|l| {
                let c: Vec<&str> = l.split(',').collect();
                // Leave out shape (column 2) and the floats after nnz.
                [c[0], c[1], c[3], c[4], c[5], c[6], c[7]].join(",")
            })
            .collect();
        assert_eq!(got, want, "{name}");
        // The Markdown header counts rows, steps and ranks over the whole input.
        let (code, out, err) = gradtrace(&["inspect", input], stdin);
        assert_eq!(code, 0, "{name}: {err}");
        assert!(
            out.contains(": 36 rows (dense and sparse), 4 steps (0..3), 3 ranks (0..2), 3 layers, 100015 elements per step and rank"),
            "{name}: {out}"
        );
    }
}

#[test]
fn cat_streams_the_same_rows_with_one_step_per_row_group() {
    let dir = tempfile::tempdir().unwrap();
    let rows = trace();
    // Two inputs, steps 0–1 and 2–3, the second from stdin.
    let (a, b) = (dir.path().join("a.parquet"), dir.path().join("b.parquet"));
    write_table::<TensorRow>(&Output::Path(a.clone()), &Meta::default(), &rows[..18]).unwrap();
    write_table::<TensorRow>(&Output::Path(b.clone()), &Meta::default(), &rows[18..]).unwrap();
    let out = dir.path().join("all.parquet");
    let (code, _, err) = gradtrace(
        &["cat", a.to_str().unwrap(), "-", "-o", out.to_str().unwrap()],
        Some(&b),
    );
    assert_eq!(code, 0, "{err}");
    let back = read_tensor(&Input::Path(out.clone()), Default::default()).unwrap();
    assert_eq!(back.rows, rows);
    assert_eq!(back.meta.get("world_size"), Some("3"));
    let reader = SerializedFileReader::new(File::open(&out).unwrap()).unwrap();
    let mut groups = Vec::new();
    for g in reader.metadata().row_groups() {
        match g.column(0).statistics() {
            Some(parquet::file::statistics::Statistics::Int32(s)) => {
                groups.push((*s.min_opt().unwrap(), *s.max_opt().unwrap()))
            }
            other => panic!("step statistics: {other:?}"),
        }
    }
    assert_eq!(groups, vec![(0, 0), (1, 1), (2, 2), (3, 3)]);
}
