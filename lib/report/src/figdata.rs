//! What a figure plots, as data: the values behind each drawn mark (`--csv`), the x positions
//! of loss plots against wall time or bytes (`--x`), smoothing (`--smooth`), and the series'
//! names (`run` where it names one algorithm, else `algo`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use anyhow::{bail, Result};
use gradkit_core::MetricRow;

use crate::metrics;

/// One plotted value: a row of `--csv`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Datum {
    /// The metric on the y axis (the panel of a loss plot, the component of a bar).
    pub panel: String,
    /// The legend's name of the series.
    pub series: String,
    /// The x value as written: a step, seconds, bytes, P, or a bar's group (`ring P=4`).
    pub x: String,
    pub y: f64,
    pub y_min: Option<f64>,
    pub y_max: Option<f64>,
    pub y_smooth: Option<f64>,
}

/// The x axis of a loss plot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XAxis {
    /// Training step
    #[default]
    Step,
    /// Wall time since the start of the run: per step, the slowest rank's time, summed
    Time,
    /// Bytes sent per rank (median over ranks), summed over the steps
    Bytes,
}

impl XAxis {
    /// Every axis, in the order `--help` lists them.
    pub const ALL: &'static [XAxis] = &[XAxis::Step, XAxis::Time, XAxis::Bytes];

    /// Its `--x` name.
    pub const fn name(self) -> &'static str {
        match self {
            XAxis::Step => "step",
            XAxis::Time => "time",
            XAxis::Bytes => "bytes",
        }
    }

    /// One line for `--help`.
    pub const fn help(self) -> Option<&'static str> {
        Some(match self {
            XAxis::Step => "Training step",
            XAxis::Time => {
                "Wall time since the start of the run: per step, the slowest rank's time, summed"
            }
            XAxis::Bytes => "Bytes sent per rank (median over ranks), summed over the steps",
        })
    }

    pub fn label(self) -> &'static str {
        match self {
            XAxis::Step => "step (iterations)",
            XAxis::Time => "wall time (s)",
            XAxis::Bytes => "bytes sent per rank, cumulative (bytes)",
        }
    }

    pub fn noun(self) -> &'static str {
        match self {
            XAxis::Step => "step",
            XAxis::Time => "wall time",
            XAxis::Bytes => "bytes sent",
        }
    }
}

gradkit_core::named!(XAxis, "--x");

/// The phases of a training step that gradtrain times; their sum is the step's time when
/// the input has no `time_step_s`.
pub const STEP_PHASES: [&str; 4] = [
    "time_compute_s",
    "time_select_s",
    "time_comm_s",
    "time_update_s",
];

/// x position of every (curve label, step) for `--x time|bytes`: the running sum, over the
/// curve's steps in order, of the step's time (max over ranks of its phases, or of
/// `time_step_s`) or of its bytes (median over ranks of `bytes_sent`). None for `--x step`.
pub fn x_positions(
    rows: &[MetricRow],
    axis: XAxis,
    label: &dyn Fn(&MetricRow) -> String,
) -> Result<Option<HashMap<(String, u32), f64>>> {
    let metrics_used: Vec<String> = match axis {
        XAxis::Step => return Ok(None),
        XAxis::Time if rows.iter().any(|r| r.metric == "time_step_s") => {
            vec!["time_step_s".into()]
        }
        XAxis::Time => STEP_PHASES.iter().map(|s| s.to_string()).collect(),
        XAxis::Bytes => vec!["bytes_sent".into()],
    };
    // (label, step) → rank → value (phases summed).
    let mut per: BTreeMap<(String, u32), BTreeMap<u32, f64>> = BTreeMap::new();
    for m in &metrics_used {
        for r in metrics::samples(rows, m) {
            if r.value.is_finite() {
                *per.entry((label(&r), r.step))
                    .or_default()
                    .entry(r.rank)
                    .or_default() += r.value;
            }
        }
    }
    if per.is_empty() {
        bail!(
            "--x {}: the input has no {} rows (gradtrain writes them)",
            axis.noun().split(' ').next().unwrap_or(""),
            metrics_used.join("/")
        );
    }
    let mut out = HashMap::new();
    let mut acc: HashMap<String, f64> = HashMap::new();
    for ((l, step), ranks) in per {
        let v: Vec<f64> = ranks.into_values().collect();
        let inc = match axis {
            XAxis::Time => v.iter().copied().fold(0.0, f64::max),
            _ => metrics::median(&v),
        };
        let a = acc.entry(l.clone()).or_default();
        *a += inc;
        out.insert((l, step), *a);
    }
    Ok(Some(out))
}

/// Trailing mean over the last `n` points (fewer at the start).
pub fn smooth(ys: &[f64], n: usize) -> Vec<f64> {
    let n = n.max(1);
    (0..ys.len())
        .map(|i| {
            let lo = (i + 1).saturating_sub(n);
            ys[lo..=i].iter().sum::<f64>() / (i + 1 - lo) as f64
        })
        .collect()
}

/// The name of each algorithm's series: its run's name when one run holds all of the
/// algorithm's measurements and names no other algorithm (`--run onebit-adam`), else the
/// algorithm. The cost model's rows (`model_*`) do not count.
pub fn algo_labels(rows: &[MetricRow]) -> HashMap<String, String> {
    let mut runs: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut algos_of_run: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for r in rows.iter().filter(|r| !r.metric.starts_with("model_")) {
        runs.entry(&r.algo).or_default().insert(&r.run);
        algos_of_run.entry(&r.run).or_default().insert(&r.algo);
    }
    let mut out = HashMap::new();
    for r in rows {
        let label = match runs.get(r.algo.as_str()) {
            Some(set) if set.len() == 1 => {
                let run = *set.iter().next().expect("one run");
                if !run.is_empty() && algos_of_run[run].len() == 1 {
                    run.to_string()
                } else {
                    r.algo.clone()
                }
            }
            _ => r.algo.clone(),
        };
        out.entry(r.algo.clone()).or_insert(label);
    }
    out
}

/// A number as the CSV writes it: the shortest text that reads back as the same f64.
fn num(v: f64) -> String {
    format!("{v}")
}

fn field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The plotted data as CSV (`panel,series,x,y,y_min,y_max,y_smooth`; empty where a column
/// does not apply), written atomically.
pub fn write_csv(path: &Path, data: &[Datum]) -> Result<()> {
    gradkit_core::io::write_file_atomic(path, csv_text(data).as_bytes())
}

/// The `--csv` file's text: a header, then one line per plotted point or bar.
pub fn csv_text(data: &[Datum]) -> String {
    let mut s = String::from("panel,series,x,y,y_min,y_max,y_smooth\n");
    let opt = |v: Option<f64>| v.map(num).unwrap_or_default();
    for d in data {
        s.push_str(&format!(
            "{},{},{},{},{},{},{}\n",
            field(&d.panel),
            field(&d.series),
            field(&d.x),
            num(d.y),
            opt(d.y_min),
            opt(d.y_max),
            opt(d.y_smooth)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_mean() {
        assert_eq!(smooth(&[1.0, 3.0, 5.0, 7.0], 2), vec![1.0, 2.0, 4.0, 6.0]);
        assert_eq!(smooth(&[1.0, 3.0], 1), vec![1.0, 3.0]);
    }

    #[test]
    fn csv_quotes_fields() {
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("x\"y"), "\"x\"\"y\"");
    }
}
