//! `--method oktopk`: Ok-Topk's balanced space partition (PPoPP'22 §3.1.1) recomputed every
//! `--period` steps from the ranks' local selections, each step's region counts and words
//! received under it and under equal-size regions as metrics, and the summary tables.

use anyhow::{Context, Result};
use gradkit_core::cli::{fmt_num, TextTable};
use gradkit_core::io::TraceReader;
use gradkit_core::trace::{self, MetricSink};
use gradkit_partition::oktopk;

use crate::{summary, Cli, Outputs};

/// Plans every step of `trace` (sparse local selections) for `p` workers.
pub(crate) fn run(
    a: &Cli,
    trace: &mut TraceReader,
    p: usize,
    sink: &mut MetricSink,
    out: &mut Outputs,
) -> Result<()> {
    let n = trace.layout.total();
    let steps = trace.steps().len();
    let recompute = oktopk::period_steps(trace.steps(), a.period);
    let naive = oktopk::naive_boundaries(p, n);
    let mut bounds = naive.clone();
    let mut totals = Totals::new(p);
    let mut recompute_it = recompute.iter();
    while let Some((step, rows)) = trace.next_step()? {
        let new = *recompute_it
            .next()
            .context("internal: a step the first pass did not see")?;
        // Each rank's sorted flat selection.
        let sels: Vec<Vec<u32>> = trace::group_step_rank(&rows)
            .iter()
            .map(|g| trace::flatten_sparse(&g.rows, &trace.layout).indices)
            .collect();
        drop(rows);
        let refs: Vec<&[u32]> = sels.iter().map(|s| s.as_slice()).collect();
        let mut plan = Vec::new();
        if new {
            totals.few += refs.iter().filter(|s| s.len() < p).count();
            bounds = match a.naive {
                true => naive.clone(),
                false => oktopk::balanced_boundaries(&refs, p, n),
            };
            plan.extend(oktopk::region_rows(&trace.layout, &bounds, step));
            for w in 0..p {
                let (s, e) = oktopk::region(&bounds, w, n);
                sink.push(step, w as u32, "region_size", (e - s) as f64);
            }
        }
        let planned = totals.regions(step, &bounds, &refs, "", sink);
        let equal = totals.regions(step, &naive, &refs, "_naive", sink);
        totals.add(planned, equal);
        out.step(plan, sink)?;
    }
    if !a.io.quiet {
        gradkit_core::noteln!(
            "oktopk{}: {steps} steps, {} plan steps, P = {p}, n = {n}",
            if a.naive { " --naive" } else { "" },
            recompute.iter().filter(|r| **r).count()
        );
        totals.print(a, steps as f64)?;
    }
    Ok(())
}

/// One step's figures under one set of boundaries.
struct Regions {
    counts: Vec<u64>,
    imbalance: f64,
    max_words: u64,
}

/// Running sums over the steps, for the summary.
struct Totals {
    /// (plan step, rank) pairs that selected fewer than P entries.
    few: usize,
    imbalance: [f64; 2],
    max_words: [u64; 2],
    counts: Vec<u64>,
}

impl Totals {
    fn new(p: usize) -> Self {
        Totals {
            few: 0,
            imbalance: [0.0; 2],
            max_words: [0; 2],
            counts: vec![0; p],
        }
    }

    /// The entries each region receives and the words each worker receives in
    /// split-and-reduce under boundaries `b`, as metrics named with `suffix`.
    fn regions(
        &self,
        step: u32,
        b: &[u64],
        refs: &[&[u32]],
        suffix: &str,
        sink: &mut MetricSink,
    ) -> Regions {
        let p = self.counts.len();
        let mut counts = vec![0u64; p];
        for s in refs {
            for (c, x) in counts.iter_mut().zip(oktopk::region_counts(b, s)) {
                *c += x;
            }
        }
        let words = oktopk::recv_words(b, refs);
        for w in 0..p {
            let entries = counts[w] as f64;
            sink.push(step, w as u32, &format!("region_entries{suffix}"), entries);
            let recv = words[w] as f64;
            sink.push(step, w as u32, &format!("recv_words{suffix}"), recv);
        }
        let mean = counts.iter().sum::<u64>() as f64 / p as f64;
        let max = counts.iter().copied().max().unwrap_or(0) as f64;
        let imbalance = if mean > 0.0 { max / mean } else { 1.0 };
        sink.push(step, 0, &format!("region_imbalance{suffix}"), imbalance);
        let max_words = words.iter().copied().max().unwrap_or(0);
        Regions {
            counts,
            imbalance,
            max_words,
        }
    }

    /// Adds one step's figures under the planned and the equal-size boundaries.
    fn add(&mut self, planned: Regions, equal: Regions) {
        for (s, c) in self.counts.iter_mut().zip(&planned.counts) {
            *s += c;
        }
        for (i, r) in [planned, equal].iter().enumerate() {
            self.imbalance[i] += r.imbalance;
            self.max_words[i] = self.max_words[i].max(r.max_words);
        }
    }

    /// The two summary tables: each worker's mean region entries, then planned vs equal-size.
    fn print(&self, a: &Cli, s: f64) -> Result<()> {
        let p = self.counts.len();
        if self.few > 0 {
            gradkit_core::noteln!(
                "note: {} (plan step, rank) pairs selected fewer than P = {p} entries; those ranks contributed equal-size cut points",
                self.few
            );
        }
        let mut t = TextTable::new(["worker", "mean_region_entries"]);
        for (w, c) in self.counts.iter().enumerate() {
            t.push([w.to_string(), fmt_num(*c as f64 / s, 4)]);
        }
        summary(a, &t)?;
        let mut t = TextTable::new(["quantity", "planned", "equal-size"]);
        t.push([
            "imbalance max/mean (mean over steps)".to_string(),
            fmt_num(self.imbalance[0] / s, 4),
            fmt_num(self.imbalance[1] / s, 4),
        ]);
        t.push([
            "max words received in split-and-reduce".to_string(),
            self.max_words[0].to_string(),
            self.max_words[1].to_string(),
        ]);
        summary(a, &t)
    }
}
