//! Ok-Topk's balanced space partition against the artifact's recipe, re-stated here
//! (oktopk.md §1 Step B; anchors.md §4), and the per-layer plan rows against a brute-force
//! coverage check.

use gradkit_core::trace::Layout;
use gradkit_partition::oktopk;

use crate::common;
use common::Rng;

fn layout(sizes: &[u64]) -> Layout {
    Layout::new(
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (i as u32, format!("l{i}"), n, None))
            .collect(),
    )
}

/// A sorted random subset of [0, n) of about m elements, denser near `hot`.
fn selection(rng: &mut Rng, n: u64, m: usize, hot: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..m)
        .map(|_| {
            if rng.below(2) == 0 {
                ((hot + rng.below(n / 8 + 1)) % n) as u32
            } else {
                rng.below(n) as u32
            }
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The artifact's recipe: c = m/P, cut i = L[i·c] (i = 1..P−1), summed over ranks, divided
/// by the number of ranks (every rank here has m ≥ P).
fn ref_boundaries(sels: &[Vec<u32>], p: usize) -> Vec<u64> {
    let mut sum = vec![0u64; p - 1];
    for s in sels {
        let c = s.len() / p;
        for i in 1..p {
            sum[i - 1] += s[i * c] as u64;
        }
    }
    sum.iter().map(|x| x / sels.len() as u64).collect()
}

/// Flat ranges of every worker from the plan rows, checked to tile [0, n) in worker order.
fn check_tiling(rows: &[gradkit_core::PlanRow], lay: &Layout, p: usize, bounds: &[u64]) {
    let n = lay.total();
    let mut ranges: Vec<(u64, u64, u32)> = rows
        .iter()
        .map(|r| {
            let off = lay.by_id(r.layer_id).unwrap().offset;
            assert!(r.start < r.end && r.end <= lay.by_id(r.layer_id).unwrap().numel);
            assert!(r.k.is_none());
            (off + r.start, off + r.end, r.worker)
        })
        .collect();
    ranges.sort();
    let mut pos = 0;
    let mut last_worker = 0;
    for &(a, b, w) in &ranges {
        assert_eq!(a, pos, "contiguous, non-overlapping");
        assert!(w >= last_worker, "regions in worker order");
        assert!((w as usize) < p);
        pos = b;
        last_worker = w;
    }
    assert_eq!(pos, n, "covers [0, n)");
    // each worker's rows are exactly its region
    for w in 0..p {
        let (s, e) = oktopk::region(bounds, w, n);
        let covered: u64 = ranges
            .iter()
            .filter(|r| r.2 == w as u32)
            .map(|r| r.1 - r.0)
            .sum();
        assert_eq!(covered, e - s);
        for r in ranges.iter().filter(|r| r.2 == w as u32) {
            assert!(r.0 >= s && r.1 <= e);
        }
    }
}

#[test]
fn boundaries_match_the_recipe_and_rows_tile_the_space() {
    let mut rng = Rng::xorshift64star(9);
    for case in 0..200 {
        let sizes: Vec<u64> = (0..1 + rng.below(6)).map(|_| 1 + rng.below(3000)).collect();
        let lay = layout(&sizes);
        let n = lay.total();
        let p = 1 + rng.below(9.min(n)) as usize;
        let ranks = 1 + rng.below(6) as usize;
        let hot = rng.below(n);
        let sels: Vec<Vec<u32>> = (0..ranks)
            .map(|_| {
                let m = p + rng.below(400) as usize;
                selection(&mut rng, n, m, hot)
            })
            .filter(|s| s.len() >= p)
            .collect();
        if sels.is_empty() {
            continue;
        }
        let refs: Vec<&[u32]> = sels.iter().map(|s| s.as_slice()).collect();
        let b = oktopk::balanced_boundaries(&refs, p, n);
        assert_eq!(b, ref_boundaries(&sels, p), "case {case}");
        let rows = oktopk::region_rows(&lay, &b, 5);
        assert!(rows.iter().all(|r| r.step == 5));
        check_tiling(&rows, &lay, p, &b);
        let naive = oktopk::naive_boundaries(p, n);
        check_tiling(&oktopk::region_rows(&lay, &naive, 0), &lay, p, &naive);
    }
}

#[test]
fn identical_selections_give_equal_counts() {
    let mut rng = Rng::xorshift64star(4);
    for case in 0..200 {
        let n = 100 + rng.below(100_000);
        let p = 1 + rng.below(16) as usize;
        let m = p + rng.below(5000) as usize;
        let hot = rng.below(n);
        let s = selection(&mut rng, n, m, hot);
        if s.len() < p {
            continue;
        }
        let ranks = 1 + rng.below(5) as usize;
        let sels: Vec<&[u32]> = (0..ranks).map(|_| s.as_slice()).collect();
        let b = oktopk::balanced_boundaries(&sels, p, n);
        let c = (s.len() / p) as u64;
        for w in 0..p {
            let (a, e) = oktopk::region(&b, w, n);
            let count = s
                .iter()
                .filter(|&&i| (i as u64) >= a && (i as u64) < e)
                .count() as u64;
            if w + 1 < p {
                assert_eq!(count, c, "case {case}: region {w}");
            } else {
                assert_eq!(count, s.len() as u64 - (p as u64 - 1) * c);
            }
            // the crate's counts agree with the brute-force count
            assert_eq!(oktopk::region_counts(&b, &s)[w], count);
        }
        // split-and-reduce: worker j receives 2 words per entry of another rank in region j
        let words = oktopk::recv_words(&b, &sels);
        for (j, wj) in words.iter().enumerate() {
            let (a, e) = oktopk::region(&b, j, n);
            let in_j = s
                .iter()
                .filter(|&&i| (i as u64) >= a && (i as u64) < e)
                .count() as u64;
            let others = (0..ranks).filter(|&i| i != j).count() as u64;
            assert_eq!(*wj, 2 * in_j * others);
        }
    }
}

#[test]
fn one_worker_and_empty_selections_work() {
    let lay = layout(&[10, 5]);
    // P = 1: one region, two rows (one per layer)
    let b = oktopk::balanced_boundaries(&[&[1, 2, 3][..], &[][..]], 1, 15);
    assert!(b.is_empty());
    let rows = oktopk::region_rows(&lay, &b, 0);
    assert_eq!(rows.len(), 2);
    check_tiling(&rows, &lay, 1, &b);
    // every rank selected nothing: equal-size regions, no panic
    let b = oktopk::balanced_boundaries(&[&[][..], &[][..]], 4, 15);
    assert_eq!(b, vec![3, 7, 11]);
    check_tiling(&oktopk::region_rows(&lay, &b, 0), &lay, 4, &b);
    // no ranks at all
    let b = oktopk::balanced_boundaries(&[], 3, 15);
    assert_eq!(b, vec![5, 10]);
    assert_eq!(oktopk::region_counts(&b, &[]), vec![0, 0, 0]);
}

#[test]
fn period_steps_start_a_window_every_tau_steps() {
    let steps: Vec<u32> = (3..40).collect();
    let got = oktopk::period_steps(&steps, 8);
    for (s, g) in steps.iter().zip(&got) {
        assert_eq!(*g, (s - 3) % 8 == 0, "step {s}");
    }
    // sparse steps: the first trace step of each window
    let got = oktopk::period_steps(&[0, 5, 10, 15, 20], 8);
    assert_eq!(got, vec![true, false, true, false, true]);
    assert_eq!(oktopk::period_steps(&[], 4), Vec::<bool>::new());
}
