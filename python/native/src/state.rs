//! A reducer's or optimiser's state (named f32 tensors, `Reducer::state`) to and from Python:
//! each tensor as bytes out (numpy reads them with `np.frombuffer`), any float32 buffer in.

use anyhow::anyhow;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::value_error;
use gradkit_comm::elem_bytes;

/// Named tensors as (name, bytes) pairs: one copy each.
pub(crate) fn to_py<'py>(
    py: Python<'py>,
    state: Vec<(String, Vec<f32>)>,
) -> Vec<(String, Bound<'py, PyBytes>)> {
    state
        .into_iter()
        .map(|(k, v)| (k, PyBytes::new(py, elem_bytes(&v))))
        .collect()
}

/// (name, float32 buffer) pairs as named tensors; a buffer of another kind is an error naming
/// the tensor.
pub(crate) fn from_py(
    py: Python<'_>,
    state: &[(String, Bound<'_, PyAny>)],
) -> PyResult<Vec<(String, Vec<f32>)>> {
    state
        .iter()
        .map(|(name, v)| {
            let buf =
                PyBuffer::<f32>::get(v).map_err(|e| value_error(anyhow!("state `{name}`: {e}")))?;
            Ok((name.clone(), buf.to_vec(py)?))
        })
        .collect()
}
