//! ξ of Ok-Topk's Assumption 1, measured inside a training run (`gradtrain --xi`):
//!
//! ξ_t = ‖Top_k((1/P)Σ_i acc_t^i) − u_t/P‖ / ‖(1/P)Σ_i αG_t^i‖,
//!
//! with acc_t^i = ε_{t−1}^i + αG_t^i the accumulator rank i hands its sparse reducer, u_t the
//! reducer's (summed) result and αG_t^i the reducer's input (SGD folds the learning rate in,
//! so α cancels). This is the authors' measurement (docs/papers/oktopk.md, Fig. 5): Top-k of
//! the dense mean of the accumulators against what the sparse allreduce delivered. The paper
//! observes ξ < P for its three models.
//!
//! The exchange keeps this rank's three vectors ([`Parts`]); the loop calls [`measure`] after
//! it has read the step's traffic counters, so the diagnostic allreduce of 2n floats is in
//! no step's `bytes_sent`.

use anyhow::{bail, Result};
use gradkit_comm::Comm;

use crate::config::{Exchange, TrainConfig};

/// `--xi` needs a sparse exchange, and its allreduce must not enter a `--comm-trace`.
pub fn check_config(cfg: &TrainConfig) -> Result<()> {
    if cfg.xi && !cfg.exchange.is_sparse() {
        bail!(
            "--xi applies to the sparse exchanges ({}) only, not `{}` (flag --xi)",
            Exchange::sparse_names(),
            cfg.exchange
        );
    }
    if cfg.xi && cfg.comm_trace.is_some() {
        bail!("--xi adds an allreduce per step that --comm-trace would record as the run's; record them in separate runs (flag --xi)");
    }
    Ok(())
}

/// One rank's vectors of one step.
#[derive(Debug, Default)]
pub struct Parts {
    /// ε_{t−1} + αG_t (the reducer's accumulator).
    pub acc: Vec<f32>,
    /// αG_t (the reducer's input).
    pub grad: Vec<f32>,
    /// u_t / P as the optimiser applies it.
    pub u_over_p: Vec<f32>,
    /// The reducer's k.
    pub k: usize,
}

/// ξ from the means over ranks: `mean_acc`, `mean_grad`, and u/P (identical on every rank).
/// Top-k by magnitude; of equal magnitudes at the k-th place, the lower indices.
pub fn xi(mean_acc: &[f32], mean_grad: &[f32], u_over_p: &[f32], k: usize) -> f64 {
    let mut order: Vec<usize> = (0..mean_acc.len()).collect();
    let k = k.min(order.len());
    if k > 0 && k < order.len() {
        order.select_nth_unstable_by(k - 1, |&a, &b| {
            mean_acc[b]
                .abs()
                .total_cmp(&mean_acc[a].abs())
                .then(a.cmp(&b))
        });
    }
    let mut top = vec![0.0f64; mean_acc.len()];
    for &i in &order[..k] {
        top[i] = mean_acc[i] as f64;
    }
    let diff: f64 = top
        .iter()
        .zip(u_over_p)
        .map(|(t, u)| (t - *u as f64).powi(2))
        .sum();
    let g: f64 = mean_grad.iter().map(|x| (*x as f64).powi(2)).sum();
    if g == 0.0 {
        return if diff == 0.0 { 0.0 } else { f64::INFINITY };
    }
    (diff / g).sqrt()
}

/// Every rank calls this with its [`Parts`]: one allreduce of [acc, grad] (sum), then ξ.
pub fn measure(comm: &dyn Comm, parts: Parts) -> Result<f64> {
    let n = parts.acc.len();
    let mut buf = parts.acc;
    buf.extend_from_slice(&parts.grad);
    comm.allreduce_native_f32(&mut buf)?;
    let inv_p = 1.0 / comm.size() as f32;
    buf.iter_mut().for_each(|x| *x *= inv_p);
    let (acc, grad) = buf.split_at(n);
    Ok(xi(acc, grad, &parts.u_over_p, parts.k))
}

#[cfg(test)]
mod tests {
    use super::xi;

    #[test]
    fn xi_by_hand() {
        // mean acc (3, −1, 0.5, 2), k = 2: Top_2 = (3, 0, 0, 2); u/P = (3, 0, 0, 1):
        // ‖(0, 0, 0, 1)‖ = 1; ‖mean g‖ = ‖(0, 2, 0, 0)‖ = 2 → ξ = 0.5
        let x = xi(
            &[3.0, -1.0, 0.5, 2.0],
            &[0.0, 2.0, 0.0, 0.0],
            &[3.0, 0.0, 0.0, 1.0],
            2,
        );
        assert!((x - 0.5).abs() < 1e-12, "{x}");
        // a result that is exactly Top_k of the mean: 0
        assert_eq!(
            xi(&[1.0, -4.0, 2.0], &[1.0, 1.0, 1.0], &[0.0, -4.0, 2.0], 2),
            0.0
        );
        // k ≥ n keeps everything: u/P = mean acc gives 0
        assert_eq!(xi(&[1.0, -4.0], &[1.0, 0.0], &[1.0, -4.0], 5), 0.0);
        // magnitude, not value: −4 is the largest
        let x = xi(&[1.0, -4.0, 2.0], &[0.0, 0.0, 3.0], &[0.0, 0.0, 0.0], 1);
        assert!((x - 4.0 / 3.0).abs() < 1e-12, "{x}");
    }
}
