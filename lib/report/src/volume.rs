//! `gradreport volume`: measured bytes per rank and step next to the cost model's formula.
//!
//! The formula value comes from `model_<metric>` rows in the input (written by the tool that
//! ran the algorithm, from its formula); groups without them show `-`.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use gradkit_core::cli::TextTable;
use gradkit_core::MetricRow;

use crate::metrics::{self, Col, Key, Stat, Summary};

/// What `gradreport volume` compares.
#[derive(Clone, Debug)]
pub struct VolumeOpts {
    pub by: Vec<Col>,
    /// The measured metric (`bytes_sent` by default); the model's is `model_<metric>`.
    pub metric: String,
    /// One row per phase (`<metric>:<phase>`) under each group's total.
    pub phases: bool,
}

/// One line of the comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeLine {
    pub key: Key,
    /// `total`, or the phase name.
    pub phase: String,
    /// Median, min and max over the (run, step, rank) samples.
    pub measured: Summary,
    /// The model's value (median over its rows), if the input has it.
    pub model: Option<f64>,
}

impl VolumeLine {
    /// measured / model: 1.00 means the formula is exact.
    pub fn ratio(&self) -> Option<f64> {
        let m = self.model?;
        if m == 0.0 {
            return (self.measured.value == 0.0).then_some(1.0);
        }
        Some(self.measured.value / m)
    }
}

/// The model's metric name for a measured one: `model_bytes_sent`, `model_bytes_sent:phase`.
pub fn model_name(metric: &str) -> String {
    format!("model_{metric}")
}

/// Compares measured and modelled volume per group (and phase).
pub fn volume(rows: &[MetricRow], opts: &VolumeOpts) -> Result<Vec<VolumeLine>> {
    metrics::expand(rows, Some(std::slice::from_ref(&opts.metric)))?;
    let mut names: Vec<(String, String)> = vec![("total".into(), opts.metric.clone())];
    if opts.phases {
        let mut seen = BTreeSet::new();
        for r in rows {
            if let Some((b, p)) = r.metric.split_once(':') {
                if b == opts.metric && seen.insert(p.to_string()) {
                    names.push((p.to_string(), r.metric.clone()));
                }
            }
        }
    }
    let mut lines = Vec::new();
    let mut per_key: BTreeMap<Key, Vec<VolumeLine>> = BTreeMap::new();
    for (phase, name) in &names {
        let measured = metrics::samples(rows, name);
        let model = metrics::samples(rows, &model_name(name));
        let mg = metrics::group(&model, &opts.by);
        for (k, v) in metrics::group(&measured, &opts.by) {
            let model = mg
                .get(&k)
                .map(|m| metrics::aggregate(m, Stat::Median).value)
                .filter(|v| !v.is_nan());
            per_key.entry(k.clone()).or_default().push(VolumeLine {
                key: k,
                phase: phase.clone(),
                measured: metrics::aggregate(&v, Stat::Median),
                model,
            });
        }
    }
    for (_, v) in per_key {
        lines.extend(v);
    }
    Ok(lines)
}

/// The comparison as a text table.
pub fn render(lines: &[VolumeLine], opts: &VolumeOpts) -> TextTable {
    let m = &opts.metric;
    let mut header: Vec<String> = opts.by.iter().map(|c| c.name().to_string()).collect();
    if opts.phases {
        header.push("phase".into());
    }
    header.extend([
        m.clone(),
        format!("{m}_min"),
        format!("{m}_max"),
        model_name(m),
        "ratio".into(),
    ]);
    let mut t = TextTable::new(header);
    for l in lines {
        let mut row: Vec<String> = l.key.iter().map(|p| p.to_string()).collect();
        if opts.phases {
            row.push(l.phase.clone());
        }
        row.push(metrics::fmt(l.measured.value));
        row.push(metrics::fmt(l.measured.min));
        row.push(metrics::fmt(l.measured.max));
        row.push(l.model.map_or("-".into(), metrics::fmt));
        row.push(l.ratio().map_or("-".into(), |r| format!("{r:.2}")));
        t.push(row);
    }
    t
}
