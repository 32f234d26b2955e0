//! The cost model's predictions as `metrics/1` rows (`model_bytes_sent`, `model_time_s`),
//! computed with each algorithm's formula (`gradkit_collectives::Algo::cost`; no MPI linked) for inputs that do not carry them.
//!
//! Tools that know the run's `n` and `k` write these rows themselves; here they are computed
//! from `--n`/`--density`, α and the bandwidth given on the command line.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{anyhow, bail, Result};
use gradkit_core::MetricRow;
use gradkit_cost as cost;

/// Parameters of the α-β model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelParams {
    /// Gradient size n in elements (f32 words).
    pub n: f64,
    /// Selected elements per rank k (≥ 1).
    pub k: f64,
    /// Start-up latency α in seconds per message.
    pub alpha: f64,
    /// Seconds per 4-byte word (β).
    pub beta_word: f64,
}

/// The run name of computed model rows.
pub const RUN: &str = "cost-model";

/// A model size in elements, as gradallreduce model reads `--n`: `110M` = 110,000,000,
/// `16Mi` = 2^24 ([`gradkit_core::budget::parse_count`]).
pub fn parse_size(s: &str) -> Result<u64> {
    let n = gradkit_core::budget::parse_count(s).map_err(|e| anyhow!("{e} (--n)"))?;
    if n == 0 {
        bail!("`{s}` is not a positive size (--n)");
    }
    Ok(n)
}

impl ModelParams {
    /// From the command line's units: α in µs, bandwidth in GB/s.
    pub fn new(n: u64, density: f64, alpha_us: f64, bandwidth_gbps: f64) -> Result<Self> {
        if !(density > 0.0 && density <= 1.0) {
            bail!("density {density} is not in (0, 1] (--density)");
        }
        if alpha_us.is_nan() || alpha_us < 0.0 || bandwidth_gbps.is_nan() || bandwidth_gbps <= 0.0 {
            bail!("--alpha-us must be ≥ 0 and --bandwidth-gbps > 0");
        }
        let n = n as f64;
        Ok(ModelParams {
            n,
            k: (density * n).floor().max(1.0),
            alpha: alpha_us * 1e-6,
            beta_word: 4.0 / (bandwidth_gbps * 1e9),
        })
    }

    /// The model's cost of `algo` at `p` ranks, if the model knows the algorithm.
    pub fn cost(&self, algo: &str, p: u32) -> Option<cost::Cost> {
        gradkit_collectives::Algo::cost_by_name(algo, p as usize, self.n, self.k)
    }
}

/// Model rows (`model_bytes_sent`, `model_time_s`) for every algorithm of `rows` that has no
/// such rows yet, at the world sizes of `rows` plus `extra_ps`. Returns the rows and the
/// algorithms the model does not know.
pub fn complete(
    rows: &[MetricRow],
    params: &ModelParams,
    extra_ps: &[u32],
) -> (Vec<MetricRow>, Vec<String>) {
    let mut have: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut algos: BTreeSet<&str> = BTreeSet::new();
    let mut ps: BTreeSet<u32> = extra_ps.iter().copied().collect();
    for r in rows {
        if r.metric.starts_with("model_") {
            have.entry(r.metric.as_str()).or_default().insert(&r.algo);
        } else {
            algos.insert(&r.algo);
            ps.insert(r.world_size);
        }
    }
    let mut out = Vec::new();
    let mut unknown = Vec::new();
    for algo in algos {
        if params.cost(algo, 2).is_none() {
            unknown.push(algo.to_string());
            continue;
        }
        for &p in &ps {
            let Some(c) = params.cost(algo, p) else {
                continue;
            };
            for (metric, value) in [
                ("model_bytes_sent", c.bytes()),
                ("model_time_s", c.time(params.alpha, params.beta_word)),
            ] {
                if have.get(metric).is_some_and(|a| a.contains(algo)) {
                    continue;
                }
                out.push(MetricRow {
                    run: RUN.into(),
                    tool: "gradreport".into(),
                    algo: algo.into(),
                    world_size: p,
                    step: 0,
                    rank: 0,
                    metric: metric.into(),
                    value,
                    settings: Default::default(),
                });
            }
        }
    }
    (out, unknown)
}

/// Powers of two from `from` (rounded up) to `to`.
pub fn powers_of_two(from: u32, to: u32) -> Vec<u32> {
    let mut v = Vec::new();
    let mut p = from.max(1).next_power_of_two();
    while p <= to {
        v.push(p);
        match p.checked_mul(2) {
            Some(q) => p = q,
            None => break,
        }
    }
    v
}
