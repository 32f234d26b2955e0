//! Ok-Topk's balanced space partition (Ok-Topk §3.1.1, Step B; oktopk.md §1): each rank cuts
//! its sorted selected indices into P equal-count pieces; the region boundaries are the
//! integer average of the ranks' cut points.

use gradkit_core::trace::Layout;
use gradkit_core::PlanRow;

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

/// Balanced space partition from every rank's sorted selected flat indices (Ok-Topk §3.1.1
/// Step B): each rank's [`cut_points`], then [`average_boundaries`]. No ranks, or P = 1, give
/// no boundaries (one region `[0, n)`).
pub fn balanced_boundaries(selections: &[&[u32]], p: usize, n: u64) -> Vec<u64> {
    let cuts: Vec<Vec<u64>> = selections
        .iter()
        .map(|s| cut_points(s, p.max(1), n))
        .collect();
    if cuts.is_empty() {
        return naive_boundaries(p.max(1), n);
    }
    average_boundaries(&cuts, n)
}

/// The `plan/1` rows of P regions (`bounds` = the P−1 boundaries) at `step`: region i belongs
/// to worker i; a region spanning layers becomes one row per layer (k null); an empty region
/// gives no row. Rows are ordered by worker, then layer.
pub fn region_rows(layout: &Layout, bounds: &[u64], step: u32) -> Vec<PlanRow> {
    let n = layout.total();
    let mut rows = Vec::new();
    for w in 0..=bounds.len() {
        let (s, e) = region(bounds, w, n);
        if s >= e {
            continue;
        }
        let mut li = layout.layer_of(s);
        while li < layout.layers.len() && layout.layers[li].offset < e {
            let l = &layout.layers[li];
            let (ls, le) = (s.max(l.offset), e.min(l.offset + l.numel));
            if ls < le {
                rows.push(PlanRow {
                    step,
                    worker: w as u32,
                    layer_id: l.layer_id,
                    layer: l.name.clone(),
                    start: ls - l.offset,
                    end: le - l.offset,
                    k: None,
                });
            }
            li += 1;
        }
    }
    rows
}

/// How many of one rank's sorted selected indices fall in each of the P regions.
pub fn region_counts(bounds: &[u64], sorted: &[u32]) -> Vec<u64> {
    let mut counts = Vec::with_capacity(bounds.len() + 1);
    let mut prev = 0usize;
    for &b in bounds {
        let at = sorted.partition_point(|&i| (i as u64) < b);
        counts.push((at - prev.min(at)) as u64);
        prev = prev.max(at);
    }
    counts.push((sorted.len() - prev) as u64);
    counts
}

/// Words each worker receives in split-and-reduce (Ok-Topk §3.1.1 Step C, Eq. 1): worker j
/// gets an (index, value) pair — 2 words — for every entry another rank selected in region j.
/// `selections[i]` is rank i's sorted selection; rank i's own region-i part stays local.
pub fn recv_words(bounds: &[u64], selections: &[&[u32]]) -> Vec<u64> {
    let p = bounds.len() + 1;
    let mut words = vec![0u64; p];
    for (i, s) in selections.iter().enumerate() {
        for (j, c) in region_counts(bounds, s).into_iter().enumerate() {
            if i != j {
                words[j] += 2 * c;
            }
        }
    }
    words
}

/// Which steps recompute the boundaries: the first trace step of every window
/// `[first + j·τ, first + (j+1)·τ)`, `first` being the trace's first step (so with consecutive
/// steps, exactly the steps `first + j·τ`). `steps` must be ascending.
pub fn period_steps(steps: &[u32], period: u32) -> Vec<bool> {
    let period = period.max(1);
    let first = steps.first().copied().unwrap_or(0);
    let mut last_window = None;
    steps
        .iter()
        .map(|&s| {
            let w = (s - first) / period;
            let new = last_window != Some(w);
            last_window = Some(w);
            new
        })
        .collect()
}
