//! Gaussiank (Shi et al. 2019, "Understanding top-k sparsification…", as the Ok-Topk paper
//! runs it, §2 Table 1 and §4 "Baselines"): fit a Gaussian (mean, std) to the accumulator,
//! take the threshold at the density's two-sided quantile, and lower it until at least 3k/4
//! entries pass (Ok-Topk's fairness rule for this baseline).

use rayon::prelude::*;

use crate::threshold;

/// Mean and (population) standard deviation, accumulated in f64 (8 lanes per chunk of
/// [`threshold::CHUNK`], chunks summed in order: the result does not depend on the threads).
pub fn mean_std(x: &[f32]) -> (f64, f64) {
    let parts: Vec<(f64, f64)> = if x.len() < 2 * threshold::CHUNK {
        vec![chunk_sums(x)]
    } else {
        x.par_chunks(threshold::CHUNK).map(chunk_sums).collect()
    };
    finish_moments(x.len(), &parts)
}

/// Σx and Σx² of one chunk.
fn chunk_sums(c: &[f32]) -> (f64, f64) {
    let mut m = Moments::default();
    m.add(c);
    m.finish()
}

fn finish_moments(n: usize, parts: &[(f64, f64)]) -> (f64, f64) {
    if n == 0 {
        return (0.0, 0.0);
    }
    let (mut s, mut s2) = (0.0f64, 0.0f64);
    for &(a, b) in parts {
        s += a;
        s2 += b;
    }
    let n = n as f64;
    let mean = s / n;
    (mean, (s2 / n - mean * mean).max(0.0).sqrt())
}

/// Σx and Σx² in 8 f64 lanes; segments fed in order give the same sums as one whole slice
/// as long as every segment but the last has a length that is a multiple of 8.
#[derive(Default)]
struct Moments {
    a: [f64; 8],
    b: [f64; 8],
    ts: f64,
    ts2: f64,
}

impl Moments {
    // Not inlined: LLVM vectorises the lane loop reliably only in a small function.
    #[inline(never)]
    fn add(&mut self, c: &[f32]) {
        let (mut a, mut b) = (self.a, self.b);
        let mut it = c.chunks_exact(8);
        for q in &mut it {
            for j in 0..8 {
                let v = q[j] as f64;
                a[j] += v;
                b[j] += v * v;
            }
        }
        (self.a, self.b) = (a, b);
        for &v in it.remainder() {
            self.ts += v as f64;
            self.ts2 += v as f64 * v as f64;
        }
    }

    fn finish(&self) -> (f64, f64) {
        (
            self.a.iter().sum::<f64>() + self.ts,
            self.b.iter().sum::<f64>() + self.ts2,
        )
    }
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
    fit_from(mean, std, density)
}

/// The fit's threshold from a mean and std: `|mean| + Φ⁻¹(1 − density/2)·std`.
pub fn fit_from(mean: f64, std: f64, density: f64) -> f32 {
    let z = norm_ppf(1.0 - density.clamp(1e-12, 1.0) / 2.0);
    (mean.abs() + z * std) as f32
}

/// Halving steps tried before falling back to `th = 0` (every non-zero entry passes).
const MAX_LOWER: u32 = 64;

/// Gaussiank's selection of about k entries: `{i : |x_i| > th}` and the threshold th, which is
/// the Gaussian fit halved until at least ⌈3k/4⌉ entries pass.
pub fn select(x: &[f32], k: usize) -> (Vec<u32>, f32) {
    let (i, _, th) = select_values(x, k);
    (i, th)
}

/// As [`select`], with the selected values `x[i]`.
///
/// One pass over x computes the exact mean and std and, at the same time, keeps the
/// candidates `{i : |x_i| > lo}` for a `lo` below half the ⌈3k/4⌉-th largest |x| (estimated
/// from a sample). Every threshold the halving ladder can stop at above lo is then decided
/// exactly from the candidates (the ladder stops at the first t with ⌈3k/4⌉ entries above it,
/// and t ≥ half that entry's |x| ≥ lo with high probability). When the ladder goes below lo,
/// the full passes run instead, so the result never depends on the sample.
pub fn select_values(x: &[f32], k: usize) -> (Vec<u32>, Vec<f32>, f32) {
    let n = x.len();
    if n == 0 || k == 0 {
        return (Vec::new(), Vec::new(), f32::INFINITY);
    }
    let need = (3 * k).div_ceil(4);
    let density = k as f64 / n as f64;
    // lo = −1: every non-NaN entry is a candidate (small inputs).
    let lo = if n >= crate::topk::SMALL {
        match crate::topk::estimate_lower_key(x, need) {
            Some(key) => candidate_floor(x, f32::from_bits(key), need, density),
            None => return select_passes(x, fit_threshold(x, density), 0, need),
        }
    } else {
        -1.0
    };
    let (mean, std, mut idx, mut val) = moments_and_candidates(x, lo);
    let mut t = fit_from(mean, std, density);
    if !t.is_finite() {
        t = f32::MAX;
    }
    // For t ≥ lo the entries above t are all among the candidates, so counting the candidate
    // values above t counts x exactly.
    let mut tries = 0;
    while t >= lo {
        if t <= 0.0 || threshold::count_above(&val, t) >= need {
            threshold::refine_values(&mut idx, &mut val, t);
            return (idx, val, t);
        }
        tries += 1;
        t = if tries >= MAX_LOWER { 0.0 } else { t * 0.5 };
    }
    select_passes(x, t, tries, need)
}

/// The candidate floor lo, from `v_low` (a sample estimate that is below the ⌈3k/4⌉-th largest
/// |x| with high probability) and a Gaussian fit on the same kind of sample.
///
/// The ladder stops at the first t below the ⌈3k/4⌉-th largest |x| (call it v): at the fit
/// itself when the fit is already below v, else at the halving that lands in [v/2, v). So
/// `v_low / 2` always covers the stop; when the sample's fit is below the sample's v (data
/// close to Gaussian, where the fit is accurate), the stop is the fit itself and a floor a
/// little below the sample's fit (×0.9) covers it with far fewer candidates.
fn candidate_floor(x: &[f32], v_low: f32, need: usize, density: f64) -> f32 {
    let n = x.len();
    let m = 1usize << 14;
    let stride = n / m;
    let sample: Vec<f32> = (0..m).map(|i| x[i * stride]).collect();
    let (mut s, mut s2) = (0.0f64, 0.0f64);
    for &v in &sample {
        s += v as f64;
        s2 += v as f64 * v as f64;
    }
    let mean = s / m as f64;
    let std = (s2 / m as f64 - mean * mean).max(0.0).sqrt();
    let fit = fit_from(mean, std, density);
    // The sample's own estimate of the ⌈3k/4⌉-th largest |x| (central, not lowered).
    let mut keys: Vec<u32> = sample.iter().map(|v| crate::threshold::key(*v)).collect();
    let r = ((need as f64 * m as f64 / n as f64).round() as usize).clamp(1, m);
    let pos = m - r;
    let v_est = f32::from_bits(*keys.select_nth_unstable(pos).1);
    if fit.is_finite() && fit < 0.98 * v_est {
        0.9 * fit
    } else {
        v_low * 0.5
    }
}

/// The halving ladder as [`select_values`] runs it, over a counting function: from the fit
/// (`f32::MAX` when not finite), halve until `count(t) ≥ need` or t ≤ 0 (0 after
/// [`MAX_LOWER`] halvings); returns the threshold, whose selection is `{|x| > t}`. For
/// callers that count elsewhere (the device seam, `resident::gaussiank_select`).
pub fn lower_until(fit: f32, need: usize, mut count: impl FnMut(f32) -> usize) -> f32 {
    let mut t = if fit.is_finite() { fit } else { f32::MAX };
    let mut tries = 0;
    while t > 0.0 && count(t) < need {
        tries += 1;
        t = if tries >= MAX_LOWER { 0.0 } else { t * 0.5 };
    }
    t
}

/// One pass: (mean, std) as [`mean_std`] computes them, and the ascending positions with
/// |x| > lo with their values.
#[allow(clippy::type_complexity)]
fn moments_and_candidates(x: &[f32], lo: f32) -> (f64, f64, Vec<u32>, Vec<f32>) {
    // Segments of 16384 (64 KiB) stay in cache between the selection scan and the sums.
    const SEG: usize = 1 << 14;
    let p = threshold::AbsGt(lo);
    let chunk = |(ci, c): (usize, &[f32])| {
        let cap = c.len() / 32 + 64;
        let (mut idx, mut val) = (Vec::with_capacity(cap), Vec::with_capacity(cap));
        let mut m = Moments::default();
        let base = ci * threshold::CHUNK;
        for (si, s) in c.chunks(SEG).enumerate() {
            threshold::scan_into::<_, true>(s, (base + si * SEG) as u32, &p, &mut idx, &mut val);
            m.add(s);
        }
        (m.finish(), (idx, val))
    };
    let parts: Vec<((f64, f64), (Vec<u32>, Vec<f32>))> = if x.len() < 2 * threshold::CHUNK {
        vec![chunk((0, x))]
    } else {
        x.par_chunks(threshold::CHUNK)
            .enumerate()
            .map(chunk)
            .collect()
    };
    let sums: Vec<(f64, f64)> = parts.iter().map(|p| p.0).collect();
    let (mean, std) = finish_moments(x.len(), &sums);
    let (idx, val) = threshold::concat(parts.into_iter().map(|p| p.1).collect());
    (mean, std, idx, val)
}

/// The halving ladder with full passes, from threshold `th` after `tries` halvings.
fn select_passes(x: &[f32], mut th: f32, mut tries: u32, need: usize) -> (Vec<u32>, Vec<f32>, f32) {
    if !th.is_finite() {
        th = f32::MAX;
    }
    let (mut idx, mut val) = threshold::above_with_values(x, th);
    if idx.len() < need && th > 0.0 {
        // One pass finds how many halvings are needed; the selection below stays exact.
        let j = halvings_needed(x, th, need).min(MAX_LOWER.saturating_sub(tries + 1));
        let mut t = th;
        for _ in 0..j {
            t *= 0.5;
        }
        if j > 0 && t > 0.0 {
            let (ci, cv) = threshold::above_with_values(x, t);
            if ci.len() >= need {
                return (ci, cv, t);
            }
            th = t;
            tries += j;
        }
    }
    while idx.len() < need && th > 0.0 {
        tries += 1;
        th = if tries >= MAX_LOWER { 0.0 } else { th * 0.5 };
        if threshold::count_above(x, th) >= need || th == 0.0 {
            (idx, val) = threshold::above_with_values(x, th);
        }
    }
    (idx, val, th)
}

/// The smallest j with at least `need` entries above th·2^-j, from one pass that puts every
/// entry in the bucket of the first halving it passes (exponent and mantissa comparison; an
/// estimate for subnormals, which the caller's exact selection checks).
fn halvings_needed(x: &[f32], th: f32, need: usize) -> u32 {
    const B: usize = 66;
    let tb = th.to_bits() & 0x7fff_ffff;
    let (te, tm) = ((tb >> 23) as i32, tb & 0x7f_ffff);
    let hist = x
        .par_chunks(threshold::CHUNK)
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
