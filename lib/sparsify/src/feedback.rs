//! Error feedback (Alistarh et al. 2018; Ok-Topk Alg. 2; DEFT Alg. 1): per rank, steps in
//! order, `acc_t = residual_{t−1} + g_t`, select from `acc_t`, send the selected `acc_t`
//! values, and keep `residual_t = acc_t` with the entries that left set to zero.
//!
//! This is the one implementation: `gradselect` (selection alone), every sparse reducer of
//! gradkit-collectives (`gradallreduce` on dense input) and `gradtrain`'s sparse exchanges
//! (which run those same reducers) all keep a [`Residual`] and settle it with the
//! [`Leaves`] rule of their exchange.

use rayon::prelude::*;

/// Which entries of the accumulator leave the residual after a step: Ok-Topk Algorithm 2
/// (lines 6–8: `ε = acc − acc(local ∩ global)`) and its per-exchange readings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leaves {
    /// Every entry this rank sent: selection alone (gradselect), and the exchanges that sum
    /// every sent entry (the allgather baselines of Ok-Topk's Table 1): a sum that cancels to
    /// 0 was still sent.
    Sent,
    /// The sent entries that are in the result's support: exchanges that drop entries on the
    /// way (gTopk's per-level top-k, Ok-Topk's global threshold).
    SentInResult,
    /// Every entry in the result's support, sent or not: each rank sends its values at all
    /// gathered indices (DEFT Algorithm 1, §3.5).
    Result,
}

/// The residual of one rank (the error-feedback memory). Empty until the first step: an
/// empty residual is zero.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Residual {
    pub values: Vec<f32>,
}

impl Residual {
    /// A zero residual of length n.
    pub fn zeros(n: usize) -> Self {
        Residual {
            values: vec![0.0; n],
        }
    }

    /// Adds the gradient in place of a copy: `g` becomes `acc = residual + g`. Returns
    /// `Σ acc²` (f64, summed as [`Residual::norm`] sums), for [`Residual::settle_norm`].
    pub fn compensate(&self, g: &mut [f32]) -> f64 {
        assert_eq!(g.len(), self.values.len(), "gradient and residual lengths");
        add_squared(g, &self.values)
    }

    /// `acc = residual + g` (`g` itself while the residual is empty), reusing `g`'s buffer.
    pub fn accumulate(&self, mut g: Vec<f32>) -> Vec<f32> {
        if !self.values.is_empty() {
            self.compensate(&mut g);
        }
        g
    }

    /// `acc = residual + g` built in the residual's own buffer (the same bits as
    /// [`Residual::accumulate`]: IEEE addition is commutative); `g` is freed at once and the
    /// residual is left empty until [`Residual::settle`] puts the new one back, so a rank
    /// holds one model-sized vector, not two, while it selects and exchanges (docs/MEMORY.md). `g`
    /// itself while the residual is empty.
    pub fn absorb(&mut self, g: Vec<f32>) -> Vec<f32> {
        self.absorb_squared(g).0
    }

    /// [`Residual::absorb`], and `Σ acc²` summed in the same pass (a separate pass while the
    /// residual is empty), for [`Residual::settle_norm`].
    pub fn absorb_squared(&mut self, g: Vec<f32>) -> (Vec<f32>, f64) {
        if self.values.is_empty() {
            let sq = sum_squares(&g);
            return (g, sq);
        }
        assert_eq!(g.len(), self.values.len(), "gradient and residual lengths");
        let mut acc = std::mem::take(&mut self.values);
        let sq = add_squared(&mut acc, &g);
        (acc, sq)
    }

    /// `residual = acc` with `selected` set to zero; takes `acc` by value (no copy).
    pub fn update(&mut self, acc: Vec<f32>, selected: &[u32]) {
        self.settle(acc, Leaves::Sent, selected, &[]);
    }

    /// After an exchange: `residual = acc` with the entries `rule` names set to zero. `sent`
    /// (this rank's selection) and `result` (the result's support) are ascending flat indices.
    pub fn settle(&mut self, acc: Vec<f32>, rule: Leaves, sent: &[u32], result: &[u32]) {
        self.zero_leaving(acc, rule, sent, result);
    }

    /// [`Residual::settle`], returning the new residual's L2 norm without a pass over it:
    /// `acc_sq` is `Σ acc²` from the accumulation ([`Residual::compensate`],
    /// [`Residual::absorb_squared`]), less the squares of the entries that leave (summed in
    /// index order while they are zeroed). docs/MEMORY.md: the separate norm pass was a fifth of a
    /// dense Ok-Topk step. Where the entries that leave hold all but 1/1024 of `Σ acc²`
    /// (the difference would lose digits), or a sum is not finite, the norm is summed over
    /// the residual as [`Residual::norm`] does.
    pub fn settle_norm(
        &mut self,
        acc: Vec<f32>,
        rule: Leaves,
        sent: &[u32],
        result: &[u32],
        acc_sq: f64,
    ) -> f64 {
        let left = self.zero_leaving(acc, rule, sent, result);
        norm_after(acc_sq, left, || sum_squares(&self.values))
    }

    /// Zeroes the entries `rule` names, keeps `acc` as the residual, and returns the sum of
    /// the zeroed entries' squares (f64, in index order).
    fn zero_leaving(
        &mut self,
        mut acc: Vec<f32>,
        rule: Leaves,
        sent: &[u32],
        result: &[u32],
    ) -> f64 {
        let mut left = 0f64;
        let mut zero = |i: u32| {
            let v = std::mem::take(&mut acc[i as usize]) as f64;
            left += v * v;
        };
        match rule {
            Leaves::Sent => sent.iter().for_each(|&i| zero(i)),
            Leaves::Result => result.iter().for_each(|&i| zero(i)),
            Leaves::SentInResult => {
                let mut r = result.iter().peekable();
                for &i in sent {
                    while r.next_if(|&&j| j < i).is_some() {}
                    if r.peek() == Some(&&i) {
                        zero(i);
                    }
                }
            }
        }
        self.values = acc;
        left
    }

    /// The L2 norm (f64 accumulation, eight lanes per chunk: one dependent add chain per lane
    /// instead of one per chunk, docs/MEMORY.md). The chunks' sums are added in chunk order, so the
    /// bits do not depend on how the threads split the work (the `residual_norm` metric is the
    /// same from run to run).
    pub fn norm(&self) -> f64 {
        sum_squares(&self.values).sqrt()
    }
}

/// `Σ v²` of one chunk in eight f64 lanes (one dependent add chain per lane), lanes then
/// tail added in a fixed order.
fn chunk_squares(c: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the function only needs AVX2, which this CPU was just checked to have.
        return unsafe { avx2::chunk_squares(c) };
    }
    chunk_squares_body(c)
}

/// `a += b`, then [`chunk_squares`] of `a` while it is in cache.
fn add_chunk(a: &mut [f32], b: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the function only needs AVX2, which this CPU was just checked to have.
        return unsafe { avx2::add_chunk(a, b) };
    }
    add_chunk_body(a, b)
}

#[inline(always)]
fn chunk_squares_body(c: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let mut blocks = c.chunks_exact(8);
    for b in &mut blocks {
        for (l, &v) in lanes.iter_mut().zip(b) {
            *l += v as f64 * v as f64;
        }
    }
    let tail: f64 = blocks
        .remainder()
        .iter()
        .map(|&v| v as f64 * v as f64)
        .sum();
    lanes.iter().sum::<f64>() + tail
}

#[inline(always)]
fn add_chunk_body(a: &mut [f32], b: &[f32]) -> f64 {
    for (x, y) in a.iter_mut().zip(b) {
        *x += *y;
    }
    chunk_squares_body(a)
}

/// The chunk kernels compiled for AVX2, chosen at run time on x86-64 CPUs that have it (as
/// the 1-bit kernels are): the same f32/f64 operations in the same order as the baseline
/// (SSE2) build, so the same bits; four f64 lanes per instruction instead of two for the
/// squares.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    #[target_feature(enable = "avx2")]
    pub(super) fn chunk_squares(c: &[f32]) -> f64 {
        super::chunk_squares_body(c)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn add_chunk(a: &mut [f32], b: &[f32]) -> f64 {
        super::add_chunk_body(a, b)
    }
}

/// The norm of what remains after entries whose squares sum to `left` leave a vector whose
/// squares sum to `acc_sq`: `√(acc_sq − left)`, or `√full()` summed over what remains where
/// the difference would lose digits (the rest below 1/1024 of `acc_sq`) or a sum is not
/// finite ([`Residual::settle_norm`], and the device seam's `resident::settle`).
pub fn norm_after(acc_sq: f64, left: f64, full: impl FnOnce() -> f64) -> f64 {
    let rest = acc_sq - left;
    if acc_sq.is_finite() && left.is_finite() && rest >= acc_sq / 1024.0 {
        rest.sqrt()
    } else {
        full().sqrt()
    }
}

/// `Σ v²` on all cores, the chunks' sums added in chunk order: the same bits on any number
/// of threads.
pub fn sum_squares(x: &[f32]) -> f64 {
    let parts: Vec<f64> = x
        .par_chunks(crate::topk::CHUNK)
        .map(chunk_squares)
        .collect();
    parts.iter().sum()
}

/// `dst += src`, element by element, on all cores ([`crate::topk::CHUNK`]s): the one
/// accumulation of error feedback ([`Residual::compensate`], [`Residual::absorb`]). Returns
/// `Σ dst²` after the addition, summed as [`sum_squares`] sums (each chunk's sum taken while
/// the chunk is in cache).
pub fn add_squared(dst: &mut [f32], src: &[f32]) -> f64 {
    let parts: Vec<f64> = dst
        .par_chunks_mut(crate::topk::CHUNK)
        .zip(src.par_chunks(crate::topk::CHUNK))
        .map(|(a, b)| add_chunk(a, b))
        .collect();
    parts.iter().sum()
}
