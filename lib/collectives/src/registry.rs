//! The `--algo` names and the parameters every algorithm may read.

use anyhow::Result;
use gradkit_core::PlanRow;

use crate::{parse_named, Algo, Op, Reducer};

/// Ok-Topk's threshold-reuse policy (`--adjust`), from the one implementation in
/// `gradkit_sparsify::oktopk`.
pub use gradkit_sparsify::oktopk::{Adjust, Bands};

/// `(name, one-line description)` of every algorithm, in the order `--help` lists them:
/// derived from [`Algo::ALL`] (kept for callers that want plain pairs).
pub const ALGOS: &[(&str, &str)] = &{
    let mut out = [("", ""); Algo::ALL.len()];
    let mut i = 0;
    while i < out.len() {
        out[i] = (Algo::ALL[i].name(), Algo::ALL[i].description());
        i += 1;
    }
    out
};

/// Balancing in Ok-Topk's `balance_and_allgatherv`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Balance {
    /// Balance when the largest buffer exceeds 4x the average (the paper's rule)
    #[default]
    Auto,
    Always,
    Never,
}

impl Balance {
    /// Every policy, in the order `--help` lists them.
    pub const ALL: &'static [Balance] = &[Balance::Auto, Balance::Always, Balance::Never];

    /// The `--balance` name.
    pub const fn name(self) -> &'static str {
        match self {
            Balance::Auto => "auto",
            Balance::Always => "always",
            Balance::Never => "never",
        }
    }

    /// One line for `--help`, where there is more to say than the name.
    pub const fn help(self) -> Option<&'static str> {
        match self {
            Balance::Auto => {
                Some("Balance when the largest buffer exceeds 4x the average (the paper's rule)")
            }
            Balance::Always | Balance::Never => None,
        }
    }
}

impl std::str::FromStr for Balance {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        parse_named("--balance", s, Balance::ALL, Balance::name)
    }
}

impl std::fmt::Display for Balance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Ok-Topk's Step D on the re-evaluation steps (every τ' steps; Algorithm 1 lines 9–13).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReevalStepD {
    /// The exact top-k of the gathered reduced values is the result, no Step D (the authors' code)
    #[default]
    Skip,
    /// Line 13 on every step: keep |reduced| ≥ the new global threshold, balance_and_allgatherv
    Run,
}

impl ReevalStepD {
    /// Every policy, in the order `--help` lists them.
    pub const ALL: &'static [ReevalStepD] = &[ReevalStepD::Skip, ReevalStepD::Run];

    /// The `--reeval-step-d` name.
    pub const fn name(self) -> &'static str {
        match self {
            ReevalStepD::Skip => "skip",
            ReevalStepD::Run => "run",
        }
    }

    /// One line for `--help`.
    pub const fn help(self) -> Option<&'static str> {
        match self {
            ReevalStepD::Skip => Some(
                "The exact top-k of the gathered reduced values is the result, no Step D (the authors' code)",
            ),
            ReevalStepD::Run => Some(
                "Algorithm 1 line 13 on every step: keep |reduced| >= the new global threshold, balance_and_allgatherv",
            ),
        }
    }
}

impl std::str::FromStr for ReevalStepD {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        parse_named("--reeval-step-d", s, ReevalStepD::ALL, ReevalStepD::name)
    }
}

impl std::fmt::Display for ReevalStepD {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How EmbRace splits an embedding table across ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Split {
    /// Near-equal contiguous column slices (the paper's choice)
    #[default]
    Columns,
    /// Near-equal contiguous row slices (for comparison)
    Rows,
}

impl Split {
    /// Every split, in the order `--help` lists them.
    pub const ALL: &'static [Split] = &[Split::Columns, Split::Rows];

    /// The `--split` name.
    pub const fn name(self) -> &'static str {
        match self {
            Split::Columns => "columns",
            Split::Rows => "rows",
        }
    }

    /// One line for `--help`.
    pub const fn help(self) -> Option<&'static str> {
        match self {
            Split::Columns => Some("Near-equal contiguous column slices (the paper's choice)"),
            Split::Rows => Some("Near-equal contiguous row slices (for comparison)"),
        }
    }
}

impl std::str::FromStr for Split {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        parse_named("--split", s, Split::ALL, Split::name)
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
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
    /// Ok-Topk: whether Step D (`balance_and_allgatherv`) also runs on re-evaluation steps.
    pub reeval_step_d: ReevalStepD,
    /// A `plan/1` table (Ok-Topk regions or DEFT ranges) instead of computing one.
    pub plan: Option<Vec<PlanRow>>,
    /// Error feedback for the algorithms' own selection of dense input.
    pub residual: bool,
    pub split: Split,
    pub seed: u64,
    /// The selection and compression kernels (top-k, thresholds, 1-bit pack/unpack):
    /// gradkit-sparsify's CPU reference unless a device implementation is given.
    pub kernels: &'static dyn gradkit_sparsify::kernels::Kernels,
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
            reeval_step_d: ReevalStepD::Skip,
            plan: None,
            residual: true,
            split: Split::Columns,
            seed: 0,
            kernels: gradkit_sparsify::kernels::cpu(),
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

/// The reducer for `--algo name`; an unknown name is an error listing the known ones.
pub fn make_reducer(name: &str, params: &Params) -> Result<Box<dyn Reducer>> {
    let algo: Algo = name.parse()?;
    reducer_for(algo, params)
}

/// The reducer for `algo`. The 1-bit reducers start with zero error buffers: a caller
/// restores saved ones with [`Reducer::load_state`].
pub fn reducer_for(algo: Algo, params: &Params) -> Result<Box<dyn Reducer>> {
    use crate::onebit::{OneBitReducer, Variant};
    use crate::sparse;
    Ok(match algo {
        Algo::Ring | Algo::RingFp16 | Algo::Rabenseifner | Algo::Tree | Algo::Native => {
            Box::new(crate::dense::DenseReducer::new(algo.name(), params.op)?)
        }
        // sparse algorithms (Ok-Topk Table 1) and DEFT
        Algo::TopkA => Box::new(sparse::topka::TopkA::new(params)?),
        Algo::TopkDsa => Box::new(sparse::topkdsa::TopkDsa::new(params)?),
        Algo::GTopk => Box::new(sparse::gtopk::GTopk::new(params)?),
        Algo::GaussianK => Box::new(sparse::gaussiank::GaussianK::new(params)?),
        Algo::OkTopk => Box::new(sparse::oktopk::OkTopk::new(params)?),
        Algo::Deft => Box::new(sparse::deft::Deft::new(params)?),
        Algo::CltK => Box::new(sparse::cltk::CltK::new(params)?),
        Algo::TopkUnion => Box::new(sparse::topk_union::TopkUnion::new(params)?),
        // compressed and embedding collectives
        Algo::OneBit => Box::new(OneBitReducer::new(Variant::Server).with_kernels(params.kernels)),
        Algo::OneBitNaive => {
            Box::new(OneBitReducer::new(Variant::Naive).with_kernels(params.kernels))
        }
        Algo::AllToAll => Box::new(crate::alltoall::AllToAllReducer::new(
            params.split,
            params.op,
        )),
    })
}
