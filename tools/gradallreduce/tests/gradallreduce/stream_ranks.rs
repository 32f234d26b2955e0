//! Under mpirun rank 0 reads each step one rank's rows at a time and sends them in pieces
//! before reading on (docs/MEMORY.md); in-process ranks get the step's rows at once.
//! The result must not depend on how a step's rows are ordered in the file: grouped by rank
//! (gradkit's order), ranks interleaved layer by layer, or a rank appearing twice in a step
//! all give the sum computed here (in f64: exact, the values are small integers). A rank whose
//! rows are wrong in the middle of a step (after rank 0 sent the earlier ranks their rows)
//! ends every rank with the message the whole-trace check (`trace::check_complete`) gives,
//! exit 1 and no output, without a hang.

use std::path::Path;
use std::process::{Command, Stdio};

use gradkit_core::trace::{check_complete, Layout};
use gradkit_core::{read_tensor, write_table, Input, Meta, Output, TensorRow};

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

/// A fresh directory for one test, removed when the guard drops.
fn tmpdir(name: &str) -> gradkit_testkit::TempDir {
    gradkit_testkit::tempdir(&format!("gradallreduce-ranks-{name}-"))
}

/// Layers (name, numel): one of 2.4 MB, more than one piece rank 0 sends at a time (2 MiB),
/// and small ones.
const LAYERS: &[(&str, u32)] = &[("emb", 600_000), ("b", 7), ("fc", 3_001)];

fn value(step: u32, rank: u32, layer: u32, i: u32) -> f32 {
    ((i * 13 + rank * 29 + step * 5 + layer * 11) % 53) as f32 - 26.0
}

/// Dense rows of `p` ranks and `steps` steps, ordered by step, rank, layer.
fn rows(p: u32, steps: u32) -> Vec<TensorRow> {
    let mut out = Vec::new();
    for step in 0..steps {
        for rank in 0..p {
            for (id, (name, n)) in LAYERS.iter().enumerate() {
                out.push(TensorRow {
                    step,
                    rank,
                    layer_id: id as u32,
                    layer: (*name).into(),
                    numel: *n as u64,
                    shape: Some(vec![*n]),
                    indices: None,
                    values: (0..*n).map(|i| value(step, rank, id as u32, i)).collect(),
                });
            }
        }
    }
    out
}

/// The same rows, within each step ordered layer-major: ranks interleaved.
fn interleaved(mut rows: Vec<TensorRow>) -> Vec<TensorRow> {
    rows.sort_by_key(|r| (r.step, r.layer_id, r.rank));
    rows
}

/// The same rows, within each step the first layer of every rank, then the other layers of
/// every rank: each rank appears twice in a step.
fn twice(mut rows: Vec<TensorRow>) -> Vec<TensorRow> {
    rows.sort_by_key(|r| (r.step, r.layer_id > 0, r.rank, r.layer_id));
    rows
}

/// The reduced rows: per (step, layer) the sum over ranks, in f64.
fn want_sum(rows: &[TensorRow]) -> Vec<(u32, u32, Vec<f32>)> {
    let mut by: std::collections::BTreeMap<(u32, u32), Vec<f64>> = Default::default();
    for r in rows {
        let e = by
            .entry((r.step, r.layer_id))
            .or_insert_with(|| vec![0.0; r.numel as usize]);
        for (a, v) in e.iter_mut().zip(&r.values) {
            *a += *v as f64;
        }
    }
    by.into_iter()
        .map(|((s, l), v)| (s, l, v.into_iter().map(|x| x as f32).collect()))
        .collect()
}

fn got(path: &Path) -> Vec<(u32, u32, Vec<f32>)> {
    read_tensor(&Input::Path(path.to_path_buf()), Default::default())
        .unwrap()
        .rows
        .into_iter()
        .map(|r| (r.step, r.layer_id, r.to_dense()))
        .collect()
}

fn write(path: &Path, rows: &[TensorRow]) {
    write_table(&Output::Path(path.to_path_buf()), &Meta::default(), rows).unwrap();
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// In-process ranks: exit code and stderr.
fn local(args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(BIN)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `mpirun -np P BIN args…`: exit code and stderr; a run still going after 300 s is killed
/// and the test fails as a hang.
fn mpirun(p: usize, args: &[&str]) -> (Option<i32>, String) {
    gradkit_testkit::mpi::run_quiet(p, BIN, args)
}

#[test]
fn grouped_interleaved_and_repeated_ranks_give_the_same_sum() {
    let d_dir = tmpdir("orders");
    let d = d_dir.path().to_path_buf();
    let mpi = gradkit_testkit::mpi::available();
    for p in [3u32, 4] {
        let base = rows(p, 2);
        let want = want_sum(&base);
        for (name, trace) in [
            ("grouped", base.clone()),
            ("interleaved", interleaved(base.clone())),
            ("twice", twice(base.clone())),
        ] {
            let t = d.join(format!("{name}-{p}.parquet"));
            write(&t, &trace);
            let o = d.join(format!("{name}-{p}-local.parquet"));
            let ranks = p.to_string();
            let (code, err) = local(&["--ranks", &ranks, "-q", s(&t), "-o", s(&o)]);
            assert_eq!(code, Some(0), "{name} P={p}: {err}");
            assert!(got(&o) == want, "{name} P={p} in-process: not the sum");
            if mpi {
                let o = d.join(format!("{name}-{p}-mpi.parquet"));
                let (code, err) = mpirun(p as usize, &["-q", s(&t), "-o", s(&o)]);
                assert_eq!(code, Some(0), "{name} P={p} mpirun: {err}");
                assert!(got(&o) == want, "{name} P={p} under mpirun: not the sum");
            }
        }
    }
}

/// What the whole-trace check says of `rows` (the layers of the first step, as the
/// whole-trace reading took them).
fn whole_trace_error(rows: &[TensorRow]) -> String {
    let first: Vec<TensorRow> = rows.iter().filter(|r| r.step == 0).cloned().collect();
    let e = check_complete(rows, &Layout::of_rows(&first), None).unwrap_err();
    e.to_string()
}

fn assert_stopped(code: Option<i32>, err: &str, needle: &str, out: &Path) {
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.matches("error:").count(), 1, "one message: {err}");
    assert!(err.contains(needle), "`{needle}` missing from: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.contains("MPI_ABORT"), "ended by agreement: {err}");
    assert!(!out.exists(), "no output after an error");
}

#[test]
fn a_bad_rank_in_the_middle_of_a_step_stops_every_rank() {
    let d_dir = tmpdir("bad");
    let d = d_dir.path().to_path_buf();
    let mpi = gradkit_testkit::mpi::available();
    let p = 4u32;
    let cases: Vec<(&str, Vec<TensorRow>)> = vec![
        // Rank 2 lacks a layer in step 1: ranks 0 and 1 were handed their rows already.
        ("missing-layer", {
            let mut r = rows(p, 3);
            r.retain(|r| !(r.step == 1 && r.rank == 2 && r.layer_id == 2));
            r
        }),
        // The same in the first step, whose layers every step must have.
        ("first-step", {
            let mut r = rows(p, 2);
            r.retain(|r| !(r.step == 0 && r.rank == 2 && r.layer_id == 1));
            r
        }),
        // Rank 2 has no rows in step 1.
        ("missing-rank", {
            let mut r = rows(p, 3);
            r.retain(|r| !(r.step == 1 && r.rank == 2));
            r
        }),
        // Ranks interleaved, rank 3 lacking a layer in step 1.
        ("interleaved", {
            let mut r = interleaved(rows(p, 3));
            r.retain(|r| !(r.step == 1 && r.rank == 3 && r.layer_id == 1));
            r
        }),
    ];
    for (name, trace) in cases {
        let want = whole_trace_error(&trace);
        assert!(want.contains("step "), "{want}");
        let t = d.join(format!("{name}.parquet"));
        write(&t, &trace);
        let o = d.join(format!("{name}-out.parquet"));
        for algo in ["ring", "oktopk"] {
            let (code, err) = local(&["--algo", algo, "--ranks", "4", s(&t), "-o", s(&o)]);
            assert_stopped(code, &err, &want, &o);
            if mpi {
                let (code, err) = mpirun(4, &["--algo", algo, s(&t), "-o", s(&o)]);
                assert_stopped(code, &err, &want, &o);
            }
        }
    }
    let left = gradkit_testkit::cli::temp_files(&d);
    assert!(left.is_empty(), "temporary files left: {left:?}");
}
