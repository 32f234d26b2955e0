//! The α-β cost model's common ground: [`Cost`] (latency terms and words per rank), the
//! collective patterns that several algorithms are built of, and the fit of α and β to
//! measurements. Each algorithm's own formula (Ok-Topk Table 1's rows, CLT-k's, Top-k
//! (union)'s, DeepSpeed's 1-bit volume) is written in the algorithm's module in
//! gradkit-collectives, next to its code, and named by its descriptor
//! (`gradkit_collectives::algo::Descriptor::cost`); `gradallreduce model` and `gradreport`
//! reach them through the registry.
//!
//! Here:
//! * the dense allreduces of Ok-Topk Table 1 (oktopk.md §2): Rabenseifner's ([`dense`], the
//!   table's row), the ring's and the binomial tree's, and [`ring_bytes_sent`], exact per
//!   rank (DEFT and Top-k (union) allreduce their values with the ring);
//! * EmbRace Table 2's patterns (embrace.md §3): a sparse AlltoAll and a sparse AllGather;
//! * [`fit_alpha_beta`].
//!
//! A [`Cost`] is `latency·α + words·β` with α in seconds per message and β in seconds per
//! word (4 bytes; COO = 2 words per non-zero). `log P` is ⌈log2 P⌉ (Table 1 assumes P a
//! power of two). Pure math, depending on nothing; gradkit-collectives re-exports this crate
//! as `gradkit_collectives::cost`.

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

/// P as f64.
pub fn pf(p: usize) -> f64 {
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

/// EmbRace Table 2, AlltoAll (the pattern of `--algo embrace`'s embedding rows): two
/// AlltoAlls (lookup data + gradients) of αM/N per pair.
/// `m_words` is the dense embedding size M in words; `density` is α.
pub fn sparse_alltoall(p: usize, m_words: f64, density: f64) -> Cost {
    Cost {
        latency: 2.0 * (pf(p) - 1.0),
        words: 2.0 * (pf(p) - 1.0) / pf(p) * density * m_words,
    }
}

/// EmbRace Table 2, sparse AllGather: N−1 exchanges of αM.
pub fn sparse_allgather(p: usize, m_words: f64, density: f64) -> Cost {
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

    /// Table 1 of Ok-Topk's dense row, typed in from oktopk.md §2, for P = 16, n = 2^24 (the
    /// sparse rows are checked through the registry, lib/collectives/tests/collectives/algo.rs).
    #[test]
    fn reproduces_table1_dense_row() {
        let (p, n) = (16usize, (1u64 << 24) as f64);
        let pp = p as f64;
        let lg = 4.0;
        assert_eq!(dense(p, n).words, 2.0 * n * (pp - 1.0) / pp);
        assert_eq!(dense(p, n).latency, 2.0 * lg);
        assert_eq!(ring(p, n).words, dense(p, n).words);
        assert_eq!(ring(p, n).latency, 2.0 * (pp - 1.0));
        assert_eq!(tree(p, n).words, n * lg);
    }

    #[test]
    fn embrace_crossovers() {
        // AlltoAll <= AllReduce volume iff density <= 1; AllGather wins at N = 2.
        let m = 1e6;
        assert!(sparse_alltoall(4, m, 0.5).words < ring(4, m).words);
        assert_eq!(sparse_alltoall(4, m, 1.0).words, ring(4, m).words);
        assert!(sparse_allgather(2, m, 0.3).words < sparse_alltoall(2, m, 0.3).words + 1.0);
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
