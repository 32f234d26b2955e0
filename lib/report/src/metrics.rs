//! Reading `metrics/1` files and turning their long rows into per-group statistics:
//! metric selection (plain names, `name:phase`, `name:*`), grouping columns, statistics.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use anyhow::{bail, Result};
use gradkit_core::{read_table, Input, MetricRow, ReadOptions};

/// Metric names in the order a reader expects them (docs/FORMAT.md); others follow by name.
pub const KNOWN_ORDER: &[&str] = &[
    "bytes_sent",
    "bytes_recv",
    "messages",
    "nnz",
    "threshold",
    "time_compute_s",
    "time_select_s",
    "time_comm_s",
    "loss",
    "accuracy",
    "lr",
];

/// Reads every file as `metrics/1` (stdin when `paths` is empty) and concatenates the rows.
pub fn load(paths: &[PathBuf]) -> Result<Vec<MetricRow>> {
    let inputs: Vec<Input> = if paths.is_empty() {
        vec![Input::from_arg(None)?]
    } else {
        paths
            .iter()
            .map(|p| Input::from_arg(Some(p)))
            .collect::<Result<_>>()?
    };
    let mut rows = Vec::new();
    for input in &inputs {
        rows.extend(read_table::<MetricRow>(input, ReadOptions::default())?.rows);
    }
    if rows.is_empty() {
        let names: Vec<String> = inputs.iter().map(|i| i.name()).collect();
        bail!("the input has no metric rows ({})", names.join(", "));
    }
    Ok(rows)
}

/// The part of a metric name before `:` (the phase suffix).
pub fn base_name(metric: &str) -> &str {
    metric.split_once(':').map_or(metric, |(b, _)| b)
}

/// Every metric name an expression like `bytes_sent`, `bytes_sent:phase` or `bytes_sent:*`
/// stands for, in column order. With no expression: every base name in the rows.
pub fn expand(rows: &[MetricRow], requested: Option<&[String]>) -> Result<Vec<String>> {
    // Names in order of first appearance, so phases keep the producer's order.
    let mut seen = Vec::new();
    let mut set = BTreeSet::new();
    for r in rows {
        if set.insert(r.metric.as_str()) {
            seen.push(r.metric.as_str());
        }
    }
    let bases: BTreeSet<&str> = seen.iter().map(|m| base_name(m)).collect();
    let Some(req) = requested else {
        let mut out: Vec<String> = KNOWN_ORDER
            .iter()
            .filter(|k| bases.contains(**k))
            .map(|k| k.to_string())
            .collect();
        out.extend(
            bases
                .iter()
                .filter(|b| !KNOWN_ORDER.contains(b))
                .map(|b| b.to_string()),
        );
        return Ok(out);
    };
    let mut out = Vec::new();
    for name in req {
        let name = name.trim();
        if let Some(base) = name.strip_suffix(":*") {
            let phases: Vec<String> = seen
                .iter()
                .filter(|m| m.split_once(':').is_some_and(|(b, _)| b == base))
                .map(|m| m.to_string())
                .collect();
            if phases.is_empty() {
                bail!(
                    "no rows for any phase of metric `{base}` (--metric {name}); {}",
                    available(&seen)
                );
            }
            out.extend(phases);
        } else {
            let has = if name.contains(':') {
                set.contains(name)
            } else {
                bases.contains(name)
            };
            if !has {
                bail!(
                    "no rows for metric `{name}` (--metric); {}",
                    available(&seen)
                );
            }
            out.push(name.to_string());
        }
    }
    Ok(out)
}

fn available(seen: &[&str]) -> String {
    const MAX: usize = 12;
    let mut s = format!("the input has: {}", seen[..seen.len().min(MAX)].join(", "));
    if seen.len() > MAX {
        s.push_str(&format!(" and {} more", seen.len() - MAX));
    }
    s
}

/// The samples of one metric: one row per (run, tool, algo, world_size, step, rank).
/// A plain name takes its own rows; where a sample has none, the sum of its `name:phase`
/// rows stands in (the total over phases). A `name:phase` takes exactly its rows.
pub fn samples(rows: &[MetricRow], metric: &str) -> Vec<MetricRow> {
    type Key<'a> = (&'a str, &'a str, &'a str, u32, u32, u32);
    fn key(r: &MetricRow) -> Key<'_> {
        (&r.run, &r.tool, &r.algo, r.world_size, r.step, r.rank)
    }
    let mut plain: BTreeMap<Key, f64> = BTreeMap::new();
    let mut phases: BTreeMap<Key, f64> = BTreeMap::new();
    let phase_of = !metric.contains(':');
    for r in rows {
        if r.metric == metric {
            // Duplicates (the same sample written twice) add up, as counters would.
            *plain.entry(key(r)).or_default() += r.value;
        } else if phase_of && base_name(&r.metric) == metric && r.metric.contains(':') {
            *phases.entry(key(r)).or_default() += r.value;
        }
    }
    for (k, v) in phases {
        plain.entry(k).or_insert(v);
    }
    plain
        .into_iter()
        .map(|((run, tool, algo, ws, step, rank), value)| MetricRow {
            run: run.into(),
            tool: tool.into(),
            algo: algo.into(),
            world_size: ws,
            step,
            rank,
            metric: metric.into(),
            value,
            settings: Default::default(),
        })
        .collect()
}

/// A grouping column of `--by`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Col {
    Run,
    Tool,
    Algo,
    WorldSize,
    Step,
    Rank,
}

impl Col {
    pub fn parse(s: &str) -> Result<Col> {
        Ok(match s.trim() {
            "run" => Col::Run,
            "tool" => Col::Tool,
            "algo" => Col::Algo,
            "world_size" | "P" | "p" => Col::WorldSize,
            "step" => Col::Step,
            "rank" => Col::Rank,
            other => bail!(
                "unknown column `{other}` (--by); choose from run, tool, algo, world_size, step, rank"
            ),
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Col::Run => "run",
            Col::Tool => "tool",
            Col::Algo => "algo",
            Col::WorldSize => "world_size",
            Col::Step => "step",
            Col::Rank => "rank",
        }
    }
    pub fn value(self, r: &MetricRow) -> KeyPart {
        match self {
            Col::Run => KeyPart::Str(r.run.clone()),
            Col::Tool => KeyPart::Str(r.tool.clone()),
            Col::Algo => KeyPart::Str(r.algo.clone()),
            Col::WorldSize => KeyPart::Num(r.world_size),
            Col::Step => KeyPart::Num(r.step),
            Col::Rank => KeyPart::Num(r.rank),
        }
    }
}

/// Parses a comma-separated `--by` list (empty: one group for everything).
pub fn parse_cols(s: &str) -> Result<Vec<Col>> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let c = Col::parse(part)?;
        if out.contains(&c) {
            bail!("column `{}` given twice (--by)", c.name());
        }
        out.push(c);
    }
    Ok(out)
}

/// One value of a grouping column; numbers sort as numbers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyPart {
    Num(u32),
    Str(String),
}

impl std::fmt::Display for KeyPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyPart::Num(n) => write!(f, "{n}"),
            KeyPart::Str(s) => f.write_str(s),
        }
    }
}

pub type Key = Vec<KeyPart>;

/// Groups samples by the values of `cols`, in sorted key order.
pub fn group<'a>(rows: &'a [MetricRow], cols: &[Col]) -> BTreeMap<Key, Vec<&'a MetricRow>> {
    let mut g: BTreeMap<Key, Vec<&MetricRow>> = BTreeMap::new();
    for r in rows {
        g.entry(cols.iter().map(|c| c.value(r)).collect())
            .or_default()
            .push(r);
    }
    g
}

/// How the samples of one group become one number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stat {
    /// Median over every (run, step, rank) sample of the group
    #[default]
    Median,
    /// Arithmetic mean over the samples
    Mean,
    /// Smallest sample
    Min,
    /// Largest sample
    Max,
    /// Sum of the samples (e.g. total bytes of all ranks over all steps)
    Sum,
    /// Median over the samples of the group's last step (e.g. final loss)
    Last,
}

impl Stat {
    /// Every statistic, in the order `--help` lists them.
    pub const ALL: &'static [Stat] = &[
        Stat::Median,
        Stat::Mean,
        Stat::Min,
        Stat::Max,
        Stat::Sum,
        Stat::Last,
    ];

    /// Its `--stat` name.
    pub const fn name(self) -> &'static str {
        match self {
            Stat::Median => "median",
            Stat::Mean => "mean",
            Stat::Min => "min",
            Stat::Max => "max",
            Stat::Sum => "sum",
            Stat::Last => "last",
        }
    }

    /// One line for `--help`.
    pub const fn help(self) -> Option<&'static str> {
        Some(match self {
            Stat::Median => "Median over every (run, step, rank) sample of the group",
            Stat::Mean => "Arithmetic mean over the samples",
            Stat::Min => "Smallest sample",
            Stat::Max => "Largest sample",
            Stat::Sum => "Sum of the samples (e.g. total bytes of all ranks over all steps)",
            Stat::Last => "Median over the samples of the group's last step (e.g. final loss)",
        })
    }

    /// Whether min–max is shown beside the value (where a spread is what people read).
    pub fn shows_range(self) -> bool {
        matches!(self, Stat::Median | Stat::Mean)
    }
}

gradkit_core::named!(Stat, "--stat");

/// Median of a non-empty slice (mean of the two middle values for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Summary of a group's samples under `stat`, with min and max of all samples.
/// NaN samples (e.g. a model value that does not exist) are left out; a group of NaN only
/// gives NaN.
pub fn aggregate(samples: &[&MetricRow], stat: Stat) -> Summary {
    let samples: Vec<&MetricRow> = samples
        .iter()
        .copied()
        .filter(|r| !r.value.is_nan())
        .collect();
    if samples.is_empty() {
        return Summary {
            value: f64::NAN,
            min: f64::NAN,
            max: f64::NAN,
        };
    }
    let values: Vec<f64> = samples.iter().map(|r| r.value).collect();
    let (min, max) = range(&values);
    let value = match stat {
        Stat::Median => median(&values),
        Stat::Mean => values.iter().sum::<f64>() / values.len() as f64,
        Stat::Min => min,
        Stat::Max => max,
        Stat::Sum => values.iter().sum(),
        Stat::Last => {
            let last = samples.iter().map(|r| r.step).max().unwrap_or(0);
            let at: Vec<f64> = samples
                .iter()
                .filter(|r| r.step == last)
                .map(|r| r.value)
                .collect();
            median(&at)
        }
    };
    Summary { value, min, max }
}

/// A group's statistic and the range of its samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub value: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// The median of non-empty `values` and their range.
    pub fn median_of(values: &[f64]) -> Summary {
        let (min, max) = range(values);
        Summary {
            value: median(values),
            min,
            max,
        }
    }
}

/// The smallest and the largest of `values`.
fn range(values: &[f64]) -> (f64, f64) {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (min, max)
}

/// Median per step over the other columns (ranks, runs) of the samples: a curve.
/// Non-finite values are left out (a plot cannot place them).
pub fn per_step_median(samples: &[&MetricRow]) -> Vec<(u32, f64)> {
    let mut by: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    for r in samples.iter().filter(|r| r.value.is_finite()) {
        by.entry(r.step).or_default().push(r.value);
    }
    by.into_iter().map(|(s, v)| (s, median(&v))).collect()
}

/// A stable label for one run: its name, or `algo P=N` when runs share names.
pub fn run_labels(rows: &[MetricRow]) -> HashMap<(String, String, u32), String> {
    let keys: BTreeSet<(String, String, u32)> = rows
        .iter()
        .map(|r| (r.run.clone(), r.algo.clone(), r.world_size))
        .collect();
    let names: BTreeSet<&str> = keys.iter().map(|k| k.0.as_str()).collect();
    let unique = names.len() == keys.len() && !names.contains("");
    keys.iter()
        .map(|k| {
            let label = if unique {
                k.0.clone()
            } else if k.0.is_empty() {
                format!("{} P={}", k.1, k.2)
            } else {
                format!("{} ({} P={})", k.0, k.1, k.2)
            };
            (k.clone(), label)
        })
        .collect()
}

/// Formats a number for a table: whole numbers in full, others with four significant digits
/// and no trailing zeros (`0.5`, `0.001234`, `1.5e-7`).
pub fn fmt(v: f64) -> String {
    if v.is_finite() && v == v.trunc() && v.abs() < 1e15 {
        return format!("{}", v as i64);
    }
    let s = gradkit_core::cli::fmt_num(v, 4);
    match s.split_once('e') {
        Some((m, e)) if m.contains('.') => {
            format!("{}e{e}", m.trim_end_matches('0').trim_end_matches('.'))
        }
        None if s.contains('.') => s.trim_end_matches('0').trim_end_matches('.').to_string(),
        _ => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: u32, rank: u32, metric: &str, value: f64) -> MetricRow {
        MetricRow {
            run: "r".into(),
            tool: "t".into(),
            algo: "a".into(),
            world_size: 2,
            step,
            rank,
            metric: metric.into(),
            value,
            settings: Default::default(),
        }
    }

    #[test]
    fn median_odd_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
    }

    #[test]
    fn plain_rows_win_over_phase_sums() {
        let rows = vec![
            row(0, 0, "bytes_sent", 5.0),
            row(0, 0, "bytes_sent:a", 1.0),
            row(0, 0, "bytes_sent:b", 2.0),
            row(0, 1, "bytes_sent:a", 10.0),
            row(0, 1, "bytes_sent:b", 20.0),
            row(0, 1, "bytes_sentx", 99.0),
        ];
        let s = samples(&rows, "bytes_sent");
        let got: Vec<(u32, f64)> = s.iter().map(|r| (r.rank, r.value)).collect();
        assert_eq!(got, vec![(0, 5.0), (1, 30.0)]);
        let s = samples(&rows, "bytes_sent:b");
        assert_eq!(
            s.iter().map(|r| r.value).collect::<Vec<_>>(),
            vec![2.0, 20.0]
        );
    }

    #[test]
    fn stats_by_hand() {
        let rows = [
            row(0, 0, "m", 1.0),
            row(0, 1, "m", 3.0),
            row(1, 0, "m", 10.0),
            row(1, 1, "m", f64::NAN),
        ];
        let refs: Vec<&MetricRow> = rows.iter().collect();
        assert_eq!(aggregate(&refs, Stat::Median).value, 3.0);
        assert_eq!(aggregate(&refs, Stat::Sum).value, 14.0);
        assert_eq!(aggregate(&refs, Stat::Last).value, 10.0);
        let s = aggregate(&refs, Stat::Mean);
        assert!((s.value - 14.0 / 3.0).abs() < 1e-12 && s.min == 1.0 && s.max == 10.0);
        assert!(aggregate(&refs[3..], Stat::Median).value.is_nan());
    }

    #[test]
    fn number_format() {
        assert_eq!(fmt(4018236.0), "4018236");
        assert_eq!(fmt(0.5), "0.5");
        assert_eq!(fmt(0.0012345), "0.001234");
        assert_eq!(fmt(2.5e-7), "2.5e-7");
        assert_eq!(fmt(f64::NAN), "NaN");
    }
}
