//! `Residual::absorb` (issue 19: the accumulator is built in the residual's buffer and the
//! gradient freed at once) against error feedback written out here: over several steps of
//! different data, `acc = g + residual` entry by entry (the same bits as a plain f32 loop),
//! the residual empty until it is settled, and the settled residual equal to `acc` with a
//! brute-force top-k zeroed (Alistarh et al. 2018; Ok-Topk Algorithm 2).

use gradkit_sparsify::{Leaves, Residual};
use gradkit_testkit::rng::Rng;

/// Values of every scale and sign (non-dyadic, so the f32 sums round), with exact zeros and
/// negative zeros mixed in.
fn gradient(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| match rng.below(16) {
            0 => 0.0,
            1 => -0.0,
            _ => {
                let m = (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                m * 2f32.powi(rng.below(20) as i32 - 10)
            }
        })
        .collect()
}

/// Indices of the k largest |x| (the lower index among equals), ascending, by sorting.
fn topk_by_sorting(x: &[f32], k: usize) -> Vec<u32> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[b].abs().total_cmp(&x[a].abs()).then(a.cmp(&b)));
    let mut top: Vec<u32> = order[..k].iter().map(|&i| i as u32).collect();
    top.sort_unstable();
    top
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn absorb_over_steps_matches_error_feedback_written_out() {
    // Lengths below and above the parallel chunk (65536), one not a multiple of it.
    for (n, k) in [(1usize, 1usize), (1000, 10), (200_003, 2_000)] {
        let mut rng = Rng::new(0x5eed ^ n as u64);
        let mut r = Residual::default();
        let mut reference: Vec<f32> = Vec::new();
        for step in 0..5 {
            let g = gradient(&mut rng, n);
            let want: Vec<f32> = if reference.is_empty() {
                g.clone()
            } else {
                g.iter().zip(&reference).map(|(a, b)| a + b).collect()
            };
            let acc = r.absorb(g);
            assert_eq!(
                bits(&acc),
                bits(&want),
                "n {n} step {step}: acc = g + residual"
            );
            assert!(
                r.values.is_empty(),
                "n {n} step {step}: the residual is held by the accumulator until settled"
            );
            let sel = topk_by_sorting(&want, k);
            r.settle(acc, Leaves::Sent, &sel, &[]);
            reference = want;
            for &i in &sel {
                reference[i as usize] = 0.0;
            }
            assert_eq!(
                bits(&r.values),
                bits(&reference),
                "n {n} step {step}: residual"
            );
        }
    }
}

#[test]
fn absorb_gives_the_same_bits_as_accumulate() {
    let mut rng = Rng::new(7);
    let n = 70_000;
    let res = Residual {
        values: gradient(&mut rng, n),
    };
    let g = gradient(&mut rng, n);
    let by_hand: Vec<f32> = g.iter().zip(&res.values).map(|(a, b)| a + b).collect();
    let mut taken = res.clone();
    let absorbed = taken.absorb(g.clone());
    assert_eq!(bits(&absorbed), bits(&by_hand));
    assert_eq!(bits(&res.accumulate(g)), bits(&by_hand));
}

#[test]
#[should_panic(expected = "gradient and residual lengths")]
fn absorb_refuses_a_gradient_of_another_length() {
    let mut r = Residual::zeros(4);
    r.absorb(vec![1.0; 5]);
}

#[test]
fn the_norm_has_the_same_bits_on_any_number_of_threads() {
    let mut rng = Rng::new(21);
    let r = Residual {
        values: gradient(&mut rng, 1_000_003),
    };
    let exact: f64 = r
        .values
        .iter()
        .map(|&v| v as f64 * v as f64)
        .sum::<f64>()
        .sqrt();
    let norms: Vec<u64> = [1, 2, 3, 8]
        .into_iter()
        .map(|t| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap();
            // Several calls per pool: work stealing splits differently from call to call.
            let first = pool.install(|| r.norm());
            for _ in 0..5 {
                assert_eq!(pool.install(|| r.norm()).to_bits(), first.to_bits());
            }
            first.to_bits()
        })
        .collect();
    assert!(norms.iter().all(|&b| b == norms[0]), "{norms:?}");
    // As gradallreduce runs it: several ranks (threads) in one shared pool at once.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    std::thread::scope(|sc| {
        for _ in 0..4 {
            sc.spawn(|| {
                for _ in 0..10 {
                    assert_eq!(pool.install(|| r.norm()).to_bits(), norms[0]);
                }
            });
        }
    });
    let got = f64::from_bits(norms[0]);
    assert!((got - exact).abs() <= 1e-12 * exact, "{got} vs {exact}");
}
