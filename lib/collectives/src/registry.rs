//! The `--algo` names and the parameters every algorithm may read.

use std::path::PathBuf;

use anyhow::{bail, Result};
use gradkit_core::PlanRow;

use crate::{Op, Reducer};

/// Ok-Topk's threshold-reuse policy (`--adjust`), from the one implementation in
/// `gradkit_sparsify::oktopk`.
pub use gradkit_sparsify::oktopk::{Adjust, Bands};

/// `(name, one-line description)` of every algorithm, in the order `--help` lists them.
pub const ALGOS: &[(&str, &str)] = &[
    (
        "ring",
        "dense: reduce-scatter + allgather ring (bandwidth-optimal)",
    ),
    (
        "rabenseifner",
        "dense: recursive halving reduce-scatter + doubling allgather, any P",
    ),
    ("tree", "dense: binomial-tree reduce + broadcast"),
    (
        "native",
        "dense: the backend's own allreduce (MPI_Allreduce under mpirun)",
    ),
    (
        "topka",
        "sparse: allgatherv of every rank's COO, then sum (TopkA)",
    ),
    (
        "topkdsa",
        "sparse: SparCML's static regions, reduce, sparse/dense allgatherv (TopkDSA)",
    ),
    (
        "gtopk",
        "sparse: gTop-k reduction tree keeping top-k per level, then broadcast",
    ),
    (
        "gaussiank",
        "sparse: Gaussian-threshold selection + TopkA communication",
    ),
    (
        "oktopk",
        "sparse: Ok-Topk (split_and_reduce + balance_and_allgatherv), O(k) volume",
    ),
    (
        "deft",
        "sparse: DEFT's exchange of disjoint per-worker selections",
    ),
    (
        "onebit",
        "compressed: DeepSpeed's error-compensated 1-bit allreduce (average)",
    ),
    (
        "onebit-naive",
        "compressed: allgather of every rank's signs and scale (baseline)",
    ),
    (
        "alltoall",
        "embedding: EmbRace's AlltoAll of row-sparse embedding gradients + ring",
    ),
];

/// Balancing in Ok-Topk's `balance_and_allgatherv`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Balance {
    /// Balance when the largest buffer exceeds 4x the average (the paper's rule)
    #[default]
    Auto,
    Always,
    Never,
}

/// How EmbRace splits an embedding table across ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Split {
    /// Near-equal contiguous column slices (the paper's choice)
    #[default]
    Columns,
    /// Near-equal contiguous row slices (for comparison)
    Rows,
}

/// Every knob an algorithm may read; each algorithm documents which it uses.
#[derive(Clone, Debug)]
pub struct Params {
    pub op: Op,
    /// Target density for algorithms that select (dense input) or keep top-k (gtopk).
    pub density: f64,
    /// Exact k instead of density.
    pub k: Option<u64>,
    /// Ok-Topk: space repartition period τ.
    pub period: u32,
    /// Ok-Topk: global threshold re-evaluation period τ'.
    pub reeval: u32,
    /// Ok-Topk: how reused thresholds are adjusted between re-evaluations (local and global).
    pub adjust: Adjust,
    pub balance: Balance,
    /// A `plan/1` table (Ok-Topk regions or DEFT ranges) instead of computing one.
    pub plan: Option<Vec<PlanRow>>,
    /// Error feedback for the algorithms' own selection of dense input.
    pub residual: bool,
    /// 1-bit: file to load/save the worker and server error buffers.
    pub state: Option<PathBuf>,
    pub split: Split,
    pub seed: u64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            op: Op::Sum,
            density: 0.01,
            k: None,
            period: 64,
            reeval: 32,
            adjust: Adjust::Ladder,
            balance: Balance::Auto,
            plan: None,
            residual: true,
            state: None,
            split: Split::Columns,
            seed: 0,
        }
    }
}

impl Params {
    /// k for a model of n elements: `--k`, else floor(density·n), at least 1 when n > 0.
    pub fn k_for(&self, n: u64) -> u64 {
        match self.k {
            Some(k) => k.min(n),
            None => ((self.density * n as f64).floor() as u64).clamp((n > 0) as u64, n),
        }
    }
}

/// The reducer for `--algo name`.
pub fn make_reducer(name: &str, params: &Params) -> Result<Box<dyn Reducer>> {
    let _ = params;
    Ok(match name {
        "ring" | "rabenseifner" | "tree" | "native" => {
            Box::new(crate::dense::DenseReducer::new(name, params.op)?)
        }
        // sparse algorithms (Ok-Topk Table 1) — filled in by the sparse collectives
        "topka" => Box::new(crate::sparse::topka::TopkA::new(params)?),
        "topkdsa" => Box::new(crate::sparse::topkdsa::TopkDsa::new(params)?),
        "gtopk" => Box::new(crate::sparse::gtopk::GTopk::new(params)?),
        "gaussiank" => Box::new(crate::sparse::gaussiank::GaussianK::new(params)?),
        "oktopk" => Box::new(crate::sparse::oktopk::OkTopk::new(params)?),
        "deft" => Box::new(crate::sparse::deft::Deft::new(params)?),
        // compressed and embedding collectives
        "onebit" => Box::new(crate::onebit::OneBitReducer::new(
            crate::onebit::Variant::Server,
            params.state.clone(),
        )),
        "onebit-naive" => Box::new(crate::onebit::OneBitReducer::new(
            crate::onebit::Variant::Naive,
            params.state.clone(),
        )),
        "alltoall" => Box::new(crate::alltoall::AllToAllReducer::new(
            params.split,
            params.op,
        )),
        other => {
            let names: Vec<&str> = ALGOS.iter().map(|a| a.0).collect();
            bail!("unknown --algo `{other}` (known: {})", names.join(", "))
        }
    })
}
