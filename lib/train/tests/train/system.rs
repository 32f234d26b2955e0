//! End-to-end properties of the training loop on small models (a few steps each):
//! equivalences with independent references, exact resume, checksums.

use gradkit_comm::World;
use gradkit_train::data::{load, Shard};
use gradkit_train::model::{Model, ModelSpec};
use gradkit_train::optim::OptConfig;
use gradkit_train::{train, TrainConfig};

fn tiny_mlp(exchange: &str, opt: &str) -> TrainConfig {
    TrainConfig {
        model: ModelSpec {
            name: "mlp".into(),
            hidden: 16,
            ..ModelSpec::default()
        },
        exchange: exchange.parse().unwrap(),
        opt: OptConfig {
            method: opt.parse().unwrap(),
            ..OptConfig::default()
        },
        lr: 0.1,
        steps: 6,
        batch: 8,
        seed: 5,
        check_every: 1,
        ..TrainConfig::default()
    }
}

fn params(world: &World, cfg: &TrainConfig) -> Vec<f32> {
    train(world, cfg).unwrap().unwrap().params
}

/// Plain single-process SGD written out here: w -= lr·g on rank 0's batches.
fn reference_sgd(cfg: &TrainConfig) -> Vec<f32> {
    let ds = load(&cfg.data).unwrap();
    let model = Model::new(&cfg.model, &ds, cfg.seed).unwrap();
    let shard = Shard::new(&ds, 0, 1, cfg.batch, cfg.model.seq_len).unwrap();
    let mut w = model.get_flat().unwrap();
    for step in 0..cfg.steps {
        let (_, g) = model
            .loss_and_grad(&shard.batch(cfg.seed, step, cfg.batch))
            .unwrap();
        for (wi, gi) in w.iter_mut().zip(&g) {
            *wi -= cfg.lr * gi;
        }
        model.set_flat(&w).unwrap();
    }
    w
}

#[test]
fn one_rank_density_one_equals_plain_training() {
    let w1 = World::local(1);
    let mut base = tiny_mlp("dense", "sgd");
    let want = reference_sgd(&base);
    for ex in [
        "dense",
        "topk",
        "topkdsa",
        "gtopk",
        "oktopk",
        "deft",
        "gaussiank",
    ] {
        base.exchange = ex.parse().unwrap();
        base.density = 1.0;
        let got = params(&w1, &base);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst < 1e-5,
            "--exchange {ex} at density 1 differs from plain SGD by {worst}"
        );
    }
}

#[test]
fn onebit_lamb_without_compression_equals_lamb() {
    let w = World::local(2);
    let mut lamb = tiny_mlp("dense", "lamb");
    lamb.lr = 0.01;
    let mut ob = lamb.clone();
    ob.exchange = "onebit".parse().unwrap();
    ob.opt.method = gradkit_train::optim::Method::OnebitLamb;
    ob.opt.freeze_step = lamb.steps; // freeze-step ≥ steps: never compresses
    assert_eq!(params(&w, &ob), params(&w, &lamb), "bit-identical to LAMB");
    // with compression after 3 steps it must differ, and still agree across ranks
    ob.opt.freeze_step = 3;
    let rep = train(&w, &ob).unwrap().unwrap();
    assert_ne!(rep.params, params(&w, &lamb));
    // the compression stage sends ≈ 2(P−1)/P·n/8 bytes instead of 2(P−1)/P·4n
    let n = rep.n_params as f64;
    let last = rep
        .metrics
        .iter()
        .find(|m| m.metric == "bytes_sent" && m.step == 5 && m.rank == 0)
        .unwrap();
    assert!(
        last.value < n / 4.0,
        "compressed step sent {} bytes for n = {n}",
        last.value
    );
}

#[test]
fn resumed_run_continues_exactly() {
    let w = World::local(2);
    for (ex, opt) in [
        ("dense", "sgd"),
        ("topk", "sgd"),
        ("onebit", "onebit-lamb"),
        ("dense", "adamw"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = tiny_mlp(ex, opt);
        cfg.opt.momentum = 0.9;
        cfg.density = 0.05;
        cfg.opt.freeze_step = 2;
        cfg.steps = 8;
        if opt != "sgd" {
            cfg.lr = 0.01;
        }
        let full = train(&w, &cfg).unwrap().unwrap();
        cfg.checkpoint = Some(dir.path().to_path_buf());
        cfg.checkpoint_every = 2;
        cfg.stop_after = Some(5); // "interrupted" after step 5; the last checkpoint is step 4
        train(&w, &cfg).unwrap();
        cfg.stop_after = None;
        cfg.resume = true;
        let resumed = train(&w, &cfg).unwrap().unwrap();
        assert_eq!(resumed.first_step, 4, "{ex}/{opt}");
        assert_eq!(
            resumed.params, full.params,
            "{ex}/{opt}: resumed parameters differ"
        );
        let losses = |r: &gradkit_train::TrainReport| -> Vec<(u32, u32, f64)> {
            r.metrics
                .iter()
                .filter(|m| (m.metric == "loss" || m.metric == "bytes_sent") && m.step >= 4)
                .map(|m| (m.step, m.rank, m.value))
                .collect()
        };
        assert_eq!(
            losses(&resumed),
            losses(&full),
            "{ex}/{opt}: metrics differ after resume"
        );
    }
}

#[test]
fn resume_refuses_other_settings() {
    let w = World::local(2);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_mlp("dense", "sgd");
    cfg.checkpoint = Some(dir.path().to_path_buf());
    train(&w, &cfg).unwrap();
    cfg.resume = true;
    cfg.exchange = "topk".parse().unwrap();
    let e = train(&w, &cfg).unwrap_err().to_string();
    assert!(e.contains("exchange"), "{e}");
}

#[test]
fn diverged_ranks_stop_the_run_naming_the_step() {
    let w = World::local(2);
    let mut cfg = tiny_mlp("dense", "sgd");
    cfg.check_every = 2;
    cfg.corrupt_at = Some(2);
    let e = format!("{:#}", train(&w, &cfg).unwrap_err());
    assert!(e.contains("after step 3"), "{e}");
}

#[test]
fn ranks_hold_identical_parameters_with_every_exchange() {
    // check_every = 1 makes any difference an error; the run must also learn.
    let w = World::local(3);
    for ex in [
        "dense",
        "topk",
        "gaussiank",
        "topkdsa",
        "gtopk",
        "oktopk",
        "deft",
    ] {
        let mut cfg = tiny_mlp(ex, "sgd");
        cfg.density = 0.05;
        cfg.steps = 4;
        let rep = train(&w, &cfg).unwrap().unwrap();
        assert!(rep.final_loss.is_finite(), "{ex}");
    }
}

#[test]
fn dump_gradients_gives_each_ranks_real_gradient() {
    let w = World::local(2);
    let mut cfg = tiny_mlp("dense", "sgd");
    cfg.steps = 3;
    let rows = gradkit_train::dump_gradients(&w, &cfg).unwrap();
    let ds = load(&cfg.data).unwrap();
    let model = Model::new(&cfg.model, &ds, cfg.seed).unwrap();
    let layers = model.layout().layers.len();
    assert_eq!(rows.len(), 3 * 2 * layers);
    assert!(rows
        .iter()
        .all(|r| r.indices.is_none() && r.values.len() as u64 == r.numel));
    // step 0 of rank 1, recomputed independently from the initial model and rank 1's shard
    let shard = Shard::new(&ds, 1, 2, cfg.batch, cfg.model.seq_len).unwrap();
    let (_, g) = model
        .loss_and_grad(&shard.batch(cfg.seed, 0, cfg.batch))
        .unwrap();
    let mut got: Vec<&gradkit_core::TensorRow> =
        rows.iter().filter(|r| r.step == 0 && r.rank == 1).collect();
    got.sort_by_key(|r| r.layer_id);
    let flat: Vec<f32> = got.iter().flat_map(|r| r.values.clone()).collect();
    assert_eq!(flat, g);
}

#[test]
fn the_parameter_estimate_is_the_models_exact_count() {
    // `--resume` compares a checkpoint's n_params with this estimate before any model is
    // built, so it must be exact, not just an upper bound.
    let digits = load(&gradkit_train::data::DataSpec::default()).unwrap();
    let lm = load(&gradkit_train::data::DataSpec {
        name: "synthetic-lm".into(),
        vocab: 37,
        tokens: 4000,
        ..Default::default()
    })
    .unwrap();
    for (name, data, hidden, d_model, layers, heads, seq_len) in [
        ("mlp", &digits, 16, 64, 2, 4, 32),
        ("mlp", &digits, 33, 64, 2, 4, 32),
        ("cnn", &digits, 128, 64, 2, 4, 32),
        ("transformer-lm", &lm, 128, 16, 1, 2, 8),
        ("transformer-lm", &lm, 128, 24, 3, 4, 12),
        ("lstm-lm", &lm, 8, 12, 2, 4, 8),
        ("lstm-lm", &lm, 20, 6, 2, 4, 5),
    ] {
        let spec = ModelSpec {
            name: name.into(),
            hidden,
            d_model,
            layers,
            heads,
            seq_len,
        };
        let model = Model::new(&spec, data, 0).unwrap();
        assert_eq!(
            gradkit_train::model::estimate_params(&spec, data),
            model.n_params_full() as u128,
            "{spec:?}"
        );
    }
}
