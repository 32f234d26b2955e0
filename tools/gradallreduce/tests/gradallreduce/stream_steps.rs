//! gradallreduce reads its trace one step at a time (docs/MEMORY.md): rank 0 hands every rank
//! its rows step by step and writes each step's result as it completes. The rows must be what
//! the whole-trace reading gave: sums computed here (values are small integers, so every
//! summation order gives the same f32), for traces ordered by step, rank-major traces (one
//! step per row group: streamed; several steps per row group: read whole, with a note) and
//! stdin; a problem in a late step ends every rank with one message and leaves no output,
//! in-process and under mpirun.

use std::path::Path;
use std::process::{Command, Stdio};

use gradkit_core::{
    read_table, read_tensor, write_table, Input, Meta, MetricRow, Output, TensorRow,
};

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

/// A fresh directory for one test, removed when the guard drops.
fn tmpdir(name: &str) -> gradkit_testkit::TempDir {
    gradkit_testkit::tempdir(&format!("gradallreduce-stream-{name}-"))
}

/// A reduced row: (step, layer_id, layer, shape, values densified).
type Reduced = (u32, u32, String, Option<Vec<u32>>, Vec<f32>);
/// Per (step, layer_id): the layer's name, shape and running sum.
type Sums = std::collections::BTreeMap<(u32, u32), (String, Option<Vec<u32>>, Vec<f64>)>;

/// Layers (name, shape) of the test model.
const LAYERS: &[(&str, &[u32])] = &[
    ("conv.w", &[4, 3, 5]),
    ("conv.b", &[4]),
    ("fc.w", &[10, 26]),
];

/// A small integer, different for every (step, rank, layer, element).
fn value(step: u32, rank: u32, layer: u32, i: u32) -> f32 {
    ((i * 31 + rank * 17 + step * 7 + layer * 3) % 41) as f32 - 20.0
}

/// A dense trace, rows ordered by step, then rank, then layer; `numel_scale` multiplies
/// every layer's first dimension (large rows make one step per row group).
fn dense_rows(p: u32, steps: u32, numel_scale: u32) -> Vec<TensorRow> {
    let mut rows = Vec::new();
    for step in 0..steps {
        for rank in 0..p {
            for (id, (name, shape)) in LAYERS.iter().enumerate() {
                let mut shape = shape.to_vec();
                shape[0] *= numel_scale;
                let n: u32 = shape.iter().product();
                rows.push(TensorRow {
                    step,
                    rank,
                    layer_id: id as u32,
                    layer: (*name).into(),
                    numel: n as u64,
                    shape: Some(shape),
                    indices: None,
                    values: (0..n).map(|i| value(step, rank, id as u32, i)).collect(),
                });
            }
        }
    }
    rows
}

/// The reduced rows the whole trace gives: per step ascending, per layer ascending, rank 0,
/// the sum over ranks (computed here, in f64, exact for these values).
fn want_sum(rows: &[TensorRow]) -> Vec<Reduced> {
    let mut by = Sums::default();
    for r in rows {
        let e = by.entry((r.step, r.layer_id)).or_insert_with(|| {
            (
                r.layer.clone(),
                r.shape.clone(),
                vec![0.0; r.numel as usize],
            )
        });
        for (a, v) in e.2.iter_mut().zip(r.to_dense()) {
            *a += v as f64;
        }
    }
    by.into_iter()
        .map(|((s, l), (name, shape, v))| {
            (s, l, name, shape, v.into_iter().map(|x| x as f32).collect())
        })
        .collect()
}

fn got(path: &Path) -> Vec<Reduced> {
    let t = read_tensor(&Input::Path(path.to_path_buf()), Default::default()).unwrap();
    t.rows
        .into_iter()
        .map(|r| {
            assert_eq!(r.rank, 0, "the result is written once, as rank 0's");
            let v = r.to_dense();
            (r.step, r.layer_id, r.layer, r.shape, v)
        })
        .collect()
}

fn write(path: &Path, rows: &[TensorRow]) {
    write_table(&Output::Path(path.to_path_buf()), &Meta::default(), rows).unwrap();
}

fn run(args: &[&str], stdin: Option<&Path>) -> (i32, String) {
    let mut c = Command::new(BIN);
    c.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    match stdin {
        Some(p) => c.stdin(std::fs::File::open(p).unwrap()),
        None => c.stdin(Stdio::null()),
    };
    let o = c.output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn every_step_is_reduced_and_written_in_order() {
    let d_dir = tmpdir("order");
    let d = d_dir.path().to_path_buf();
    let rows = dense_rows(3, 5, 1);
    let t = d.join("t.parquet");
    write(&t, &rows);
    let want = want_sum(&rows);
    for algo in ["ring", "tree", "rabenseifner"] {
        let (o, m) = (
            d.join(format!("{algo}.parquet")),
            d.join(format!("{algo}-m.parquet")),
        );
        let (code, err) = run(
            &[
                "--algo",
                algo,
                "--ranks",
                "3",
                "-q",
                s(&t),
                "-o",
                s(&o),
                "--metrics",
                s(&m),
            ],
            None,
        );
        assert_eq!(code, 0, "{algo}: {err}");
        assert_eq!(got(&o), want, "{algo}");
        // Metrics: every rank's rows for every step, in (step, rank) order (they are written
        // as the steps complete, not held until the end).
        let metrics = read_table::<MetricRow>(&Input::Path(m), Default::default()).unwrap();
        let keys: Vec<(u32, u32)> = metrics
            .rows
            .iter()
            .filter(|r| r.metric == "bytes_sent")
            .map(|r| (r.step, r.rank))
            .collect();
        let want_keys: Vec<(u32, u32)> = (0..5).flat_map(|s| (0..3).map(move |r| (s, r))).collect();
        assert_eq!(keys, want_keys, "{algo}");
    }
}

#[test]
fn rank_major_traces_and_stdin_give_the_same_rows() {
    let d_dir = tmpdir("rankmajor");
    let d = d_dir.path().to_path_buf();
    // Small steps: the writer puts several steps in a row group, so a rank-major file is read
    // whole (with a note); large steps (≥ 1 MiB per rank): one step per row group, streamed.
    for (scale, note) in [(1u32, true), (2200, false)] {
        let mut rows = dense_rows(2, 3, scale);
        let want = want_sum(&rows);
        rows.sort_by_key(|r| (r.rank, r.step, r.layer_id));
        let t = d.join(format!("t{scale}.parquet"));
        write(&t, &rows);
        let o = d.join(format!("o{scale}.parquet"));
        let (code, err) = run(
            &["--algo", "ring", "--ranks", "2", s(&t), "-o", s(&o)],
            None,
        );
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            err.contains("is not ordered by step"),
            note,
            "scale {scale}: {err}"
        );
        assert_eq!(got(&o), want, "scale {scale}");
        let o2 = d.join(format!("o{scale}-stdin.parquet"));
        let (code, err) = run(
            &["--algo", "ring", "--ranks", "2", "-q", "-", "-o", s(&o2)],
            Some(&t),
        );
        assert_eq!(code, 0, "{err}");
        assert_eq!(got(&o2), want, "scale {scale}, stdin");
    }
}

#[test]
fn sparse_input_streams_too() {
    let d_dir = tmpdir("sparse");
    let d = d_dir.path().to_path_buf();
    let mut rows = dense_rows(2, 4, 1);
    // Keep every third value of each row: sparse rows with ascending indices.
    for r in &mut rows {
        let (idx, vals): (Vec<u32>, Vec<f32>) = r
            .values
            .iter()
            .enumerate()
            .filter(|(i, _)| (*i as u32 + r.rank + r.step).is_multiple_of(3))
            .map(|(i, v)| (i as u32, *v))
            .unzip();
        r.indices = Some(idx);
        r.values = vals;
    }
    let t = d.join("t.parquet");
    write(&t, &rows);
    let o = d.join("o.parquet");
    let (code, err) = run(
        &["--algo", "topka", "--ranks", "2", "-q", s(&t), "-o", s(&o)],
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(got(&o), want_sum(&rows));
}

/// A trace of 2 ranks and 5 steps whose step 3 lacks rank 1's `conv.b` row.
fn bad_late_step(path: &Path) {
    let mut rows = dense_rows(2, 5, 1);
    rows.retain(|r| !(r.step == 3 && r.rank == 1 && r.layer_id == 1));
    write(path, &rows);
}

/// A trace of 2 ranks and 5 steps with a NaN in step 4 (0.8 MB per rank and step, so the
/// reader meets it after the first steps were reduced).
fn nan_late_step(path: &Path) {
    let mut rows = dense_rows(2, 5, 600);
    let r = rows
        .iter_mut()
        .find(|r| r.step == 4 && r.rank == 0 && r.layer_id == 2)
        .unwrap();
    r.values[7] = f32::NAN;
    write(path, &rows);
}

fn assert_one_error(code: i32, err: &str, needles: &[&str]) {
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.matches("error:").count(), 1, "one message: {err}");
    assert!(err.starts_with("error: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_bad_late_step_ends_the_run_with_one_message_and_no_output() {
    let d_dir = tmpdir("bad");
    let d = d_dir.path().to_path_buf();
    let (bad, nan) = (d.join("bad.parquet"), d.join("nan.parquet"));
    bad_late_step(&bad);
    nan_late_step(&nan);
    let (o, m, st) = (
        d.join("o.parquet"),
        d.join("m.parquet"),
        d.join("state.bin"),
    );
    for (t, needles) in [
        (&bad, &["step 3 rank 1", "bad.parquet"][..]),
        (&nan, &["non-finite", "step 4 rank 0", "nan.parquet"][..]),
    ] {
        for algo in ["ring", "oktopk", "onebit"] {
            let mut args = vec![
                "--algo",
                algo,
                "--ranks",
                "2",
                s(t),
                "-o",
                s(&o),
                "--metrics",
                s(&m),
            ];
            if algo == "onebit" {
                args.extend(["--state", s(&st)]);
            }
            let (code, err) = run(&args, None);
            assert_one_error(code, &err, needles);
            assert!(
                !o.exists() && !m.exists() && !st.exists(),
                "no output after an error"
            );
            // The same from stdin.
            args[4] = "-";
            let (code, err) = run(&args, Some(t));
            assert_one_error(code, &err, &needles[..needles.len() - 1]);
            assert!(
                !o.exists() && !m.exists() && !st.exists(),
                "no output after an error"
            );
        }
    }
    let left = gradkit_testkit::cli::temp_files(&d);
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// `mpirun -np P BIN args…`: exit code and stderr; a run still going after 300 s is killed
/// and the test fails as a hang.
fn mpirun(p: usize, args: &[&str]) -> (Option<i32>, String) {
    gradkit_testkit::mpi::run_quiet(p, BIN, args)
}

#[test]
fn under_mpirun_steps_stream_and_a_bad_late_step_is_reported_once() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let d_dir = tmpdir("mpi");
    let d = d_dir.path().to_path_buf();
    let rows = dense_rows(3, 4, 1);
    let t = d.join("t.parquet");
    write(&t, &rows);
    let want = want_sum(&rows);
    for algo in ["ring", "oktopk"] {
        let o = d.join(format!("{algo}.parquet"));
        let (code, err) = mpirun(3, &["--algo", algo, "-q", s(&t), "-o", s(&o)]);
        assert_eq!(code, Some(0), "{err}");
        if algo == "ring" {
            assert_eq!(got(&o), want);
        } else {
            // The same rows as in-process ranks give.
            let o2 = d.join("oktopk-local.parquet");
            let (code, err) = run(
                &["--algo", algo, "--ranks", "3", "-q", s(&t), "-o", s(&o2)],
                None,
            );
            assert_eq!(code, 0, "{err}");
            assert_eq!(got(&o), got(&o2));
        }
    }
    let (bad, nan) = (d.join("bad.parquet"), d.join("nan.parquet"));
    bad_late_step(&bad);
    nan_late_step(&nan);
    let (o, m) = (d.join("o.parquet"), d.join("m.parquet"));
    for (t, needle) in [(&bad, "step 3 rank 1"), (&nan, "step 4 rank 0")] {
        for algo in ["ring", "oktopk"] {
            let (code, err) = mpirun(2, &["--algo", algo, s(t), "-o", s(&o), "--metrics", s(&m)]);
            assert_eq!(code, Some(1), "{err}");
            assert_eq!(err.matches("error:").count(), 1, "one message: {err}");
            assert!(err.contains(needle), "`{needle}` missing from: {err}");
            assert!(
                !err.contains("MPI_ABORT"),
                "ended by agreement, not abort: {err}"
            );
            assert!(!o.exists() && !m.exists(), "no output after an error");
        }
    }
}
