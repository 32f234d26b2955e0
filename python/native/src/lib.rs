//! `gradkit._native`: gradkit's reducers called from a Python training loop, with no second
//! implementation of any algorithm (docs/PYTORCH.md § Train with it).
//!
//! - [`comm::PyComm`]: a rank of a world, on gradkit's MPI backend (under `mpirun`) or on a
//!   transport written in Python (torch.distributed's process group, `gradkit.torch`), which
//!   carries [`gradkit_comm::Comm::exchange_raw`]; both count their traffic as every backend
//!   does and pass [`gradkit_comm::conformance`].
//! - [`reducer::PyReducer`]: one algorithm of [`gradkit_collectives::Algo::ALL`] by its
//!   `--algo` name, its options checked against the descriptor's `reads`, its state kept
//!   across steps; each step runs [`gradkit_collectives::step::reduce_step`], as
//!   `gradallreduce` does, so the result and the `metrics/1` rows are the tool's.
//! - [`optim::PyOnebit`]: 1-bit Adam and 1-bit LAMB of gradkit-train on a model's flat
//!   parameters (`gradkit.torch.OnebitAdam`, `OnebitLamb`).
//! - [`metrics::PyMetrics`]: every rank's metric rows, written by rank 0 as one `metrics/1`
//!   file (with the loop's own rows: loss, accuracy).
//!
//! The Python package (python/gradkit/native.py, torch.py) is the API users call; this module
//! is its engine. Arrays cross as buffers (numpy float32, contiguous): read once into the
//! reducer's input, the result written into the caller's array.

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

mod comm;
mod metrics;
mod optim;
mod reducer;
mod state;

create_exception!(
    _native,
    GradkitError,
    PyRuntimeError,
    "A reduction or a communication failed (a peer that died, a timeout, a transport error)."
);

/// A user mistake (a bad argument): `ValueError` with gradkit's message and its causes.
pub(crate) fn value_error(e: anyhow::Error) -> PyErr {
    PyValueError::new_err(gradkit_core::cli::chain_text(&e))
}

/// A failure while running: [`GradkitError`] with gradkit's message and its causes.
pub(crate) fn run_error(e: anyhow::Error) -> PyErr {
    GradkitError::new_err(gradkit_core::cli::chain_text(&e))
}

/// One algorithm as `algorithms()` gives it: (name, family, paper, description, options it
/// reads, whether this module runs it on dense buckets).
type AlgoInfo = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Vec<&'static str>,
    bool,
);

/// Every algorithm ([`AlgoInfo`]), in `--help` order.
#[pyfunction]
fn algorithms() -> Vec<AlgoInfo> {
    gradkit_collectives::Algo::ALL
        .iter()
        .map(|a| {
            let d = a.descriptor();
            (
                a.name(),
                a.family().name(),
                d.paper,
                d.description,
                reducer::options_read(*a),
                reducer::runs_on_buckets(*a).is_ok(),
            )
        })
        .collect()
}

/// Whether this process was started by mpirun or mpiexec (seen in the launcher's
/// environment), by the tools' own rule.
#[pyfunction]
fn under_mpi_launcher() -> bool {
    gradkit_comm::launch::under_mpi_launcher()
}

/// `MPI_Finalize` when this process initialised MPI through [`comm::PyComm::mpi`] (the
/// package registers it with `atexit`).
#[pyfunction]
fn finalize_mpi(py: Python<'_>) {
    py.detach(gradkit_comm::mpi::finalize_library);
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<comm::PyComm>()?;
    m.add_class::<reducer::PyReducer>()?;
    m.add_class::<metrics::PyMetrics>()?;
    m.add_class::<optim::PyOnebit>()?;
    m.add_function(wrap_pyfunction!(algorithms, m)?)?;
    m.add_function(wrap_pyfunction!(finalize_mpi, m)?)?;
    m.add_function(wrap_pyfunction!(under_mpi_launcher, m)?)?;
    m.add("GradkitError", m.py().get_type::<GradkitError>())?;
    Ok(())
}
