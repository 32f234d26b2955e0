//! candle's gradients of every model against central finite differences (in f64 sums of
//! f32 losses) on the largest-gradient entry of several parameter tensors.

use gradkit_train::data::{load, DataSpec, Shard};
use gradkit_train::model::{Model, ModelSpec};

fn check(spec: ModelSpec, data: &str) {
    let ds = load(&DataSpec {
        name: data.into(),
        vocab: 24,
        tokens: 3000,
        ..DataSpec::default()
    })
    .unwrap();
    let model = Model::new(&spec, &ds, 7).unwrap();
    let shard = Shard::new(&ds, 0, 1, 4, spec.seq_len).unwrap();
    let batch = shard.batch(3, 0, 4);
    let w0 = model.get_flat().unwrap();
    let (_, g) = model.loss_and_grad(&batch).unwrap();
    let layers = model.layout().layers.clone();
    let mut checked = 0;
    for l in layers.iter().filter(|l| l.numel > 1) {
        let (o, n) = (l.offset as usize, l.numel as usize);
        // the entry with the largest |gradient| in this tensor
        let i = o
            + (0..n)
                .max_by(|a, b| g[o + a].abs().total_cmp(&g[o + b].abs()))
                .unwrap();
        if g[i].abs() < 1e-4 {
            continue;
        }
        let h = 2e-3f32 * (1.0 + w0[i].abs());
        let loss_at = |x: f32| {
            let mut w = w0.clone();
            w[i] = x;
            model.set_flat(&w).unwrap();
            model.loss(&batch).unwrap().to_scalar::<f32>().unwrap() as f64
        };
        let fd = (loss_at(w0[i] + h) - loss_at(w0[i] - h)) / (2.0 * h as f64);
        let err = (fd - g[i] as f64).abs();
        assert!(
            err <= 0.03 * g[i].abs() as f64 + 2e-3,
            "{}: layer {} entry {}: autodiff {} vs finite difference {fd}",
            spec.name,
            l.name,
            i - o,
            g[i]
        );
        checked += 1;
    }
    model.set_flat(&w0).unwrap();
    assert!(
        checked >= 3,
        "{}: only {checked} tensors checked",
        spec.name
    );
}

#[test]
fn mlp_gradients() {
    check(
        ModelSpec {
            name: "mlp".into(),
            hidden: 8,
            ..ModelSpec::default()
        },
        "digits",
    );
}

#[test]
fn cnn_gradients() {
    check(
        ModelSpec {
            name: "cnn".into(),
            ..ModelSpec::default()
        },
        "digits",
    );
}

#[test]
fn transformer_gradients() {
    check(
        ModelSpec {
            name: "transformer-lm".into(),
            d_model: 16,
            heads: 2,
            layers: 1,
            seq_len: 6,
            ..ModelSpec::default()
        },
        "synthetic-lm",
    );
}

#[test]
fn lstm_gradients() {
    check(
        ModelSpec {
            name: "lstm-lm".into(),
            d_model: 8,
            hidden: 8,
            seq_len: 5,
            ..ModelSpec::default()
        },
        "synthetic-lm",
    );
}
