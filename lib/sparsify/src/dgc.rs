//! Deep Gradient Compression's selection (Lin et al., ICLR 2018, §3 "sampling"; the authors'
//! `DGCCompressor`, anchors.md §1.9): estimate the threshold from a strided sample of |x| (the
//! sample's top-(density·m) boundary), keep `{i : |x_i| > th}`, lower th by ×0.8 while fewer
//! than 0.8k pass (at most 10 times), and when more than 1.3k pass take the exact top-k among
//! the passing entries.

use rayon::prelude::*;

use crate::{threshold, topk};

/// DGC's bounds on the selected count relative to k.
pub const UPPER: f64 = 1.3;
pub const LOWER: f64 = 0.8;
const MAX_ADAPT: u32 = 10;

/// One DGC selection.
#[derive(Clone, Debug, PartialEq)]
pub struct DgcStep {
    pub indices: Vec<u32>,
    /// The threshold: `indices == {i : |x_i| > threshold}` unless `exact_topk`, in which case
    /// the selection is the exact top-k and this is the k-th largest |x|.
    pub threshold: f32,
    pub exact_topk: bool,
}

/// The strided sample: m = max(1, ⌊n·ratio⌋) entries at stride ⌊n/m⌋, starting at 0.
pub fn sample_threshold(x: &[f32], k: usize, ratio: f64) -> f32 {
    let n = x.len();
    let m = ((n as f64 * ratio).floor() as usize).clamp(1, n);
    let stride = n / m;
    // The strided reads miss the cache one by one: split them over the threads when many.
    let s: Vec<f32> = if m >= 1 << 16 {
        (0..m).into_par_iter().map(|i| x[i * stride]).collect()
    } else {
        (0..m).map(|i| x[i * stride]).collect()
    };
    let ks = ((k as f64 * m as f64 / n as f64).ceil() as usize).clamp(1, m);
    topk::kth_largest_abs(&s, ks)
}

/// DGC's selection of about k entries of x.
pub fn select(x: &[f32], k: usize, ratio: f64) -> DgcStep {
    select_values(x, k, ratio).0
}

/// As [`select`], with the selected values `x[i]` (from the selection pass, not gathered).
pub fn select_values(x: &[f32], k: usize, ratio: f64) -> (DgcStep, Vec<f32>) {
    let n = x.len();
    if n == 0 || k == 0 {
        return (
            DgcStep {
                indices: Vec::new(),
                threshold: f32::INFINITY,
                exact_topk: false,
            },
            Vec::new(),
        );
    }
    // Strict `>` at the sample's k-th value would drop that value itself: step just below it.
    let mut th = next_down(sample_threshold(x, k, ratio));
    let (mut idx, mut val) = threshold::above_with_values(x, th);
    let mut adapt = 0;
    while (idx.len() as f64) < LOWER * k as f64 && adapt < MAX_ADAPT && th > 0.0 {
        th *= LOWER as f32;
        (idx, val) = threshold::above_with_values(x, th);
        adapt += 1;
    }
    if idx.len() as f64 > UPPER * k as f64 {
        let (top, topv, kth) = topk::topk_among_values(&idx, &val, k);
        return (
            DgcStep {
                indices: top,
                threshold: kth.unwrap_or(th),
                exact_topk: true,
            },
            topv,
        );
    }
    (
        DgcStep {
            indices: idx,
            threshold: th,
            exact_topk: false,
        },
        val,
    )
}

/// The largest f32 below a non-negative finite v (0 stays 0: `> 0` keeps every non-zero).
fn next_down(v: f32) -> f32 {
    if v > 0.0 && v.is_finite() {
        f32::from_bits(v.to_bits() - 1)
    } else {
        v
    }
}
