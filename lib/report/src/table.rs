//! `gradreport table`: one row per group of `--by` columns, one column per metric.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use anyhow::Result;
use gradkit_core::cli::{Format, TextTable};
use gradkit_core::MetricRow;

use crate::metrics::{self, Col, Key, Stat};

/// What `gradreport table` shows.
#[derive(Clone, Debug)]
pub struct TableOpts {
    pub by: Vec<Col>,
    /// Metric expressions (`name`, `name:phase`, `name:*`); `None`: every base name.
    pub metrics: Option<Vec<String>>,
    pub stat: Stat,
    /// Show min–max beside medians and means.
    pub range: bool,
    pub format: Format,
}

/// Pivots `rows` into a text table (see [`TableOpts`]).
pub fn table(rows: &[MetricRow], opts: &TableOpts) -> Result<TextTable> {
    let names = metrics::expand(rows, opts.metrics.as_deref())?;
    let cells = names
        .iter()
        .map(|m| column(rows, m, opts))
        .collect::<Vec<_>>();
    render(&names, cells, opts, opts.stat.shows_range())
}

/// As [`table`], with each range of `repeats` (one input file's rows within `rows`) one repeat
/// of the same runs: a group's `--stat` is taken within each repeat alone, and its cell is the
/// median over the repeats that have the group, with the repeats' min–max as its range. A ratio
/// or time is thus summarised per repeat first (a median over steps), then across repeats.
pub fn table_over_repeats(
    rows: &[MetricRow],
    repeats: &[Range<usize>],
    opts: &TableOpts,
) -> Result<TextTable> {
    let names = metrics::expand(rows, opts.metrics.as_deref())?;
    let mut cells = Vec::new();
    for m in &names {
        let mut per: BTreeMap<Key, Vec<f64>> = BTreeMap::new();
        for r in repeats {
            for (k, s) in column(&rows[r.clone()], m, opts) {
                if !s.value.is_nan() {
                    per.entry(k).or_default().push(s.value);
                }
            }
        }
        let col = per
            .into_iter()
            .map(|(k, v)| (k, metrics::Summary::median_of(&v)))
            .collect();
        cells.push(col);
    }
    // The repeats' range is shown whatever the statistic (a sum or a last value varies too).
    render(&names, cells, opts, true)
}

/// One metric's cells: its samples grouped by `--by`, each group under `--stat`.
fn column(rows: &[MetricRow], metric: &str, opts: &TableOpts) -> BTreeMap<Key, metrics::Summary> {
    let s = metrics::samples(rows, metric);
    metrics::group(&s, &opts.by)
        .into_iter()
        .map(|(k, v)| (k, metrics::aggregate(&v, opts.stat)))
        .collect()
}

fn render(
    names: &[String],
    cells: Vec<BTreeMap<Key, metrics::Summary>>,
    opts: &TableOpts,
    ranged: bool,
) -> Result<TextTable> {
    let keys: BTreeSet<Key> = cells.iter().flat_map(|c| c.keys().cloned()).collect();
    let split_range = opts.format != Format::Md && opts.range && ranged;
    let mut header: Vec<String> = opts.by.iter().map(|c| c.name().to_string()).collect();
    for m in names {
        header.push(column_name(m, opts.stat, opts.format));
        if split_range {
            header.push(format!("{m}_min"));
            header.push(format!("{m}_max"));
        }
    }
    let mut t = TextTable::new(header);
    for k in &keys {
        let mut row: Vec<String> = k.iter().map(|p| p.to_string()).collect();
        for col in &cells {
            match col.get(k) {
                None => {
                    row.push("-".into());
                    if split_range {
                        row.extend(["-".into(), "-".into()]);
                    }
                }
                Some(s) if split_range => row.extend([
                    metrics::fmt(s.value),
                    metrics::fmt(s.min),
                    metrics::fmt(s.max),
                ]),
                Some(s) => row.push(cell(s, opts.range && ranged)),
            }
        }
        t.push(row);
    }
    Ok(t)
}

fn column_name(metric: &str, stat: Stat, format: Format) -> String {
    match (stat, format) {
        (Stat::Median, _) => metric.to_string(),
        (s, Format::Md) => format!("{metric} ({})", s.name()),
        (s, _) => format!("{metric}_{}", s.name()),
    }
}

/// A Markdown cell: the value, and `(min–max)` when the samples differ.
fn cell(s: &metrics::Summary, range: bool) -> String {
    if range && s.min < s.max {
        format!(
            "{} ({}–{})",
            metrics::fmt(s.value),
            metrics::fmt(s.min),
            metrics::fmt(s.max)
        )
    } else {
        metrics::fmt(s.value)
    }
}
