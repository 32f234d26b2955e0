//! gradtrain's sparse exchanges are gradallreduce's reducers (docs/ALGORITHMS.md): for every sparse
//! exchange and P = 1..5, replaying the gradients a `gradtrain` run recorded through
//! `make_reducer` (the path `gradallreduce --algo X` takes on dense input, with its own error
//! feedback) and applying Ok-Topk Algorithm 2 by hand — `acc = ε + lr·G`, `u = Σ acc(sel)`,
//! `w -= u/P` through momentum SGD — gives the trainer's parameters and residuals bit for bit,
//! step by step.

use gradkit_collectives::{make_reducer, Flat, Op, Params};
use gradkit_comm::World;
use gradkit_core::keep::Keep;
use gradkit_core::trace::{flatten_dense, Layout};
use gradkit_core::TensorRow;
use gradkit_train::model::{Model, ModelSpec};
use gradkit_train::optim::OptConfig;
use gradkit_train::{checkpoint, data, train, Exchange, TrainConfig};

const STEPS: u32 = 5;
const LR: f32 = 0.05;
const MU: f32 = 0.9;

fn config(exchange: &str) -> TrainConfig {
    TrainConfig {
        model: ModelSpec {
            name: "mlp".into(),
            hidden: 16,
            ..ModelSpec::default()
        },
        exchange: exchange.parse().unwrap(),
        density: 0.03,
        period: 2,
        reeval: 2,
        opt: OptConfig {
            method: "sgd".parse().unwrap(),
            momentum: MU,
            ..OptConfig::default()
        },
        lr: LR,
        steps: STEPS,
        batch: 8,
        seed: 11,
        check_every: 1,
        record_gradients: true,
        quiet: true,
        ..TrainConfig::default()
    }
}

/// Rank `rank`'s flat gradient of `step`, from the recorded `tensor/1` rows.
fn gradient(rows: &[TensorRow], step: u32, rank: u32) -> Vec<f32> {
    let mut mine: Vec<&TensorRow> = rows
        .iter()
        .filter(|r| r.step == step && r.rank == rank)
        .collect();
    mine.sort_by_key(|r| r.layer_id);
    flatten_dense(&mine)
}

/// What one rank of the replay ends with: parameters after every step, final residual.
struct Replayed {
    params: Vec<Vec<f32>>,
    residual: Vec<f32>,
}

/// Algorithm 2 on the recorded gradients with gradallreduce's reducer for `algo`.
fn replay(
    cfg: &TrainConfig,
    algo: &str,
    p: usize,
    w0: &[f32],
    layout: &Layout,
    grads: &[TensorRow],
) -> Vec<Replayed> {
    let params = Params {
        op: Op::Sum,
        keep: Keep::Density(cfg.density),
        period: cfg.period,
        reeval: cfg.reeval,
        adjust: cfg.adjust,
        residual: true,
        seed: cfg.seed,
        ..Params::default()
    };
    World::local(p)
        .run(|comm| {
            let mut reducer = make_reducer(algo, &params)?;
            let rank = comm.rank() as u32;
            let mut w = w0.to_vec();
            let mut buf = vec![0.0f32; w.len()];
            let mut traj = Vec::new();
            let inv_p = 1.0 / p as f32;
            for step in 0..STEPS {
                let g = gradient(grads, step, rank);
                // acc input α·G (α = lr folded in; weight decay 0).
                let input: Vec<f32> = g
                    .iter()
                    .zip(&w)
                    .map(|(gi, wi)| LR * (gi + 0.0 * wi))
                    .collect();
                let out = reducer.reduce(comm, step, layout, Flat::Dense(input))?;
                let Flat::Sparse(s) = out.result else {
                    anyhow::bail!("{algo}: dense result");
                };
                let mut u = vec![0.0f32; w.len()];
                for (&i, &v) in s.indices.iter().zip(&s.values) {
                    u[i as usize] += v * inv_p;
                }
                // Momentum SGD on u/P with lr 1 (the lr is already in u).
                for i in 0..w.len() {
                    let gi = u[i] + 0.0 * w[i];
                    buf[i] = MU * buf[i] + gi;
                    w[i] -= 1.0 * buf[i];
                }
                traj.push(w.clone());
            }
            let residual = reducer
                .state()
                .into_iter()
                .find(|(k, _)| k == "residual")
                .map(|(_, v)| v)
                .unwrap_or_default();
            Ok(Replayed {
                params: traj,
                residual,
            })
        })
        .unwrap()
}

#[test]
fn gradtrain_sparse_exchanges_are_gradallreduce_reducers() {
    let sparse: Vec<(&str, &str)> = Exchange::all()
        .iter()
        .map(|e| (e.name(), e.algo().name()))
        .filter(|e| {
            [
                "topka",
                "topkdsa",
                "gtopk",
                "gaussiank",
                "oktopk",
                "deft",
                "cltk",
                "topk-union",
            ]
            .contains(&e.1)
        })
        .collect();
    assert_eq!(sparse.len(), 8, "every sparse exchange is covered");
    for (exchange, algo) in sparse {
        for p in 1..=5usize {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = config(exchange);
            cfg.checkpoint = Some(dir.path().to_path_buf());
            let data = data::load(&cfg.data).unwrap();
            let model = Model::new(&cfg.model, &data, cfg.seed).unwrap();
            let w0 = model.get_flat().unwrap();
            let layout = model.layout().clone();
            // The trainer, stopped after each step to see its trajectory.
            let mut trained = Vec::new();
            for s in 1..=STEPS {
                let mut c = cfg.clone();
                c.stop_after = Some(s);
                c.checkpoint = None;
                trained.push(train(&World::local(p), &c).unwrap().unwrap().params);
            }
            let full = train(&World::local(p), &cfg).unwrap().unwrap();
            assert_eq!(
                full.params,
                trained[STEPS as usize - 1],
                "{exchange} P={p}: deterministic"
            );
            let ck = checkpoint::latest(dir.path()).unwrap().unwrap();
            let got = replay(&cfg, algo, p, &w0, &layout, &full.gradients);
            for (r, rep) in got.iter().enumerate() {
                for (s, (mine, theirs)) in rep.params.iter().zip(&trained).enumerate() {
                    assert!(
                        mine == theirs,
                        "{exchange} P={p} rank {r}: parameters after step {s} differ from gradallreduce's replay"
                    );
                }
                let st = checkpoint::read_rank(&ck, r).unwrap();
                let residual = st
                    .get("residual")
                    .expect("a sparse exchange checkpoints its residual");
                assert_eq!(residual.len(), w0.len());
                assert!(
                    *residual == rep.residual,
                    "{exchange} P={p} rank {r}: the trainer's residual differs from gradallreduce's"
                );
                // Error feedback keeps something back (the test would be vacuous otherwise).
                assert!(
                    residual.iter().any(|&x| x != 0.0),
                    "{exchange} P={p}: zero residual"
                );
            }
        }
    }
}
