//! `gradreport plot`: figures from `metrics/1` rows, drawn with plotters' SVG backend (PDF
//! and PNG are made from that SVG in [`crate::export`]; the plotted values and the loss
//! plot's x positions are in [`crate::figdata`]).
//!
//! Text is written as SVG `<text>` elements (plotters without `ttf`: no font library is
//! needed to build, and any SVG viewer renders the text with its own sans-serif font).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{anyhow, bail, Result};
use gradkit_core::MetricRow;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::figdata::{self, Datum, XAxis};
use crate::metrics::{self, Col, Stat};

/// Which figure to draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

impl Kind {
    /// Every kind, in the order `--help` lists them.
    pub const ALL: &'static [Kind] = &[Kind::Loss, Kind::Breakdown, Kind::Volume, Kind::Scaling];

    /// Its name on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Loss => "loss",
            Kind::Breakdown => "breakdown",
            Kind::Volume => "volume",
            Kind::Scaling => "scaling",
        }
    }

    /// One line for `--help`.
    pub const fn help(self) -> Option<&'static str> {
        Some(match self {
            Kind::Loss => "Loss (and accuracy, when present) vs step, one line per run",
            Kind::Breakdown => {
                "Stacked compute / select / comm time per step, one bar per algorithm and P"
            }
            Kind::Volume => {
                "Bytes per rank and step vs P, measured points on the cost model's lines (log-log)"
            }
            Kind::Scaling => {
                "The cost model's projected time per step vs P, one line per algorithm (log-log)"
            }
        })
    }
}

gradkit_core::named!(Kind, "figure kind");

/// Options of `gradreport plot`.
#[derive(Clone, Debug)]
pub struct PlotOpts {
    pub kind: Kind,
    /// Metric expressions overriding the kind's default metrics.
    pub metrics: Option<Vec<String>>,
    pub title: Option<String>,
    pub width: u32,
    pub height: u32,
    /// The x axis of loss plots.
    pub x: XAxis,
    /// Trailing mean over this many points for loss plots (1: none).
    pub smooth: usize,
}

impl PlotOpts {
    pub fn new(kind: Kind) -> Self {
        PlotOpts {
            kind,
            metrics: None,
            title: None,
            width: 900,
            height: 560,
            x: XAxis::Step,
            smooth: 1,
        }
    }
}

/// The default metrics of the breakdown figure, bottom to top of each bar.
pub const BREAKDOWN: &[&str] = &["time_compute_s", "time_select_s", "time_comm_s"];

/// How a series is drawn, as its legend entry shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    Line,
    Dot,
    Ring,
    Bar,
}

/// A legend entry: only series that were drawn get one.
#[derive(Clone, Debug)]
pub struct Entry {
    pub label: String,
    pub color: RGBColor,
    pub mark: Mark,
}

/// What a kind's drawing produced: its legend and the values behind it.
#[derive(Default)]
pub struct Drawn {
    pub legend: Vec<Entry>,
    pub data: Vec<Datum>,
}

impl Drawn {
    fn entry(&mut self, label: impl Into<String>, color: RGBColor, mark: Mark) {
        self.legend.push(Entry {
            label: label.into(),
            color,
            mark,
        });
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

thread_local! {
    /// Set while the figure is drawn a second time (beside its legend): its notes were
    /// printed the first time.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn note(msg: String) {
    if !QUIET.with(|q| q.get()) {
        gradkit_core::noteln!("{msg}");
    }
}

/// Draws the figure and returns the SVG text.
pub fn plot(rows: &[MetricRow], opts: &PlotOpts) -> Result<String> {
    Ok(render(rows, opts)?.0)
}

/// Draws the figure: the SVG text and the plotted values. The legend stands in a column of
/// its own right of the data (drawn once to learn the labels, then again beside them).
pub fn render(rows: &[MetricRow], opts: &PlotOpts) -> Result<(String, Vec<Datum>)> {
    let (svg, drawn) = draw(rows, opts, 0)?;
    let w = legend_width(&drawn.legend, opts.width);
    if w == 0 {
        return Ok((svg, drawn.data));
    }
    QUIET.with(|q| q.set(true));
    let second = draw(rows, opts, w);
    QUIET.with(|q| q.set(false));
    let (svg, drawn) = second?;
    Ok((svg, drawn.data))
}

fn draw(rows: &[MetricRow], opts: &PlotOpts, legend_w: u32) -> Result<(String, Drawn)> {
    let mut svg = String::new();
    let drawn;
    {
        let root = SVGBackend::with_string(&mut svg, (opts.width, opts.height)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let (plot_area, legend_area) = root.split_horizontally(opts.width.saturating_sub(legend_w));
        drawn = match opts.kind {
            Kind::Loss => loss(&plot_area, rows, opts)?,
            Kind::Breakdown => breakdown(&plot_area, rows, opts)?,
            Kind::Volume => volume(&plot_area, rows, opts)?,
            Kind::Scaling => scaling(&plot_area, rows, opts)?,
        };
        if legend_w > 0 {
            draw_legend(&legend_area, &drawn.legend)?;
        }
        root.present().map_err(draw_err)?;
    }
    Ok((svg, drawn))
}

/// The legend column's width: its longest label at about 0.6 em per character, plus the
/// swatch; at most 40 % of the figure.
fn legend_width(entries: &[Entry], width: u32) -> u32 {
    let chars = entries
        .iter()
        .map(|e| e.label.chars().count())
        .max()
        .unwrap_or(0);
    if chars == 0 {
        return 0;
    }
    ((chars as f64 * 7.6 + 52.0) as u32).min(width * 2 / 5)
}

fn draw_legend(area: &Area, entries: &[Entry]) -> Result<()> {
    let text = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, e) in entries.iter().enumerate() {
        let y = 48 + 22 * i as i32;
        let c = e.color;
        match e.mark {
            Mark::Line => area.draw(&PathElement::new(vec![(6, y), (28, y)], c.stroke_width(2))),
            Mark::Dot => area.draw(&Circle::new((17, y), 5, c.filled())),
            Mark::Ring => area.draw(&Circle::new((17, y), 6, c.stroke_width(2))),
            Mark::Bar => area.draw(&Rectangle::new([(10, y - 6), (24, y + 6)], c.filled())),
        }
        .map_err(draw_err)?;
        area.draw(&Text::new(e.label.clone(), (34, y), text.clone()))
            .map_err(draw_err)?;
    }
    Ok(())
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

/// The P axis: powers of two around the data, or centred on a single P.
fn p_range(lo: f64, hi: f64) -> std::ops::Range<f64> {
    if lo == hi {
        return lo / 1.6..lo * 1.6;
    }
    padded_log(log_range(lo, hi, 2.0))
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

/// One line of a loss panel: its label and points (x, median over ranks).
type Curve = (String, Vec<(f64, f64)>);

/// The loss plot's metrics: `--metric`, or `loss` and the accuracy when some run has two
/// or more accuracy points (a single evaluation makes no curve: it is left out, with a note).
fn loss_names(rows: &[MetricRow], opts: &PlotOpts) -> Result<Vec<String>> {
    if let Some(m) = &opts.metrics {
        return metrics::expand(rows, Some(m));
    }
    let mut v = metrics::expand(rows, Some(&["loss".to_string()]))?;
    // gradtrain writes the test accuracy as `eval_accuracy`.
    for acc in ["accuracy", "eval_accuracy"] {
        let mut steps: BTreeMap<(&str, &str, u32), BTreeSet<u32>> = BTreeMap::new();
        for r in rows
            .iter()
            .filter(|r| r.metric == acc && r.value.is_finite())
        {
            steps
                .entry((&r.run, &r.algo, r.world_size))
                .or_default()
                .insert(r.step);
        }
        if steps.values().any(|s| s.len() >= 2) {
            v.push(acc.into());
        } else if !steps.is_empty() {
            note(format!(
                "note: `{acc}` has one point per run: no panel for it (gradreport table --metric {acc} shows it)"
            ));
        }
    }
    Ok(v)
}

/// The curves of one metric: median over ranks per step, at the step's x position.
fn loss_curves(
    rows: &[MetricRow],
    name: &str,
    label: &dyn Fn(&MetricRow) -> String,
    xs: &Option<std::collections::HashMap<(String, u32), f64>>,
) -> Result<Vec<Curve>> {
    let samples = metrics::samples(rows, name);
    let mut curves: BTreeMap<String, Vec<&MetricRow>> = BTreeMap::new();
    for r in &samples {
        curves.entry(label(r)).or_default().push(r);
    }
    let curves: Vec<Curve> = curves
        .into_iter()
        .map(|(l, v)| {
            let pts = metrics::per_step_median(&v)
                .into_iter()
                .filter_map(|(s, y)| match xs {
                    None => Some((s as f64, y)),
                    Some(m) => m.get(&(l.clone(), s)).map(|x| (*x, y)),
                })
                .collect();
            (l, pts)
        })
        .filter(|(_, pts): &Curve| !pts.is_empty())
        .collect();
    if curves.is_empty() {
        bail!("metric `{name}` has no finite values to plot");
    }
    Ok(curves)
}

fn loss(root: &Area, rows: &[MetricRow], opts: &PlotOpts) -> Result<Drawn> {
    let names = loss_names(rows, opts)?;
    let labels = metrics::run_labels(rows);
    let label = |r: &MetricRow| curve_label(&labels, r);
    let xs = figdata::x_positions(rows, opts.x, &label)?;
    // One colour per run in every panel.
    let colours: BTreeMap<&String, usize> = labels
        .values()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .enumerate()
        .map(|(i, l)| (l, i))
        .collect();
    let panels_data = names
        .iter()
        .map(|n| loss_curves(rows, n, &label, &xs))
        .collect::<Result<Vec<_>>>()?;
    // One x axis for every panel.
    let (xlo, xhi) = min_max(
        panels_data
            .iter()
            .flatten()
            .flat_map(|c| c.1.iter().map(|p| p.0)),
    );
    let xr = padded(xlo, xhi);
    let panels = root.split_evenly((names.len(), 1));
    let mut drawn = Drawn::default();
    for (pi, ((name, curves), area)) in names.iter().zip(&panels_data).zip(&panels).enumerate() {
        let title = match (pi, &opts.title) {
            (0, Some(t)) => t.clone(),
            (0, None) => format!(
                "{} vs {} (median over ranks)",
                names.join(", "),
                opts.x.noun()
            ),
            _ => String::new(),
        };
        let colour = |l: &String| color(colours.get(l).copied().unwrap_or(0));
        let d = loss_panel(area, name, curves, &xr, &title, opts, &colour)?;
        for e in d.legend {
            if !drawn.legend.iter().any(|x| x.label == e.label) {
                drawn.legend.push(e);
            }
        }
        drawn.data.extend(d.data);
    }
    Ok(drawn)
}

/// One panel of the loss plot: a line per curve (a dot where a curve has one point; with
/// `--smooth`, the raw line faint under the smoothed one).
fn loss_panel(
    area: &Area,
    name: &str,
    curves: &[Curve],
    xr: &std::ops::Range<f64>,
    title: &str,
    opts: &PlotOpts,
    colour: &dyn Fn(&String) -> RGBColor,
) -> Result<Drawn> {
    let ys: Vec<f64> = curves
        .iter()
        .flat_map(|c| c.1.iter().map(|p| p.1))
        .collect();
    let (ylo, yhi) = min_max(ys.iter().copied());
    let mut builder = ChartBuilder::on(area);
    if !title.is_empty() {
        builder.caption(title, (FONT, 20));
    }
    let mut chart = builder
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(xr.clone(), padded(ylo, yhi))
        .map_err(draw_err)?;
    let xfmt = |v: &f64| match opts.x {
        XAxis::Step => integer_label(*v),
        XAxis::Time => short(*v),
        XAxis::Bytes => si(*v, "B"),
    };
    mesh(&mut chart.configure_mesh())
        .x_desc(opts.x.label())
        .y_desc(axis_label(name, &ys))
        .x_label_formatter(&xfmt)
        .y_label_formatter(&|v| short(*v))
        .draw()
        .map_err(draw_err)?;
    let mut drawn = Drawn::default();
    for (label, pts) in curves {
        let c = colour(label);
        let sm = figdata::smooth(&pts.iter().map(|p| p.1).collect::<Vec<_>>(), opts.smooth);
        let smoothed = opts.smooth > 1 && pts.len() > 1;
        let faint = if smoothed { c.mix(0.35) } else { c.mix(1.0) };
        let width = if smoothed { 1 } else { 2 };
        if pts.len() == 1 {
            chart
                .draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled())))
                .map_err(draw_err)?;
            drawn.entry(label, c, Mark::Dot);
        } else {
            chart
                .draw_series(LineSeries::new(
                    pts.iter().copied(),
                    faint.stroke_width(width),
                ))
                .map_err(draw_err)?;
            if smoothed {
                let line = pts.iter().zip(&sm).map(|(p, y)| (p.0, *y));
                chart
                    .draw_series(LineSeries::new(line, c.stroke_width(2)))
                    .map_err(draw_err)?;
            }
            drawn.entry(label, c, Mark::Line);
        }
        for (p, y) in pts.iter().zip(&sm) {
            drawn.data.push(Datum {
                panel: name.to_string(),
                series: label.clone(),
                x: format!("{}", p.0),
                y: p.1,
                y_smooth: (opts.smooth > 1).then_some(*y),
                ..Datum::default()
            });
        }
    }
    Ok(drawn)
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

/// The breakdown's components, bottom to top: `--metric`, or those of [`BREAKDOWN`] present.
fn breakdown_names(rows: &[MetricRow], opts: &PlotOpts) -> Result<Vec<String>> {
    if let Some(m) = &opts.metrics {
        return metrics::expand(rows, Some(m));
    }
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
    Ok(present)
}

/// The bars: one per (series, P) group, the median over steps and ranks of each component.
struct Bars {
    names: Vec<String>,
    keys: Vec<(String, u32)>,
    /// per[component][bar]
    per: Vec<Vec<f64>>,
    /// x position of each bar's left edge; a gap between series when P varies
    slot_of: Vec<f64>,
    several_p: bool,
    end: f64,
}

fn bars(rows: &[MetricRow], opts: &PlotOpts) -> Result<Bars> {
    let names = breakdown_names(rows, opts)?;
    let series = figdata::algo_labels(rows);
    let name_of = |algo: &str| {
        series
            .get(algo)
            .cloned()
            .unwrap_or_else(|| algo.to_string())
    };
    let mut per_map: Vec<BTreeMap<(String, u32), f64>> = Vec::new();
    let mut keys: BTreeSet<(String, u32)> = BTreeSet::new();
    for n in &names {
        let s = metrics::samples(rows, n);
        let mut g: BTreeMap<(String, u32), Vec<MetricRow>> = BTreeMap::new();
        for r in s {
            g.entry((name_of(&r.algo), r.world_size))
                .or_default()
                .push(r);
        }
        let g: BTreeMap<(String, u32), f64> = g
            .into_iter()
            .map(|(k, v)| {
                (
                    k,
                    metrics::aggregate(&v.iter().collect::<Vec<_>>(), Stat::Median).value,
                )
            })
            .filter(|(_, v)| v.is_finite())
            .collect();
        keys.extend(g.keys().cloned());
        per_map.push(g);
    }
    let keys: Vec<(String, u32)> = keys.into_iter().collect();
    let several_p = keys.iter().map(|k| k.1).collect::<BTreeSet<_>>().len() > 1;
    let (mut slot_of, mut slot) = (Vec::with_capacity(keys.len()), 0.0f64);
    for (i, k) in keys.iter().enumerate() {
        if several_p && i > 0 && keys[i - 1].0 != k.0 {
            slot += 0.6;
        }
        slot_of.push(slot);
        slot += 1.0;
    }
    let per = per_map
        .iter()
        .map(|g| {
            keys.iter()
                .map(|k| g.get(k).copied().unwrap_or(0.0))
                .collect()
        })
        .collect();
    Ok(Bars {
        names,
        keys,
        per,
        slot_of,
        several_p,
        end: slot,
    })
}

fn breakdown(root: &Area, rows: &[MetricRow], opts: &PlotOpts) -> Result<Drawn> {
    let b = bars(rows, opts)?;
    let totals: Vec<f64> = (0..b.keys.len())
        .map(|i| b.per.iter().map(|c| c[i]).sum())
        .collect();
    let max = totals.iter().copied().fold(0.0, f64::max);
    let (scale, unit_name) = time_unit(max);
    let title = opts
        .title
        .clone()
        .unwrap_or_else(|| "time per step by algorithm (median over steps and ranks)".to_string());
    let ymax = if max > 0.0 { max * scale * 1.1 } else { 1.0 };
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(if b.several_p { 76 } else { 52 })
        .y_label_area_size(80)
        .build_cartesian_2d(-0.2..b.end + 0.2, 0f64..ymax)
        .map_err(draw_err)?;
    mesh(&mut chart.configure_mesh())
        .disable_x_mesh()
        .x_labels(0)
        .x_desc(if b.several_p {
            "ranks P, grouped by algorithm"
        } else {
            "algorithm"
        })
        .y_desc(format!("time per step ({unit_name})"))
        .y_label_formatter(&|v| short(*v))
        .draw()
        .map_err(draw_err)?;
    let mut drawn = Drawn::default();
    let mut base = vec![0.0f64; b.keys.len()];
    for (ci, (name, values)) in b.names.iter().zip(&b.per).enumerate() {
        let c = color(ci);
        let mut rects = Vec::new();
        for (i, v) in values.iter().enumerate() {
            let x0 = b.slot_of[i] + 0.1;
            let top = base[i] + v * scale;
            rects.push(Rectangle::new([(x0, base[i]), (x0 + 0.8, top)], c.filled()));
            base[i] = top;
            drawn.data.push(Datum {
                panel: name.clone(),
                series: component_name(name),
                x: format!("{} P={}", b.keys[i].0, b.keys[i].1),
                y: *v,
                ..Datum::default()
            });
        }
        chart.draw_series(rects).map_err(draw_err)?;
        drawn.entry(component_name(name), c, Mark::Bar);
    }
    bar_labels(root, &chart, &b)?;
    // Listed top to bottom as the components stack.
    drawn.legend.reverse();
    Ok(drawn)
}

/// Tick labels under the bars (P, or the series when P does not vary), and each series'
/// name under its group.
fn bar_labels<'a>(
    root: &Area,
    chart: &ChartContext<
        'a,
        SVGBackend<'a>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    b: &Bars,
) -> Result<()> {
    let tick = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    let group = TextStyle::from((FONT, 14).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    let (_, y0) = chart.backend_coord(&(0.0, 0.0));
    for (i, k) in b.keys.iter().enumerate() {
        let (x, _) = chart.backend_coord(&(b.slot_of[i] + 0.5, 0.0));
        let label = if b.several_p {
            format!("P={}", k.1)
        } else {
            k.0.clone()
        };
        root.draw(&Text::new(label, (x, y0 + 6), tick.clone()))
            .map_err(draw_err)?;
    }
    if !b.several_p {
        return Ok(());
    }
    let mut i = 0;
    while i < b.keys.len() {
        let mut j = i;
        while j + 1 < b.keys.len() && b.keys[j + 1].0 == b.keys[i].0 {
            j += 1;
        }
        let mid = (b.slot_of[i] + b.slot_of[j]) / 2.0 + 0.5;
        let (x, _) = chart.backend_coord(&(mid, 0.0));
        root.draw(&Text::new(b.keys[i].0.clone(), (x, y0 + 26), group.clone()))
            .map_err(draw_err)?;
        i = j + 1;
    }
    Ok(())
}

/// Points of one metric per series (an algorithm, or the run naming it): (P, median, min,
/// max) over steps and ranks.
type Curves = BTreeMap<String, Vec<(f64, f64, f64, f64)>>;

fn curves_by_algo(rows: &[MetricRow], metric: &str) -> Curves {
    let series = figdata::algo_labels(rows);
    let s = metrics::samples(rows, metric);
    let mut out: Curves = BTreeMap::new();
    for (k, v) in metrics::group(&s, &[Col::Algo, Col::WorldSize]) {
        let sum = metrics::aggregate(&v, Stat::Median);
        let p = match k[1] {
            metrics::KeyPart::Num(p) => p as f64,
            _ => unreachable!("world_size is numeric"),
        };
        let algo = k[0].to_string();
        let name = series.get(&algo).cloned().unwrap_or(algo);
        out.entry(name)
            .or_default()
            .push((p, sum.value, sum.min, sum.max));
    }
    out
}

/// What a log-log chart shows: lines (`line_suffix` in their labels) and measured points.
struct LogLog<'a> {
    title: &'a str,
    y_desc: &'a str,
    unit: &'a str,
    lines: Curves,
    points: Curves,
    line_metric: &'a str,
    point_metric: &'a str,
    line_suffix: &'a str,
}

/// Keeps the points a log axis can show.
fn positive(c: &Curves) -> Curves {
    c.iter()
        .map(|(a, v)| (a.clone(), v.iter().copied().filter(|p| p.1 > 0.0).collect()))
        .collect()
}

/// A log-log chart of per-series curves against P: lines (a ring where a line has a single
/// point: nothing else would show), and points with min–max whiskers.
fn log_log(root: &Area, ll: LogLog) -> Result<Drawn> {
    let (lines, points) = (positive(&ll.lines), positive(&ll.points));
    let all = lines.values().chain(points.values()).flatten();
    let (xlo, xhi) = min_max(all.clone().map(|p| p.0));
    let (ylo, yhi) = min_max(all.flat_map(|p| [p.1, if p.2 > 0.0 { p.2 } else { p.1 }, p.3]));
    if !xlo.is_finite() || !ylo.is_finite() || xlo <= 0.0 {
        bail!("nothing to draw on log axes: every value is zero or negative");
    }
    let algos: BTreeSet<&String> = lines.keys().chain(points.keys()).collect();
    let mut chart = ChartBuilder::on(root)
        .caption(ll.title, (FONT, 20))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(
            p_range(xlo, xhi).log_scale().base(2.0),
            log_range(ylo, yhi, 10.0).log_scale(),
        )
        .map_err(draw_err)?;
    mesh(&mut chart.configure_mesh())
        .x_desc("ranks P (log scale)")
        .y_desc(ll.y_desc)
        .x_label_formatter(&|v| integer_label(*v))
        .y_label_formatter(&|v| si(*v, ll.unit))
        .draw()
        .map_err(draw_err)?;
    let mut drawn = Drawn::default();
    for (i, algo) in algos.iter().enumerate() {
        let c = color(i);
        if let Some(pts) = lines.get(*algo).filter(|p| !p.is_empty()) {
            let label = format!("{algo}{}", ll.line_suffix);
            if pts.len() == 1 {
                let ring = pts
                    .iter()
                    .map(|p| Circle::new((p.0, p.1), 8, c.stroke_width(2)));
                chart.draw_series(ring).map_err(draw_err)?;
                drawn.entry(label.clone(), c, Mark::Ring);
            } else {
                let line = LineSeries::new(pts.iter().map(|p| (p.0, p.1)), c.stroke_width(2));
                chart.draw_series(line).map_err(draw_err)?;
                drawn.entry(label.clone(), c, Mark::Line);
            }
            push_points(&mut drawn.data, ll.line_metric, &label, pts);
        }
        if let Some(pts) = points.get(*algo).filter(|p| !p.is_empty()) {
            let whiskers: Vec<_> = pts
                .iter()
                .filter(|p| p.2 > 0.0 && p.2 < p.3)
                .map(|p| PathElement::new(vec![(p.0, p.2), (p.0, p.3)], c.stroke_width(1)))
                .collect();
            chart.draw_series(whiskers).map_err(draw_err)?;
            chart
                .draw_series(pts.iter().map(|p| Circle::new((p.0, p.1), 5, c.filled())))
                .map_err(draw_err)?;
            let label = format!("{algo} (measured)");
            drawn.entry(label.clone(), c, Mark::Dot);
            push_points(&mut drawn.data, ll.point_metric, &label, pts);
        }
    }
    Ok(drawn)
}

fn push_points(data: &mut Vec<Datum>, panel: &str, series: &str, pts: &[(f64, f64, f64, f64)]) {
    for p in pts {
        data.push(Datum {
            panel: panel.to_string(),
            series: series.to_string(),
            x: format!("{}", p.0),
            y: p.1,
            y_min: Some(p.2),
            y_max: Some(p.3),
            y_smooth: None,
        });
    }
}

fn volume(root: &Area, rows: &[MetricRow], opts: &PlotOpts) -> Result<Drawn> {
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
        note(format!(
            "note: no `{model}` rows in the input: the figure shows measured points only"
        ));
    }
    let title = opts
        .title
        .clone()
        .unwrap_or_else(|| format!("{metric} per rank and step vs P: measured and cost model"));
    log_log(
        root,
        LogLog {
            title: &title,
            y_desc: &format!("{metric} per rank and step (bytes, log scale)"),
            unit: "B",
            lines,
            points: measured,
            line_metric: &model,
            point_metric: &metric,
            line_suffix: " (model)",
        },
    )
}

fn scaling(root: &Area, rows: &[MetricRow], opts: &PlotOpts) -> Result<Drawn> {
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
        LogLog {
            title: &title,
            y_desc: &format!("{metric} per step (seconds, log scale)"),
            unit: "s",
            lines,
            points: Curves::new(),
            line_metric: &metric,
            point_metric: &metric,
            line_suffix: "",
        },
    )
}
