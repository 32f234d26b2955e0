//! Gaussiank (Shi et al. 2019; Ok-Topk §4 baseline): selection by a threshold from a Gaussian
//! fit of the accumulator, then TopkA's communication (allgatherv of COO, sum).
//!
//! Selection (dense input) is `gradkit_sparsify::gaussiank::select`, the same as
//! `gradselect --method gaussiank`: the threshold `|μ| + σ·Φ⁻¹(1 − d/2)` of a Gaussian fit
//! (d = k/n), halved until at least ⌈3k/4⌉ entries pass (Ok-Topk's fairness rule); the set is
//! exactly `{i : |acc_i| > th}`. Sparse input is taken as the selection and only the
//! communication runs.

use anyhow::Result;
use gradkit_comm::Comm;
use gradkit_core::trace::Layout;
use gradkit_cost::{log2p, pf, Cost};

use super::topka::allgather_sum;
use super::Feedback;
use crate::{Flat, Params, Reducer, StepOutput};

/// Gaussiank's formula (Ok-Topk Table 1): TopkA's communication, 2k(P−1) words, 2 log P α.
pub fn cost(p: usize, k: f64) -> Cost {
    Cost {
        latency: 2.0 * log2p(p),
        words: 2.0 * k * (pf(p) - 1.0),
    }
}

/// `--algo gaussiank`.
pub const DESCRIPTOR: crate::algo::Descriptor = {
    use crate::algo::{Descriptor, Family, Knob};
    Descriptor {
        name: "gaussiank",
        family: Family::Sparse,
        paper: "Ok-Topk Table 1 (Gaussiank: Shi et al. 2019)",
        description: "Gaussian-threshold selection + TopkA communication",
        reads: &[Knob::Op],
        dense_input_only: false,
        cost: Some(|p, _, k| cost(p, k)),
        phases: Some(|p, _, k| vec![("allgatherv", cost(p, k))]),
        exchange: crate::algo::AsExchange::new("Gaussian-threshold selection, TopkA communication"),
        ..Descriptor::base(|params| Ok(Box::new(GaussianK::new(params)?)))
    }
};

/// `--algo gaussiank`.
pub struct GaussianK {
    params: Params,
    fb: Feedback,
}

impl GaussianK {
    pub fn new(params: &Params) -> Result<Self> {
        Ok(GaussianK {
            params: params.clone(),
            fb: Feedback::new(params.residual, gradkit_sparsify::Leaves::Sent).on(params.resident),
        })
    }
}

impl Reducer for GaussianK {
    fn name(&self) -> &'static str {
        "gaussiank"
    }
    super::feedback_state!("gaussiank");
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
            "gaussiank",
            comm,
            layout,
            input,
            super::Local::Gaussiank,
            |comm, sel, _, _| allgather_sum(comm, sel),
        )
    }
}
