//! Property tests of the region tilings (docs/ALGORITHMS.md): Ok-Topk's boundaries
//! (`cut_points`, `average_boundaries`, `balanced_boundaries`, `region_rows`) and DEFT's
//! pieces and bin-packing, on random layouts, selections and world sizes. Every region set
//! must be disjoint, ascending and cover `[0, n)` exactly (checked element by element), and
//! every DEFT piece must go to exactly one worker.

use gradkit_core::trace::Layout;
use gradkit_partition::{deft, oktopk};
use proptest::prelude::*;

fn layout(sizes: &[u64]) -> Layout {
    Layout::new(
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (i as u32, format!("l{i}"), n, None))
            .collect(),
    )
}

/// Asserts that the P regions `region(bounds, i, n)` tile `[0, n)`: every element is in
/// exactly one region, regions are in worker order (ascending, each `start ≤ end`).
fn assert_tiles(bounds: &[u64], p: usize, n: u64) -> Result<(), TestCaseError> {
    prop_assert_eq!(bounds.len(), p - 1, "P−1 boundaries");
    let regions: Vec<(u64, u64)> = (0..p).map(|i| oktopk::region(bounds, i, n)).collect();
    let mut owner = vec![0u32; n as usize];
    let mut prev_end = 0;
    for (i, &(s, e)) in regions.iter().enumerate() {
        prop_assert!(
            s <= e && e <= n,
            "region {} = [{}, {}) in n = {}",
            i,
            s,
            e,
            n
        );
        prop_assert_eq!(
            s,
            prev_end,
            "region {} starts where {} ends",
            i,
            i.max(1) - 1
        );
        prev_end = e;
        for j in s..e {
            owner[j as usize] += 1;
        }
    }
    prop_assert_eq!(prev_end, n, "the last region ends at n");
    prop_assert!(
        owner.iter().all(|&c| c == 1),
        "every element in exactly one region"
    );
    Ok(())
}

/// A sorted set of distinct indices below n.
fn selection(n: u64) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::btree_set(0..n.max(1) as u32, 0..=(n as usize).min(64))
        .prop_map(move |s| s.into_iter().filter(|&i| (i as u64) < n).collect())
}

/// (n, P, every rank's selection).
fn world() -> impl Strategy<Value = (u64, usize, Vec<Vec<u32>>)> {
    (0u64..400, 1usize..=8)
        .prop_flat_map(|(n, p)| (Just(n), Just(p), prop::collection::vec(selection(n), p..=p)))
}

proptest! {
    #![proptest_config(gradkit_testkit::proptest_config(64))]

    #[test]
    fn oktopk_cut_points_are_p_minus_1_ascending_indices((n, p, sels) in world()) {
        for s in &sels {
            let c = oktopk::cut_points(s, p, n);
            prop_assert_eq!(c.len(), p - 1);
            prop_assert!(c.windows(2).all(|w| w[0] <= w[1]), "ascending: {:?}", c);
            prop_assert!(c.iter().all(|&x| x <= n));
            if s.len() >= p {
                // Reference: the i·floor(m/P)-th selected index.
                let step = s.len() / p;
                let want: Vec<u64> = (1..p).map(|i| s[i * step] as u64).collect();
                prop_assert_eq!(c, want);
            } else {
                let want: Vec<u64> = (1..p as u64).map(|i| i * n / p as u64).collect();
                prop_assert_eq!(c, want, "fewer than P selected: equal-size cuts");
            }
        }
    }

    #[test]
    fn oktopk_balanced_and_averaged_boundaries_tile_the_index_space(
        (n, p, sels) in world(),
    ) {
        let views: Vec<&[u32]> = sels.iter().map(|s| s.as_slice()).collect();
        let b = oktopk::balanced_boundaries(&views, p, n);
        assert_tiles(&b, p, n)?;
        // The same from the cut points directly.
        let cuts: Vec<Vec<u64>> = sels.iter().map(|s| oktopk::cut_points(s, p, n)).collect();
        prop_assert_eq!(&oktopk::average_boundaries(&cuts, n), &b);
        // Counts per region add up to each rank's selection, and match a scan.
        for s in &sels {
            let c = oktopk::region_counts(&b, s);
            prop_assert_eq!(c.len(), p);
            for (i, &ci) in c.iter().enumerate() {
                let (lo, hi) = oktopk::region(&b, i, n);
                let want = s.iter().filter(|&&x| (x as u64) >= lo && (x as u64) < hi).count();
                prop_assert_eq!(ci, want as u64, "region {}", i);
            }
        }
        // Equal-size boundaries tile as well.
        assert_tiles(&oktopk::naive_boundaries(p, n), p, n)?;
    }

    #[test]
    fn oktopk_average_of_arbitrary_cuts_still_tiles(
        n in 0u64..300,
        cuts in prop::collection::vec(prop::collection::vec(0u64..400, 4..=4), 1..6),
    ) {
        // Cut points that are not sorted or exceed n (a misbehaving rank) still give a tiling:
        // the average is made non-decreasing and clamped.
        let b = oktopk::average_boundaries(&cuts, n);
        assert_tiles(&b, 5, n)?;
    }

    #[test]
    fn oktopk_region_rows_cover_every_element_once(
        sizes in prop::collection::vec(0u64..60, 1..6),
        p in 1usize..=6,
        seed_sel in prop::collection::vec(any::<u32>(), 0..80),
    ) {
        let lay = layout(&sizes);
        let n = lay.total();
        let mut sel: Vec<u32> = seed_sel.iter().filter(|_| n > 0).map(|&x| x % n as u32).collect();
        sel.sort_unstable();
        sel.dedup();
        let b = oktopk::balanced_boundaries(&[&sel], p, n);
        let rows = oktopk::region_rows(&lay, &b, 3);
        let mut owner = vec![u32::MAX; n as usize];
        let mut last_worker = 0;
        for r in &rows {
            let l = lay.by_id(r.layer_id).unwrap();
            prop_assert!(r.start < r.end && r.end <= l.numel, "row inside its layer");
            prop_assert!(r.worker as usize >= last_worker && (r.worker as usize) < p);
            last_worker = r.worker as usize;
            let (lo, hi) = oktopk::region(&b, r.worker as usize, n);
            for j in l.offset + r.start..l.offset + r.end {
                prop_assert!(j >= lo && j < hi, "row in its worker's region");
                prop_assert_eq!(owner[j as usize], u32::MAX, "element {} in two rows", j);
                owner[j as usize] = r.worker;
            }
        }
        prop_assert!(owner.iter().all(|&w| w != u32::MAX), "every element in a row");
    }

    #[test]
    fn deft_pieces_tile_the_layers_and_every_piece_goes_to_one_worker(
        sizes in prop::collection::vec(0u64..200, 1..8),
        p in 1usize..=6,
        k_frac in 0.0f64..1.0,
        norm_seed in prop::collection::vec(0u32..1000, 64),
        step in 0u32..10,
        topup in any::<bool>(),
    ) {
        let lay = layout(&sizes);
        let n = lay.total();
        let pcs = deft::pieces(&lay, p);
        // Pieces: non-empty, in flat order, tiling [0, n) element by element.
        let mut next = 0u64;
        for pc in &pcs {
            prop_assert!(pc.start < pc.end, "non-empty piece");
            let r = pc.flat_range(&lay);
            prop_assert_eq!(r.start as u64, next, "pieces in order without gaps");
            next = r.end as u64;
            prop_assert!(pc.end <= lay.layers[pc.layer].numel);
        }
        prop_assert_eq!(next, n, "pieces cover the model");
        // A layer larger than n/P is cut into min(P, size) pieces of sizes differing by ≤ 1.
        for (li, l) in lay.layers.iter().enumerate() {
            let mine: Vec<u64> = pcs.iter().filter(|x| x.layer == li).map(|x| x.size()).collect();
            if l.numel as f64 > n as f64 / p as f64 {
                prop_assert_eq!(mine.len() as u64, (p as u64).min(l.numel));
                let (lo, hi) = (mine.iter().min().unwrap(), mine.iter().max().unwrap());
                prop_assert!(hi - lo <= 1);
            } else {
                prop_assert_eq!(mine.len(), usize::from(l.numel > 0));
            }
        }
        // k allocation, then bin-packing: every piece in exactly one bin < P.
        let norms: Vec<f64> = (0..pcs.len()).map(|i| norm_seed[i % 64] as f64 / 7.0).collect();
        let k = (k_frac * n as f64) as u64;
        let ks = deft::allocate_k(&pcs, &norms, k, topup);
        prop_assert_eq!(ks.len(), pcs.len());
        for (pc, &kx) in pcs.iter().zip(&ks) {
            prop_assert!(kx <= pc.size(), "k_x ≤ size");
        }
        if topup && pcs.len() as u64 <= k {
            prop_assert_eq!(ks.iter().sum::<u64>(), k, "Σ k_x = k with top-up");
            prop_assert!(ks.iter().all(|&x| x >= 1));
        }
        let bins = deft::bin_pack(&pcs, &ks, p);
        prop_assert_eq!(bins.len(), pcs.len(), "one bin per piece");
        prop_assert!(bins.iter().all(|&b| b < p));
        // LPT: every piece went to a least-loaded bin, so the spread of the loads is at most
        // the largest piece cost.
        if !pcs.is_empty() {
            let loads = deft::bin_loads(&pcs, &ks, &bins, p);
            let max_cost = pcs
                .iter()
                .zip(&ks)
                .map(|(pc, &kx)| deft::cost(pc.size(), kx))
                .fold(0.0f64, f64::max);
            let (lo, hi) = loads.iter().fold((f64::MAX, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
            prop_assert!(hi - lo <= max_cost + 1e-9 * hi, "loads {:?}, max cost {}", loads, max_cost);
        }
        // Plan rows: each piece exactly once, at the worker its bin rotates to; the bin →
        // worker map is a bijection of 0..P.
        let rows = deft::plan_rows(&lay, &pcs, &ks, &bins, p, step);
        prop_assert_eq!(rows.len(), pcs.len());
        let mut seen = vec![false; pcs.len()];
        for r in &rows {
            let li = lay.layers.iter().position(|l| l.layer_id == r.layer_id).unwrap();
            let x = pcs
                .iter()
                .position(|pc| pc.layer == li && pc.start == r.start && pc.end == r.end)
                .expect("row is a piece");
            prop_assert!(!seen[x], "piece {} in two rows", x);
            seen[x] = true;
            prop_assert_eq!(r.worker as usize, (bins[x] + p - step as usize % p) % p);
            prop_assert_eq!(r.k, Some(ks[x]));
        }
        let mut workers: Vec<usize> = (0..p).map(|b| deft::worker_of_bin(b, step, p)).collect();
        workers.sort_unstable();
        prop_assert_eq!(workers, (0..p).collect::<Vec<_>>());
    }
}
