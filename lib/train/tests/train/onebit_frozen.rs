//! The compressed stage of 1-bit Adam/LAMB with a tiny frozen variance: the update ratio
//! m/(√v+η) is clipped to the bound every uncompressed Adam step obeys, so training on
//! digits with the default η = 1e-8 stays finite through the freeze.

use gradkit_comm::World;
use gradkit_train::model::ModelSpec;
use gradkit_train::optim::{adam_ratio_bound, OnebitAdam, OnebitLamb, OptConfig};
use gradkit_train::{train, TrainConfig};

/// Plain Adam moments without bias correction, written out here.
fn max_ratio(gs: &[f64], b1: f64, b2: f64) -> f64 {
    let (mut m, mut v, mut worst) = (0.0f64, 0.0f64, 0.0f64);
    for g in gs {
        m = b1 * m + (1.0 - b1) * g;
        v = b2 * v + (1.0 - b2) * g * g;
        if v > 1e-280 {
            // (below, g² would be subnormal and v inexact)
            worst = worst.max(m.abs() / v.sqrt());
        }
    }
    worst
}

#[test]
fn bound_holds_for_adam_and_is_tight() {
    for (b1, b2) in [(0.9f32, 0.999f32), (0.9, 0.99), (0.5, 0.9)] {
        let b = adam_ratio_bound(b1, b2).unwrap() as f64;
        let (f1, f2) = (b1 as f64, b2 as f64);
        // random gradient sequences (a small LCG) never exceed it
        let mut s = 12345u64;
        for _ in 0..50 {
            let gs: Vec<f64> = (0..300)
                .map(|_| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let u = (s >> 11) as f64 / (1u64 << 53) as f64;
                    (u - 0.5) * if u > 0.97 { 100.0 } else { 1.0 }
                })
                .collect();
            assert!(max_ratio(&gs, f1, f2) <= b * (1.0 + 1e-9));
        }
        // the Cauchy–Schwarz extremal sequence, g at age j ∝ (β1/β2)^j, reaches it
        // (2,000 terms: long enough for the series, short enough that g² stays normal)
        let t: i32 = 2_000;
        let gs: Vec<f64> = (0..t).map(|i| (f1 / f2).powi(t - 1 - i)).collect();
        let got = max_ratio(&gs, f1, f2);
        assert!((got - b).abs() / b < 1e-3, "β = ({b1}, {b2}): {got} vs {b}");
    }
    assert_eq!(adam_ratio_bound(0.99, 0.9), None, "β1² ≥ β2: no bound");
}

#[test]
fn compressed_step_clips_the_ratio_of_a_tiny_frozen_variance() {
    let cfg = OptConfig {
        method: "onebit-adam".parse().unwrap(),
        freeze_step: 1,
        ..OptConfig::default()
    };
    let bound = 0.1 / (0.001f64 * (1.0 - 0.81 / 0.999)).sqrt(); // β = (0.9, 0.999)
                                                                // entry 0 almost never active (g = 1e-6): v = 1e-15
    let mut w = vec![1.0f32, -2.0];
    let mut o = OnebitAdam::new(&cfg, 2);
    o.warmup_step(&mut w, &[1e-6, 0.5], 0.1);
    let before = w.clone();
    // a 1-bit momentum gives both entries the chunk's magnitude 0.05
    o.compressed_step(&mut w, vec![0.05, 0.05], 0.1);
    let d0 = (before[0] - w[0]) as f64;
    let d1 = (before[1] - w[1]) as f64;
    assert!(
        (d0 - 0.1 * bound).abs() < 1e-5,
        "step {d0}, want lr·bound = {}",
        0.1 * bound
    );
    // entry 1: v = 0.001·0.25, m/√v = 0.05/0.0158 = 3.16 < bound, unchanged
    let want1 = 0.1 * 0.05 / ((0.001f64 * 0.25).sqrt() + 1e-8);
    assert!((d1 - want1).abs() < 1e-5, "{d1} vs {want1}");

    // 1-bit LAMB: the same entry gets at most the bound before the layer coefficient
    let cfg = OptConfig {
        method: "onebit-lamb".parse().unwrap(),
        freeze_step: 1,
        ..OptConfig::default()
    };
    let mut o = OnebitLamb::new(&cfg, vec![(0, 2)], 2);
    let mut w = vec![1.0f32, -2.0];
    o.warmup_step(&mut w, &[1e-6, 0.5], 0.1, 0);
    let m = o.local_momentum(&[1e-6, 0.5]);
    let before = w.clone();
    o.compressed_step(&mut w, vec![m[1], m[1]], 0.1);
    let coeff = (o.r_prev[0] * o.c_avg[0]) as f64;
    let d0 = (before[0] - w[0]) as f64;
    assert!(
        (d0 - 0.1 * coeff * bound).abs() < 1e-5,
        "{d0} vs {}",
        0.1 * coeff * bound
    );
}

#[test]
fn onebit_optimisers_on_digits_stay_finite_with_the_default_eps() {
    // Before the clip, both diverged (loss NaN) a few steps after the freeze.
    let w = World::local(4);
    for (opt, lr) in [("onebit-lamb", 0.02f32), ("onebit-adam", 0.003)] {
        let cfg = TrainConfig {
            model: ModelSpec {
                name: "mlp".into(),
                ..ModelSpec::default()
            },
            exchange: "onebit".parse().unwrap(),
            opt: OptConfig {
                method: opt.parse().unwrap(),
                freeze_step: 80,
                ..OptConfig::default()
            },
            lr,
            steps: 110,
            batch: 32,
            seed: 1,
            check_every: 0,
            ..TrainConfig::default()
        };
        assert_eq!(cfg.opt.eps, 1e-8);
        let rep = train(&w, &cfg)
            .unwrap_or_else(|e| panic!("{opt}: {e}"))
            .unwrap();
        assert!(
            rep.final_loss.is_finite() && rep.final_loss < 0.5,
            "{opt}: {}",
            rep.final_loss
        );
        assert!(
            rep.eval_accuracy > 0.9,
            "{opt}: accuracy {}",
            rep.eval_accuracy
        );
    }
}
