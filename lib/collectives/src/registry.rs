//! The one list of algorithms ([`Algo::ALL`]): the families' lists, each declared beside the
//! family's modules (`dense::ALGOS`, `sparse::ALGOS`, `onebit::ALGOS`, `alltoall::ALGOS`),
//! one line per [`Descriptor`] its module declares (name, family, paper, options, formula,
//! constructor). A new sparse allreduce is its module, and its `pub mod` and list line in
//! `sparse/mod.rs`.

use anyhow::Result;

use crate::algo::{Algo, Descriptor};
use crate::Reducer;

/// Ok-Topk's threshold-reuse policy (`--adjust`), from the one implementation in
/// `gradkit_sparsify::oktopk`.
pub use crate::params::{Adjust, Balance, Bands, Params, ReevalStepD, Split};

/// Every algorithm, in the order `--help` lists them ([`Algo::ALL`]).
pub const ALL: &[Algo] = Algo::ALL;

/// The families' lists, in `--help` order; each is declared beside its modules.
const FAMILIES: &[&[Algo]] = &[
    crate::dense::ALGOS,
    crate::sparse::ALGOS,
    crate::onebit::ALGOS,
    crate::alltoall::ALGOS,
];

/// How many algorithms [`FAMILIES`] holds.
const COUNT: usize = {
    let (mut i, mut n) = (0, 0);
    while i < FAMILIES.len() {
        n += FAMILIES[i].len();
        i += 1;
    }
    n
};

/// [`FAMILIES`] in one array, at compile time.
const ALL_ARRAY: [Algo; COUNT] = {
    let mut out = [Algo(&crate::dense::RING); COUNT];
    let (mut i, mut o) = (0, 0);
    while i < FAMILIES.len() {
        let mut j = 0;
        while j < FAMILIES[i].len() {
            out[o] = FAMILIES[i][j];
            o += 1;
            j += 1;
        }
        i += 1;
    }
    out
};

impl Algo {
    /// Every algorithm, in the order `--help` lists them: the families' lists (dense,
    /// sparse, compressed, embedding), each one line per descriptor beside its module.
    pub const ALL: &'static [Algo] = &ALL_ARRAY;
}

/// The reducer for `--algo name`; an unknown name is an error listing the known ones.
pub fn make_reducer(name: &str, params: &Params) -> Result<Box<dyn Reducer>> {
    let algo: Algo = name.parse()?;
    reducer_for(algo, params)
}

/// The reducer for `algo`. The 1-bit reducers start with zero error buffers: a caller
/// restores saved ones with [`Reducer::load_state`].
pub fn reducer_for(algo: Algo, params: &Params) -> Result<Box<dyn Reducer>> {
    let d: &Descriptor = algo.descriptor();
    (d.make)(params)
}
