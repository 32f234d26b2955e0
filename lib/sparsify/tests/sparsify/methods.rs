//! Every selection method against independent references (a stable full sort, a plain
//! filter), on adversarial inputs; Ok-Topk's re-evaluation schedule; random-k's shared seed;
//! DEFT's ranges; error-feedback conservation.

use gradkit_sparsify::{deft, k_for, Adjust, Bands, Method, Residual, Selector};
use rand::{Rng, SeedableRng};

fn ref_topk(x: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..x.len() as u32).collect();
    idx.sort_by(|&a, &b| x[b as usize].abs().total_cmp(&x[a as usize].abs()));
    let mut top = idx[..k.min(x.len())].to_vec();
    top.sort_unstable();
    top
}

fn ref_above(x: &[f32], th: f32) -> Vec<u32> {
    (0..x.len() as u32)
        .filter(|&i| x[i as usize].abs() > th)
        .collect()
}

fn heavy(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let u: f32 = rng.gen::<f32>().max(1e-7);
            let s = if rng.gen::<bool>() { 1.0 } else { -1.0 };
            s * u.powf(-1.2) * 1e-3
        })
        .collect()
}

fn adversarial() -> Vec<Vec<f32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    vec![
        vec![0.5],
        vec![0.0],
        vec![2.0; 40],
        vec![0.0; 40],
        (0..100).map(|i| -(i as f32) * 0.25 - 0.5).collect(),
        (0..300).map(|_| rng.gen_range(-2i32..=2) as f32).collect(),
        (0..300)
            .map(|i| if i % 7 == 0 { 1.5 } else { 0.0 })
            .collect(),
        heavy(3000, 9),
        heavy(150_000, 10),
    ]
}

fn check_threshold_or_topk(x: &[f32], k: usize, s: &gradkit_sparsify::Selected, what: &str) {
    let th = s.info.threshold.expect("threshold reported");
    if s.info.exact_topk {
        assert_eq!(s.indices, ref_topk(x, k), "{what}: exact top-k");
        let mut a: Vec<f32> = x.iter().map(|v| v.abs()).collect();
        a.sort_by(|p, q| q.total_cmp(p));
        assert_eq!(th, a[k - 1], "{what}: k-th largest");
    } else {
        assert_eq!(s.indices, ref_above(x, th), "{what}: set == {{|x| > th}}");
    }
    for (i, v) in s.indices.iter().zip(&s.values) {
        assert_eq!(x[*i as usize], *v, "{what}: values are the acc values");
    }
}

#[test]
fn topk_and_threshold_methods_match_references() {
    for x in adversarial() {
        let n = x.len();
        for k in [1, 2, n / 3, n / 100, n] {
            let k = k.clamp(1, n);
            let s = Selector::new(Method::Topk, 0).select(0, &x, k);
            assert_eq!(s.indices, ref_topk(&x, k), "topk n={n} k={k}");
            check_threshold_or_topk(&x, k, &s, "topk");

            let s = Selector::new(Method::Threshold(0.75), 0).select(0, &x, k);
            assert_eq!(s.indices, ref_above(&x, 0.75));

            let s = Selector::new(Method::GaussianK, 0).select(0, &x, k);
            check_threshold_or_topk(&x, k, &s, &format!("gaussiank n={n} k={k}"));
            let nonzero = x.iter().filter(|v| **v != 0.0).count();
            assert!(
                s.indices.len() >= (3 * k).div_ceil(4).min(nonzero),
                "gaussiank keeps at least 3k/4: n={n} k={k} got {}",
                s.indices.len()
            );

            for sample in [0.01, 0.3] {
                let s = Selector::new(Method::Dgc { sample }, 0).select(0, &x, k);
                check_threshold_or_topk(&x, k, &s, &format!("dgc n={n} k={k}"));
                assert!(s.indices.len() as f64 <= 1.3 * k as f64 || !s.info.exact_topk);
                if s.info.exact_topk {
                    assert_eq!(s.indices.len(), k);
                }
            }
        }
    }
}

#[test]
fn empty_input_selects_nothing() {
    for m in [
        Method::Topk,
        Method::GaussianK,
        Method::Dgc { sample: 0.01 },
        Method::RandomK { seed: 1 },
        Method::OkTopk {
            reeval: 4,
            adjust: Adjust::Paper,
        },
    ] {
        let s = Selector::new(m, 0).select(0, &[], 0);
        assert!(s.indices.is_empty());
    }
    assert_eq!(k_for(0.5, 0), 0);
    assert_eq!(k_for(0.001, 10), 1);
    assert_eq!(k_for(1.0, 10), 10);
    assert_eq!(k_for(0.25, 10), 2);
}

/// A slowly drifting sequence of accumulators, as a training run gives.
fn drifting(steps: usize, n: usize) -> Vec<Vec<f32>> {
    let base = heavy(n, 42);
    (0..steps)
        .map(|t| {
            let noise = heavy(n, 100 + t as u64);
            base.iter().zip(&noise).map(|(b, e)| b + 0.3 * e).collect()
        })
        .collect()
}

#[test]
fn oktopk_reeval_1_equals_topk() {
    let accs = drifting(6, 20_000);
    let k = 200;
    let mut ok = Selector::new(
        Method::OkTopk {
            reeval: 1,
            adjust: Adjust::Paper,
        },
        0,
    );
    for (t, a) in accs.iter().enumerate() {
        assert_eq!(
            ok.select(t as u32, a, k).indices,
            ref_topk(a, k),
            "step {t}"
        );
    }
}

#[test]
fn oktopk_reeval_4_reuses_last_exact_threshold() {
    let accs = drifting(10, 20_000);
    let k = 200;
    let mut ok = Selector::new(
        Method::OkTopk {
            reeval: 4,
            adjust: Adjust::Paper,
        },
        0,
    );
    let mut last_exact = None;
    for (t, a) in accs.iter().enumerate() {
        let s = ok.select(t as u32, a, k);
        if t % 4 == 0 {
            assert!(s.info.exact_topk, "step {t} re-evaluates");
            assert_eq!(s.indices, ref_topk(a, k));
            let mut m: Vec<f32> = a.iter().map(|v| v.abs()).collect();
            m.sort_by(|p, q| q.total_cmp(p));
            assert_eq!(s.info.threshold, Some(m[k - 1]));
            last_exact = s.info.threshold;
        } else {
            assert!(!s.info.exact_topk);
            assert_eq!(s.info.threshold, last_exact, "step {t} reuses");
            assert_eq!(s.indices, ref_above(a, last_exact.unwrap()));
        }
    }
}

#[test]
fn oktopk_adjust_keeps_set_equal_to_reported_threshold() {
    // Growing magnitudes push the count above the bands: the threshold must move up.
    let base = heavy(20_000, 5);
    let k = 200;
    let mut ok = Selector::new(
        Method::OkTopk {
            reeval: 100,
            adjust: Adjust::Reference(Bands::VGG),
        },
        0,
    );
    let mut ths = Vec::new();
    for t in 0..8 {
        let a: Vec<f32> = base.iter().map(|v| v * (1.0 + 0.2 * t as f32)).collect();
        let s = ok.select(t, &a, k);
        check_threshold_or_topk(&a, k, &s, &format!("oktopk --adjust step {t}"));
        ths.push(s.info.threshold.unwrap());
    }
    assert!(ths[7] > ths[0] * 1.1, "threshold rose: {ths:?}");
}

#[test]
fn randomk_same_across_ranks_differs_across_steps() {
    let n = 10_000;
    let k = 100;
    let a = heavy(n, 1);
    let b = heavy(n, 2);
    let mut r0 = Selector::new(Method::RandomK { seed: 7 }, 0);
    let mut r1 = Selector::new(Method::RandomK { seed: 7 }, 0);
    let mut prev: Option<Vec<u32>> = None;
    for t in 0..5 {
        let s0 = r0.select(t, &a, k);
        let s1 = r1.select(t, &b, k);
        assert_eq!(s0.indices, s1.indices, "same indices on every rank");
        assert_eq!(s0.indices.len(), k);
        assert!(s0.indices.windows(2).all(|w| w[0] < w[1]));
        assert!(s0.indices.iter().all(|&i| (i as usize) < n));
        if let Some(p) = &prev {
            assert_ne!(p, &s0.indices, "different at step {t}");
        }
        prev = Some(s0.indices);
    }
    let other_layer = Selector::new(Method::RandomK { seed: 7 }, 1).select(0, &a, k);
    let first = Selector::new(Method::RandomK { seed: 7 }, 0).select(0, &a, k);
    assert_ne!(other_layer.indices, first.indices);
    assert_eq!(
        Selector::new(Method::RandomK { seed: 7 }, 0)
            .select(0, &a, n)
            .indices
            .len(),
        n
    );
}

#[test]
fn deft_ranges_match_per_range_sort() {
    let x = heavy(5000, 11);
    let ranges = [
        (3000, 5000, 40),
        (0, 1, 1),
        (1, 1, 0),
        (10, 2000, 25),
        (2000, 2001, 3),
    ];
    let got = deft::select_in_ranges(&x, &ranges);
    let mut want = Vec::new();
    for &(s, e, k) in &ranges {
        want.extend(ref_topk(&x[s..e], k).into_iter().map(|i| i + s as u32));
    }
    want.sort_unstable();
    assert_eq!(got, want);
}

#[test]
fn error_feedback_conserves_the_gradient_sum() {
    let n = 30_000;
    let steps = 8;
    for method in [
        Method::Topk,
        Method::OkTopk {
            reeval: 3,
            adjust: Adjust::Reference(Bands::LSTM),
        },
        Method::GaussianK,
        Method::Dgc { sample: 0.01 },
        Method::RandomK { seed: 3 },
    ] {
        let mut sel = Selector::new(method.clone(), 0);
        let mut res = Residual::zeros(n);
        let mut sum_g = vec![0f64; n];
        let mut sum_sel = vec![0f64; n];
        for t in 0..steps {
            let g = heavy(n, 1000 + t);
            for (s, v) in sum_g.iter_mut().zip(&g) {
                *s += *v as f64;
            }
            let mut acc = g.clone();
            res.compensate(&mut acc);
            let s = sel.select(t as u32, &acc, 300);
            for (i, v) in s.indices.iter().zip(&s.values) {
                sum_sel[*i as usize] += *v as f64;
            }
            res.update(acc, &s.indices);
        }
        let scale: f64 = sum_g.iter().map(|v| v.abs()).fold(0.0, f64::max);
        for i in 0..n {
            let lhs = sum_g[i];
            let rhs = sum_sel[i] + res.values[i] as f64;
            assert!(
                (lhs - rhs).abs() <= 1e-5 * scale,
                "{}: index {i}: {lhs} vs {rhs}",
                method.name()
            );
        }
    }
}
