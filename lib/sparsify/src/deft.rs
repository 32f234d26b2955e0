//! DEFT's layer-wise selection (Yoon & Oh, ICPP'23, Alg. 5; deft.md §1.4): each worker runs an
//! exact top-k in each of the ranges the plan gives it, with its own per-range k. The plan
//! itself (pieces, norm-based k, bin-packing) is `gradkit_partition::deft`.

use crate::topk;

/// Exact top-k (ties to the lower index) in each half-open range `(start, end, k)` of `acc`;
/// the ranges must be disjoint. Returns flat indices, ascending.
///
/// # Panics
/// If a range lies outside `acc` or ranges overlap.
pub fn select_in_ranges(acc: &[f32], ranges: &[(usize, usize, usize)]) -> Vec<u32> {
    let mut rs: Vec<(usize, usize, usize)> = ranges.to_vec();
    rs.sort_unstable();
    let mut out = Vec::with_capacity(rs.iter().map(|r| r.2.min(r.1 - r.0)).sum());
    let mut prev_end = 0;
    for &(s, e, k) in &rs {
        assert!(
            s <= e && e <= acc.len(),
            "range {s}..{e} outside 0..{}",
            acc.len()
        );
        assert!(s >= prev_end, "ranges overlap at {s}");
        prev_end = e;
        out.extend(
            topk::topk_indices(&acc[s..e], k)
                .into_iter()
                .map(|i| i + s as u32),
        );
    }
    out
}

/// The L2 norm of one piece (DEFT's norm-based k allocation, deft.md §1.2): f64 squares in
/// four lanes, then the tail, in a fixed order (gradkit-partition's `piece_norms`, and the
/// device seam's `range_norms`).
pub fn range_norm(s: &[f32]) -> f64 {
    let mut acc = [0.0f64; 4];
    let mut chunks = s.chunks_exact(4);
    for c in &mut chunks {
        for j in 0..4 {
            let v = c[j] as f64;
            acc[j] += v * v;
        }
    }
    let mut tail = 0.0f64;
    for &v in chunks.remainder() {
        tail += v as f64 * v as f64;
    }
    (acc[0] + acc[1] + acc[2] + acc[3] + tail).sqrt()
}
