//! `gradreport plot`: SVG figures from `metrics/1` rows, drawn with plotters' SVG backend.
//!
//! Text is written as SVG `<text>` elements (plotters without `ttf`: no font library is
//! needed to build, and any SVG viewer renders the text with its own sans-serif font).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use gradkit_core::MetricRow;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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

/// Writes `svg` to `path` atomically (see `gradkit_core::io::write_file_atomic`).
pub fn write_svg(path: &Path, svg: &str) -> Result<()> {
    gradkit_core::io::write_file_atomic(path, svg.as_bytes())
}

fn draw_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the figure: {e:?}")
}

/// Tableau 10, then darker variants: distinct colours that stay readable in print, enough for
/// every algorithm of `gradallreduce` in one figure.
const PALETTE: [RGBColor; 16] = [
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
    RGBColor(31, 60, 110),
    RGBColor(160, 80, 10),
    RGBColor(130, 20, 40),
    RGBColor(30, 100, 60),
    RGBColor(90, 50, 120),
    RGBColor(60, 60, 60),
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
        "accuracy" | "eval_accuracy" if values.iter().any(|v| *v > 1.0) => {
            format!("{metric} (%)")
        }
        "accuracy" | "eval_accuracy" => format!("{metric} (fraction)"),
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

/// A log range widened by 15 % at each end, so points on the first and last tick stand clear
/// of the axes.
fn padded_log(r: std::ops::Range<f64>) -> std::ops::Range<f64> {
    r.start / 1.15..r.end * 1.15
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
            // gradtrain writes the test accuracy as `eval_accuracy`.
            for acc in ["accuracy", "eval_accuracy"] {
                if rows.iter().any(|r| r.metric == acc) {
                    v.push(acc.into());
                }
            }
            v
        }
    };
    let labels = metrics::run_labels(rows);
    // One colour per run in every panel.
    let colours: BTreeMap<&String, usize> = labels
        .values()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .enumerate()
        .map(|(i, l)| (l, i))
        .collect();
    let mut panels_data = Vec::new();
    for name in &names {
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
            .filter(|(_, pts): &(String, Vec<(f64, f64)>)| !pts.is_empty())
            .collect();
        if curves.is_empty() {
            bail!("metric `{name}` has no finite values to plot");
        }
        panels_data.push(curves);
    }
    // One step axis for every panel.
    let (xlo, xhi) = min_max(
        panels_data
            .iter()
            .flatten()
            .flat_map(|c| c.1.iter().map(|p| p.0)),
    );
    let xr = padded(xlo, xhi);
    let panels = root.split_evenly((names.len(), 1));
    for (pi, ((name, curves), area)) in names
        .iter()
        .zip(&panels_data)
        .zip(panels.iter())
        .enumerate()
    {
        let ys: Vec<f64> = curves
            .iter()
            .flat_map(|c| c.1.iter().map(|p| p.1))
            .collect();
        let (ylo, yhi) = min_max(ys.iter().copied());
        let yr = padded(ylo, yhi);
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
            .build_cartesian_2d(xr.clone(), yr.clone())
            .map_err(draw_err)?;
        mesh(&mut chart.configure_mesh())
            .x_desc("step (iterations)")
            .y_desc(axis_label(name, &ys))
            .x_label_formatter(&|v| integer_label(*v))
            .y_label_formatter(&|v| short(*v))
            .draw()
            .map_err(draw_err)?;
        let mut occupied = Vec::new();
        for (label, pts) in curves {
            let c = color(colours.get(label).copied().unwrap_or(0));
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
            let norm: Vec<(f64, f64)> = pts
                .iter()
                .map(|p| (unit(p.0, &xr), unit(p.1, &yr)))
                .collect();
            occupied.extend(densify(&norm));
        }
        legend(&mut chart, free_corner(&occupied))?;
    }
    Ok(())
}

/// The mesh style every figure shares: readable tick labels, faint minor grid lines.
fn mesh<'a, 'b, X, Y, DB>(
    m: &'b mut plotters::chart::MeshStyle<'a, 'b, X, Y, DB>,
) -> &'b mut plotters::chart::MeshStyle<'a, 'b, X, Y, DB>
where
    X: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    DB: DrawingBackend,
{
    m.label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(200, 200, 200))
}

/// `v` on `r` mapped to 0..1.
fn unit(v: f64, r: &std::ops::Range<f64>) -> f64 {
    (v - r.start) / (r.end - r.start)
}

/// Points along a polyline (in unit coordinates), so a line counts where it passes.
fn densify(pts: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = pts.to_vec();
    for w in pts.windows(2) {
        for i in 1..16 {
            let t = i as f64 / 16.0;
            out.push((
                w[0].0 + t * (w[1].0 - w[0].0),
                w[0].1 + t * (w[1].1 - w[0].1),
            ));
        }
    }
    out
}

/// The corner of the plot (unit coordinates, y up) whose box holds the fewest data points.
fn free_corner(pts: &[(f64, f64)]) -> SeriesLabelPosition {
    let (bw, bh) = (0.4, 0.4);
    let corners = [
        (SeriesLabelPosition::UpperRight, 1.0 - bw, 1.0 - bh),
        (SeriesLabelPosition::UpperLeft, 0.0, 1.0 - bh),
        (SeriesLabelPosition::LowerRight, 1.0 - bw, 0.0),
        (SeriesLabelPosition::LowerLeft, 0.0, 0.0),
    ];
    let count = |x0: f64, y0: f64| {
        pts.iter()
            .filter(|p| p.0 >= x0 && p.0 <= x0 + bw && p.1 >= y0 && p.1 <= y0 + bh)
            .count()
    };
    let mut best = (usize::MAX, SeriesLabelPosition::UpperRight);
    for (pos, x0, y0) in corners {
        let c = count(x0, y0);
        if c < best.0 {
            best = (c, pos);
        }
    }
    best.1
}

fn legend<'a, DB: DrawingBackend + 'a, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    pos: SeriesLabelPosition,
) -> Result<()>
where
    X: plotters::coord::ranged1d::Ranged,
    Y: plotters::coord::ranged1d::Ranged,
{
    chart
        .configure_series_labels()
        .position(pos)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.9))
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
                bail!(
                    "no rows for metrics {} (plot breakdown); give --metric NAMES",
                    BREAKDOWN.join(", ")
                );
            }
            present
        }
    };
    let by = [Col::Algo, Col::WorldSize];
    // per[component][group]: median over steps and ranks.
    let mut keys: BTreeSet<metrics::Key> = BTreeSet::new();
    let mut per: Vec<BTreeMap<metrics::Key, f64>> = Vec::new();
    for n in &names {
        let s = metrics::samples(rows, n);
        let g: BTreeMap<metrics::Key, f64> = metrics::group(&s, &by)
            .into_iter()
            .map(|(k, v)| (k, metrics::aggregate(&v, Stat::Median).value))
            .filter(|(_, v)| v.is_finite())
            .collect();
        keys.extend(g.keys().cloned());
        per.push(g);
    }
    let keys: Vec<metrics::Key> = keys.into_iter().collect();
    let several_p = keys.iter().map(|k| &k[1]).collect::<BTreeSet<_>>().len() > 1;
    // Slots on the x axis: one per bar, a gap between algorithms when bars are grouped.
    let mut slot_of = Vec::with_capacity(keys.len());
    let mut slot = 0.0f64;
    for (i, k) in keys.iter().enumerate() {
        if several_p && i > 0 && keys[i - 1][0] != k[0] {
            slot += 0.6;
        }
        slot_of.push(slot);
        slot += 1.0;
    }
    let totals: Vec<f64> = keys
        .iter()
        .map(|k| per.iter().map(|g| g.get(k).copied().unwrap_or(0.0)).sum())
        .collect();
    let max = totals.iter().copied().fold(0.0, f64::max);
    let (scale, unit_name) = time_unit(max);
    let title = opts
        .title
        .clone()
        .unwrap_or_else(|| "time per step by algorithm (median over steps and ranks)".to_string());
    let ymax = if max > 0.0 { max * scale * 1.3 } else { 1.0 };
    let xr = -0.2..slot + 0.2;
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(if several_p { 76 } else { 52 })
        .y_label_area_size(80)
        .build_cartesian_2d(xr.clone(), 0f64..ymax)
        .map_err(draw_err)?;
    mesh(&mut chart.configure_mesh())
        .disable_x_mesh()
        .x_labels(0)
        .x_desc(if several_p {
            "ranks P, grouped by algorithm"
        } else {
            "algorithm"
        })
        .y_desc(format!("time per step ({unit_name})"))
        .y_label_formatter(&|v| short(*v))
        .draw()
        .map_err(draw_err)?;
    let mut base = vec![0.0f64; keys.len()];
    let mut occupied = Vec::new();
    for (ci, (name, g)) in names.iter().zip(&per).enumerate() {
        let c = color(ci);
        let mut bars = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let v = g.get(k).copied().unwrap_or(0.0) * scale;
            let x0 = slot_of[i] + 0.1;
            bars.push(Rectangle::new(
                [(x0, base[i]), (x0 + 0.8, base[i] + v)],
                c.filled(),
            ));
            base[i] += v;
        }
        chart
            .draw_series(bars)
            .map_err(draw_err)?
            .label(component_name(name))
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
    }
    for (i, top) in base.iter().enumerate() {
        for j in 0..=10 {
            let y = top * j as f64 / 10.0;
            occupied.push((unit(slot_of[i] + 0.5, &xr), unit(y, &(0.0..ymax))));
        }
    }
    legend(&mut chart, free_corner(&occupied))?;
    // Tick labels under the bars (and algorithm names under their group).
    let tick = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    let group = TextStyle::from((FONT, 14).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    let (_, y0) = chart.backend_coord(&(0.0, 0.0));
    for (i, k) in keys.iter().enumerate() {
        let (x, _) = chart.backend_coord(&(slot_of[i] + 0.5, 0.0));
        let label = if several_p {
            format!("P={}", k[1])
        } else {
            k[0].to_string()
        };
        root.draw(&Text::new(label, (x, y0 + 6), tick.clone()))
            .map_err(draw_err)?;
    }
    if several_p {
        let mut i = 0;
        while i < keys.len() {
            let mut j = i;
            while j + 1 < keys.len() && keys[j + 1][0] == keys[i][0] {
                j += 1;
            }
            let mid = (slot_of[i] + slot_of[j]) / 2.0 + 0.5;
            let (x, _) = chart.backend_coord(&(mid, 0.0));
            root.draw(&Text::new(
                keys[i][0].to_string(),
                (x, y0 + 26),
                group.clone(),
            ))
            .map_err(draw_err)?;
            i = j + 1;
        }
    }
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
            padded_log(log_range(xlo, xhi, 2.0)).log_scale().base(2.0),
            log_range(ylo, yhi, 10.0).log_scale(),
        )
        .map_err(draw_err)?;
    mesh(&mut chart.configure_mesh())
        .x_desc("ranks P (log scale)")
        .y_desc(y_desc)
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
    let xr = padded_log(log_range(xlo, xhi, 2.0));
    let yr = log_range(ylo, yhi, 10.0);
    let logu =
        |v: f64, r: &std::ops::Range<f64>| (v.ln() - r.start.ln()) / (r.end.ln() - r.start.ln());
    let mut occupied = Vec::new();
    for c in lines.values() {
        let norm: Vec<(f64, f64)> = c.iter().map(|p| (logu(p.0, &xr), logu(p.1, &yr))).collect();
        occupied.extend(densify(&norm));
    }
    for c in points.values() {
        occupied.extend(c.iter().map(|p| (logu(p.0, &xr), logu(p.1, &yr))));
    }
    legend(&mut chart, free_corner(&occupied))?;
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
        gradkit_core::noteln!(
            "note: no `{model}` rows in the input: the figure shows measured points only"
        );
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
    if opts.metrics.is_none() && !rows.iter().any(|r| r.metric == metric) {
        bail!("no rows for metric `{metric}` (plot scaling): give --n SIZE [--density D] to compute the cost model's projection, or input files with `{metric}` rows");
    }
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
