//! A rank of a world for the Python module: gradkit's MPI backend, or a transport written in
//! Python ([`TransportComm`]: torch.distributed's process group in `gradkit.torch`).
//!
//! The communicator lives behind a lock ([`Shared`]): Python may call from several threads
//! (DDP runs its communication hooks on autograd's threads), one at a time. Every call
//! releases the interpreter while it runs; a Python transport takes it back for each of its
//! calls.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use gradkit_comm::{
    check_exchange, elem_bytes, elem_bytes_mut, Backend, Buf, Comm, CommError, CommResult, Elem,
    Kind, Traffic,
};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyList};

use crate::{run_error, value_error};

/// A communicator that one thread at a time may use.
pub(crate) struct Held(Box<dyn Comm>);

// SAFETY: a `Held` is only reached through `Shared`'s mutex, so one thread at a time uses the
// communicator. The MPI backend's is initialised with MPI_THREAD_SERIALIZED
// (`gradkit_comm::mpi::init_library`), which allows calls from any thread one at a time; a
// `TransportComm` holds Python objects (`Py<…>` is Send) and plain counters.
unsafe impl Send for Held {}

/// The communicator of a world, shared by the objects that use it (reducers, metrics).
pub(crate) type Shared = Arc<Mutex<Held>>;

/// Runs `f` on the communicator with the interpreter released (a Python transport takes it
/// back for its own calls).
pub(crate) fn with_comm<R: Send>(
    py: Python<'_>,
    shared: &Shared,
    f: impl FnOnce(&dyn Comm) -> R + Send,
) -> R {
    py.detach(|| {
        let held = shared.lock().unwrap_or_else(|e| e.into_inner());
        f(held.0.as_ref())
    })
}

/// The MPI world of this process, initialised once (a second `Comm.mpi()` shares it).
static MPI_WORLD: OnceLock<(Shared, usize, usize)> = OnceLock::new();

/// A rank of a world: `Comm.mpi()` under mpirun, or `Comm.transport(obj, rank, size)` on a
/// Python transport (an object with `exchange(tag, sends, srcs)`, `barrier()` and
/// `allreduce(data, dtype)`; `gradkit.torch.ProcessGroupTransport` is one).
#[pyclass(frozen, name = "Comm", module = "gradkit._native")]
pub struct PyComm {
    pub(crate) shared: Shared,
    #[pyo3(get)]
    pub(crate) rank: usize,
    #[pyo3(get)]
    pub(crate) size: usize,
    #[pyo3(get)]
    backend: &'static str,
}

impl PyComm {
    fn new(comm: Box<dyn Comm>) -> PyComm {
        let (rank, size, backend) = (comm.rank(), comm.size(), comm.backend().name());
        PyComm {
            shared: Arc::new(Mutex::new(Held(comm))),
            rank,
            size,
            backend,
        }
    }
}

#[pymethods]
impl PyComm {
    /// This process's rank of the MPI job that `mpirun` started (MPI initialised here, once).
    #[staticmethod]
    fn mpi() -> PyResult<PyComm> {
        if let Some((shared, rank, size)) = MPI_WORLD.get() {
            return Ok(PyComm {
                shared: shared.clone(),
                rank: *rank,
                size: *size,
                backend: Backend::MPI.name(),
            });
        }
        let comm = gradkit_comm::mpi::init_library().map_err(value_error)?;
        let c = PyComm::new(Box::new(comm));
        let _ = MPI_WORLD.set((c.shared.clone(), c.rank, c.size));
        Ok(c)
    }

    /// A rank of a world whose messages a Python object carries (see the class docs);
    /// `name` is the backend's name in the metrics and errors.
    #[staticmethod]
    fn transport(obj: Py<PyAny>, rank: usize, size: usize, name: String) -> PyResult<PyComm> {
        if rank >= size {
            return Err(value_error(anyhow::anyhow!(
                "rank {rank} is outside a world of {size} ranks"
            )));
        }
        let name: &'static str = Box::leak(name.into_boxed_str());
        Ok(PyComm::new(Box::new(TransportComm {
            obj,
            rank,
            size,
            backend: Backend::new(name),
            traffic: Traffic::default(),
        })))
    }

    /// This rank's traffic so far, per phase: {phase: (bytes_sent, bytes_recv, messages_sent,
    /// messages_recv, seconds)}.
    fn traffic(&self, py: Python<'_>) -> BTreeMap<String, (u64, u64, u64, u64, f64)> {
        with_comm(py, &self.shared, |c| c.traffic().snapshot())
            .into_iter()
            .map(|(k, v)| {
                let t = (
                    v.bytes_sent,
                    v.bytes_recv,
                    v.msgs_sent,
                    v.msgs_recv,
                    v.seconds,
                );
                (k, t)
            })
            .collect()
    }

    /// Waits for every rank.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        with_comm(py, &self.shared, |c| c.barrier()).map_err(|e| run_error(e.into()))
    }

    /// gradkit_comm's conformance suite on this rank (a collective: every rank calls it);
    /// the names of the checks passed.
    #[pyo3(signature = (large_elems = 1 << 16))]
    fn conformance(&self, py: Python<'_>, large_elems: usize) -> PyResult<Vec<&'static str>> {
        let opts = gradkit_comm::conformance::Options { large_elems };
        with_comm(py, &self.shared, |c| {
            gradkit_comm::conformance::run(c, &opts)
        })
        .map(|r| r.checks)
        .map_err(run_error)
    }

    fn __repr__(&self) -> String {
        format!(
            "Comm(backend={:?}, rank={}, size={})",
            self.backend, self.rank, self.size
        )
    }
}

/// A [`Comm`] whose messages a Python object carries (see [`PyComm`]): messages to oneself
/// stay here; the others go to `obj.exchange(tag, [(dst, bytes)], [src])`, which returns the
/// received messages' bytes in the order of the sources. Messages carry no kind (as MPI's):
/// the receiver reads the bytes as the kind it expects.
struct TransportComm {
    obj: Py<PyAny>,
    rank: usize,
    size: usize,
    backend: Backend,
    traffic: Traffic,
}

impl TransportComm {
    fn failed(&self, e: PyErr) -> CommError {
        CommError::Transport {
            backend: self.backend.name(),
            message: e.to_string(),
        }
    }

    /// Calls the transport with the interpreter taken back.
    fn call<R>(
        &self,
        f: impl for<'py> FnOnce(Python<'py>, &Bound<'py, PyAny>) -> PyResult<R>,
    ) -> CommResult<R> {
        Python::attach(|py| f(py, self.obj.bind(py))).map_err(|e| self.failed(e))
    }
}

impl Comm for TransportComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn backend(&self) -> Backend {
        self.backend
    }
    fn exchange_raw(
        &self,
        tag: u32,
        sends: Vec<(usize, Buf)>,
        recvs: &[(usize, Kind)],
    ) -> CommResult<Vec<Buf>> {
        check_exchange(self.backend, self.size, &sends, recvs)?;
        let me = self.rank;
        let mut to_self = VecDeque::new();
        let mut remote = Vec::new();
        for (d, b) in sends {
            match d == me {
                true => to_self.push_back(b),
                false => remote.push((d, b)),
            }
        }
        let srcs: Vec<usize> = recvs.iter().map(|r| r.0).filter(|s| *s != me).collect();
        let got: Vec<Buf> = self.call(|py, obj| {
            let sends = PyList::empty(py);
            for (d, b) in remote {
                // No copy: the message's bytes, lent read-only (`torch.frombuffer` reads them).
                sends.append((d, Py::new(py, Message { buf: b })?))?;
            }
            let got = obj.call_method1("exchange", (tag, sends, srcs.clone()))?;
            let got: Vec<Bound<'_, PyAny>> = got.extract()?;
            if got.len() != srcs.len() {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "exchange returned {} messages for {} sources",
                    got.len(),
                    srcs.len()
                )));
            }
            let kinds = recvs.iter().filter(|r| r.0 != me).map(|r| r.1);
            got.iter()
                .zip(kinds)
                .zip(&srcs)
                .map(|((m, k), s)| {
                    buf_from(k, m).map_err(|e| {
                        pyo3::exceptions::PyValueError::new_err(format!(
                            "message from rank {s}: {e}"
                        ))
                    })
                })
                .collect()
        })?;
        let mut got = got.into_iter();
        let mut out = Vec::with_capacity(recvs.len());
        for &(s, k) in recvs {
            let b = match s == me {
                true => to_self.pop_front().ok_or_else(|| CommError::Transport {
                    backend: self.backend.name(),
                    message: "a receive from this rank with no send to it".into(),
                })?,
                false => got.next().ok_or_else(|| CommError::Transport {
                    backend: self.backend.name(),
                    message: "a receive with no message".into(),
                })?,
            };
            if b.kind() != k {
                return Err(CommError::KindMismatch {
                    from: Some(s),
                    expected: k,
                    got: b.kind(),
                });
            }
            out.push(b);
        }
        Ok(out)
    }
    fn barrier(&self) -> CommResult<()> {
        self.call(|_, obj| obj.call_method0("barrier").map(drop))
    }
    fn allreduce_native_f32(&self, data: &mut [f32]) -> CommResult<()> {
        self.traffic.add_opaque(data.len() * 4);
        self.allreduce_in_place(data, "f32")
    }
    fn allreduce_native_f64(&self, data: &mut [f64]) -> CommResult<()> {
        self.traffic.add_opaque(data.len() * 8);
        self.allreduce_in_place(data, "f64")
    }
    fn traffic(&self) -> &Traffic {
        &self.traffic
    }
}

impl TransportComm {
    /// `obj.allreduce(data, dtype)`: the sum over the ranks, written into `data` (a bytearray
    /// the transport reduces in place).
    fn allreduce_in_place<T: Elem>(&self, data: &mut [T], dtype: &str) -> CommResult<()> {
        if self.size == 1 || data.is_empty() {
            return Ok(());
        }
        self.call(|py, obj| {
            let ba = PyByteArray::new(py, elem_bytes(data));
            obj.call_method1("allreduce", (&ba, dtype))?;
            // SAFETY: no Python code runs while the slice is borrowed (copied out at once), and
            // the bytearray keeps its length (the transport reduces it in place).
            let reduced = unsafe { ba.as_bytes() };
            if reduced.len() != std::mem::size_of_val(data) {
                return Err(pyo3::exceptions::PyValueError::new_err(
                    "allreduce changed the buffer's length",
                ));
            }
            elem_bytes_mut(data).copy_from_slice(reduced);
            Ok(())
        })
    }
}

/// A message handed to the transport's `exchange`: it owns the bytes gradkit sends and lends
/// them read-only through the buffer protocol (`torch.frombuffer`, `memoryview`, `np.frombuffer`
/// read them in place, no copy); `len()` is its size in bytes.
#[pyclass(frozen, name = "Message", module = "gradkit._native")]
struct Message {
    buf: Buf,
}

#[pymethods]
impl Message {
    /// # Safety
    /// Called by Python with a `view` to fill. The bytes stay valid while the view lives: it
    /// holds a reference to this object (`PyBuffer_FillInfo` sets `view.obj`), which owns
    /// them and never changes them.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        let bytes = slf.get().buf.host_bytes().unwrap_or_default();
        // Read-only: a request for a writable view is refused (BufferError).
        let rc = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                bytes.as_ptr() as *mut std::os::raw::c_void,
                bytes.len() as pyo3::ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.buf.bytes()
    }
}

/// A buffer of kind `k` read from a Python buffer of bytes (a numpy uint8 array, bytes): one
/// copy ([`Buf::from_host_bytes`]).
fn buf_from(k: Kind, obj: &Bound<'_, PyAny>) -> PyResult<Buf> {
    let pb = PyBuffer::<u8>::get(obj)?;
    if !pb.is_c_contiguous() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "a received message is not a contiguous buffer",
        ));
    }
    // SAFETY: `pb` is a contiguous buffer of `item_count` bytes (checked), exported while `pb`
    // lives; nothing runs Python (or writes it) while the slice is read.
    let bytes = unsafe { std::slice::from_raw_parts(pb.buf_ptr() as *const u8, pb.item_count()) };
    Buf::from_host_bytes(k, bytes)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}
