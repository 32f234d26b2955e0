//! CLT-k, cyclic local top-k (Chen et al. 2020, ScaleCom), the baseline DEFT compares with
//! (Yoon & Oh, ICPP'23 §1 and §3.1, Table 1; deft.md §2): at step t the leader is rank
//! t mod P. Per step:
//! 1. every rank accumulates `acc = residual + g` (error feedback, Ok-Topk Algorithm 2);
//! 2. the leader alone selects the exact top-k of **its own** accumulator by magnitude and
//!    broadcasts the k indices (binomial tree from the leader; `broadcast_indices`);
//! 3. every rank contributes its accumulator values at exactly those indices, summed by the
//!    ring allreduce of the k values (`allreduce_values`), so every rank gets the same bits.
//!
//! Result: the leader's indices with `Σ_i acc_i` there (divided by P for `Op::Mean`), so the
//! global density is exactly k / n whatever P (no build-up). Residual: the accumulator with
//! the leader's indices zeroed on every rank (every rank sent its values there;
//! `Leaves::Result`, as DEFT). The other ranks select nothing: they wait at the broadcast
//! (the "worker idling" of DEFT's Table 1).
//!
//! Traffic per step: the broadcast sends 4k bytes to each of a rank's children in the
//! binomial tree rooted at the leader (⌈log2 P⌉ messages from the leader), and the ring
//! allreduce of k f32 sends 2(P−1) messages per rank (`gradkit_cost::ring_bytes_sent` bytes).
//!
//! Needs dense input: the selection is made from the leader's dense accumulator, so a
//! sparse selection (e.g. from gradselect) is refused.

use std::time::Instant;

use anyhow::Result;
use gradkit_comm::{Comm, CommExt};
use gradkit_core::trace::{Layout, Sparse};
use gradkit_cost::{log2p, pf, Cost};

use super::{k_of, output, secs, Acc, Feedback};
use crate::{Flat, Params, Reducer, StepOutput};

/// The leader of `step` among `p` ranks (rank t mod P).
pub fn leader_of(step: u32, p: usize) -> usize {
    step as usize % p
}

/// The CLT-k exchange of one step: the leader (`leader_of(step, P)`) gives `Some(indices)`
/// (ascending, below `acc.len()`), the others `None`; returns the leader's indices with the
/// sum over ranks of `acc` at them, identical on every rank.
pub fn exchange(
    comm: &dyn Comm,
    leader: usize,
    acc: &[f32],
    sel: Option<Vec<u32>>,
) -> Result<Sparse> {
    let indices: Vec<u32> = {
        let _ph = comm.phase("broadcast_indices");
        comm.broadcast(leader, sel)?
    };
    super::allreduce_at(
        comm,
        "cltk",
        &format!("leader {leader}'s indices"),
        acc,
        indices,
    )
}

/// [`exchange`] with the accumulator where it lives.
fn exchange_acc(
    comm: &dyn Comm,
    leader: usize,
    acc: &Acc,
    sel: Option<Vec<u32>>,
) -> Result<Sparse> {
    let indices: Vec<u32> = {
        let _ph = comm.phase("broadcast_indices");
        comm.broadcast(leader, sel)?
    };
    let what = format!("leader {leader}'s indices");
    super::allreduce_at_acc(comm, "cltk", &what, acc, indices)
}

/// CLT-k's formula (DEFT §1, §3.1; Chen et al. 2020): the leader's k `u32` indices broadcast
/// down a binomial tree (⌈log2 P⌉ messages from the leader, the busiest rank, k words each),
/// then a ring allreduce of the k `f32` values: ⌈log2 P⌉ + 2(P−1) α, k⌈log2 P⌉ + 2k(P−1)/P
/// words. Exact for the leader's bytes when P divides k (the ring's chunks are then equal).
pub fn cost(p: usize, k: f64) -> Cost {
    Cost {
        latency: log2p(p) + 2.0 * (pf(p) - 1.0),
        words: k * log2p(p) + 2.0 * k * (pf(p) - 1.0) / pf(p),
    }
}

/// `--algo cltk`.
pub const DESCRIPTOR: crate::algo::Descriptor = {
    use crate::algo::{Descriptor, Family, Knob};
    Descriptor {
        name: "cltk",
        family: Family::Sparse,
        paper: "DEFT §1, §3.1 (CLT-k: Chen et al. 2020)",
        description: "CLT-k: the cyclic leader's top-k indices broadcast, every rank's values there allreduced",
        reads: &[Knob::Op],
        dense_input_only: true,
        cost: Some(|p, _, k| cost(p, k)),
        exchange: crate::algo::AsExchange::new("CLT-k: cyclic leader's top-k indices, every rank's values there allreduced"),
        ..Descriptor::base(|params| Ok(Box::new(CltK::new(params)?)))
    }
};

/// `--algo cltk`. Reads `k`/`density`, `residual`, `kernels`, `op`.
pub struct CltK {
    params: Params,
    fb: Feedback,
}

impl CltK {
    pub fn new(params: &Params) -> Result<Self> {
        Ok(CltK {
            params: params.clone(),
            fb: Feedback::new(params.residual, gradkit_sparsify::Leaves::Result)
                .on(params.resident),
        })
    }
}

impl Reducer for CltK {
    fn name(&self) -> &'static str {
        "cltk"
    }
    super::feedback_state!("cltk");
    fn reduce(
        &mut self,
        comm: &dyn Comm,
        step: u32,
        layout: &Layout,
        input: Flat,
    ) -> Result<StepOutput> {
        let (n, g) = self.fb.check_dense(
            "cltk",
            layout,
            input,
            "CLT-k's leader selects the top-k of its own dense accumulator and every rank sends its values there",
        )?;
        let k = k_of(&self.params, n);
        let leader = leader_of(step, comm.size());
        let t = Instant::now();
        let acc = self.fb.accumulate_acc(g);
        let t_topk = Instant::now();
        let sel = (comm.rank() == leader)
            .then(|| acc.select_in_ranges(self.params.kernels, &[(0..n, k)]));
        // Only the leader selects; the others spend no time on it.
        let (time_topk, time_select) = if sel.is_some() {
            (secs(t_topk), secs(t))
        } else {
            (0.0, 0.0)
        };
        let res = exchange_acc(comm, leader, &acc, sel)?;
        let mut metrics = vec![
            ("time_select_s".to_string(), time_select),
            ("time_topk_s".to_string(), time_topk),
            ("local_nnz".to_string(), res.indices.len() as f64),
            ("leader".to_string(), leader as f64),
        ];
        let contributed = res.indices.clone();
        if let Some(norm) = self.fb.settle_acc(acc, &contributed, &res.indices) {
            metrics.push(("residual_norm".into(), norm));
        }
        Ok(output(
            comm,
            self.params.op,
            res,
            k,
            Some(contributed),
            metrics,
        ))
    }
}
