//! The α-β cost model: predicted per-rank latency terms and volume of every allreduce of the
//! four papers, so measurements here can be checked against the papers' formulas and
//! projected to P = 256 and beyond.
//!
//! * Ok-Topk Table 1 (oktopk.md §2): dense, TopkA, TopkDSA (best/worst), gTopk, Gaussiank,
//!   Ok-Topk (best/worst), in *words* (4 bytes; COO = 2 words per non-zero).
//! * DeepSpeed's 1-bit compressed allreduce (onebit-lamb.md §2): packed sign bytes plus
//!   the worker and server scales.
//! * EmbRace Table 2 (embrace.md §3): AlltoAll, ring AllReduce, AllGather, PS.
//! * CLT-k (deft.md §2): binomial broadcast of the leader's k indices + ring allreduce of
//!   the k values.
//! * Top-k (union) (DEFT Algorithm 1 with Top-k; deft.md §1.0): ring allgatherv of every
//!   rank's k indices + ring allreduce of the values at their union.
//!
//! A [`Cost`] is `latency·α + words·β` with α in seconds per message and β in seconds per
//! word. `log P` is ⌈log2 P⌉ (Table 1 assumes P a power of two).
//!
//! Pure math, depending on nothing. Which formula belongs to which algorithm is said by the
//! algorithm's descriptor (`gradkit_collectives::algo::Descriptor::cost`), next to its code;
//! gradkit-collectives re-exports this crate as `gradkit_collectives::cost`.

/// Predicted cost of one allreduce on one rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    /// Number of α terms (message start-ups on the critical path).
    pub latency: f64,
    /// Words (4 bytes) sent per rank.
    pub words: f64,
}

impl Cost {
    /// Predicted seconds for start-up `alpha` (s) and `beta` (s per word).
    pub fn time(&self, alpha: f64, beta: f64) -> f64 {
        self.latency * alpha + self.words * beta
    }
    pub fn bytes(&self) -> f64 {
        self.words * 4.0
    }
}

/// ⌈log2 P⌉.
pub fn log2p(p: usize) -> f64 {
    if p <= 1 {
        0.0
    } else {
        (usize::BITS - (p - 1).leading_zeros()) as f64
    }
}

fn pf(p: usize) -> f64 {
    p as f64
}

/// Dense allreduce, Table 1's row (Rabenseifner): 2n(P−1)/P words, 2 log P α.
pub fn dense(p: usize, n: f64) -> Cost {
    Cost {
        latency: 2.0 * log2p(p),
        words: 2.0 * n * (pf(p) - 1.0) / pf(p),
    }
}

/// Dense ring allreduce: same volume, 2(P−1) α.
pub fn ring(p: usize, n: f64) -> Cost {
    Cost {
        latency: 2.0 * (pf(p) - 1.0),
        words: 2.0 * n * (pf(p) - 1.0) / pf(p),
    }
}

/// Binomial tree reduce + broadcast: 2 log P α on the critical path; the busiest rank (the
/// root, sending n to each of its ⌈log2 P⌉ children in the broadcast) sends ⌈log2 P⌉·n words.
pub fn tree(p: usize, n: f64) -> Cost {
    Cost {
        latency: 2.0 * log2p(p),
        words: n * log2p(p),
    }
}

/// TopkA: allgather of every rank's k-COO: 2k(P−1) words, log P α.
pub fn topka(p: usize, k: f64) -> Cost {
    Cost {
        latency: log2p(p),
        words: 2.0 * k * (pf(p) - 1.0),
    }
}

/// TopkDSA (SparCML) best case: fully overlapping, uniformly spread indices: 4k(P−1)/P.
pub fn topkdsa_best(p: usize, k: f64) -> Cost {
    Cost {
        latency: pf(p) + 2.0 * log2p(p),
        words: 4.0 * k * (pf(p) - 1.0) / pf(p),
    }
}

/// TopkDSA worst case: fill-in makes it switch to a dense allgather: (2k+n)(P−1)/P.
pub fn topkdsa_worst(p: usize, n: f64, k: f64) -> Cost {
    Cost {
        latency: pf(p) + 2.0 * log2p(p),
        words: (2.0 * k + n) * (pf(p) - 1.0) / pf(p),
    }
}

/// gTopk: reduction tree and broadcast tree of k-COO: 4k log P words, 2 log P α.
pub fn gtopk(p: usize, k: f64) -> Cost {
    Cost {
        latency: 2.0 * log2p(p),
        words: 4.0 * k * log2p(p),
    }
}

/// Gaussiank: TopkA's communication: 2k(P−1) words, 2 log P α.
pub fn gaussiank(p: usize, k: f64) -> Cost {
    Cost {
        latency: 2.0 * log2p(p),
        words: 2.0 * k * (pf(p) - 1.0),
    }
}

/// Ok-Topk best case (the lower bound of Theorem 3.1): 2k(P−1)/P words.
pub fn oktopk_best(p: usize, k: f64) -> Cost {
    Cost {
        latency: 2.0 * pf(p) + 2.0 * log2p(p),
        words: 2.0 * k * (pf(p) - 1.0) / pf(p),
    }
}

/// Ok-Topk worst case with balanced regions: 6k(P−1)/P words.
pub fn oktopk_worst(p: usize, k: f64) -> Cost {
    Cost {
        latency: 2.0 * pf(p) + 2.0 * log2p(p),
        words: 6.0 * k * (pf(p) - 1.0) / pf(p),
    }
}

/// CLT-k (DEFT §1, §3.1; Chen et al. 2020): the leader's k `u32` indices broadcast down a
/// binomial tree (⌈log2 P⌉ messages from the leader, the busiest rank, k words each), then a
/// ring allreduce of the k `f32` values: ⌈log2 P⌉ + 2(P−1) α, k⌈log2 P⌉ + 2k(P−1)/P words.
/// Exact for the leader's bytes when P divides k (the ring's chunks are then equal).
pub fn cltk(p: usize, k: f64) -> Cost {
    Cost {
        latency: log2p(p) + 2.0 * (pf(p) - 1.0),
        words: k * log2p(p) + 2.0 * k * (pf(p) - 1.0) / pf(p),
    }
}

/// Top-k (union) (DEFT Algorithm 1 with Top-k as `Sparsify`; deft.md §1.0) with a union of
/// `u` indices (k ≤ u ≤ min(Pk, n)): the ring allgatherv of every rank's k `u32` indices
/// (P−1 messages, k(P−1) words) then the ring allreduce of the u `f32` values (2(P−1)
/// messages, 2u(P−1)/P words): 3(P−1) α, k(P−1) + 2u(P−1)/P words. Exact per rank when P
/// divides u; [`topk_union_bytes_sent`] is exact for every rank.
pub fn topk_union(p: usize, k: f64, u: f64) -> Cost {
    if p <= 1 {
        return Cost {
            latency: 0.0,
            words: 0.0,
        };
    }
    Cost {
        latency: 3.0 * (pf(p) - 1.0),
        words: k * (pf(p) - 1.0) + 2.0 * u * (pf(p) - 1.0) / pf(p),
    }
}

/// Exact bytes rank `r` sends in gradkit's Top-k (union) exchange
/// (`collectives::sparse::topk_union`) when every rank selects k entries and their union has
/// u: 4k(P−1) for the allgatherv plus [`ring_bytes_sent`]`(P, u, r)`.
pub fn topk_union_bytes_sent(p: usize, k: usize, u: usize, r: usize) -> u64 {
    if p <= 1 {
        return 0;
    }
    4 * (k as u64) * (p as u64 - 1) + ring_bytes_sent(p, u, r)
}

/// Length of the 1-bit buffer after padding n to a multiple of P·lcm(P, 8); in u128, where
/// it cannot overflow for any P of a u32 (saturating beyond).
pub fn onebit_padded(p: usize, n: usize) -> u128 {
    let l = lcm(p.max(1) as u128, 8).saturating_mul(p.max(1) as u128);
    (n as u128).div_ceil(l).saturating_mul(l)
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: u128, b: u128) -> u128 {
    a / gcd(a, b) * b
}

/// DeepSpeed's compressed allreduce: alltoall of sign chunks + allgather of server chunks
/// (each (P−1)/P·padded/8 bytes) and two allgathers of one f32 scale per rank.
/// Exact bytes sent per rank: 2(P−1)/P·padded/8 + 2(P−1)·4.
pub fn onebit(p: usize, n: usize) -> Cost {
    if p <= 1 {
        return Cost {
            latency: 0.0,
            words: 0.0,
        };
    }
    let padded = onebit_padded(p, n) as f64;
    let bytes = 2.0 * (pf(p) - 1.0) / pf(p) * padded / 8.0 + 2.0 * (pf(p) - 1.0) * 4.0;
    Cost {
        latency: 4.0 * (pf(p) - 1.0),
        words: bytes / 4.0,
    }
}

/// EmbRace Table 2, AlltoAll: two AlltoAlls (lookup data + gradients) of αM/N per pair.
/// `m_words` is the dense embedding size M in words; `density` is α.
pub fn embrace_alltoall(p: usize, m_words: f64, density: f64) -> Cost {
    Cost {
        latency: 2.0 * (pf(p) - 1.0),
        words: 2.0 * (pf(p) - 1.0) / pf(p) * density * m_words,
    }
}

/// EmbRace Table 2, sparse AllGather: N−1 exchanges of αM.
pub fn embrace_allgather(p: usize, m_words: f64, density: f64) -> Cost {
    Cost {
        latency: pf(p) - 1.0,
        words: (pf(p) - 1.0) * density * m_words,
    }
}

/// Exact bytes rank `r` sends in gradkit's ring allreduce (`collectives::dense::ring`) of `n`
/// f32, chunks cut at ⌊i·n/P⌋: reduce-scatter sends every chunk but c_{r+1}, allgather every
/// chunk but c_{r+2}.
pub fn ring_bytes_sent(p: usize, n: usize, r: usize) -> u64 {
    if p == 1 {
        return 0;
    }
    let start = |i: usize| (n as u128 * i as u128 / p as u128) as usize;
    let c = |i: usize| start(i + 1) - start(i);
    (4 * (2 * n - c((r + 1) % p) - c((r + 2) % p))) as u64
}

/// Fit of `t ≈ α·messages + β·bytes` over measured points `(messages, bytes, seconds)`,
/// minimising the *relative* error Σ((α·m + β·b − t)/t)², so small messages (which set α)
/// weigh as much as large ones (which set β). Returns (α seconds, β seconds per byte).
pub fn fit_alpha_beta(points: &[(f64, f64, f64)]) -> Option<(f64, f64)> {
    let (mut smm, mut smb, mut sbb, mut smt, mut sbt) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(m, b, t) in points {
        if t <= 0.0 {
            continue;
        }
        let (m, b) = (m / t, b / t);
        smm += m * m;
        smb += m * b;
        sbb += b * b;
        smt += m;
        sbt += b;
    }
    let det = smm * sbb - smb * smb;
    if det.abs() < 1e-300 {
        return None;
    }
    let alpha = (smt * sbb - sbt * smb) / det;
    let beta = (smm * sbt - smb * smt) / det;
    Some((alpha, beta))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 1 of Ok-Topk, typed in from oktopk.md §2, for P = 16, n = 2^24, k = n/100.
    #[test]
    fn reproduces_table1() {
        let (p, n, k) = (16usize, (1u64 << 24) as f64, ((1u64 << 24) / 100) as f64);
        let pp = p as f64;
        let lg = 4.0;
        assert_eq!(dense(p, n).words, 2.0 * n * (pp - 1.0) / pp);
        assert_eq!(dense(p, n).latency, 2.0 * lg);
        assert_eq!(topka(p, k).words, 2.0 * k * (pp - 1.0));
        assert_eq!(topka(p, k).latency, lg);
        assert_eq!(topkdsa_best(p, k).words, 4.0 * k * (pp - 1.0) / pp);
        assert_eq!(
            topkdsa_worst(p, n, k).words,
            (2.0 * k + n) * (pp - 1.0) / pp
        );
        assert_eq!(topkdsa_best(p, k).latency, pp + 2.0 * lg);
        assert_eq!(gtopk(p, k).words, 4.0 * k * lg);
        assert_eq!(gtopk(p, k).latency, 2.0 * lg);
        assert_eq!(gaussiank(p, k).words, 2.0 * k * (pp - 1.0));
        assert_eq!(gaussiank(p, k).latency, 2.0 * lg);
        assert_eq!(oktopk_best(p, k).words, 2.0 * k * (pp - 1.0) / pp);
        assert_eq!(oktopk_worst(p, k).words, 6.0 * k * (pp - 1.0) / pp);
        assert_eq!(oktopk_worst(p, k).latency, 2.0 * pp + 2.0 * lg);
        // Ok-Topk's worst case beats TopkA's volume for every P > 3.
        assert!(oktopk_worst(p, k).words < topka(p, k).words);
    }

    #[test]
    fn onebit_volume_is_32x_below_ring_for_large_n() {
        let n = 16usize << 20;
        let ratio = ring(4, n as f64).bytes() / onebit(4, n).bytes();
        assert!(ratio > 31.9 && ratio <= 32.0, "{ratio}");
        assert_eq!(onebit_padded(3, 1), 72);
        assert_eq!(onebit_padded(8, 65), 128);
    }

    /// Where P·lcm(P, 8) or the padded length passes 2^64 the padding is still the
    /// definition's (n rounded up to a multiple of P·lcm(P, 8)), never a wrapped 0 (a divide
    /// by zero) or a wrapped small length (an absurd speedup).
    #[test]
    fn onebit_padding_does_not_overflow() {
        let p = 1usize << 32;
        // lcm(2^32, 8) = 2^32, so the multiple is 2^64.
        assert_eq!(onebit_padded(p, 1), 1u128 << 64);
        assert_eq!(onebit_padded(p, usize::MAX), 1u128 << 64);
        // n = 2^64 − 1 on 256 ranks: the multiple is 256·256 = 2^16, padded to 2^64.
        assert_eq!(onebit_padded(256, usize::MAX), 1u128 << 64);
        let c = onebit(256, usize::MAX);
        // At least its sign bytes: 2(P−1)/P · n/8.
        assert!(
            c.bytes() >= 2.0 * 255.0 / 256.0 * (usize::MAX as f64) / 8.0,
            "{c:?}"
        );
        let ratio = ring(256, usize::MAX as f64).bytes() / c.bytes();
        assert!(ratio > 31.9 && ratio <= 32.0, "{ratio}");
    }

    #[test]
    fn embrace_crossovers() {
        // AlltoAll <= AllReduce volume iff density <= 1; AllGather wins at N = 2.
        let m = 1e6;
        assert!(embrace_alltoall(4, m, 0.5).words < ring(4, m).words);
        assert_eq!(embrace_alltoall(4, m, 1.0).words, ring(4, m).words);
        assert!(embrace_allgather(2, m, 0.3).words < embrace_alltoall(2, m, 0.3).words + 1.0);
    }

    #[test]
    fn fit_recovers_known_alpha_beta() {
        let (a, b) = (2e-6, 1e-9);
        let pts: Vec<_> = [(6.0, 1e3), (6.0, 1e6), (6.0, 1e8), (12.0, 5e5)]
            .iter()
            .map(|&(m, by)| (m, by, a * m + b * by))
            .collect();
        let (fa, fb) = fit_alpha_beta(&pts).unwrap();
        assert!((fa - a).abs() / a < 1e-6 && (fb - b).abs() / b < 1e-6);
    }
}
