//! `Residual::absorb` (docs/MEMORY.md: the accumulator is built in the residual's buffer and the
//! gradient freed at once) against error feedback written out here: over several steps of
//! different data, `acc = g + residual` entry by entry (the same bits as a plain f32 loop),
//! the residual empty until it is settled, and the settled residual equal to `acc` with a
//! brute-force top-k zeroed (Alistarh et al. 2018; Ok-Topk Algorithm 2).
//!
//! `Residual::settle_norm` (docs/MEMORY.md, fifth round: the residual's norm from the accumulation's
//! `Σ acc²` less the squares of the entries that leave, instead of a pass over the residual)
//! against the norm summed here over a residual settled by hand, for every `Leaves` rule, for
//! selections that take little, most, or all of the accumulator's energy, and for values that
//! are not finite.

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

/// `f` run in rayon pools of 1, 2, 3 and 8 threads.
fn per_pool<T>(f: impl Fn(&rayon::ThreadPool) -> T) -> Vec<T> {
    [1, 2, 3, 8]
        .into_iter()
        .map(|t| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap();
            f(&pool)
        })
        .collect()
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
    let norms: Vec<u64> = per_pool(|pool| {
        // Several calls per pool: work stealing splits differently from call to call.
        let first = pool.install(|| r.norm());
        for _ in 0..5 {
            assert_eq!(pool.install(|| r.norm()).to_bits(), first.to_bits());
        }
        first.to_bits()
    });
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

/// Every other index of `x` in `[0, n)`, from `from` on: a set overlapping a selection.
fn every_other(n: usize, from: usize) -> Vec<u32> {
    (from..n).step_by(2).map(|i| i as u32).collect()
}

/// The residual as each rule leaves it, written out.
fn settled_by_hand(acc: &[f32], rule: Leaves, sent: &[u32], result: &[u32]) -> Vec<f32> {
    let mut r = acc.to_vec();
    let in_result = |i: &u32| result.binary_search(i).is_ok();
    let leaving: Vec<u32> = match rule {
        Leaves::Sent => sent.to_vec(),
        Leaves::Result => result.to_vec(),
        Leaves::SentInResult => sent.iter().copied().filter(in_result).collect(),
    };
    for i in leaving {
        r[i as usize] = 0.0;
    }
    r
}

fn plain_norm(x: &[f32]) -> f64 {
    x.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt()
}

fn close(got: f64, want: f64, ctx: &str) {
    assert!(
        (got - want).abs() <= 1e-12 * want.max(1e-300),
        "{ctx}: norm {got} vs {want} (summed over the settled residual)"
    );
}

const RULES: [Leaves; 3] = [Leaves::Sent, Leaves::SentInResult, Leaves::Result];

#[test]
fn settle_norm_is_the_norm_of_the_settled_residual() {
    // Lengths below and above the parallel chunk (65536), one not a multiple of it; from a
    // few entries leaving to all of them.
    for n in [1usize, 9, 1000, 200_003] {
        let mut rng = Rng::new(0xacc ^ n as u64);
        for k in [1, n / 100 + 1, n / 2 + 1, n] {
            for rule in RULES {
                let ctx = format!("n {n} k {k} {rule:?}");
                let mut r = Residual {
                    values: gradient(&mut rng, n),
                };
                let g = gradient(&mut rng, n);
                let acc_by_hand: Vec<f32> = g.iter().zip(&r.values).map(|(a, b)| a + b).collect();
                let sent = topk_by_sorting(&acc_by_hand, k);
                let result = every_other(n, 1);
                let (acc, sq) = r.absorb_squared(g);
                assert_eq!(acc, acc_by_hand, "{ctx}: acc");
                close(
                    sq.sqrt(),
                    plain_norm(&acc_by_hand),
                    &format!("{ctx}: Σ acc²"),
                );
                let norm = r.settle_norm(acc, rule, &sent, &result, sq);
                let want = settled_by_hand(&acc_by_hand, rule, &sent, &result);
                assert_eq!(r.values, want, "{ctx}: residual");
                close(norm, plain_norm(&want), &ctx);
                close(norm, r.norm(), &format!("{ctx}: against Residual::norm"));
            }
        }
    }
}

#[test]
fn compensate_returns_the_accumulators_sum_of_squares() {
    let mut rng = Rng::new(5);
    let n = 150_001;
    let r = Residual {
        values: gradient(&mut rng, n),
    };
    let mut acc = gradient(&mut rng, n);
    let want: Vec<f32> = acc.iter().zip(&r.values).map(|(a, b)| a + b).collect();
    let sq = r.compensate(&mut acc);
    assert_eq!(acc, want);
    close(sq.sqrt(), plain_norm(&want), "compensate");
    // gradselect's order: compensate, then settle by its selection.
    let mut r = r;
    settle_top_and_check(&mut r, acc, sq, 1500, "compensate then settle_norm");
}

/// Settles `acc` (with its `Σ acc²`) by its top k under `Leaves::Sent` and checks the norm
/// against the residual settled by hand.
fn settle_top_and_check(r: &mut Residual, acc: Vec<f32>, sq: f64, k: usize, ctx: &str) {
    let sent = topk_by_sorting(&acc, k);
    let want = plain_norm(&settled_by_hand(&acc, Leaves::Sent, &sent, &[]));
    close(r.settle_norm(acc, Leaves::Sent, &sent, &[], sq), want, ctx);
}

#[test]
fn the_first_step_has_an_empty_residual() {
    let mut rng = Rng::new(11);
    let g = gradient(&mut rng, 70_000);
    let mut r = Residual::default();
    let (acc, sq) = r.absorb_squared(g.clone());
    assert_eq!(acc, g);
    close(sq.sqrt(), plain_norm(&g), "Σ g²");
    settle_top_and_check(&mut r, acc, sq, 700, "first step");
}

#[test]
fn nothing_left_is_exactly_zero_and_near_cancellation_keeps_its_digits() {
    // Everything leaves: the norm is 0, not the rounding left of Σacc² − Σleft².
    let mut rng = Rng::new(3);
    let n = 100_000;
    let g = gradient(&mut rng, n);
    let mut r = Residual::default();
    let (acc, sq) = r.absorb_squared(g);
    let all: Vec<u32> = (0..n as u32).collect();
    assert_eq!(r.settle_norm(acc, Leaves::Sent, &all, &[], sq), 0.0);
    // A few huge entries leave and tiny ones stay: the difference of the sums would have no
    // correct digit left; the norm must still be the tiny entries' norm.
    let mut acc: Vec<f32> = (0..n).map(|i| 1e-6 * (1 + i % 7) as f32).collect();
    for i in (0..n).step_by(1000) {
        acc[i] = 1e6;
    }
    let big: Vec<u32> = (0..n as u32).step_by(1000).collect();
    let mut r = Residual::default();
    let (acc, sq) = r.absorb_squared(acc);
    let want = plain_norm(&settled_by_hand(&acc, Leaves::Sent, &big, &[]));
    let got = r.settle_norm(acc, Leaves::Sent, &big, &[], sq);
    close(got, want, "tiny entries after huge ones left");
}

#[test]
fn values_that_are_not_finite() {
    let n = 1000;
    let base: Vec<f32> = (0..n).map(|i| (i % 10) as f32 * 0.1).collect();
    for (bad, leaves, want_nan, want_inf) in [
        (f32::INFINITY, true, false, false),
        (f32::INFINITY, false, false, true),
        (f32::NAN, true, false, false),
        (f32::NAN, false, true, false),
    ] {
        let mut acc = base.clone();
        acc[17] = bad;
        let sent: Vec<u32> = if leaves {
            vec![3, 17, 400]
        } else {
            vec![3, 400]
        };
        let mut r = Residual::default();
        let (acc, sq) = r.absorb_squared(acc);
        let want_res = settled_by_hand(&acc, Leaves::Sent, &sent, &[]);
        let got = r.settle_norm(acc, Leaves::Sent, &sent, &[], sq);
        let ctx = format!("{bad} {}", if leaves { "leaves" } else { "stays" });
        if want_nan {
            assert!(got.is_nan(), "{ctx}: {got}");
        } else if want_inf {
            assert_eq!(got, f64::INFINITY, "{ctx}");
        } else {
            close(got, plain_norm(&want_res), &ctx);
        }
    }
}

#[test]
fn settle_norm_has_the_same_bits_on_any_number_of_threads() {
    let mut rng = Rng::new(21);
    let n = 1_000_003;
    let res = gradient(&mut rng, n);
    let g = gradient(&mut rng, n);
    let norms: Vec<u64> = per_pool(|pool| {
        pool.install(|| {
            let mut r = Residual {
                values: res.clone(),
            };
            let (acc, sq) = r.absorb_squared(g.clone());
            let sent = topk_by_sorting(&acc, 10_000);
            r.settle_norm(acc, Leaves::Sent, &sent, &[], sq).to_bits()
        })
    });
    assert!(norms.iter().all(|&b| b == norms[0]), "{norms:?}");
}
