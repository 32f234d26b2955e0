//! The closed-loop diagnostics: `xi` (Ok-Topk's Assumption 1 constant, `--xi`) and the
//! optimisers' `variance_norm` / `variance_fresh_norm`, each recomputed here from the run's
//! own recorded gradients (`record_gradients`) by a separate implementation of the papers'
//! formulas.

use gradkit_comm::World;
use gradkit_core::{MetricRow, TensorRow};
use gradkit_train::model::ModelSpec;
use gradkit_train::optim::OptConfig;
use gradkit_train::{train, TrainConfig, TrainReport};

fn tiny(exchange: &str, opt: &str, steps: u32) -> TrainConfig {
    TrainConfig {
        model: ModelSpec {
            name: "mlp".into(),
            hidden: 16,
            ..ModelSpec::default()
        },
        exchange: exchange.parse().unwrap(),
        density: 0.05,
        opt: OptConfig {
            method: opt.parse().unwrap(),
            freeze_step: 3,
            ..OptConfig::default()
        },
        lr: if opt == "sgd" { 0.1 } else { 0.003 },
        steps,
        batch: 8,
        seed: 5,
        record_gradients: true,
        ..TrainConfig::default()
    }
}

fn run(p: usize, cfg: &TrainConfig) -> TrainReport {
    train(&World::local(p), cfg).unwrap().unwrap()
}

fn metric(rows: &[MetricRow], name: &str, step: u32, rank: u32) -> Option<f64> {
    rows.iter()
        .find(|m| m.metric == name && m.step == step && m.rank == rank)
        .map(|m| m.value)
}

/// Rank `rank`'s flat gradient of `step` (layers in layout order).
fn grad(rows: &[TensorRow], step: u32, rank: u32) -> Vec<f64> {
    let mut mine: Vec<&TensorRow> = rows
        .iter()
        .filter(|r| r.step == step && r.rank == rank)
        .collect();
    mine.sort_by_key(|r| r.layer_id);
    mine.iter()
        .flat_map(|r| r.values.iter().map(|v| *v as f64))
        .collect()
}

fn l2(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()) + 1e-30
}

#[test]
fn variance_norm_is_the_second_moment_of_the_mean_gradient() {
    // v_t = β2·v_{t−1} + (1−β2)·ḡ_t², ḡ the mean over ranks (Adam keeps v without its bias
    // correction, LAMB has none): its norm after every step.
    let p = 2;
    for opt in ["lamb", "adam"] {
        let cfg = tiny("dense", opt, 5);
        let rep = run(p, &cfg);
        let b2 = cfg.opt.beta2 as f64;
        let mut v = vec![0.0f64; rep.n_params];
        for step in 0..cfg.steps {
            let (g0, g1) = (grad(&rep.gradients, step, 0), grad(&rep.gradients, step, 1));
            for (i, vi) in v.iter_mut().enumerate() {
                let g = (g0[i] + g1[i]) / 2.0;
                *vi = b2 * *vi + (1.0 - b2) * g * g;
            }
            for r in 0..p as u32 {
                let got = metric(&rep.metrics, "variance_norm", step, r).unwrap();
                assert!(
                    close(got, l2(&v), 1e-4),
                    "{opt} step {step} rank {r}: variance_norm {got}, recomputed {}",
                    l2(&v)
                );
            }
        }
    }
    let sgd = run(1, &tiny("dense", "sgd", 2));
    assert!(
        metric(&sgd.metrics, "variance_norm", 0, 0).is_none(),
        "SGD has no v"
    );
}

#[test]
fn onebit_lamb_freezes_variance_norm_and_tracks_the_fresh_copy() {
    let cfg = tiny("onebit", "onebit-lamb", 6);
    let rep = run(2, &cfg);
    let b2 = cfg.opt.beta2 as f64;
    let freeze = cfg.opt.freeze_step;
    // the warm-up is LAMB on the allreduced gradient
    let mut v = vec![0.0f64; rep.n_params];
    for step in 0..freeze {
        let (g0, g1) = (grad(&rep.gradients, step, 0), grad(&rep.gradients, step, 1));
        for (i, vi) in v.iter_mut().enumerate() {
            let g = (g0[i] + g1[i]) / 2.0;
            *vi = b2 * *vi + (1.0 - b2) * g * g;
        }
        let got = metric(&rep.metrics, "variance_norm", step, 0).unwrap();
        assert!(close(got, l2(&v), 1e-4), "step {step}: {got} vs {}", l2(&v));
    }
    let frozen = l2(&v);
    let fresh_at_freeze = metric(&rep.metrics, "variance_fresh_norm", freeze - 1, 0).unwrap();
    assert!(
        close(fresh_at_freeze, frozen, 1e-4),
        "the fresh copy starts at v"
    );
    for step in freeze..cfg.steps {
        let got = metric(&rep.metrics, "variance_norm", step, 0).unwrap();
        assert!(
            close(got, frozen, 1e-6),
            "step {step}: frozen v moved to {got}"
        );
        let fresh = metric(&rep.metrics, "variance_fresh_norm", step, 0).unwrap();
        assert!(
            fresh.is_finite() && fresh != got,
            "step {step}: the fresh v keeps changing"
        );
    }
}

/// Top-k by magnitude of `x` as a dense vector.
fn topk_dense(x: &[f64], k: usize) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[b].abs().total_cmp(&x[a].abs()));
    let mut out = vec![0.0; x.len()];
    for &i in &order[..k] {
        out[i] = x[i];
    }
    out
}

#[test]
fn xi_matches_a_replay_of_topk_with_error_feedback() {
    // TopkA with Algorithm 2 and SGD: acc_i = ε_i + lr·G_i, u = Σ_i Top_k(acc_i), ε_i = acc_i
    // without its selection; ξ = ‖Top_k(mean acc) − u/P‖ / ‖mean lr·G‖, replayed from the
    // recorded gradients (the run's own, so the parameters need not be replayed).
    let p = 3usize;
    let mut cfg = tiny("topk", "sgd", 6);
    cfg.xi = true;
    let rep = run(p, &cfg);
    let n = rep.n_params;
    let k = ((cfg.density * n as f64).floor() as usize).max(1);
    let lr = cfg.lr as f64;
    let mut eps = vec![vec![0.0f64; n]; p];
    for step in 0..cfg.steps {
        let mut u = vec![0.0f64; n];
        let mut mean_acc = vec![0.0f64; n];
        let mut mean_g = vec![0.0f64; n];
        for (r, e) in eps.iter_mut().enumerate() {
            let g = grad(&rep.gradients, step, r as u32);
            let acc: Vec<f64> = e.iter().zip(&g).map(|(e, g)| e + lr * g).collect();
            let sel = topk_dense(&acc, k);
            for i in 0..n {
                u[i] += sel[i];
                mean_acc[i] += acc[i] / p as f64;
                mean_g[i] += lr * g[i] / p as f64;
                e[i] = if sel[i] != 0.0 { 0.0 } else { acc[i] };
            }
        }
        let top = topk_dense(&mean_acc, k);
        let diff: Vec<f64> = top.iter().zip(&u).map(|(t, u)| t - u / p as f64).collect();
        let want = l2(&diff) / l2(&mean_g);
        for r in 0..p as u32 {
            let got = metric(&rep.metrics, "xi", step, r).unwrap();
            assert!(
                close(got, want, 1e-3),
                "step {step} rank {r}: xi {got}, replay {want}"
            );
        }
        if step > 0 {
            assert!(want > 0.0, "step {step}: a nontrivial case");
        }
    }
}

#[test]
fn xi_changes_neither_the_training_nor_the_bytes() {
    for ex in ["oktopk", "topk"] {
        let plain = run(4, &tiny(ex, "sgd", 5));
        let mut cfg = tiny(ex, "sgd", 5);
        cfg.xi = true;
        cfg.dense_warmup = 2;
        let mut base = tiny(ex, "sgd", 5);
        base.dense_warmup = 2;
        let (with, without) = (run(4, &cfg), run(4, &base));
        assert_eq!(with.params, without.params, "{ex}");
        for step in 0..5 {
            for r in 0..4 {
                assert_eq!(
                    metric(&with.metrics, "bytes_sent", step, r),
                    metric(&without.metrics, "bytes_sent", step, r),
                    "{ex} step {step} rank {r}"
                );
                let xi = metric(&with.metrics, "xi", step, r);
                // dense warm-up steps have no sparse result to measure
                assert_eq!(xi.is_some(), step >= 2, "{ex} step {step}");
                assert!(xi.is_none_or(|x| x.is_finite() && x >= 0.0));
            }
        }
        assert!(
            metric(&plain.metrics, "xi", 0, 0).is_none(),
            "only with --xi"
        );
    }
}

#[test]
fn xi_at_full_density_is_zero() {
    // k = n: Top_k(mean acc) is mean acc and the sum of everything is u/P.
    let mut cfg = tiny("oktopk", "sgd", 4);
    cfg.density = 1.0;
    cfg.xi = true;
    let rep = run(2, &cfg);
    for step in 0..4 {
        let xi = metric(&rep.metrics, "xi", step, 0).unwrap();
        assert!(xi < 1e-5, "step {step}: {xi}");
    }
}

#[test]
fn xi_is_refused_where_it_means_nothing() {
    let mut cfg = tiny("ring", "sgd", 2);
    cfg.xi = true;
    let err = train(&World::local(2), &cfg).unwrap_err().to_string();
    assert!(err.contains("--xi") && err.contains("`ring`"), "{err}");
}
