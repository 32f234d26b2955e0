//! Statistics of synthetic traces, checked against references computed here: per-layer norms
//! of VGG-16 span orders of magnitude; top-1% sets persist across steps and overlap across
//! ranks as a bivariate normal with correlation --drift / --overlap predicts; the tail matches
//! the Tukey-h kurtosis; the same seed gives the same values.

use gradkit_core::synth::{self, LayerSpec, SynthSpec};
use gradkit_core::TensorRow;

/// Upper tail of the standard normal, Q(z) = erfc(z/√2)/2 (Numerical Recipes erfcc, rel. err.
/// below 1.2e-7).
fn q(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let p = -x * x - 1.26551223
        + t * (1.00002368
            + t * (0.37409196
                + t * (0.09678418
                    + t * (-0.18628806
                        + t * (0.27886807
                            + t * (-1.13520398
                                + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    let erfc = t * p.exp();
    0.5 * if x >= 0.0 { erfc } else { 2.0 - erfc }
}

/// Expected |A∩B|/k for the top-`frac` sets by |x| of two standard normals with correlation
/// `rho`: P(|X|>t, |Y|>t) / frac, integrated with Simpson's rule.
fn expected_overlap(rho: f64, frac: f64) -> f64 {
    assert!((frac - 0.01).abs() < 1e-12);
    let t = 2.575_829_303_548_900_4; // Q(t) = 0.005
    let s = (1.0 - rho * rho).sqrt();
    let f = |x: f64| {
        let phi = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
        phi * (q((t - rho * x) / s) + q((t + rho * x) / s))
    };
    let (a, b, n) = (t, t + 12.0, 20_000);
    let h = (b - a) / n as f64;
    let mut sum = f(a) + f(b);
    for i in 1..n {
        sum += f(a + i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    2.0 * sum * h / 3.0 / frac
}

fn top_set(values: &[f32], frac: f64) -> std::collections::HashSet<usize> {
    let k = (values.len() as f64 * frac).round() as usize;
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[b].abs().total_cmp(&values[a].abs()));
    idx.truncate(k);
    idx.into_iter().collect()
}

fn overlap(a: &[f32], b: &[f32]) -> f64 {
    let (sa, sb) = (top_set(a, 0.01), top_set(b, 0.01));
    sa.intersection(&sb).count() as f64 / sa.len() as f64
}

fn one_layer(n: u32, ranks: u32, steps: u32, overlap: f64, drift: f64) -> Vec<TensorRow> {
    let mut spec = SynthSpec::new(vec![LayerSpec::new("w", &[n])], ranks, steps, 42);
    spec.overlap = overlap;
    spec.drift = drift;
    synth::generate(&spec).unwrap()
}

fn row(rows: &[TensorRow], step: u32, rank: u32) -> &[f32] {
    &rows
        .iter()
        .find(|r| r.step == step && r.rank == rank)
        .unwrap()
        .values
}

#[test]
fn the_reference_is_right_at_the_ends() {
    assert!((q(0.0) - 0.5).abs() < 1e-7);
    assert!((q(1.959_963_984_540_054) - 0.025).abs() < 1e-8);
    assert!((expected_overlap(0.0, 0.01) - 0.01).abs() < 1e-5);
    assert!((expected_overlap(0.999_999, 0.01) - 1.0).abs() < 0.01);
}

#[test]
fn vgg16_layer_norms_span_two_orders_of_magnitude() {
    let spec = SynthSpec::new(synth::shape("vgg16", 0.25).unwrap(), 1, 1, 3);
    let rows = synth::generate(&spec).unwrap();
    assert_eq!(rows.len(), 54);
    let norms: Vec<f64> = rows
        .iter()
        .map(|r| {
            r.values
                .iter()
                .map(|&v| (v as f64).powi(2))
                .sum::<f64>()
                .sqrt()
        })
        .collect();
    let max = norms.iter().cloned().fold(0.0, f64::max);
    let min = norms.iter().cloned().fold(f64::INFINITY, f64::min);
    assert!(max / min >= 100.0, "norms span only {:.1}x", max / min);
    // And per-element scales, not only layer sizes, differ by more than 10x.
    let rms: Vec<f64> = rows
        .iter()
        .zip(&norms)
        .map(|(r, n)| n / (r.values.len() as f64).sqrt())
        .collect();
    let (lo, hi) = (
        rms.iter().cloned().fold(f64::INFINITY, f64::min),
        rms.iter().cloned().fold(0.0, f64::max),
    );
    assert!(hi / lo > 10.0, "element scales span only {:.1}x", hi / lo);
}

#[test]
fn top_one_percent_persists_across_steps_as_the_drift_implies() {
    let mut measured = Vec::new();
    for drift in [0.5, 0.9, 0.99] {
        let rows = one_layer(200_000, 1, 4, 0.6, drift);
        let m: f64 = (0..3)
            .map(|t| overlap(row(&rows, t, 0), row(&rows, t + 1, 0)))
            .sum::<f64>()
            / 3.0;
        let want = expected_overlap(drift, 0.01);
        assert!(
            (m - want).abs() < 0.03,
            "drift {drift}: overlap {m:.3}, expected {want:.3}"
        );
        eprintln!(
            "param {:?}: measured {m:.4}, expected {want:.4}",
            measured.len()
        );
        measured.push(m);
    }
    assert!(measured.windows(2).all(|w| w[0] < w[1]), "{measured:?}");
}

#[test]
fn ranks_overlap_more_with_higher_overlap() {
    let mut measured = Vec::new();
    for o in [0.2, 0.6, 0.95] {
        let rows = one_layer(200_000, 3, 1, o, 0.9);
        let pairs = [(0, 1), (0, 2), (1, 2)];
        let m: f64 = pairs
            .iter()
            .map(|&(a, b)| overlap(row(&rows, 0, a), row(&rows, 0, b)))
            .sum::<f64>()
            / 3.0;
        let want = expected_overlap(o, 0.01);
        assert!(
            (m - want).abs() < 0.03,
            "overlap {o}: measured {m:.3}, expected {want:.3}"
        );
        eprintln!(
            "param {:?}: measured {m:.4}, expected {want:.4}",
            measured.len()
        );
        measured.push(m);
    }
    assert!(measured.windows(2).all(|w| w[0] < w[1]), "{measured:?}");
}

#[test]
fn tails_have_the_kurtosis_of_the_tukey_h_transform() {
    for h in [0.0, 0.1] {
        let mut spec = SynthSpec::new(vec![LayerSpec::new("w", &[400_000])], 1, 1, 9);
        spec.tail = h;
        let v = &synth::generate(&spec).unwrap()[0].values;
        let n = v.len() as f64;
        let m2 = v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / n;
        let m4 = v.iter().map(|&x| (x as f64).powi(4)).sum::<f64>() / n;
        let kurt = m4 / (m2 * m2);
        // E X^2 = (1-2h)^-3/2, E X^4 = 3 (1-4h)^-5/2 for X = Z exp(hZ²/2).
        let want = 3.0 * (1.0 - 2.0 * h).powi(3) / (1.0 - 4.0 * h).powf(2.5);
        eprintln!("h {h}: kurtosis {kurt:.3}, expected {want:.3}");
        assert!(
            (kurt / want - 1.0).abs() < 0.12,
            "h {h}: kurtosis {kurt:.2}, expected {want:.2}"
        );
    }
}

#[test]
fn same_seed_same_values_and_ranks_do_not_disturb_each_other() {
    let layers = synth::parse_layers("a=300x7,b=50").unwrap();
    let a = synth::generate(&SynthSpec::new(layers.clone(), 2, 3, 5)).unwrap();
    let b = synth::generate(&SynthSpec::new(layers.clone(), 2, 3, 5)).unwrap();
    assert_eq!(a, b);
    let c = synth::generate(&SynthSpec::new(layers.clone(), 2, 3, 6)).unwrap();
    assert_ne!(a[0].values, c[0].values);
    // Rank 0's values do not depend on how many ranks there are.
    let d = synth::generate(&SynthSpec::new(layers, 4, 3, 5)).unwrap();
    let r0 = |rows: &[TensorRow]| -> Vec<Vec<f32>> {
        rows.iter()
            .filter(|r| r.rank == 0)
            .map(|r| r.values.clone())
            .collect()
    };
    assert_eq!(r0(&a), r0(&d));
    assert_eq!(a.len(), 2 * 3 * 2);
    assert!(a
        .iter()
        .all(|r| r.shape.is_some() && r.indices.is_none() && r.values.len() as u64 == r.numel));
}

#[test]
fn one_ranks_generator_yields_that_ranks_rows_of_the_whole_trace() {
    let layers = synth::parse_layers("a=300x7,b=50").unwrap();
    let spec = SynthSpec::new(layers, 3, 4, 11);
    let all = synth::generate(&spec).unwrap();
    for r in 0..3 {
        let gen = synth::Generator::for_rank(&spec, r).unwrap();
        assert_eq!(gen.len(), 4);
        let mine: Vec<TensorRow> = gen.flatten().collect();
        let want: Vec<TensorRow> = all.iter().filter(|x| x.rank == r).cloned().collect();
        assert_eq!(mine.len(), 4 * 2);
        assert_eq!(mine, want, "rank {r}");
    }
    let e = synth::Generator::for_rank(&spec, 3).err().unwrap();
    assert!(e.to_string().contains("rank 3"), "{e}");
}

#[test]
fn bad_specs_are_refused_with_the_flag_named() {
    let l = vec![LayerSpec::new("w", &[10])];
    let mut s = SynthSpec::new(l.clone(), 1, 1, 0);
    s.overlap = 1.5;
    assert!(format!("{:#}", synth::generate(&s).unwrap_err()).contains("--overlap"));
    let mut s = SynthSpec::new(l.clone(), 1, 1, 0);
    s.drift = -0.1;
    assert!(format!("{:#}", synth::generate(&s).unwrap_err()).contains("--drift"));
    let s = SynthSpec::new(l, 0, 1, 0);
    assert!(format!("{:#}", synth::generate(&s).unwrap_err()).contains("--ranks"));
    assert!(format!("{:#}", synth::shape("resnet", 1.0).unwrap_err()).contains("--shape"));
    assert!(format!("{:#}", synth::shape("mlp", 0.0).unwrap_err()).contains("--scale"));
}
