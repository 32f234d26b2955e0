//! Tables written by pandas, polars and pyarrow themselves (docs/RELIABILITY.md):
//! large and Null types, Int64 where the format says UInt32, a Float64 `k`, the schema key
//! dropped, the gzip/LZ4/Brotli codecs. Each file must read as the rows it was made from (an
//! independent fixture, `common::good_rows`), and `gradtrace cat` must rewrite it in the
//! canonical types. The files come from tests/py/write_ecosystem.py in the project's venv
//! (`make deps-py`); without the venv the tests say so and skip.

use crate::common;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use gradkit_core::io::{read_table, read_tensor, write_table, Input, Meta, ReadOptions};
use gradkit_core::{MetricRow, PlanRow, Table, TensorRow};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::reader::{FileReader, SerializedFileReader};

const BIN: &str = env!("CARGO_BIN_EXE_gradtrace");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv's Python when it has pandas, polars and pyarrow; otherwise the reason to skip.
fn python() -> Result<PathBuf, String> {
    let py = root().join(".venv/bin/python");
    if !py.exists() {
        return Err(format!("{} is missing (run `make deps-py`)", py.display()));
    }
    let o = Command::new(&py)
        .args(["-c", "import pandas, polars, pyarrow"])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", py.display()))?;
    if !o.status.success() {
        return Err(format!(
            "the venv lacks pandas or polars (run `make deps-py`): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(py)
}

fn plan_rows() -> Vec<PlanRow> {
    let r = |worker, start, end, k| PlanRow {
        step: 0,
        worker,
        layer_id: 0,
        layer: "w".into(),
        start,
        end,
        k,
    };
    vec![r(0, 0, 2, Some(1)), r(1, 2, 4, None), r(0, 4, 6, Some(3))]
}

fn metric_rows() -> Vec<MetricRow> {
    (0..4)
        .map(|i| MetricRow {
            run: format!("run{}", i % 2),
            tool: "gradallreduce".into(),
            algo: "ring".into(),
            world_size: 2,
            step: i / 2,
            rank: i % 2,
            metric: "bytes_sent".into(),
            value: 1.5 * i as f64 + 0.25,
            settings: Default::default(),
        })
        .collect()
}

/// The directory of files the script wrote (made once per test binary), or why not.
fn fixtures() -> Result<&'static Path, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        let py = python()?;
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("gradtrace-ecosystem-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let src = dir.join("in");
        std::fs::create_dir_all(&src).unwrap();
        common::write_rows(&src.join("trace.parquet"), &common::good_rows());
        let meta = Meta::producer("test");
        write_table(
            &gradkit_core::Output::Path(src.join("plan.parquet")),
            &meta,
            &plan_rows(),
        )
        .unwrap();
        write_table(
            &gradkit_core::Output::Path(src.join("metrics.parquet")),
            &meta,
            &metric_rows(),
        )
        .unwrap();
        std::fs::copy(
            root().join("data/digits.parquet"),
            src.join("digits.parquet"),
        )
        .unwrap();
        let o = Command::new(py)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/write_ecosystem.py"))
            .arg(&src)
            .arg(dir.join("out"))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "write_ecosystem.py failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        Ok(dir.join("out"))
    })
    .as_deref()
    .map_err(|e| e.clone())
}

/// The fixture directory, or `None` after printing why the test is skipped.
fn dir() -> Option<&'static Path> {
    match fixtures() {
        Ok(d) => Some(d),
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

fn run(args: &[&str], cwd: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const TENSOR_FILES: &[&str] = &[
    "pandas_tensor.parquet",
    "pandas_int64.parquet",
    "polars_tensor.parquet",
];

fn dense_rows() -> Vec<TensorRow> {
    common::good_rows()
        .into_iter()
        .filter(|r| r.indices.is_none())
        .collect()
}

#[test]
fn pandas_and_polars_tensor_files_read_as_the_rows_they_hold() {
    let Some(d) = dir() else { return };
    for f in TENSOR_FILES {
        let t = read_tensor(&Input::Path(d.join(f)), ReadOptions::default())
            .unwrap_or_else(|e| panic!("{f}: {e:#}"));
        assert_eq!(t.rows, common::good_rows(), "{f}");
        assert_eq!(t.meta.get("gradkit.schema"), None, "{f}");
    }
    // `indices` typed Null (and an extra index column): every row dense.
    let t = read_tensor(
        &Input::Path(d.join("pandas_dense.parquet")),
        ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(t.rows, dense_rows());
}

/// The Arrow types of a file's columns as gradkit's reader sees them.
fn arrow_types(p: &Path) -> Vec<(String, arrow_schema::DataType)> {
    let b = ParquetRecordBatchReaderBuilder::try_new(File::open(p).unwrap()).unwrap();
    b.schema()
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().clone()))
        .collect()
}

#[test]
fn gradtrace_cat_rewrites_them_in_the_canonical_types() {
    let Some(d) = dir() else { return };
    let canonical: Vec<_> = TensorRow::schema()
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().clone()))
        .collect();
    let files = TENSOR_FILES.iter().chain(&["pandas_dense.parquet"]);
    for (i, f) in files.enumerate() {
        let out = format!("cat{i}.parquet");
        let o = run(&["cat", f, "-o", &out], d);
        assert!(o.status.success(), "{f}: {}", stderr(&o));
        // One note, naming the file and the table it was recognised as.
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{f}: {err}");
        assert!(
            err.starts_with("note: ")
                && err.contains(f)
                && err.contains("no `gradkit.schema`")
                && err.contains("tensor/1"),
            "{f}: {err}"
        );
        let p = d.join(&out);
        assert_eq!(arrow_types(&p), canonical, "{f}");
        let t = read_tensor(&Input::Path(p.clone()), ReadOptions::default()).unwrap();
        assert_eq!(t.meta.get("gradkit.schema"), Some("tensor/1"));
        let want = if *f == "pandas_dense.parquet" {
            dense_rows()
        } else {
            common::good_rows()
        };
        assert_eq!(t.rows, want, "{f}");
        // The canonical file reads without a note.
        let o = run(&["inspect", &out, "--format", "csv"], d);
        assert!(o.status.success() && o.stderr.is_empty(), "{}", stderr(&o));
    }
}

#[test]
fn plan_and_metrics_through_pandas_and_polars_read_back() {
    let Some(d) = dir() else { return };
    // pandas turned `k` (UInt64 with nulls) into Float64 holding whole numbers.
    let plan = read_table::<PlanRow>(
        &Input::Path(d.join("pandas_plan.parquet")),
        ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(plan.rows, plan_rows());
    let m = read_table::<MetricRow>(
        &Input::Path(d.join("polars_metrics.parquet")),
        ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(m.rows, metric_rows());
    // A file recognised as another table is refused as such.
    let o = run(&["inspect", "pandas_plan.parquet"], d);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("absent") && err.contains("`plan/1`") && err.contains("`tensor/1`"),
        "{err}"
    );
}

#[test]
fn codecs_other_writers_use_read() {
    let Some(d) = dir() else { return };
    let mut seen = Vec::new();
    for f in [
        "pyarrow_gzip.parquet",
        "pyarrow_lz4.parquet",
        "pyarrow_lz4_raw.parquet",
        "pyarrow_brotli.parquet",
        "polars_lz4.parquet",
    ] {
        let p = d.join(f);
        let r = SerializedFileReader::new(File::open(&p).unwrap()).unwrap();
        seen.push(r.metadata().row_group(0).column(0).compression());
        let t = read_tensor(&Input::Path(p), ReadOptions::default())
            .unwrap_or_else(|e| panic!("{f}: {e:#}"));
        assert_eq!(t.rows, common::good_rows(), "{f}");
        let o = run(&["cat", f, "-o", "codec.parquet"], d);
        assert!(o.status.success(), "{f}: {}", stderr(&o));
    }
    // LZ4, gzip and Brotli were really exercised. pyarrow 26 and polars write LZ4 as LZ4_RAW
    // whether asked for `lz4` or `lz4_raw`; the older Hadoop-framed LZ4 (Compression::LZ4) is
    // read in lib/core/tests/core_tests/ecosystem.rs from a file arrow-rs writes.
    assert!(seen.contains(&Compression::LZ4_RAW), "{seen:?}");
    assert!(
        seen.iter().any(|c| matches!(c, Compression::GZIP(_))),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|c| matches!(c, Compression::BROTLI(_))),
        "{seen:?}"
    );
}

#[test]
fn values_that_do_not_fit_are_refused_naming_column_and_row() {
    let Some(d) = dir() else { return };
    // Int64 `step` with -1 in row 5.
    let o = run(
        &["cat", "pandas_negative_step.parquet", "-o", "neg.parquet"],
        d,
    );
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("error: ")
            && err.contains("column `step`, row 5")
            && err.contains("-1")
            && err.contains("UInt32"),
        "{err}"
    );
    assert!(!d.join("neg.parquet").exists());
    // Float64 gradient values are not rounded to float32 behind the user's back.
    let o = run(
        &["cat", "pandas_float64_values.parquet", "-o", "f64.parquet"],
        d,
    );
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("column `values`")
            && err.contains("List<Float64>")
            && err.contains("expected List<Float32>")
            && err.contains("float32"),
        "{err}"
    );
    assert_eq!(err.matches("error: ").count(), 1, "{err}");
    assert!(!d.join("f64.parquet").exists());
}

/// gradtrain's data reader (`gradtrace model --data` shares it with `gradtrain --data`): a
/// pandas or polars round trip of the digits gives the very gradients the original gives.
#[test]
fn digits_round_trips_give_the_same_gradients() {
    let Some(d) = dir() else { return };
    let digits = root().join("data/digits.parquet");
    let model = |data: &Path, out: &str| {
        let o = run(
            &[
                "model",
                "--data",
                data.to_str().unwrap(),
                "--ranks",
                "2",
                "--steps",
                "2",
                "-q",
                "-o",
                out,
            ],
            d,
        );
        assert!(o.status.success(), "{}: {}", data.display(), stderr(&o));
        read_tensor(&Input::Path(d.join(out)), ReadOptions::default())
            .unwrap()
            .rows
    };
    let want = model(&digits, "g-orig.parquet");
    for f in ["digits_pandas.parquet", "digits_polars.parquet"] {
        assert_eq!(model(&d.join(f), &format!("g-{f}")), want, "{f}");
    }
}
