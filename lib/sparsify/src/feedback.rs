//! Error feedback (Alistarh et al. 2018; Ok-Topk Alg. 2; DEFT Alg. 1): per rank, steps in
//! order, `acc_t = residual_{t−1} + g_t`, select from `acc_t`, send the selected `acc_t`
//! values, and keep `residual_t = acc_t` with the selected entries set to zero.

use rayon::prelude::*;

/// The residual of one rank (the error-feedback memory).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Residual {
    pub values: Vec<f32>,
}

impl Residual {
    /// A zero residual of length n.
    pub fn zeros(n: usize) -> Self {
        Residual {
            values: vec![0.0; n],
        }
    }

    /// Adds the gradient in place of a copy: `g` becomes `acc = residual + g`.
    pub fn compensate(&self, g: &mut [f32]) {
        assert_eq!(g.len(), self.values.len(), "gradient and residual lengths");
        g.par_chunks_mut(crate::topk::CHUNK)
            .zip(self.values.par_chunks(crate::topk::CHUNK))
            .for_each(|(a, r)| {
                for (x, y) in a.iter_mut().zip(r) {
                    *x += *y;
                }
            });
    }

    /// `residual = acc` with `selected` set to zero; takes `acc` by value (no copy).
    pub fn update(&mut self, mut acc: Vec<f32>, selected: &[u32]) {
        for &i in selected {
            acc[i as usize] = 0.0;
        }
        self.values = acc;
    }

    /// The L2 norm (f64 accumulation).
    pub fn norm(&self) -> f64 {
        self.values
            .par_chunks(crate::topk::CHUNK)
            .map(|c| c.iter().map(|&v| v as f64 * v as f64).sum::<f64>())
            .sum::<f64>()
            .sqrt()
    }
}
