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
const SMALL: usize = 1 << 16;
/// Elements per parallel chunk.
pub(crate) const CHUNK: usize = 1 << 16;
/// Sample size for the threshold estimate.
const SAMPLE: usize = 1 << 15;
/// Contiguous entries per sample block.
const BLOCK: usize = 32;

#[inline]
pub(crate) fn key(v: f32) -> u32 {
    v.to_bits() & 0x7fff_ffff
}

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
        Some((c, keys)) => take_top_keyed(&c, &keys, th, k),
        None => take_top(x, 0..x.len() as u32, th, k),
    };
    (idx, Some(f32::from_bits(th)))
}

/// Exact top-k among the given ascending `positions` of `x` (DGC's "exact top-k of the entries
/// that passed"); returns ascending indices and the k-th largest |x| among them.
pub fn topk_among(x: &[f32], positions: &[u32], k: usize) -> (Vec<u32>, Option<f32>) {
    let k = k.min(positions.len());
    if k == 0 {
        return (Vec::new(), None);
    }
    let mut keys: Vec<u32> = positions.iter().map(|&i| key(x[i as usize])).collect();
    let th = select_kth_largest(&mut keys, k);
    (
        take_top(x, positions.iter().copied(), th, k),
        Some(f32::from_bits(th)),
    )
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

/// As [`take_top`], for candidates whose keys were collected with them.
fn take_top_keyed(pos: &[u32], keys: &[u32], th: u32, k: usize) -> Vec<u32> {
    let above = keys.iter().filter(|&&kv| kv > th).count();
    let mut ties = k - above;
    let mut out = Vec::with_capacity(k);
    for (&i, &kv) in pos.iter().zip(keys) {
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

/// The k-th largest of `keys` (1 ≤ k ≤ len); reorders `keys`.
fn select_kth_largest(keys: &mut [u32], k: usize) -> u32 {
    let pos = keys.len() - k;
    *keys.select_nth_unstable(pos).1
}

/// Candidate positions (ascending) and their keys.
type Candidates = (Vec<u32>, Vec<u32>);

/// The k-th largest key of x, with the ascending candidate positions (and their keys) that
/// contain every position whose key is ≥ it (None: the caller scans all of x).
fn kth_key(x: &[f32], k: usize) -> (u32, Option<Candidates>) {
    let n = x.len();
    if n >= SMALL {
        if let Some(lo) = estimate_lower_key(x, k) {
            let (cands, keys) = at_least(x, lo);
            if cands.len() >= k {
                let mut scratch = keys.clone();
                let th = select_kth_largest(&mut scratch, k);
                return (th, Some((cands, keys)));
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
fn estimate_lower_key(x: &[f32], k: usize) -> Option<u32> {
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

/// Ascending positions with key ≥ lo and their keys (one parallel pass).
pub(crate) fn at_least(x: &[f32], lo: u32) -> (Vec<u32>, Vec<u32>) {
    let parts: Vec<(Vec<u32>, Vec<u32>)> = x
        .par_chunks(CHUNK)
        .enumerate()
        .map(|(ci, c)| {
            let mut idx = Vec::new();
            let mut keys = Vec::new();
            scan_mask(
                c,
                (ci * CHUNK) as u32,
                |v| key(v) >= lo,
                |i, v| {
                    idx.push(i);
                    keys.push(key(v));
                },
            );
            (idx, keys)
        })
        .collect();
    let total = parts.iter().map(|p| p.0.len()).sum();
    let (mut idx, mut keys) = (Vec::with_capacity(total), Vec::with_capacity(total));
    for (i, k) in parts {
        idx.extend_from_slice(&i);
        keys.extend_from_slice(&k);
    }
    (idx, keys)
}

/// Calls `hit(base + j, c[j])` for every j with `pred(c[j])`, in order. The predicate is
/// evaluated 32 lanes at a time into a bit mask (vectorised, branch-free); blocks with no hit
/// cost one test, so a pass with few hits runs near memory speed.
#[inline(always)]
pub(crate) fn scan_mask(
    c: &[f32],
    base: u32,
    pred: impl Fn(f32) -> bool,
    mut hit: impl FnMut(u32, f32),
) {
    let mut blocks = c.chunks_exact(32);
    let mut off = base;
    for b in &mut blocks {
        let mut m = 0u32;
        for (j, v) in b.iter().enumerate() {
            m |= (pred(*v) as u32) << j;
        }
        while m != 0 {
            let j = m.trailing_zeros();
            hit(off + j, b[j as usize]);
            m &= m - 1;
        }
        off += 32;
    }
    for (j, v) in blocks.remainder().iter().enumerate() {
        if pred(*v) {
            hit(off + j as u32, *v);
        }
    }
}
