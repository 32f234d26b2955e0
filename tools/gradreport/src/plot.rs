//! `gradreport plot`: SVG figures from `metrics/1` rows, drawn with plotters' SVG backend.
//!
//! Text is written as SVG `<text>` elements (plotters without `ttf`: no font library is
//! needed to build, and any SVG viewer renders the text with its own sans-serif font).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use gradkit_core::MetricRow;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::metrics::{self, Col, Stat};

/// Which figure to draw.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Loss (and accuracy, when present) vs step, one line per run
    Loss,
    /// Stacked compute / select / comm time per step, one bar per algorithm and P
    Breakdown,
    /// Bytes per rank and step vs P, measured points on the cost model's lines (log-log)
    Volume,
    /// The cost model's projected time per step vs P, one line per algorithm (log-log)
    Scaling,
}

/// Options of `gradreport plot`.
#[derive(Clone, Debug)]
pub struct PlotOpts {
    pub kind: Kind,
    /// Metric expressions overriding the kind's default metrics.
    pub metrics: Option<Vec<String>>,
    pub title: Option<String>,
    pub width: u32,
    pub height: u32,
}

impl PlotOpts {
    pub fn new(kind: Kind) -> Self {
        PlotOpts {
            kind,
            metrics: None,
            title: None,
            width: 900,
            height: 560,
        }
    }
}

/// The default metrics of the breakdown figure, bottom to top of each bar.
pub const BREAKDOWN: &[&str] = &["time_compute_s", "time_select_s", "time_comm_s"];

/// Draws the figure and returns the SVG text.
pub fn plot(rows: &[MetricRow], opts: &PlotOpts) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (opts.width, opts.height)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        match opts.kind {
            Kind::Loss => loss(&root, rows, opts)?,
            Kind::Breakdown => breakdown(&root, rows, opts)?,
            Kind::Volume => volume(&root, rows, opts)?,
            Kind::Scaling => scaling(&root, rows, opts)?,
        }
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

/// Writes `svg` to `path` through a temporary file renamed into place.
pub fn write_svg(path: &Path, svg: &str) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let res = std::fs::write(&tmp, svg)
        .with_context(|| format!("cannot write {}", tmp.display()))
        .and_then(|_| {
            std::fs::rename(&tmp, path)
                .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
        });
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

fn draw_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the figure: {e:?}")
}

/// Tableau 10: distinct colours that stay readable in print.
const PALETTE: [RGBColor; 10] = [
    RGBColor(78, 121, 167),
    RGBColor(242, 142, 43),
    RGBColor(225, 87, 89),
    RGBColor(118, 183, 178),
    RGBColor(89, 161, 79),
    RGBColor(237, 201, 72),
    RGBColor(176, 122, 161),
    RGBColor(255, 157, 167),
    RGBColor(156, 117, 95),
    RGBColor(186, 176, 172),
];

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

const FONT: &str = "sans-serif";

/// The y-axis description of a metric, with its unit.
pub fn axis_label(metric: &str, values: &[f64]) -> String {
    let base = metrics::base_name(metric);
    let base = base.strip_prefix("model_").unwrap_or(base);
    match base {
        "loss" => format!("{metric} (unitless)"),
        "accuracy" if values.iter().any(|v| *v > 1.0) => format!("{metric} (%)"),
        "accuracy" => format!("{metric} (fraction)"),
        "lr" => format!("{metric} (learning rate, unitless)"),
        "bytes_sent" | "bytes_recv" => format!("{metric} (bytes)"),
        "messages" => format!("{metric} (count)"),
        "nnz" => format!("{metric} (values)"),
        "threshold" => format!("{metric} (|gradient value|)"),
        b if b.ends_with("_s") => format!("{metric} (s)"),
        _ => format!("{metric} (as recorded)"),
    }
}

/// A range with 5 % padding (and some width when all values are equal).
fn padded(lo: f64, hi: f64) -> std::ops::Range<f64> {
    let span = hi - lo;
    if span <= 0.0 || !span.is_finite() {
        let d = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        return lo - d..hi + d;
    }
    lo - 0.05 * span..hi + 0.05 * span
}

/// A log range that contains at least one power of `base` at each end, so ticks are drawn.
fn log_range(lo: f64, hi: f64, base: f64) -> std::ops::Range<f64> {
    let lo_p = base.powf((lo.ln() / base.ln()).floor());
    let mut hi_p = base.powf((hi.ln() / base.ln()).ceil());
    if hi_p <= lo_p {
        hi_p = lo_p * base;
    }
    lo_p..hi_p
}

/// `1.5 kB`, `20 MB`: SI prefixes (powers of 1000), three significant digits.
pub fn si(v: f64, unit: &str) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v} {unit}");
    }
    let prefixes = [
        (1e12, "T"),
        (1e9, "G"),
        (1e6, "M"),
        (1e3, "k"),
        (1.0, ""),
        (1e-3, "m"),
        (1e-6, "µ"),
        (1e-9, "n"),
    ];
    let (scale, p) = prefixes
        .iter()
        .find(|(s, _)| v.abs() >= *s * 0.9995)
        .copied()
        .unwrap_or((1e-9, "n"));
    format!("{} {p}{unit}", short(v / scale))
}

/// A number with at most three significant digits and no trailing zeros.
fn short(v: f64) -> String {
    let s = gradkit_core::cli::fmt_num(v, 3);
    if s.contains('.') && !s.contains('e') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A tick label for an integer axis (steps, ranks): blank between integers.
fn integer_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        String::new()
    }
}

/// Labels of curves: `run` when run names identify the curves, else `run (algo P=N)`.
fn curve_label(
    labels: &std::collections::HashMap<(String, String, u32), String>,
    r: &MetricRow,
) -> String {
    labels
        .get(&(r.run.clone(), r.algo.clone(), r.world_size))
        .cloned()
        .unwrap_or_else(|| r.run.clone())
}

fn loss(root: &DrawingArea<SVGBackend, Shift>, rows: &[MetricRow], opts: &PlotOpts) -> Result<()> {
    let names = match &opts.metrics {
        Some(m) => metrics::expand(rows, Some(m))?,
        None => {
            let mut v = metrics::expand(rows, Some(&["loss".to_string()]))?;
            if rows.iter().any(|r| r.metric == "accuracy") {
                v.push("accuracy".into());
            }
            v
        }
    };
    let labels = metrics::run_labels(rows);
    let panels = root.split_evenly((names.len(), 1));
    for (pi, (name, area)) in names.iter().zip(panels.iter()).enumerate() {
        let samples = metrics::samples(rows, name);
        let mut curves: BTreeMap<String, Vec<&MetricRow>> = BTreeMap::new();
        for r in &samples {
            curves.entry(curve_label(&labels, r)).or_default().push(r);
        }
        let curves: Vec<(String, Vec<(f64, f64)>)> = curves
            .into_iter()
            .map(|(l, v)| {
                let pts = metrics::per_step_median(&v)
                    .into_iter()
                    .map(|(s, y)| (s as f64, y))
                    .collect();
                (l, pts)
            })
            .collect();
        let xs = curves.iter().flat_map(|c| c.1.iter().map(|p| p.0));
        let ys: Vec<f64> = curves
            .iter()
            .flat_map(|c| c.1.iter().map(|p| p.1))
            .collect();
        let (xlo, xhi) = min_max(xs);
        let (ylo, yhi) = min_max(ys.iter().copied());
        let title = if pi == 0 {
            opts.title
                .clone()
                .unwrap_or_else(|| format!("{} vs step (median over ranks)", names.join(", ")))
        } else {
            String::new()
        };
        let mut builder = ChartBuilder::on(area);
        if !title.is_empty() {
            builder.caption(title, (FONT, 20));
        }
        let mut chart = builder
            .margin(12)
            .x_label_area_size(48)
            .y_label_area_size(80)
            .build_cartesian_2d(padded(xlo, xhi), padded(ylo, yhi))
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc("step (iterations)")
            .y_desc(axis_label(name, &ys))
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 15))
            .x_label_formatter(&|v| integer_label(*v))
            .y_label_formatter(&|v| short(*v))
            .draw()
            .map_err(draw_err)?;
        for (i, (label, pts)) in curves.iter().enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                .map_err(draw_err)?
                .label(label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
            if pts.len() == 1 {
                chart
                    .draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled())))
                    .map_err(draw_err)?;
            }
        }
        legend(&mut chart)?;
    }
    Ok(())
}

fn legend<'a, DB: DrawingBackend + 'a, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
) -> Result<()>
where
    X: plotters::coord::ranged1d::Ranged,
    Y: plotters::coord::ranged1d::Ranged,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(draw_err)
}

fn min_max(v: impl Iterator<Item = f64>) -> (f64, f64) {
    v.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    })
}

/// The short name of a time component: `time_comm_s` → `comm`.
fn component_name(metric: &str) -> String {
    let (base, phase) = match metric.split_once(':') {
        Some((b, p)) => (b, Some(p)),
        None => (metric, None),
    };
    let short = base
        .strip_prefix("time_")
        .and_then(|b| b.strip_suffix("_s"))
        .unwrap_or(base);
    match phase {
        Some(p) => format!("{short}:{p}"),
        None => short.to_string(),
    }
}

/// Bar labels: `algo`, or `algo P=N` when the input has several world sizes.
fn bar_labels(keys: &[metrics::Key]) -> Vec<String> {
    let sizes: BTreeSet<&metrics::KeyPart> = keys.iter().map(|k| &k[1]).collect();
    keys.iter()
        .map(|k| {
            if sizes.len() > 1 {
                format!("{} P={}", k[0], k[1])
            } else {
                k[0].to_string()
            }
        })
        .collect()
}

/// Seconds in the unit that keeps the largest bar between 1 and 1000.
fn time_unit(max_s: f64) -> (f64, &'static str) {
    if max_s >= 1.0 {
        (1.0, "s")
    } else if max_s >= 1e-3 {
        (1e3, "ms")
    } else {
        (1e6, "µs")
    }
}

fn breakdown(
    root: &DrawingArea<SVGBackend, Shift>,
    rows: &[MetricRow],
    opts: &PlotOpts,
) -> Result<()> {
    let names: Vec<String> = match &opts.metrics {
        Some(m) => metrics::expand(rows, Some(m))?,
        None => {
            let present: Vec<String> = BREAKDOWN
                .iter()
                .filter(|m| rows.iter().any(|r| metrics::base_name(&r.metric) == **m))
                .map(|m| m.to_string())
                .collect();
            if present.is_empty() {
                // Names the metrics and what the input holds.
                metrics::expand(rows, Some(&[BREAKDOWN.join(", ")]))?;
            }
            present
        }
    };
    let by = [Col::Algo, Col::WorldSize];
    // value[component][group]
    let mut keys: BTreeSet<metrics::Key> = BTreeSet::new();
    let mut per: Vec<BTreeMap<metrics::Key, f64>> = Vec::new();
    for n in &names {
        let s = metrics::samples(rows, n);
        let g: BTreeMap<metrics::Key, f64> = metrics::group(&s, &by)
            .into_iter()
            .map(|(k, v)| (k, metrics::aggregate(&v, Stat::Median).value))
            .collect();
        keys.extend(g.keys().cloned());
        per.push(g);
    }
    let keys: Vec<metrics::Key> = keys.into_iter().collect();
    let labels = bar_labels(&keys);
    let totals: Vec<f64> = keys
        .iter()
        .map(|k| per.iter().map(|g| g.get(k).copied().unwrap_or(0.0)).sum())
        .collect();
    let max = totals.iter().copied().fold(0.0, f64::max);
    let (scale, unit) = time_unit(max);
    let n = keys.len() as u32;
    let title = opts
        .title
        .clone()
        .unwrap_or_else(|| "time per step by algorithm (median over steps and ranks)".to_string());
    let ymax = if max > 0.0 { max * scale * 1.25 } else { 1.0 };
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d((0u32..n).into_segmented(), 0f64..ymax)
        .map_err(draw_err)?;
    let fmt_x = |v: &SegmentValue<u32>| match v {
        SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n as usize + 1)
        .x_desc("algorithm")
        .y_desc(format!("time per step ({unit})"))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .x_label_formatter(&fmt_x)
        .y_label_formatter(&|v| short(*v))
        .draw()
        .map_err(draw_err)?;
    let mut base = vec![0.0f64; keys.len()];
    for (ci, (name, g)) in names.iter().zip(&per).enumerate() {
        let c = color(ci);
        let mut bars = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let v = g.get(k).copied().unwrap_or(0.0) * scale;
            let mut r = Rectangle::new(
                [
                    (SegmentValue::Exact(i as u32), base[i]),
                    (SegmentValue::Exact(i as u32 + 1), base[i] + v),
                ],
                c.filled(),
            );
            r.set_margin(0, 0, 12, 12);
            base[i] += v;
            bars.push(r);
        }
        chart
            .draw_series(bars)
            .map_err(draw_err)?
            .label(component_name(name))
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
    }
    legend(&mut chart)?;
    Ok(())
}

/// Points of one metric per algorithm: (P, median, min, max) over steps and ranks.
type Curves = BTreeMap<String, Vec<(f64, f64, f64, f64)>>;

fn curves_by_algo(rows: &[MetricRow], metric: &str) -> Curves {
    let s = metrics::samples(rows, metric);
    let mut out: Curves = BTreeMap::new();
    for (k, v) in metrics::group(&s, &[Col::Algo, Col::WorldSize]) {
        let sum = metrics::aggregate(&v, Stat::Median);
        let p = match k[1] {
            metrics::KeyPart::Num(p) => p as f64,
            _ => unreachable!("world_size is numeric"),
        };
        out.entry(k[0].to_string())
            .or_default()
            .push((p, sum.value, sum.min, sum.max));
    }
    out
}

/// A log-log chart of per-algorithm curves against P: `lines` drawn as lines, `points` as
/// markers with min–max whiskers.
fn log_log(
    root: &DrawingArea<SVGBackend, Shift>,
    title: &str,
    y_desc: &str,
    unit: &str,
    lines: &Curves,
    points: &Curves,
    line_suffix: &str,
) -> Result<()> {
    let positive = |c: &Curves| -> Curves {
        c.iter()
            .map(|(a, v)| (a.clone(), v.iter().copied().filter(|p| p.1 > 0.0).collect()))
            .collect()
    };
    let (lines, points) = (positive(lines), positive(points));
    let all = lines.values().chain(points.values()).flatten();
    let (xlo, xhi) = min_max(all.clone().map(|p| p.0));
    let (ylo, yhi) = min_max(all.flat_map(|p| [p.1, if p.2 > 0.0 { p.2 } else { p.1 }, p.3]));
    if !xlo.is_finite() || !ylo.is_finite() || xlo <= 0.0 {
        bail!("nothing to draw on log axes: every value is zero or negative");
    }
    let algos: BTreeSet<&String> = lines.keys().chain(points.keys()).collect();
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(
            log_range(xlo, xhi, 2.0).log_scale().base(2.0),
            log_range(ylo, yhi, 10.0).log_scale(),
        )
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("ranks P (log scale)")
        .y_desc(y_desc)
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .x_label_formatter(&|v| integer_label(*v))
        .y_label_formatter(&|v| si(*v, unit))
        .draw()
        .map_err(draw_err)?;
    for (i, algo) in algos.iter().enumerate() {
        let c = color(i);
        if let Some(pts) = lines.get(*algo) {
            chart
                .draw_series(LineSeries::new(
                    pts.iter().map(|p| (p.0, p.1)),
                    c.stroke_width(2),
                ))
                .map_err(draw_err)?
                .label(format!("{algo}{line_suffix}"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
        }
        if let Some(pts) = points.get(*algo) {
            let whiskers: Vec<_> = pts
                .iter()
                .filter(|p| p.2 > 0.0 && p.2 < p.3)
                .map(|p| PathElement::new(vec![(p.0, p.2), (p.0, p.3)], c.stroke_width(1)))
                .collect();
            chart.draw_series(whiskers).map_err(draw_err)?;
            chart
                .draw_series(pts.iter().map(|p| Circle::new((p.0, p.1), 5, c.filled())))
                .map_err(draw_err)?
                .label(format!("{algo} (measured)"))
                .legend(move |(x, y)| Circle::new((x + 10, y), 5, c.filled()));
        }
    }
    legend(&mut chart)?;
    Ok(())
}

fn volume(
    root: &DrawingArea<SVGBackend, Shift>,
    rows: &[MetricRow],
    opts: &PlotOpts,
) -> Result<()> {
    let metric = match &opts.metrics {
        Some(m) if m.len() == 1 => m[0].clone(),
        Some(_) => bail!("plot volume takes one measured metric (--metric), e.g. bytes_sent"),
        None => "bytes_sent".into(),
    };
    metrics::expand(rows, Some(std::slice::from_ref(&metric)))?;
    let model = crate::volume::model_name(&metric);
    let measured = curves_by_algo(rows, &metric);
    let lines = curves_by_algo(rows, &model);
    if lines.is_empty() {
        eprintln!("note: no `{model}` rows in the input: the figure shows measured points only");
    }
    let title = opts
        .title
        .clone()
        .unwrap_or_else(|| format!("{metric} per rank and step vs P: measured and cost model"));
    log_log(
        root,
        &title,
        &format!("{metric} per rank and step (bytes, log scale)"),
        "B",
        &lines,
        &measured,
        " (model)",
    )
}

fn scaling(
    root: &DrawingArea<SVGBackend, Shift>,
    rows: &[MetricRow],
    opts: &PlotOpts,
) -> Result<()> {
    let metric = match &opts.metrics {
        Some(m) if m.len() == 1 => m[0].clone(),
        Some(_) => bail!("plot scaling takes one model metric (--metric), e.g. model_time_s"),
        None => "model_time_s".into(),
    };
    metrics::expand(rows, Some(std::slice::from_ref(&metric)))?;
    let lines = curves_by_algo(rows, &metric);
    let title = opts
        .title
        .clone()
        .unwrap_or_else(|| "projected time per step vs P (α-β cost model)".to_string());
    log_log(
        root,
        &title,
        &format!("{metric} per step (seconds, log scale)"),
        "s",
        &lines,
        &Curves::new(),
        "",
    )
}
