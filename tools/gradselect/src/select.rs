//! gradselect's run: the trace read step by step ([`TraceReader`]), each rank's accumulator
//! compensated with its residual, selected by the method (DEFT: planned by the step's leader
//! first), and the outputs written as the steps complete and committed together.

use std::time::Instant;

use anyhow::{Context, Result};
use gradkit_core::cli;
use gradkit_core::io::{
    Expect, Input, Meta, Output, RankRows, ReadOptions, TableWriter, TraceReader,
};
use gradkit_core::keep::Keep;
use gradkit_core::trace::{self, Layout, MetricSink, Sparse};
use gradkit_core::{read_table, MetricRow, PlanRow, TensorRow};
use gradkit_partition::deft as pdeft;
use gradkit_partition::plan as pplan;
use gradkit_sparsify::kernels::Kernels;
use gradkit_sparsify::resident::{self, DVec, DeviceKernels};
use gradkit_sparsify::selection::Configured;
use gradkit_sparsify::{deft, Leaves, Method, Residual, Selector};

use crate::{Cli, Scope};

/// What gradselect says when its input is not a dense trace.
const NEEDS: &str = "gradselect needs a dense tensor/1 trace, e.g. from `gradtrace synthetic`";

pub(crate) fn body(a: &Cli, configured: Configured, keep: Option<Keep>) -> Result<()> {
    check_paths(a)?;
    // Before anything is read or created: `--device cuda` without a usable GPU is one line.
    let kernels = gradkit_cuda::kernels_for(a.device)?;
    let input = a.io.input()?;
    let output = a.io.output()?;
    let metrics_out = cli::output_flag("--metrics", a.metrics.as_deref())?;
    let residual_out = cli::output_flag("--residual-out", a.residual_out.as_deref())?;
    let mut trace = TraceReader::open(&input, a.io.read_options(), Expect::dense(NEEDS))?;
    let n = trace.flat_len()?;
    let p = trace.ranks();
    let plan = match &a.plan {
        Some(path) => Some(load_plan(path, &trace.layout, p, trace.steps())?),
        None => None,
    };
    let algo = configured.selection().name();
    let meta = out_meta(a, &configured, keep, p);
    // Outputs are written as the steps complete; each appears at its path only when finished.
    let mut w = Writers::create(
        &output,
        metrics_out.as_ref(),
        residual_out.as_ref(),
        &meta,
        algo,
    )?;
    let mut run = Run::new(a, (configured, kernels), keep, &trace.layout, p, plan);
    run.resident = gradkit_cuda::resident_for(a.device)?;
    let steps = trace.steps().to_vec();
    let pb = cli::progress("gradselect", steps.len() as u64, a.io.quiet);
    for &step in &steps {
        run.step(step, &mut trace, &mut w)?;
        pb.inc(1);
    }
    pb.finish_and_clear();
    let last = steps[steps.len() - 1];
    run.download_residuals();
    w.commit(&run.states, &trace.layout, last)?;
    if !a.io.quiet {
        let all = steps.len() * p * n;
        gradkit_core::noteln!(
            "gradselect: {algo}: {} steps × {p} ranks, {} entries selected of {all} ({:.4}%)",
            steps.len(),
            run.total,
            100.0 * run.total as f64 / all.max(1) as f64
        );
        if let Some(line) = gradkit_cuda::transfer_note("gradselect", a.device) {
            gradkit_core::noteln!("{line}");
        }
    }
    Ok(())
}

/// No output may overwrite an input or another output.
fn check_paths(a: &Cli) -> Result<()> {
    gradkit_core::paths::check_distinct(
        &[("IN", a.io.input.as_deref()), ("--plan", a.plan.as_deref())],
        &[
            ("-o", cli::stdout_if_absent(a.io.output.as_deref())),
            ("--residual-out", a.residual_out.as_deref()),
            ("--metrics", a.metrics.as_deref()),
        ],
    )
}

/// The selection's metadata: the method and every parameter it read.
fn out_meta(a: &Cli, configured: &Configured, keep: Option<Keep>, p: usize) -> Meta {
    let mut meta = Meta::producer("gradselect");
    meta.set("method", configured.selection().name())
        .set("world_size", p)
        .set("scope", format!("{:?}", a.scope).to_lowercase())
        .set("residual", !a.no_residual);
    match keep {
        Some(Keep::Density(d)) => {
            meta.set("density", d);
        }
        Some(Keep::K(k)) => {
            meta.set("k", k);
        }
        None => {}
    }
    match configured {
        Configured::Local(Method::Threshold(t)) => {
            meta.set("threshold", t);
        }
        Configured::Local(Method::OkTopk { reeval, adjust }) => {
            meta.set("reeval", reeval).set("adjust", adjust.label());
        }
        Configured::Local(Method::Dgc { sample }) => {
            meta.set("sample", sample);
        }
        Configured::Local(Method::RandomK { seed }) => {
            meta.set("seed", seed);
        }
        Configured::Local(Method::Topk | Method::GaussianK) => {}
        Configured::Deft { topup } => {
            let plan = a.plan.as_ref();
            meta.set(
                "plan",
                plan.map_or("in-process".to_string(), |p| p.display().to_string()),
            )
            .set("topup", topup);
        }
    }
    meta
}

/// The run's name in the metrics: `--run`, else the method and what it keeps
/// (`topk-d0.01`, `topk-k1000`).
fn run_name(a: &Cli, algo: &str, keep: Option<Keep>) -> String {
    a.run
        .clone()
        .unwrap_or_else(|| cli::default_run_name(algo, keep))
}

/// k of `n` entries: what `keep` says, 0 with nothing to keep (threshold selects no k).
fn k_of(keep: Option<Keep>, n: usize) -> usize {
    keep.map_or(0, |keep| keep.k(n as u64) as usize)
}

/// The run's outputs, written as the steps complete.
struct Writers {
    out: TableWriter<TensorRow>,
    metrics: Option<TableWriter<MetricRow>>,
    residual: Option<TableWriter<TensorRow>>,
}

impl Writers {
    /// Opens every output now: a path one cannot be created at stops the run before any step
    /// (--residual-out too, though it is written after the last step).
    fn create(
        output: &Output,
        metrics: Option<&Output>,
        residual: Option<&Output>,
        meta: &Meta,
        algo: &str,
    ) -> Result<Self> {
        let metrics = match metrics {
            Some(m) => {
                let mut mm = Meta::producer("gradselect");
                mm.set("method", algo);
                Some(TableWriter::<MetricRow>::create(m, &mm)?)
            }
            None => None,
        };
        let out = TableWriter::<TensorRow>::create(output, meta)?;
        let residual = match residual {
            Some(rout) => {
                let mut rm = meta.clone();
                rm.set("content", "residual");
                Some(TableWriter::<TensorRow>::create(rout, &rm)?)
            }
            None => None,
        };
        Ok(Writers {
            out,
            metrics,
            residual,
        })
    }

    /// The step's metric rows go out (or are dropped without --metrics).
    fn flush_metrics(&mut self, sink: &mut MetricSink) -> Result<()> {
        match &mut self.metrics {
            Some(w) => w.write_owned(std::mem::take(&mut sink.rows)),
            None => {
                sink.rows.clear();
                Ok(())
            }
        }
    }

    /// Every output is complete before any is given its name: they appear together or not at
    /// all. The residuals are those after the last step.
    fn commit(self, states: &[RankState], layout: &Layout, last: u32) -> Result<()> {
        let mut files = Vec::new();
        if let Some(mut w) = self.residual {
            for (r, st) in states.iter().enumerate() {
                let values = &st.residual.values;
                w.write_owned(trace::unflatten_dense(values, layout, last, r as u32))?;
            }
            files.extend(w.close()?);
        }
        if let Some(w) = self.metrics {
            files.extend(w.close()?);
        }
        files.extend(self.out.close()?);
        gradkit_core::paths::commit_all(files)
    }
}

/// Per-rank state: one selector per index space, and the residual.
struct RankState {
    selectors: Vec<Selector>,
    residual: Residual,
    /// The residual resident on the device (`--device cuda`), between steps.
    dres: Option<DVec>,
}

/// What one (step, rank) selection produced.
struct Out {
    sparse: Sparse,
    k_target: usize,
    threshold: Option<f32>,
    exact_topk: bool,
    time: f64,
}

/// DEFT's part of a run: its pieces of the model, `--plan`'s plan (absent: planned by each
/// step's leader) and `--topup`.
struct DeftRun {
    topup: bool,
    pieces: Vec<pdeft::Piece>,
    plan: Option<Plan>,
}

/// The selection across steps: every rank's selectors (none for DEFT) and residual, DEFT's
/// pieces and plan.
struct Run {
    states: Vec<RankState>,
    keep: Option<Keep>,
    deft: Option<DeftRun>,
    residual_on: bool,
    sink: MetricSink,
    n: usize,
    total: usize,
    /// The device the selection runs on with the rank's tensors resident (docs/GPU.md §7).
    resident: Option<&'static dyn DeviceKernels>,
}

impl Run {
    fn new(
        a: &Cli,
        (configured, kernels): (Configured, &'static dyn Kernels),
        keep: Option<Keep>,
        layout: &Layout,
        p: usize,
        plan: Option<Plan>,
    ) -> Self {
        let residual_on = !a.no_residual;
        let n = layout.total() as usize;
        let algo = configured.selection().name();
        let settings = gradkit_core::RunSettings {
            density: keep.and_then(Keep::density_of),
            seed: match configured {
                Configured::Local(Method::RandomK { seed }) => Some(seed),
                _ => None,
            },
            ..Default::default()
        };
        let sink = MetricSink::new(&run_name(a, algo, keep), "gradselect", algo, p as u32)
            .with_settings(settings);
        // A local method gets a selector per rank and index space; DEFT selects in its plan's
        // ranges instead.
        let (method, deft) = match configured {
            Configured::Local(m) => (Some(m), None),
            Configured::Deft { topup } => {
                let pieces = pdeft::pieces(layout, p);
                (
                    None,
                    Some(DeftRun {
                        topup,
                        pieces,
                        plan,
                    }),
                )
            }
        };
        let selectors = |m: &Method| match a.scope {
            Scope::Global => vec![Selector::with_kernels(m.clone(), 0, kernels)],
            Scope::Layer => (layout.layers.iter())
                .map(|l| Selector::with_kernels(m.clone(), l.layer_id as u64, kernels))
                .collect(),
        };
        let states = (0..p)
            .map(|_| RankState {
                selectors: method.as_ref().map_or_else(Vec::new, selectors),
                residual: Residual::zeros(if residual_on { n } else { 0 }),
                dres: None,
            })
            .collect();
        Run {
            states,
            keep,
            deft,
            residual_on,
            sink,
            n,
            total: 0,
            resident: None,
        }
    }

    /// The residuals kept on the device back in host memory (for `--residual-out`).
    fn download_residuals(&mut self) {
        if let Some(dev) = self.resident {
            for st in &mut self.states {
                if let Some(d) = st.dres.take() {
                    st.residual.values = dev.download_f32(&d);
                }
            }
        }
    }

    /// One step: DEFT's leader needs every rank's accumulator before anyone selects, so its
    /// accumulators are all held; every other method selects rank by rank, with one
    /// accumulator alive at a time (docs/MEMORY.md).
    fn step(&mut self, step: u32, trace: &mut TraceReader, w: &mut Writers) -> Result<()> {
        let mut rows = trace.by_rank(step);
        if self.deft.is_some() {
            let accs = self.accumulators(&mut rows, trace)?;
            let plan = self.deft_plan(step, &accs, &trace.layout)?;
            for (r, (acc, sq)) in accs.into_iter().enumerate() {
                self.select_rank(step, r, acc, Some(sq), Some(&plan), &trace.layout, w)?;
            }
        } else {
            for r in 0..self.states.len() {
                let acc = trace::take_flat(rows.rank(r, trace)?, self.n);
                self.select_rank(step, r, acc, None, None, &trace.layout, w)?;
            }
        }
        rows.finish(trace)?;
        w.flush_metrics(&mut self.sink)
    }

    /// Every rank's accumulator of the step, compensated, with its Σ acc².
    fn accumulators(
        &self,
        rows: &mut RankRows,
        trace: &mut TraceReader,
    ) -> Result<Vec<(Vec<f32>, f64)>> {
        let mut accs = Vec::with_capacity(self.states.len());
        for (r, st) in self.states.iter().enumerate() {
            let mut acc = trace::take_flat(rows.rank(r, trace)?, self.n);
            let sq = match self.residual_on {
                true => st.residual.compensate(&mut acc),
                false => 0.0,
            };
            accs.push((acc, sq));
        }
        Ok(accs)
    }

    /// DEFT's plan of the step: --plan's, or the one the step's leader makes from its
    /// accumulator (deft.md §1.2–1.3).
    fn deft_plan(
        &self,
        step: u32,
        accs: &[(Vec<f32>, f64)],
        layout: &Layout,
    ) -> Result<Vec<(pdeft::Piece, usize)>> {
        let deft = self.deft.as_ref().expect("a DEFT run");
        if let Some(pl) = &deft.plan {
            return Ok(plan_for_step(pl, step).to_vec());
        }
        let p = self.states.len();
        let k = k_of(self.keep, self.n) as u64;
        let leader = &accs[step as usize % p].0;
        let rows = pdeft::plan_step(layout, &deft.pieces, leader, k, p, step, deft.topup);
        plan_pieces(&rows, layout)
    }

    /// Rank `r`'s selection of the step, its residual settled, its rows and metrics out.
    /// `accumulated`: Σ acc² of an accumulator already compensated (DEFT's), or None for a
    /// gradient compensated here; the residual's norm then needs no pass of its own.
    #[allow(clippy::too_many_arguments)]
    fn select_rank(
        &mut self,
        step: u32,
        r: usize,
        mut acc: Vec<f32>,
        accumulated: Option<f64>,
        plan: Option<&[(pdeft::Piece, usize)]>,
        layout: &Layout,
        w: &mut Writers,
    ) -> Result<()> {
        let (n, keep, residual_on) = (self.n, self.keep, self.residual_on);
        let topup = self.deft.as_ref().is_some_and(|d| d.topup);
        let st = &mut self.states[r];
        if let (Some(dev), None) = (self.resident, plan) {
            if let Some((o, rn)) =
                select_resident(dev, st, acc.as_slice(), k_of(keep, n), residual_on)
            {
                self.record(step, r as u32, &o, rn);
                self.total += o.sparse.len();
                return w
                    .out
                    .write_owned(trace::unflatten_sparse(&o.sparse, layout, step, r as u32));
            }
        }
        let acc_sq = match accumulated {
            Some(sq) => sq,
            None if residual_on => st.residual.compensate(&mut acc),
            None => 0.0,
        };
        let o = match plan {
            Some(sp) => select_deft(&acc, layout, sp, r, k_of(keep, n), topup),
            None => select_plain(&mut st.selectors, step, &acc, layout, keep),
        };
        let rn = match residual_on {
            true => {
                let idx = &o.sparse.indices;
                st.residual.settle_norm(acc, Leaves::Sent, idx, &[], acc_sq)
            }
            false => {
                drop(acc);
                0.0
            }
        };
        self.record(step, r as u32, &o, rn);
        self.total += o.sparse.len();
        w.out
            .write_owned(trace::unflatten_sparse(&o.sparse, layout, step, r as u32))
    }

    /// One (step, rank)'s metric rows.
    fn record(&mut self, step: u32, rank: u32, o: &Out, residual_norm: f64) {
        let nnz = o.sparse.len();
        let n = self.n;
        let sink = &mut self.sink;
        sink.push(step, rank, "k_target", o.k_target as f64);
        sink.push(step, rank, "nnz", nnz as f64);
        if let Some(th) = o.threshold {
            sink.push(step, rank, "threshold", th as f64);
        }
        sink.push(step, rank, "exact_topk", f64::from(u8::from(o.exact_topk)));
        let density = if n > 0 { nnz as f64 / n as f64 } else { 0.0 };
        sink.push(step, rank, "density_achieved", density);
        sink.push(step, rank, "time_select_s", o.time);
        sink.push(step, rank, "residual_norm", residual_norm);
    }
}

/// A rank's selection with its tensors resident on `dev` (global scope, the methods with a
/// device path): the gradient's one upload, the residual kept there (zeros at first, as the
/// host's), the selection downloaded. `None` where the host path runs instead.
fn select_resident(
    dev: &'static dyn DeviceKernels,
    st: &mut RankState,
    g: &[f32],
    k: usize,
    residual_on: bool,
) -> Option<(Out, f64)> {
    let supported = |m: &Method| {
        matches!(
            m,
            Method::Topk | Method::Threshold(_) | Method::OkTopk { .. } | Method::GaussianK
        )
    };
    if st.selectors.len() != 1 || !supported(st.selectors[0].method()) {
        return None;
    }
    let t0 = Instant::now();
    let res = residual_on.then(|| st.dres.take().unwrap_or_else(|| dev.zeros(g.len())));
    let (acc, acc_sq) = resident::accumulate(dev, res, g);
    let s = st.selectors[0].select_resident(dev, &acc, k)?;
    let time = t0.elapsed().as_secs_f64();
    let rn = if residual_on {
        let (res, rn) = resident::settle(dev, acc, Leaves::Sent, &s.indices, &[], acc_sq);
        st.dres = Some(res);
        rn
    } else {
        0.0
    };
    let o = Out {
        time,
        k_target: s.info.k_target,
        threshold: s.info.threshold,
        exact_topk: s.info.exact_topk,
        sparse: Sparse {
            indices: s.indices,
            values: s.values,
        },
    };
    Some((o, rn))
}

/// Every method but DEFT, global or per layer.
fn select_plain(
    sels: &mut [Selector],
    step: u32,
    acc: &[f32],
    layout: &Layout,
    keep: Option<Keep>,
) -> Out {
    let t0 = Instant::now();
    if sels.len() == 1 {
        let s = sels[0].select(step, acc, k_of(keep, acc.len()));
        return Out {
            time: t0.elapsed().as_secs_f64(),
            k_target: s.info.k_target,
            threshold: s.info.threshold,
            exact_topk: s.info.exact_topk,
            sparse: Sparse {
                indices: s.indices,
                values: s.values,
            },
        };
    }
    let mut sparse = Sparse::default();
    let (mut k_target, mut exact) = (0, true);
    for (sel, l) in sels.iter_mut().zip(&layout.layers) {
        let off = l.offset as usize;
        let slice = &acc[off..off + l.numel as usize];
        let s = sel.select(step, slice, k_of(keep, slice.len()));
        k_target += s.info.k_target;
        exact &= s.info.exact_topk;
        sparse
            .indices
            .extend(s.indices.iter().map(|&i| i + off as u32));
        sparse.values.extend(s.values);
    }
    Out {
        time: t0.elapsed().as_secs_f64(),
        k_target,
        // One threshold per layer: not a single number per (step, rank).
        threshold: None,
        exact_topk: exact,
        sparse,
    }
}

/// DEFT (deft.md §1.2–1.4): this rank's own norms over all the plan's pieces give its own
/// per-piece k (Alg. 3); it then runs top-k in the pieces the plan gives it (Alg. 5).
fn select_deft(
    acc: &[f32],
    layout: &Layout,
    plan: &[(pdeft::Piece, usize)],
    rank: usize,
    k: usize,
    topup: bool,
) -> Out {
    let t0 = Instant::now();
    let pieces: Vec<pdeft::Piece> = plan.iter().map(|(pc, _)| *pc).collect();
    let norms = pdeft::piece_norms(layout, &pieces, acc);
    let ks = pdeft::allocate_k(&pieces, &norms, k as u64, topup);
    let ranges: Vec<(usize, usize, usize)> = plan
        .iter()
        .zip(&ks)
        .filter(|((_, w), _)| *w == rank)
        .map(|((pc, _), &kx)| {
            let r = pc.flat_range(layout);
            (r.start, r.end, kx as usize)
        })
        .collect();
    let k_target = ranges.iter().map(|r| r.2.min(r.1 - r.0)).sum();
    let indices = deft::select_in_ranges(acc, &ranges);
    let values = indices.iter().map(|&i| acc[i as usize]).collect();
    Out {
        time: t0.elapsed().as_secs_f64(),
        k_target,
        threshold: None,
        exact_topk: true,
        sparse: Sparse { indices, values },
    }
}

/// A plan as (first step, pieces with their worker), ordered by step.
type Plan = Vec<(u32, Vec<(pdeft::Piece, usize)>)>;

/// The plan in force at `step`: the latest plan step ≤ step.
fn plan_for_step(plan: &Plan, step: u32) -> &[(pdeft::Piece, usize)] {
    let i = plan.partition_point(|(s, _)| *s <= step);
    &plan[i - 1].1
}

/// Pieces of one plan step (rows checked by [`pplan::check`]) in flat order.
fn plan_pieces(rows: &[PlanRow], layout: &Layout) -> Result<Vec<(pdeft::Piece, usize)>> {
    let mut v: Vec<(pdeft::Piece, usize)> = Vec::with_capacity(rows.len());
    for r in rows {
        let li = layout
            .layers
            .binary_search_by_key(&r.layer_id, |l| l.layer_id)
            .ok()
            .with_context(|| {
                format!(
                    "plan step {}: layer_id {} (`{}`) is not in the trace (column `layer_id`)",
                    r.step, r.layer_id, r.layer
                )
            })?;
        v.push((
            pdeft::Piece {
                layer: li,
                start: r.start,
                end: r.end,
            },
            r.worker as usize,
        ));
    }
    v.sort_by_key(|(pc, _)| (pc.layer, pc.start, pc.end));
    v.retain(|(pc, _)| pc.end > pc.start);
    Ok(v)
}

/// Reads a DEFT plan and checks it against the trace's layers, ranks and steps with the
/// validator every plan consumer shares (gradkit-partition's `plan::check`).
fn load_plan(path: &std::path::Path, layout: &Layout, p: usize, steps: &[u32]) -> Result<Plan> {
    load_plan_inner(path, layout, p, steps).with_context(|| format!("--plan {}", path.display()))
}

fn load_plan_inner(
    path: &std::path::Path,
    layout: &Layout,
    p: usize,
    steps: &[u32],
) -> Result<Plan> {
    let input = Input::Path(path.to_path_buf());
    let loaded = read_table::<PlanRow>(&input, ReadOptions::default())?;
    let checked = pplan::check(
        loaded.rows,
        Some(&loaded.meta),
        pplan::PlanKind::Deft,
        layout,
        p,
        steps[0],
    )?;
    checked
        .steps
        .iter()
        .map(|(s, rows)| Ok((*s, plan_pieces(rows, layout)?)))
        .collect()
}
