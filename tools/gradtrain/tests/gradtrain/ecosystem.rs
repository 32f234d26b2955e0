//! `gradtrain --data` reads the digits after a pandas or a polars round trip (LargeList
//! `features`, LargeUtf8 `split`) and trains exactly as on the shipped file (docs/RELIABILITY.md).
//! The round trips run in the project's venv (`make deps-py`); without it the test says so and
//! skips.

use std::path::{Path, PathBuf};
use std::process::Command;

use gradkit_core::io::{read_table, Input, ReadOptions};
use gradkit_core::MetricRow;

fn python() -> Result<PathBuf, String> {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    if !py.exists() {
        return Err(format!("{} is missing (run `make deps-py`)", py.display()));
    }
    match Command::new(&py)
        .args(["-c", "import pandas, polars"])
        .output()
    {
        Ok(o) if o.status.success() => Ok(py),
        _ => Err("the venv lacks pandas or polars (run `make deps-py`)".into()),
    }
}

/// The loss and accuracy rows of a short run on `data` (times differ between runs).
fn train(data: &Path, dir: &Path, name: &str) -> Vec<MetricRow> {
    let m = dir.join(format!("metrics-{name}.parquet"));
    let o = Command::new(env!("CARGO_BIN_EXE_gradtrain"))
        .args(["--model", "mlp", "--data"])
        .arg(data)
        .args(["--ranks", "2", "--steps", "2", "--eval-every", "2", "-q"])
        .arg("--metrics")
        .arg(&m)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}: {}",
        data.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    read_table::<MetricRow>(&Input::Path(m), ReadOptions::default())
        .unwrap()
        .rows
        .into_iter()
        .filter(|r| !r.metric.starts_with("time_"))
        .map(|r| MetricRow {
            run: String::new(),
            ..r
        })
        .collect()
}

#[test]
fn digits_through_pandas_and_polars_train_as_the_original() {
    let py = match python() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let digits = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/digits.parquet");
    let script = "import sys, pandas as pd, polars as pl\n\
                  pd.read_parquet(sys.argv[1]).to_parquet(sys.argv[2])\n\
                  pl.read_parquet(sys.argv[1]).write_parquet(sys.argv[3])\n";
    let (pd_file, pl_file) = (dir.path().join("pd.parquet"), dir.path().join("pl.parquet"));
    let o = Command::new(py)
        .args(["-c", script])
        .args([&digits, &pd_file, &pl_file])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = train(&digits, dir.path(), "orig");
    assert!(want.iter().any(|r| r.metric == "loss"), "{want:?}");
    assert_eq!(train(&pd_file, dir.path(), "pd"), want, "pandas");
    assert_eq!(train(&pl_file, dir.path(), "pl"), want, "polars");
}
