//! TopkDSA: SparCML's dynamic sparse allreduce (Renggli et al., SC'19; Ok-Topk Table 1).
//!
//! Static equal regions (region i = `[i·n/P, (i+1)·n/P)`); the same point-to-point reduce
//! as Ok-Topk's split-and-reduce (rotated destinations, buckets); then an allgather of the P
//! reduced sizes and, as SparCML switches representation when fill-in makes the data dense:
//! - **sparse** allgatherv of the reduced COO regions when their total size T satisfies
//!   2·T < n (COO words below dense words: the break-even point), else
//! - **dense** allgatherv of the reduced regions as plain `f32` arrays (n words in all).
//!
//! Result = Σ_i S_i exactly: the union of supports on the sparse path; the non-zero entries on
//! the dense path (where explicit zeros cannot be told apart). Metric `dense_allgather` says
//! which path ran.

use anyhow::Result;
use gradkit_comm::{Comm, CommExt};
use gradkit_core::trace::{Layout, Sparse};
use gradkit_cost::{log2p, pf, Cost};
use gradkit_partition::oktopk::{naive_boundaries, region};

use super::oktopk::split_and_reduce;
use super::{allgatherv_sparse, concat, gather, Feedback};
use crate::{Flat, Params, Reducer, StepOutput};

/// Whether TopkDSA gathers dense regions: COO (2 words per entry) at or above n words.
pub fn dense_is_cheaper(total_nnz: u64, n: u64) -> bool {
    2 * total_nnz >= n
}

/// The TopkDSA exchange of one step; returns the sum and whether the dense path ran.
pub fn sparse_allreduce(comm: &dyn Comm, sel: &Sparse, n: u64) -> Result<(Sparse, bool)> {
    let p = comm.size();
    let bounds = naive_boundaries(p, n);
    let reduced = {
        let _ph = comm.phase("reduce");
        split_and_reduce(comm, sel, &bounds, n)?
    };
    let sizes: Vec<u64> = {
        let _ph = comm.phase("allgather_sizes");
        if p == 1 {
            vec![reduced.len() as u64]
        } else {
            comm.allgather_one(reduced.len() as u64)?
        }
    };
    let total: u64 = sizes.iter().sum();
    let _ph = comm.phase("allgatherv");
    if !dense_is_cheaper(total, n) {
        return Ok((concat(allgatherv_sparse(comm, reduced)?), false));
    }
    let (lo, hi) = region(&bounds, comm.rank(), n);
    let mut mine = vec![0f32; (hi - lo) as usize];
    for (&i, &v) in reduced.indices.iter().zip(&reduced.values) {
        mine[(i as u64 - lo) as usize] = v;
    }
    // Each region is freed as soon as it is copied (not every region and the whole model).
    let mut dense: Vec<f32> = Vec::with_capacity(n as usize);
    for part in comm.allgatherv(mine)? {
        dense.extend_from_slice(&part);
    }
    let nz: Vec<u32> = (0..dense.len() as u32)
        .filter(|&i| dense[i as usize] != 0.0)
        .collect();
    Ok((gather(&dense, nz), true))
}

/// TopkDSA's best case (Ok-Topk Table 1): fully overlapping, uniformly spread indices:
/// 4k(P−1)/P words, P + 2 log P α.
pub fn cost_best(p: usize, k: f64) -> Cost {
    Cost {
        latency: pf(p) + 2.0 * log2p(p),
        words: 4.0 * k * (pf(p) - 1.0) / pf(p),
    }
}

/// TopkDSA's worst case (Ok-Topk Table 1): fill-in makes it switch to a dense allgather:
/// (2k + n)(P−1)/P words.
pub fn cost_worst(p: usize, n: f64, k: f64) -> Cost {
    Cost {
        latency: pf(p) + 2.0 * log2p(p),
        words: (2.0 * k + n) * (pf(p) - 1.0) / pf(p),
    }
}

/// `--algo topkdsa`. The formula is Table 1's best case; `bounds` gives both ends.
pub const DESCRIPTOR: crate::algo::Descriptor = {
    use crate::algo::{Descriptor, Family, Knob};
    Descriptor {
        name: "topkdsa",
        family: Family::Sparse,
        paper: "Ok-Topk Table 1 (TopkDSA: SparCML, Renggli et al. 2019)",
        description: "SparCML's static regions, reduce, sparse/dense allgatherv (TopkDSA)",
        reads: &[Knob::Op],
        dense_input_only: false,
        cost: Some(|p, _, k| cost_best(p, k)),
        bounds: Some((|p, _, k| cost_best(p, k), cost_worst)),
        exchange: crate::algo::AsExchange::new(
            "SparCML's static regions, sparse/dense allgatherv (TopkDSA)",
        ),
        ..Descriptor::base(|params| Ok(Box::new(TopkDsa::new(params)?)))
    }
};

/// `--algo topkdsa`. Dense input: exact local top-k with error feedback.
pub struct TopkDsa {
    params: Params,
    fb: Feedback,
}

impl TopkDsa {
    pub fn new(params: &Params) -> Result<Self> {
        Ok(TopkDsa {
            params: params.clone(),
            fb: Feedback::new(params.residual, gradkit_sparsify::Leaves::Sent).on(params.resident),
        })
    }
}

impl Reducer for TopkDsa {
    fn name(&self) -> &'static str {
        "topkdsa"
    }
    super::feedback_state!("topkdsa");
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
            "topkdsa",
            comm,
            layout,
            input,
            super::Local::Topk,
            |comm, sel, n, metrics| {
                let (res, dense) = sparse_allreduce(comm, &sel, n as u64)?;
                metrics.push(("dense_allgather".into(), f64::from(u8::from(dense))));
                Ok(res)
            },
        )
    }
}
