//! TopkA (Ok-Topk Table 1; Renggli et al. 2019's allgather baseline): every rank's COO
//! selection is allgathered (ring allgatherv of the `u32` indices, then of the `f32` values)
//! and summed in rank order. Result = Σ_i S_i exactly (union of supports).
//!
//! Traffic: rank r sends 8·Σ_{i≠r+1}|S_i| bytes and receives 8·Σ_{i≠r}|S_i| bytes in
//! 2(P−1) messages each way: 2k(P−1) words when every |S_i| = k.

use anyhow::Result;
use gradkit_comm::{Comm, CommExt};
use gradkit_core::trace::{Layout, Sparse};
use gradkit_cost::{log2p, pf, Cost};

use super::{allgatherv_sparse, sum_sparse, Feedback};
use crate::{Flat, Params, Reducer, StepOutput};

/// Allgatherv of every rank's COO, then the sum in rank order.
pub fn allgather_sum(comm: &dyn Comm, mine: Sparse) -> Result<Sparse> {
    let _ph = comm.phase("allgatherv");
    let all = allgatherv_sparse(comm, mine)?;
    Ok(sum_sparse(&all))
}

/// TopkA's formula (Ok-Topk Table 1): an allgather of every rank's k-COO: 2k(P−1) words,
/// log P α.
pub fn cost(p: usize, k: f64) -> Cost {
    Cost {
        latency: log2p(p),
        words: 2.0 * k * (pf(p) - 1.0),
    }
}

/// `--algo topka`.
pub const DESCRIPTOR: crate::algo::Descriptor = {
    use crate::algo::{Descriptor, Family, Knob};
    Descriptor {
        name: "topka",
        family: Family::Sparse,
        paper: "Ok-Topk §2, Table 1 (TopkA)",
        description: "allgatherv of every rank's COO, then sum (TopkA)",
        reads: &[Knob::Op],
        dense_input_only: false,
        cost: Some(|p, _, k| cost(p, k)),
        phases: Some(|p, _, k| vec![("allgatherv", cost(p, k))]),
        exchange: Some(crate::algo::AsExchange {
            help: "local top-k of residual+gradient, allgatherv (TopkA)",
            aliases: &["topk"],
        }),
        ..Descriptor::base(|params| Ok(Box::new(TopkA::new(params)?)))
    }
};

/// `--algo topka`. Dense input: exact local top-k (`params.k_for(n)`) with error feedback.
pub struct TopkA {
    params: Params,
    fb: Feedback,
}

impl TopkA {
    pub fn new(params: &Params) -> Result<Self> {
        Ok(TopkA {
            params: params.clone(),
            fb: Feedback::new(params.residual, gradkit_sparsify::Leaves::Sent).on(params.resident),
        })
    }
}

impl Reducer for TopkA {
    fn name(&self) -> &'static str {
        "topka"
    }
    super::feedback_state!("topka");
    fn reduce(
        &mut self,
        comm: &dyn Comm,
        _step: u32,
        layout: &Layout,
        input: Flat,
    ) -> Result<StepOutput> {
        super::select_and_exchange(
            &mut self.fb,
            &self.params,
            "topka",
            comm,
            layout,
            input,
            super::Local::Topk,
            |comm, sel, _, _| allgather_sum(comm, sel),
        )
    }
}
