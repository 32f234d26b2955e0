//! Ok-Topk's O(k) sparse allreduce (Li & Hoefler, PPoPP'22, Algorithm 1; oktopk.md §1).
//!
//! One step on rank r, with a call counter c = 0, 1, 2, … (c plays Algorithm 1's t − 1):
//! 1. Local selection (dense input only), by the one implementation of the local threshold
//!    reuse, `gradkit_sparsify::oktopk::OkTopk`: on re-evaluation calls (c mod τ' = 0) the
//!    exact local top-k of `acc = residual + g` and its k-th largest |acc| as the local
//!    threshold; in between `{j : |acc_j| > local_th}` with the threshold reused (§3.1.3) and
//!    adjusted as `Params::adjust` says (`paper`: unchanged; `reference`: the authors' ×1.03
//!    loop and count bands; `ladder`, the default: the rung of a ×1.06 ladder whose own count
//!    is closest to k with at most 4k/3 passing, no message).
//!    Sparse input (`gradselect`'s selection) is used as it is.
//! 2. [`space_repartition`] every τ calls (`--period`), or regions from a `plan/1`
//!    (`gradpartition --method oktopk`): each rank's P−1 equal-count cut points of its sorted
//!    selected indices, summed by an allreduce of P−1 integers and divided by P (Step B).
//! 3. [`split_and_reduce`] (Step C): the part of the selection in region d goes to rank d;
//!    at step s rank r sends to (r+s) mod P and receives from (r−s) mod P; steps are posted
//!    in buckets of min(4, P−1) non-blocking messages. The parts are summed by a merge of
//!    sorted lists, O(k) per rank as the paper's title says, or, where the region is small
//!    beside what arrives, by a scatter-add into a dense region buffer, bucket b−1 on a
//!    second thread while bucket b is on the wire (same bits either way).
//!    Rank r sends exactly 8·|S_r outside region r| bytes in 2(P−1) messages.
//! 4. On re-evaluation calls, [`th_re_evaluate`]: allgatherv of all reduced non-zeros, and
//!    their k-th largest |value| is the global threshold. With `--reeval-step-d skip` (the
//!    default, as the reference code does) the exact top-k of them is the result and Step D is
//!    skipped on these calls; with `run` (Algorithm 1 as written: line 13 on every step) each
//!    rank keeps `{j ∈ region r : |reduced_j| ≥ global_th}` (the gathered top-k when the
//!    magnitudes are distinct, every tie at the k-th largest too) and Step D follows, charged
//!    to `balance_and_allgatherv` as on the other steps.
//!    Otherwise the reused global threshold, with `--adjust ladder` (the default), is first
//!    adjusted collectively ([`th_adjust`]: every rank counts its reduced entries above a
//!    ladder of candidate thresholds around it, one integer allreduce (phase `th_adjust`) sums
//!    the counts, every rank picks the same rung so that the global count stays in a band
//!    around k); `paper` reuses it unchanged; `reference` nudges it after the step from the
//!    global count with the preset's global bands (no message). Then each rank keeps
//!    `{j ∈ region r : |reduced_j| > global_th}` and
//!    [`balance_and_allgatherv`] (Step D) moves the buffers to near-equal sizes when the
//!    largest exceeds 4× the average (`--balance auto`; `always`, `never`), then allgathers.
//!
//! Result: bit-identical on every rank (each region is reduced on one rank only and then
//! gathered). Residual (Algorithm 2): the accumulator with `local_sel ∩ supp(result)` zeroed.
//! Departures from the reference code (anchors.md §4): indices are `u32` messages, never
//! floats; P = 1 and empty selections work (P = 1: no messages, the result is the local
//! selection's top-k / threshold pass); balancing is implemented; the allgathers are rings
//! (same volume as the paper's recursive doubling, P−1 instead of log P messages); the
//! policies of the threshold reuse are selectable (`--adjust paper|reference|ladder`,
//! docs/ALGORITHMS.md); the default `ladder` adjusts the global threshold before Step D with
//! [`th_adjust`] (instead of the reference code's per-step nudges, applied *after* the step
//! has already moved the over-full buffers), which keeps the step's own global count ≤ 4k/3
//! and so Table 1's 6k(P−1)/P volume bound under error feedback.

use std::time::Instant;

use anyhow::{ensure, Context, Result};
use gradkit_comm::{Comm, CommExt};
use gradkit_core::trace::{Layout, Sparse};
use gradkit_core::PlanRow;
use gradkit_cost::{log2p, pf, Cost};
use gradkit_partition::oktopk::{cut_points, region};
use gradkit_sparsify::kernels::Kernels;
use gradkit_sparsify::oktopk::{Adjust, OkTopk as LocalReuse};

use super::{
    allgatherv_sparse, allreduce_sum_u64, check_plan_workers, concat, exact_threshold,
    exchange_sparse, flat_range, k_of, output, plan_at, topk_sparse, Acc, Feedback,
};
use crate::params::{Balance, ReevalStepD};
use crate::{Flat, Params, Reducer, StepOutput};

/// Step B: region boundaries (P−1 of them, region i = `[b[i−1], b[i])`) from every rank's
/// sorted selected indices: cut points averaged over ranks with an integer allreduce, then
/// made non-decreasing and clamped to n. A rank with fewer than P selected entries
/// contributes the equal-size cuts (no crash at P = 1 or on empty selections).
pub fn space_repartition(comm: &dyn Comm, sorted_local: &[u32], n: u64) -> Result<Vec<u64>> {
    let p = comm.size();
    let mut cuts = cut_points(sorted_local, p, n);
    allreduce_sum_u64(comm, &mut cuts)?;
    let mut b: Vec<u64> = cuts.iter().map(|c| c / p as u64).collect();
    for i in 1..b.len() {
        b[i] = b[i].max(b[i - 1]);
    }
    b.iter_mut().for_each(|x| *x = (*x).min(n));
    Ok(b)
}

fn scatter_add(buf: &mut [f32], lo: u64, idx: &[u32], val: &[f32]) {
    for (&i, &v) in idx.iter().zip(val) {
        buf[(i as u64 - lo) as usize] += v;
    }
}

/// Step C: sends the part of `sel` (ascending) in region d to rank d with rotated
/// destinations, in buckets of min(4, P−1) steps, and returns this rank's reduced region: the
/// non-zero sums, ascending, each summed from 0 in a fixed order (own part first, then the
/// parts of ranks r−1, r−2, …).
///
/// Two ways to sum, with the same bits: where the region is large beside what arrives
/// (the common case: about k entries against n/P, [`merge_is_cheaper`]), the parts are merged
/// as sorted lists once all have arrived, in O(k·P) time and memory; otherwise they are
/// scatter-added into a dense buffer of the region, bucket b−1 on a second thread while
/// bucket b is on the wire, and the non-zeros read out of it (O(n/P) time and memory).
pub fn split_and_reduce(comm: &dyn Comm, sel: &Sparse, bounds: &[u64], n: u64) -> Result<Sparse> {
    let (p, r) = (comm.size(), comm.rank());
    let part = |d: usize| {
        let (lo, hi) = region(bounds, d, n);
        let a = sel.indices.partition_point(|&i| (i as u64) < lo);
        let b = sel.indices.partition_point(|&i| (i as u64) < hi);
        a..b
    };
    let (lo, hi) = region(bounds, r, n);
    let own = part(r);
    let steps: Vec<usize> = (1..p).collect();
    let bucket = 4.min(p.saturating_sub(1)).max(1);
    let buckets = steps.chunks(bucket).map(|chunk| {
        let sends: Vec<(usize, Sparse)> = chunk
            .iter()
            .map(|&s| {
                let d = (r + s) % p;
                let rg = part(d);
                let piece = Sparse {
                    indices: sel.indices[rg.clone()].to_vec(),
                    values: sel.values[rg].to_vec(),
                };
                (d, piece)
            })
            .collect();
        let srcs: Vec<usize> = chunk.iter().map(|&s| (r + p - s) % p).collect();
        (sends, srcs)
    });
    if merge_is_cheaper(p, own.len(), hi - lo) {
        let mut got = Vec::with_capacity(p - 1);
        for (sends, srcs) in buckets {
            got.extend(exchange_sparse(comm, sends, &srcs)?);
        }
        let mut parts: Vec<(&[u32], &[f32])> = Vec::with_capacity(p);
        parts.push((&sel.indices[own.clone()], &sel.values[own]));
        parts.extend(got.iter().map(|m| (&m.indices[..], &m.values[..])));
        return Ok(merge_sum(&parts));
    }
    let mut buf = vec![0f32; (hi - lo) as usize];
    scatter_add(&mut buf, lo, &sel.indices[own.clone()], &sel.values[own]);
    std::thread::scope(|sc| -> Result<()> {
        let mut pending: Option<Vec<Sparse>> = None;
        for (sends, srcs) in buckets {
            // Reduce the previous bucket while this one is on the wire.
            let handle = pending.take().map(|msgs| {
                let mut b = std::mem::take(&mut buf);
                sc.spawn(move || {
                    for m in &msgs {
                        scatter_add(&mut b, lo, &m.indices, &m.values);
                    }
                    b
                })
            });
            let got = exchange_sparse(comm, sends, &srcs)?;
            if let Some(h) = handle {
                buf = h.join().expect("reduction thread");
            }
            pending = Some(got);
        }
        if let Some(msgs) = pending {
            for m in &msgs {
                scatter_add(&mut buf, lo, &m.indices, &m.values);
            }
        }
        Ok(())
    })?;
    // Sized by a count first: no regrowth (and its copies) beside the dense region.
    let nz = buf.iter().filter(|&&v| v != 0.0).count();
    let mut out = Sparse {
        indices: Vec::with_capacity(nz),
        values: Vec::with_capacity(nz),
    };
    for (j, &v) in buf.iter().enumerate() {
        if v != 0.0 {
            out.indices.push((lo + j as u64) as u32);
            out.values.push(v);
        }
    }
    Ok(out)
}

/// Whether [`split_and_reduce`] merges sorted parts rather than summing in a dense region
/// buffer: the merge looks at each of the P heads once per entry (about P · P · own entries
/// in all, the own part standing for each rank's), the dense buffer is zeroed, filled and read
/// once over its `region_len` elements.
pub fn merge_is_cheaper(p: usize, own: usize, region_len: u64) -> bool {
    (p as u64)
        .saturating_mul(p as u64)
        .saturating_mul(own as u64 + 1)
        < region_len
}

/// The sums of sorted sparse `parts` (each strictly ascending), ascending, exact zeros left
/// out; at each index the sum starts from 0 and adds the parts holding it in their order, as
/// a scatter-add of the parts into a zeroed buffer does (the same bits).
pub fn merge_sum(parts: &[(&[u32], &[f32])]) -> Sparse {
    let total: usize = parts.iter().map(|p| p.0.len()).sum();
    let mut out = Sparse {
        indices: Vec::with_capacity(total),
        values: Vec::with_capacity(total),
    };
    let mut heads = vec![0usize; parts.len()];
    loop {
        let mut next = u32::MAX;
        let mut any = false;
        for (h, (idx, _)) in heads.iter().zip(parts) {
            if let Some(&i) = idx.get(*h) {
                next = next.min(i);
                any = true;
            }
        }
        if !any {
            break;
        }
        let mut sum = 0f32;
        for (h, (idx, val)) in heads.iter_mut().zip(parts) {
            if idx.get(*h) == Some(&next) {
                sum += val[*h];
                *h += 1;
            }
        }
        if sum != 0.0 {
            out.indices.push(next);
            out.values.push(sum);
        }
    }
    out
}

/// Exact global re-evaluation (Algorithm 1 lines 9–12): allgatherv of every rank's reduced
/// non-zeros; returns their exact top-k (ties to the lower index) and the k-th largest |sum|
/// as the new global threshold (0 when there are at most k non-zeros: all pass).
pub fn th_re_evaluate(
    comm: &dyn Comm,
    kern: &dyn Kernels,
    reduced: Sparse,
    k: usize,
) -> Result<(Sparse, f32)> {
    let all = concat(allgatherv_sparse(comm, reduced)?);
    let th = exact_threshold(kern, &all.values, k);
    Ok((topk_sparse(kern, &all, k), th))
}

/// The ladder and its rule live with the local threshold reuse in `gradkit_sparsify::oktopk`
/// (one implementation, used locally by [`Adjust::Ladder`] and globally by [`th_adjust`]).
pub use gradkit_sparsify::oktopk::{
    fine_ladder, next_ladder, outside_band, pick_rung, th_ladder, Rung, TH_ADJUST_COUNTS,
    TH_ADJUST_ROUNDS, TH_LADDER_DOWN, TH_LADDER_STEP, TH_LADDER_UP,
};

/// What [`th_adjust`] decided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adjusted {
    /// The threshold taken.
    pub th: f32,
    /// The global count at the reused threshold (what the unadjusted threshold would have let
    /// through); `None` when it was kept without counting (≤ 0).
    pub before: Option<u64>,
    /// Ladder rounds run.
    pub rounds: u32,
    /// The count at `th` is outside the band where the band was reachable: re-evaluate.
    pub missed: bool,
}

/// Collective count-band adjustment of a reused global threshold (reuse steps, before Step D).
/// Each rank counts its reduced entries with |v| > rung for every rung of [`th_ladder`]`(th)`
/// (and its number of non-zeros); one integer allreduce ([`allreduce_sum_u64`], ⌈log2 P⌉
/// (+2) messages of 8·[`TH_ADJUST_COUNTS`] bytes) sums them; every rank applies
/// [`pick_rung`] to the same sums, so every rank gets the same threshold. Repeats on the
/// re-centred ladder at most [`TH_ADJUST_ROUNDS`] times. A threshold of 0 (at most k
/// non-zeros at the last re-evaluation, e.g. density 1) is kept as is, without messages.
/// The ladder's final pick is checked against its band: when the global count at the rung
/// taken is still outside [2k/3, 4k/3] where the band was reachable ([`outside_band`]), `missed`
/// is set and the caller re-evaluates exactly ([`th_re_evaluate`]) instead of using it; every
/// rank decides this from the same sums.
pub fn th_adjust(comm: &dyn Comm, reduced: &[f32], th: f32, k: usize) -> Result<Adjusted> {
    if th <= 0.0 || !th.is_finite() {
        return Ok(Adjusted {
            th,
            before: None,
            rounds: 0,
            missed: false,
        });
    }
    let nonzero = reduced.iter().filter(|v| v.abs() > 0.0).count() as u64;
    let mut rungs = th_ladder(th);
    let mut before = None;
    for round in 1..=TH_ADJUST_ROUNDS {
        let mut counts = ladder_counts(reduced, &rungs);
        counts.push(nonzero);
        allreduce_sum_u64(comm, &mut counts)?;
        let all = counts.pop().expect("count of non-zeros");
        let before = *before.get_or_insert(counts[TH_LADDER_DOWN as usize]);
        match pick_rung(&counts, all, k as u64, round == TH_ADJUST_ROUNDS) {
            Rung::Take(i) => {
                return Ok(Adjusted {
                    th: rungs[i],
                    before: Some(before),
                    rounds: round,
                    missed: outside_band(counts[i], all, k as u64),
                })
            }
            rung => rungs = next_ladder(&rungs, rung),
        }
    }
    unreachable!("the last round takes a rung")
}

/// `counts[i]` = #{v : not |v| ≤ rungs[i]} (NaN counts above every rung) for ascending
/// `rungs`, in one pass over `values`: each |v| is put in the bucket of the rungs below it
/// (a binary search), and the buckets are summed from the top.
pub fn ladder_counts(values: &[f32], rungs: &[f32]) -> Vec<u64> {
    let r = rungs.len();
    let mut hist = vec![0u64; r + 1];
    let lowest = rungs.first().copied().unwrap_or(f32::INFINITY);
    for v in values {
        let m = v.abs();
        if m <= lowest {
            continue; // in no count (the common case: most of a region is below the ladder)
        }
        let b = if m.is_nan() {
            r
        } else {
            rungs.partition_point(|&t| t < m)
        };
        hist[b] += 1;
    }
    // counts[i] = Σ_{b > i} hist[b]
    let mut counts = vec![0u64; r];
    let mut acc = 0u64;
    for i in (0..r).rev() {
        acc += hist[i + 1];
        counts[i] = acc;
    }
    counts
}

/// Step D: allgather of the P buffer sizes; when `balance` says so (auto: largest > 4× the
/// average), the rank-ordered concatenation (T entries) is re-cut into blocks of ⌊T/P⌋ (the
/// first T mod P one longer) and each rank sends the parts of its buffer that overlap block
/// j to rank j; then an allgatherv. The result is the rank-ordered concatenation either way.
/// Returns it and whether balancing ran.
pub fn balance_and_allgatherv(
    comm: &dyn Comm,
    mine: Sparse,
    balance: Balance,
) -> Result<(Sparse, bool)> {
    let (p, r) = (comm.size(), comm.rank());
    if p == 1 {
        return Ok((mine, false));
    }
    let sizes: Vec<u64> = comm.allgather_one(mine.len() as u64)?;
    let total: u64 = sizes.iter().sum();
    let max = sizes.iter().copied().max().unwrap_or(0);
    let avg = total as f64 / p as f64;
    let do_balance = total > 0
        && match balance {
            Balance::Always => true,
            Balance::Never => false,
            Balance::Auto => max as f64 > 4.0 * avg,
        };
    let mut mine = mine;
    if do_balance {
        let mut off = vec![0u64; p + 1];
        for i in 0..p {
            off[i + 1] = off[i] + sizes[i];
        }
        let (q, rem) = (total / p as u64, total % p as u64);
        let block = |j: usize| {
            let j = j as u64;
            let s = j * q + j.min(rem);
            (s, s + q + u64::from(j < rem))
        };
        let overlap = |a: (u64, u64), b: (u64, u64)| (a.0.max(b.0), a.1.min(b.1));
        let seg = |i: usize| (off[i], off[i + 1]);
        let slice = |(a, b): (u64, u64)| {
            let (a, b) = ((a - off[r]) as usize, (b - off[r]) as usize);
            Sparse {
                indices: mine.indices[a..b].to_vec(),
                values: mine.values[a..b].to_vec(),
            }
        };
        let sends: Vec<(usize, Sparse)> = (1..p)
            .map(|s| (r + s) % p)
            .filter_map(|j| {
                let o = overlap(seg(r), block(j));
                (o.0 < o.1).then(|| (j, slice(o)))
            })
            .collect();
        let srcs: Vec<usize> = (1..p)
            .map(|s| (r + p - s) % p)
            .filter(|&i| {
                let o = overlap(seg(i), block(r));
                o.0 < o.1
            })
            .collect();
        let got = exchange_sparse(comm, sends, &srcs)?;
        // Assemble block r in rank (= concatenation) order, own part in its place.
        let mut parts: Vec<(usize, Sparse)> = srcs.into_iter().zip(got).collect();
        let o = overlap(seg(r), block(r));
        if o.0 < o.1 {
            parts.push((r, slice(o)));
        }
        parts.sort_by_key(|x| x.0);
        mine = concat(parts.into_iter().map(|x| x.1).collect());
    }
    Ok((concat(allgatherv_sparse(comm, mine)?), do_balance))
}

/// Regions from an Ok-Topk `plan/1` (rows of one step): the ranges must tile [0, n) in
/// worker order (checked by the validator every plan consumer shares,
/// `gradkit_partition::plan`); returns the P−1 boundaries.
pub fn plan_bounds(layout: &Layout, rows: &[&PlanRow], p: usize, n: u64) -> Result<Vec<u64>> {
    let step = rows.first().map_or(0, |r| r.step);
    crate::plan::check_step(crate::plan::PlanKind::Oktopk, layout, p, step, rows)
        .context("oktopk (--plan)")?;
    ensure!(
        layout.total() == n,
        "oktopk: the layout has {} elements, not {n}",
        layout.total()
    );
    let mut tiles = Vec::with_capacity(rows.len());
    for r in rows {
        let (a, b) = flat_range("oktopk", layout, r)?;
        if a < b {
            tiles.push((a, b, r.worker as usize));
        }
    }
    tiles.sort_unstable();
    Ok((0..p.saturating_sub(1))
        .map(|i| {
            tiles
                .iter()
                .filter(|t| t.2 <= i)
                .map(|t| t.1)
                .max()
                .unwrap_or(0)
        })
        .collect())
}

/// Ok-Topk's best case (Ok-Topk Table 1; the lower bound of Theorem 3.1): 2k(P−1)/P words,
/// 2P + 2 log P α.
pub fn cost_best(p: usize, k: f64) -> Cost {
    Cost {
        latency: 2.0 * pf(p) + 2.0 * log2p(p),
        words: 2.0 * k * (pf(p) - 1.0) / pf(p),
    }
}

/// Ok-Topk's worst case with balanced regions (Ok-Topk Table 1): 6k(P−1)/P words.
pub fn cost_worst(p: usize, k: f64) -> Cost {
    Cost {
        latency: 2.0 * pf(p) + 2.0 * log2p(p),
        words: 6.0 * k * (pf(p) - 1.0) / pf(p),
    }
}

/// Ok-Topk's formula by phase (§3.1): `split_and_reduce` Eq. 1, (P−1)α + 2k(P−1)/P·β with
/// balanced regions, and `balance_and_allgatherv` Eq. 2's bound, (P + 2 log P)α +
/// 4k(P−1)/P·β. The threshold's control (`th_adjust`, `th_re_evaluate`) and the regions'
/// repartition are not in Table 1.
pub fn phase_costs(p: usize, k: f64) -> Vec<(&'static str, Cost)> {
    let share = k * (pf(p) - 1.0) / pf(p);
    vec![
        (
            "split_and_reduce",
            Cost {
                latency: pf(p) - 1.0,
                words: 2.0 * share,
            },
        ),
        (
            "balance_and_allgatherv",
            Cost {
                latency: pf(p) + 2.0 * log2p(p),
                words: 4.0 * share,
            },
        ),
    ]
}

/// `--algo oktopk`.
/// The formula is the worst case with balanced regions; `bounds` gives both ends.
pub const DESCRIPTOR: crate::algo::Descriptor = {
    use crate::algo::{Descriptor, Family, Knob};
    Descriptor {
        name: "oktopk",
        family: Family::Sparse,
        paper: "Ok-Topk §3, Algorithms 1 and 2",
        description: "Ok-Topk (split_and_reduce + balance_and_allgatherv), O(k) volume",
        reads: &[
            Knob::Op,
            Knob::Plan,
            Knob::Period,
            Knob::Reeval,
            Knob::Adjust,
            Knob::Balance,
            Knob::ReevalStepD,
        ],
        dense_input_only: false,
        plan: Some(crate::plan::PlanKind::Oktopk),
        cost: Some(|p, _, k| cost_worst(p, k)),
        bounds: Some((|p, _, k| cost_best(p, k), |p, _, k| cost_worst(p, k))),
        phases: Some(|p, _, k| phase_costs(p, k)),
        exchange: crate::algo::AsExchange::new(
            "Ok-Topk: split_and_reduce + balance_and_allgatherv (Algorithm 2)",
        ),
        ..Descriptor::base(|params| Ok(Box::new(OkTopk::new(params)?)))
    }
};

/// `--algo oktopk`: Algorithm 1 with its state across steps (boundaries, thresholds,
/// residual). Reads `k`/`density`, `period` τ, `reeval` τ', `adjust`, `balance`,
/// `reeval_step_d`, `plan`, `residual`.
pub struct OkTopk {
    params: Params,
    fb: Feedback,
    calls: u64,
    bounds: Option<Vec<u64>>,
    /// The local threshold reuse (gradkit_sparsify::oktopk, the one implementation).
    local: LocalReuse,
    local_th: Option<f32>,
    global_th: Option<f32>,
}

impl OkTopk {
    pub fn new(params: &Params) -> Result<Self> {
        ensure!(params.period >= 1, "oktopk: --period must be at least 1");
        ensure!(params.reeval >= 1, "oktopk: --reeval must be at least 1");
        Ok(OkTopk {
            params: params.clone(),
            fb: Feedback::new(params.residual, gradkit_sparsify::Leaves::SentInResult)
                .on(params.resident),
            calls: 0,
            bounds: None,
            local: LocalReuse::new(params.reeval, params.adjust),
            local_th: None,
            global_th: None,
        })
    }

    /// Algorithm 1's global selection: the exact threshold on re-evaluation steps
    /// (`th_re_evaluate`; its exact top-k is the result under `--reeval-step-d skip`, Step D
    /// runs with the new threshold under `run`), otherwise the reused one (adjusted by the
    /// `--adjust` policy) and Step D. Returns the result and whether balancing ran.
    fn global_selection(
        &mut self,
        comm: &dyn Comm,
        reduced: Sparse,
        k: usize,
        reeval: bool,
        metrics: &mut Vec<(String, f64)>,
    ) -> Result<(Sparse, bool)> {
        let kern = self.params.kernels;
        if reeval {
            let _ph = comm.phase("th_re_evaluate");
            if self.params.reeval_step_d == ReevalStepD::Skip {
                let (res, th) = th_re_evaluate(comm, kern, reduced, k)?;
                self.global_th = Some(th);
                return Ok((res, false));
            }
            // Lines 9–12, then line 13 below with the exact threshold.
            let all = concat(allgatherv_sparse(comm, reduced.clone())?);
            let th = exact_threshold(kern, &all.values, k);
            self.global_th = Some(th);
            drop(_ph);
            // th is the k-th largest |sum| (0: at most k non-zeros, all pass): `≥` keeps
            // exactly the gathered top-k when the magnitudes are distinct.
            let keep = |v: f32| if th > 0.0 { v.abs() >= th } else { v != 0.0 };
            return self.step_d(comm, &reduced, keep);
        }
        let th = self.global_th.expect("threshold from the first call");
        let th = match self.params.adjust {
            Adjust::Ladder => {
                let a = {
                    let _ph = comm.phase("th_adjust");
                    th_adjust(comm, &reduced.values, th, k)?
                };
                if let Some(b) = a.before {
                    metrics.push(("global_count_reused_th".into(), b as f64));
                }
                metrics.push(("th_adjust_rounds".into(), f64::from(a.rounds)));
                metrics.push(("th_fallback".into(), f64::from(u8::from(a.missed))));
                if a.missed {
                    // The ladder could not reach the band (gradients fading or growing faster
                    // than its rounds move): this step re-evaluates exactly instead.
                    let _ph = comm.phase("th_re_evaluate");
                    let (res, th) = th_re_evaluate(comm, kern, reduced, k)?;
                    self.global_th = Some(th);
                    return Ok((res, false));
                }
                a.th
            }
            // Algorithm 1 line 13 as written; the reference code nudges th after the step.
            Adjust::Paper | Adjust::Reference(_) => th,
        };
        // The threshold in force this step; it carries over to the next reuse step.
        self.global_th = Some(th);
        self.step_d(comm, &reduced, |v: f32| v.abs() > th)
    }

    /// Step D (Algorithm 1 line 13): this rank keeps the entries of its reduced region that
    /// pass `keep`, then [`balance_and_allgatherv`] (phase `balance_and_allgatherv`).
    fn step_d(
        &self,
        comm: &dyn Comm,
        reduced: &Sparse,
        keep: impl Fn(f32) -> bool,
    ) -> Result<(Sparse, bool)> {
        let kept: Vec<usize> = (0..reduced.len())
            .filter(|&i| keep(reduced.values[i]))
            .collect();
        let mine = Sparse {
            indices: kept.iter().map(|&i| reduced.indices[i]).collect(),
            values: kept.iter().map(|&i| reduced.values[i]).collect(),
        };
        let _ph = comm.phase("balance_and_allgatherv");
        balance_and_allgatherv(comm, mine, self.params.balance)
    }
}

impl OkTopk {
    /// Step 1: this rank's selection (given sparse, or selected from the error-compensated
    /// accumulator with the threshold reused between re-evaluations), and the accumulator
    /// when this rank compensated one.
    fn local_selection(
        &mut self,
        input: Flat,
        reeval: bool,
        k: usize,
        metrics: &mut Vec<(String, f64)>,
    ) -> (Sparse, Option<Acc>) {
        let t = Instant::now();
        let (sel, acc) = match input {
            Flat::Sparse(s) => (s, None),
            Flat::Dense(g) => {
                let acc = self.fb.accumulate_acc(g);
                let (st, values) = match &acc {
                    Acc::Host(a) => self.local.select_values_at(reeval, a, k),
                    Acc::Dev(dev, a) => self.local.select_values_resident(*dev, reeval, a, k),
                };
                self.local_th = st.threshold;
                // Passes over acc beyond the one streaming pass (0 in the common case).
                metrics.push(("local_rescans".into(), f64::from(st.rescans)));
                metrics.push(("local_fallback".into(), f64::from(u8::from(st.fell_back))));
                let sel = Sparse {
                    indices: st.indices,
                    values,
                };
                (sel, Some(acc))
            }
        };
        metrics.push(("time_select_s".into(), super::secs(t)));
        metrics.push(("local_nnz".into(), sel.len() as f64));
        if let Some(th) = self.local_th {
            metrics.push(("threshold".into(), th as f64));
        }
        (sel, acc)
    }

    /// Step 2: the regions of this step: the plan's, or repartitioned every τ calls from the
    /// selections (space_repartition). Whether they changed.
    fn regions(
        &mut self,
        comm: &dyn Comm,
        plan_b: Option<Vec<u64>>,
        sel: &Sparse,
        n: u64,
        calls: u64,
    ) -> Result<bool> {
        if let Some(b) = plan_b {
            let changed = self.bounds.as_ref() != Some(&b);
            self.bounds = Some(b);
            return Ok(changed);
        }
        if self.bounds.is_none() || calls.is_multiple_of(self.params.period as u64) {
            let _ph = comm.phase("space_repartition");
            self.bounds = Some(space_repartition(comm, &sel.indices, n)?);
            return Ok(true);
        }
        Ok(false)
    }
}

impl Reducer for OkTopk {
    fn name(&self) -> &'static str {
        "oktopk"
    }
    /// The residual, and what Algorithm 1 carries from call to call, so that a run restored
    /// from it continues exactly: `oktopk.thresholds` (the local, global and local-reuse
    /// thresholds, NaN where none is set yet), `oktopk.calls` (this reducer's and the local
    /// selection's call counts) and `oktopk.regions` (the P + 1 region bounds, empty before
    /// the first call). Counts and bounds are integers: each is stored as the two 32-bit
    /// halves of its u64, as the bit patterns of f32 values ([`int_state`]), so they survive
    /// exactly in a state of f32 tensors. Before the first call: the residual only (none).
    fn state(&self) -> Vec<(String, Vec<f32>)> {
        let mut out = self.fb.state();
        if self.calls == 0 {
            return out; // a fresh reducer: nothing carried yet
        }
        let (local_calls, reuse_th) = self.local.progress();
        let th = |t: Option<f32>| t.unwrap_or(f32::NAN);
        out.push((
            "oktopk.thresholds".into(),
            vec![th(self.local_th), th(self.global_th), th(reuse_th)],
        ));
        out.push((
            "oktopk.calls".into(),
            int_state::encode(&[self.calls, local_calls]),
        ));
        let regions = self.bounds.as_deref().unwrap_or_default();
        out.push(("oktopk.regions".into(), int_state::encode(regions)));
        out
    }
    fn load_state(&mut self, state: &[(String, Vec<f32>)]) -> Result<()> {
        let mut residual = Vec::new();
        for (k, v) in state {
            match k.as_str() {
                "oktopk.thresholds" => {
                    ensure!(
                        v.len() == 3,
                        "oktopk: state `{k}` holds {} values, not 3",
                        v.len()
                    );
                    let th = |x: f32| (!x.is_nan()).then_some(x);
                    self.local_th = th(v[0]);
                    self.global_th = th(v[1]);
                    let calls = self.local.progress().0;
                    self.local.restore(calls, th(v[2]));
                }
                "oktopk.calls" => {
                    let c = int_state::decode(k, v)?;
                    ensure!(
                        c.len() == 2,
                        "oktopk: state `{k}` holds {} counts, not 2",
                        c.len()
                    );
                    self.calls = c[0];
                    let th = self.local.progress().1;
                    self.local.restore(c[1], th);
                }
                "oktopk.regions" => {
                    let b = int_state::decode(k, v)?;
                    self.bounds = (!b.is_empty()).then_some(b);
                }
                _ => residual.push((k.clone(), v.clone())),
            }
        }
        self.fb.load_state("oktopk", &residual)
    }
    fn reduce(
        &mut self,
        comm: &dyn Comm,
        step: u32,
        layout: &Layout,
        input: Flat,
    ) -> Result<StepOutput> {
        let n = self.fb.check("oktopk", layout, &input)?;
        let p = comm.size();
        let k = k_of(&self.params, n);
        let c = self.calls;
        let reeval = c.is_multiple_of(self.params.reeval as u64);
        let mut metrics: Vec<(String, f64)> = Vec::new();

        // Plan errors are found before any message, on every rank alike.
        let plan_b = match &self.params.plan {
            Some(plan) => {
                check_plan_workers("oktopk", plan, p)?;
                Some(plan_bounds(layout, &plan_at(plan, step), p, n as u64)?)
            }
            None => None,
        };
        self.calls += 1;

        // 1. local selection
        let (sel, acc) = self.local_selection(input, reeval, k, &mut metrics);
        // 2. regions
        let repartitioned = self.regions(comm, plan_b, &sel, n as u64, c)?;
        let bounds = self.bounds.as_ref().expect("regions");
        let (lo, hi) = region(bounds, comm.rank(), n as u64);

        // 3. split and reduce
        let reduced = {
            let _ph = comm.phase("split_and_reduce");
            split_and_reduce(comm, &sel, bounds, n as u64)?
        };
        metrics.push(("reduced_nnz".into(), reduced.len() as f64));

        // 4. global selection
        let (result, balanced) = self.global_selection(comm, reduced, k, reeval, &mut metrics)?;
        metrics.push((
            "global_threshold".into(),
            self.global_th.unwrap_or(0.0) as f64,
        ));
        if let (Adjust::Reference(b), Some(th)) = (self.params.adjust, self.global_th) {
            // The reference code's global count bands, for the next step (no message: every
            // rank has the same result).
            self.global_th = Some(b.nudge_global(th, result.len(), k));
        }
        metrics.push(("reevaluated".into(), f64::from(u8::from(reeval))));
        metrics.push(("repartitioned".into(), f64::from(u8::from(repartitioned))));
        metrics.push(("balanced".into(), f64::from(u8::from(balanced))));
        metrics.push(("region_start".into(), lo as f64));
        metrics.push(("region_end".into(), hi as f64));

        let contributed = acc.as_ref().map(|_| sel.indices.clone());
        if let Some(acc) = acc {
            if let Some(norm) = self.fb.settle_acc(acc, &sel.indices, &result.indices) {
                metrics.push(("residual_norm".into(), norm));
            }
        }
        Ok(output(
            comm,
            self.params.op,
            result,
            k,
            contributed,
            metrics,
        ))
    }
}

/// Integers in a state of f32 tensors ([`Reducer::state`]): each u64 as its low and high
/// 32-bit halves, each half the bit pattern of one f32 (copied, never computed with, so every
/// pattern, NaNs included, survives).
pub(crate) mod int_state {
    use anyhow::{ensure, Result};

    pub fn encode(v: &[u64]) -> Vec<f32> {
        v.iter()
            .flat_map(|x| [f32::from_bits(*x as u32), f32::from_bits((*x >> 32) as u32)])
            .collect()
    }

    pub fn decode(name: &str, v: &[f32]) -> Result<Vec<u64>> {
        ensure!(
            v.len().is_multiple_of(2),
            "state `{name}` holds {} values, not pairs of 32-bit halves",
            v.len()
        );
        Ok(v.chunks_exact(2)
            .map(|h| u64::from(h[0].to_bits()) | (u64::from(h[1].to_bits()) << 32))
            .collect())
    }
}
