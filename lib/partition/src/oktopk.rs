//! Ok-Topk's balanced space partition (Ok-Topk §3.1.1, Step B; oktopk.md §1): each rank cuts
//! its sorted selected indices into P equal-count pieces; the region boundaries are the
//! integer average of the ranks' cut points.

/// This rank's P−1 cut points: `L[i·floor(m/P)]` for i = 1..P−1 of its sorted selected
/// indices L (m = |L|). With m < P there is no meaningful cut: the rank contributes the
/// equal-size boundaries `i·n/P` instead, so the average is never dragged to 0 (the
/// reference code crashes here).
pub fn cut_points(sorted: &[u32], p: usize, n: u64) -> Vec<u64> {
    let m = sorted.len();
    if m < p {
        return naive_boundaries(p, n);
    }
    let step = m / p;
    (1..p).map(|i| sorted[i * step] as u64).collect()
}

/// Equal-size boundaries `i·n/P`, i = 1..P−1 (the `--naive` partition, SparCML's regions).
pub fn naive_boundaries(p: usize, n: u64) -> Vec<u64> {
    (1..p as u64).map(|i| i * n / p as u64).collect()
}

/// Region boundaries from every rank's cut points: the integer average (floor) of each cut,
/// made non-decreasing and clamped to n. Region i is `[b[i−1], b[i])` with b[−1]=0, b[P−1]=n.
pub fn average_boundaries(all_cuts: &[Vec<u64>], n: u64) -> Vec<u64> {
    let p = all_cuts.len();
    let cuts = all_cuts.first().map_or(0, |c| c.len());
    let mut b: Vec<u64> = (0..cuts)
        .map(|i| all_cuts.iter().map(|c| c[i]).sum::<u64>() / p as u64)
        .collect();
    for i in 1..b.len() {
        b[i] = b[i].max(b[i - 1]);
    }
    for x in &mut b {
        *x = (*x).min(n);
    }
    b
}

/// The region `[start, end)` owned by worker `i` given the P−1 boundaries.
pub fn region(bounds: &[u64], i: usize, n: u64) -> (u64, u64) {
    let start = if i == 0 { 0 } else { bounds[i - 1] };
    let end = if i == bounds.len() { n } else { bounds[i] };
    (start, end)
}
