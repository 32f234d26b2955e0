//! Ok-Topk's one-pass local selection (docs/MEMORY.md; Ok-Topk §3.1.3 reuse steps) against brute
//! force written here: every count is a full scan of the accumulator per threshold, every
//! selection a full filter `|acc| > th`, the ladder's and the reference loop's rules re-derived
//! from docs/ALGORITHMS.md ("Ok-Topk threshold reuse") and the authors' code. Inputs have
//! ties, zeros, −0, values equal to the rungs, and sizes on both sides of the parallel split.

use gradkit_sparsify::oktopk::{ladder_local, Adjust, Bands, OkTopk, Scratch};
use rand::{Rng, SeedableRng};

/// Heavy-tailed values on a coarse grid (many ties), a fifth of them zero (some −0).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let r: f32 = rng.gen();
            if r < 0.1 {
                0.0
            } else if r < 0.2 {
                -0.0
            } else {
                let u: f32 = rng.gen::<f32>().max(1e-4);
                let s = if rng.gen::<bool>() { 1.0 } else { -1.0 };
                s * ((u.powf(-0.7) * 16.0).round() / 16.0)
            }
        })
        .collect()
}

fn brute_count(acc: &[f32], th: f32) -> u64 {
    acc.iter().filter(|v| v.abs() > th).count() as u64
}

fn brute_select(acc: &[f32], th: f32) -> (Vec<u32>, Vec<f32>) {
    let idx: Vec<u32> = (0..acc.len() as u32)
        .filter(|&i| acc[i as usize].abs() > th)
        .collect();
    let val = idx.iter().map(|&i| acc[i as usize]).collect();
    (idx, val)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The ladder around th: th·1.06^j, j = −12 … 24, computed in f64 and rounded to f32.
fn ladder(th: f32) -> Vec<f32> {
    (-12..=24)
        .map(|j| (th as f64 * 1.06f64.powi(j)) as f32)
        .collect()
}

/// What the ladder's rule decided for one round.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Next {
    Take(usize),
    /// Re-centre the ladder on this rung.
    Centre(usize),
    /// Count again on 37 rungs from this rung to the next.
    Between(usize),
}

/// The ladder's rule: among rungs with count ≤ 4k/3 the one closest to k (equal distances:
/// the higher rung); of the rungs with that count, the highest when it is ≥ k or equals
/// `all`, else the lowest; none: re-centre on the top rung (take it in the last round); a
/// count below 2k/3 with more non-zeros left: re-centre on the bottom rung when the rung is
/// the bottom one, else count again between the rung below and it (not in the last round).
fn rule(counts: &[u64], all: u64, k: u64, last: bool) -> Next {
    let mut best: Option<usize> = None;
    for (i, &c) in counts.iter().enumerate() {
        if 3 * c > 4 * k {
            continue;
        }
        let better = match best {
            None => true,
            Some(b) => c.abs_diff(k) <= counts[b].abs_diff(k),
        };
        if better {
            best = Some(i);
        }
    }
    let top = counts.len() - 1;
    let Some(b) = best else {
        return if last {
            Next::Take(top)
        } else {
            Next::Centre(top)
        };
    };
    let c = counts[b];
    let same: Vec<usize> = (0..=top).filter(|&i| counts[i] == c).collect();
    let (lo, hi) = (same[0], same[same.len() - 1]);
    if c >= k || c == all {
        Next::Take(hi)
    } else if !last && 3 * c < 2 * k && all > c {
        if lo == 0 {
            Next::Centre(0)
        } else {
            Next::Between(lo - 1)
        }
    } else {
        Next::Take(lo)
    }
}

/// Brute-force ladder: (selection, threshold, extra passes the one-pass version must report:
/// one per count of non-zeros and one per re-centring on the bottom rung).
fn brute_ladder(acc: &[f32], th: f32, k: usize) -> ((Vec<u32>, Vec<f32>), f32, u32) {
    if th <= 0.0 || !th.is_finite() {
        return (brute_select(acc, th), th, 0);
    }
    let (mut rungs, mut rescans) = (ladder(th), 0);
    for round in 1..=4 {
        let last = round == 4;
        let counts: Vec<u64> = rungs.iter().map(|&r| brute_count(acc, r)).collect();
        let mut pick = rule(&counts, u64::MAX, k as u64, last);
        if pick == Next::Centre(0) {
            rescans += 1;
            pick = rule(&counts, brute_count(acc, 0.0), k as u64, last);
        }
        match pick {
            Next::Take(i) => return (brute_select(acc, rungs[i]), rungs[i], rescans),
            Next::Centre(i) => {
                rescans += u32::from(i == 0);
                rungs = ladder(rungs[i]);
            }
            Next::Between(i) => {
                let (a, z) = (rungs[i] as f64, rungs[i + 1] as f64);
                rungs = (0..=36)
                    .map(|j| (a * (z / a).powf(j as f64 / 36.0)) as f32)
                    .collect();
            }
        }
    }
    unreachable!()
}

/// The authors' pre-loop: th ×f while more than pre_upper·k pass, at most pre_loops times,
/// each time keeping the entries of the current selection above the new th. With f ≥ 1 the
/// selection is `{|acc| > th}` at the final th; with f < 1 (no preset) it stays the selection
/// at the first th while the reported th drops (the loop only ever removes entries).
fn brute_reference(acc: &[f32], th: f32, k: usize, b: &Bands) -> ((Vec<u32>, Vec<f32>), f32) {
    let (mut th, mut highest) = (th, th);
    let mut loops = 0;
    while brute_count(acc, highest) as f64 > b.pre_upper * k as f64 && loops < b.pre_loops {
        th *= b.pre_factor;
        highest = highest.max(th);
        loops += 1;
    }
    (brute_select(acc, highest), th)
}

#[test]
fn one_pass_counts_equal_a_scan_per_rung() {
    let mut scratch = Scratch::default();
    for (n, seed) in [(0usize, 1u64), (31, 2), (5_000, 3), ((1 << 19) + 777, 4)] {
        let mut x = data(n, seed);
        let rungs = ladder(3.0);
        // Entries exactly at the rungs (strict > leaves them out), and odd values.
        for (j, &r) in rungs.iter().enumerate() {
            if j * 97 < n {
                x[j * 97] = if j % 2 == 0 { r } else { -r };
            }
        }
        for (j, v) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-40, -1e30]
            .into_iter()
            .enumerate()
        {
            if 13 + j * 1001 < n {
                x[13 + j * 1001] = v;
            }
        }
        for lists in [
            rungs.clone(),
            vec![0.0],
            vec![-1.0, 0.0, 0.0, 2.5],
            vec![1e30],
        ] {
            let counts = scratch.scan(&x, &lists);
            let want: Vec<u64> = lists.iter().map(|&r| brute_count(&x, r)).collect();
            assert_eq!(counts, want, "n={n} rungs={lists:?}");
            for (i, &r) in lists.iter().enumerate() {
                let (idx, val) = scratch.take(i);
                let (wi, wv) = brute_select(&x, r);
                assert!(idx == wi, "n={n} rung {r}");
                assert!(bits(&val) == bits(&wv), "n={n} rung {r}");
            }
        }
        // Recounting higher rungs from the candidates alone.
        let high = ladder(6.0);
        scratch.scan(&x, &ladder(3.0));
        let counts = scratch.recount(&high);
        let want: Vec<u64> = high.iter().map(|&r| brute_count(&x, r)).collect();
        assert_eq!(counts, want, "n={n} recount");
    }
}

#[test]
fn ladder_equals_brute_force_and_counts_its_rescans() {
    let mut scratch = Scratch::default();
    for (n, seed) in [(4_000usize, 5u64), ((1 << 19) + 333, 6)] {
        let base = data(n, seed);
        let k = n / 100;
        // The k-th largest |x| as the reused threshold, with the accumulator scaled so that
        // the ladder stays put, re-centres up (×40, ×1e4) or down (÷4, ÷1e3), and zeros only.
        let mut mags: Vec<f32> = base.iter().map(|v| v.abs()).collect();
        mags.sort_by(|a, b| b.total_cmp(a));
        let th = mags[k - 1];
        let mut saw_rescan = false;
        for s in [1.0f32, 1.3, 40.0, 1e4, 0.25, 1e-3, 0.0] {
            let acc: Vec<f32> = base.iter().map(|v| v * s).collect();
            for th in [th, th * 0.9, 0.0, -1.0, f32::INFINITY] {
                let got = ladder_local(&acc, th, k, &mut scratch);
                let ((wi, wv), wth, wres) = brute_ladder(&acc, th, k);
                assert!(got.indices == wi, "n={n} s={s} th={th}");
                assert!(bits(&got.values) == bits(&wv), "n={n} s={s} th={th}");
                assert_eq!(
                    got.threshold.to_bits(),
                    wth.to_bits(),
                    "n={n} s={s} th={th}"
                );
                // One more when the sampled floor turned out too high (its exact count ≤ 4k/3).
                assert!(
                    got.rescans == wres || got.rescans == wres + 1,
                    "n={n} s={s} th={th}: {} rescans, {wres} without a floor",
                    got.rescans
                );
                saw_rescan |= wres > 0;
                if s == 1.0 && th > 0.0 && th.is_finite() {
                    assert_eq!(got.rescans, 0, "common case: one pass");
                    if n >= 1 << 16 {
                        // Large inputs keep only the entries above a sampled floor rung, which
                        // lets more than 4k/3 through.
                        let above = brute_count(&acc, scratch.floor());
                        assert!(scratch.floor() > ladder(th)[0], "n={n}: floor above rung 0");
                        assert!(3 * above > 4 * k as u64, "n={n}: {above} above the floor");
                    }
                }
            }
        }
        assert!(
            saw_rescan,
            "the scaled inputs exercise the bottom re-centring"
        );
    }
}

/// Step by step with error feedback, every policy: the library's selection, threshold and
/// schedule equal the brute-force policy run on the same accumulators.
#[test]
fn every_policy_equals_brute_force_over_steps() {
    let odd = Bands {
        pre_factor: 0.97,
        pre_loops: 70,
        ..Bands::VGG
    };
    let policies = [
        Adjust::Paper,
        Adjust::Ladder,
        Adjust::Reference(Bands::VGG),
        Adjust::Reference(Bands::BERT),
        Adjust::Reference(odd),
    ];
    for (n, seed) in [(6_000usize, 7u64), ((1 << 19) + 5, 8)] {
        for adjust in policies {
            let (k, tau) = (n / 100, 5u64);
            let mut lib = OkTopk::new(tau as u32, adjust);
            let mut eps = vec![0f32; n];
            let mut th = f32::NAN;
            for t in 0..12u64 {
                // Gradients change scale between steps so that every policy moves.
                let scale = [
                    1.0f32, 1.0, 3.0, 0.5, 1.0, 1.0, 0.05, 20.0, 1.0, 1.0, 0.3, 1.0,
                ];
                let g = data(n, seed * 100 + t);
                let acc: Vec<f32> = eps
                    .iter()
                    .zip(&g)
                    .map(|(e, x)| e + x * scale[t as usize])
                    .collect();
                let (st, vals) = lib.select_values_at(t % tau == 0, &acc, k);
                let ((wi, wv), wth) = if t % tau == 0 {
                    // Exact top-k, ties to the lower index; th = the k-th largest |acc|
                    // (0 when at most k are non-zero: then every non-zero is taken).
                    let mut order: Vec<u32> = (0..n as u32).collect();
                    order.sort_by(|&a, &b| {
                        acc[b as usize]
                            .abs()
                            .total_cmp(&acc[a as usize].abs())
                            .then(a.cmp(&b))
                    });
                    let kth = acc[order[k - 1] as usize].abs();
                    let mut s = order[..k].to_vec();
                    s.sort_unstable();
                    let v = s.iter().map(|&i| acc[i as usize]).collect();
                    ((s, v), kth)
                } else {
                    match adjust {
                        Adjust::Paper => (brute_select(&acc, th), th),
                        Adjust::Reference(b) => brute_reference(&acc, th, k, &b),
                        Adjust::Ladder => {
                            let (sel, th, _) = brute_ladder(&acc, th, k);
                            (sel, th)
                        }
                    }
                };
                let what = format!("n={n} {} t={t}", adjust.label());
                assert_eq!(st.reevaluated, t % tau == 0, "{what}");
                let what = format!(
                    "{what}: th {:?} vs {wth}, {} vs {} selected",
                    st.threshold,
                    st.indices.len(),
                    wi.len()
                );
                assert!(st.indices == wi, "{what}");
                assert!(bits(&vals) == bits(&wv), "{what}");
                assert_eq!(
                    st.threshold.map(f32::to_bits),
                    Some(wth.to_bits()),
                    "{what}"
                );
                // The next step's threshold: the reference bands nudge it.
                th = match adjust {
                    Adjust::Reference(b) => {
                        let c = wi.len() as f64;
                        if c < b.lower * k as f64 {
                            wth / b.factor
                        } else if c > b.upper * k as f64 {
                            wth * b.factor
                        } else {
                            wth
                        }
                    }
                    _ => wth,
                };
                eps = acc;
                for &i in &wi {
                    eps[i as usize] = 0.0;
                }
            }
        }
    }
}

/// The residual norm (the `residual_norm` metric of every dense-input step) against a plain
/// f64 sum of squares, sizes around the lane width and the parallel split.
#[test]
fn residual_norm_is_the_f64_sum_of_squares() {
    for (n, seed) in [
        (0usize, 9u64),
        (7, 10),
        (8, 11),
        (1001, 12),
        ((1 << 18) * 3 + 5, 13),
    ] {
        let x = data(n, seed);
        let want = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt();
        let mut r = gradkit_sparsify::Residual::zeros(n);
        r.update(x, &[]);
        let got = r.norm();
        assert!(
            (got - want).abs() <= 1e-12 * want.max(1.0),
            "n={n}: {got} vs {want}"
        );
    }
}
