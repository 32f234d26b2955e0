//! `--backend mpi|nccl` of gradallreduce (reduce and bench) and gradtrain: which `Comm`
//! carries the collective's messages (docs/GPU.md §4). `mpi` (the default) is the host
//! backend: MPI under mpirun, in-process threads otherwise. `nccl` runs the collective over
//! [`crate::nccl::NcclComm`], opened over the host one (rank 0's unique id broadcast over
//! it, each rank on the GPU of its local rank); whatever else the tool exchanges (a trace's
//! feed, `--state`, checkpoints, metrics) stays on the host backend. A build without the
//! `cuda` feature, or a machine without a GPU or NCCL, is refused with one line
//! ([`check`], before anything is read).

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
        let info = crate::probe()?;
        crate::probe_nccl()?;
        anyhow::ensure!(info.count() > 0, crate::DeviceError::NoDevices);
    }
    Ok(())
}

/// The rank's `Comm` for the collective over `host`: `None` for the host backend itself.
pub fn open(b: CommBackend, host: &dyn Comm) -> Result<Option<Box<dyn Comm>>> {
    match b {
        CommBackend::Mpi => Ok(None),
        CommBackend::Nccl => open_nccl(host),
    }
}

#[cfg(feature = "cuda")]
fn open_nccl(host: &dyn Comm) -> Result<Option<Box<dyn Comm>>> {
    use crate::nccl::{local_rank, NcclComm};
    let gpus = crate::probe()?.count().max(1) as u32;
    Ok(Some(Box::new(NcclComm::over(host, local_rank() % gpus)?)))
}

#[cfg(not(feature = "cuda"))]
fn open_nccl(_host: &dyn Comm) -> Result<Option<Box<dyn Comm>>> {
    Err(crate::DeviceError::NotBuilt.into())
}
