//! DEFT's exchange (Yoon & Oh, ICPP'23; deft.md §1.5): every rank selects only inside the
//! gradient pieces it owns, so the ranks' index sets are disjoint; then
//! 1. allgather of the per-rank counts (`allgather_counts`),
//! 2. allgather of the indices (`allgather_indices`; their union needs no dedup),
//! 3. allreduce (ring) of **every** rank's accumulator values at all gathered indices
//!    (`allreduce_values`).
//!
//! Result: `Σ_i acc_i` at the union of the selections. Residual: the accumulator with all
//! gathered indices zeroed (every rank sent its values there; DEFT Algorithm 1).
//!
//! Needs dense input. Ranges: from `params.plan` (a DEFT `plan/1` from `gradpartition
//! --method deft`, rows of the applicable step, each row's k used as is), or computed
//! in-process with gradkit-partition's `deft` module: pieces once, then per step every rank
//! allocates k over the pieces from its own norms (deft.md §1.2), the leader rank
//! `step mod P` bin-packs with its allocation and broadcasts the piece → bin table (`plan`,
//! 4 bytes per piece), and rank r takes the pieces whose bin maps to it (`worker_of_bin`).

use anyhow::{bail, ensure, Context, Result};
use gradkit_comm::{Comm, CommExt};
use gradkit_core::trace::{Layout, Sparse};
use gradkit_partition::deft as dp;

use super::{check_plan_workers, flat_range, k_of, output, plan_at, Acc, Feedback};
use crate::{Flat, Params, Reducer, StepOutput};

/// The DEFT exchange of one step given this rank's (disjoint) selection from `acc`.
pub fn exchange(comm: &dyn Comm, acc: &[f32], sel: Vec<u32>) -> Result<Sparse> {
    let union = gather_union(comm, sel)?;
    super::allreduce_at(comm, "deft", "the gathered indices", acc, union)
}

/// Steps 1–2 of [`exchange`]: the counts and the indices allgathered, their union checked
/// (ascending, no duplicates).
fn gather_union(comm: &dyn Comm, sel: Vec<u32>) -> Result<Vec<u32>> {
    let counts: Vec<u64> = {
        let _ph = comm.phase("allgather_counts");
        if comm.size() == 1 {
            vec![sel.len() as u64]
        } else {
            comm.allgather_one(sel.len() as u64)?
        }
    };
    let mut union: Vec<u32> = {
        let _ph = comm.phase("allgather_indices");
        let all = comm.allgatherv(sel)?;
        for (i, (a, c)) in all.iter().zip(&counts).enumerate() {
            ensure!(
                a.len() as u64 == *c,
                "deft: rank {i} sent {} indices but announced {c}",
                a.len()
            );
        }
        all.concat()
    };
    union.sort_unstable();
    let before = union.len();
    union.dedup();
    ensure!(
        union.len() == before,
        "deft: ranks selected overlapping indices ({} duplicates): the plan's ranges overlap (--plan)",
        before - union.len()
    );
    Ok(union)
}

/// [`exchange`] with the accumulator where it lives (resident on a device: the union goes
/// up, the accumulator's values at it come down).
fn exchange_acc(comm: &dyn Comm, acc: &Acc, sel: Vec<u32>) -> Result<Sparse> {
    match acc {
        Acc::Host(a) => exchange(comm, a, sel),
        Acc::Dev(..) => {
            let union = gather_union(comm, sel)?;
            super::allreduce_at_acc(comm, "deft", "the gathered indices", acc, union)
        }
    }
}

/// `--algo deft`.
pub const DESCRIPTOR: crate::algo::Descriptor = {
    use crate::algo::{Descriptor, Family, Knob};
    Descriptor {
        name: "deft",
        family: Family::Sparse,
        paper: "DEFT §3 (Algorithm 1, the exchange of disjoint selections)",
        description: "DEFT's exchange of disjoint per-worker selections",
        reads: &[Knob::Op, Knob::Plan],
        dense_input_only: true,
        plan: Some(crate::plan::PlanKind::Deft),
        cost: None,
        exchange: crate::algo::AsExchange::new("DEFT: disjoint per-worker partitions, no build-up"),
        ..Descriptor::base(|params| Ok(Box::new(Deft::new(params)?)))
    }
};

/// `--algo deft`. Reads `k`/`density`, `plan`, `residual`.
pub struct Deft {
    params: Params,
    fb: Feedback,
    pieces: Option<Vec<dp::Piece>>,
    /// Seconds of the last step's norms + k allocation and of its bin packing (leader only),
    /// reported apart from the selection (DEFT Figs. 7 and 9).
    times: (f64, f64),
}

impl Deft {
    pub fn new(params: &Params) -> Result<Self> {
        Ok(Deft {
            params: params.clone(),
            fb: Feedback::new(params.residual, gradkit_sparsify::Leaves::Result)
                .on(params.resident),
            pieces: None,
            times: (0.0, 0.0),
        })
    }

    /// This rank's `(flat range, k)` list for `step`.
    fn ranges(
        &mut self,
        comm: &dyn Comm,
        step: u32,
        layout: &Layout,
        acc: &Acc,
        k: usize,
    ) -> Result<Vec<(std::ops::Range<usize>, usize)>> {
        let (p, r) = (comm.size(), comm.rank());
        self.times = (0.0, 0.0);
        if let Some(plan) = &self.params.plan {
            check_plan_workers("deft", plan, p)?;
            let rows = plan_at(plan, step);
            // The validator every plan consumer shares: a gap would leave part of the model
            // never exchanged, an overlap would select twice.
            let at = rows.first().map_or(step, |r| r.step);
            crate::plan::check_step(crate::plan::PlanKind::Deft, layout, p, at, &rows)
                .context("deft (--plan)")?;
            let mut out = Vec::new();
            for row in rows {
                let (a, b) = flat_range("deft", layout, row)?;
                let Some(kx) = row.k else {
                    bail!("deft: plan row without k (an Ok-Topk plan?); use gradpartition --method deft (--plan)")
                };
                if row.worker as usize == r {
                    out.push((a as usize..b as usize, kx as usize));
                }
            }
            return Ok(out);
        }
        let pieces = self.pieces.get_or_insert_with(|| dp::pieces(layout, p));
        let t = std::time::Instant::now();
        let norms = acc.piece_norms(layout, pieces);
        let ks = dp::allocate_k(pieces, &norms, k as u64, false);
        self.times.0 = super::secs(t);
        let leader = step as usize % p;
        // Packed before the `plan` phase, so that phase times the broadcast alone.
        let t = std::time::Instant::now();
        let mine = (r == leader).then(|| {
            dp::bin_pack(pieces, &ks, p)
                .into_iter()
                .map(|b| b as u32)
                .collect()
        });
        if r == leader {
            self.times.1 = super::secs(t);
        }
        let bins: Vec<u32> = {
            let _ph = comm.phase("plan");
            // One bin per layer piece: control, whatever the model's size.
            let _fixed = comm.fixed(gradkit_comm::Fixed::All);
            comm.broadcast(leader, mine)?
        };
        ensure!(
            bins.len() == pieces.len(),
            "deft: leader sent {} bins for {} pieces",
            bins.len(),
            pieces.len()
        );
        Ok(pieces
            .iter()
            .zip(&ks)
            .zip(&bins)
            .filter(|(_, &b)| dp::worker_of_bin(b as usize, step, p) == r)
            .map(|((pc, &kx), _)| (pc.flat_range(layout), kx as usize))
            .collect())
    }
}

impl Reducer for Deft {
    fn name(&self) -> &'static str {
        "deft"
    }
    super::feedback_state!("deft");
    fn reduce(
        &mut self,
        comm: &dyn Comm,
        step: u32,
        layout: &Layout,
        input: Flat,
    ) -> Result<StepOutput> {
        let (n, g) = self.fb.check_dense(
            "deft",
            layout,
            input,
            "DEFT selects inside its own ranges and sends every rank's values at the gathered indices",
        )?;
        let k = k_of(&self.params, n);
        let t = std::time::Instant::now();
        let acc = self.fb.accumulate_acc(g);
        let ranges = self.ranges(comm, step, layout, &acc, k)?;
        let t_topk = std::time::Instant::now();
        let sel = acc.select_in_ranges(self.params.kernels, &ranges);
        let time_topk = super::secs(t_topk);
        let mut metrics = vec![
            ("time_select_s".to_string(), super::secs(t)),
            ("time_norms_s".to_string(), self.times.0),
            ("time_binpack_s".to_string(), self.times.1),
            ("time_topk_s".to_string(), time_topk),
            ("local_nnz".to_string(), sel.len() as f64),
            ("pieces".to_string(), ranges.len() as f64),
        ];
        let res = exchange_acc(comm, &acc, sel.clone())?;
        if let Some(norm) = self.fb.settle_acc(acc, &sel, &res.indices) {
            metrics.push(("residual_norm".into(), norm));
        }
        Ok(output(comm, self.params.op, res, k, Some(sel), metrics))
    }
}
