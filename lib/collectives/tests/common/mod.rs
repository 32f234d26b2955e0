//! Helpers shared by the sparse-allreduce tests: a tiny deterministic generator whose values
//! are small dyadic numbers (sums of a few are exact in f32), a two-layer layout, random
//! sparse vectors and the sparse result of a step.

#![allow(dead_code)] // each test file uses its own subset

use std::collections::BTreeMap;

use gradkit_collectives::registry::Params;
use gradkit_collectives::{make_reducer, Flat, StepOutput};
use gradkit_comm::{run_local, PhaseCounts};
use gradkit_core::trace::{Layout, Sparse};

/// gradkit-testkit's seeded generator, as xorshift64* from `seed·φ | 1` (the stream these
/// tests' fixed expectations were written for).
pub struct Rng(gradkit_testkit::rng::Rng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(gradkit_testkit::rng::Rng::xorshift64star(
            seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        ))
    }
    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.below(n)
    }
    /// A non-zero dyadic value k/16, |k| ≤ 512.
    pub fn val(&mut self) -> f32 {
        let k = self.below(1024) as i64 - 512;
        (if k >= 0 { k + 1 } else { k }) as f32 / 16.0
    }
}

/// Two layers, the first `n / split` long, so the flat index space spans a layer boundary.
pub fn layout(n: u64, split: u64) -> Layout {
    let a = n / split;
    Layout::new(vec![(0, "a".into(), a, None), (1, "b".into(), n - a, None)])
}

/// A random sparse vector with about `m` entries in [0, n).
pub fn rand_sparse(rng: &mut Rng, n: u64, m: usize) -> Sparse {
    let mut idx: Vec<u32> = (0..m).map(|_| rng.below(n) as u32).collect();
    idx.sort_unstable();
    idx.dedup();
    let values = idx.iter().map(|_| rng.val()).collect();
    Sparse {
        indices: idx,
        values,
    }
}

/// The sparse result of a step.
pub fn res(o: &StepOutput) -> &Sparse {
    match &o.result {
        Flat::Sparse(s) => s,
        Flat::Dense(_) => panic!("sparse result expected"),
    }
}

/// Per rank, per step: the output, the traffic per phase and the reducer's residual after it.
pub type Out = Vec<Vec<(StepOutput, BTreeMap<String, PhaseCounts>, Vec<f32>)>>;

/// Runs `algo` on P in-process ranks over `g[step][rank]` (dense input), one long-lived
/// reducer per rank, recording each step's output, traffic and residual (its only state).
pub fn run_steps(algo: &str, p: usize, params: &Params, lay: &Layout, g: &[Vec<Vec<f32>>]) -> Out {
    run_local(p, |comm| {
        let mut red = make_reducer(algo, params)?;
        let mut v = Vec::new();
        for (t, gt) in g.iter().enumerate() {
            comm.traffic().reset();
            let o = red.reduce(comm, t as u32, lay, Flat::Dense(gt[comm.rank()].clone()))?;
            let tr = comm.traffic().snapshot();
            let residual = match red.state().as_slice() {
                [] => Vec::new(),
                [(name, v)] if name == "residual" => v.clone(),
                other => panic!("unexpected state {:?}", other.iter().map(|s| &s.0)),
            };
            v.push((o, tr, residual));
        }
        Ok(v)
    })
    .unwrap()
}

/// Exact top-k by |x| by sorting: larger magnitude first, the lower index among equals;
/// returned ascending.
pub fn topk_by_sorting(x: &[f32], k: usize) -> Vec<u32> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[b].abs().partial_cmp(&x[a].abs()).unwrap().then(a.cmp(&b)));
    let mut top: Vec<u32> = order[..k.min(x.len())].iter().map(|&i| i as u32).collect();
    top.sort_unstable();
    top
}

/// Ring allreduce of m f32 (chunks cut at ⌊i·m/P⌋), bytes (sent, received) by rank r:
/// reduce-scatter sends every chunk but c_{r+1} and receives every chunk but c_r; allgather
/// sends every chunk but c_{r+2} and receives every chunk but c_{r+1}.
pub fn ring_bytes(p: usize, m: usize, r: usize) -> (u64, u64) {
    if p == 1 {
        return (0, 0);
    }
    let c = |i: usize| ((i % p) + 1) * m / p - (i % p) * m / p;
    let sent = 2 * m - c(r + 1) - c(r + 2);
    let recv = 2 * m - c(r) - c(r + 1);
    (4 * sent as u64, 4 * recv as u64)
}

/// The error-feedback residual of a sparse reducer's `Reducer::state` (empty when it keeps
/// none). Ok-Topk's state also holds what Algorithm 1 carries between calls (`oktopk.*`);
/// any other entry is a failure.
pub fn residual_of(state: &[(String, Vec<f32>)]) -> Vec<f32> {
    let rest: Vec<_> = state
        .iter()
        .filter(|s| !s.0.starts_with("oktopk."))
        .collect();
    match rest[..] {
        [] => Vec::new(),
        [(name, v)] if name == "residual" => v.clone(),
        ref other => panic!(
            "unexpected state {:?}",
            other.iter().map(|s| &s.0).collect::<Vec<_>>()
        ),
    }
}
