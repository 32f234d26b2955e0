//! The one list of gradkit's allreduce algorithms: the `--algo` names, their one-line
//! descriptions and families. The CLI value lists, the reducer registry
//! (`gradkit_collectives::make_reducer`), the cost model's dispatch ([`crate::by_algo`]) and
//! the docs' tables are all derived from (or checked against) [`Algo::ALL`].

use std::fmt;
use std::str::FromStr;

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

/// Every allreduce algorithm of the four papers, as `--algo` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algo {
    Ring,
    RingFp16,
    Rabenseifner,
    Tree,
    Native,
    TopkA,
    TopkDsa,
    GTopk,
    GaussianK,
    OkTopk,
    Deft,
    CltK,
    TopkUnion,
    OneBit,
    OneBitNaive,
    AllToAll,
}

impl Algo {
    /// Every algorithm, in the order `--help` lists them.
    pub const ALL: &'static [Algo] = &[
        Algo::Ring,
        Algo::RingFp16,
        Algo::Rabenseifner,
        Algo::Tree,
        Algo::Native,
        Algo::TopkA,
        Algo::TopkDsa,
        Algo::GTopk,
        Algo::GaussianK,
        Algo::OkTopk,
        Algo::Deft,
        Algo::CltK,
        Algo::TopkUnion,
        Algo::OneBit,
        Algo::OneBitNaive,
        Algo::AllToAll,
    ];

    /// The `--algo` name.
    pub const fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::RingFp16 => "ring-fp16",
            Algo::Rabenseifner => "rabenseifner",
            Algo::Tree => "tree",
            Algo::Native => "native",
            Algo::TopkA => "topka",
            Algo::TopkDsa => "topkdsa",
            Algo::GTopk => "gtopk",
            Algo::GaussianK => "gaussiank",
            Algo::OkTopk => "oktopk",
            Algo::Deft => "deft",
            Algo::CltK => "cltk",
            Algo::TopkUnion => "topk-union",
            Algo::OneBit => "onebit",
            Algo::OneBitNaive => "onebit-naive",
            Algo::AllToAll => "embrace",
        }
    }

    /// One line on what it does (without the family, see [`Algo::family`]).
    pub const fn description(self) -> &'static str {
        match self {
            Algo::Ring => "reduce-scatter + allgather ring (bandwidth-optimal)",
            Algo::RingFp16 => {
                "the ring with an fp16 wire format (half the bytes; sums rounded to fp16)"
            }
            Algo::Rabenseifner => "recursive halving reduce-scatter + doubling allgather, any P",
            Algo::Tree => "binomial-tree reduce + broadcast",
            Algo::Native => "the backend's own allreduce (MPI_Allreduce under mpirun)",
            Algo::TopkA => "allgatherv of every rank's COO, then sum (TopkA)",
            Algo::TopkDsa => "SparCML's static regions, reduce, sparse/dense allgatherv (TopkDSA)",
            Algo::GTopk => "gTop-k reduction tree keeping top-k per level, then broadcast",
            Algo::GaussianK => "Gaussian-threshold selection + TopkA communication",
            Algo::OkTopk => "Ok-Topk (split_and_reduce + balance_and_allgatherv), O(k) volume",
            Algo::Deft => "DEFT's exchange of disjoint per-worker selections",
            Algo::CltK => "CLT-k: the cyclic leader's top-k indices broadcast, every rank's values there allreduced",
            Algo::TopkUnion => {
                "Top-k (union): every rank's top-k indices allgathered, all ranks' values at the union allreduced"
            }
            Algo::OneBit => "DeepSpeed's error-compensated 1-bit allreduce (average)",
            Algo::OneBitNaive => "allgather of every rank's signs and scale (baseline)",
            Algo::AllToAll => "EmbRace's AlltoAll of row-sparse embedding gradients + ring",
        }
    }

    /// The kind of data it moves.
    pub const fn family(self) -> Family {
        match self {
            Algo::Ring | Algo::RingFp16 | Algo::Rabenseifner | Algo::Tree | Algo::Native => {
                Family::Dense
            }
            Algo::TopkA
            | Algo::TopkDsa
            | Algo::GTopk
            | Algo::GaussianK
            | Algo::OkTopk
            | Algo::Deft
            | Algo::CltK
            | Algo::TopkUnion => Family::Sparse,
            Algo::OneBit | Algo::OneBitNaive => Family::Compressed,
            Algo::AllToAll => Family::Embedding,
        }
    }

    /// Old spellings `--algo` still takes (with a note): one name per algorithm in every tool
    /// (`gradtrain --exchange`) and in the metrics' `algo` column.
    pub const ALIASES: &'static [(&'static str, Algo)] = &[("alltoall", Algo::AllToAll)];

    /// The `--algo` names of [`Algo::ALL`], in order.
    pub fn names() -> impl Iterator<Item = &'static str> {
        Algo::ALL.iter().map(|a| a.name())
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
        write!(f, "unknown --algo `{}` (known: ", self.0)?;
        for (i, name) in Algo::names().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(name)?;
        }
        f.write_str(")")
    }
}

impl std::error::Error for UnknownAlgo {}

impl FromStr for Algo {
    type Err = UnknownAlgo;

    /// The exact `--algo` name (case-sensitive, as the CLI has always taken it), or an old
    /// spelling in [`Algo::ALIASES`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algo::ALL
            .iter()
            .copied()
            .find(|a| a.name() == s)
            .or_else(|| {
                Algo::ALIASES
                    .iter()
                    .find(|(old, _)| *old == s)
                    .map(|(_, a)| *a)
            })
            .ok_or_else(|| UnknownAlgo(s.to_string()))
    }
}
