//! `--exchange embrace|allgather`: equality with dense training and with an independent
//! reference trainer written here, the prior/delayed split, fifo = embrace schedule, column
//! balance and bytes per rank against embrace.md §1.3's formulas.

use std::collections::BTreeSet;

use gradkit_comm::World;
use gradkit_core::MetricRow;
use gradkit_train::data::{load, Batch, DataSpec, Shard};
use gradkit_train::embrace::split_prior;
use gradkit_train::model::{Model, ModelSpec};
use gradkit_train::optim::OptConfig;
use gradkit_train::train::check_config;
use gradkit_train::{train, TrainConfig};

fn tiny(exchange: &str, opt: &str, d_model: usize) -> TrainConfig {
    TrainConfig {
        model: ModelSpec {
            name: "transformer-lm".into(),
            d_model,
            layers: 1,
            heads: 2,
            seq_len: 8,
            hidden: 8,
        },
        data: DataSpec {
            name: "synthetic-lm".into(),
            vocab: 300,
            corpus_seed: 3,
            tokens: 20_000,
            ..DataSpec::default()
        },
        exchange: exchange.parse().unwrap(),
        // ε = 1e-4: the gradient of the attention key bias is zero up to rounding (softmax is
        // shift-invariant), and with ε = 1e-8 Adam turns that rounding noise into lr-sized
        // steps that differ with summation order.
        opt: OptConfig {
            method: opt.parse().unwrap(),
            eps: 1e-4,
            ..OptConfig::default()
        },
        lr: if opt == "adam" { 0.01 } else { 0.5 },
        steps: 4,
        batch: 2,
        seed: 7,
        check_every: 1,
        ..TrainConfig::default()
    }
}

fn run_report(p: usize, cfg: &TrainConfig) -> gradkit_train::TrainReport {
    train(&World::local(p), cfg).unwrap().unwrap()
}

fn run(p: usize, cfg: &TrainConfig) -> (Vec<f32>, Vec<MetricRow>) {
    let r = train(&World::local(p), cfg).unwrap().unwrap();
    (r.params, r.metrics)
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
}

fn ids(b: &Batch) -> Vec<u32> {
    match b {
        Batch::Lm { x, .. } => x.clone(),
        _ => unreachable!(),
    }
}

/// Independent reference: one process computes every rank's gradient on the full table,
/// averages them and applies SGD to everything, or Adam to the dense layers and lazy Adam
/// (moments and update only on rows some rank's batch touched) to the token embedding.
fn reference(p: usize, cfg: &TrainConfig) -> Vec<f32> {
    let ds = load(&cfg.data).unwrap();
    let model = Model::new(&cfg.model, &ds, cfg.seed).unwrap();
    let lay = model.layout().clone();
    let emb = lay.layers.iter().find(|l| l.name == "wte.weight").unwrap();
    let (eo, en) = (emb.offset as usize, emb.numel as usize);
    let d = cfg.model.d_model;
    let shards: Vec<Shard> = (0..p)
        .map(|j| Shard::new(&ds, j, p, cfg.batch, cfg.model.seq_len).unwrap())
        .collect();
    let mut w = model.get_flat().unwrap();
    let n = w.len();
    let (mut m, mut v) = (vec![0f32; n], vec![0f32; n]);
    let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-4f32);
    for step in 0..cfg.steps {
        let mut g = vec![0f32; n];
        let mut touched = BTreeSet::new();
        for s in &shards {
            let b = s.batch(cfg.seed, step, cfg.batch);
            touched.extend(ids(&b));
            let (_, gi) = model.loss_and_grad(&b).unwrap();
            for (a, x) in g.iter_mut().zip(&gi) {
                *a += x;
            }
        }
        g.iter_mut().for_each(|x| *x /= p as f32);
        let t = step as i32 + 1;
        for i in 0..n {
            let in_emb = (eo..eo + en).contains(&i);
            if in_emb && !touched.contains(&(((i - eo) / d) as u32)) {
                continue;
            }
            if cfg.opt.method == gradkit_train::optim::Method::Sgd {
                w[i] -= cfg.lr * g[i];
            } else {
                m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                let mh = m[i] / (1.0 - b1.powi(t));
                let vh = v[i] / (1.0 - b2.powi(t));
                w[i] -= cfg.lr * mh / (vh.sqrt() + eps);
            }
        }
        model.set_flat(&w).unwrap();
    }
    w
}

#[test]
fn sgd_embrace_and_allgather_equal_dense_for_p_1_to_4() {
    for p in 1..=4 {
        let (dense, _) = run(p, &tiny("dense", "sgd", 8));
        let want = reference(p, &tiny("dense", "sgd", 8));
        assert!(
            worst(&dense, &want) < 1e-5,
            "P={p}: dense vs reference {}",
            worst(&dense, &want)
        );
        for (ex, sched) in [
            ("allgather", "fifo"),
            ("embrace", "fifo"),
            ("embrace", "embrace"),
        ] {
            let mut c = tiny(ex, "sgd", 8);
            c.schedule = sched.parse().unwrap();
            let (got, _) = run(p, &c);
            let e = worst(&got, &dense);
            assert!(e < 1e-5, "P={p} {ex}/{sched}: max |Δ| vs dense = {e}");
        }
    }
}

#[test]
fn lazy_adam_equals_reference_and_allgather() {
    for p in [1, 3] {
        let want = reference(p, &tiny("embrace", "adam", 8));
        let (ag, _) = run(p, &tiny("allgather", "adam", 8));
        let (em, _) = run(p, &tiny("embrace", "adam", 8));
        assert!(worst(&ag, &want) < 1e-5, "P={p} allgather vs reference");
        assert!(worst(&em, &want) < 1e-5, "P={p} embrace vs reference");
        // Sanity: the test can fail — dense Adam moves untouched rows, so it differs.
        let (dense, _) = run(p, &tiny("dense", "adam", 8));
        assert!(
            worst(&dense, &want) > 1e-4,
            "P={p}: dense Adam should differ"
        );
    }
}

#[test]
fn fifo_and_embrace_schedules_are_bit_identical_and_fresh() {
    // Adam: every delayed row's update must use its own step's bias correction.
    let p = 3;
    let mut a = tiny("embrace", "adam", 8);
    a.steps = 6;
    a.schedule = "fifo".parse().unwrap();
    let mut b = a.clone();
    b.schedule = "embrace".parse().unwrap();
    let (pa, ma) = run(p, &a);
    let (pb, mb) = run(p, &b);
    assert_eq!(pa, pb, "schedules changed the parameters");
    // Freshness: every step's loss (which reads the rows of that step's batch after the
    // previous step's prior rows were applied and before its delayed rows were) is identical.
    let loss = |m: &[MetricRow]| -> Vec<(u32, u32, u64)> {
        m.iter()
            .filter(|r| r.metric == "loss")
            .map(|r| (r.step, r.rank, r.value.to_bits()))
            .collect()
    };
    assert_eq!(loss(&ma), loss(&mb));
    // And the split really happened: some rows were delayed.
    let delayed: f64 = mb
        .iter()
        .filter(|r| r.metric == "rows_delayed")
        .map(|r| r.value)
        .sum();
    assert!(delayed > 0.0);
}

#[test]
fn prior_and_delayed_partition_the_coalesced_rows() {
    let cur = vec![1u32, 4, 5, 9, 12, 40];
    let next = vec![vec![4u32, 4, 7], vec![40, 2], vec![12, 99]];
    let (prior, delayed) = split_prior(&cur, &next);
    // Brute force.
    let nx: Vec<u32> = next.iter().flatten().copied().collect();
    let want_p: Vec<u32> = cur.iter().copied().filter(|i| nx.contains(i)).collect();
    let want_d: Vec<u32> = cur.iter().copied().filter(|i| !nx.contains(i)).collect();
    assert_eq!(prior, want_p);
    assert_eq!(delayed, want_d);
    assert_eq!(prior, vec![4, 12, 40]);
    let mut all = prior.clone();
    all.extend(&delayed);
    all.sort();
    assert_eq!(all, cur);
}

fn metric(m: &[MetricRow], name: &str, step: u32, rank: u32) -> f64 {
    m.iter()
        .find(|r| r.metric == name && r.step == step && r.rank == rank)
        .unwrap_or_else(|| panic!("no {name} at step {step} rank {rank}"))
        .value
}

#[test]
fn bytes_per_rank_match_the_formulas_and_columns_are_balanced() {
    let d = 8;
    for p in [2usize, 3, 4] {
        let mut c = tiny("embrace", "sgd", d);
        c.schedule = "fifo".parse().unwrap();
        c.steps = 2;
        let (_, m) = run(p, &c);
        let ds = load(&c.data).unwrap();
        let shards: Vec<Shard> = (0..p)
            .map(|j| Shard::new(&ds, j, p, c.batch, c.model.seq_len).unwrap())
            .collect();
        // Column widths: balanced within one column, covering d.
        let widths: Vec<usize> = (0..p)
            .map(|r| metric(&m, "emb_width", 0, r as u32) as usize)
            .collect();
        assert_eq!(widths.iter().sum::<usize>(), d, "P={p}: {widths:?}");
        assert!(widths.iter().max().unwrap() - widths.iter().min().unwrap() <= 1);
        for step in 0..c.steps {
            let xs: Vec<Vec<u32>> = shards
                .iter()
                .map(|s| ids(&s.batch(c.seed, step, c.batch)))
                .collect();
            for r in 0..p {
                let t_others: usize = (0..p).filter(|&j| j != r).map(|j| xs[j].len()).sum();
                let u_r = xs[r].iter().collect::<BTreeSet<_>>().len();
                // Forward: my columns of every other rank's tokens.
                let fwd = 4 * widths[r] * t_others;
                // Backward: every other owner k gets my coalesced rows' ids and its columns.
                let bwd: usize = (0..p)
                    .filter(|&k| k != r)
                    .map(|k| 4 * u_r * (1 + widths[k]))
                    .sum();
                let ru = r as u32;
                assert_eq!(metric(&m, "bytes_emb_forward", step, ru), fwd as f64);
                assert_eq!(metric(&m, "bytes_emb_grad", step, ru), bwd as f64);
                if d % p == 0 {
                    // embrace.md §1.3: 2·(P−1)/P·αM with αM = rows·d·4 (equal batches), plus
                    // the row ids of the gradient exchange.
                    let t = xs[r].len();
                    assert_eq!(fwd, 4 * t * d * (p - 1) / p);
                    assert_eq!(bwd, 4 * u_r * d * (p - 1) / p + 4 * u_r * (p - 1));
                }
            }
        }
        // AllGather baseline: in total over ranks, every rank's block (ids + full rows)
        // reaches the P−1 others.
        let mut a = tiny("allgather", "sgd", d);
        a.steps = 1;
        let (_, ma) = run(p, &a);
        let xs: Vec<Vec<u32>> = shards
            .iter()
            .map(|s| ids(&s.batch(a.seed, 0, a.batch)))
            .collect();
        let blocks: usize = xs
            .iter()
            .map(|x| 4 * x.iter().collect::<BTreeSet<_>>().len() * (1 + d))
            .sum();
        let sent: f64 = (0..p)
            .map(|r| metric(&ma, "bytes_emb_grad", 0, r as u32))
            .sum();
        assert_eq!(sent, ((p - 1) * blocks) as f64, "P={p} allgather");
    }
}

#[test]
fn lstm_lm_embrace_equals_dense() {
    let mut c = tiny("dense", "sgd", 8);
    c.model.name = "lstm-lm".into();
    let (dense, _) = run(2, &c);
    c.exchange = "embrace".parse().unwrap();
    let (em, _) = run(2, &c);
    assert!(worst(&dense, &em) < 1e-5);
}

#[test]
fn bad_combinations_are_refused() {
    let mut c = tiny("embrace", "sgd", 8);
    c.opt.momentum = 0.9;
    assert!(check_config(&c)
        .unwrap_err()
        .to_string()
        .contains("--momentum"));
    let mut c = tiny("embrace", "lamb", 8);
    assert!(check_config(&c).is_err());
    c = tiny("embrace", "sgd", 8);
    c.model.name = "mlp".into();
    assert!(check_config(&c)
        .unwrap_err()
        .to_string()
        .contains("--model"));
    // An unknown schedule is refused where the name is parsed, naming the flag.
    let e = "lifo".parse::<gradkit_train::Schedule>().unwrap_err();
    assert!(e.contains("--schedule"), "{e}");
}

/// docs/gradtrain.md: the sharded model holds no V × d tensor; its parameters and every
/// column slice of its embedding's initial values are those of the full model.
#[test]
fn sharded_model_holds_no_table_and_draws_the_same_initial_values() {
    for name in ["transformer-lm", "lstm-lm"] {
        let mut c = tiny("embrace", "sgd", 8);
        c.model.name = name.into();
        let ds = load(&c.data).unwrap();
        let full = Model::new(&c.model, &ds, c.seed).unwrap();
        let sh = Model::new_sharded(&c.model, &ds, c.seed).unwrap();
        let (v, d) = (c.data.vocab, c.model.d_model);
        let lay = full.layout();
        let emb = lay
            .layers
            .iter()
            .find(|l| l.name == "wte.weight" || l.name == "emb.weight")
            .unwrap();
        let (eo, en) = (emb.offset as usize, emb.numel as usize);
        assert_eq!(en, v * d);
        // No held tensor has the embedding's size; the held ones are the full model's others.
        assert_eq!(sh.n_params(), full.n_params() - v * d, "{name}");
        assert!(sh.layout().layers.iter().all(|l| l.name != emb.name));
        let w = full.get_flat().unwrap();
        let mut others = w[..eo].to_vec();
        others.extend_from_slice(&w[eo + en..]);
        assert_eq!(sh.get_flat().unwrap(), others, "{name}: held parameters");
        for (lo, hi) in [(0, d), (0, 3), (3, 8), (5, 6)] {
            let want: Vec<f32> = (0..v)
                .flat_map(|r| w[eo + r * d + lo..eo + r * d + hi].to_vec())
                .collect();
            assert_eq!(
                sh.embedding_init(lo..hi).unwrap(),
                want,
                "{name} cols {lo}..{hi}"
            );
        }
    }
}

/// `--lookup unique` trains bit-identically to the paper's per-token lookup and sends, per
/// rank, its columns of every other rank's distinct tokens (no ids).
#[test]
fn unique_lookup_trains_identically_and_sends_distinct_rows() {
    let d = 8;
    for p in [1usize, 2, 3, 4] {
        let mut per_token = tiny("embrace", "adam", d);
        per_token.steps = 3;
        let mut uniq = per_token.clone();
        uniq.lookup = "unique".parse().unwrap();
        let (a, ma) = run(p, &per_token);
        let (b, mb) = run(p, &uniq);
        assert_eq!(a, b, "P={p}: unique lookup changes the parameters");
        let ds = load(&uniq.data).unwrap();
        let shards: Vec<Shard> = (0..p)
            .map(|j| Shard::new(&ds, j, p, uniq.batch, uniq.model.seq_len).unwrap())
            .collect();
        for step in 0..uniq.steps {
            let xs: Vec<Vec<u32>> = shards
                .iter()
                .map(|s| ids(&s.batch(uniq.seed, step, uniq.batch)))
                .collect();
            for r in 0..p {
                let w = d * (r + 1) / p - d * r / p;
                let distinct: usize = (0..p)
                    .filter(|&j| j != r)
                    .map(|j| xs[j].iter().collect::<BTreeSet<_>>().len())
                    .sum();
                let ru = r as u32;
                assert_eq!(
                    metric(&mb, "bytes_emb_forward", step, ru),
                    (4 * w * distinct) as f64,
                    "P={p} step {step} rank {r}"
                );
                // The gradient exchange is the same.
                assert_eq!(
                    metric(&mb, "bytes_emb_grad", step, ru),
                    metric(&ma, "bytes_emb_grad", step, ru)
                );
            }
        }
    }
}

/// The output head is a dense V × d layer (+ bias) allreduced by the ring: its bytes are
/// reported apart, summing over ranks to 2·(P−1)·4·(V·d + V), and the evaluation (from
/// looked-up rows, no full table) equals dense training's.
#[test]
fn lm_head_bytes_are_reported_apart_and_evaluation_matches_dense() {
    let d = 8;
    for p in [2usize, 3] {
        let mut c = tiny("embrace", "sgd", d);
        c.steps = 2;
        let rep = run_report(p, &c);
        let v = c.data.vocab;
        for step in 0..c.steps {
            let head: f64 = (0..p)
                .map(|r| metric(&rep.metrics, "bytes_lm_head", step, r as u32))
                .sum();
            assert_eq!(head, (2 * (p - 1) * 4 * (v * d + v)) as f64, "P={p}");
            for r in 0..p as u32 {
                let all = metric(&rep.metrics, "bytes_dense", step, r);
                let parts = metric(&rep.metrics, "bytes_lm_head", step, r)
                    + metric(&rep.metrics, "bytes_dense_other", step, r);
                assert_eq!(all, parts);
            }
        }
        let mut dn = c.clone();
        dn.exchange = "dense".parse().unwrap();
        let want = run_report(p, &dn);
        assert!(rep.eval_loss.is_finite() && rep.eval_loss > 0.0);
        assert!(
            (rep.eval_loss - want.eval_loss).abs() < 1e-5,
            "P={p}: eval loss {} vs dense {}",
            rep.eval_loss,
            want.eval_loss
        );
        assert_eq!(rep.eval_accuracy, want.eval_accuracy);
    }
}

#[test]
fn lookup_flag_is_checked() {
    let mut c = tiny("allgather", "sgd", 8);
    c.lookup = "unique".parse().unwrap();
    let e = check_config(&c).unwrap_err().to_string();
    assert!(e.contains("--lookup"), "{e}");
    c = tiny("embrace", "sgd", 8);
    // An unknown name is refused where it is parsed, naming the known ones.
    let e = "sorted".parse::<gradkit_train::Lookup>().unwrap_err();
    assert!(e.contains("--lookup") && e.contains("per-token"), "{e}");
    c.lookup = "unique".parse().unwrap();
    assert!(check_config(&c).is_ok());
}
