//! The one list of algorithms: each line names the [`Descriptor`] its module declares
//! (name, family, paper, options, formula, constructor). A new algorithm is its module and
//! one line here.

use anyhow::Result;

use crate::algo::{Algo, Descriptor};
use crate::Reducer;

/// Ok-Topk's threshold-reuse policy (`--adjust`), from the one implementation in
/// `gradkit_sparsify::oktopk`.
pub use crate::params::{Adjust, Balance, Bands, Params, ReevalStepD, Split};

/// Every algorithm, in the order `--help` lists them ([`Algo::ALL`]).
pub const ALL: &[Algo] = Algo::ALL;

impl Algo {
    /// Every algorithm, in the order `--help` lists them: one line per descriptor.
    pub const ALL: &'static [Algo] = &[
        Algo(&crate::dense::RING),
        Algo(&crate::dense::RING_FP16),
        Algo(&crate::dense::RABENSEIFNER),
        Algo(&crate::dense::TREE),
        Algo(&crate::dense::NATIVE),
        Algo(&crate::sparse::topka::DESCRIPTOR),
        Algo(&crate::sparse::topkdsa::DESCRIPTOR),
        Algo(&crate::sparse::gtopk::DESCRIPTOR),
        Algo(&crate::sparse::gaussiank::DESCRIPTOR),
        Algo(&crate::sparse::oktopk::DESCRIPTOR),
        Algo(&crate::sparse::deft::DESCRIPTOR),
        Algo(&crate::sparse::cltk::DESCRIPTOR),
        Algo(&crate::sparse::topk_union::DESCRIPTOR),
        Algo(&crate::onebit::ONEBIT),
        Algo(&crate::onebit::ONEBIT_NAIVE),
        Algo(&crate::alltoall::DESCRIPTOR),
    ];
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
