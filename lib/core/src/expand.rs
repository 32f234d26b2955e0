//! P ranks from fewer recorded (`gradtrace expand`, issue 44 point 2): a trace of R ranks made
//! into one of P > R ranks, for a replay at a scale the recording could not run at.
//!
//! The model, per step, layer and coordinate, on the recorded ranks' dense gradients
//! g_0 … g_{R−1}: their mean m, and the ranks' variance around it σ² = Σ_r (g_r − m)² / (R − 1)
//! (R = 1: no variance, every new rank is the recorded one). Ranks 0 … R−1 are the recorded
//! ones, unchanged. A new rank q ≥ R is
//!
//! ```text
//! g_q = w · m + σ · ξ_q,   w = max(0, 1 − σ² / (R · m²)),   ξ_q ~ N(0, 1)
//! ```
//!
//! independent per (seed, step, layer, rank) and coordinate: every rank the recorded mean's
//! signal plus its own noise of the recorded size. The mean is shrunk by its own noise share
//! (σ²/R is the variance of a mean of R ranks): a coordinate where one recorded rank alone
//! had a spike is noise, not a direction every new rank shares.
//!
//! What it keeps and what it cannot: each rank's norm and k-th largest magnitude stay near the
//! recorded ranks'; with few recorded ranks the mean still carries some of their noise, so new
//! ranks agree more than real ones (more top-k overlap between ranks, a smaller union).
//! docs/SIMULATE.md § "From P recorded ranks to any P" measures both against a real recording
//! of more ranks.

use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use std::collections::BTreeMap;

use crate::synth::mix;
use crate::TensorRow;

/// The rows of one step for P ranks, from `recorded`: that step's rows of every recorded rank
/// (R ranks, 0 … R−1, each with every layer, dense), in any order, which it keeps (no copy of
/// them). Rows come out rank by rank, layers in `layer_id` order.
pub fn expand_step(recorded: Vec<TensorRow>, p: u32, seed: u64) -> Result<Vec<TensorRow>> {
    let Some(first) = recorded.first() else {
        return Ok(Vec::new());
    };
    let step = first.step;
    let r = recorded.iter().map(|x| x.rank).max().unwrap_or(0) + 1;
    if p < r {
        bail!("--ranks {p} is fewer than the recording's {r} ranks (expand makes more, not fewer)");
    }
    // layer_id → the recorded ranks' rows.
    let mut layers: BTreeMap<u32, Vec<Option<TensorRow>>> = BTreeMap::new();
    for x in recorded {
        if !x.is_dense() {
            bail!(
                "step {step}, rank {}, layer `{}` is sparse: expand needs dense gradients (a recording, not a selection)",
                x.rank,
                x.layer
            );
        }
        let slot = layers
            .entry(x.layer_id)
            .or_insert_with(|| vec![None; r as usize]);
        let rank = x.rank as usize;
        slot[rank] = Some(x);
    }
    let mut out: Vec<Vec<TensorRow>> = (0..p).map(|_| Vec::new()).collect();
    for (id, ranks) in layers {
        if let Some(missing) = ranks.iter().position(Option::is_none) {
            bail!("step {step}: rank {missing} has no row of layer_id {id}: expand needs every recorded rank's every layer");
        }
        let rows: Vec<TensorRow> = ranks.into_iter().flatten().collect();
        let (centre, sigma) = centre_and_spread(&rows);
        for q in r..p {
            let noise = mix(mix(mix(mix(seed) ^ u64::from(step)) ^ u64::from(id)) ^ u64::from(q));
            out[q as usize].push(TensorRow {
                rank: q,
                indices: None,
                values: new_rank(&centre, &sigma, noise),
                ..rows[0].key()
            });
        }
        for (q, row) in rows.into_iter().enumerate() {
            out[q].push(row);
        }
    }
    Ok(out.into_iter().flatten().collect())
}

/// Per coordinate of one layer's recorded rows: the shrunk mean w·m and the ranks' standard
/// deviation σ (see the module documentation).
fn centre_and_spread(rows: &[TensorRow]) -> (Vec<f64>, Vec<f64>) {
    let rf = rows.len() as f64;
    (0..rows[0].values.len())
        .map(|i| {
            let m = rows.iter().map(|x| f64::from(x.values[i])).sum::<f64>() / rf;
            if rows.len() < 2 {
                return (m, 0.0);
            }
            let var = rows
                .iter()
                .map(|x| (f64::from(x.values[i]) - m).powi(2))
                .sum::<f64>()
                / (rf - 1.0);
            let w = if m == 0.0 {
                0.0
            } else {
                (1.0 - var / (rf * m * m)).max(0.0)
            };
            (w * m, var.sqrt())
        })
        .unzip()
}

/// A new rank's values: `centre + σ · ξ`, ξ standard normal from the stream `seed`.
fn new_rank(centre: &[f64], sigma: &[f64], seed: u64) -> Vec<f32> {
    let mut noise = StdRng::seed_from_u64(seed);
    centre
        .iter()
        .zip(sigma)
        .map(|(&c, &s)| {
            let xi: f64 = noise.sample(StandardNormal);
            (c + s * xi) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(rank: u32, values: Vec<f32>) -> TensorRow {
        TensorRow {
            step: 2,
            rank,
            layer_id: 0,
            layer: "w".into(),
            numel: values.len() as u64,
            shape: None,
            indices: None,
            values,
        }
    }

    #[test]
    fn recorded_ranks_stay_and_new_ranks_follow_the_model() {
        // Coordinates: 0 no spread (every rank 2.0); 1 a mean of 0 with spread; 2 a strong
        // signal with little spread; 3 a spike on one rank only.
        let rec = vec![
            row(0, vec![2.0, 1.0, 10.0, 4.0]),
            row(1, vec![2.0, -1.0, 9.0, 0.0]),
        ];
        let p = 4002u32;
        let out = expand_step(rec.clone(), p, 9).unwrap();
        assert_eq!(out.len(), p as usize);
        assert_eq!(out[0].values, rec[0].values);
        assert_eq!(out[1].values, rec[1].values);
        let new: Vec<&TensorRow> = out[2..].iter().collect();
        let moments = |i: usize| {
            let v: Vec<f64> = new.iter().map(|x| f64::from(x.values[i])).collect();
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1) as f64;
            (mean, var.sqrt())
        };
        // Written here, R = 2: σ² = Σ(g − m)² / 1; w = max(0, 1 − σ²/(2m²)).
        // 0: m = 2, σ = 0 → every new rank is 2 exactly.
        assert!(new.iter().all(|x| x.values[0] == 2.0));
        // 1: m = 0, σ = √2 → mean 0, sd √2.
        let (m1, s1) = moments(1);
        assert!(
            m1.abs() < 0.1 && (s1 - 2f64.sqrt()).abs() < 0.1,
            "{m1} {s1}"
        );
        // 2: m = 9.5, σ² = 0.5, w = 1 − 0.5/(2·90.25) → mean 9.4737, sd √0.5.
        let (m2, s2) = moments(2);
        assert!(
            (m2 - 9.5 * (1.0 - 0.5 / 180.5)).abs() < 0.05 && (s2 - 0.5f64.sqrt()).abs() < 0.05,
            "{m2} {s2}"
        );
        // 3: m = 2, σ² = 8, w = max(0, 1 − 8/8) = 0 → mean 0, sd √8: the spike is noise.
        let (m3, s3) = moments(3);
        assert!(
            m3.abs() < 0.2 && (s3 - 8f64.sqrt()).abs() < 0.2,
            "{m3} {s3}"
        );
        // Same seed, same rows; another seed, other rows.
        assert_eq!(
            expand_step(rec.clone(), 8, 9).unwrap(),
            expand_step(rec.clone(), 8, 9).unwrap()
        );
        assert_ne!(
            expand_step(rec.clone(), 8, 10).unwrap(),
            expand_step(rec.clone(), 8, 9).unwrap()
        );
    }

    #[test]
    fn sparse_rows_and_missing_ranks_are_refused() {
        let mut s = row(0, vec![1.0]);
        s.indices = Some(vec![0]);
        assert!(expand_step(vec![s, row(1, vec![1.0])], 4, 0)
            .unwrap_err()
            .to_string()
            .contains("sparse"));
        assert!(expand_step(vec![row(1, vec![1.0])], 4, 0)
            .unwrap_err()
            .to_string()
            .contains("rank 0"));
        assert!(
            expand_step(vec![row(0, vec![1.0]), row(1, vec![1.0])], 1, 0)
                .unwrap_err()
                .to_string()
                .contains("fewer")
        );
    }
}
