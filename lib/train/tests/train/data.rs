//! Data: the shipped digits, the Markov source's entropy rate against an independent
//! computation, shards and deterministic batches.
#![allow(clippy::needless_range_loop)]

use gradkit_train::data::{load, Batch, DataSpec, Dataset, MarkovSource, Shard};

#[test]
fn digits_are_the_uci_set_with_the_documented_split() {
    let Dataset::Class(c) = load(&DataSpec::default()).unwrap() else {
        panic!()
    };
    assert_eq!((c.dim, c.classes), (64, 10));
    assert_eq!((c.train_y.len(), c.test_y.len()), (1437, 360));
    let mut counts = [0usize; 10];
    for y in c.train_y.iter().chain(&c.test_y) {
        counts[*y as usize] += 1;
    }
    assert_eq!(counts, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]);
    assert!(c.train_x.iter().all(|v| (0.0..=1.0).contains(v)));
}

/// Stationary distribution by Gaussian elimination on (Pᵀ − I)μ = 0, Σμ = 1.
fn stationary_direct(p: &[Vec<f64>]) -> Vec<f64> {
    let v = p.len();
    let mut a: Vec<Vec<f64>> = (0..v)
        .map(|i| {
            let mut row: Vec<f64> = (0..v)
                .map(|j| p[j][i] - if i == j { 1.0 } else { 0.0 })
                .collect();
            row.push(0.0);
            row
        })
        .collect();
    a[v - 1] = vec![1.0; v + 1];
    for col in 0..v {
        let piv = (col..v)
            .max_by(|x, y| a[*x][col].abs().total_cmp(&a[*y][col].abs()))
            .unwrap();
        a.swap(col, piv);
        for r in 0..v {
            if r != col {
                let f = a[r][col] / a[col][col];
                for c in col..=v {
                    a[r][c] -= f * a[col][c];
                }
            }
        }
    }
    (0..v).map(|i| a[i][v] / a[i][i]).collect()
}

#[test]
fn entropy_rate_matches_an_independent_computation_and_samples() {
    let v = 12;
    let src = MarkovSource::new(v, 3).unwrap();
    // recover the transition matrix from a long sample and check the entropy rate two ways
    let toks = src.sample(400_000, 9);
    let mut counts = vec![vec![0f64; v]; v];
    for w in toks.windows(2) {
        counts[w[0] as usize][w[1] as usize] += 1.0;
    }
    // plug-in conditional entropy of the sample, and the stationary distribution of the
    // empirical matrix by direct elimination (not power iteration)
    let n: f64 = counts.iter().flatten().sum();
    let mut h_emp = 0.0;
    let p_emp: Vec<Vec<f64>> = counts
        .iter()
        .map(|row| {
            let s: f64 = row.iter().sum();
            row.iter().map(|c| c / s).collect()
        })
        .collect();
    for row in &counts {
        let s: f64 = row.iter().sum();
        for c in row.iter().filter(|c| **c > 0.0) {
            h_emp -= c / n * (c / s).ln();
        }
    }
    assert!(
        (h_emp - src.entropy_rate).abs() < 0.01,
        "sample {h_emp} vs exact {}",
        src.entropy_rate
    );
    let mu = stationary_direct(&p_emp);
    for (a, b) in mu.iter().zip(&src.stationary) {
        assert!(
            (a - b).abs() < 0.01,
            "stationary {mu:?} vs {:?}",
            src.stationary
        );
    }
    // entropy rate below the unigram entropy (the previous token carries information)
    let h1: f64 = -src.stationary.iter().map(|m| m * m.ln()).sum::<f64>();
    assert!(src.entropy_rate < h1 - 0.05);
}

#[test]
fn batches_depend_only_on_seed_rank_and_step() {
    let ds = load(&DataSpec::default()).unwrap();
    let s0 = Shard::new(&ds, 0, 4, 8, 32).unwrap();
    let s1 = Shard::new(&ds, 1, 4, 8, 32).unwrap();
    assert_eq!(s0.batch(1, 7, 8), s0.batch(1, 7, 8));
    assert_ne!(s0.batch(1, 7, 8), s0.batch(1, 8, 8));
    assert_ne!(s0.batch(1, 7, 8), s1.batch(1, 7, 8));
    let Batch::Class { y, b, .. } = s0.batch(1, 7, 8) else {
        panic!()
    };
    assert_eq!((b, y.len()), (8, 8));
    // 1437 rows over 4 ranks: rank 0 holds 360
    let e = Shard::new(&ds, 0, 4, 361, 32).unwrap_err().to_string();
    assert!(e.contains("larger than rank 0's shard of 360"), "{e}");
}

#[test]
fn lm_windows_are_shifted_by_one() {
    let ds = load(&DataSpec {
        name: "synthetic-lm".into(),
        vocab: 50,
        tokens: 5000,
        ..DataSpec::default()
    })
    .unwrap();
    let s = Shard::new(&ds, 1, 2, 4, 16).unwrap();
    let Batch::Lm { x, y, b, t } = s.batch(0, 0, 4) else {
        panic!()
    };
    assert_eq!((b, t), (4, 16));
    for r in 0..b {
        assert_eq!(&x[r * t + 1..(r + 1) * t], &y[r * t..(r + 1) * t - 1]);
    }
}
