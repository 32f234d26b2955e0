//! The sparse reducers' local steps on a device that keeps the step's tensors resident
//! (`Params::resident`, docs/GPU.md §7): the gradient is uploaded once into the device's
//! accumulator, selected there, and only the selection comes down for the exchange; the
//! residual stays on the device across steps. The exchanges themselves are unchanged.

use std::time::Instant;

use gradkit_core::trace::{Layout, Sparse};
use gradkit_partition::deft as dp;
use gradkit_sparsify::kernels::Kernels;
use gradkit_sparsify::resident::{self, DVec, DeviceKernels};

use super::{secs, select_topk, Feedback};
use crate::Flat;

/// The local selection of the select-then-exchange reducers.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Local {
    /// Exact top-k (`select_topk`).
    Topk,
    /// Gaussiank's fitted threshold (`gradkit_sparsify::gaussiank::select`).
    Gaussiank,
}

impl Local {
    fn host(self, kern: &dyn Kernels, acc: &[f32], k: usize) -> (Vec<u32>, Option<f32>) {
        match self {
            Local::Topk => (select_topk(kern, acc, k), None),
            Local::Gaussiank => {
                let (idx, th) = gradkit_sparsify::gaussiank::select(acc, k);
                (idx, Some(th))
            }
        }
    }

    fn resident(self, dev: &dyn DeviceKernels, acc: &DVec, k: usize) -> (Sparse, Option<f32>) {
        match self {
            Local::Topk => (resident::topk_select(dev, acc, k), None),
            Local::Gaussiank => {
                let (sel, th) = resident::gaussiank_select(dev, acc, k);
                (sel, Some(th))
            }
        }
    }
}

/// A step's error-compensated accumulator: in host memory, or resident on a device.
pub(crate) enum Acc {
    Host(Vec<f32>),
    Dev(&'static dyn DeviceKernels, DVec),
}

impl Acc {
    /// The accumulator's values at `idx` (on a device: the indices up, the values down).
    pub fn values_at(&self, idx: &[u32]) -> Vec<f32> {
        match self {
            Acc::Host(a) => idx.iter().map(|&i| a[i as usize]).collect(),
            Acc::Dev(dev, a) => dev.download_f32(&dev.gather(a, &dev.upload_u32(idx))),
        }
    }

    /// DEFT's piece norms (`gradkit_partition::deft::piece_norms`).
    pub fn piece_norms(&self, layout: &Layout, pieces: &[dp::Piece]) -> Vec<f64> {
        match self {
            Acc::Host(a) => dp::piece_norms(layout, pieces, a),
            Acc::Dev(dev, a) => {
                let ranges: Vec<_> = pieces.iter().map(|p| p.flat_range(layout)).collect();
                dev.range_norms(a, &ranges)
            }
        }
    }

    /// Exact top-k in each `(flat range, k)`, flat indices ascending (DEFT's selection).
    pub fn select_in_ranges(
        &self,
        kern: &dyn Kernels,
        ranges: &[(std::ops::Range<usize>, usize)],
    ) -> Vec<u32> {
        match self {
            Acc::Host(acc) => {
                let mut sel: Vec<u32> = Vec::new();
                for (rg, kx) in ranges {
                    let off = rg.start as u32;
                    sel.extend(
                        kern.topk_by_magnitude(&acc[rg.clone()], *kx)
                            .into_iter()
                            .map(|i| i + off),
                    );
                }
                sel.sort_unstable();
                sel
            }
            Acc::Dev(dev, a) => resident::ranges_select(*dev, a, ranges),
        }
    }
}

impl Feedback {
    /// [`Feedback::accumulate`] on the device: the gradient's one upload, added into the
    /// resident residual (a residual restored on the host goes up first).
    pub fn accumulate_resident(&mut self, dev: &'static dyn DeviceKernels, g: Vec<f32>) -> Acc {
        if !self.enabled {
            return Acc::Dev(dev, dev.upload_f32(&g));
        }
        let res = self.dres.take().or_else(|| {
            let host = std::mem::take(&mut self.residual.values);
            (!host.is_empty()).then(|| dev.upload_f32(&host))
        });
        let (acc, sq) = resident::accumulate(dev, res, &g);
        self.acc_sq = Some(sq);
        Acc::Dev(dev, acc)
    }

    /// [`Feedback::accumulate`] where the accumulator lives (`Params::resident`).
    pub fn accumulate_acc(&mut self, g: Vec<f32>) -> Acc {
        match self.dev {
            Some(dev) => self.accumulate_resident(dev, g),
            None => Acc::Host(self.accumulate(g)),
        }
    }

    /// [`Feedback::local_selection`] of `local`, on the device when there is one.
    pub fn select_local(
        &mut self,
        input: Flat,
        metrics: &mut Vec<(String, f64)>,
        kern: &dyn Kernels,
        local: Local,
        k: usize,
    ) -> (Sparse, Option<Acc>) {
        match (self.dev, input) {
            (Some(dev), Flat::Dense(g)) => {
                let t = Instant::now();
                let acc = self.accumulate_resident(dev, g);
                let Acc::Dev(_, a) = &acc else {
                    unreachable!("a device accumulator")
                };
                let (sel, th) = local.resident(dev, a, k);
                metrics.push(("time_select_s".into(), secs(t)));
                if let Some(th) = th {
                    metrics.push(("threshold".into(), th as f64));
                }
                metrics.push(("local_nnz".into(), sel.len() as f64));
                (sel, Some(acc))
            }
            (_, input) => {
                let (sel, acc) =
                    self.local_selection(input, metrics, |acc| local.host(kern, acc, k));
                (sel, acc.map(Acc::Host))
            }
        }
    }

    /// [`Feedback::settle`] where the accumulator lives: on a device the indices that leave
    /// go up and the residual stays there.
    pub fn settle_acc(&mut self, acc: Acc, sent: &[u32], result: &[u32]) -> Option<f64> {
        match acc {
            Acc::Host(a) => self.settle(a, sent, result),
            Acc::Dev(dev, a) => {
                if !self.enabled {
                    return None;
                }
                let sq = self.acc_sq.take().unwrap_or(f64::NAN);
                let (res, norm) = resident::settle(dev, a, self.rule, sent, result, sq);
                self.dres = Some(res);
                Some(norm)
            }
        }
    }
}
