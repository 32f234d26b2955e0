//! Validation that agrees across tools (docs/RELIABILITY.md), as gradpartition sees it:
//! a flag of the other method is a usage error (its default never trips the check), and the
//! plans gradpartition writes pass the validator every plan consumer shares.

use std::path::Path;
use std::process::Command;

use gradkit_core::io::{Input, Meta, Output, ReadOptions};
use gradkit_core::trace::Layout;
use gradkit_core::{read_table, write_table, PlanRow, TensorRow};
use gradkit_partition::plan::{check, PlanKind};

const BIN: &str = env!("CARGO_BIN_EXE_gradpartition");

/// Ranks 0..2, steps 0..4, layers `a` (40) and `b` (24); `sparse` keeps every third entry.
fn trace(sparse: bool) -> Vec<TensorRow> {
    let mut rows = Vec::new();
    for step in 0..4u32 {
        for rank in 0..2u32 {
            for (id, (name, n)) in [("a", 40u64), ("b", 24)].into_iter().enumerate() {
                let v = |i: u64| ((i * 7 + 5 * rank as u64 + step as u64) % 13) as f32 - 6.0;
                let (indices, values) = if sparse {
                    let idx: Vec<u32> = (0..n as u32).filter(|i| i % 3 == rank).collect();
                    let vals = idx.iter().map(|&i| v(i as u64)).collect();
                    (Some(idx), vals)
                } else {
                    (None, (0..n).map(v).collect())
                };
                rows.push(TensorRow {
                    step,
                    rank,
                    layer_id: id as u32,
                    layer: name.into(),
                    numel: n,
                    shape: None,
                    indices,
                    values,
                });
            }
        }
    }
    rows
}

fn write(path: &Path, rows: &[TensorRow]) {
    write_table::<TensorRow>(&Output::Path(path.into()), &Meta::default(), rows).unwrap();
}

fn run(args: &[&str]) -> (i32, String) {
    let o = Command::new(BIN).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_flag_of_the_other_method_is_a_usage_error() {
    let d = tempfile::tempdir().unwrap();
    let (dense, sparse) = (d.path().join("d.parquet"), d.path().join("s.parquet"));
    write(&dense, &trace(false));
    write(&sparse, &trace(true));
    let out = d.path().join("out.parquet");
    let (ds, ss, os) = (
        dense.to_str().unwrap(),
        sparse.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    let deft = ["--method", "deft", "--density", "0.1"];
    for (args, input, needle) in [
        (
            &[&deft[..], &["--period", "4"]].concat(),
            ds,
            "error: --period applies to --method oktopk only, not --method deft",
        ),
        (
            &[&deft[..], &["--naive"]].concat(),
            ds,
            "error: --naive applies to --method oktopk only",
        ),
        (
            &["--method", "oktopk", "--density", "0.1"][..].to_vec(),
            ss,
            "error: --density applies to --method deft only, not --method oktopk",
        ),
        (
            &["--method", "oktopk", "--no-buildup"][..].to_vec(),
            ss,
            "error: --no-buildup applies to --method deft only",
        ),
        (
            &["--method", "oktopk", "--period", "0"][..].to_vec(),
            ss,
            "error: --period must be at least 1",
        ),
    ] {
        let mut a = args.clone();
        a.extend([input, "-o", os]);
        let (c, e) = run(&a);
        assert_eq!(c, 2, "{args:?}: {e}");
        assert!(e.starts_with(needle), "{args:?}: {e}");
        assert!(!out.exists(), "{args:?}");
    }
    // --period's default does not trip the check for deft; given for oktopk it is taken.
    let (c, e) = run(&[&deft[..], &[ds, "-o", os, "-q"]].concat());
    assert_eq!(c, 0, "{e}");
    let (c, e) = run(&["--method", "oktopk", "--period", "2", ss, "-o", os, "-q"]);
    assert_eq!(c, 0, "{e}");
}

#[test]
fn the_plans_written_pass_the_shared_validator() {
    let d = tempfile::tempdir().unwrap();
    let (dense, sparse) = (d.path().join("d.parquet"), d.path().join("s.parquet"));
    let rows = trace(false);
    write(&dense, &rows);
    write(&sparse, &trace(true));
    let layout = Layout::of_rows(&rows);
    for (args, kind) in [
        (vec!["--method", "deft", "--density", "0.1"], PlanKind::Deft),
        (
            vec!["--method", "oktopk", "--period", "2"],
            PlanKind::Oktopk,
        ),
    ] {
        let out = d.path().join("plan.parquet");
        let input = if kind == PlanKind::Deft {
            &dense
        } else {
            &sparse
        };
        let mut a = args.clone();
        a.extend([input.to_str().unwrap(), "-o", out.to_str().unwrap(), "-q"]);
        let (c, e) = run(&a);
        assert_eq!(c, 0, "{args:?}: {e}");
        let t = read_table::<PlanRow>(&Input::Path(out.clone()), ReadOptions::default()).unwrap();
        check(t.rows, Some(&t.meta), kind, &layout, 2, 0)
            .unwrap_or_else(|e| panic!("{args:?}: {e:#}"));
    }
}

/// The environment variables gradkit reads are checked like flags, here too (where
/// `GRADKIT_COMM_TIMEOUT` has no effect, and `GRADKIT_MAX_MEMORY` may have none): a usage
/// error naming the variable and its values.
#[test]
fn a_bad_environment_variable_is_a_usage_error() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().join("t.parquet");
    write_table(&Output::Path(t.clone()), &Meta::default(), &trace(false)).unwrap();
    let args = [
        "--method",
        "deft",
        "--density",
        "0.1",
        "t.parquet",
        "-o",
        "plan.parquet",
        "-q",
    ];
    for (var, v, accepts) in gradkit_testkit::cli::BAD_ENV {
        gradkit_testkit::cli::env_refused(BIN, d.path(), &args, var, v, accepts);
    }
}
