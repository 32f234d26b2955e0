//! gradkit-sparsify: gradient selection (sparsification) methods and error feedback.
//!
//! Every method of the papers lives in its own module, named after the paper, with the
//! section it implements cited in its doc comment. Selection works on `&[f32]` slices
//! (the flat, error-compensated accumulator of one rank) and returns strictly ascending
//! `u32` indices. [`Selector`] keeps a method's state across steps (Ok-Topk's threshold, the
//! call count); [`feedback::Residual`] is the error-feedback memory. This crate knows nothing
//! of communication or files.
//!
//! ```
//! use gradkit_sparsify::{Method, Selector};
//! let acc = [0.1f32, -3.0, 0.5, 2.0];
//! let mut sel = Selector::new(Method::Topk, 0);
//! let s = sel.select(0, &acc, 2);
//! assert_eq!(s.indices, vec![1, 3]);
//! assert_eq!(s.values, vec![-3.0, 2.0]);
//! ```

pub mod deft;
pub mod dgc;
pub mod feedback;
pub mod gaussiank;
pub mod heap_topk;
pub mod kernels;
pub mod oktopk;
pub mod onebit;
pub mod randomk;
pub mod resident;
pub mod selection;
pub mod threshold;
pub mod topk;

pub use feedback::{Leaves, Residual};
pub use kernels::Kernels;
pub use oktopk::{Adjust, Bands};
pub use selection::{Configured, Needs, Selection};

/// A method a [`Selector`] runs, with its parameters: every [`Selection`] but DEFT, which is
/// range-based ([`deft`]; [`Configured::Deft`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Method {
    /// Exact top-k by |x|, ties to the lower index.
    Topk,
    /// `{i : |x_i| > th}` for a fixed th.
    Threshold(f32),
    /// Ok-Topk's local selection: exact threshold every `reeval` steps, reused between with
    /// the [`Adjust`] policy.
    OkTopk { reeval: u32, adjust: Adjust },
    /// Gaussian-fit threshold, lowered until ≥ 3k/4 pass.
    GaussianK,
    /// DGC's sampled threshold with sample ratio `sample`.
    Dgc { sample: f64 },
    /// k random indices from (seed, step, stream), the same on every rank.
    RandomK { seed: u64 },
}

impl Method {
    /// The method, as the table of methods ([`Selection`]) lists it.
    pub fn selection(&self) -> Selection {
        match self {
            Method::Topk => Selection::Topk,
            Method::Threshold(_) => Selection::Threshold,
            Method::OkTopk { .. } => Selection::Oktopk,
            Method::GaussianK => Selection::Gaussiank,
            Method::Dgc { .. } => Selection::Dgc,
            Method::RandomK { .. } => Selection::Randomk,
        }
    }

    /// The name used by `--method`.
    pub fn name(&self) -> &'static str {
        self.selection().name()
    }
}

/// What a selection did, besides the indices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SelectInfo {
    /// The k asked for (after clamping to the length).
    pub k_target: usize,
    /// The threshold the method used, or None (topk reports its k-th largest |x|; randomk none).
    pub threshold: Option<f32>,
    /// True when the selection is the exact top-k (ties to the lower index) and `threshold` is
    /// the k-th largest |x|; otherwise a threshold method selected exactly `{|x| > threshold}`.
    pub exact_topk: bool,
}

/// What one selection picked: ascending indices, the selected accumulator values, and what
/// was done.
#[derive(Clone, Debug, PartialEq)]
pub struct Selected {
    pub indices: Vec<u32>,
    pub values: Vec<f32>,
    pub info: SelectInfo,
}

/// A method with its state across steps, for one rank and one index space (the flat model,
/// or one layer with `--scope layer`).
#[derive(Clone, Debug)]
pub struct Selector {
    method: Method,
    /// Separates index spaces for random-k (the layer id with `--scope layer`, else 0).
    stream: u64,
    ok: Option<oktopk::OkTopk>,
    /// The kernels the top-k and threshold methods run on ([`kernels::cpu`] by default).
    kernels: &'static dyn Kernels,
}

impl Selector {
    /// A selector on the CPU kernels.
    pub fn new(method: Method, stream: u64) -> Self {
        Self::with_kernels(method, stream, kernels::cpu())
    }

    /// A selector whose top-k and threshold methods run on `kernels`.
    pub fn with_kernels(method: Method, stream: u64, kernels: &'static dyn Kernels) -> Self {
        let ok = match &method {
            Method::OkTopk { reeval, adjust } => Some(oktopk::OkTopk::new(*reeval, *adjust)),
            _ => None,
        };
        Selector {
            method,
            stream,
            ok,
            kernels,
        }
    }

    /// The kernels this selector runs on.
    pub fn kernels(&self) -> &'static dyn Kernels {
        self.kernels
    }

    pub fn method(&self) -> &Method {
        &self.method
    }

    /// Selects about k entries of `acc` at `step` (calls must come in step order).
    pub fn select(&mut self, step: u32, acc: &[f32], k: usize) -> Selected {
        let k = k.min(acc.len());
        let (indices, values, threshold, exact_topk) = match &self.method {
            Method::Topk => {
                let (i, v, th) = self.kernels.topk_with_values(acc, k);
                (i, v, th, true)
            }
            Method::Threshold(th) => {
                let (i, v) = self.kernels.select_above_with_values(acc, *th);
                (i, v, Some(*th), false)
            }
            Method::OkTopk { .. } => {
                let (s, v) = self
                    .ok
                    .as_mut()
                    .expect("oktopk state")
                    .select_values(acc, k);
                (s.indices, v, s.threshold, s.reevaluated)
            }
            Method::GaussianK => {
                let (i, v, th) = gaussiank::select_values(acc, k);
                (i, v, Some(th), false)
            }
            Method::Dgc { sample } => {
                let (s, v) = dgc::select_values(acc, k, *sample);
                (s.indices, v, Some(s.threshold), s.exact_topk)
            }
            Method::RandomK { seed } => {
                let i = randomk::indices(acc.len(), k, *seed, step, self.stream);
                let v = i.iter().map(|&i| acc[i as usize]).collect();
                (i, v, None, false)
            }
        };
        Selected {
            indices,
            values,
            info: SelectInfo {
                k_target: k,
                threshold,
                exact_topk,
            },
        }
    }
}

impl Selector {
    /// [`Selector::select`] of an accumulator resident on `dev` (docs/GPU.md §7), the
    /// selection downloaded: top-k, threshold, Ok-Topk and Gaussiank. `None` for the methods
    /// with no device path (DGC, random-k), which select on the host.
    pub fn select_resident(
        &mut self,
        dev: &dyn resident::DeviceKernels,
        acc: &resident::DVec,
        k: usize,
    ) -> Option<Selected> {
        let k = k.min(acc.len());
        let (s, threshold, exact_topk) = match &self.method {
            Method::Topk => {
                let (i, v, th) = dev.topk(acc, 0..acc.len(), k);
                (resident::download_sparse(dev, &i, &v, 0), th, true)
            }
            Method::Threshold(th) => {
                let (i, v) = dev.select_above(acc, *th);
                (resident::download_sparse(dev, &i, &v, 0), Some(*th), false)
            }
            Method::OkTopk { .. } => {
                let ok = self.ok.as_mut().expect("oktopk state");
                let reeval = ok.reevaluates_next();
                let (st, values) = ok.select_values_resident(dev, reeval, acc, k);
                let s = gradkit_core::trace::Sparse {
                    indices: st.indices,
                    values,
                };
                (s, st.threshold, st.reevaluated)
            }
            Method::GaussianK => {
                let (s, th) = resident::gaussiank_select(dev, acc, k);
                (s, Some(th), false)
            }
            Method::Dgc { .. } | Method::RandomK { .. } => return None,
        };
        Some(Selected {
            indices: s.indices,
            values: s.values,
            info: SelectInfo {
                k_target: k,
                threshold,
                exact_topk,
            },
        })
    }
}

/// `k = floor(density·n)`, at least 1 when n > 0 (Ok-Topk's `int(n·density)`): the one rule,
/// [`gradkit_core::keep::Keep::k`], for a length.
pub fn k_for(density: f64, n: usize) -> usize {
    gradkit_core::keep::Keep::Density(density).k(n as u64) as usize
}
