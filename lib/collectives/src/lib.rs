//! gradkit-collectives: every allreduce of the four papers, written once against
//! [`gradkit_comm::Comm`], plus the α-β cost model that predicts their time.
//!
//! Dense: [`dense`] (ring, Rabenseifner, binomial tree, the backend's native one).
//! Sparse (Ok-Topk Table 1): TopkA, TopkDSA, gTopk, Gaussiank, Ok-Topk, DEFT's exchange.
//! Compressed: DeepSpeed's 1-bit allreduce. Embedding: EmbRace's AlltoAll exchange.
//! [`cost`] holds the formulas. Each algorithm is a [`Reducer`]: state that lives across the
//! steps of a run (residuals, thresholds, error buffers) and reduces one step at a time.
//!
//! Not here: reading files, choosing ranks (see gradkit-comm), training (gradkit-train).

pub mod alltoall;
pub mod cost;
pub mod dense;
pub mod onebit;
pub mod registry;
pub mod sparse;

use anyhow::Result;
use gradkit_comm::Comm;
use gradkit_core::trace::{Layout, Sparse};

/// The `plan/1` validator every plan consumer shares (gradkit-partition's), for the callers
/// that hand a plan to [`Params::plan`].
pub use gradkit_partition::plan;
pub use registry::{make_reducer, Params, ALGOS};

/// One rank's data for one step, in the flat index space (layers concatenated by
/// `layer_id`, see [`Layout`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Flat {
    Dense(Vec<f32>),
    Sparse(Sparse),
}

impl Flat {
    pub fn to_dense(&self, n: usize) -> Vec<f32> {
        match self {
            Flat::Dense(v) => v.clone(),
            Flat::Sparse(s) => s.to_dense(n),
        }
    }
    pub fn is_dense(&self) -> bool {
        matches!(self, Flat::Dense(_))
    }
}

/// The result of one step on one rank, plus named per-step measurements (threshold, nnz…)
/// that the tool writes as `metrics/1` rows.
#[derive(Clone, Debug, PartialEq)]
pub struct StepOutput {
    pub result: Flat,
    pub metrics: Vec<(String, f64)>,
    /// Flat indices this rank selected locally and sent (algorithms that select from dense
    /// input), so a trainer can apply Ok-Topk Algorithm 2's residual rule.
    pub contributed: Option<Vec<u32>>,
}

impl StepOutput {
    pub fn new(result: Flat) -> Self {
        StepOutput {
            result,
            metrics: Vec::new(),
            contributed: None,
        }
    }
}

/// An allreduce algorithm with the state it keeps across the steps of one run.
/// Every rank of a world calls [`Reducer::reduce`] once per step, in step order.
pub trait Reducer: Send {
    /// The `--algo` name.
    fn name(&self) -> &'static str;
    /// Reduces this rank's `input` for `step` with the other ranks of `comm`.
    fn reduce(
        &mut self,
        comm: &dyn Comm,
        step: u32,
        layout: &Layout,
        input: Flat,
    ) -> Result<StepOutput>;
    /// Called once after the last step (e.g. to save error buffers with `--state`).
    fn finish(&mut self, _comm: &dyn Comm) -> Result<()> {
        Ok(())
    }
}

/// Reduction operator of the dense algorithms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Op {
    #[default]
    Sum,
    Mean,
}
