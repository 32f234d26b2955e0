//! `gradreport` run as a user would, on small metrics/tensor files written here; the expected
//! tables are written out by hand from the fixture values below.

use std::path::{Path, PathBuf};
use std::process::{Command, Output as ProcOut};

use gradkit_core::{write_table, Meta, MetricRow, Output, TensorRow};

fn m(run: &str, algo: &str, ws: u32, step: u32, rank: u32, metric: &str, value: f64) -> MetricRow {
    MetricRow {
        run: run.into(),
        tool: "test".into(),
        algo: algo.into(),
        world_size: ws,
        step,
        rank,
        metric: metric.into(),
        value,
        settings: Default::default(),
    }
}

/// ring P=2: bytes_sent (step, rank) = (0,0) 100, (0,1) 100, (1,0) 100, (1,1) 300
///   → median 100, min 100, max 300; time_comm_s 0.5 everywhere.
/// oktopk P=2: only phases. split_and_reduce 10 (rank 0) / 30 (rank 1), balance_and_allgatherv
///   20 / 40, both steps → totals 30 / 70 → median 50; per phase medians 20 and 30.
/// ring P=4: bytes_sent 200 at every (step, rank), no model.
/// Model: ring P=2 100; oktopk P=2 40, split_and_reduce 20.
fn comm_rows() -> Vec<MetricRow> {
    let mut v = Vec::new();
    for (step, rank, b) in [(0, 0, 100.0), (0, 1, 100.0), (1, 0, 100.0), (1, 1, 300.0)] {
        v.push(m("r1", "ring", 2, step, rank, "bytes_sent", b));
        v.push(m("r1", "ring", 2, step, rank, "time_comm_s", 0.5));
    }
    for step in 0..2 {
        for (rank, sr, ba) in [(0, 10.0, 20.0), (1, 30.0, 40.0)] {
            v.push(m(
                "o1",
                "oktopk",
                2,
                step,
                rank,
                "bytes_sent:split_and_reduce",
                sr,
            ));
            v.push(m(
                "o1",
                "oktopk",
                2,
                step,
                rank,
                "bytes_sent:balance_and_allgatherv",
                ba,
            ));
        }
    }
    v
}

fn model_rows() -> Vec<MetricRow> {
    vec![
        m("model", "ring", 2, 0, 0, "model_bytes_sent", 100.0),
        m("model", "oktopk", 2, 0, 0, "model_bytes_sent", 40.0),
        m(
            "model",
            "oktopk",
            2,
            0,
            0,
            "model_bytes_sent:split_and_reduce",
            20.0,
        ),
    ]
}

fn ring4_rows() -> Vec<MetricRow> {
    let mut v = Vec::new();
    for step in 0..2 {
        for rank in 0..4 {
            v.push(m("r4", "ring", 4, step, rank, "bytes_sent", 200.0));
        }
    }
    v
}

/// Run a: loss at steps 0..=2 on ranks 0, 1; at step 2 rank 0 has 0.5 and rank 1 0.7 (→ 0.6).
/// Run b: loss at steps 0..=3, 0.25 at step 3 on both ranks. accuracy for run a only.
fn train_rows() -> Vec<MetricRow> {
    let mut v = Vec::new();
    for (step, l0, l1) in [(0, 2.0, 2.0), (1, 1.0, 1.2), (2, 0.5, 0.7)] {
        v.push(m("alpha-run", "dense", 2, step, 0, "loss", l0));
        v.push(m("alpha-run", "dense", 2, step, 1, "loss", l1));
        v.push(m(
            "alpha-run",
            "dense",
            2,
            step,
            0,
            "accuracy",
            0.1 * (step + 1) as f64,
        ));
    }
    for (step, l) in [(0, 2.0), (1, 1.0), (2, 0.5), (3, 0.25)] {
        for rank in 0..2 {
            v.push(m("beta-run", "oktopk", 2, step, rank, "loss", l));
        }
    }
    v
}

fn breakdown_rows() -> Vec<MetricRow> {
    let mut v = Vec::new();
    for (algo, c, s, x) in [("dense", 0.010, 0.0, 0.020), ("topka", 0.010, 0.002, 0.005)] {
        for rank in 0..2 {
            v.push(m("b", algo, 2, 0, rank, "time_compute_s", c));
            v.push(m("b", algo, 2, 0, rank, "time_select_s", s));
            v.push(m("b", algo, 2, 0, rank, "time_comm_s", x));
        }
    }
    v
}

fn write_metrics(dir: &Path, name: &str, rows: &[MetricRow]) -> PathBuf {
    let p = dir.join(name);
    write_table(&Output::Path(p.clone()), &Meta::producer("test"), rows).unwrap();
    p
}

fn tensor_file(dir: &Path) -> PathBuf {
    let rows = vec![
        TensorRow {
            step: 0,
            rank: 0,
            layer_id: 0,
            layer: "fc.weight".into(),
            numel: 4,
            shape: Some(vec![2, 2]),
            indices: None,
            values: vec![3.0, 0.0, 4.0, 0.0],
        },
        TensorRow {
            step: 0,
            rank: 0,
            layer_id: 1,
            layer: "fc.bias".into(),
            numel: 10,
            shape: None,
            indices: Some(vec![1, 7]),
            values: vec![1.0, 0.0],
        },
        TensorRow {
            step: 1,
            rank: 0,
            layer_id: 0,
            layer: "fc.weight".into(),
            numel: 4,
            shape: Some(vec![2, 2]),
            indices: None,
            values: vec![1.0, 1.0, 1.0, 1.0],
        },
    ];
    let p = dir.join("t.parquet");
    write_table(&Output::Path(p.clone()), &Meta::producer("test"), &rows).unwrap();
    p
}

fn run(args: &[&str]) -> ProcOut {
    Command::new(env!("CARGO_BIN_EXE_gradreport"))
        .args(args)
        .output()
        .expect("runs")
}

fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert!(
        o.status.success(),
        "gradreport {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Exit 1 with one `error:` line; returns it.
fn fails(args: &[&str]) -> String {
    let o = run(args);
    assert_eq!(
        o.status.code(),
        Some(1),
        "gradreport {args:?} should exit 1"
    );
    let err = String::from_utf8(o.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(o.stdout.is_empty());
    err
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn table_markdown_medians_with_ranges() {
    let d = tempfile::tempdir().unwrap();
    let f = write_metrics(d.path(), "m.parquet", &comm_rows());
    let out = ok(&["table", s(&f), "--metric", "bytes_sent,time_comm_s"]);
    let want = "\
| algo   | world_size | bytes_sent    | time_comm_s |
|--------|-----------:|---------------|------------:|
| oktopk |          2 | 50 (30–70)    |           - |
| ring   |          2 | 100 (100–300) |         0.5 |
";
    assert_eq!(out, want);
}

#[test]
fn table_default_metrics_and_several_files() {
    let d = tempfile::tempdir().unwrap();
    let f1 = write_metrics(d.path(), "a.parquet", &comm_rows());
    let f2 = write_metrics(d.path(), "b.parquet", &ring4_rows());
    // Default metrics: bytes_sent (phases collapse into it), time_comm_s.
    let out = ok(&["table", s(&f1), s(&f2), "--format", "csv"]);
    let want = "\
algo,world_size,bytes_sent,bytes_sent_min,bytes_sent_max,time_comm_s,time_comm_s_min,time_comm_s_max
oktopk,2,50,30,70,-,-,-
ring,2,100,100,300,0.5,0.5,0.5
ring,4,200,200,200,-,-,-
";
    assert_eq!(out, want);
}

#[test]
fn table_phases_and_stats() {
    let d = tempfile::tempdir().unwrap();
    let f = write_metrics(d.path(), "m.parquet", &comm_rows());
    let out = ok(&[
        "table",
        s(&f),
        "--by",
        "algo",
        "--metric",
        "bytes_sent:*",
        "--no-range",
        "--format",
        "csv",
    ]);
    assert_eq!(
        out,
        "algo,bytes_sent:split_and_reduce,bytes_sent:balance_and_allgatherv\noktopk,20,30\n"
    );
    // Sum over all samples: ring 100+100+100+300; oktopk 30+70+30+70.
    let out = ok(&[
        "table",
        s(&f),
        "--by",
        "algo",
        "--metric",
        "bytes_sent",
        "--stat",
        "sum",
        "--format",
        "csv",
    ]);
    assert_eq!(out, "algo,bytes_sent_sum\noktopk,200\nring,600\n");
    // Mean keeps the range columns; max does not.
    let out = ok(&[
        "table",
        s(&f),
        "--by",
        "algo",
        "--metric",
        "bytes_sent",
        "--stat",
        "mean",
        "--format",
        "csv",
    ]);
    assert_eq!(
        out,
        "algo,bytes_sent_mean,bytes_sent_min,bytes_sent_max\noktopk,50,30,70\nring,150,100,300\n"
    );
    let out = ok(&[
        "table",
        s(&f),
        "--by",
        "rank",
        "--metric",
        "bytes_sent",
        "--stat",
        "max",
    ]);
    let want = "\
| rank | bytes_sent (max) |
|-----:|-----------------:|
|    0 |              100 |
|    1 |              300 |
";
    assert_eq!(out, want);
}

#[test]
fn table_last_step_and_json() {
    let d = tempfile::tempdir().unwrap();
    let f = write_metrics(d.path(), "t.parquet", &train_rows());
    let out = ok(&[
        "table",
        s(&f),
        "--by",
        "run",
        "--metric",
        "loss",
        "--stat",
        "last",
        "--format",
        "csv",
    ]);
    assert_eq!(out, "run,loss_last\nalpha-run,0.6\nbeta-run,0.25\n");
    let out = ok(&[
        "table",
        s(&f),
        "--by",
        "run",
        "--metric",
        "accuracy",
        "--stat",
        "last",
        "--format",
        "json",
    ]);
    assert_eq!(
        out,
        "[\n  {\"run\": \"alpha-run\", \"accuracy_last\": 0.3}\n]\n"
    );
}

#[test]
fn volume_measured_vs_model() {
    let d = tempfile::tempdir().unwrap();
    let f1 = write_metrics(d.path(), "a.parquet", &comm_rows());
    let f2 = write_metrics(d.path(), "b.parquet", &ring4_rows());
    let f3 = write_metrics(d.path(), "model.parquet", &model_rows());
    let out = ok(&["volume", s(&f1), s(&f2), s(&f3), "--format", "csv"]);
    let want = "\
algo,world_size,bytes_sent,bytes_sent_min,bytes_sent_max,model_bytes_sent,ratio
oktopk,2,50,30,70,40,1.25
ring,2,100,100,300,100,1.00
ring,4,200,200,200,-,-
";
    assert_eq!(out, want);
    let out = ok(&["volume", s(&f1), s(&f3), "--phases", "--by", "algo"]);
    let want = "\
| algo   | phase                  | bytes_sent | bytes_sent_min | bytes_sent_max | model_bytes_sent | ratio |
|--------|------------------------|-----------:|---------------:|---------------:|-----------------:|------:|
| oktopk | total                  |         50 |             30 |             70 |               40 |  1.25 |
| oktopk | split_and_reduce       |         20 |             10 |             30 |               20 |  1.00 |
| oktopk | balance_and_allgatherv |         30 |             20 |             40 |                - |     - |
| ring   | total                  |        100 |            100 |            300 |              100 |  1.00 |
";
    assert_eq!(out, want);
}

#[test]
fn volume_model_from_cost_module() {
    let d = tempfile::tempdir().unwrap();
    let f1 = write_metrics(d.path(), "a.parquet", &comm_rows());
    // n = 100, density 0.1 → k = 10. Ok-Topk Table 1 (worst): 6k(P−1)/P words = 30 words =
    // 120 bytes at P = 2; ring: 2n(P−1)/P words = 100 words = 400 bytes.
    let out = ok(&[
        "volume",
        s(&f1),
        "--n",
        "100",
        "--density",
        "0.1",
        "--format",
        "csv",
    ]);
    let want = "\
algo,world_size,bytes_sent,bytes_sent_min,bytes_sent_max,model_bytes_sent,ratio
oktopk,2,50,30,70,120,0.42
ring,2,100,100,300,400,0.25
";
    assert_eq!(out, want);
    // Model rows in the input win over computed ones.
    let f3 = write_metrics(d.path(), "model.parquet", &model_rows());
    let out = ok(&[
        "volume",
        s(&f1),
        s(&f3),
        "--n",
        "100",
        "--density",
        "0.1",
        "--format",
        "csv",
    ]);
    assert!(out.contains("oktopk,2,50,30,70,40,1.25\n"), "{out}");
    assert!(out.contains("ring,2,100,100,300,100,1.00\n"), "{out}");
}

#[test]
fn tensor_stats() {
    let d = tempfile::tempdir().unwrap();
    let f = tensor_file(d.path());
    let out = ok(&["tensor", s(&f), "--step", "0", "--format", "csv"]);
    let want = "\
step,rank,layer_id,layer,numel,kind,nnz,density,l2
0,0,0,fc.weight,4,dense,2,0.5,5
0,0,1,fc.bias,10,sparse,1,0.1,1
";
    assert_eq!(out, want);
    let out = ok(&["tensor", s(&f), "--step", "1", "--format", "csv"]);
    assert_eq!(
        out,
        "step,rank,layer_id,layer,numel,kind,nnz,density,l2\n1,0,0,fc.weight,4,dense,4,1,2\n"
    );
}

#[test]
fn bad_input_is_one_line_error() {
    let d = tempfile::tempdir().unwrap();
    let t = tensor_file(d.path());
    let f = write_metrics(d.path(), "m.parquet", &comm_rows());
    let e = fails(&["table", s(&t)]);
    assert!(
        e.contains("tensor/1") && e.contains("metrics/1") && e.contains("t.parquet"),
        "{e}"
    );
    let e = fails(&["tensor", s(&f)]);
    assert!(e.contains("metrics/1") && e.contains("tensor/1"), "{e}");
    let e = fails(&["table", s(&f), "--metric", "loss"]);
    assert!(
        e.contains("no rows for metric `loss`") && e.contains("bytes_sent"),
        "{e}"
    );
    let e = fails(&["table", s(&f), "--metric", "loss:*"]);
    assert!(e.contains("`loss`"), "{e}");
    let e = fails(&["table", s(&f), "--by", "colour"]);
    assert!(e.contains("colour") && e.contains("--by"), "{e}");
    let e = fails(&["volume", s(&f), "--metric", "bytes_recv"]);
    assert!(e.contains("bytes_recv"), "{e}");
    let e = fails(&["table", s(&d.path().join("absent.parquet"))]);
    assert!(e.contains("absent.parquet"), "{e}");
    let junk = d.path().join("junk.parquet");
    std::fs::write(&junk, b"not parquet").unwrap();
    let e = fails(&["table", s(&junk)]);
    assert!(e.contains("not a Parquet file"), "{e}");
    // A figure that cannot be drawn leaves no file behind.
    let svg = d.path().join("loss.svg");
    let e = fails(&["plot", "loss", s(&f), "-o", s(&svg)]);
    assert!(e.contains("no rows for metric `loss`"), "{e}");
    assert!(std::fs::read_dir(d.path()).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains(".svg")));
    // Usage errors are clap's: exit 2.
    assert_eq!(
        run(&["plot", "pie", s(&f), "-o", "x.svg"]).status.code(),
        Some(2)
    );
}

/// The SVG parses as XML; returns the text of every `<text>` element.
fn svg_texts(path: &Path) -> Vec<String> {
    let src = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&src).expect("SVG is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.tag_name().name() == "text")
        .filter_map(|n| n.text().map(|t| t.trim().to_string()))
        .collect()
}

fn has(texts: &[String], want: &str) -> bool {
    texts.iter().any(|t| t == want)
}

#[test]
fn plot_loss_svg() {
    let d = tempfile::tempdir().unwrap();
    let f = write_metrics(d.path(), "t.parquet", &train_rows());
    let svg = d.path().join("loss.svg");
    ok(&["plot", "loss", s(&f), "-o", s(&svg)]);
    let t = svg_texts(&svg);
    for want in [
        "alpha-run",
        "beta-run",
        "step (iterations)",
        "loss (unitless)",
        "accuracy (fraction)",
    ] {
        assert!(has(&t, want), "missing `{want}` in {t:?}");
    }
}

#[test]
fn plot_breakdown_svg() {
    let d = tempfile::tempdir().unwrap();
    let f = write_metrics(d.path(), "b.parquet", &breakdown_rows());
    let svg = d.path().join("b.svg");
    ok(&["plot", "breakdown", s(&f), "-o", s(&svg)]);
    let t = svg_texts(&svg);
    // Tallest bar 30 ms → the axis is in milliseconds.
    for want in [
        "compute",
        "select",
        "comm",
        "dense",
        "topka",
        "time per step (ms)",
        "algorithm",
    ] {
        assert!(has(&t, want), "missing `{want}` in {t:?}");
    }
}

#[test]
fn plot_volume_and_scaling_svg() {
    let d = tempfile::tempdir().unwrap();
    let f1 = write_metrics(d.path(), "a.parquet", &comm_rows());
    let f2 = write_metrics(d.path(), "b.parquet", &ring4_rows());
    let mut model = model_rows();
    for (p, b, t) in [(4, 150.0, 1e-4), (8, 175.0, 2e-4), (256, 199.2, 8e-3)] {
        model.push(m("model", "ring", p, 0, 0, "model_bytes_sent", b));
        model.push(m("model", "ring", p, 0, 0, "model_time_s", t));
    }
    model.push(m("model", "ring", 2, 0, 0, "model_time_s", 5e-5));
    let f3 = write_metrics(d.path(), "model.parquet", &model);
    let svg = d.path().join("v.svg");
    ok(&["plot", "volume", s(&f1), s(&f2), s(&f3), "-o", s(&svg)]);
    let t = svg_texts(&svg);
    for want in [
        "ring (model)",
        "ring (measured)",
        // oktopk's one run, `o1`, names its series (labels come from --run).
        "o1 (measured)",
        "ranks P (log scale)",
        "256",
    ] {
        assert!(has(&t, want), "missing `{want}` in {t:?}");
    }
    assert!(t.iter().any(|x| x.contains("(bytes, log scale)")), "{t:?}");
    let svg = d.path().join("s.svg");
    ok(&["plot", "scaling", s(&f3), "-o", s(&svg)]);
    let t = svg_texts(&svg);
    assert!(has(&t, "ring"), "{t:?}");
    assert!(
        t.iter().any(|x| x.contains("(seconds, log scale)")),
        "{t:?}"
    );
    // Scaling needs the model's rows, or --n to compute them (projected to 256 ranks).
    let e = fails(&["plot", "scaling", s(&f1), "-o", s(&svg)]);
    assert!(e.contains("model_time_s") && e.contains("--n"), "{e}");
    let svg = d.path().join("s2.svg");
    ok(&[
        "plot",
        "scaling",
        s(&f1),
        "--n",
        "100",
        "--density",
        "0.1",
        "-o",
        s(&svg),
    ]);
    let t = svg_texts(&svg);
    // Each algorithm's series is named by its one run (o1, r1).
    for want in ["o1", "r1", "256"] {
        assert!(has(&t, want), "missing `{want}` in {t:?}");
    }
}

/// The environment variables gradkit reads are checked like flags, here too (where
/// `GRADKIT_COMM_TIMEOUT` has no effect, and `GRADKIT_MAX_MEMORY` may have none): a usage
/// error naming the variable and its values.
#[test]
fn a_bad_environment_variable_is_a_usage_error() {
    let d = tempfile::tempdir().unwrap();
    let m = write_metrics(d.path(), "m.parquet", &comm_rows());
    for (var, v, accepts) in gradkit_testkit::cli::BAD_ENV {
        gradkit_testkit::cli::env_refused(
            env!("CARGO_BIN_EXE_gradreport"),
            d.path(),
            &["table", s(&m)],
            var,
            v,
            accepts,
        );
    }
}

/// The median of a slice, written apart from gradreport's (mean of the middle two when even).
fn median_ref(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[test]
fn table_per_file_is_the_median_over_repeats_of_each_repeats_statistic() {
    let d = tempfile::tempdir().unwrap();
    // Three repeats of one run at P = 4 (time per step, rank 0), and a P = 8 run only in two.
    let reps: [&[f64]; 3] = [
        &[1.0, 2.0, 3.0],
        &[10.0, 20.0, 30.0, 40.0],
        &[5.0, 5.0, 6.0],
    ];
    let p8: [&[f64]; 2] = [&[7.0, 9.0], &[3.0]];
    let mut files = Vec::new();
    for (i, r) in reps.iter().enumerate() {
        let mut rows: Vec<MetricRow> = (r.iter().enumerate())
            .map(|(s, &v)| m("sel", "deft", 4, s as u32, 0, "time_s", v))
            .collect();
        if let Some(q) = p8.get(i) {
            rows.extend(
                (q.iter().enumerate()).map(|(s, &v)| m("sel", "deft", 8, s as u32, 0, "time_s", v)),
            );
        }
        files.push(write_metrics(d.path(), &format!("r{i}.parquet"), &rows));
    }
    let mut args = vec!["table"];
    args.extend(files.iter().map(|f| s(f)));
    args.extend(["--per-file", "--by", "world_size", "--format", "csv"]);
    let out = ok(&args);
    // Reference: each repeat's median over its steps, then median, min and max over the repeats.
    let line = |p: u32, per: Vec<f64>| {
        let lo = per.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = per.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{p},{},{lo},{hi}", median_ref(&per))
    };
    let want = format!(
        "world_size,time_s,time_s_min,time_s_max\n{}\n{}\n",
        line(4, reps.iter().map(|r| median_ref(r)).collect()),
        line(8, p8.iter().map(|r| median_ref(r)).collect())
    );
    assert_eq!(out, want);
    // The pooled median of every sample (no --per-file) is another number: the option matters.
    let pooled: Vec<f64> = reps.iter().flat_map(|r| r.iter().copied()).collect();
    assert_ne!(
        median_ref(&pooled),
        median_ref(&reps.iter().map(|r| median_ref(r)).collect::<Vec<_>>())
    );
    // --stat sum per repeat, then the median of the sums; Markdown shows the repeats' range.
    let mut args = vec!["table"];
    args.extend(files.iter().map(|f| s(f)));
    args.extend(["--per-file", "--by", "world_size", "--stat", "sum"]);
    let out = ok(&args);
    let sums: Vec<f64> = reps.iter().map(|r| r.iter().sum()).collect();
    assert!(
        out.contains(&format!("| {} (6–100)", median_ref(&sums))),
        "{out}"
    );
    // One file is not a set of repeats.
    let e = fails(&["table", s(&files[0]), "--per-file"]);
    assert!(e.contains("--per-file") && e.lines().count() == 1, "{e}");
}

/// `path` with its footer rewritten by the parquet crate's metadata writer: row group 0 claims
/// `rows` rows (the data pages untouched).
fn claim_rows(path: &Path, rows: i64) {
    use parquet::file::metadata::{ParquetMetaDataReader, ParquetMetaDataWriter};
    let bytes = std::fs::read(path).unwrap();
    let n = bytes.len();
    let footer_len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    let start = n - 8 - footer_len;
    let meta = ParquetMetaDataReader::decode_metadata(&bytes[start..n - 8]).unwrap();
    let mut groups = meta.row_groups().to_vec();
    groups[0] = groups[0]
        .clone()
        .into_builder()
        .set_num_rows(rows)
        .build()
        .unwrap();
    let meta = meta.into_builder().set_row_groups(groups).build();
    let mut out = bytes[..start].to_vec();
    ParquetMetaDataWriter::new(&mut out, &meta)
        .finish()
        .unwrap();
    std::fs::write(path, out).unwrap();
}

/// A commtrace/1 recording of one 2-rank exchange of `bytes` each way, world `world`.
fn recording(path: &Path, world: usize, bytes: u64) {
    use gradkit_core::{CommRow, EventKind};
    let ev = |rank: u32, event: u64, kind: EventKind| CommRow {
        step: 0,
        rank,
        event,
        call: 0,
        kind,
        peer: 1 - rank,
        tag: 0,
        seq: 0,
        bytes,
        fixed_bytes: 0,
        phase: "p".into(),
        label: "x".into(),
        start_s: 0.0,
        end_s: 1e-3,
    };
    let rows = vec![
        ev(0, 0, EventKind::Send),
        ev(0, 1, EventKind::Recv),
        ev(1, 0, EventKind::Send),
        ev(1, 1, EventKind::Recv),
    ];
    gradkit_core::write_comm_trace(path, Meta::default(), world, &rows).unwrap();
}

#[test]
fn a_footer_claiming_more_rows_than_the_file_holds_is_one_line() {
    let d = tempfile::tempdir().unwrap();
    let f = write_metrics(d.path(), "m.parquet", &comm_rows());
    let rec = d.path().join("rec.parquet");
    recording(&rec, 2, 64);
    let svg = d.path().join("fig.svg");
    // 10^12 rows: more than the file's bytes can encode; one more than there is: found when
    // the rows are read. Either names the file and the footer field.
    for claim in [1_000_000_000_000i64, comm_rows().len() as i64 + 1] {
        claim_rows(&f, claim);
        for args in [
            vec!["table", s(&f)],
            vec!["plot", "breakdown", s(&f), "-o", s(&svg)],
        ] {
            let e = fails(&args);
            assert!(e.contains("m.parquet") && e.contains("num_rows"), "{e}");
        }
        assert!(!svg.exists());
    }
    claim_rows(&rec, 1_000_000_000_000);
    let o = run(&["simulate", s(&rec)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("rec.parquet") && err.contains("num_rows"),
        "{err}"
    );
}

#[test]
fn a_world_of_10_12_ranks_is_one_line_and_leaves_no_temporary_directory() {
    let d = tempfile::tempdir().unwrap();
    let rec = d.path().join("rec.parquet");
    recording(&rec, 1_000_000_000_000, 64);
    let tmp = d.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_gradreport"))
        .args(["simulate", s(&rec)])
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("rec.parquet") && err.contains("gradkit.world_size"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0);
}

#[test]
fn table_by_step_groups_every_step_as_a_brute_force_grouping() {
    let d = tempfile::tempdir().unwrap();
    // 3,000 steps × 3 ranks, values from a fixed pseudo-random sequence.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rows = Vec::new();
    for step in (0..3000u32).rev() {
        for rank in 0..3 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = (x % 1000) as f64;
            rows.push(m("r", "ring", 3, step, rank, "time_comm_s", v));
        }
    }
    let f = write_metrics(d.path(), "m.parquet", &rows);
    let out = ok(&["table", s(&f), "--by", "step", "--format", "csv"]);
    // The reference: every step's three samples found by a scan of all rows, sorted by hand.
    let mut want = String::from("step,time_comm_s,time_comm_s_min,time_comm_s_max\n");
    for step in 0..3000u32 {
        let mut v: Vec<f64> = rows
            .iter()
            .filter(|r| r.step == step)
            .map(|r| r.value)
            .collect();
        v.sort_by(f64::total_cmp);
        assert_eq!(v.len(), 3);
        want.push_str(&format!("{step},{},{},{}\n", v[1], v[0], v[2]));
    }
    assert_eq!(out, want);
    // Markdown holds the same numbers, one line per step.
    let md = ok(&["table", s(&f), "--by", "step"]);
    assert_eq!(md.lines().count(), 3002);
    // The rows need more memory than a limit of 1 MiB: refused, naming the limit.
    let o = Command::new(env!("CARGO_BIN_EXE_gradreport"))
        .args(["table", s(&f), "--by", "step"])
        .env("GRADKIT_MAX_MEMORY", "1M")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("GRADKIT_MAX_MEMORY") && err.contains("m.parquet"),
        "{err}"
    );
}

#[test]
fn plot_with_an_unwritable_csv_writes_no_figure() {
    let d = tempfile::tempdir().unwrap();
    let f = write_metrics(d.path(), "train.parquet", &train_rows());
    let svg = d.path().join("loss.svg");
    let csv = d.path().join("absent").join("loss.csv");
    let e = fails(&[
        "plot",
        "loss",
        s(&f),
        "-o",
        s(&svg),
        "--also",
        "png",
        "--csv",
        s(&csv),
    ]);
    assert!(e.contains("--csv") && e.contains("absent"), "{e}");
    let names: Vec<String> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["train.parquet"]);
}
