//! gTop-k (Shi et al., ICDCS'19; Ok-Topk Table 1): a reduction tree in which each level sums
//! the partner's sparse vector into its own and keeps the top-k by |value|, then a broadcast
//! of the root's result.
//!
//! Tree for any P: with p' the largest power of two ≤ P, ranks r ≥ p' first fold into
//! r − p' (which keeps Topk(V_{r−p'} + V_r)); then at level ℓ = 0, 1, … rank r with
//! r mod 2^(ℓ+1) = 0 receives from r + 2^ℓ and keeps Topk(V_r + V_{r+2^ℓ}). Rank 0's vector is
//! broadcast (binomial tree, indices then values). For P = 4:
//! Topk(Topk(S0+S1) + Topk(S2+S3)); for P = 1 the result is S0 as given. Top-k keeps exactly
//! min(k, nnz) entries, ties to the lower index.
//!
//! Traffic: each tree edge carries ≤ k COO entries (8k bytes); rank 0 sends 8k·⌈log2 P⌉
//! bytes in the broadcast: 4k log P words on the critical path, as in Table 1.

use anyhow::{Context, Result};
use gradkit_comm::{Comm, CommExt};
use gradkit_core::trace::{Layout, Sparse};
use gradkit_cost::{log2p, Cost};
use gradkit_sparsify::kernels::Kernels;

use super::{exchange_sparse, k_of, sum_sparse, topk_sparse, Feedback};
use crate::{Flat, Params, Reducer, StepOutput};

/// The gTop-k reduction tree and broadcast of one step.
pub fn tree_allreduce(
    comm: &dyn Comm,
    kern: &dyn Kernels,
    mine: Sparse,
    k: usize,
) -> Result<Sparse> {
    let (p, r) = (comm.size(), comm.rank());
    if p == 1 {
        return Ok(mine);
    }
    let pp = 1usize << (usize::BITS - 1 - p.leading_zeros());
    let mut cur = mine;
    {
        let _ph = comm.phase("reduce_tree");
        let mut active = true;
        if r >= pp {
            exchange_sparse(comm, vec![(r - pp, std::mem::take(&mut cur))], &[])?;
            active = false;
        } else if r + pp < p {
            let got = exchange_sparse(comm, vec![], &[r + pp])?
                .pop()
                .context("one message")?;
            cur = topk_sparse(kern, &sum_sparse(&[cur, got]), k);
        }
        let mut half = 1;
        while active && half < pp {
            if r % (2 * half) == 0 {
                let got = exchange_sparse(comm, vec![], &[r + half])?
                    .pop()
                    .context("one message")?;
                cur = topk_sparse(kern, &sum_sparse(&[cur, got]), k);
            } else {
                exchange_sparse(comm, vec![(r - half, std::mem::take(&mut cur))], &[])?;
                active = false;
            }
            half *= 2;
        }
    }
    let _ph = comm.phase("broadcast");
    let root = r == 0;
    let indices = comm.broadcast(0, root.then(|| std::mem::take(&mut cur.indices)))?;
    let values = comm.broadcast(0, root.then(|| std::mem::take(&mut cur.values)))?;
    Ok(Sparse { indices, values })
}

/// gTopk's formula (Ok-Topk Table 1): a reduction tree and a broadcast tree of k-COO:
/// 4k log P words, 2 log P α.
pub fn cost(p: usize, k: f64) -> Cost {
    Cost {
        latency: 2.0 * log2p(p),
        words: 4.0 * k * log2p(p),
    }
}

/// `--algo gtopk`.
pub const DESCRIPTOR: crate::algo::Descriptor = {
    use crate::algo::{Descriptor, Family, Knob};
    Descriptor {
        name: "gtopk",
        family: Family::Sparse,
        paper: "Ok-Topk Table 1 (gTopk: Shi et al. 2019)",
        description: "gTop-k reduction tree keeping top-k per level, then broadcast",
        reads: &[Knob::Op],
        dense_input_only: false,
        cost: Some(|p, _, k| cost(p, k)),
        // Table 1's two trees, half of the formula each.
        phases: Some(|p, _, k| {
            let half = Cost {
                latency: log2p(p),
                words: 2.0 * k * log2p(p),
            };
            vec![("reduce_tree", half), ("broadcast", half)]
        }),
        exchange: crate::algo::AsExchange::new("gTop-k reduction tree keeping top-k per level"),
        ..Descriptor::base(|params| Ok(Box::new(GTopk::new(params)?)))
    }
};

/// `--algo gtopk`. Dense input: exact local top-k with error feedback; the residual keeps
/// every locally selected entry that the tree dropped.
pub struct GTopk {
    params: Params,
    fb: Feedback,
}

impl GTopk {
    pub fn new(params: &Params) -> Result<Self> {
        Ok(GTopk {
            params: params.clone(),
            fb: Feedback::new(params.residual, gradkit_sparsify::Leaves::SentInResult)
                .on(params.resident),
        })
    }
}

impl Reducer for GTopk {
    fn name(&self) -> &'static str {
        "gtopk"
    }
    super::feedback_state!("gtopk");
    fn reduce(
        &mut self,
        comm: &dyn Comm,
        _step: u32,
        layout: &Layout,
        input: Flat,
    ) -> Result<StepOutput> {
        let k = k_of(&self.params, layout.total() as usize);
        super::select_and_exchange(
            &mut self.fb,
            &self.params,
            "gtopk",
            comm,
            layout,
            input,
            super::Local::Topk,
            |comm, sel, _, _| tree_allreduce(comm, self.params.kernels, sel, k),
        )
    }
}
