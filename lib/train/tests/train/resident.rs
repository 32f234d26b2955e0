//! The exchange on a device that keeps the sparse exchanges' tensors resident
//! (`TrainConfig::resident`, what `gradtrain --device cuda` sets): on the counting device
//! (host memory, every copy counted) training gives the host path's parameters and metrics
//! bit for bit, timing columns aside, and the gradients did go through the device. The
//! 1-bit exchange likewise, its worker and server errors resident.

use gradkit_comm::World;
use gradkit_sparsify::resident::{Counting, DeviceKernels};
use gradkit_train::model::ModelSpec;
use gradkit_train::optim::OptConfig;
use gradkit_train::{train, TrainConfig, TrainReport};

fn tiny(exchange: &str) -> TrainConfig {
    TrainConfig {
        model: ModelSpec {
            name: "mlp".into(),
            hidden: 16,
            ..ModelSpec::default()
        },
        exchange: exchange.parse().unwrap(),
        density: 0.05,
        reeval: 2,
        steps: 5,
        batch: 8,
        seed: 3,
        check_every: 1,
        ..TrainConfig::default()
    }
}

#[test]
fn sparse_exchanges_on_the_counting_device_train_exactly_as_on_the_host() {
    let w = World::local(2);
    for ex in ["topk", "oktopk", "gtopk", "deft", "gaussiank"] {
        let host = train(&w, &tiny(ex)).unwrap().unwrap();
        let dev: &'static Counting = Box::leak(Box::new(Counting::new()));
        let cfg = TrainConfig {
            resident: Some(dev as &'static dyn DeviceKernels),
            ..tiny(ex)
        };
        let got = train(&w, &cfg).unwrap().unwrap();
        same_training(ex, &host, &got);
        // Every rank's gradient went up at every step (after any dense warm-up: none here).
        let t = dev.transfers();
        assert!(t.uploads >= 2 * 5, "{ex}: {t:?}");
        assert!(
            t.upload_bytes >= 2 * 5 * 4 * host.n_params as u64,
            "{ex}: {t:?}"
        );
    }
}

/// `got` trained to `host`'s parameters and metrics bit for bit, timing columns aside.
fn same_training(ex: &str, host: &TrainReport, got: &TrainReport) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got.params), bits(&host.params), "{ex}: parameters");
    let untimed = |r: &gradkit_core::MetricRow| !r.metric.starts_with("time_");
    let a: Vec<_> = host.metrics.iter().filter(|r| untimed(r)).collect();
    let b: Vec<_> = got.metrics.iter().filter(|r| untimed(r)).collect();
    assert_eq!(a.len(), b.len(), "{ex}: metric rows");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            (&x.metric, x.step, x.rank, x.value.to_bits()),
            (&y.metric, y.step, y.rank, y.value.to_bits()),
            "{ex}"
        );
    }
}

#[test]
fn onebit_exchange_on_the_counting_device_trains_exactly_as_on_the_host() {
    let w = World::local(3);
    for opt in ["onebit-lamb", "onebit-adam"] {
        let cfg = |dev: Option<&'static dyn DeviceKernels>| TrainConfig {
            opt: OptConfig {
                method: opt.parse().unwrap(),
                freeze_step: 2,
                ..OptConfig::default()
            },
            steps: 6,
            resident: dev,
            ..tiny("onebit")
        };
        let host = train(&w, &cfg(None)).unwrap().unwrap();
        let dev: &'static Counting = Box::leak(Box::new(Counting::new()));
        let got = train(&w, &cfg(Some(dev))).unwrap().unwrap();
        same_training(opt, &host, &got);
        // Each compressed step on each rank: the momentum, the received sign chunks and
        // the gathered server chunks go up; the warm-up steps do not touch the device.
        let compressed = got
            .metrics
            .iter()
            .filter(|r| r.metric == "compressed" && r.value == 1.0)
            .count() as u64;
        assert_eq!(compressed, 3 * 4, "{opt}: compressed steps × ranks");
        let t = dev.transfers();
        assert_eq!(
            (t.uploads, t.downloads),
            (3 * compressed, 3 * compressed),
            "{opt}: {t:?}"
        );
        assert!(
            t.upload_bytes >= compressed * 4 * host.n_params as u64,
            "{opt}: {t:?}"
        );
    }
}
