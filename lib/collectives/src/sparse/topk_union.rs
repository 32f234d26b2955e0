//! The paper's Top-k exchange, "Top-k (union)": the baseline DEFT compares with (Yoon & Oh,
//! ICPP'23, Algorithm 1 with Top-k as `Sparsify`; deft.md §1.0). Per step, on every rank i:
//! 1. `acc_i = residual_i + g_i` (error feedback);
//! 2. `idx_i` = the exact top-k of `acc_i` by magnitude (exactly min(k, n) entries, ties to
//!    the lower index, as gradselect's `--method topk`);
//! 3. `idx = AllGather(idx_i)` (ring allgatherv of the `u32` indices; `allgather_indices`),
//!    and its union, ascending;
//! 4. every rank's `acc_i` at the whole union is summed by the ring allreduce
//!    (`allreduce_values`), so every rank gets the same bits;
//! 5. every rank zeroes the union in its accumulator (`Leaves::Result`): the rest is its
//!    new residual.
//!
//! Result: `Σ_i acc_i` at `∪_i idx_i` (divided by P for `Op::Mean`); its support is between k
//! and min(Pk, n) entries (DEFT's "gradient build-up", deft.md §5.2). Unlike TopkA
//! (`--algo topka`), which sends each rank's own (index, value) pairs and leaves the values a
//! rank did not select in its residual, every rank here contributes at every union index.
//!
//! Traffic per rank and step: the allgatherv sends 4k(P−1) bytes in P−1 messages; the ring
//! allreduce of the u = |∪ idx_i| values sends `gradkit_cost::ring_bytes_sent(P, u, r)` bytes in
//! 2(P−1) messages ([`bytes_sent`]).
//!
//! Needs dense input: every rank sends its values at indices other ranks selected, which a
//! sparse selection does not have.

use std::time::Instant;

use anyhow::Result;
use gradkit_comm::{Comm, CommExt};
use gradkit_core::trace::{Layout, Sparse};
use gradkit_cost::{pf, Cost};

use super::{allreduce_at, allreduce_at_acc, k_of, output, secs, Acc, Feedback};
use crate::{Flat, Params, Reducer, StepOutput};

/// The Top-k (union) exchange of one step given this rank's selection `sel` (ascending, from
/// `acc`): allgather of the indices, their union, every rank's `acc` summed there.
pub fn exchange(comm: &dyn Comm, acc: &[f32], sel: Vec<u32>) -> Result<Sparse> {
    let mut union: Vec<u32> = {
        let _ph = comm.phase("allgather_indices");
        comm.allgatherv(sel)?.concat()
    };
    union.sort_unstable();
    union.dedup();
    allreduce_at(comm, "topk-union", "the gathered indices", acc, union)
}

/// [`exchange`] with the accumulator where it lives.
fn exchange_acc(comm: &dyn Comm, acc: &Acc, sel: Vec<u32>) -> Result<Sparse> {
    let mut union: Vec<u32> = {
        let _ph = comm.phase("allgather_indices");
        comm.allgatherv(sel)?.concat()
    };
    union.sort_unstable();
    union.dedup();
    allreduce_at_acc(comm, "topk-union", "the gathered indices", acc, union)
}

/// Top-k (union)'s formula (DEFT Algorithm 1 with Top-k as `Sparsify`; deft.md §1.0) with a
/// union of `u` indices (k ≤ u ≤ min(Pk, n)): the ring allgatherv of every rank's k `u32`
/// indices (P−1 messages, k(P−1) words) then the ring allreduce of the u `f32` values (2(P−1)
/// messages, 2u(P−1)/P words): 3(P−1) α, k(P−1) + 2u(P−1)/P words. Exact per rank when P
/// divides u; [`bytes_sent`] is exact for every rank.
pub fn cost(p: usize, k: f64, u: f64) -> Cost {
    if p <= 1 {
        return Cost {
            latency: 0.0,
            words: 0.0,
        };
    }
    Cost {
        latency: 3.0 * (pf(p) - 1.0),
        words: k * (pf(p) - 1.0) + 2.0 * u * (pf(p) - 1.0) / pf(p),
    }
}

/// Exact bytes rank `r` sends when every rank selects k entries and their union has u:
/// 4k(P−1) for the allgatherv plus `gradkit_cost::ring_bytes_sent(P, u, r)`.
pub fn bytes_sent(p: usize, k: usize, u: usize, r: usize) -> u64 {
    if p <= 1 {
        return 0;
    }
    4 * (k as u64) * (p as u64 - 1) + gradkit_cost::ring_bytes_sent(p, u, r)
}

/// `--algo topk-union`.
/// The formula is the best case: the ranks' top-k coincide (a union of k); the worst is
/// min(Pk, n).
pub const DESCRIPTOR: crate::algo::Descriptor = {
    use crate::algo::{Descriptor, Family, Knob};
    Descriptor {
        name: "topk-union",
        family: Family::Sparse,
        paper: "DEFT Algorithm 1 with Top-k (deft.md §1.0)",
        description: "Top-k (union): every rank's top-k indices allgathered, all ranks' values at the union allreduced",
        reads: &[Knob::Op],
        dense_input_only: true,
        cost: Some(|p, _, k| cost(p, k, k)),
        exchange: crate::algo::AsExchange::new("Top-k (union): every rank's top-k indices allgathered, all ranks' values at the union allreduced, the union zeroed in every residual"),
        ..Descriptor::base(|params| Ok(Box::new(TopkUnion::new(params)?)))
    }
};

/// `--algo topk-union`. Reads `k`/`density`, `residual`, `kernels`, `op`.
pub struct TopkUnion {
    params: Params,
    fb: Feedback,
}

impl TopkUnion {
    pub fn new(params: &Params) -> Result<Self> {
        Ok(TopkUnion {
            params: params.clone(),
            fb: Feedback::new(params.residual, gradkit_sparsify::Leaves::Result)
                .on(params.resident),
        })
    }
}

impl Reducer for TopkUnion {
    fn name(&self) -> &'static str {
        "topk-union"
    }
    super::feedback_state!("topk-union");
    fn reduce(
        &mut self,
        comm: &dyn Comm,
        _step: u32,
        layout: &Layout,
        input: Flat,
    ) -> Result<StepOutput> {
        let (n, g) = self.fb.check_dense(
            "topk-union",
            layout,
            input,
            "every rank sends its accumulator values at the union of all ranks' top-k indices",
        )?;
        let k = k_of(&self.params, n);
        let t = Instant::now();
        let acc = self.fb.accumulate_acc(g);
        let t_topk = Instant::now();
        let sel = acc.select_in_ranges(self.params.kernels, &[(0..n, k)]);
        let time_topk = secs(t_topk);
        let mut metrics = vec![
            ("time_select_s".to_string(), secs(t)),
            ("time_topk_s".to_string(), time_topk),
            ("local_nnz".to_string(), sel.len() as f64),
        ];
        let res = exchange_acc(comm, &acc, sel.clone())?;
        if let Some(norm) = self.fb.settle_acc(acc, &sel, &res.indices) {
            metrics.push(("residual_norm".into(), norm));
        }
        Ok(output(comm, self.params.op, res, k, Some(sel), metrics))
    }
}
