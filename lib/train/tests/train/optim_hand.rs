//! One step of each optimiser against numbers computed by hand (in the comments).

use gradkit_train::optim::{lr_at, Decay, OnebitLamb, Opt, OptConfig};

const W: [f32; 2] = [1.0, -2.0];
const G: [f32; 2] = [0.5, 0.25];

fn step(name: &str, f: impl FnOnce(&mut OptConfig)) -> Vec<f32> {
    let mut cfg = OptConfig {
        method: name.parse().unwrap(),
        ..OptConfig::default()
    };
    f(&mut cfg);
    let mut o = Opt::new(&cfg, vec![(0, 2)]).unwrap();
    let mut w = W.to_vec();
    o.step(&mut w, &G, 0.1, 0);
    w
}

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "lengths differ: {a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}

#[test]
fn sgd_plain_momentum_nesterov() {
    // w - 0.1·g
    close(&step("sgd", |_| {}), &[0.95, -2.025], 1e-7);
    // g' = g + 0.1·w = [0.6, 0.05]; buf = g'; w - 0.1·buf
    close(
        &step("sgd", |c| {
            c.momentum = 0.9;
            c.weight_decay = 0.1;
        }),
        &[0.94, -2.005],
        1e-6,
    );
    // Nesterov: d = g' + 0.9·buf = 1.9·g' = [1.14, 0.095]
    close(
        &step("sgd", |c| {
            c.momentum = 0.9;
            c.weight_decay = 0.1;
            c.nesterov = true;
        }),
        &[0.886, -2.0095],
        1e-6,
    );
}

#[test]
fn adam_and_adamw() {
    // bias-corrected first step: m̂ = g, v̂ = g², w - 0.1·g/|g|
    close(&step("adam", |_| {}), &[0.9, -2.1], 1e-6);
    // AdamW: w·(1 - 0.1·0.1) = [0.99, -1.98], then the same -0.1·sign(g)
    close(
        &step("adamw", |c| c.weight_decay = 0.1),
        &[0.89, -2.08],
        1e-6,
    );
    // Adam with L2: g' = g + 0.1·w = [0.6, 0.05]; still sign steps
    close(&step("adam", |c| c.weight_decay = 0.1), &[0.9, -2.1], 1e-6);
}

#[test]
fn lamb_one_step() {
    // m = 0.1·g, v = 0.001·g² (no bias correction) → u = √10·sign(g) = [3.16228, 3.16228]
    // ‖w‖ = √5, ‖u‖ = √20 → c = 0.5; w - 0.1·0.5·u = w - 0.158114
    close(&step("lamb", |_| {}), &[0.841886, -2.158114], 1e-5);
    // clipped: c_max = 0.3 → w - 0.1·0.3·√10 = w - 0.0948683
    close(
        &step("lamb", |c| c.lamb_max = 0.3),
        &[0.905132, -2.094868],
        1e-5,
    );
}

#[test]
fn onebit_adam_warmup_step() {
    // no bias correction: u = m/√v = √10·sign(g); w - 0.1·3.16228
    close(&step("onebit-adam", |_| {}), &[0.683772, -2.316228], 1e-5);
}

#[test]
fn onebit_lamb_warmup_then_compressed_step() {
    let cfg = OptConfig {
        method: "onebit-lamb".parse().unwrap(),
        freeze_step: 1,
        ..OptConfig::default()
    };
    let mut o = OnebitLamb::new(&cfg, vec![(0, 2)], 2);
    let mut w = W.to_vec();
    assert!(!o.compressing(0));
    o.warmup_step(&mut w, &G, 0.1, 0);
    close(&w, &[0.841886, -2.158114], 1e-5); // = LAMB
    close(&o.c_avg, &[0.05], 1e-5); // 0.9·0 + 0.1·0.5
    let v_frozen = o.lamb.v.clone();
    let c_frozen = o.c_avg.clone();
    assert_eq!(
        o.v_fresh, v_frozen,
        "fresh variance starts as a copy of the frozen one"
    );
    assert!(o.compressing(1));
    // m_prev = [0.05, 0.025]; m = 0.9·m_prev + 0.1·g = [0.095, 0.0475]; one tensor → k = 1
    let m = o.local_momentum(&G);
    close(&m, &[0.095, 0.0475], 1e-7);
    // identity "allreduce" (P = 1); g_rec = g; v_fresh = 1.999·v_frozen
    // u = m/√v_frozen = [6.00833, 6.00833]; r = 1/√1.999 = 0.7073 → clipped to 0.9·r_prev = 0.9
    // c = 0.9·0.05 = 0.045; w - 0.1·0.045·6.00833 = w - 0.0270375
    o.compressed_step(&mut w, m, 0.1);
    close(&w, &[0.814849, -2.185151], 1e-5);
    close(&o.r_prev, &[0.9], 1e-7);
    close(&o.v_fresh, &[0.00049975, 0.000124937_5], 2e-8); // f32 cancellation in g_rec
    assert_eq!(o.lamb.v, v_frozen, "variance frozen after freeze_step");
    assert_eq!(
        o.c_avg, c_frozen,
        "coefficient EMA frozen after freeze_step"
    );
    // a second compressed step: r may move at most ±10 % again (0.81 lower bound)
    let m = o.local_momentum(&G);
    o.compressed_step(&mut w, m, 0.1);
    assert_eq!(o.lamb.v, v_frozen);
    assert_eq!(o.c_avg, c_frozen);
    assert!((o.r_prev[0] - 0.81).abs() < 1e-6, "r = {}", o.r_prev[0]);
}

#[test]
fn schedules() {
    assert_eq!(lr_at(1.0, 0, 4, 10, Decay::None), 0.25);
    assert_eq!(lr_at(1.0, 3, 4, 10, Decay::Linear), 1.0);
    assert!((lr_at(1.0, 7, 4, 10, Decay::Linear) - 0.5).abs() < 1e-6); // (7-4)/6 of the way
    assert!((lr_at(1.0, 7, 4, 10, Decay::Cosine) - 0.5).abs() < 1e-6); // cos(π/2) = 0
    assert!((lr_at(2.0, 5, 0, 10, Decay::Cosine) - 1.0).abs() < 1e-6);
    assert_eq!(lr_at(1.0, 9, 0, 10, Decay::None), 1.0);
}
