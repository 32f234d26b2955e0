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
    /// every sent entry (TopkA, TopkDSA, Gaussiank): a sum that cancels to 0 was still sent.
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

    /// Adds the gradient in place of a copy: `g` becomes `acc = residual + g`.
    pub fn compensate(&self, g: &mut [f32]) {
        assert_eq!(g.len(), self.values.len(), "gradient and residual lengths");
        add_par(g, &self.values);
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
    /// holds one model-sized vector, not two, while it selects and exchanges (issue 19). `g`
    /// itself while the residual is empty.
    pub fn absorb(&mut self, g: Vec<f32>) -> Vec<f32> {
        if self.values.is_empty() {
            return g;
        }
        assert_eq!(g.len(), self.values.len(), "gradient and residual lengths");
        let mut acc = std::mem::take(&mut self.values);
        add_par(&mut acc, &g);
        acc
    }

    /// `residual = acc` with `selected` set to zero; takes `acc` by value (no copy).
    pub fn update(&mut self, acc: Vec<f32>, selected: &[u32]) {
        self.settle(acc, Leaves::Sent, selected, &[]);
    }

    /// After an exchange: `residual = acc` with the entries `rule` names set to zero. `sent`
    /// (this rank's selection) and `result` (the result's support) are ascending flat indices.
    pub fn settle(&mut self, mut acc: Vec<f32>, rule: Leaves, sent: &[u32], result: &[u32]) {
        let mut zero = |i: u32| acc[i as usize] = 0.0;
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
    }

    /// The L2 norm (f64 accumulation, eight lanes per chunk: one dependent add chain per lane
    /// instead of one per chunk, issue 19). The chunks' sums are added in chunk order, so the
    /// bits do not depend on how the threads split the work (the `residual_norm` metric is the
    /// same from run to run).
    pub fn norm(&self) -> f64 {
        let parts: Vec<f64> = self
            .values
            .par_chunks(crate::topk::CHUNK)
            .map(|c| {
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
            })
            .collect();
        parts.iter().sum::<f64>().sqrt()
    }
}

/// `dst += src`, element by element, on all cores ([`crate::topk::CHUNK`]s): the one
/// accumulation of error feedback ([`Residual::compensate`], [`Residual::absorb`]).
fn add_par(dst: &mut [f32], src: &[f32]) {
    dst.par_chunks_mut(crate::topk::CHUNK)
        .zip(src.par_chunks(crate::topk::CHUNK))
        .for_each(|(a, b)| {
            for (x, y) in a.iter_mut().zip(b) {
                *x += *y;
            }
        });
}
