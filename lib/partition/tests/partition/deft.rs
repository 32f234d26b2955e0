//! DEFT's partitioning, allocation and bin-packing against straightforward re-implementations
//! written here (scans and sorts, no code shared with the crate).

use gradkit_core::trace::Layout;
use gradkit_partition::deft::{self, Piece};

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

/// Reference two-stage partition: (layer, start, end) by scanning the sizes.
fn ref_pieces(sizes: &[u64], p: u64) -> Vec<(usize, u64, u64)> {
    let total: u64 = sizes.iter().sum();
    let mut out = vec![];
    for (l, &s) in sizes.iter().enumerate() {
        // s > total/p  ⇔  s·p > total (exact in integers)
        if s * p > total {
            let mut start = 0;
            for i in 0..p {
                let len = if i < s % p { s / p + 1 } else { s / p };
                if len > 0 {
                    out.push((l, start, start + len));
                }
                start += len;
            }
        } else if s > 0 {
            out.push((l, 0, s));
        }
    }
    out
}

/// Reference allocation: descending norm (ties: lower index first), remainders reduced by
/// subtraction as in the paper's Alg. 3, then the optional top-up and trim passes.
fn ref_allocate(sizes: &[u64], norms: &[f64], k: u64, topup: bool) -> Vec<u64> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    // selection sort by (−norm, index): the plainest way to state the order
    for i in 0..order.len() {
        let mut best = i;
        for j in i + 1..order.len() {
            let (a, b) = (order[j], order[best]);
            if norms[a] > norms[b] || (norms[a] == norms[b] && a < b) {
                best = j;
            }
        }
        order.swap(i, best);
    }
    let mut k_remain = k as i64;
    let mut norm_remain: f64 = norms.iter().sum();
    let mut ks = vec![0u64; sizes.len()];
    for &x in &order {
        let t = if norm_remain > 0.0 && k_remain > 0 {
            (k_remain as f64 * (norms[x] / norm_remain)).floor() as u64
        } else {
            0
        };
        ks[x] = if sizes[x] < t { sizes[x] } else { t.max(1) };
        k_remain -= ks[x] as i64;
        norm_remain -= norms[x];
    }
    if topup {
        for &x in &order {
            while k_remain > 0 && ks[x] < sizes[x] {
                ks[x] += 1;
                k_remain -= 1;
            }
        }
        for &x in order.iter().rev() {
            while k_remain < 0 && ks[x] > 1 {
                ks[x] -= 1;
                k_remain += 1;
            }
        }
    }
    ks
}

fn ref_cost(size: u64, k: u64) -> f64 {
    if k <= 1 {
        size as f64
    } else {
        size as f64 * (k as f64).log2()
    }
}

/// Reference LPT, as the authors' code does it: L times, the first maximum of the remaining
/// costs goes to the first minimum of the loads.
fn ref_bin_pack(sizes: &[u64], ks: &[u64], p: usize) -> (Vec<usize>, Vec<f64>) {
    let mut cost: Vec<f64> = sizes
        .iter()
        .zip(ks)
        .map(|(&s, &k)| ref_cost(s, k))
        .collect();
    let mut load = vec![0.0f64; p];
    let mut bin = vec![usize::MAX; sizes.len()];
    for _ in 0..sizes.len() {
        let mut x = 0;
        for j in 0..cost.len() {
            if cost[j] > cost[x] {
                x = j;
            }
        }
        let mut b = 0;
        for j in 0..p {
            if load[j] < load[b] {
                b = j;
            }
        }
        bin[x] = b;
        load[b] += cost[x];
        cost[x] = -1.0;
    }
    (bin, load)
}

fn random_sizes(rng: &mut Rng, layers: usize) -> Vec<u64> {
    (0..layers)
        .map(|_| match rng.below(4) {
            0 => 1 + rng.below(10),
            1 => 1 + rng.below(1000),
            2 => 1 + rng.below(100_000),
            _ => 64 * (1 + rng.below(64)),
        })
        .collect()
}

fn piece_sizes(ps: &[Piece]) -> Vec<u64> {
    ps.iter().map(|p| p.end - p.start).collect()
}

#[test]
fn pieces_match_the_reference_and_tile_every_layer_once() {
    let mut rng = Rng::xorshift64star(7);
    for case in 0..300 {
        let layers = 1 + rng.below(12) as usize;
        let sizes = random_sizes(&mut rng, layers);
        let p = 1 + rng.below(40);
        let lay = layout(&sizes);
        let got: Vec<(usize, u64, u64)> = deft::pieces(&lay, p as usize)
            .iter()
            .map(|x| (x.layer, x.start, x.end))
            .collect();
        assert_eq!(
            got,
            ref_pieces(&sizes, p),
            "case {case}: sizes {sizes:?} P {p}"
        );
        for (l, &s) in sizes.iter().enumerate() {
            let mut pos = 0;
            for &(_, a, b) in got.iter().filter(|x| x.0 == l) {
                assert_eq!(a, pos);
                assert!(b > a);
                pos = b;
            }
            assert_eq!(pos, s, "layer {l} covered");
        }
    }
}

#[test]
fn empty_pieces_are_skipped() {
    // n = 4, P = 8: both layers exceed n/P = 0.5 and are cut into 8 pieces, of which only
    // 3 (resp. 1) are non-empty.
    let lay = layout(&[3, 1]);
    let ps = deft::pieces(&lay, 8);
    assert_eq!(piece_sizes(&ps), vec![1, 1, 1, 1]);
}

#[test]
fn allocation_matches_the_reference_with_ties() {
    let mut rng = Rng::xorshift64star(11);
    for case in 0..500 {
        let l = 1 + rng.below(30) as usize;
        let sizes: Vec<u64> = (0..l).map(|_| 1 + rng.below(500)).collect();
        // small integer norms: exact sums (so subtraction and re-summing agree) and many ties
        let norms: Vec<f64> = (0..l).map(|_| rng.below(6) as f64).collect();
        let n: u64 = sizes.iter().sum();
        let k = 1 + rng.below(n);
        let pieces: Vec<Piece> = sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| Piece {
                layer: i,
                start: 0,
                end: s,
            })
            .collect();
        for topup in [false, true] {
            let got = deft::allocate_k(&pieces, &norms, k, topup);
            let want = ref_allocate(&sizes, &norms, k, topup);
            assert_eq!(
                got, want,
                "case {case} topup {topup}: sizes {sizes:?} norms {norms:?} k {k}"
            );
        }
    }
}

#[test]
fn allocation_bounds_hold() {
    let mut rng = Rng::xorshift64star(5);
    for case in 0..500 {
        let l = 1 + rng.below(40) as usize;
        let k = 1 + rng.below(2000);
        let norms: Vec<f64> = (0..l)
            .map(|_| rng.unit_f64() * 10f64.powf(rng.unit_f64() * 4.0 - 2.0))
            .collect();
        // pieces at least k long: the size clamp never binds
        let pieces: Vec<Piece> = (0..l)
            .map(|i| Piece {
                layer: i,
                start: 0,
                end: k + rng.below(1000),
            })
            .collect();
        let ks = deft::allocate_k(&pieces, &norms, k, false);
        let sum: u64 = ks.iter().sum();
        assert!(
            (k..k + l as u64).contains(&sum),
            "case {case}: Σk_x = {sum}, k = {k}, L = {l}"
        );
        for (x, p) in ks.iter().zip(&pieces) {
            assert!(*x >= 1 && *x <= p.end - p.start);
        }
        // with --topup: exactly k whenever L ≤ k ≤ n, also when sizes clamp
        let small: Vec<Piece> = (0..l)
            .map(|i| Piece {
                layer: i,
                start: 0,
                end: 1 + rng.below(200),
            })
            .collect();
        let n: u64 = small.iter().map(|p| p.end).sum();
        let k2 = l as u64 + rng.below(n - l as u64 + 1);
        let ks = deft::allocate_k(&small, &norms, k2, true);
        assert_eq!(ks.iter().sum::<u64>(), k2, "case {case}: topup");
        for (x, p) in ks.iter().zip(&small) {
            assert!(*x >= 1 && *x <= p.end - p.start);
        }
    }
}

#[test]
fn bin_packing_matches_the_reference_and_lpt_bound() {
    let mut rng = Rng::xorshift64star(3);
    for case in 0..400 {
        let l = 1 + rng.below(60) as usize;
        let p = 1 + rng.below(12) as usize;
        // few distinct sizes and ks: many equal costs, so the tie rules matter
        let sizes: Vec<u64> = (0..l)
            .map(|_| [1, 2, 8, 64, 100][rng.below(5) as usize])
            .collect();
        let ks: Vec<u64> = sizes.iter().map(|&s| 1 + rng.below(s.min(4))).collect();
        let pieces: Vec<Piece> = sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| Piece {
                layer: i,
                start: 0,
                end: s,
            })
            .collect();
        let got = deft::bin_pack(&pieces, &ks, p);
        let (want, loads) = ref_bin_pack(&sizes, &ks, p);
        assert_eq!(got, want, "case {case}: sizes {sizes:?} ks {ks:?} P {p}");
        assert!(
            got.iter().all(|&b| b < p),
            "each piece in one of the P bins"
        );
        let costs: Vec<f64> = sizes
            .iter()
            .zip(&ks)
            .map(|(&s, &k)| ref_cost(s, k))
            .collect();
        let total: f64 = costs.iter().sum();
        let largest = costs.iter().cloned().fold(0.0, f64::max);
        let max = loads.iter().cloned().fold(0.0, f64::max);
        assert!(
            max <= total / p as f64 + (1.0 - 1.0 / p as f64) * largest + 1e-9,
            "case {case}: LPT bound"
        );
        let got_loads = deft::bin_loads(&pieces, &ks, &got, p);
        for (a, b) in got_loads.iter().zip(&loads) {
            assert!((a - b).abs() <= 1e-9 * b.max(1.0));
        }
    }
}

/// Reference plan of one step: norms by a plain sum of squares, reference allocation and
/// packing, then worker = the r with (t + r) mod P = bin.
#[test]
fn plan_step_rotates_bins_and_tiles_every_layer() {
    let mut rng = Rng::xorshift64star(21);
    for case in 0..60 {
        let layers = 1 + rng.below(8) as usize;
        let sizes = random_sizes(&mut rng, layers);
        let n: u64 = sizes.iter().sum();
        let p = 1 + rng.below(10.min(n)) as usize;
        let lay = layout(&sizes);
        // small integers: every sum of squares is exact, so any summation order agrees
        let flat: Vec<f32> = (0..n).map(|i| ((i * 7919) % 13) as f32 - 6.0).collect();
        let k = 1 + rng.below(n);
        let step = rng.below(1000) as u32;
        let ps = deft::pieces(&lay, p);
        let rows = deft::plan_step(&lay, &ps, &flat, k, p, step, false);
        // reference
        let rp = ref_pieces(&sizes, p as u64);
        let norms: Vec<f64> = rp
            .iter()
            .map(|&(l, a, b)| {
                let off: u64 = sizes[..l].iter().sum();
                (off + a..off + b)
                    .map(|i| (flat[i as usize] as f64).powi(2))
                    .sum::<f64>()
                    .sqrt()
            })
            .collect();
        let psz: Vec<u64> = rp.iter().map(|x| x.2 - x.1).collect();
        let ks = deft::allocate_k(&ps, &norms, k, false);
        let (bins, _) = ref_bin_pack(&psz, &ks, p);
        assert_eq!(rows.len(), rp.len(), "case {case}: one row per piece");
        for r in &rows {
            let x = rp
                .iter()
                .position(|&(l, a, b)| l as u32 == r.layer_id && a == r.start && b == r.end)
                .expect("row is a piece");
            assert_eq!(
                bins[x],
                (step as usize + r.worker as usize) % p,
                "case {case}: rotation"
            );
            assert_eq!(r.k, Some(ks[x]));
            assert_eq!(r.step, step);
        }
        // tiling
        let mut rs: Vec<(u32, u64, u64)> =
            rows.iter().map(|r| (r.layer_id, r.start, r.end)).collect();
        rs.sort();
        for (l, &s) in sizes.iter().enumerate() {
            let mut pos = 0;
            for &(_, a, b) in rs.iter().filter(|x| x.0 == l as u32) {
                assert_eq!(a, pos, "case {case}: gap or overlap in layer {l}");
                pos = b;
            }
            assert_eq!(pos, s);
        }
    }
}

#[test]
fn norms_are_l2_norms_of_the_pieces() {
    let lay = layout(&[5, 3]);
    let ps = deft::pieces(&lay, 2); // 5 > 4: pieces [0,3) [3,5); 3 ≤ 4: whole
    assert_eq!(piece_sizes(&ps), vec![3, 2, 3]);
    let flat = [3.0, 0.0, 4.0, 1.0, 1.0, 0.0, 0.0, -2.0];
    let n = deft::piece_norms(&lay, &ps, &flat);
    assert_eq!(n, vec![5.0, 2f64.sqrt(), 2.0]);
}

/// Shared component plus per-rank noise, per-layer scales over two orders of magnitude.
fn synthetic(sizes: &[u64], ranks: usize, overlap: f64, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::xorshift64star(seed);
    let n: u64 = sizes.iter().sum();
    let scale: Vec<f64> = sizes
        .iter()
        .map(|_| 10f64.powf(rng.unit_f64() * 2.0 - 1.0))
        .collect();
    let shared: Vec<f64> = (0..n).map(|_| rng.normal_f64()).collect();
    (0..ranks)
        .map(|_| {
            let mut out = Vec::with_capacity(n as usize);
            let mut i = 0usize;
            for (l, &s) in sizes.iter().enumerate() {
                for _ in 0..s {
                    let z = overlap.sqrt() * shared[i] + (1.0 - overlap).sqrt() * rng.normal_f64();
                    out.push((scale[l] * z) as f32);
                    i += 1;
                }
            }
            out
        })
        .collect()
}

/// Top-k by a full sort (reference selection).
fn sort_topk(x: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..x.len() as u32).collect();
    idx.sort_by(|&a, &b| {
        x[b as usize]
            .abs()
            .total_cmp(&x[a as usize].abs())
            .then(a.cmp(&b))
    });
    idx.truncate(k);
    idx
}

#[test]
fn deft_has_no_gradient_build_up() {
    let sizes = [20_000, 200, 8_000, 100, 4_000, 50];
    let lay = layout(&sizes);
    let n: u64 = sizes.iter().sum();
    let k = n / 100;
    let mut planner = deft::DeftPlanner::new(&lay, 8, k, false, true);
    for step in 0..4u32 {
        let grads = synthetic(&sizes, 8, 0.2, 100 + step as u64);
        let st = planner.step(step, &grads, &sort_topk, true);
        let topk = st.union_topk.unwrap() as f64 / k as f64;
        let d = st.union_deft as f64 / k as f64;
        assert!(topk > 3.0, "step {step}: plain top-k union/k = {topk}");
        assert!(
            (0.95..=1.05).contains(&d),
            "step {step}: DEFT union/k = {d}"
        );
        // the union really is disjoint: reference union of the workers' selections
        let mut all = vec![];
        for r in &st.rows {
            let off = lay.layers[r.layer_id as usize].offset;
            let acc_len = (r.end - r.start) as usize;
            assert!(r.k.unwrap() as usize <= acc_len);
            all.push((off + r.start, off + r.end));
        }
        all.sort();
        assert!(all.windows(2).all(|w| w[0].1 <= w[1].0), "pieces disjoint");
    }
}

#[test]
fn error_feedback_accumulates_unselected_values() {
    // One layer, P = 1, k = 1: the largest entry is sent, the rest carries over.
    let lay = layout(&[3]);
    let mut pl = deft::DeftPlanner::new(&lay, 1, 1, false, true);
    let g = vec![vec![1.0f32, 2.0, 0.5]];
    let st = pl.step(0, &g, &sort_topk, false);
    assert_eq!(st.union_deft, 1);
    // residual now [1, 0, 0.5]; next acc = [2, 2, 1]: norms differ from step 0's gradient
    let g2 = vec![vec![1.0f32, 2.0, 0.5]];
    let st2 = pl.step(
        1,
        &g2,
        &|x: &[f32], k: usize| {
            assert_eq!(x, &[2.0, 2.0, 1.0]);
            sort_topk(x, k)
        },
        false,
    );
    assert_eq!(st2.ks, vec![1]);
    // without residuals the accumulator is the raw gradient
    let mut pl = deft::DeftPlanner::new(&lay, 1, 1, false, false);
    pl.step(0, &g, &sort_topk, false);
    pl.step(
        1,
        &g2,
        &|x: &[f32], k: usize| {
            assert_eq!(x, &[1.0, 2.0, 0.5]);
            sort_topk(x, k)
        },
        false,
    );
}

#[test]
fn leader_rotates_with_the_step() {
    let lay = layout(&[100, 100]);
    let mut pl = deft::DeftPlanner::new(&lay, 4, 10, false, false);
    let grads = synthetic(&[100, 100], 4, 0.5, 1);
    for step in 0..9u32 {
        assert_eq!(
            pl.step(step, &grads, &sort_topk, false).leader,
            step as usize % 4
        );
    }
}
