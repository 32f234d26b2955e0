//! Sparse allreduces (Ok-Topk Table 1, PPoPP'22) and DEFT's exchange (ICPP'23).
//!
//! Every algorithm is a [`crate::Reducer`] taking either a selection (`Flat::Sparse`, e.g. from
//! `gradselect`) or a dense gradient (`Flat::Dense`: the algorithm then runs its own selection
//! on `residual + gradient` and keeps error feedback across steps, Ok-Topk Algorithm 2). The
//! result is a `Flat::Sparse` that is bit-identical on every rank. Indices travel as `u32`,
//! values as `f32`, in separate messages (never indices packed as floats, anchors.md §4).
//!
//! | module | `--algo` | phases charged |
//! |---|---|---|
//! | [`topka`] | topka | `allgatherv` |
//! | [`topkdsa`] | topkdsa | `reduce`, `allgather_sizes`, `allgatherv` |
//! | [`gtopk`] | gtopk | `reduce_tree`, `broadcast` |
//! | [`gaussiank`] | gaussiank | `allgatherv` |
//! | [`oktopk`] | oktopk | `space_repartition`, `split_and_reduce`, `th_re_evaluate`, `th_adjust`, `balance_and_allgatherv` |
//! | [`deft`] | deft | `plan`, `allgather_counts`, `allgather_indices`, `allreduce_values` |
//! | [`cltk`] | cltk | `broadcast_indices`, `allreduce_values` |
//! | [`topk_union`] | topk-union | `allgather_indices`, `allreduce_values` |
//!
//! Residual rule for dense input (Ok-Topk Algorithm 2, DEFT Algorithm 1): after a step the
//! residual is the accumulator with the entries zeroed that this rank *sent and that are in the
//! result's support* (for DEFT: every entry at the gathered indices, since every rank sends its
//! values there). Locally selected entries that did not survive stay in the residual.

pub mod cltk;
pub mod deft;
pub mod gaussiank;
pub mod gtopk;
pub mod oktopk;
mod resident;
pub mod topk_union;
pub mod topka;
pub mod topkdsa;

use crate::Algo;

/// The sparse algorithms, in `--help` order (Ok-Topk Table 1's, then DEFT's and its
/// baselines): one line per module's descriptor, collected by [`crate::registry`].
pub const ALGOS: &[Algo] = &[
    Algo(&topka::DESCRIPTOR),
    Algo(&topkdsa::DESCRIPTOR),
    Algo(&gtopk::DESCRIPTOR),
    Algo(&gaussiank::DESCRIPTOR),
    Algo(&oktopk::DESCRIPTOR),
    Algo(&deft::DESCRIPTOR),
    Algo(&cltk::DESCRIPTOR),
    Algo(&topk_union::DESCRIPTOR),
];

use std::time::Instant;

use anyhow::{bail, ensure, Result};
use gradkit_comm::{Buf, Comm, CommExt, Kind};
use gradkit_core::trace::{Layout, Sparse};
use gradkit_core::PlanRow;
use gradkit_sparsify::kernels::Kernels;
use gradkit_sparsify::resident::{DVec, DeviceKernels};
use gradkit_sparsify::{Leaves, Residual};

use crate::{Flat, Op, StepOutput};

/// Message tags of the sparse algorithms (pairs of ranks with one tag stay ordered).
pub(crate) const TAG_SPARSE: u32 = 60;

/// Per-rank state shared by every sparse reducer: input checks and error feedback (the one
/// [`Residual`] of gradkit-sparsify, settled by each reducer's [`Leaves`] rule).
#[derive(Debug)]
pub(crate) struct Feedback {
    /// Whether error feedback is on for dense input.
    enabled: bool,
    /// `Some(true)` after a dense step, `Some(false)` after a sparse one.
    mode: Option<bool>,
    residual: Residual,
    /// Which entries leave the residual after this reducer's exchange.
    rule: Leaves,
    /// `Σ acc²` of the accumulator out for this step (from [`Feedback::accumulate`]), so
    /// [`Feedback::settle`] has the new residual's norm without a pass over it.
    acc_sq: Option<f64>,
    /// The device that keeps the accumulator and the residual resident (`Params::resident`).
    dev: Option<&'static dyn DeviceKernels>,
    /// The residual on `dev` (between dense steps; `residual` stays empty then).
    dres: Option<DVec>,
}

pub(crate) use resident::{Acc, Local};

impl Feedback {
    pub fn new(enabled: bool, rule: Leaves) -> Self {
        Feedback {
            enabled,
            mode: None,
            residual: Residual::default(),
            rule,
            acc_sq: None,
            dev: None,
            dres: None,
        }
    }

    /// The same, keeping the step's tensors on `dev` where one is given.
    pub fn on(mut self, dev: Option<&'static dyn DeviceKernels>) -> Self {
        self.dev = dev;
        self
    }

    /// Checks `input` against the layout (length, ascending in-range indices), against the
    /// residual (a restored one must fit) and against the previous steps of this run (no
    /// switching between dense and sparse input).
    pub fn check(&mut self, algo: &str, layout: &Layout, input: &Flat) -> Result<usize> {
        let n = layout.total();
        ensure!(
            n <= u32::MAX as u64 + 1,
            "{algo}: the flat model has {n} elements, more than u32 indices can address"
        );
        let n = n as usize;
        match input {
            Flat::Dense(v) => ensure!(
                v.len() == n,
                "{algo}: dense input has {} values but the layout has {n} elements",
                v.len()
            ),
            Flat::Sparse(s) => check_sparse(algo, s, n)?,
        }
        let r = (self.dres.as_ref()).map_or(self.residual.values.len(), |d| d.len());
        ensure!(
            r == 0 || r == n,
            "{algo}: the residual has {r} values but the layout has {n} elements"
        );
        let dense = input.is_dense();
        match self.mode {
            Some(m) if m != dense => bail!(
                "{algo}: mixed dense and sparse input in one run (a step was {}, an earlier one {})",
                if dense { "dense" } else { "sparse" },
                if m { "dense" } else { "sparse" }
            ),
            _ => self.mode = Some(dense),
        }
        Ok(n)
    }

    /// [`Feedback::check`] for the reducers that select for themselves from a dense
    /// accumulator (DEFT, CLT-k): returns n and the dense gradient; sparse input is refused,
    /// saying `why`.
    pub fn check_dense(
        &mut self,
        algo: &str,
        layout: &Layout,
        input: Flat,
        why: &str,
    ) -> Result<(usize, Vec<f32>)> {
        let n = self.check(algo, layout, &input)?;
        match input {
            Flat::Dense(g) => Ok((n, g)),
            Flat::Sparse(_) => bail!("{algo}: needs dense input ({why}); got a sparse tensor"),
        }
    }

    /// This rank's contribution for one step: a sparse input as it is, or `select(acc)` of
    /// `acc = residual + g` for a dense one (timed as `time_select_s`; `select` returns the
    /// indices and, for threshold methods, the threshold it used). Records `local_nnz`. The
    /// accumulator comes back for [`Feedback::settle`] after the exchange.
    pub fn local_selection(
        &mut self,
        input: Flat,
        metrics: &mut Vec<(String, f64)>,
        select: impl FnOnce(&[f32]) -> (Vec<u32>, Option<f32>),
    ) -> (Sparse, Option<Vec<f32>>) {
        let (sel, acc) = match input {
            Flat::Sparse(s) => (s, None),
            Flat::Dense(g) => {
                let t = Instant::now();
                let acc = self.accumulate(g);
                let (idx, th) = select(&acc);
                metrics.push(("time_select_s".into(), secs(t)));
                if let Some(th) = th {
                    metrics.push(("threshold".into(), th as f64));
                }
                (gather(&acc, idx), Some(acc))
            }
        };
        metrics.push(("local_nnz".into(), sel.len() as f64));
        (sel, acc)
    }

    /// `acc = residual + g` (or `g` when error feedback is off or on the first step), in the
    /// residual's buffer: `g` is freed here and the residual is empty until
    /// [`Feedback::settle`] (`Residual::absorb`: one model-sized vector per rank, not two,
    /// during the selection and the exchange).
    pub fn accumulate(&mut self, g: Vec<f32>) -> Vec<f32> {
        if self.enabled {
            let (acc, sq) = self.residual.absorb_squared(g);
            self.acc_sq = Some(sq);
            acc
        } else {
            g
        }
    }

    /// New residual after the exchange: `acc` with the entries this reducer's rule names
    /// zeroed (`sent`: this rank's selection; `result`: the result's support; both ascending).
    /// Returns the new residual's L2 norm (for the `residual_norm` metric; `None` when error
    /// feedback is off).
    pub fn settle(&mut self, acc: Vec<f32>, sent: &[u32], result: &[u32]) -> Option<f64> {
        if !self.enabled {
            return None;
        }
        // Without a sum from `accumulate` (none is missing on any path) NaN makes settle_norm
        // sum the residual itself.
        let sq = self.acc_sq.take().unwrap_or(f64::NAN);
        Some(self.residual.settle_norm(acc, self.rule, sent, result, sq))
    }

    /// The residual as `Reducer::state` (nothing before the first dense step).
    pub fn state(&self) -> Vec<(String, Vec<f32>)> {
        if let (Some(dev), Some(d)) = (self.dev, &self.dres) {
            return vec![("residual".into(), dev.download_f32(d))];
        }
        if self.residual.values.is_empty() {
            Vec::new()
        } else {
            vec![("residual".into(), self.residual.values.clone())]
        }
    }

    /// Restores [`Feedback::state`]; its length is checked against the layout at the next step.
    pub fn load_state(&mut self, algo: &str, state: &[(String, Vec<f32>)]) -> Result<()> {
        for (k, v) in state {
            ensure!(
                k == "residual",
                "{algo}: unknown state `{k}` (keeps `residual`)"
            );
            ensure!(
                self.enabled,
                "{algo}: given a residual, but error feedback is off"
            );
            self.residual.values = v.clone();
            self.dres = None;
        }
        Ok(())
    }
}

/// `Reducer::state`/`load_state` of a sparse reducer whose state is its `fb: Feedback`.
macro_rules! feedback_state {
    ($algo:literal) => {
        fn state(&self) -> Vec<(String, Vec<f32>)> {
            self.fb.state()
        }
        fn load_state(&mut self, state: &[(String, Vec<f32>)]) -> anyhow::Result<()> {
            self.fb.load_state($algo, state)
        }
    };
}
pub(crate) use feedback_state;

/// Sparse input must have one value per index and strictly ascending indices below n.
pub(crate) fn check_sparse(algo: &str, s: &Sparse, n: usize) -> Result<()> {
    ensure!(
        s.indices.len() == s.values.len(),
        "{algo}: sparse input has {} indices but {} values",
        s.indices.len(),
        s.values.len()
    );
    for w in s.indices.windows(2) {
        ensure!(
            w[0] < w[1],
            "{algo}: sparse input indices are not strictly ascending ({} then {})",
            w[0],
            w[1]
        );
    }
    if let Some(&last) = s.indices.last() {
        ensure!(
            (last as usize) < n,
            "{algo}: sparse input index {last} is outside the model's {n} elements"
        );
    }
    Ok(())
}

/// Entries of `x` at `idx` (ascending flat indices) as a sparse vector.
pub(crate) fn gather(x: &[f32], idx: Vec<u32>) -> Sparse {
    let values = idx.iter().map(|&i| x[i as usize]).collect();
    Sparse {
        indices: idx,
        values,
    }
}

/// Exact top-k of a sparse vector by |value| (ties to the lower index), ascending.
pub(crate) fn topk_sparse(kern: &dyn Kernels, s: &Sparse, k: usize) -> Sparse {
    if s.len() <= k {
        return s.clone();
    }
    let pos = kern.topk_by_magnitude(&s.values, k);
    Sparse {
        indices: pos.iter().map(|&p| s.indices[p as usize]).collect(),
        values: pos.iter().map(|&p| s.values[p as usize]).collect(),
    }
}

/// Exact selection threshold: the k-th largest |x| when more than k candidates are non-zero,
/// else 0 (everything non-zero passes `|x| > 0`). Used for Ok-Topk's `th_re_evaluate`.
pub(crate) fn exact_threshold(kern: &dyn Kernels, x: &[f32], k: usize) -> f32 {
    let nz = x.iter().filter(|v| **v != 0.0).count();
    if nz <= k || k == 0 {
        if k == 0 {
            return f32::INFINITY;
        }
        return 0.0;
    }
    kern.kth_largest_magnitude(x, k)
}

/// Sum of sparse vectors (each ascending), summed in list order at every index: the same
/// floating-point result on every rank that calls it with the same lists. Keeps the union of
/// the supports (a sum that cancels to 0 stays as an explicit 0).
pub(crate) fn sum_sparse(lists: &[Sparse]) -> Sparse {
    match lists.len() {
        0 => return Sparse::default(),
        1 => return lists[0].clone(),
        _ => {}
    }
    let total: usize = lists.iter().map(|s| s.len()).sum();
    let mut pairs: Vec<(u32, f32)> = Vec::with_capacity(total);
    for s in lists {
        pairs.extend(s.indices.iter().copied().zip(s.values.iter().copied()));
    }
    // Stable: equal indices keep list order, so the sum order is the list order.
    pairs.sort_by_key(|p| p.0);
    let mut out = Sparse {
        indices: Vec::with_capacity(total),
        values: Vec::with_capacity(total),
    };
    for (i, v) in pairs {
        if out.indices.last() == Some(&i) {
            *out.values.last_mut().expect("value") += v;
        } else {
            out.indices.push(i);
            out.values.push(v);
        }
    }
    out
}

/// Concatenation of sparse vectors whose index ranges are ordered and disjoint.
pub(crate) fn concat(parts: Vec<Sparse>) -> Sparse {
    // Sized once: no regrowth (and its copy) while the parts are appended.
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = Sparse {
        indices: Vec::with_capacity(total),
        values: Vec::with_capacity(total),
    };
    for p in parts {
        out.indices.extend(p.indices);
        out.values.extend(p.values);
    }
    out
}

/// Allgatherv of a COO vector: one ring allgatherv of the `u32` indices, one of the `f32`
/// values; returns every rank's vector in rank order.
pub(crate) fn allgatherv_sparse(comm: &dyn Comm, mine: Sparse) -> Result<Vec<Sparse>> {
    let idx = comm.allgatherv(mine.indices)?;
    let val = comm.allgatherv(mine.values)?;
    Ok(idx
        .into_iter()
        .zip(val)
        .map(|(indices, values)| Sparse { indices, values })
        .collect())
}

/// One bucket of point-to-point COO messages (indices and values as two messages per peer),
/// posted together; returns what each of `srcs` sent, in order.
pub(crate) fn exchange_sparse(
    comm: &dyn Comm,
    sends: Vec<(usize, Sparse)>,
    srcs: &[usize],
) -> Result<Vec<Sparse>> {
    let mut out = Vec::with_capacity(2 * sends.len());
    for (d, s) in sends {
        out.push((d, Buf::from_vec(s.indices)));
        out.push((d, Buf::from_vec(s.values)));
    }
    let recvs: Vec<(usize, Kind)> = srcs
        .iter()
        .flat_map(|&s| [(s, Kind::U32), (s, Kind::F32)])
        .collect();
    let got = comm.exchange(TAG_SPARSE, out, &recvs)?;
    let mut it = got.into_iter();
    let mut res = Vec::with_capacity(srcs.len());
    while let (Some(i), Some(v)) = (it.next(), it.next()) {
        let indices = i.into_vec()?;
        let values = v.into_vec()?;
        res.push(Sparse { indices, values });
    }
    Ok(res)
}

/// The second half of the exchanges in which every rank sends its accumulator values at a
/// common index set (DEFT Algorithm 1 lines 4–6; deft.md §1.0, §1.5): DEFT, CLT-k and the
/// paper's Top-k (union). Checks `indices` (strictly ascending, below `acc.len()`; `what`
/// names their origin in the error), then sums `acc` at them over the ranks with the ring
/// allreduce (phase `allreduce_values`), so every rank gets the same bits.
pub(crate) fn allreduce_at(
    comm: &dyn Comm,
    algo: &str,
    what: &str,
    acc: &[f32],
    indices: Vec<u32>,
) -> Result<Sparse> {
    check_at(algo, what, acc.len(), &indices)?;
    allreduce_gathered(comm, indices, |idx| {
        idx.iter().map(|&i| acc[i as usize]).collect()
    })
}

/// [`allreduce_at`] with the accumulator where it lives (resident on a device: the indices
/// go up, the accumulator's values at them come down).
pub(crate) fn allreduce_at_acc(
    comm: &dyn Comm,
    algo: &str,
    what: &str,
    acc: &Acc,
    indices: Vec<u32>,
) -> Result<Sparse> {
    match acc {
        Acc::Host(a) => allreduce_at(comm, algo, what, a, indices),
        Acc::Dev(_, d) => {
            check_at(algo, what, d.len(), &indices)?;
            allreduce_gathered(comm, indices, |idx| acc.values_at(idx))
        }
    }
}

/// [`allreduce_at`]'s checks of `indices` against an accumulator of `len` elements.
fn check_at(algo: &str, what: &str, len: usize, indices: &[u32]) -> Result<()> {
    for w in indices.windows(2) {
        ensure!(
            w[0] < w[1],
            "{algo}: {what} are not strictly ascending ({} then {})",
            w[0],
            w[1]
        );
    }
    if let Some(&last) = indices.last() {
        ensure!(
            (last as usize) < len,
            "{algo}: {what} include {last}, outside the model's {len} elements"
        );
    }
    Ok(())
}

/// The ring allreduce of [`allreduce_at`] on values gathered by `gather` at checked indices.
pub(crate) fn allreduce_gathered(
    comm: &dyn Comm,
    indices: Vec<u32>,
    gather: impl FnOnce(&[u32]) -> Vec<f32>,
) -> Result<Sparse> {
    let mut values = gather(&indices);
    {
        let _ph = comm.phase("allreduce_values");
        crate::dense::ring_in_caller_phase(comm, &mut values)?;
    }
    Ok(Sparse { indices, values })
}

/// Sum-allreduce of a few u64 (Ok-Topk's boundary consensus): recursive doubling among the
/// largest power of two p' ≤ P, the ranks r ≥ p' first folding into r − p' and getting the
/// result back. ⌈log2 P⌉ (+2) messages per rank; exact (integers).
pub(crate) fn allreduce_sum_u64(comm: &dyn Comm, data: &mut [u64]) -> Result<()> {
    // Counts and boundaries: control messages, whose size does not grow with the model's.
    let _fixed = comm.fixed(gradkit_comm::Fixed::All);
    let (p, r) = (comm.size(), comm.rank());
    if p == 1 {
        return Ok(());
    }
    let pp = 1usize << (usize::BITS - 1 - p.leading_zeros());
    let add = |d: &mut [u64], g: &[u64]| d.iter_mut().zip(g).for_each(|(a, b)| *a += *b);
    if r >= pp {
        comm.send(r - pp, data.to_vec())?;
        let got: Vec<u64> = comm.recv(r - pp)?;
        data.copy_from_slice(&got);
        return Ok(());
    }
    if r + pp < p {
        let got: Vec<u64> = comm.recv(r + pp)?;
        add(data, &got);
    }
    let mut mask = 1;
    while mask < pp {
        let partner = r ^ mask;
        let got: Vec<u64> = comm.sendrecv(partner, data.to_vec(), partner)?;
        add(data, &got);
        mask <<= 1;
    }
    if r + pp < p {
        comm.send(r + pp, data.to_vec())?;
    }
    Ok(())
}

/// The rows of the plan step that applies to `step`: the latest plan step ≤ `step`, else the
/// first plan step.
pub(crate) fn plan_at(plan: &[PlanRow], step: u32) -> Vec<&PlanRow> {
    let mut steps: Vec<u32> = plan.iter().map(|r| r.step).collect();
    steps.sort_unstable();
    steps.dedup();
    let Some(&first) = steps.first() else {
        return Vec::new();
    };
    let at = steps
        .iter()
        .rev()
        .find(|&&s| s <= step)
        .copied()
        .unwrap_or(first);
    plan.iter().filter(|r| r.step == at).collect()
}

/// Checks that a plan is for `p` workers (its largest worker id is p − 1).
pub(crate) fn check_plan_workers(algo: &str, plan: &[PlanRow], p: usize) -> Result<()> {
    ensure!(!plan.is_empty(), "{algo}: the plan has no rows (--plan)");
    let workers = plan.iter().map(|r| r.worker).max().unwrap_or(0) as usize + 1;
    ensure!(
        workers == p,
        "{algo}: the plan is for {workers} workers but the world has {p} ranks (--plan)"
    );
    Ok(())
}

/// Flat range `[start, end)` of a plan row.
pub(crate) fn flat_range(algo: &str, layout: &Layout, r: &PlanRow) -> Result<(u64, u64)> {
    let Some(l) = layout.by_id(r.layer_id) else {
        bail!(
            "{algo}: plan row names layer_id {} that the input does not have (--plan)",
            r.layer_id
        )
    };
    ensure!(
        r.start <= r.end && r.end <= l.numel,
        "{algo}: plan range [{}, {}) is outside layer `{}` of {} elements (--plan)",
        r.start,
        r.end,
        l.name,
        l.numel
    );
    Ok((l.offset + r.start, l.offset + r.end))
}

/// Builds the step's output: scales by 1/P for `Op::Mean`, records `k`.
pub(crate) fn output(
    comm: &dyn Comm,
    op: Op,
    mut result: Sparse,
    k: usize,
    contributed: Option<Vec<u32>>,
    mut metrics: Vec<(String, f64)>,
) -> StepOutput {
    if op == Op::Mean {
        let inv = 1.0 / comm.size() as f32;
        result.values.iter_mut().for_each(|v| *v *= inv);
    }
    // `nnz` of the result is recorded by the tool (gradallreduce) for every algorithm.
    metrics.push(("k".into(), k as f64));
    let mut out = StepOutput::new(Flat::Sparse(result));
    out.metrics = metrics;
    out.contributed = contributed;
    out
}

/// One step of the select-then-exchange reducers (TopkA, TopkDSA, gTopk, Gaussiank): check
/// the input, select locally from `residual + g` for dense input (`local`), run
/// `exchange(comm, selection, n, metrics)`, settle the residual (Algorithm 2, the reducer's
/// [`Leaves`] rule), and build the output.
#[allow(clippy::too_many_arguments)]
pub(crate) fn select_and_exchange(
    fb: &mut Feedback,
    params: &crate::Params,
    algo: &str,
    comm: &dyn Comm,
    layout: &Layout,
    input: Flat,
    local: Local,
    exchange: impl FnOnce(&dyn Comm, Sparse, usize, &mut Vec<(String, f64)>) -> Result<Sparse>,
) -> Result<StepOutput> {
    let n = fb.check(algo, layout, &input)?;
    let k = k_of(params, n);
    let mut metrics = Vec::new();
    let (sel, acc) = fb.select_local(input, &mut metrics, params.kernels, local, k);
    let contributed = acc.as_ref().map(|_| sel.indices.clone());
    let res = exchange(comm, sel, n, &mut metrics)?;
    if let (Some(acc), Some(c)) = (acc, &contributed) {
        if let Some(norm) = fb.settle_acc(acc, c, &res.indices) {
            metrics.push(("residual_norm".into(), norm));
        }
    }
    Ok(output(comm, params.op, res, k, contributed, metrics))
}

/// Seconds since `t`.
pub(crate) fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// k as usize for a flat model of n elements.
pub(crate) fn k_of(params: &crate::Params, n: usize) -> usize {
    params.k_for(n as u64) as usize
}

/// Local top-k selection of a dense accumulator: exactly min(k, n) entries, as gradselect's
/// `--method topk` (with fewer than k non-zeros, exact zeros fill the selection and are
/// sent, so every rank sends k entries as Table 1 counts).
pub(crate) fn select_topk(kern: &dyn Kernels, acc: &[f32], k: usize) -> Vec<u32> {
    kern.topk_by_magnitude(acc, k)
}
