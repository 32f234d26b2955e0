//! Random-k (Stich et al. 2018; GRACE's `randomk`, anchors.md §1.5): k indices drawn uniformly
//! without replacement from a generator seeded by (seed, step, stream) only, so every rank
//! draws the same indices at a step and a plain allreduce of the values works.

use rand::{Rng, SeedableRng};

/// SplitMix64 finaliser: mixes the seed parts into one well-spread 64-bit seed.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The generator seed of (seed, step, stream); `stream` separates layers with `--scope layer`.
pub fn step_seed(seed: u64, step: u32, stream: u64) -> u64 {
    mix(mix(mix(seed) ^ step as u64) ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// k distinct indices of 0..n, ascending (Floyd's algorithm over a bitmap; O(k + n/64)).
pub fn indices(n: usize, k: usize, seed: u64, step: u32, stream: u64) -> Vec<u32> {
    let k = k.min(n);
    if k == n {
        return (0..n as u32).collect();
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(step_seed(seed, step, stream));
    let mut bits = vec![0u64; n.div_ceil(64)];
    fn set(i: usize, bits: &mut [u64]) -> bool {
        let (w, b) = (i / 64, 1u64 << (i % 64));
        let had = bits[w] & b != 0;
        bits[w] |= b;
        had
    }
    for j in (n - k)..n {
        let t = rng.gen_range(0..=j);
        if set(t, &mut bits) {
            set(j, &mut bits);
        }
    }
    let mut out = Vec::with_capacity(k);
    for (w, &word) in bits.iter().enumerate() {
        let mut m = word;
        while m != 0 {
            let b = m.trailing_zeros() as usize;
            out.push((w * 64 + b) as u32);
            m &= m - 1;
        }
    }
    out
}
