//! gradselect reads its trace one step at a time (docs/MEMORY.md). Whatever the input path —
//! a file ordered by step (streamed), stdin, a rank-major file (each rank's steps in turn; its
//! steps are small, so they share a row group and the file is read whole, with a note) — the
//! selection is the one a brute-force top-k with error feedback, written here, gives; and a
//! problem in a late step stops the run with no output file left behind. (A rank-major file
//! with one step per row group streams: gradkit-core's `io` tests.)

use std::path::Path;

use gradkit_core::{read_tensor, Input, TensorRow};
use gradkit_testkit::plans::write_trace;
use gradkit_testkit::traces::dense;

const BIN: &str = env!("CARGO_BIN_EXE_gradselect");
const LAYERS: [(&str, u64); 3] = [("a", 40), ("b", 25), ("c", 7)];

/// Runs gradselect with `stdin` piped in (or none): exit code, stderr.
fn gradselect(args: &[&str], stdin: Option<&Path>) -> (i32, String) {
    let (code, _, err) = gradkit_testkit::cli::run_with_stdin(BIN, args, stdin);
    (code, err)
}

/// The expected output: for every step ascending and rank ascending, acc = residual + g, the k
/// entries of largest |acc| (ties to the lower index) kept, residual = acc with them zeroed;
/// one sparse row per layer. Also the final residuals.
fn brute_force(
    trace: &[TensorRow],
    p: u32,
    steps: u32,
    k: usize,
) -> (Vec<TensorRow>, Vec<Vec<f32>>) {
    let n: usize = LAYERS.iter().map(|l| l.1 as usize).sum();
    let mut residual = vec![vec![0f32; n]; p as usize];
    let mut out = Vec::new();
    for step in 0..steps {
        for rank in 0..p {
            let mut acc = Vec::new();
            for id in 0..LAYERS.len() as u32 {
                let r = trace
                    .iter()
                    .find(|r| r.step == step && r.rank == rank && r.layer_id == id)
                    .unwrap();
                acc.extend_from_slice(&r.values);
            }
            for (a, r) in acc.iter_mut().zip(&residual[rank as usize]) {
                *a += *r;
            }
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&i, &j| acc[j].abs().total_cmp(&acc[i].abs()).then(i.cmp(&j)));
            let mut kept: Vec<usize> = order[..k].to_vec();
            kept.sort_unstable();
            let mut off = 0usize;
            for (id, (name, numel)) in LAYERS.iter().enumerate() {
                let numel = *numel as usize;
                let mine: Vec<usize> = kept
                    .iter()
                    .copied()
                    .filter(|&i| i >= off && i < off + numel)
                    .collect();
                out.push(TensorRow {
                    step,
                    rank,
                    layer_id: id as u32,
                    layer: name.to_string(),
                    numel: numel as u64,
                    shape: Some(vec![numel as u32]),
                    indices: Some(mine.iter().map(|&i| (i - off) as u32).collect()),
                    values: mine.iter().map(|&i| acc[i]).collect(),
                });
                off += numel;
            }
            for &i in &kept {
                acc[i] = 0.0;
            }
            residual[rank as usize] = acc;
        }
    }
    (out, residual)
}

#[test]
fn every_input_path_selects_what_brute_force_top_k_selects() {
    let dir = tempfile::tempdir().unwrap();
    let (p, steps) = (3u32, 6u32);
    let trace = dense(p, steps, &LAYERS);
    let ordered = dir.path().join("ordered.parquet");
    write_trace(&ordered, &trace);
    // Rank-major: each rank's steps in turn, so step 0 comes again after step 5.
    let mut rm = trace.clone();
    rm.sort_by_key(|r| (r.rank, r.step, std::cmp::Reverse(r.layer_id)));
    let rank_major = dir.path().join("rank-major.parquet");
    write_trace(&rank_major, &rm);
    // Ordered by step, but within a step the ranks interleaved layer by layer, or in reverse:
    // read rank by rank, a rank is selected once its rows are complete, ranks in order.
    let mut il = trace.clone();
    il.sort_by_key(|r| (r.step, r.layer_id, r.rank));
    let interleaved = dir.path().join("interleaved.parquet");
    write_trace(&interleaved, &il);
    let mut rev = trace.clone();
    rev.sort_by_key(|r| (r.step, std::cmp::Reverse(r.rank), r.layer_id));
    let reversed = dir.path().join("reversed.parquet");
    write_trace(&reversed, &rev);
    // k = floor(0.1 · 72) = 7 of the whole model.
    let (want, want_res) = brute_force(&trace, p, steps, 7);
    for (name, input, stdin) in [
        ("interleaved ranks", interleaved.to_str().unwrap(), None),
        ("reversed ranks", reversed.to_str().unwrap(), None),
        ("ordered file", ordered.to_str().unwrap(), None),
        ("stdin", "-", Some(ordered.as_path())),
        ("rank-major file", rank_major.to_str().unwrap(), None),
        ("rank-major stdin", "-", Some(rank_major.as_path())),
    ] {
        let out = dir.path().join("sel.parquet");
        let res = dir.path().join("res.parquet");
        let (code, err) = gradselect(
            &[
                "--method",
                "topk",
                "--density",
                "0.1",
                "-q",
                input,
                "-o",
                out.to_str().unwrap(),
                "--residual-out",
                res.to_str().unwrap(),
            ],
            stdin,
        );
        assert_eq!(code, 0, "{name}: {err}");
        if name.starts_with("rank-major") {
            // Steps this small share a row group, so the file is read whole, with a note.
            assert!(
                err.contains("is not ordered by step (step 0 at row 18 comes after step 5)"),
                "{name}: {err}"
            );
        } else {
            assert!(err.is_empty(), "{name}: {err}");
        }
        let got = read_tensor(&Input::Path(out.clone()), Default::default()).unwrap();
        assert_eq!(got.rows, want, "{name}");
        let res = read_tensor(&Input::Path(res.clone()), Default::default()).unwrap();
        let flat: Vec<Vec<f32>> = (0..p)
            .map(|r| {
                res.rows
                    .iter()
                    .filter(|x| x.rank == r && x.step == steps - 1)
                    .flat_map(|x| x.values.clone())
                    .collect()
            })
            .collect();
        assert_eq!(flat, want_res, "{name}: final residuals");
    }
}

#[test]
fn a_problem_in_a_late_step_stops_the_run_and_leaves_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dense(2, 5, &LAYERS);
    // Step 3 lacks rank 1 (its last rank): only a check of every step finds it.
    let missing: Vec<TensorRow> = trace
        .iter()
        .filter(|r| !(r.step == 3 && r.rank == 1))
        .cloned()
        .collect();
    // Step 4 holds a NaN.
    let mut nan = trace.clone();
    let i = nan
        .iter()
        .position(|r| r.step == 4 && r.layer_id == 1)
        .unwrap();
    nan[i].values[3] = f32::NAN;
    for (name, rows, want) in [
        (
            "missing",
            missing,
            "step 3: only 1 of 2 ranks have rows (a rank is missing this step)",
        ),
        (
            "nan",
            nan,
            "column `values`: non-finite value NaN at position 3 (step 4 rank 0 layer `b`)",
        ),
    ] {
        let t = dir.path().join(format!("{name}.parquet"));
        write_trace(&t, &rows);
        let out = dir.path().join(format!("{name}-sel.parquet"));
        let m = dir.path().join(format!("{name}-m.parquet"));
        let (code, err) = gradselect(
            &[
                "--method",
                "topk",
                "--density",
                "0.1",
                t.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
                "--metrics",
                m.to_str().unwrap(),
            ],
            None,
        );
        assert_eq!(code, 1, "{name}: {err}");
        assert!(err.contains(want), "{name}: {err}");
        assert!(
            err.contains(t.to_str().unwrap()),
            "{name} names the file: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: one line: {err}");
        assert!(!out.exists() && !m.exists(), "{name}: no output left");
        let left = gradkit_testkit::cli::temp_files(dir.path());
        assert!(left.is_empty(), "{name}: temporary files left: {left:?}");
    }
}
