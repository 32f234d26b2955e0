//! gradkit-collectives: every allreduce of the four papers, written once against
//! [`gradkit_comm::Comm`], plus the α-β cost model that predicts their time.
//!
//! Dense: [`dense`] (ring, Rabenseifner, binomial tree, the backend's native one).
//! Sparse: [`sparse`] (Ok-Topk's Table 1 with its baselines, DEFT's exchange and its own).
//! Compressed: DeepSpeed's 1-bit allreduce. Embedding: EmbRace's AlltoAll exchange.
//! Each algorithm's module declares its [`algo::Descriptor`] (name, family, paper section,
//! the options it reads, its formula from [`cost`], its constructor), and
//! [`registry::ALL`] lists them: an [`Algo`] is a handle to one. Each algorithm is a
//! [`Reducer`]: state that lives across
//! the steps of a run (residuals, thresholds, error buffers) and reduces one step at a time;
//! that state goes in and out as values ([`Reducer::state`], [`Reducer::load_state`]).
//!
//! Not here: reading or writing files (the tools do the I/O), command lines (the tools build
//! their value lists from [`Algo::ALL`], [`Op::ALL`], …), choosing ranks (see gradkit-comm),
//! training (gradkit-train).

pub mod algo;
pub mod alltoall;
pub mod dense;
pub mod feed;
pub mod onebit;
pub mod params;
pub mod registry;
pub mod sparse;
pub mod step;

use anyhow::Result;
use gradkit_comm::Comm;
use gradkit_core::trace::{Layout, Sparse};

pub use algo::{Algo, AsExchange, Descriptor, Family, Knob};
/// The α-β formulas (crate gradkit-cost) the descriptors name.
pub use gradkit_cost as cost;
/// The `plan/1` validator every plan consumer shares (gradkit-partition's), for the callers
/// that hand a plan to [`Params::plan`].
pub use gradkit_partition::plan;
pub use params::{Op, Params};
pub use registry::{make_reducer, reducer_for};

/// One rank's data for one step, in the flat index space (layers concatenated by
/// `layer_id`, see [`Layout`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Flat {
    Dense(Vec<f32>),
    Sparse(Sparse),
}

impl Flat {
    /// The dense vector, moved out of a `Dense` (no copy) or expanded from a `Sparse`.
    pub fn into_dense(self, n: usize) -> Vec<f32> {
        match self {
            Flat::Dense(v) => v,
            Flat::Sparse(s) => s.to_dense(n),
        }
    }
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

/// What [`Reducer::reduce_in_place`] gives besides the result it wrote.
#[derive(Debug, Default)]
pub struct InPlaceOutput {
    pub metrics: Vec<(String, f64)>,
    /// The result's entries that are not zero, where the reducer counted them on its last
    /// pass over the result (the mean's division); `None`: the caller counts.
    pub nnz: Option<usize>,
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
    /// [`Reducer::reduce`] of dense input that the reducer can reduce where it lies: `data`
    /// holds this rank's input and is overwritten with the result (the same bits and messages
    /// as `reduce` of `Flat::Dense(data.to_vec())`), and the step's metrics are returned.
    /// `None` where the reducer needs its input as an owned vector (the caller then copies
    /// it and calls `reduce`). The Python module's `Reducer.reduce(x, out=x)` goes this way,
    /// so a DDP bucket is reduced without a copy ([`step::reduce_step_in_place`]).
    fn reduce_in_place(
        &mut self,
        _comm: &dyn Comm,
        _step: u32,
        _layout: &Layout,
        _data: &mut [f32],
    ) -> Option<Result<InPlaceOutput>> {
        None
    }
    /// Called once after the last step.
    fn finish(&mut self, _comm: &dyn Comm) -> Result<()> {
        Ok(())
    }
    /// The state this rank keeps across steps (error-feedback residual, 1-bit error buffers,
    /// reused thresholds) as named `f32` tensors, so that a caller can checkpoint it. The
    /// reducer does no I/O: the tools and the trainer write and read these values.
    fn state(&self) -> Vec<(String, Vec<f32>)> {
        Vec::new()
    }
    /// Restores what [`Reducer::state`] returned (same rank count and layout); a name the
    /// reducer does not know, or a length that does not fit, is an error naming it.
    fn load_state(&mut self, state: &[(String, Vec<f32>)]) -> Result<()> {
        match state.first() {
            None => Ok(()),
            Some((k, _)) => anyhow::bail!("{}: keeps no state, but was given `{k}`", self.name()),
        }
    }
    /// [`Reducer::load_state`] of values the reducer may keep (no copy where it overrides
    /// this; the default copies).
    fn load_state_owned(&mut self, state: Vec<(String, Vec<f32>)>) -> Result<()> {
        self.load_state(&state)
    }
    /// [`Reducer::state`] of a reducer that is done: its state moved out where it overrides
    /// this (no copy; the reducer keeps none), a copy by default.
    fn take_state(&mut self) -> Vec<(String, Vec<f32>)> {
        self.state()
    }
}
