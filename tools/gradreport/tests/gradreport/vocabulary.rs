//! One vocabulary across the tools, and metrics ready for analysis: an algorithm has one name
//! in `gradallreduce --algo`, `gradtrain --exchange` and the metrics' `algo` column (old
//! spellings accepted, with a note); a run's default name says what it ran and at which
//! density; the run's settings are columns; phase rows are told from totals by the `phase`
//! column, not by a pattern in the metric's name. The files are read here with the parquet
//! crate's own reader (not gradkit's), as pandas or duckdb would see them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt32Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

fn bin(tool: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_gradreport"))
        .parent()
        .expect("the binary has a directory")
        .join(tool)
}

/// Runs `tool args`; (exit code, stderr).
fn run(tool: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(bin(tool)).args(args).output().expect("spawn");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(tool: &str, args: &[&str]) -> String {
    let (code, err) = run(tool, args);
    assert_eq!(code, 0, "{tool} {args:?}: {err}");
    err
}

fn batch(path: &Path) -> RecordBatch {
    let f = std::fs::File::open(path).unwrap();
    let r = ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    let batches: Vec<RecordBatch> = r.map(|b| b.unwrap()).collect();
    arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap()
}

fn strings(b: &RecordBatch, name: &str) -> Vec<String> {
    let a = b
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"));
    let a = a.as_string::<i32>();
    (0..a.len())
        .map(|i| {
            if a.is_valid(i) {
                a.value(i).to_string()
            } else {
                "<null>".into()
            }
        })
        .collect()
}

/// The distinct values of a Utf8 column.
fn distinct(b: &RecordBatch, name: &str) -> Vec<String> {
    let mut v = strings(b, name);
    v.sort();
    v.dedup();
    v
}

fn trace(dir: &Path) -> PathBuf {
    let t = dir.join("trace.parquet");
    if !t.exists() {
        ok(
            "gradtrace",
            &[
                "synthetic",
                "--shape",
                "mlp",
                "--ranks",
                "2",
                "--steps",
                "2",
                "--seed",
                "3",
                "-q",
                "-o",
                t.to_str().unwrap(),
            ],
        );
    }
    t
}

fn train(dir: &Path, name: &str, extra: &[&str]) -> (RecordBatch, String) {
    let m = dir.join(format!("{name}.parquet"));
    let mut args = vec![
        "--model",
        "mlp",
        "--ranks",
        "2",
        "--steps",
        "2",
        "--batch",
        "8",
        "-q",
        "--metrics",
        m.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let err = ok("gradtrain", &args);
    (batch(&m), err)
}

fn reduce(dir: &Path, name: &str, extra: &[&str]) -> (RecordBatch, String) {
    let m = dir.join(format!("{name}.parquet"));
    let t = trace(dir);
    let mut args = vec![
        t.to_str().unwrap(),
        "-q",
        "-o",
        "/dev/null",
        "--metrics",
        m.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let err = ok("gradallreduce", &args);
    (batch(&m), err)
}

#[test]
fn one_name_per_algorithm_in_every_tool_and_in_the_algo_column() {
    let d = gradkit_testkit::tempdir("vocabulary-names");
    // Every algorithm gradtrain and gradallreduce share, by the one name both take.
    for name in [
        "ring",
        "topka",
        "gaussiank",
        "topkdsa",
        "gtopk",
        "oktopk",
        "deft",
        "cltk",
        "topk-union",
    ] {
        let (t, _) = train(d.path(), &format!("train-{name}"), &["--exchange", name]);
        let (r, _) = reduce(d.path(), &format!("reduce-{name}"), &["--algo", name]);
        assert_eq!(distinct(&t, "algo"), [name], "gradtrain --exchange {name}");
        assert_eq!(distinct(&r, "algo"), [name], "gradallreduce --algo {name}");
    }
    // The fp16 wire: the same flag and the same name in both tools.
    let (t, _) = train(
        d.path(),
        "train-fp16",
        &["--exchange", "ring", "--wire", "fp16"],
    );
    let (r, _) = reduce(
        d.path(),
        "reduce-fp16",
        &["--algo", "ring", "--wire", "fp16"],
    );
    let (r2, _) = reduce(d.path(), "reduce-fp16-name", &["--algo", "ring-fp16"]);
    assert_eq!(distinct(&t, "algo"), ["ring-fp16"]);
    assert_eq!(distinct(&r, "algo"), ["ring-fp16"]);
    assert_eq!(distinct(&r2, "algo"), ["ring-fp16"]);
    let (code, err) = run(
        "gradallreduce",
        &[
            trace(d.path()).to_str().unwrap(),
            "--algo",
            "topka",
            "--wire",
            "fp16",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--wire fp16 applies to --algo ring only"),
        "{err}"
    );
}

#[test]
fn old_spellings_are_accepted_with_a_note() {
    let d = gradkit_testkit::tempdir("vocabulary-aliases");
    for (old, new) in [("dense", "ring"), ("topk", "topka")] {
        let (t, err) = train(d.path(), old, &["--exchange", old]);
        assert_eq!(distinct(&t, "algo"), [new], "--exchange {old}");
        let note = format!("note: --exchange {old} is now spelled `{new}`");
        assert_eq!(err.matches(&note).count(), 1, "one note, got: {err}");
    }
    // gradallreduce's `alltoall` is EmbRace's exchange: the note comes as the flag is read.
    let (_, err) = run(
        "gradallreduce",
        &[
            trace(d.path()).to_str().unwrap(),
            "--algo",
            "alltoall",
            "-o",
            "/dev/null",
        ],
    );
    assert!(
        err.contains("note: --algo alltoall is now spelled `embrace`"),
        "{err}"
    );
    // The canonical names print no note.
    let (_, err) = train(d.path(), "ring", &["--exchange", "ring"]);
    assert!(!err.contains("note:"), "{err}");
}

#[test]
fn default_run_names_say_what_ran_and_at_which_density() {
    let d = gradkit_testkit::tempdir("vocabulary-runs");
    let cases: Vec<(RecordBatch, &str)> = vec![
        (
            train(
                d.path(),
                "a",
                &["--exchange", "oktopk", "--density", "0.05"],
            )
            .0,
            "oktopk-d0.05",
        ),
        (
            train(
                d.path(),
                "b",
                &["--exchange", "oktopk", "--density", "0.02"],
            )
            .0,
            "oktopk-d0.02",
        ),
        (
            train(d.path(), "c", &["--optimizer", "adam"]).0,
            "ring-adam",
        ),
        (
            reduce(d.path(), "e", &["--algo", "topka", "--density", "0.02"]).0,
            "topka-d0.02",
        ),
        (
            reduce(d.path(), "f", &["--algo", "topka", "--k", "7"]).0,
            "topka-k7",
        ),
        (
            reduce(d.path(), "g", &["--algo", "rabenseifner"]).0,
            "rabenseifner",
        ),
    ];
    for (b, want) in &cases {
        assert_eq!(distinct(b, "run"), [*want]);
    }
    let sel = d.path().join("sel.parquet");
    ok(
        "gradselect",
        &[
            trace(d.path()).to_str().unwrap(),
            "--method",
            "topk",
            "--density",
            "0.02",
            "-q",
            "-o",
            "/dev/null",
            "--metrics",
            sel.to_str().unwrap(),
        ],
    );
    assert_eq!(distinct(&batch(&sel), "run"), ["topk-d0.02"]);
}

#[test]
fn the_runs_settings_are_columns() {
    let d = gradkit_testkit::tempdir("vocabulary-settings");
    let (t, _) = train(
        d.path(),
        "t",
        &["--exchange", "gtopk", "--density", "0.05", "--seed", "7"],
    );
    let n = t.num_rows();
    let density = t
        .column_by_name("density")
        .unwrap()
        .as_primitive::<Float64Type>();
    let seed = t
        .column_by_name("seed")
        .unwrap()
        .as_primitive::<UInt64Type>();
    assert_eq!(density.null_count(), 0);
    assert!((0..n).all(|i| density.value(i) == 0.05 && seed.value(i) == 7));
    assert_eq!(distinct(&t, "optimizer"), ["sgd"]);
    assert_eq!(distinct(&t, "model"), ["mlp"]);
    // A dense exchange has no density: null, not a made-up number.
    let (r, _) = train(d.path(), "r", &["--exchange", "ring"]);
    assert_eq!(
        r.column_by_name("density").unwrap().null_count(),
        r.num_rows()
    );
    let (s, _) = reduce(d.path(), "s", &["--algo", "oktopk", "--density", "0.03"]);
    let density = s
        .column_by_name("density")
        .unwrap()
        .as_primitive::<Float64Type>();
    assert!((0..s.num_rows()).all(|i| density.value(i) == 0.03));
    assert_eq!(distinct(&s, "optimizer"), ["<null>"]);
}

#[test]
fn phase_rows_are_told_from_totals_by_a_column() {
    let d = gradkit_testkit::tempdir("vocabulary-phase");
    let (b, _) = reduce(d.path(), "ok", &["--algo", "oktopk"]);
    let (metric, phase) = (strings(&b, "metric"), strings(&b, "phase"));
    let value = b
        .column_by_name("value")
        .unwrap()
        .as_primitive::<Float64Type>();
    let step = b
        .column_by_name("step")
        .unwrap()
        .as_primitive::<UInt32Type>();
    let rank = b
        .column_by_name("rank")
        .unwrap()
        .as_primitive::<UInt32Type>();
    assert!(metric.iter().all(|m| !m.contains(':')), "{metric:?}");
    // Totals and the sum of the phases, independently, per (metric, step, rank).
    let mut total: BTreeMap<(String, u32, u32), f64> = BTreeMap::new();
    let mut phases: BTreeMap<(String, u32, u32), (f64, usize)> = BTreeMap::new();
    for i in 0..b.num_rows() {
        if !["bytes_sent", "bytes_recv", "messages"].contains(&metric[i].as_str()) {
            continue;
        }
        let key = (metric[i].clone(), step.value(i), rank.value(i));
        if phase[i].is_empty() {
            assert!(
                total.insert(key, value.value(i)).is_none(),
                "one total per key"
            );
        } else {
            let e = phases.entry(key).or_default();
            e.0 += value.value(i);
            e.1 += 1;
        }
    }
    assert!(!total.is_empty());
    for (k, t) in &total {
        let (sum, count) = phases[k];
        assert!(count >= 2, "{k:?}: Ok-Topk has several phases");
        assert_eq!(*t, sum, "{k:?}: total {t} vs the phases' sum {sum}");
    }
    // gradreport reads it back as it reads older files that spelled the phase in the name.
    let (code, err) = run(
        "gradreport",
        &[
            "table",
            d.path().join("ok.parquet").to_str().unwrap(),
            "--metric",
            "bytes_sent:split_and_reduce",
        ],
    );
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_metrics_file_from_before_the_phase_and_settings_columns_still_reads() {
    use arrow_array::{Float64Array, StringArray, UInt32Array};
    use std::sync::Arc;
    let d = gradkit_testkit::tempdir("vocabulary-legacy");
    let s = |v: &[&str]| Arc::new(StringArray::from(v.to_vec())) as arrow_array::ArrayRef;
    let u = |v: &[u32]| Arc::new(UInt32Array::from(v.to_vec())) as arrow_array::ArrayRef;
    let b = RecordBatch::try_from_iter([
        ("run", s(&["x", "x"])),
        ("tool", s(&["gradallreduce", "gradallreduce"])),
        ("algo", s(&["oktopk", "oktopk"])),
        ("world_size", u(&[2, 2])),
        ("step", u(&[0, 0])),
        ("rank", u(&[0, 0])),
        ("metric", s(&["bytes_sent", "bytes_sent:split_and_reduce"])),
        (
            "value",
            Arc::new(Float64Array::from(vec![10.0, 4.0])) as arrow_array::ArrayRef,
        ),
    ])
    .unwrap();
    let p = d.path().join("old.parquet");
    let mut w =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&p).unwrap(), b.schema(), None)
            .unwrap();
    w.write(&b).unwrap();
    w.close().unwrap();
    let rows = gradkit_core::read_table::<gradkit_core::MetricRow>(
        &gradkit_core::Input::Path(p),
        Default::default(),
    )
    .unwrap()
    .rows;
    let names: Vec<&str> = rows.iter().map(|r| r.metric.as_str()).collect();
    assert_eq!(names, ["bytes_sent", "bytes_sent:split_and_reduce"]);
    assert_eq!(rows[1].name_and_phase(), ("bytes_sent", "split_and_reduce"));
    assert_eq!(rows[0].settings.density, None);
}
