//! Figures for papers: the legend beside the data, a legend entry only for what is drawn,
//! PDF and PNG beside SVG, the loss plot against wall time or bytes with smoothing, the
//! plotted data as CSV (checked against the input rows, summed here), and labels from `run`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output as ProcOut};

use gradkit_core::{write_table, Meta, MetricRow, Output};

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

fn write_metrics(dir: &Path, name: &str, rows: &[MetricRow]) -> PathBuf {
    let p = dir.join(name);
    write_table(&Output::Path(p.clone()), &Meta::producer("test"), rows).unwrap();
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
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Two training runs: `a` on 2 ranks for 6 steps, `b` on 2 ranks for 4; loss, the four time
/// phases and bytes per (step, rank), and one evaluation of `a` at its last step.
fn train_rows() -> Vec<MetricRow> {
    let mut v = Vec::new();
    for (run, steps) in [("a", 6u32), ("b", 4)] {
        for step in 0..steps {
            for rank in 0..2u32 {
                let f = (step + 1) as f64;
                let loss = 3.0 / f + 0.1 * rank as f64 + if step % 2 == 1 { 0.2 } else { 0.0 };
                v.push(m(run, "dense", 2, step, rank, "loss", loss));
                v.push(m(run, "dense", 2, step, rank, "time_compute_s", 0.01 * f));
                v.push(m(run, "dense", 2, step, rank, "time_select_s", 0.001));
                v.push(m(
                    run,
                    "dense",
                    2,
                    step,
                    rank,
                    "time_comm_s",
                    0.002 * (rank + 1) as f64,
                ));
                v.push(m(run, "dense", 2, step, rank, "time_update_s", 0.0005));
                v.push(m(
                    run,
                    "dense",
                    2,
                    step,
                    rank,
                    "bytes_sent",
                    1000.0 + 10.0 * rank as f64,
                ));
            }
        }
    }
    v.push(m("a", "dense", 2, 5, 0, "eval_accuracy", 0.8));
    v
}

/// A `<text>` or drawn element of the SVG, in document order.
#[derive(Debug)]
struct El {
    tag: String,
    text: String,
    x: f64,
    color: String,
    filled: bool,
    points: usize,
}

fn elements(path: &Path) -> Vec<El> {
    let src = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&src).expect("SVG is well-formed XML");
    let num = |n: roxmltree::Node, a: &str| {
        n.attribute(a)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    doc.descendants()
        .filter(|n| n.is_element())
        .map(|n| {
            let fill = n.attribute("fill").unwrap_or("none");
            let stroke = n.attribute("stroke").unwrap_or("none");
            let pts = n
                .attribute("points")
                .map(|p| {
                    let mut v: Vec<&str> = p.split_whitespace().collect();
                    v.dedup();
                    v.len()
                })
                .unwrap_or(0);
            El {
                tag: n.tag_name().name().to_string(),
                text: n.text().unwrap_or("").trim().to_string(),
                x: num(n, "x").max(num(n, "cx")).max(num(n, "x1")),
                color: if fill != "none" { fill } else { stroke }.to_string(),
                filled: fill != "none",
                points: pts,
            }
        })
        .collect()
}

/// The right edge of the plot area: the rightmost grid line.
fn plot_right(els: &[El], src: &str) -> f64 {
    let doc = roxmltree::Document::parse(src).unwrap();
    doc.descendants()
        .filter(|n| n.tag_name().name() == "line")
        .filter_map(|n| n.attribute("x2").and_then(|v| v.parse::<f64>().ok()))
        .fold(f64::MIN, f64::max)
        .max(
            els.iter()
                .filter(|e| e.tag == "circle")
                .fold(0.0, |a, e| a.max(e.x)),
        )
}

/// Legend entries: (swatch, label) — a text naming a series right after its swatch.
fn legend<'a>(els: &'a [El], labels: &[&str]) -> Vec<(&'a El, &'a El)> {
    els.windows(2)
        .filter(|w| w[1].tag == "text" && labels.contains(&w[1].text.as_str()))
        .map(|w| (&w[0], &w[1]))
        .collect()
}

#[test]
fn legend_beside_the_data() {
    let d = tempfile::tempdir().unwrap();
    let f = write_metrics(d.path(), "t.parquet", &train_rows());
    let svg = d.path().join("loss.svg");
    ok(&["plot", "loss", s(&f), "-o", s(&svg)]);
    let els = elements(&svg);
    let right = plot_right(&els, &std::fs::read_to_string(&svg).unwrap());
    let entries = legend(&els, &["a", "b"]);
    assert_eq!(entries.len(), 2, "{els:?}");
    for (_, label) in entries {
        assert!(
            label.x > right,
            "legend label `{}` at x={} is inside the plot (right edge {right})",
            label.text,
            label.x
        );
    }
}

#[test]
fn every_legend_entry_is_drawn() {
    // One P: the model's "lines" are single points; each entry must have a mark of its kind
    // and colour in the plot, other than the swatches.
    let d = tempfile::tempdir().unwrap();
    let mut rows = Vec::new();
    for (algo, b, model) in [("ring", 300.0, 300.0), ("topka", 40.0, 40.0)] {
        for rank in 0..4 {
            rows.push(m(algo, algo, 4, 0, rank, "bytes_sent", b));
        }
        rows.push(m(algo, algo, 4, 0, 0, "model_bytes_sent", model));
    }
    let f = write_metrics(d.path(), "v.parquet", &rows);
    let svg = d.path().join("v.svg");
    ok(&["plot", "volume", s(&f), "-o", s(&svg)]);
    let els = elements(&svg);
    let labels = [
        "ring (model)",
        "ring (measured)",
        "topka (model)",
        "topka (measured)",
    ];
    let entries = legend(&els, &labels);
    let swatches: Vec<*const El> = entries.iter().map(|(sw, _)| *sw as *const El).collect();
    let kind = |e: &El| match e.tag.as_str() {
        "polyline" | "line" | "path" if e.points >= 2 || e.tag == "line" => "line",
        "circle" if e.filled => "dot",
        "circle" => "ring",
        "rect" => "bar",
        _ => "none",
    };
    for (sw, label) in &entries {
        let drawn = els.iter().any(|e| {
            !swatches.contains(&(e as *const El))
                && kind(e) == kind(sw)
                && e.color == sw.color
                && (e.tag != "polyline" || e.points >= 2)
        });
        assert!(
            drawn,
            "legend entry `{}` ({}, {}) has nothing drawn",
            label.text,
            kind(sw),
            sw.color
        );
    }
}

#[test]
fn pdf_and_png_beside_svg() {
    let d = tempfile::tempdir().unwrap();
    let f = write_metrics(d.path(), "t.parquet", &train_rows());
    let pdf = d.path().join("loss.pdf");
    ok(&["plot", "loss", s(&f), "-o", s(&pdf), "--also", "svg,png"]);
    let b = std::fs::read(&pdf).unwrap();
    assert!(b.starts_with(b"%PDF-1."), "not a PDF");
    assert!(b.ends_with(b"%%EOF\n"));
    let text = String::from_utf8_lossy(&b);
    assert!(text.contains("/BaseFont /Helvetica"));
    assert!(text.contains("(loss \\(unitless\\)) Tj"), "axis label");
    assert!(text.contains("(step \\(iterations\\)) Tj"));
    // Every object the cross-reference table names starts where it says.
    let xref = text.rfind("xref\n").unwrap();
    for (i, line) in text[xref..].lines().skip(3).take(5).enumerate() {
        let off: usize = line[..10].parse().unwrap();
        assert!(
            text[off..].starts_with(&format!("{} 0 obj", i + 1)),
            "object {}",
            i + 1
        );
    }
    let png = std::fs::read(d.path().join("loss.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert_eq!(&png[12..16], b"IHDR");
    let w = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!((w, h), (1800, 1120), "twice the SVG's 900x560");
    assert!(d.path().join("loss.svg").is_file());
    // A bad format is a usage error, and nothing is written.
    let e = run(&["plot", "loss", s(&f), "-o", s(&d.path().join("x.jpg"))]);
    assert_eq!(
        e.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&e.stderr)
    );
    assert!(!d.path().join("x.jpg").exists());
}

fn read_csv(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Expected (x, loss median) per step of `run` for `--x time` and `--x bytes`, from the rows.
fn expected(rows: &[MetricRow], run: &str, x: &str) -> Vec<(f64, f64)> {
    let steps: std::collections::BTreeSet<u32> = rows
        .iter()
        .filter(|r| r.run == run && r.metric == "loss")
        .map(|r| r.step)
        .collect();
    let mut acc = 0.0;
    let mut out = Vec::new();
    for s in steps {
        let at = |metric: &str, rank: u32| {
            rows.iter()
                .filter(|r| r.run == run && r.step == s && r.rank == rank && r.metric == metric)
                .map(|r| r.value)
                .sum::<f64>()
        };
        let inc = match x {
            "time" => (0..2)
                .map(|rk| {
                    [
                        "time_compute_s",
                        "time_select_s",
                        "time_comm_s",
                        "time_update_s",
                    ]
                    .iter()
                    .map(|p| at(p, rk))
                    .sum::<f64>()
                })
                .fold(0.0, f64::max),
            _ => median((0..2).map(|rk| at("bytes_sent", rk)).collect()),
        };
        acc += inc;
        out.push((acc, median((0..2).map(|rk| at("loss", rk)).collect())));
    }
    out
}

#[test]
fn loss_against_time_and_bytes_with_smoothing_as_csv() {
    let d = tempfile::tempdir().unwrap();
    let rows = train_rows();
    let f = write_metrics(d.path(), "t.parquet", &rows);
    for x in ["time", "bytes"] {
        let svg = d.path().join(format!("{x}.svg"));
        let csv = d.path().join(format!("{x}.csv"));
        let args = [
            "plot",
            "loss",
            s(&f),
            "--x",
            x,
            "--smooth",
            "3",
            "--csv",
            s(&csv),
        ];
        ok(&[&args[..], &["-o", s(&svg)]].concat());
        let t = read_csv(&csv);
        assert_eq!(
            t[0],
            ["panel", "series", "x", "y", "y_min", "y_max", "y_smooth"]
        );
        for run in ["a", "b"] {
            let got: Vec<&Vec<String>> = t[1..]
                .iter()
                .filter(|r| r[0] == "loss" && r[1] == run)
                .collect();
            let want = expected(&rows, run, x);
            assert_eq!(got.len(), want.len(), "{x} {run}");
            for (i, (g, (wx, wy))) in got.iter().zip(&want).enumerate() {
                let (gx, gy): (f64, f64) = (g[2].parse().unwrap(), g[3].parse().unwrap());
                assert!(
                    (gx - wx).abs() <= 1e-12 * wx.abs().max(1.0),
                    "{x} {run} x {gx} vs {wx}"
                );
                assert!((gy - wy).abs() <= 1e-12, "{x} {run} y {gy} vs {wy}");
                // Trailing mean of up to 3 points.
                let lo = i.saturating_sub(2);
                let mean = want[lo..=i].iter().map(|p| p.1).sum::<f64>() / (i - lo + 1) as f64;
                let gs: f64 = g[6].parse().unwrap();
                assert!((gs - mean).abs() <= 1e-12, "smoothed {gs} vs {mean}");
            }
        }
        let els = elements(&svg);
        let axis = if x == "time" {
            "wall time (s)"
        } else {
            "bytes sent per rank, cumulative (bytes)"
        };
        assert!(els.iter().any(|e| e.text == axis), "no x label `{axis}`");
    }
}

#[test]
fn one_panel_when_accuracy_is_one_point() {
    let d = tempfile::tempdir().unwrap();
    let f = write_metrics(d.path(), "t.parquet", &train_rows());
    let svg = d.path().join("loss.svg");
    let err = ok(&["plot", "loss", s(&f), "-o", s(&svg)]);
    let els = elements(&svg);
    assert!(
        !els.iter().any(|e| e.text.starts_with("eval_accuracy")),
        "a panel for one accuracy point"
    );
    assert!(err.contains("eval_accuracy"), "a note says why: {err}");
}

#[test]
fn volume_csv_and_labels_from_run() {
    let d = tempfile::tempdir().unwrap();
    let mut rows = Vec::new();
    for (p, bytes) in [(2u32, [10.0, 30.0]), (4, [50.0, 70.0])] {
        for (rank, b) in bytes.iter().enumerate() {
            rows.push(m(
                "onebit-adam",
                "onebit",
                p,
                0,
                rank as u32,
                "bytes_sent",
                *b,
            ));
            rows.push(m(
                "onebit-adam",
                "onebit",
                p,
                1,
                rank as u32,
                "bytes_sent",
                b + 1.0,
            ));
        }
    }
    let f = write_metrics(d.path(), "v.parquet", &rows);
    let (svg, csv) = (d.path().join("v.svg"), d.path().join("v.csv"));
    ok(&["plot", "volume", s(&f), "-o", s(&svg), "--csv", s(&csv)]);
    let els = elements(&svg);
    assert!(
        els.iter().any(|e| e.text == "onebit-adam (measured)"),
        "{els:?}"
    );
    let t = read_csv(&csv);
    // P=2: samples 10, 30, 11, 31 → median 20.5, min 10, max 31.
    let p2: Vec<&Vec<String>> = t.iter().filter(|r| r[2] == "2").collect();
    assert_eq!(p2.len(), 1, "{t:?}");
    assert_eq!(p2[0][1], "onebit-adam (measured)");
    assert_eq!(&p2[0][3..6], ["20.5", "10", "31"]);
}
