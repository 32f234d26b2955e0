//! `--onebit-clip off --onebit-mask none` (`--onebit-exact`): one compressed step of 1-bit
//! LAMB / 1-bit Adam equals an independent f64 re-implementation of DeepSpeed's
//! `OnebitLamb.step` / `OnebitAdam.step` (deepspeed/runtime/fp16/onebit/{lamb,adam}.py:
//! no bias correction, scaling_coeff, fresh variance from the reconstructed gradient, factor
//! clipped to [factor_min, factor_max] and ±factor_threshold, no momentum mask by default);
//! with the clip on, the ratio m/(√v_frozen+η) stays within Adam's bound.

use gradkit_train::optim::{OnebitAdam, OnebitLamb, OptConfig};

const B1: f64 = 0.9;
const B2: f64 = 0.999;
const EPS: f64 = 1e-8;

/// (1−β1)/√((1−β2)(1−β1²/β2)), derived by hand for the test.
fn bound() -> f64 {
    (1.0 - B1) / ((1.0 - B2) * (1.0 - B1 * B1 / B2)).sqrt()
}

/// Deterministic gradients; entry `dead` is exactly 0 through the warm-up (frozen v = 0).
fn grad(t: usize, n: usize, dead: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            if i == dead {
                0.0
            } else {
                (((t * 7 + i * 13) % 11) as f32 - 5.0) * 0.01 * (1.0 + i as f32 * 0.3)
            }
        })
        .collect()
}

/// The 1-bit compressor C of one chunk (sign, scale = RMS), standing in for the compressed
/// allreduce at P = 1 (any averaged momentum would do: the step takes it as given).
fn one_bit(x: &[f32]) -> Vec<f32> {
    let rms = (x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64).sqrt();
    x.iter()
        .map(|v| if *v >= 0.0 { rms as f32 } else { -rms as f32 })
        .collect()
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn close(got: &[f32], want: &[f64], what: &str) {
    let scale = want.iter().fold(0.0f64, |a, x| a.max(x.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (*g as f64 - w).abs();
        assert!(
            err <= 2e-4 * w.abs() + 1e-6 * scale,
            "{what}[{i}]: code {g} vs reference {w}"
        );
    }
}

const SEGS: [(usize, usize); 2] = [(0, 5), (5, 3)];
const N: usize = 8;
const DEAD: usize = 2;
const WARM: usize = 3;
const WD: f64 = 0.01;
const LR: f64 = 0.02;

fn lamb_cfg(clip: bool) -> OptConfig {
    OptConfig {
        method: "onebit-lamb".parse().unwrap(),
        weight_decay: WD as f32,
        freeze_step: WARM as u32,
        onebit_clip: clip,
        onebit_mask: false,
        ..OptConfig::default()
    }
}

/// Runs the code: WARM warm-up steps, then one compressed step; returns (w before the
/// compressed step, w after, the averaged momentum handed to it).
fn run_lamb(clip: bool) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut o = OnebitLamb::new(&lamb_cfg(clip), SEGS.to_vec(), N);
    let mut w: Vec<f32> = (0..N).map(|i| 0.5 - 0.1 * i as f32).collect();
    for t in 0..WARM {
        o.warmup_step(&mut w, &grad(t, N, DEAD), LR as f32, t as u32);
    }
    let local = grad(WARM, N, usize::MAX); // the dead entry wakes up after the freeze
    let m = o.local_momentum(&local);
    let avg = one_bit(&m);
    let before = w.clone();
    o.compressed_step(&mut w, avg.clone(), LR as f32);
    (before, w, avg)
}

/// DeepSpeed's OnebitLamb in f64, from the same gradients; `clip`: the gradkit option.
fn reference_lamb(avg: &[f32], clip: bool) -> (Vec<f64>, Vec<f64>, f64) {
    let mut x: Vec<f64> = (0..N).map(|i| 0.5 - 0.1 * i as f64).collect();
    let (mut m, mut v) = (vec![0.0f64; N], vec![0.0f64; N]);
    let mut c_freeze = [0.0f64; 2];
    for t in 0..WARM {
        let g = grad(t, N, DEAD);
        for (l, &(o, n)) in SEGS.iter().enumerate() {
            let mut upd = vec![0.0; n];
            for j in 0..n {
                let gi = g[o + j] as f64;
                m[o + j] = B1 * m[o + j] + (1.0 - B1) * gi;
                v[o + j] = B2 * v[o + j] + (1.0 - B2) * gi * gi;
                upd[j] = m[o + j] / (v[o + j].sqrt() + EPS) + WD * x[o + j];
            }
            let (wn, un) = (norm(&x[o..o + n]), norm(&upd));
            let mut c = 1.0;
            if wn != 0.0 && un != 0.0 {
                c = (wn / un).clamp(0.01, 10.0);
            }
            if c != 1.0 {
                c_freeze[l] = 0.9 * c_freeze[l] + 0.1 * c;
            }
            for j in 0..n {
                x[o + j] -= LR * c * upd[j];
            }
        }
    }
    let v_fresh0 = v.clone();
    // scaling_coeff from exp_avg at the start of the first compression step
    let s: Vec<f64> = SEGS
        .iter()
        .map(|&(o, n)| norm(&m[o..o + n]) / (n as f64).sqrt())
        .collect();
    let united = s.iter().sum::<f64>() / s.len() as f64;
    let before = x.clone();
    let mut max_abs_ratio = 0.0f64;
    for (l, &(o, n)) in SEGS.iter().enumerate() {
        let k = united / s[l];
        let mut u_pre = vec![0.0; n];
        let mut u = vec![0.0; n];
        let mut factor = f64::NEG_INFINITY;
        for j in 0..n {
            let i = o + j;
            let ma = avg[i] as f64 / k; // exp_avg.div_(scaling_coeff); no mask
            let g_rec = (ma - m[i] * B1) / (1.0 - B1);
            let vf = B2 * v_fresh0[i] + (1.0 - B2) * g_rec * g_rec;
            let denom = v[i].sqrt() + EPS;
            let mut r = ma / denom;
            max_abs_ratio = max_abs_ratio.max(r.abs());
            if clip {
                r = r.clamp(-bound(), bound());
            }
            u_pre[j] = r;
            u[j] = r + WD * x[i];
            factor = factor.max(denom / (vf.sqrt() + EPS));
        }
        let ratio = (norm(&u_pre) / norm(&u)).min(1.0);
        factor = factor * ratio + (1.0 - ratio);
        factor = factor.clamp(0.5, 4.0).clamp(0.9, 1.1); // last_factor = 1.0
        let coeff = c_freeze[l] * factor;
        for j in 0..n {
            x[o + j] -= LR * coeff * u[j];
        }
    }
    (before, x, max_abs_ratio)
}

#[test]
fn onebit_lamb_exact_step_equals_deepspeed() {
    let (before, after, avg) = run_lamb(false);
    let (rb, ra, max_ratio) = reference_lamb(&avg, false);
    close(&before, &rb, "warm-up weights");
    let d: Vec<f32> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let rd: Vec<f64> = ra.iter().zip(&rb).map(|(a, b)| a - b).collect();
    close(&d, &rd, "compressed-step update");
    // The case the clip exists for: the dead entry's ratio is |m|/η, far above the bound.
    assert!(max_ratio > 1e3 * bound(), "ratio {max_ratio}");
    assert!(after.iter().all(|x| x.is_finite()));
}

#[test]
fn onebit_lamb_clip_on_holds_the_bound() {
    let (before, after, avg) = run_lamb(true);
    let (rb, ra, max_ratio) = reference_lamb(&avg, true);
    assert!(max_ratio > bound(), "the clip must be engaged in this case");
    let d: Vec<f32> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let rd: Vec<f64> = ra.iter().zip(&rb).map(|(a, b)| a - b).collect();
    close(&d, &rd, "clipped compressed-step update");
}

fn adam_run(clip: bool, mask: bool) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let cfg = OptConfig {
        method: "onebit-adam".parse().unwrap(),
        freeze_step: WARM as u32,
        onebit_clip: clip,
        onebit_mask: mask,
        ..OptConfig::default()
    };
    let mut o = OnebitAdam::new(&cfg, N);
    let mut w: Vec<f32> = (0..N).map(|i| 0.5 - 0.1 * i as f32).collect();
    for t in 0..WARM {
        o.warmup_step(&mut w, &grad(t, N, DEAD), LR as f32);
    }
    let m = o.local_momentum(&grad(WARM, N, usize::MAX));
    let avg = one_bit(&m);
    let before = w.clone();
    o.compressed_step(&mut w, avg.clone(), LR as f32);
    (before, w, avg)
}

/// DeepSpeed's OnebitAdam (no bias correction, weight decay 0): the compressed step is
/// x -= lr·m_avg/(√v_frozen + η) with exp_avg = the allreduced momentum, unmasked.
fn adam_reference(avg: &[f32]) -> Vec<f64> {
    let (mut m, mut v) = (vec![0.0f64; N], vec![0.0f64; N]);
    for t in 0..WARM {
        let g = grad(t, N, DEAD);
        for i in 0..N {
            m[i] = B1 * m[i] + (1.0 - B1) * g[i] as f64;
            v[i] = B2 * v[i] + (1.0 - B2) * (g[i] as f64).powi(2);
        }
    }
    (0..N)
        .map(|i| -LR * avg[i] as f64 / (v[i].sqrt() + EPS))
        .collect()
}

#[test]
fn onebit_adam_exact_step_equals_deepspeed_and_clip_bounds_it() {
    let (before, after, avg) = adam_run(false, false);
    let d: Vec<f32> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let want = adam_reference(&avg);
    close(&d, &want, "1-bit Adam exact update");
    assert!(want[DEAD].abs() / LR > 1e3 * bound());

    let (before, after, _) = adam_run(true, false);
    for (i, (a, b)) in after.iter().zip(&before).enumerate() {
        let ratio = ((a - b) as f64 / LR).abs();
        assert!(
            ratio <= bound() * (1.0 + 1e-5),
            "entry {i}: |Δw|/lr = {ratio}"
        );
    }
    // clipped entry sits exactly at the bound
    let r = ((after[DEAD] - before[DEAD]) as f64 / LR).abs();
    assert!((r - bound()).abs() / bound() < 1e-4, "{r} vs {}", bound());

    // the derived mask (default) zeroes the never-seen entry instead
    let (before, after, _) = adam_run(false, true);
    assert_eq!(after[DEAD], before[DEAD]);
}
