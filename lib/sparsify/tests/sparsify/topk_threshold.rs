//! Top-k and threshold selection against independent references: a full stable sort and a
//! plain filter, on adversarial inputs.

use gradkit_sparsify::{threshold, topk};
use rand::{Rng, SeedableRng};

/// Reference: stable sort of indices by |x| descending (ties keep lower index first).
fn ref_topk(x: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..x.len() as u32).collect();
    idx.sort_by(|&a, &b| {
        x[b as usize]
            .abs()
            .partial_cmp(&x[a as usize].abs())
            .unwrap()
    });
    let mut top = idx[..k.min(x.len())].to_vec();
    top.sort_unstable();
    top
}

fn ref_kth(x: &[f32], k: usize) -> f32 {
    let mut a: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    a.sort_by(|p, q| q.partial_cmp(p).unwrap());
    a[k - 1]
}

fn ref_above(x: &[f32], th: f32) -> Vec<u32> {
    let mut v = Vec::new();
    for (i, xi) in x.iter().enumerate() {
        if xi.abs() > th {
            v.push(i as u32);
        }
    }
    v
}

fn inputs() -> Vec<Vec<f32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut v = vec![
        vec![],
        vec![0.0],
        vec![-3.0],
        vec![1.0; 17],
        vec![0.0; 33],
        vec![-0.0, 0.0, -0.0, 0.0],
        (0..50).map(|i| -(i as f32) - 1.0).collect(),
        (0..64).map(|i| ((i % 3) as f32) - 1.0).collect(),
    ];
    v.push((0..1000).map(|_| rng.gen_range(-4i32..=4) as f32).collect());
    v.push((0..5000).map(|_| rng.gen::<f32>() - 0.5).collect());
    // heavy tail
    v.push(
        (0..200_000)
            .map(|_| {
                let u: f32 = rng.gen::<f32>().max(1e-7);
                let s = if rng.gen::<bool>() { 1.0 } else { -1.0 };
                s * u.powf(-1.5) * 1e-3
            })
            .collect(),
    );
    v
}

#[test]
fn topk_matches_full_sort() {
    for x in inputs() {
        let n = x.len();
        let mut ks = vec![0, 1, 2, n / 2, n.saturating_sub(1), n, n + 3];
        ks.push(n / 100 + 1);
        for k in ks {
            assert_eq!(topk::topk_indices(&x, k), ref_topk(&x, k), "n={n} k={k}");
            if k >= 1 && k <= n {
                assert_eq!(topk::kth_largest_abs(&x, k), ref_kth(&x, k), "n={n} k={k}");
            }
        }
    }
}

#[test]
fn above_matches_filter() {
    for x in inputs() {
        for th in [-1.0, 0.0, 0.5, 1.0, 2.0, 1e-3, f32::INFINITY] {
            assert_eq!(threshold::above(&x, th), ref_above(&x, th));
        }
        if !x.is_empty() {
            let th = ref_kth(&x, x.len().div_ceil(2));
            assert_eq!(threshold::above(&x, th), ref_above(&x, th));
        }
    }
}
