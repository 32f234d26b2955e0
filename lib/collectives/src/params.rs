//! The knobs every algorithm may read ([`Params`]) and the option enums behind their flags
//! (`--balance`, `--reeval-step-d`, `--split`): each with its name, `--help` line, parser and
//! display from one table. A leaf of the crate: the algorithms and the registry use it.

use gradkit_core::keep::{Keep, DEFAULT_DENSITY};
use gradkit_core::PlanRow;

pub use gradkit_sparsify::oktopk::{Adjust, Bands};

/// Reduction operator of the dense algorithms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Op {
    #[default]
    Sum,
    Mean,
}

impl Op {
    /// Every operator, in the order `--help` lists them.
    pub const ALL: &'static [Op] = &[Op::Sum, Op::Mean];

    /// The `--op` name.
    pub const fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Mean => "mean",
        }
    }

    /// One line for `--help`, where there is more to say than the name.
    pub const fn help(self) -> Option<&'static str> {
        None
    }
}

gradkit_core::named!(Op, "--op");

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

gradkit_core::named!(Balance, "--balance");

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

gradkit_core::named!(ReevalStepD, "--reeval-step-d");

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

gradkit_core::named!(Split, "--split");

/// Every knob an algorithm may read; each algorithm documents which it uses.
#[derive(Clone, Debug)]
pub struct Params {
    pub op: Op,
    /// What the algorithms that select (dense input) or keep top-k (gtopk) keep: a density
    /// k/n or an exact k (`--density`, `--k`), checked where it is built ([`Keep::density`],
    /// [`Keep::count`]).
    pub keep: Keep,
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
    /// A device that keeps the step's tensors resident (docs/GPU.md §7): the sparse reducers
    /// (every one selects from dense input) upload the gradient once, select and keep the
    /// residual on it, and download the selection; the 1-bit reducers keep their worker
    /// and server errors on it and move only packed signs besides the gradient and the
    /// result. `None`: host memory, the `kernels` above.
    pub resident: Option<&'static dyn gradkit_sparsify::resident::DeviceKernels>,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            op: Op::Sum,
            keep: Keep::Density(DEFAULT_DENSITY),
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
            resident: None,
        }
    }
}

impl Params {
    /// k for a model of n elements: `--k`, else floor(density·n), at least 1 when n > 0
    /// ([`Keep::k`], the one rule).
    pub fn k_for(&self, n: u64) -> u64 {
        self.keep.k(n)
    }
}
