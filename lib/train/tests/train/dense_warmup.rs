//! `dense_warmup` (gradtrain --dense-warmup N): the first N steps of a sparse exchange are
//! exactly `--exchange dense`, later steps are the sparse exchange.

use gradkit_comm::World;
use gradkit_core::MetricRow;
use gradkit_train::model::ModelSpec;
use gradkit_train::optim::OptConfig;
use gradkit_train::{train, TrainConfig, TrainReport};

fn tiny(exchange: &str, opt: &str) -> TrainConfig {
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
            momentum: if opt == "sgd" { 0.9 } else { 0.0 },
            ..OptConfig::default()
        },
        lr: if opt == "sgd" { 0.1 } else { 0.003 },
        steps: 6,
        batch: 8,
        seed: 3,
        check_every: 1,
        ..TrainConfig::default()
    }
}

fn run(world: &World, cfg: &TrainConfig) -> TrainReport {
    train(world, cfg).unwrap().unwrap()
}

fn metric(rows: &[MetricRow], name: &str, step: u32, rank: u32) -> f64 {
    rows.iter()
        .find(|m| m.metric == name && m.step == step && m.rank == rank)
        .unwrap_or_else(|| panic!("no {name} at step {step} rank {rank}"))
        .value
}

#[test]
fn warmup_covering_the_run_equals_dense_exactly() {
    let w = World::local(3);
    for opt in ["sgd", "adam"] {
        let dense = run(&w, &tiny("dense", opt));
        for ex in ["topk", "oktopk", "deft", "gtopk"] {
            for warm in [6, 100] {
                let mut cfg = tiny(ex, opt);
                cfg.dense_warmup = warm;
                let got = run(&w, &cfg);
                assert_eq!(
                    got.params, dense.params,
                    "{ex}/{opt} with dense_warmup {warm} ≥ steps must be bit-identical to dense"
                );
                for step in 0..6 {
                    for r in 0..3 {
                        assert_eq!(
                            metric(&got.metrics, "loss", step, r),
                            metric(&dense.metrics, "loss", step, r)
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn warmup_steps_send_dense_bytes_then_sparse_bytes() {
    let p = 4u32;
    let w = World::local(p as usize);
    let warm = 3;
    for ex in ["oktopk", "topk", "deft"] {
        let mut cfg = tiny(ex, "sgd");
        cfg.dense_warmup = warm;
        let rep = run(&w, &cfg);
        let n = rep.n_params as f64;
        // ring allreduce of fp32: each rank sends 2(P−1) chunks of ≈ n/P floats
        let ring = 2.0 * (p as f64 - 1.0) / p as f64 * 4.0 * n;
        for step in 0..cfg.steps {
            for r in 0..p {
                let b = metric(&rep.metrics, "bytes_sent", step, r);
                let nnz = metric(&rep.metrics, "nnz", step, r);
                if step < warm {
                    assert!(
                        (b - ring).abs() <= 8.0 * p as f64,
                        "{ex}: warm-up step {step} rank {r} sent {b} bytes, dense ring sends {ring}"
                    );
                    assert_eq!(nnz, n, "{ex}: warm-up step carries every entry");
                } else {
                    assert!(
                        b < ring / 4.0,
                        "{ex}: sparse step {step} rank {r} sent {b} bytes (dense {ring})"
                    );
                    assert!(nnz < n / 2.0, "{ex}: sparse step {step} has nnz {nnz}");
                }
            }
        }
        // the sparse phase really differs from training densely all the way
        let dense = run(&w, &tiny("dense", "sgd"));
        assert_ne!(rep.params, dense.params, "{ex}");
    }
}

#[test]
fn momentum_carries_over_into_the_sparse_phase() {
    // One rank at density 1: the sparse exchange keeps everything, so SGD with momentum
    // after the warm-up must continue exactly as dense SGD with momentum would (up to the
    // rounding of Algorithm 2's lr folding); dropping the momentum buffer at the switch
    // would not.
    let w = World::local(1);
    let dense = run(&w, &tiny("dense", "sgd"));
    for ex in ["oktopk", "topk"] {
        let mut cfg = tiny(ex, "sgd");
        cfg.density = 1.0;
        cfg.dense_warmup = 3;
        let got = run(&w, &cfg);
        let worst = got
            .params
            .iter()
            .zip(&dense.params)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{ex}: differs from dense SGD by {worst}");
    }
}

#[test]
fn warmup_is_refused_where_it_means_nothing() {
    let w = World::local(2);
    let mut cfg = tiny("onebit", "onebit-lamb");
    cfg.dense_warmup = 2;
    let err = train(&w, &cfg).unwrap_err().to_string();
    assert!(err.contains("--dense-warmup"), "{err}");
}
