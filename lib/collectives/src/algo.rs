//! What an algorithm is, as every tool sees it: a [`Descriptor`] declared by the
//! algorithm's own module, next to its code, and collected in one list
//! (`Algo::ALL`, written in the registry module). An [`Algo`] is a handle to one descriptor.
//!
//! A descriptor owns the algorithm's `--algo` name (also gradtrain's `--exchange` name and
//! the metrics' `algo` value) and its old spellings, its family, the paper section it
//! implements, its one-line description, the algorithm-specific options it reads
//! ([`Knob`]: a tool refuses any other), its α-β formula and its constructor. Everything else
//! is derived from the list: clap's value list and `--help`, the refusal of a flag the
//! algorithm does not read, the reducer registry ([`crate::reducer_for`]), the cost model's
//! dispatch ([`Algo::cost`]) and the docs' tables (checked by the tests).

use std::fmt;
use std::str::FromStr;

use anyhow::Result;
use gradkit_cost::Cost;

use crate::{Params, Reducer};

/// What kind of data an algorithm moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Every element, uncompressed.
    Dense,
    /// Selected (index, value) pairs: Ok-Topk's Table 1 and DEFT.
    Sparse,
    /// Quantised to one bit per element plus scales.
    Compressed,
    /// Row-sparse embedding gradients (EmbRace).
    Embedding,
}

impl Family {
    /// Every family, in the order of [`Algo::ALL`].
    pub const ALL: &'static [Family] = &[
        Family::Dense,
        Family::Sparse,
        Family::Compressed,
        Family::Embedding,
    ];

    /// Lower-case name (`dense`, `sparse`, `compressed`, `embedding`).
    pub const fn name(self) -> &'static str {
        match self {
            Family::Dense => "dense",
            Family::Sparse => "sparse",
            Family::Compressed => "compressed",
            Family::Embedding => "embedding",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An option that only some algorithms read. A tool refuses one given to an algorithm whose
/// [`Descriptor::reads`] lacks it (it would be ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knob {
    /// `--op sum|mean` (every algorithm but the 1-bit ones, which always average).
    Op,
    /// `--wire fp16`: the dense ring's fp16 messages.
    Wire,
    /// `--state`: the 1-bit error buffers saved across runs.
    State,
    /// `--plan`: a plan/1 table (Ok-Topk's regions, DEFT's ranges).
    Plan,
    /// Ok-Topk's `--period` (τ).
    Period,
    /// Ok-Topk's `--reeval` (τ').
    Reeval,
    /// Ok-Topk's `--adjust`.
    Adjust,
    /// Ok-Topk's `--balance`.
    Balance,
    /// Ok-Topk's `--reeval-step-d`.
    ReevalStepD,
    /// EmbRace's `--split`.
    Split,
}

impl Knob {
    /// The options that are refused from [`Descriptor::reads`] with the common message
    /// ("`--flag` applies to --algo … only").
    pub const REFUSED: &'static [Knob] = &[
        Knob::State,
        Knob::Plan,
        Knob::Period,
        Knob::Reeval,
        Knob::Adjust,
        Knob::Balance,
        Knob::ReevalStepD,
        Knob::Split,
    ];

    /// The flag as the tools spell it.
    pub const fn flag(self) -> &'static str {
        match self {
            Knob::Op => "--op",
            Knob::Wire => "--wire",
            Knob::State => "--state",
            Knob::Plan => "--plan",
            Knob::Period => "--period",
            Knob::Reeval => "--reeval",
            Knob::Adjust => "--adjust",
            Knob::Balance => "--balance",
            Knob::ReevalStepD => "--reeval-step-d",
            Knob::Split => "--split",
        }
    }

    /// clap's id of the flag (the field name).
    pub const fn id(self) -> &'static str {
        match self {
            Knob::Op => "op",
            Knob::Wire => "wire",
            Knob::State => "state",
            Knob::Plan => "plan",
            Knob::Period => "period",
            Knob::Reeval => "reeval",
            Knob::Adjust => "adjust",
            Knob::Balance => "balance",
            Knob::ReevalStepD => "reeval_step_d",
            Knob::Split => "split",
        }
    }

    /// The `--algo` names of the algorithms that read this option, in alphabetical order.
    pub fn readers(self) -> Vec<&'static str> {
        let mut names: Vec<&str> = Algo::ALL
            .iter()
            .filter(|a| a.reads(self))
            .map(|a| a.name())
            .collect();
        names.sort_unstable();
        names
    }
}

/// The α-β formula of an algorithm: (P, n elements, k selected) → cost per rank.
pub type CostFn = fn(usize, f64, f64) -> Cost;

/// An algorithm's formula split by the phases its reducer records (`comm.phase`), in the
/// order they run: (P, n, k) → (phase, cost) pairs. A phase the reducer records and the list
/// leaves out is traffic the paper's formula does not count (Ok-Topk's threshold control).
pub type PhasesFn = fn(usize, f64, f64) -> Vec<(&'static str, Cost)>;

/// One algorithm, declared by its module (see the module docs).
pub struct Descriptor {
    /// The `--algo` name.
    pub name: &'static str,
    /// Old spellings that are still taken (with a note).
    pub aliases: &'static [&'static str],
    pub family: Family,
    /// The paper and section it implements (or the baseline it is compared with).
    pub paper: &'static str,
    /// One line on what it does (without the family).
    pub description: &'static str,
    /// The algorithm-specific options it reads.
    pub reads: &'static [Knob],
    /// Whether a sparse algorithm selects from dense input itself and cannot take a
    /// selection (DEFT, CLT-k, Top-k (union) see every rank's dense values).
    pub dense_input_only: bool,
    /// The kind of plan/1 table `--plan` gives it (with [`Knob::Plan`] in `reads`).
    pub plan: Option<crate::plan::PlanKind>,
    /// Its formula (Table 1's best case where Table 1 gives an interval, Ok-Topk's worst
    /// case), or `None` where there is none.
    pub cost: Option<CostFn>,
    /// Its best and worst case where its paper gives an interval (two rows of Ok-Topk's
    /// Table 1), or `None`: `gradallreduce model` prints both.
    pub bounds: Option<(CostFn, CostFn)>,
    /// [`Descriptor::cost`] split by recorded phase, where the paper's formula is a sum of
    /// its phases' (`gradreport simulate --model-n` compares each phase's replay with its
    /// share), or `None`.
    pub phases: Option<PhasesFn>,
    /// How gradtrain runs it as an `--exchange`, or `None` where gradtrain does not.
    pub exchange: Option<AsExchange>,
    /// The reducer, with the options of `params` it reads.
    pub make: fn(&Params) -> Result<Box<dyn Reducer>>,
}

/// An algorithm as gradtrain's `--exchange` (the training loop's view: gradients averaged
/// over the ranks, the sparse ones with error feedback).
pub struct AsExchange {
    /// Its line in `gradtrain --help`.
    pub help: &'static str,
    /// Old spellings `--exchange` still takes (gradtrain's own; `--algo` does not take them).
    pub aliases: &'static [&'static str],
}

impl AsExchange {
    /// An exchange with its help line and no old spellings.
    pub const fn new(help: &'static str) -> Option<AsExchange> {
        Some(AsExchange { help, aliases: &[] })
    }
}

impl Descriptor {
    /// A descriptor with the common defaults: no aliases, no algorithm-specific option but
    /// `--op`, input dense or selected, no formula. Modules fill in the rest with
    /// `Descriptor { name: …, ..Descriptor::base(make) }`.
    pub const fn base(make: fn(&Params) -> Result<Box<dyn Reducer>>) -> Descriptor {
        Descriptor {
            name: "",
            aliases: &[],
            family: Family::Sparse,
            paper: "",
            description: "",
            reads: &[Knob::Op],
            dense_input_only: false,
            plan: None,
            cost: None,
            bounds: None,
            phases: None,
            exchange: None,
            make,
        }
    }
}

/// An algorithm: a handle to its [`Descriptor`]. Two handles are equal when they name the
/// same algorithm.
#[derive(Clone, Copy)]
pub struct Algo(pub &'static Descriptor);

impl Algo {
    /// Its descriptor.
    pub const fn descriptor(self) -> &'static Descriptor {
        self.0
    }

    /// The `--algo` name.
    pub const fn name(self) -> &'static str {
        self.0.name
    }

    /// One line on what it does (without the family, see [`Algo::family`]).
    pub const fn description(self) -> &'static str {
        self.0.description
    }

    /// The kind of data it moves.
    pub const fn family(self) -> Family {
        self.0.family
    }

    /// Whether it reads `knob`.
    pub fn reads(self, knob: Knob) -> bool {
        self.0.reads.contains(&knob)
    }

    /// The kind of plan `--plan` gives it, `None` where it reads no plan.
    pub const fn plan_kind(self) -> Option<crate::plan::PlanKind> {
        self.0.plan
    }

    /// Its α-β cost for P ranks, n elements and k selected, or `None` where the model has no
    /// formula.
    pub fn cost(self, p: usize, n: f64, k: f64) -> Option<Cost> {
        self.0.cost.map(|f| f(p, n, k))
    }

    /// Its best and worst case for P ranks, n elements and k selected, where its paper gives
    /// an interval ([`Descriptor::bounds`]).
    pub fn bounds(self, p: usize, n: f64, k: f64) -> Option<(Cost, Cost)> {
        self.0
            .bounds
            .map(|(best, worst)| (best(p, n, k), worst(p, n, k)))
    }

    /// Its formula by recorded phase ([`Descriptor::phases`]), `None` where it has none.
    pub fn phase_costs(self, p: usize, n: f64, k: f64) -> Option<Vec<(&'static str, Cost)>> {
        self.0.phases.map(|f| f(p, n, k))
    }

    /// [`Algo::cost`] for an `--algo` name (as metrics/1 files record it); `None` for a name
    /// that is no algorithm or has no formula.
    pub fn cost_by_name(name: &str, p: usize, n: f64, k: f64) -> Option<Cost> {
        name.parse::<Algo>().ok()?.cost(p, n, k)
    }

    /// The `--algo` names of [`Algo::ALL`], in order.
    pub fn names() -> impl Iterator<Item = &'static str> {
        Algo::ALL.iter().map(|a| a.name())
    }

    /// Old spellings `--algo` still takes (with a note), with the algorithm they name.
    pub fn aliases() -> impl Iterator<Item = (&'static str, Algo)> {
        Algo::ALL
            .iter()
            .flat_map(|a| a.0.aliases.iter().map(move |old| (*old, *a)))
    }
}

impl PartialEq for Algo {
    fn eq(&self, other: &Algo) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Algo {}

impl std::hash::Hash for Algo {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.name.hash(state)
    }
}

impl fmt::Debug for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Algo({})", self.0.name)
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no [`Algo`]; its message lists the known names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownAlgo(pub String);

impl fmt::Display for UnknownAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&gradkit_core::named::unknown(
            "--algo",
            &self.0,
            Algo::names(),
        ))
    }
}

impl std::error::Error for UnknownAlgo {}

impl FromStr for Algo {
    type Err = UnknownAlgo;

    /// The exact `--algo` name (case-sensitive, as the CLI has always taken it), or an old
    /// spelling.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let aliases: Vec<(&'static str, Algo)> = Algo::aliases().collect();
        gradkit_core::named::lookup(s, Algo::ALL, Algo::name, &aliases)
            .ok_or_else(|| UnknownAlgo(s.to_string()))
    }
}
