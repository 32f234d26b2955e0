//! The exchange on a device that keeps the sparse exchanges' tensors resident
//! (`TrainConfig::resident`, what `gradtrain --device cuda` sets): on the counting device
//! (host memory, every copy counted) training gives the host path's parameters and metrics
//! bit for bit, timing columns aside, and the gradients did go through the device.

use gradkit_comm::World;
use gradkit_sparsify::resident::{Counting, DeviceKernels};
use gradkit_train::model::ModelSpec;
use gradkit_train::{train, TrainConfig};

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
        // Every rank's gradient went up at every step (after any dense warm-up: none here).
        let t = dev.transfers();
        assert!(t.uploads >= 2 * 5, "{ex}: {t:?}");
        assert!(
            t.upload_bytes >= 2 * 5 * 4 * host.n_params as u64,
            "{ex}: {t:?}"
        );
    }
}
