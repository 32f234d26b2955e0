//! Gaussiank (Shi et al. 2019, "Understanding top-k sparsification…", as the Ok-Topk paper
//! runs it, §2 Table 1 and §4 "Baselines"): fit a Gaussian (mean, std) to the accumulator,
//! take the threshold at the density's two-sided quantile, and lower it until at least 3k/4
//! entries pass (Ok-Topk's fairness rule for this baseline).

use rayon::prelude::*;

use crate::threshold;

/// Mean and (population) standard deviation, accumulated in f64 per chunk.
pub fn mean_std(x: &[f32]) -> (f64, f64) {
    if x.is_empty() {
        return (0.0, 0.0);
    }
    let (s, s2) = x
        .par_chunks(crate::topk::CHUNK)
        .map(|c| {
            let mut a = [0.0f64; 8];
            let mut b = [0.0f64; 8];
            let mut it = c.chunks_exact(8);
            for q in &mut it {
                for j in 0..8 {
                    let v = q[j] as f64;
                    a[j] += v;
                    b[j] += v * v;
                }
            }
            let (mut s, mut s2) = (a.iter().sum::<f64>(), b.iter().sum::<f64>());
            for &v in it.remainder() {
                s += v as f64;
                s2 += v as f64 * v as f64;
            }
            (s, s2)
        })
        .reduce(|| (0.0, 0.0), |p, q| (p.0 + q.0, p.1 + q.1));
    let n = x.len() as f64;
    let mean = s / n;
    (mean, (s2 / n - mean * mean).max(0.0).sqrt())
}

/// The standard normal quantile function Φ⁻¹(p) (Acklam's rational approximation, relative
/// error < 1.2e-9), for 0 < p < 1.
pub fn norm_ppf(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e+01,
        2.209460984245205e+02,
        -2.759285104469687e+02,
        1.383_577_518_672_69e+02,
        -3.066479806614716e+01,
        2.506628277459239e+00,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e+01,
        1.615858368580409e+02,
        -1.556989798598866e+02,
        6.680131188771972e+01,
        -1.328068155288572e+01,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-03,
        -3.223964580411365e-01,
        -2.400758277161838e+00,
        -2.549671010264337e+00,
        4.374664141464968e+00,
        2.938163982698783e+00,
    ];
    const D: [f64; 4] = [
        7.784695709041462e-03,
        3.224671290700398e-01,
        2.445134137142996e+00,
        3.754408661907416e+00,
    ];
    let p = p.clamp(1e-300, 1.0 - 1e-16);
    let lo = 0.02425;
    if p < lo {
        let q = (-2.0 * p.ln()).sqrt();
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    } else if p <= 1.0 - lo {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        -norm_ppf(1.0 - p)
    }
}

/// The Gaussian-fit threshold for keeping a fraction `density` of the entries by |x|:
/// `|mean| + Φ⁻¹(1 − density/2)·std`.
pub fn fit_threshold(x: &[f32], density: f64) -> f32 {
    let (mean, std) = mean_std(x);
    let z = norm_ppf(1.0 - density.clamp(1e-12, 1.0) / 2.0);
    (mean.abs() + z * std) as f32
}

/// Halving steps tried before falling back to `th = 0` (every non-zero entry passes).
const MAX_LOWER: u32 = 64;

/// Gaussiank's selection of about k entries: `{i : |x_i| > th}` and the threshold th, which is
/// the Gaussian fit halved until at least ⌈3k/4⌉ entries pass.
pub fn select(x: &[f32], k: usize) -> (Vec<u32>, f32) {
    let n = x.len();
    if n == 0 || k == 0 {
        return (Vec::new(), f32::INFINITY);
    }
    let need = (3 * k).div_ceil(4);
    let mut th = fit_threshold(x, k as f64 / n as f64);
    if !th.is_finite() {
        th = f32::MAX;
    }
    let mut idx = threshold::above(x, th);
    if idx.len() < need && th > 0.0 {
        // One pass finds how many halvings are needed; the selection below stays exact.
        let j = halvings_needed(x, th, need);
        let mut t = th;
        for _ in 0..j {
            t *= 0.5;
        }
        if j > 0 && t > 0.0 {
            let cand = threshold::above(x, t);
            if cand.len() >= need {
                return (cand, t);
            }
        }
    }
    let mut tries = 0;
    while idx.len() < need && th > 0.0 {
        tries += 1;
        th = if tries >= MAX_LOWER { 0.0 } else { th * 0.5 };
        if threshold::count_above(x, th) >= need || th == 0.0 {
            idx = threshold::above(x, th);
        }
    }
    (idx, th)
}

/// The smallest j with at least `need` entries above th·2^-j, from one pass that puts every
/// entry in the bucket of the first halving it passes (exponent and mantissa comparison; an
/// estimate for subnormals, which the caller's exact selection checks).
fn halvings_needed(x: &[f32], th: f32, need: usize) -> u32 {
    const B: usize = 66;
    let tb = th.to_bits() & 0x7fff_ffff;
    let (te, tm) = ((tb >> 23) as i32, tb & 0x7f_ffff);
    let hist = x
        .par_chunks(crate::topk::CHUNK)
        .map(|c| {
            let mut h = [0u64; B];
            for v in c {
                let b = v.to_bits() & 0x7fff_ffff;
                let bucket = if b == 0 {
                    B - 1
                } else {
                    let e = te - (b >> 23) as i32 + i32::from(b & 0x7f_ffff <= tm);
                    e.clamp(0, B as i32 - 2) as usize
                };
                h[bucket] += 1;
            }
            h
        })
        .reduce(
            || [0u64; B],
            |mut a, b| {
                for (p, q) in a.iter_mut().zip(b) {
                    *p += q;
                }
                a
            },
        );
    let mut c = 0u64;
    for (j, h) in hist.iter().enumerate().take(B - 1) {
        c += h;
        if c >= need as u64 {
            return j as u32;
        }
    }
    (B - 2) as u32
}
