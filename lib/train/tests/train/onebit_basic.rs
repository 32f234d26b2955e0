//! 1-bit LAMB's scaling coefficients as metrics (`lamb_coeff:<tensor>`, the paper's Figs.
//! 1–3) and the "LAMB + basic 1-bit" ablation (§3.4, `onebit_basic`): during the warm-up
//! the coefficients are LAMB's; in the compression stage the basic variant keeps each
//! tensor's coefficient at c_avg, the EMA (β3) of its warm-up coefficients skipping exact
//! 1.0 — computed here from the warm-up metrics alone — while the paper's variant moves it
//! by the variance ratio r within ±factor_threshold per step.

use gradkit_comm::World;
use gradkit_core::MetricRow;
use gradkit_train::model::ModelSpec;
use gradkit_train::optim::OptConfig;
use gradkit_train::{train, TrainConfig};

const FREEZE: u32 = 6;
const STEPS: u32 = 14;

fn config(basic: bool) -> TrainConfig {
    TrainConfig {
        model: ModelSpec {
            name: "mlp".into(),
            hidden: 16,
            ..ModelSpec::default()
        },
        exchange: "onebit".parse().unwrap(),
        opt: OptConfig {
            method: "onebit-lamb".parse().unwrap(),
            freeze_step: FREEZE,
            onebit_basic: basic,
            ..OptConfig::default()
        },
        lr: 0.01,
        steps: STEPS,
        batch: 8,
        seed: 5,
        ..TrainConfig::default()
    }
}

/// `(tensor, step) -> coefficient` on rank 0.
fn coefficients(rows: &[MetricRow]) -> Vec<(String, u32, f64)> {
    rows.iter()
        .filter(|m| m.rank == 0)
        .filter_map(|m| {
            m.metric
                .strip_prefix("lamb_coeff:")
                .map(|t| (t.to_string(), m.step, m.value))
        })
        .collect()
}

#[test]
fn basic_one_bit_freezes_the_coefficient_at_its_warmup_average() {
    let w = World::local(3);
    let basic = train(&w, &config(true)).unwrap().unwrap();
    let paper = train(&w, &config(false)).unwrap().unwrap();
    let (cb, cp) = (coefficients(&basic.metrics), coefficients(&paper.metrics));
    let tensors: std::collections::BTreeSet<String> = cb.iter().map(|c| c.0.clone()).collect();
    assert_eq!(
        tensors.len(),
        6,
        "one coefficient per tensor of the 3-layer MLP"
    );
    assert_eq!(
        cb.len(),
        6 * STEPS as usize,
        "every step reports every tensor"
    );
    let mut moved = false;
    for t in &tensors {
        let series = |c: &[(String, u32, f64)]| -> Vec<f64> {
            let mut v: Vec<(u32, f64)> =
                c.iter().filter(|x| &x.0 == t).map(|x| (x.1, x.2)).collect();
            v.sort_by_key(|x| x.0);
            v.into_iter().map(|x| x.1).collect()
        };
        let (sb, sp) = (series(&cb), series(&cp));
        // The warm-up is plain LAMB in both runs.
        assert_eq!(
            sb[..FREEZE as usize],
            sp[..FREEZE as usize],
            "{t}: warm-up differs"
        );
        // c_avg: the EMA of the warm-up coefficients, exact 1.0 skipped (DeepSpeed's rule).
        let mut c_avg = 0.0f32;
        for &c in &sb[..FREEZE as usize] {
            if c as f32 != 1.0 {
                c_avg = 0.9 * c_avg + 0.1 * c as f32;
            }
        }
        for (s, &c) in sb.iter().enumerate().skip(FREEZE as usize) {
            assert!(
                ((c - c_avg as f64) / c_avg as f64).abs() < 1e-6,
                "{t} step {s}: basic 1-bit coefficient {c} is not c_avg {c_avg}"
            );
        }
        // The paper's coefficient r·c_avg: r within ±10 % of the previous r per step.
        let mut prev_r = 1.0f64;
        for (s, &c) in sp.iter().enumerate().skip(FREEZE as usize) {
            let r = c / c_avg as f64;
            assert!(
                r >= 0.9 * prev_r * (1.0 - 1e-5) && r <= 1.1 * prev_r * (1.0 + 1e-5),
                "{t} step {s}: r = {r} moved more than 10 % from {prev_r}"
            );
            moved |= (r - 1.0).abs() > 1e-4;
            prev_r = r;
        }
    }
    assert!(
        moved,
        "the paper's variance ratio never moved a coefficient"
    );
    assert_ne!(basic.params, paper.params, "the ablation changes training");
}
