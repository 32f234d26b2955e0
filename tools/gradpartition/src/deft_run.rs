//! `--method deft`: the DEFT planner (deft.md §1.2–1.4) run step by step over a dense trace,
//! its per-worker costs, selections and build-up as metrics, and the summary tables.

use anyhow::Result;
use gradkit_core::cli::{self, fmt_num, TextTable};
use gradkit_core::io::TraceReader;
use gradkit_core::trace::MetricSink;
use gradkit_core::TensorRow;
use gradkit_partition::deft;

use crate::{summary, Cli, Outputs};

/// Plans every step of `trace` for `p` workers selecting `k` entries in all.
pub(crate) fn run(
    a: &Cli,
    trace: &mut TraceReader,
    p: usize,
    k: u64,
    sink: &mut MetricSink,
    out: &mut Outputs,
) -> Result<()> {
    let layout = &trace.layout;
    let ranks = trace.ranks();
    let mut planner = deft::DeftPlanner::new(layout, p, k, a.topup, !a.no_residual);
    let n = layout.total();
    let steps = trace.steps().len();
    let mut totals = Totals::new(p, k, deft::topk_cost(n, k));
    let pb = cli::progress("deft", steps as u64, a.io.quiet);
    while let Some((step, rows)) = trace.next_step()? {
        let grads = step_grads(rows, ranks, n as usize);
        let st = planner.step_owned(step, grads, &topk, !a.no_buildup);
        totals.record(step, &st, sink);
        out.step(st.rows, sink)?;
        pb.inc(1);
    }
    pb.finish_and_clear();
    if !a.io.quiet {
        gradkit_core::noteln!(
            "deft: {steps} steps, P = {p}, n = {n}, k = {k}, {} pieces",
            planner.pieces.len()
        );
        totals.print(a, steps as f64)?;
    }
    Ok(())
}

/// One step's flat dense gradients, one per rank (ranks 0..R, checked complete), each rank's
/// rows dropped as soon as they are copied.
fn step_grads(rows: Vec<TensorRow>, ranks: usize, n: usize) -> Vec<Vec<f32>> {
    let mut by_rank: Vec<Vec<TensorRow>> = (0..ranks).map(|_| Vec::new()).collect();
    for r in rows {
        by_rank[r.rank as usize].push(r);
    }
    by_rank
        .into_iter()
        .map(|rows| gradkit_core::trace::take_flat(rows, n))
        .collect()
}

/// Indices of the k largest |x| (gradkit-sparsify's exact top-k, ties to the lower index).
fn topk(x: &[f32], k: usize) -> Vec<u32> {
    gradkit_sparsify::topk::topk_indices(x, k)
}

/// Running sums over the steps, for the summary.
struct Totals {
    k: u64,
    topk_cost: f64,
    loads: Vec<f64>,
    imbalance: f64,
    worst_imbalance: f64,
    cost_max: f64,
    buildup_deft: f64,
    buildup_topk: f64,
    /// Per-step measured speedups; the summary shows their median (one preempted step on a
    /// loaded machine would dominate a ratio of sums).
    measured: Vec<f64>,
}

impl Totals {
    fn new(p: usize, k: u64, topk_cost: f64) -> Self {
        Totals {
            k,
            topk_cost,
            loads: vec![0.0; p],
            imbalance: 0.0,
            worst_imbalance: 0.0,
            cost_max: 0.0,
            buildup_deft: 0.0,
            buildup_topk: 0.0,
            measured: Vec::new(),
        }
    }

    /// One step's metrics (per worker, then the step's own) and their running sums.
    fn record(&mut self, step: u32, st: &deft::DeftStep, sink: &mut MetricSink) {
        let p = self.loads.len();
        let cmax = st.loads.iter().cloned().fold(0.0, f64::max);
        let mean = st.loads.iter().sum::<f64>() / p as f64;
        let imb = if mean > 0.0 { cmax / mean } else { 1.0 };
        for (w, total) in self.loads.iter_mut().enumerate() {
            let r = w as u32;
            sink.push(step, r, "cost_load", st.loads[w]);
            sink.push(step, r, "k_assigned", st.worker_k[w] as f64);
            sink.push(step, r, "k_selected", st.worker_selected[w] as f64);
            sink.push(step, r, "time_select_s", st.worker_select_s[w]);
            sink.push(step, r, "elements_assigned", st.worker_elements[w] as f64);
            *total += st.loads[w];
        }
        let bd = st.union_deft as f64 / self.k as f64;
        sink.push(step, 0, "leader", st.leader as f64);
        sink.push(step, 0, "pieces", st.ks.len() as f64);
        sink.push(step, 0, "cost_max", cmax);
        sink.push(step, 0, "cost_imbalance", imb);
        sink.push(step, 0, "cost_topk", self.topk_cost);
        sink.push(
            step,
            0,
            "selection_speedup_predicted",
            self.topk_cost / cmax,
        );
        let tmax = st.worker_select_s.iter().cloned().fold(0.0, f64::max);
        if let Some(tt) = st.topk_select_s {
            sink.push(step, 0, "time_select_topk_s", tt);
            sink.push(step, 0, "time_select_deft_max_s", tmax);
            if tmax > 0.0 {
                sink.push(step, 0, "selection_speedup_measured", tt / tmax);
                self.measured.push(tt / tmax);
            }
        }
        sink.push(step, 0, "k_total", st.ks.iter().sum::<u64>() as f64);
        sink.push(step, 0, "buildup_deft", bd);
        if let Some(u) = st.union_topk {
            let bt = u as f64 / self.k as f64;
            sink.push(step, 0, "buildup_topk", bt);
            self.buildup_topk += bt;
        }
        self.imbalance += imb;
        self.cost_max += cmax;
        self.buildup_deft += bd;
        self.worst_imbalance = self.worst_imbalance.max(imb);
    }

    /// The two summary tables: each worker's mean load, then the run's quantities.
    fn print(mut self, a: &Cli, s: f64) -> Result<()> {
        let p = self.loads.len() as f64;
        let mean_load = self.loads.iter().sum::<f64>() / (p * s);
        let mut t = TextTable::new(["worker", "mean_cost_load", "load/mean"]);
        for (w, l) in self.loads.iter().enumerate() {
            let (mean, rel) = (fmt_num(l / s, 4), fmt_num(l / s / mean_load, 4));
            t.push([w.to_string(), mean, rel]);
        }
        summary(a, &t)?;
        let mut t = TextTable::new(["quantity", "value"]);
        let mut row = |q: &str, v: f64| t.push([q.to_string(), fmt_num(v, 4)]);
        row("imbalance max/mean (mean over steps)", self.imbalance / s);
        row("imbalance max/mean (worst step)", self.worst_imbalance);
        row("DEFT cost max_i C_i (mean)", self.cost_max / s);
        row("Top-k cost n·log2 k", self.topk_cost);
        row(
            "selection speedup, predicted n·log2 k / max_i C_i",
            self.topk_cost * s / self.cost_max,
        );
        if !self.measured.is_empty() {
            self.measured.sort_by(f64::total_cmp);
            row(
                "selection speedup, measured top-k time / max worker time (median)",
                self.measured[self.measured.len() / 2],
            );
        }
        row("build-up DEFT union/k (mean)", self.buildup_deft / s);
        if !a.no_buildup {
            row("build-up Top-k union/k (mean)", self.buildup_topk / s);
        }
        summary(a, &t)
    }
}
