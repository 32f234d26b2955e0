//! `gradreport table`: one row per group of `--by` columns, one column per metric.

use std::collections::{BTreeMap, BTreeSet};

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
    let mut cells: Vec<BTreeMap<Key, metrics::Summary>> = Vec::new();
    let mut keys: BTreeSet<Key> = BTreeSet::new();
    for m in &names {
        let s = metrics::samples(rows, m);
        let g = metrics::group(&s, &opts.by);
        let col: BTreeMap<Key, metrics::Summary> = g
            .into_iter()
            .map(|(k, v)| (k, metrics::aggregate(&v, opts.stat)))
            .collect();
        keys.extend(col.keys().cloned());
        cells.push(col);
    }
    let split_range = opts.format != Format::Md && opts.range && opts.stat.shows_range();
    let mut header: Vec<String> = opts.by.iter().map(|c| c.name().to_string()).collect();
    for m in &names {
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
                Some(s) => row.push(cell(s, opts.range && opts.stat.shows_range())),
            }
        }
        t.push(row);
    }
    Ok(t)
}

fn column_name(metric: &str, stat: Stat, format: Format) -> String {
    match (stat, format) {
        (Stat::Median, _) => metric.to_string(),
        (s, Format::Md) => format!("{metric} ({})", stat_name(s)),
        (s, _) => format!("{metric}_{}", stat_name(s)),
    }
}

fn stat_name(s: Stat) -> &'static str {
    match s {
        Stat::Median => "median",
        Stat::Mean => "mean",
        Stat::Min => "min",
        Stat::Max => "max",
        Stat::Sum => "sum",
        Stat::Last => "last",
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
