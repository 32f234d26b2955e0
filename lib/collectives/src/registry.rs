//! The `--algo` names and the parameters every algorithm may read.

use anyhow::Result;

use crate::{Algo, Reducer};

/// Ok-Topk's threshold-reuse policy (`--adjust`), from the one implementation in
/// `gradkit_sparsify::oktopk`.
pub use crate::params::{Adjust, Balance, Bands, Params, ReevalStepD, Split};

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
        Algo::OneBit | Algo::OneBitNaive => {
            let variant = match algo {
                Algo::OneBit => Variant::Server,
                _ => Variant::Naive,
            };
            Box::new(
                OneBitReducer::new(variant)
                    .with_kernels(params.kernels)
                    .with_resident(params.resident),
            )
        }
        Algo::AllToAll => Box::new(crate::alltoall::AllToAllReducer::new(
            params.split,
            params.op,
        )),
    })
}
