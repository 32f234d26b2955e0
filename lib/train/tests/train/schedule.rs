//! `--schedule 2d` (EmbRace's horizontal, block-level schedule, embrace.md §2.1): the same
//! training as `fifo` (parameters and per-step losses), and both equal to an independent
//! dense-SGD reference computed here; its per-block wait metrics; flushing before a
//! mid-run evaluation.
//!
//! Exactness: for P ≤ 2 every value is bit-identical to fifo. For P ≥ 3 the ring allreduce
//! sums each element in an order fixed by the chunk it falls in, and `2d` allreduces each
//! block on its own (fifo: the dense part in one to three pieces), so an element can be
//! summed in another rank order: the runs then agree to float rounding (≤ 1e-6 here).

use gradkit_comm::World;
use gradkit_core::MetricRow;
use gradkit_train::data::{load, DataSpec, Shard};
use gradkit_train::model::{Model, ModelSpec};
use gradkit_train::optim::OptConfig;
use gradkit_train::train::check_config;
use gradkit_train::{train, TrainConfig};

fn tiny(schedule: &str, opt: &str) -> TrainConfig {
    TrainConfig {
        model: ModelSpec {
            name: "transformer-lm".into(),
            d_model: 8,
            layers: 3,
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
        exchange: "embrace".parse().unwrap(),
        schedule: schedule.parse().unwrap(),
        // ε = 1e-4 as in tests/embrace.rs: Adam must not turn rounding noise into steps.
        opt: OptConfig {
            method: opt.parse().unwrap(),
            eps: 1e-4,
            ..OptConfig::default()
        },
        lr: if opt == "adam" { 0.01 } else { 0.5 },
        steps: 5,
        batch: 2,
        seed: 7,
        check_every: 1,
        ..TrainConfig::default()
    }
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

/// (step, rank) → value of `metric`, sorted.
fn series(rows: &[MetricRow], metric: &str) -> Vec<(u32, u32, f64)> {
    let mut v: Vec<_> = rows
        .iter()
        .filter(|r| r.metric == metric)
        .map(|r| (r.step, r.rank, r.value))
        .collect();
    v.sort_by_key(|a| (a.0, a.1));
    v
}

/// Independent reference: one process computes every rank's gradient of each step on the
/// full model, averages them and applies plain SGD to every parameter (untouched embedding
/// rows have a zero gradient, so lazy and dense SGD agree). Returns the parameters and each
/// step's per-rank losses.
fn reference(p: usize, cfg: &TrainConfig) -> (Vec<f32>, Vec<Vec<f32>>) {
    let ds = load(&cfg.data).unwrap();
    let model = Model::new(&cfg.model, &ds, cfg.seed).unwrap();
    let shards: Vec<Shard> = (0..p)
        .map(|j| Shard::new(&ds, j, p, cfg.batch, cfg.model.seq_len).unwrap())
        .collect();
    let mut w = model.get_flat().unwrap();
    let mut losses = Vec::new();
    for step in 0..cfg.steps {
        let mut g = vec![0f32; w.len()];
        let mut ls = Vec::new();
        for s in &shards {
            let (l, gi) = model
                .loss_and_grad(&s.batch(cfg.seed, step, cfg.batch))
                .unwrap();
            ls.push(l);
            g.iter_mut().zip(&gi).for_each(|(a, x)| *a += x);
        }
        for (wi, gi) in w.iter_mut().zip(&g) {
            *wi -= cfg.lr * (gi / p as f32);
        }
        model.set_flat(&w).unwrap();
        losses.push(ls);
    }
    (w, losses)
}

#[test]
fn two_d_trains_exactly_as_fifo_and_the_reference_for_p_1_to_4() {
    for opt in ["sgd", "adam"] {
        for p in 1..=4 {
            let (fifo, mf) = run(p, &tiny("fifo", opt));
            let (two, m2) = run(p, &tiny("2d", opt));
            let (lf, l2) = (series(&mf, "loss"), series(&m2, "loss"));
            assert_eq!(lf.len(), 5 * p, "P={p}: one loss per step and rank");
            let tol = if p <= 2 { 0.0 } else { 1e-6 };
            let e = worst(&fifo, &two);
            assert!(e <= tol, "{opt} P={p}: params max |Δ| 2d vs fifo = {e}");
            for (a, b) in lf.iter().zip(&l2) {
                assert_eq!((a.0, a.1), (b.0, b.1));
                let d = (a.2 - b.2).abs() as f32;
                assert!(
                    d <= tol,
                    "{opt} P={p} step {} rank {}: loss {} vs {}",
                    a.0,
                    a.1,
                    a.2,
                    b.2
                );
            }
            if opt == "sgd" {
                let (want, wl) = reference(p, &tiny("fifo", opt));
                let e = worst(&two, &want);
                assert!(e < 1e-5, "P={p}: 2d vs reference max |Δ| = {e}");
                for (s, r, l) in &l2 {
                    let x = wl[*s as usize][*r as usize] as f64;
                    assert!((l - x).abs() < 1e-5, "P={p} step {s} rank {r}: {l} vs {x}");
                }
            }
        }
    }
}

#[test]
fn a_mid_run_evaluation_flushes_the_queue_and_changes_nothing() {
    // Evaluation needs the current table and dense part: the queued blocks and rows of the
    // last step are run first, and the next step starts from a fresh lookup.
    let p = 3;
    let mut c = tiny("2d", "sgd");
    c.eval_every = 2;
    let (two, _) = run(p, &c);
    let (plain, _) = run(p, &tiny("2d", "sgd"));
    let (want, _) = reference(p, &tiny("fifo", "sgd"));
    assert_eq!(worst(&two, &plain), 0.0, "an evaluation changed the run");
    assert!(worst(&two, &want) < 1e-5);
}

#[test]
fn two_d_reports_per_block_waits_and_the_row_split() {
    let p = 2;
    let (_, m) = run(p, &tiny("2d", "sgd"));
    // One wait per FP group: embedding level, h0, h1, h2, head; every step, every rank.
    let blocks = ["emb", "h0", "h1", "h2", "head"];
    for b in blocks {
        let w = series(&m, &format!("wait_s:{b}"));
        assert_eq!(w.len(), 5 * p, "wait_s:{b}");
        assert!(w.iter().all(|x| x.2 >= 0.0 && x.2.is_finite()));
    }
    let total = series(&m, "time_fwd_wait_s");
    for (i, t) in total.iter().enumerate() {
        let sum: f64 = blocks
            .iter()
            .map(|b| series(&m, &format!("wait_s:{b}"))[i].2)
            .sum();
        assert!(
            (t.2 - sum).abs() < 1e-9,
            "time_fwd_wait_s is the sum of the block waits"
        );
    }
    for name in ["stall_s", "time_overlapped_s"] {
        assert!(series(&m, name).iter().all(|x| x.2 >= 0.0), "{name}");
    }
    let (u, pr, de) = (
        series(&m, "rows_coalesced"),
        series(&m, "rows_prior"),
        series(&m, "rows_delayed"),
    );
    for ((a, b), c) in u.iter().zip(&pr).zip(&de) {
        assert_eq!(a.2, b.2 + c.2, "prior + delayed = coalesced");
    }
}

#[test]
fn schedules_are_checked() {
    let c = tiny("2d", "adam");
    assert!(check_config(&c).is_ok());
    // An unknown schedule is refused where the name is parsed, listing the known ones.
    let e = "horizontal".parse::<gradkit_train::Schedule>().unwrap_err();
    assert!(
        e.contains("--schedule") && e.contains("fifo, embrace, 2d"),
        "{e}"
    );
    // Block-wise updates need an elementwise optimiser: the exchange allows no other.
    let mut c = tiny("2d", "lamb");
    c.opt.method = gradkit_train::optim::Method::Lamb;
    let e = check_config(&c).unwrap_err().to_string();
    assert!(e.contains("--optimizer"), "{e}");
}

#[test]
fn lstm_lm_two_d_equals_fifo() {
    // The LSTM LM has no transformer blocks: groups `emb` (empty) and `head` (LSTM + head).
    let mut c = tiny("fifo", "sgd");
    c.model.name = "lstm-lm".into();
    let (fifo, mf) = run(2, &c);
    c.schedule = "2d".parse().unwrap();
    let (two, m2) = run(2, &c);
    assert_eq!(worst(&fifo, &two), 0.0);
    assert_eq!(series(&mf, "loss"), series(&m2, "loss"));
    assert_eq!(series(&m2, "wait_s:head").len(), 5 * 2);
}

#[test]
fn two_d_sends_the_dense_bytes_of_fifo_one_step_later() {
    // A step's blocks travel during the next step: from step 1 on, every step sends what
    // fifo sends per step (the last step's blocks are flushed after the loop).
    let p = 4;
    let (_, mf) = run(p, &tiny("fifo", "sgd"));
    let (_, m2) = run(p, &tiny("2d", "sgd"));
    let (bf, b2) = (series(&mf, "bytes_dense"), series(&m2, "bytes_dense"));
    for (a, b) in bf.iter().zip(&b2) {
        let want = if a.0 == 0 { 0.0 } else { a.2 };
        assert_eq!(b.2, want, "step {} rank {}", a.0, a.1);
    }
    // The output head's group (lm_head + final LN) is reported as `bytes_lm_head`.
    let (hf, h2) = (series(&mf, "bytes_lm_head"), series(&m2, "bytes_lm_head"));
    for (a, b) in hf.iter().zip(&h2).filter(|x| x.0 .0 > 0) {
        assert!(b.2 >= a.2 && b.2 < 1.01 * a.2, "{} vs {}", b.2, a.2);
    }
}
