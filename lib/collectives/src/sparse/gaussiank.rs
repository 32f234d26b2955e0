//! Gaussiank (Shi et al. 2019; Ok-Topk §4 baseline): selection by a threshold from a Gaussian
//! fit of the accumulator, then TopkA's communication (allgatherv of COO, sum).
//!
//! Threshold (dense input): mean μ and standard deviation σ of `acc` (f64), then
//! `th = |μ| + σ·Φ⁻¹(1 − d/2)` with d = k/n (the two-sided tail holding a fraction d of a
//! normal distribution); as Ok-Topk's evaluation does for fairness, th is lowered (×0.9 per
//! round, at most 64 rounds, then 0) until at least ⌈3k/4⌉ entries pass `|acc| > th`.
//! Sparse input is taken as the selection (`gradselect --method gaussiank`) and only the
//! communication runs.

use anyhow::Result;
use gradkit_comm::Comm;
use gradkit_core::trace::Layout;
use gradkit_sparsify::threshold;

use super::topka::allgather_sum;
use super::{k_of, output, Feedback};
use crate::{Flat, Params, Reducer, StepOutput};

/// Φ⁻¹(p) for 0 < p < 1 (Acklam's rational approximation, relative error < 1.2e-9).
#[allow(clippy::excessive_precision)]
pub fn norm_ppf(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.383577518672690e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e1,
        1.615858368580409e2,
        -1.556989798598866e2,
        6.680131188771972e1,
        -1.328068155288572e1,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [
        7.784695709041462e-3,
        3.224671290700398e-1,
        2.445134137142996,
        3.754408661907416,
    ];
    let p = p.clamp(1e-300, 1.0 - 1e-16);
    let pl = 0.02425;
    if p < pl {
        let q = (-2.0 * p.ln()).sqrt();
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    } else if p <= 1.0 - pl {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        -norm_ppf(1.0 - p)
    }
}

/// Gaussiank's threshold for `acc` and target k (see the module docs).
pub fn gaussian_threshold(acc: &[f32], k: usize) -> f32 {
    let n = acc.len();
    if n == 0 || k == 0 {
        return f32::INFINITY;
    }
    if k >= n {
        return 0.0;
    }
    let mean = acc.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    let var = acc.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
    let d = k as f64 / n as f64;
    let mut th = (mean.abs() + var.sqrt() * norm_ppf(1.0 - d / 2.0)) as f32;
    let need = (3 * k).div_ceil(4);
    for _ in 0..64 {
        if acc.iter().filter(|v| v.abs() > th).count() >= need {
            return th;
        }
        th *= 0.9;
    }
    0.0
}

/// `--algo gaussiank`.
pub struct GaussianK {
    params: Params,
    fb: Feedback,
}

impl GaussianK {
    pub fn new(params: &Params) -> Result<Self> {
        Ok(GaussianK {
            params: params.clone(),
            fb: Feedback::new(params.residual),
        })
    }
}

impl Reducer for GaussianK {
    fn name(&self) -> &'static str {
        "gaussiank"
    }
    fn reduce(
        &mut self,
        comm: &dyn Comm,
        _step: u32,
        layout: &Layout,
        input: Flat,
    ) -> Result<StepOutput> {
        let n = self.fb.check("gaussiank", layout, &input)?;
        let k = k_of(&self.params, n);
        let mut metrics = Vec::new();
        let (sel, acc) = self.fb.local_selection(input, &mut metrics, |acc| {
            let th = gaussian_threshold(acc, k);
            (threshold::above(acc, th), Some(th))
        });
        let contributed = acc.as_ref().map(|_| sel.indices.clone());
        let res = allgather_sum(comm, sel);
        if let (Some(acc), Some(c)) = (acc, &contributed) {
            self.fb.update(acc, c);
        }
        Ok(output(comm, self.params.op, res, k, contributed, metrics))
    }
}
