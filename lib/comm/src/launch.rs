//! Launch: MPI when the process was started by `mpirun`/`mpiexec` (seen in the launcher's
//! environment), otherwise N in-process ranks (`--ranks N`, default 1).

use anyhow::{bail, Result};

use crate::local::run_local;
use crate::mpi::MpiComm;
use crate::Comm;

/// Environment variables that MPI launchers set in every rank (Open MPI, PMIx, MPICH/Hydra,
/// Intel MPI, Slurm's PMI).
const LAUNCHER_VARS: &[&str] = &[
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",
    "PMI_SIZE",
    "PMI_RANK",
    "MPI_LOCALNRANKS",
];

/// Whether this process was started by an MPI launcher.
pub fn under_mpi_launcher() -> bool {
    LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some())
}

enum Backend {
    Local(usize),
    Mpi {
        _universe: mpi::environment::Universe,
        comm: MpiComm,
    },
}

/// The set of ranks a tool runs on.
pub struct World {
    backend: Backend,
}

impl World {
    /// MPI under a launcher (then `ranks`, when given, must equal the MPI size), otherwise
    /// `ranks` (default 1) in-process ranks.
    pub fn init(ranks: Option<usize>) -> Result<World> {
        if under_mpi_launcher() {
            let Some(universe) = mpi::initialize() else {
                bail!("MPI was already initialised in this process");
            };
            let comm = MpiComm::new(universe.world());
            if let Some(r) = ranks {
                if r != comm.size() {
                    bail!(
                        "--ranks {r} disagrees with the {} ranks mpirun started (flag --ranks; drop it under mpirun)",
                        comm.size()
                    );
                }
            }
            return Ok(World {
                backend: Backend::Mpi {
                    _universe: universe,
                    comm,
                },
            });
        }
        let p = ranks.unwrap_or(1);
        if p == 0 {
            bail!("--ranks must be at least 1 (flag --ranks)");
        }
        Ok(World {
            backend: Backend::Local(p),
        })
    }
    /// A Local world of `p` ranks (tests, benchmarks).
    pub fn local(p: usize) -> World {
        World {
            backend: Backend::Local(p),
        }
    }
    pub fn size(&self) -> usize {
        match &self.backend {
            Backend::Local(p) => *p,
            Backend::Mpi { comm, .. } => comm.size(),
        }
    }
    /// Whether this process does the file I/O: always for Local, rank 0 under MPI.
    pub fn is_io_rank(&self) -> bool {
        match &self.backend {
            Backend::Local(_) => true,
            Backend::Mpi { comm, .. } => comm.rank() == 0,
        }
    }
    pub fn backend(&self) -> &'static str {
        match &self.backend {
            Backend::Local(_) => "local",
            Backend::Mpi { .. } => "mpi",
        }
    }
    /// Runs `f` on every rank. Local: all ranks' results in rank order. MPI: this process's
    /// result only; an error on any rank ends the whole job (MPI_Abort) so none hangs.
    pub fn run<R, F>(&self, f: F) -> Result<Vec<R>>
    where
        R: Send,
        F: Fn(&dyn Comm) -> Result<R> + Sync,
    {
        match &self.backend {
            Backend::Local(p) => run_local(*p, f),
            Backend::Mpi { comm, .. } => {
                comm.traffic().reset();
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(comm)));
                match r {
                    Ok(Ok(v)) => Ok(vec![v]),
                    Ok(Err(e)) => {
                        eprintln!("error: rank {}: {e:#}", comm.rank());
                        comm.abort(1)
                    }
                    Err(_) => comm.abort(1),
                }
            }
        }
    }
    /// Agreement on a check made by the I/O rank: under MPI rank 0 tells the others whether
    /// to go on; on failure the others exit quietly with status 1 and rank 0 reports.
    pub fn agree(&self, ok: Result<()>) -> Result<()> {
        match &self.backend {
            Backend::Local(_) => ok,
            Backend::Mpi { comm, .. } => {
                use crate::CommExt;
                let _io = comm.phase(crate::dist::IO_PHASE);
                let flag = comm.broadcast(0, (comm.rank() == 0).then(|| vec![ok.is_ok() as u8]));
                match (ok, flag[0]) {
                    (Err(e), _) => Err(e),
                    (Ok(()), 1) => Ok(()),
                    (Ok(()), _) => Err(anyhow::Error::new(crate::dist::Silent)),
                }
            }
        }
    }
}
