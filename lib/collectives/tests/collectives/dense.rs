//! Dense allreduces against a single-process f64 sum, and their exact traffic.

use gradkit_collectives::{cost, dense, Op};
use gradkit_comm::{run_local, Comm};

/// Rank r's input: a deterministic pseudo-random vector, uniform in [−1, 1), different per
/// rank (gradkit-testkit's seeded generator).
fn input(r: usize, n: usize) -> Vec<f32> {
    let mut g = gradkit_testkit::rng::Rng::new(r as u64 + 1);
    (0..n).map(|_| g.unit_f32() * 2.0 - 1.0).collect()
}

fn reference(p: usize, n: usize) -> Vec<f64> {
    let mut acc = vec![0f64; n];
    for r in 0..p {
        for (a, x) in acc.iter_mut().zip(input(r, n)) {
            *a += x as f64;
        }
    }
    acc
}

fn check(name: &str, p: usize, n: usize, op: Op) {
    let want = reference(p, n);
    let scale = if op == Op::Mean { 1.0 / p as f64 } else { 1.0 };
    let res = run_local(p, |c: &dyn Comm| {
        let mut x = input(c.rank(), n);
        dense::allreduce(c, name.parse()?, op, &mut x)?;
        Ok((x, c.traffic().total()))
    })
    .unwrap();
    for (r, (x, _)) in res.iter().enumerate() {
        assert_eq!(x.len(), n);
        for (i, (&g, &w)) in x.iter().zip(&want).enumerate() {
            let w = w * scale;
            assert!(
                (g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()) * p as f64,
                "{name} P={p} n={n} rank {r} i={i}: {g} vs {w}"
            );
        }
    }
    // Every rank holds the same bits.
    for (x, _) in &res[1..] {
        assert_eq!(x, &res[0].0, "{name} P={p} n={n}: ranks differ");
    }
}

#[test]
fn every_dense_algorithm_matches_the_f64_sum() {
    for name in ["ring", "rabenseifner", "tree", "native"] {
        for p in [1usize, 2, 3, 4, 5, 7, 8] {
            for n in [0usize, 1, p - 1, 1000, (1 << 20) + 3] {
                if n > 1000 && p > 4 && name != "ring" {
                    continue; // the large size once per algorithm family is enough here
                }
                check(name, p, n, if n % 2 == 0 { Op::Sum } else { Op::Mean });
            }
        }
    }
}

fn traffic(name: &str, p: usize, n: usize) -> Vec<gradkit_comm::PhaseCounts> {
    run_local(p, |c: &dyn Comm| {
        let mut x = input(c.rank(), n);
        dense::allreduce(c, name.parse()?, Op::Sum, &mut x)?;
        Ok(c.traffic().total())
    })
    .unwrap()
}

#[test]
fn ring_traffic_is_exact() {
    for p in [1usize, 2, 3, 4, 5, 7, 8] {
        for n in [0usize, 1, p + 1, 1000, 4096] {
            for (r, t) in traffic("ring", p, n).iter().enumerate() {
                // Independent statement of the formula: chunk i has floor((i+1)n/P) − floor(i n/P)
                // elements; rank r sends all chunks but r+1 (reduce-scatter) and r+2 (allgather).
                let c = |i: usize| ((i + 1) * n / p - i * n / p) as u64;
                let want = if p == 1 {
                    0
                } else {
                    4 * (2 * n as u64 - c((r + 1) % p) - c((r + 2) % p))
                };
                assert_eq!(t.bytes_sent, want, "P={p} n={n} r={r}");
                assert_eq!(t.bytes_sent, cost::ring_bytes_sent(p, n, r));
                assert_eq!(t.msgs_sent, 2 * (p as u64 - 1));
                if n % p == 0 && p > 1 {
                    assert_eq!(t.bytes_sent, (2 * (p - 1) * n / p * 4) as u64);
                }
            }
        }
    }
}

#[test]
fn rabenseifner_and_tree_traffic_are_exact() {
    let n = 4096usize;
    for p in [2usize, 4, 8] {
        for t in traffic("rabenseifner", p, n) {
            assert_eq!(t.bytes_sent, (2 * (p - 1) * n / p * 4) as u64, "P={p}");
            assert_eq!(t.msgs_sent, 2 * (p as f64).log2() as u64);
        }
    }
    // Non-power of two: P = 6 → p' = 4, q = 2; ranks 0 and 2 fold (send n, get n back).
    let p = 6;
    let t = traffic("rabenseifner", p, n);
    for r in [0usize, 2] {
        assert_eq!(t[r].bytes_sent, (n * 4) as u64);
        assert_eq!(t[r].bytes_recv, (n * 4) as u64);
        assert_eq!(t[r].msgs_sent, 1);
    }
    for r in [1usize, 3] {
        // core rank: halving + doubling over p' = 4 plus sending the result back
        assert_eq!(t[r].bytes_sent, (2 * 3 * n / 4 * 4 + n * 4) as u64);
    }
    for r in [4usize, 5] {
        assert_eq!(t[r].bytes_sent, (2 * 3 * n / 4 * 4) as u64);
    }
    // Tree: every non-root sends n up once; each rank sends n to each child in broadcast.
    for p in [2usize, 3, 5, 8] {
        let t = traffic("tree", p, n);
        for (r, tr) in t.iter().enumerate() {
            let children = (0..p)
                .filter(|&c| c != 0 && c - (1 << (usize::BITS - 1 - c.leading_zeros())) == r)
                .count();
            let up = if r == 0 { 0 } else { 1 };
            assert_eq!(
                tr.bytes_sent,
                ((up + children) * n * 4) as u64,
                "tree P={p} r={r}"
            );
        }
    }
}

/// The fp16-wire ring: every rank ends with the same fp16-representable values, within the
/// rounding of P − 1 fp16 partial sums of the f64 reference, in exactly half the bytes of the
/// f32 ring's messages (same message count).
#[test]
fn ring_fp16_sums_within_fp16_rounding_in_half_the_bytes() {
    for p in 1..=5usize {
        for n in [0usize, 1, 3, 7, 1000, 4099] {
            let want = reference(p, n);
            let run = |name: &'static str| {
                run_local(p, move |c: &dyn Comm| {
                    let mut x = input(c.rank(), n);
                    dense::allreduce(c, name.parse()?, Op::Sum, &mut x)?;
                    Ok((x, c.traffic().total()))
                })
                .unwrap()
            };
            let (half, full) = (run("ring-fp16"), run("ring"));
            for (r, ((x, t), (_, tf))) in half.iter().zip(&full).enumerate() {
                assert_eq!(x, &half[0].0, "P={p} n={n}: rank {r} differs from rank 0");
                assert_eq!(t.msgs_sent, tf.msgs_sent, "P={p} n={n}: message count");
                assert_eq!(2 * t.bytes_sent, tf.bytes_sent, "P={p} n={n}: fp16 bytes");
                for (i, (&g, &w)) in x.iter().zip(&want).enumerate() {
                    let h = half::f16::from_f32(g).to_f32();
                    assert_eq!(h, g, "P={p} n={n} i={i}: {g} is not an fp16 value");
                    // Each of the P roundings (inputs and partial sums, |·| ≤ P) errs by at
                    // most half an fp16 ulp relative: 2^-11.
                    let tol = p as f64 * p as f64 * 2f64.powi(-11) + 1e-7;
                    assert!((g as f64 - w).abs() <= tol, "P={p} n={n} i={i}: {g} vs {w}");
                }
            }
        }
    }
}
