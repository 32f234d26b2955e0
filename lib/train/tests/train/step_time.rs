//! Every exchange reports its step's wall time (`time_step_s`) and the run's elapsed wall time
//! (`time_elapsed_s`) per (step, rank), so that loss against wall time is one column, not a sum of
//! phase columns. Checked against the phases each run reports itself: a step lasts at least
//! its compute, selection, communication and update together, and elapsed time only grows.

use gradkit_comm::World;
use gradkit_core::MetricRow;
use gradkit_train::model::ModelSpec;
use gradkit_train::optim::OptConfig;
use gradkit_train::{train, TrainConfig};

fn cfg(exchange: &str, opt: &str) -> TrainConfig {
    TrainConfig {
        model: ModelSpec {
            name: "mlp".into(),
            hidden: 16,
            ..ModelSpec::default()
        },
        exchange: exchange.parse().unwrap(),
        opt: OptConfig {
            method: opt.parse().unwrap(),
            freeze_step: 2,
            ..OptConfig::default()
        },
        density: 0.05,
        steps: 5,
        batch: 8,
        seed: 1,
        eval_every: 2,
        ..TrainConfig::default()
    }
}

fn values(rows: &[MetricRow], name: &str, rank: u32) -> Vec<(u32, f64)> {
    let mut v: Vec<(u32, f64)> = rows
        .iter()
        .filter(|m| m.metric == name && m.rank == rank)
        .map(|m| (m.step, m.value))
        .collect();
    v.sort_by_key(|x| x.0);
    v
}

#[test]
fn every_exchange_reports_step_time_and_elapsed_time() {
    let w = World::local(2);
    for (ex, opt) in [
        ("dense", "sgd"),
        ("oktopk", "sgd"),
        ("deft", "sgd"),
        ("onebit", "onebit-lamb"),
    ] {
        let rep = train(&w, &cfg(ex, opt)).unwrap().unwrap();
        for r in 0..2 {
            let step = values(&rep.metrics, "time_step_s", r);
            let elapsed = values(&rep.metrics, "time_elapsed_s", r);
            let steps: Vec<u32> = (0..5).collect();
            assert_eq!(step.iter().map(|s| s.0).collect::<Vec<_>>(), steps, "{ex}");
            assert_eq!(
                elapsed.iter().map(|s| s.0).collect::<Vec<_>>(),
                steps,
                "{ex}"
            );
            let parts: Vec<f64> = (0..5)
                .map(|s| {
                    [
                        "time_compute_s",
                        "time_select_s",
                        "time_comm_s",
                        "time_update_s",
                    ]
                    .iter()
                    .map(|m| values(&rep.metrics, m, r)[s].1)
                    .sum()
                })
                .collect();
            for s in 0..5 {
                // The phases are timed inside the step; 1 µs for the clocks' granularity.
                assert!(
                    step[s].1 + 1e-6 >= parts[s],
                    "{ex} rank {r} step {s}: time_step_s {} < its phases {}",
                    step[s].1,
                    parts[s]
                );
                assert!(elapsed[s].1 >= step[s].1, "{ex} rank {r} step {s}");
            }
            assert!(
                elapsed.windows(2).all(|w| w[1].1 > w[0].1),
                "{ex} rank {r}: time_elapsed_s must grow: {elapsed:?}"
            );
        }
    }
}
