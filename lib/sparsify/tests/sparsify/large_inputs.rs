//! The parallel and sampled paths (inputs of more than two 2^18-element chunks, and Gaussiank's
//! one-pass candidate ladder with its fallback) against independent references: a plain filter,
//! a full sort, and the Gaussian fit recomputed in f64 in the test.

use gradkit_sparsify::{gaussiank, threshold, topk, Method, Selector};
use rand::{Rng, SeedableRng};

const N: usize = 600_000;

fn heavy(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let u: f32 = rng.gen::<f32>().max(1e-7);
            let s = if rng.gen::<bool>() { 1.0 } else { -1.0 };
            s * (u.powf(-0.5) - 1.0) * 1e-3
        })
        .collect()
}

fn normal(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let u: f64 = rng.gen::<f64>().max(1e-300);
            let v: f64 = rng.gen();
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect()
}

fn filter(x: &[f32], th: f32) -> (Vec<u32>, Vec<f32>) {
    let mut i = Vec::new();
    let mut v = Vec::new();
    for (j, &xj) in x.iter().enumerate() {
        if xj.abs() > th {
            i.push(j as u32);
            v.push(xj);
        }
    }
    (i, v)
}

fn inputs() -> Vec<Vec<f32>> {
    let mut v = vec![heavy(N, 1), normal(N, 2)];
    // Outliers that the fit sees and a sample mostly does not: the ladder runs long and may go
    // below the candidate floor (the full-pass fallback).
    for (s, big) in [(3u64, 1e4f32), (4, 1e6), (5, 3e3)] {
        let mut x = normal(N, s);
        x[N / 3 + 17] = big;
        x[N - 5] = -big;
        v.push(x);
    }
    // Ties, zeros and NaN inside a large input.
    let mut x: Vec<f32> = (0..N).map(|i| ((i % 7) as f32) - 3.0).collect();
    x[1000] = f32::NAN;
    x[N - 1] = f32::NAN;
    for e in x.iter_mut().skip(5).step_by(11) {
        *e = 0.0;
    }
    v.push(x);
    v
}

#[test]
fn parallel_threshold_passes_match_filter() {
    for x in inputs() {
        let mut keys: Vec<f32> = x.iter().filter(|v| !v.is_nan()).map(|v| v.abs()).collect();
        keys.sort_by(|a, b| b.partial_cmp(a).unwrap());
        for th in [keys[0], keys[N / 100], keys[N / 3], 0.0, -1.0] {
            let (ri, rv) = filter(&x, th);
            assert_eq!(threshold::above(&x, th), ri);
            let (i, v) = threshold::above_with_values(&x, th);
            assert_eq!(i, ri);
            assert_eq!(
                v.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                rv.iter().map(|f| f.to_bits()).collect::<Vec<_>>()
            );
            assert_eq!(threshold::count_above(&x, th), ri.len());
        }
    }
}

#[test]
fn parallel_topk_with_values_matches_sort() {
    for x in inputs().into_iter().take(3) {
        let k = N / 100;
        let mut idx: Vec<u32> = (0..N as u32).collect();
        idx.sort_by(|&a, &b| {
            x[b as usize]
                .abs()
                .partial_cmp(&x[a as usize].abs())
                .unwrap()
        });
        let mut top = idx[..k].to_vec();
        top.sort_unstable();
        let (i, v, th) = topk::topk_with_values(&x, k);
        assert_eq!(i, top);
        let want: Vec<f32> = top.iter().map(|&j| x[j as usize]).collect();
        assert_eq!(v, want);
        assert_eq!(th, Some(x[idx[k - 1] as usize].abs()));
    }
}

#[test]
fn gaussiank_large_follows_the_halving_rule() {
    // Φ⁻¹(1 − 0.01/2), for density k/n = 0.01 exactly.
    const Z: f64 = 2.575_829_303_548_900_4;
    for x in inputs().into_iter().take(5) {
        let k = N / 100;
        let need = (3 * k).div_ceil(4);
        let n = N as f64;
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        let fit = mean.abs() + Z * var.sqrt();
        let mut sel = Selector::new(Method::GaussianK, 0);
        let s = sel.select(0, &x, k);
        let th = s.info.threshold.unwrap();
        // The set is exactly the filter at the reported threshold, values included.
        let (ri, rv) = filter(&x, th);
        assert_eq!(s.indices, ri);
        assert_eq!(s.values, rv);
        assert_eq!(gaussiank::select(&x, k), (ri.clone(), th));
        // th is the fit halved j times, the first halving with ⌈3k/4⌉ entries above it.
        let j = (fit / th as f64).log2().round();
        assert!((0.0..64.0).contains(&j), "fit {fit} th {th}");
        let rel = (th as f64 * 2f64.powi(j as i32) - fit).abs() / fit;
        assert!(rel < 1e-5, "th {th} is not fit {fit} / 2^{j}");
        assert!(ri.len() >= need, "{} < {need}", ri.len());
        if j > 0.0 {
            assert!(
                filter(&x, th * 2.0).0.len() < need,
                "a higher halving already passed"
            );
        }
    }
}
