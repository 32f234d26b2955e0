//! The dense allreduces that give back the pages of dead chunks
//! (ring, ring-fp16, Rabenseifner) and the tree that moves its vectors
//! (`DenseReducer` → `tree_owned`) still produce, bit for bit, the sums their messages
//! define. The references are written here by brute force from each algorithm's
//! definition (which rank adds what, in which order), independently of lib/collectives:
//! a released page read before being overwritten would show as a zero term, a different
//! order as different rounding. Inputs mix magnitudes so that order matters.

use gradkit_collectives::{dense, Flat, Op, Reducer};
use gradkit_comm::{run_local, Comm};
use gradkit_core::trace::Layout;

fn input(r: usize, call: usize, n: usize) -> Vec<f32> {
    let mut g = gradkit_testkit::rng::Rng::new((call * 1009 + r) as u64 + 11);
    (0..n)
        .map(|i| (g.unit_f32() * 2.0 - 1.0) * 10f32.powi((i % 9) as i32 - 4))
        .collect()
}

/// Chunk c of n elements cut in p near-equal parts (`i·n/p`).
fn chunk(n: usize, p: usize, c: usize) -> std::ops::Range<usize> {
    n * c / p..n * (c + 1) / p
}

/// Ring: chunk c starts at rank c and each next rank adds its value to the partial sum.
fn ring_ref(x: &[Vec<f32>], fp16: bool) -> Vec<f32> {
    let (p, n) = (x.len(), x[0].len());
    let round = |v: f32| {
        if fp16 {
            half::f16::from_f32(v).to_f32()
        } else {
            v
        }
    };
    let mut out = vec![0.0; n];
    for c in 0..p {
        for i in chunk(n, p, c) {
            let mut acc = round(x[c][i]);
            for k in 1..p {
                acc = round(x[(c + k) % p][i] + acc);
            }
            out[i] = acc;
        }
    }
    out
}

/// Binomial tree: rank r adds the subtrees of r + 2^j (j above r's highest bit), in
/// ascending j.
fn tree_ref(x: &[Vec<f32>]) -> Vec<f32> {
    fn sub(x: &[Vec<f32>], r: usize) -> Vec<f32> {
        let p = x.len();
        let mut v = x[r].clone();
        let mut bit = if r == 0 {
            1
        } else {
            1 << (usize::BITS - r.leading_zeros())
        };
        while bit < p {
            if r + bit < p {
                for (a, b) in v.iter_mut().zip(sub(x, r + bit)) {
                    *a += b;
                }
            }
            bit <<= 1;
        }
        v
    }
    sub(x, 0)
}

/// Rabenseifner: the first 2q ranks fold pairwise (odd + even), then a butterfly over the
/// p' = 2^⌊log2 P⌋ remaining values, highest bit first.
fn rabenseifner_ref(x: &[Vec<f32>]) -> Vec<f32> {
    let p = x.len();
    let pp = 1usize << (usize::BITS - 1 - p.leading_zeros());
    let q = p - pp;
    let mut v: Vec<Vec<f32>> = (0..pp)
        .map(|nr| {
            if nr < q {
                x[2 * nr + 1]
                    .iter()
                    .zip(&x[2 * nr])
                    .map(|(a, b)| a + b)
                    .collect()
            } else {
                x[nr + q].clone()
            }
        })
        .collect();
    let mut mask = pp >> 1;
    while mask > 0 {
        v = (0..pp)
            .map(|nr| {
                v[nr]
                    .iter()
                    .zip(&v[nr ^ mask])
                    .map(|(a, b)| a + b)
                    .collect()
            })
            .collect();
        mask >>= 1;
    }
    v.swap_remove(0)
}

fn reference(name: &str, x: &[Vec<f32>]) -> Vec<f32> {
    match name {
        "ring" => ring_ref(x, false),
        "ring-fp16" => ring_ref(x, true),
        "rabenseifner" => rabenseifner_ref(x),
        "tree" => tree_ref(x),
        _ => unreachable!(),
    }
}

/// Sizes of successive calls on one reducer: large (chunks span several 2 MiB blocks, so
/// pages are released), smaller, empty, shorter than P, large again (the kept scratch was
/// released in between).
const SIZES: [usize; 5] = [1_500_001, 100_003, 0, 3, 1_200_000];

#[test]
fn dense_algorithms_equal_their_brute_force_order_bit_for_bit() {
    for name in ["ring", "ring-fp16", "rabenseifner", "tree"] {
        for p in 1..=6usize {
            let res = run_local(p, |c: &dyn Comm| {
                let mut red = dense::DenseReducer::new(name, Op::Sum)?;
                let mut out = Vec::new();
                for (call, &n) in SIZES.iter().enumerate() {
                    let layout = Layout::new(vec![(0, "w".into(), n as u64, None)]);
                    let got = red.reduce(
                        c,
                        call as u32,
                        &layout,
                        Flat::Dense(input(c.rank(), call, n)),
                    )?;
                    // The slice form (no kept buffer, no moves) on the same input.
                    let mut plain = input(c.rank(), call, n);
                    dense::allreduce(c, name.parse()?, Op::Sum, &mut plain)?;
                    out.push((got.result.into_dense(n), plain));
                }
                Ok(out)
            })
            .unwrap();
            for (call, &n) in SIZES.iter().enumerate() {
                let x: Vec<Vec<f32>> = (0..p).map(|r| input(r, call, n)).collect();
                let want = if n == 0 {
                    Vec::new()
                } else {
                    reference(name, &x)
                };
                for (r, calls) in res.iter().enumerate() {
                    for (what, got) in [("reducer", &calls[call].0), ("slice", &calls[call].1)] {
                        assert_eq!(got.len(), n, "{name} P={p} n={n} rank {r} {what}");
                        if let Some(i) = (0..n).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                            panic!(
                                "{name} P={p} call {call} n={n} rank {r} {what}: element {i} is {}, want {}",
                                got[i], want[i]
                            );
                        }
                    }
                }
            }
        }
    }
}
