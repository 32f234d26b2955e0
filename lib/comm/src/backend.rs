//! [`Backend`]: what a communication backend is and can do, asked by capability rather than
//! by name. The set is open: a new backend declares its own `Backend` value (a name and its
//! capabilities) and implements [`crate::Comm`] and [`crate::Launch`]; no caller compares
//! names.

use std::fmt;

use crate::Location;

/// A backend's name and capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Backend {
    name: &'static str,
    in_process: bool,
    device_memory: bool,
}

impl Backend {
    /// P ranks as threads of one process ([`crate::local`]).
    pub const LOCAL: Backend = Backend::new("local").with_in_process(true);
    /// One rank per process under `mpirun` ([`crate::mpi`]), host memory only.
    pub const MPI: Backend = Backend::new("mpi");

    /// A backend called `name` (what run metadata records, `gradkit.backend`) whose ranks live
    /// in separate processes and which moves host memory only; set the capabilities it has
    /// with the builder methods.
    pub const fn new(name: &'static str) -> Backend {
        Backend {
            name,
            in_process: false,
            device_memory: false,
        }
    }
    /// Declares that every rank runs in this one process (sharing its memory and files).
    pub const fn with_in_process(mut self, yes: bool) -> Backend {
        self.in_process = yes;
        self
    }
    /// Declares that the backend moves device-located buffers. No backend declares it yet:
    /// the NCCL one (gradkit-cuda) stages host `Buf`s through the GPU and refuses device
    /// buffers as a host-only backend does (docs/GPU.md §7).
    pub const fn with_device_memory(mut self, yes: bool) -> Backend {
        self.device_memory = yes;
        self
    }

    /// The name, for messages and metadata only (never for decisions: ask a capability).
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// Whether all ranks run in this process: they share memory, so a table held by one is
    /// visible to all, and memory checks must count every rank.
    pub fn in_process(&self) -> bool {
        self.in_process
    }
    /// How many ranks this process runs out of a world of `size`.
    pub fn ranks_per_process(&self, size: usize) -> usize {
        if self.in_process {
            size
        } else {
            1
        }
    }
    /// Whether the backend can move a buffer at `location`.
    pub fn moves(&self, location: Location) -> bool {
        match location {
            Location::Host => true,
            Location::Device(_) => self.device_memory,
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}
