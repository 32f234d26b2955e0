//! gradpartition reads its trace one step at a time (docs/MEMORY.md): a trace in reverse step
//! order (read whole, with a note) and stdin give the plan and metrics of the file ordered by
//! step; a problem in a late step stops the run with no output file left behind.

use std::path::Path;

use gradkit_core::{read_table, Input, MetricRow, PlanRow, TensorRow};
use gradkit_testkit::plans::write_trace;
use gradkit_testkit::traces::dense;

const BIN: &str = env!("CARGO_BIN_EXE_gradpartition");
const LAYERS: [(&str, u64); 3] = [("a", 400), ("b", 250), ("c", 70)];

/// Runs gradpartition with `stdin` piped in (or none): exit code, stderr.
fn gradpartition(args: &[&str], stdin: Option<&Path>) -> (i32, String) {
    let (code, _, err) = gradkit_testkit::cli::run_with_stdin(BIN, args, stdin);
    (code, err)
}

/// Plan rows and metrics (timings left out: they are measured) of one run.
fn run(input: &str, stdin: Option<&Path>, dir: &Path) -> (Vec<PlanRow>, Vec<MetricRow>, String) {
    let (plan, m) = (dir.join("plan.parquet"), dir.join("m.parquet"));
    let (code, err) = gradpartition(
        &[
            "--method",
            "deft",
            "--density",
            "0.05",
            "-q",
            "--run",
            "r",
            input,
            "-o",
            plan.to_str().unwrap(),
            "--metrics",
            m.to_str().unwrap(),
        ],
        stdin,
    );
    assert_eq!(code, 0, "{input}: {err}");
    let plan = read_table::<PlanRow>(&Input::Path(plan), Default::default()).unwrap();
    let m = read_table::<MetricRow>(&Input::Path(m), Default::default()).unwrap();
    let m = m
        .rows
        .into_iter()
        .filter(|r| !r.metric.starts_with("time_") && !r.metric.contains("measured"))
        .collect();
    (plan.rows, m, err)
}

#[test]
fn stdin_and_an_unordered_trace_plan_as_the_ordered_file() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dense(3, 5, &LAYERS);
    let ordered = dir.path().join("ordered.parquet");
    write_trace(&ordered, &trace);
    let mut rev: Vec<TensorRow> = trace.clone();
    rev.reverse();
    let reversed = dir.path().join("reversed.parquet");
    write_trace(&reversed, &rev);
    let (plan, metrics, err) = run(ordered.to_str().unwrap(), None, dir.path());
    assert!(err.is_empty(), "{err}");
    // One plan step per trace step, each tiling the 720 elements once per step.
    for s in 0..5u32 {
        let covered: u64 = plan
            .iter()
            .filter(|r| r.step == s)
            .map(|r| r.end - r.start)
            .sum();
        assert_eq!(covered, 720, "step {s}");
    }
    let (p2, m2, err) = run("-", Some(&ordered), dir.path());
    assert!(err.is_empty(), "{err}");
    assert!(
        p2 == plan && m2 == metrics,
        "stdin: another plan or metrics"
    );
    let (p3, m3, err) = run(reversed.to_str().unwrap(), None, dir.path());
    // Steps this small share a row group: read whole, with a note.
    assert!(err.contains("is not ordered by step"), "{err}");
    assert!(
        p3 == plan && m3 == metrics,
        "reversed: another plan or metrics"
    );
}

#[test]
fn a_sparse_row_in_a_late_step_stops_the_run_and_leaves_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let mut trace = dense(2, 4, &LAYERS);
    let i = trace
        .iter()
        .position(|r| r.step == 3 && r.rank == 1 && r.layer_id == 2)
        .unwrap();
    trace[i].indices = Some(vec![0, 5]);
    trace[i].values = vec![1.0, 2.0];
    let t = dir.path().join("t.parquet");
    write_trace(&t, &trace);
    let (plan, m) = (
        dir.path().join("plan.parquet"),
        dir.path().join("m.parquet"),
    );
    let (code, err) = gradpartition(
        &[
            "--method",
            "deft",
            "--density",
            "0.05",
            t.to_str().unwrap(),
            "-o",
            plan.to_str().unwrap(),
            "--metrics",
            m.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("step 3 rank 1 layer `c` is sparse but this needs dense input"),
        "{err}"
    );
    assert!(err.contains(t.to_str().unwrap()), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!plan.exists() && !m.exists());
}
