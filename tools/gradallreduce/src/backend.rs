//! `--backend mpi|nccl`: which `Comm` carries the reducer's messages (docs/GPU.md §4). `mpi`
//! (the default) is the host backend: MPI under mpirun, in-process threads otherwise. `nccl`
//! runs the reducer over gradkit-cuda's NCCL backend, opened over the host one (rank 0's
//! unique id broadcast over it, each rank on the GPU of its local rank); the trace's feed
//! and the `--state` file stay on the host backend. A build without the `cuda` feature, or a
//! machine without a GPU or NCCL, is refused with one line before anything is read.

use anyhow::Result;
use gradkit_comm::Comm;

/// The values of `--backend`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CommBackend {
    #[default]
    Mpi,
    Nccl,
}

impl CommBackend {
    pub const VALUES: &'static str = "mpi, nccl";
}

/// `--backend`'s parser: a typo is a usage error (exit 2) listing the values.
pub fn parse(s: &str) -> std::result::Result<CommBackend, String> {
    match s {
        "mpi" => Ok(CommBackend::Mpi),
        "nccl" => Ok(CommBackend::Nccl),
        _ => Err(format!(
            "unknown backend `{s}`: the values are {}",
            CommBackend::VALUES
        )),
    }
}

impl std::fmt::Display for CommBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CommBackend::Mpi => "mpi",
            CommBackend::Nccl => "nccl",
        })
    }
}

/// Whether `b` can be used here (the cuda feature, a GPU, NCCL), before any file is touched.
pub fn check(b: CommBackend) -> Result<()> {
    if b == CommBackend::Nccl {
        let info = gradkit_cuda::probe()?;
        gradkit_cuda::probe_nccl()?;
        anyhow::ensure!(info.count() > 0, gradkit_cuda::DeviceError::NoDevices);
    }
    Ok(())
}

/// The rank's `Comm` for the reducer over `host`: `None` for the host backend itself.
pub fn open(b: CommBackend, host: &dyn Comm) -> Result<Option<Box<dyn Comm>>> {
    match b {
        CommBackend::Mpi => Ok(None),
        CommBackend::Nccl => open_nccl(host),
    }
}

#[cfg(feature = "cuda")]
fn open_nccl(host: &dyn Comm) -> Result<Option<Box<dyn Comm>>> {
    use gradkit_cuda::nccl::{local_rank, NcclComm};
    let gpus = gradkit_cuda::probe()?.count().max(1) as u32;
    Ok(Some(Box::new(NcclComm::over(host, local_rank() % gpus)?)))
}

#[cfg(not(feature = "cuda"))]
fn open_nccl(_host: &dyn Comm) -> Result<Option<Box<dyn Comm>>> {
    Err(gradkit_cuda::DeviceError::NotBuilt.into())
}
