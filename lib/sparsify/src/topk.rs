//! Exact top-k by magnitude (Alistarh et al. 2018; Ok-Topk §3.1.3 `th_re_evaluate`).
//!
//! Magnitudes are compared through their IEEE bit patterns (`bits & 0x7fff_ffff`), which
//! orders every non-NaN `|x|` exactly; a NaN compares above +inf.

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
    let th = key(kth_largest_abs(x, k));
    let above = x.iter().filter(|v| key(**v) > th).count();
    let mut ties = k - above;
    let mut out = Vec::with_capacity(k);
    for (i, v) in x.iter().enumerate() {
        let kv = key(*v);
        if kv > th {
            out.push(i as u32);
        } else if kv == th && ties > 0 {
            ties -= 1;
            out.push(i as u32);
        }
    }
    out
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
    let mut keys: Vec<u32> = x.iter().map(|v| key(*v)).collect();
    let pos = x.len() - k;
    let (_, kth, _) = keys.select_nth_unstable(pos);
    f32::from_bits(*kth)
}
