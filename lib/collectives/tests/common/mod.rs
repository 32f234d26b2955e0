//! Helpers shared by the sparse-allreduce tests: a tiny deterministic generator whose values
//! are small dyadic numbers (sums of a few are exact in f32), a two-layer layout, random
//! sparse vectors and the sparse result of a step.

#![allow(dead_code)] // each test file uses its own subset

use gradkit_collectives::{Flat, StepOutput};
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
