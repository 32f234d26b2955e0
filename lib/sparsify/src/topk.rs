//! Exact top-k by magnitude (Alistarh et al. 2018 "The convergence of sparsified gradient
//! methods"; Ok-Topk §3.1.3 `th_re_evaluate`, the exact k-th largest |x|).
//!
//! Magnitudes are compared through their IEEE bit patterns (`bits & 0x7fff_ffff`), which
//! orders every non-NaN `|x|` exactly (−0 and +0 are equal); a NaN compares above +inf.
//!
//! Large inputs use sample-then-filter: the k/n quantile of |x| is estimated from a fixed
//! strided sample, lowered by a safety margin, one parallel pass keeps the candidates at or
//! above that estimate (in index order), and the exact k-th largest is selected among the
//! candidates. When the estimate misses (fewer than k candidates) the exact full selection
//! runs instead, so the result never depends on the sample.

use rayon::prelude::*;

/// Below this length the plain selection is used (sampling does not pay).
pub(crate) const SMALL: usize = 1 << 16;
/// Elements per parallel chunk.
pub(crate) const CHUNK: usize = 1 << 16;
/// Sample size for the threshold estimate.
const SAMPLE: usize = 1 << 15;
/// Contiguous entries per sample block.
const BLOCK: usize = 32;

pub(crate) use crate::threshold::key;

/// Exactly k indices of largest |x|, ties to the lower index; returned ascending.
///
/// `k` is clamped to `x.len()`; `k == 0` gives an empty vector.
pub fn topk_indices(x: &[f32], k: usize) -> Vec<u32> {
    let k = k.min(x.len());
    if k == 0 {
        return Vec::new();
    }
    if k == x.len() {
        return (0..x.len() as u32).collect();
    }
    topk_with_threshold(x, k).0
}

/// The k-th largest |x| (k ≥ 1, k ≤ len); used as Ok-Topk's exact threshold.
///
/// # Panics
/// If `k == 0` or `k > x.len()`.
pub fn kth_largest_abs(x: &[f32], k: usize) -> f32 {
    assert!(
        k >= 1 && k <= x.len(),
        "kth_largest_abs: k = {k} not in 1..={}",
        x.len()
    );
    f32::from_bits(kth_key(x, k).0)
}

/// Exact top-k (as [`topk_indices`]) together with the k-th largest |x|.
pub fn topk_with_threshold(x: &[f32], k: usize) -> (Vec<u32>, Option<f32>) {
    let k = k.min(x.len());
    if k == 0 {
        return (Vec::new(), None);
    }
    let (th, cands) = kth_key(x, k);
    let idx = match cands {
        Some((c, vals)) => take_top_valued::<false>(&c, &vals, th, k).0,
        None => take_top(x, 0..x.len() as u32, th, k),
    };
    (idx, Some(f32::from_bits(th)))
}

/// As [`topk_with_threshold`], with the selected values `x[i]` (taken from the candidate pass,
/// not gathered again).
pub fn topk_with_values(x: &[f32], k: usize) -> (Vec<u32>, Vec<f32>, Option<f32>) {
    let k = k.min(x.len());
    if k == 0 {
        return (Vec::new(), Vec::new(), None);
    }
    let (th, cands) = kth_key(x, k);
    let (idx, val) = match cands {
        Some((c, vals)) => take_top_valued::<true>(&c, &vals, th, k),
        None => {
            let idx = take_top(x, 0..x.len() as u32, th, k);
            let val = idx.iter().map(|&i| x[i as usize]).collect();
            (idx, val)
        }
    };
    (idx, val, Some(f32::from_bits(th)))
}

/// Exact top-k among candidates given as ascending positions with their values (DGC's "exact
/// top-k of the entries that passed"): the kept positions and values, and the k-th largest |x|.
pub fn topk_among_values(pos: &[u32], vals: &[f32], k: usize) -> (Vec<u32>, Vec<f32>, Option<f32>) {
    let k = k.min(pos.len());
    if k == 0 {
        return (Vec::new(), Vec::new(), None);
    }
    let mut keys: Vec<u32> = vals.iter().map(|v| key(*v)).collect();
    let th = select_kth_largest(&mut keys, k);
    let (i, v) = take_top_valued::<true>(pos, vals, th, k);
    (i, v, Some(f32::from_bits(th)))
}

/// Keeps, in order, the positions with key > th plus the first ties at th, k in all.
fn take_top(
    x: &[f32],
    positions: impl Iterator<Item = u32> + Clone,
    th: u32,
    k: usize,
) -> Vec<u32> {
    let above = positions
        .clone()
        .filter(|&i| key(x[i as usize]) > th)
        .count();
    let mut ties = k - above;
    let mut out = Vec::with_capacity(k);
    for i in positions {
        let kv = key(x[i as usize]);
        if kv > th || (kv == th && ties > 0) {
            if kv == th {
                ties -= 1;
            }
            out.push(i);
            if out.len() == k {
                break;
            }
        }
    }
    out
}

/// As [`take_top`], for candidates whose values were collected with them; the values of the
/// kept ones when `VALUES` (else an empty vector).
fn take_top_valued<const VALUES: bool>(
    pos: &[u32],
    vals: &[f32],
    th: u32,
    k: usize,
) -> (Vec<u32>, Vec<f32>) {
    let above = vals.iter().filter(|v| key(**v) > th).count();
    let mut ties = k - above;
    let mut out = Vec::with_capacity(k);
    let mut outv = Vec::with_capacity(if VALUES { k } else { 0 });
    for (&i, &v) in pos.iter().zip(vals) {
        let kv = key(v);
        if kv > th || (kv == th && ties > 0) {
            if kv == th {
                ties -= 1;
            }
            out.push(i);
            if VALUES {
                outv.push(v);
            }
            if out.len() == k {
                break;
            }
        }
    }
    (out, outv)
}

/// The k-th largest of `keys` (1 ≤ k ≤ len); reorders `keys`.
fn select_kth_largest(keys: &mut [u32], k: usize) -> u32 {
    let pos = keys.len() - k;
    *keys.select_nth_unstable(pos).1
}

/// Candidate positions (ascending) and their values.
type Candidates = (Vec<u32>, Vec<f32>);

/// The k-th largest key of x, with the ascending candidate positions (and their keys) that
/// contain every position whose key is ≥ it, with their values (None: the caller scans all of
/// x).
fn kth_key(x: &[f32], k: usize) -> (u32, Option<Candidates>) {
    let n = x.len();
    if n >= SMALL {
        if let Some(lo) = estimate_lower_key(x, k) {
            let (cands, vals) = at_least(x, lo);
            if cands.len() >= k {
                let mut keys: Vec<u32> = vals.iter().map(|v| key(*v)).collect();
                let th = select_kth_largest(&mut keys, k);
                return (th, Some((cands, vals)));
            }
        }
    }
    let mut keys: Vec<u32> = if n >= SMALL {
        x.par_iter().map(|v| key(*v)).collect()
    } else {
        x.iter().map(|v| key(*v)).collect()
    };
    (select_kth_largest(&mut keys, k), None)
}

/// A key that is ≤ the k-th largest with high probability, from a sample of `SAMPLE` entries in
/// blocks of `BLOCK` contiguous ones spread evenly over x (few cache misses); None when the
/// sample says nearly everything would pass (the filter would not pay).
pub(crate) fn estimate_lower_key(x: &[f32], k: usize) -> Option<u32> {
    let n = x.len();
    let blocks = (SAMPLE / BLOCK).min(n / BLOCK).max(1);
    let stride = n / blocks;
    let mut sample: Vec<u32> = Vec::with_capacity(blocks * BLOCK);
    for b in 0..blocks {
        // A deterministic jitter inside each stride, against periodic inputs.
        let room = stride.saturating_sub(BLOCK).max(1);
        let start = b * stride + (b.wrapping_mul(2_654_435_761) >> 5) % room;
        let end = (start + BLOCK).min(n);
        sample.extend(x[start..end].iter().map(|v| key(*v)));
    }
    let m = sample.len();
    let expect = k as f64 * m as f64 / n as f64;
    let r = (expect + 4.0 * expect.sqrt() + 16.0).ceil() as usize;
    if r >= m / 2 {
        return None;
    }
    Some(select_kth_largest(&mut sample, r))
}

/// Ascending positions with key ≥ lo and their values (one parallel pass).
pub(crate) fn at_least(x: &[f32], lo: u32) -> (Vec<u32>, Vec<f32>) {
    crate::threshold::collect::<_, true>(x, &crate::threshold::KeyGe(lo))
}
