//! Launch: MPI when the process was started by `mpirun`/`mpiexec` (seen in the launcher's
//! environment), otherwise N in-process ranks (`--ranks N`, default 1).
//!
//! Errors across ranks (docs/RELIABILITY.md). A tool's work has two kinds of places where a
//! rank can fail:
//! - **agreement points** ([`World::init`], [`World::agree`]): every rank brings the outcome of
//!   its own checks; all learn whether every rank succeeded. On failure the lowest failing rank
//!   prints its message (with its rank number when it is not rank 0), every rank waits until
//!   that line is written, and every rank exits 1 — one message, always, before any rank exits.
//! - **inside the collectives** ([`World::run`]): a rank that fails there may leave others
//!   waiting for its messages, so it prints its message and ends the job with `MPI_Abort`.
//!
//! Any other error that reaches `gradkit_core::cli::run` under MPI is treated like the second
//! kind. A receive that waits longer than `GRADKIT_COMM_TIMEOUT` seconds (default 1800; 0 =
//! never) reports which rank it waited for and ends the job, so no rank waits forever.

use anyhow::{bail, Result};
use gradkit_core::cli::{self, Launcher, Silent};

use crate::local::run_local;
use crate::mpi::MpiComm;
use crate::{Comm, CommExt};

pub use gradkit_core::cli::under_mpi_launcher;

enum Backend {
    Local(usize),
    Mpi(MpiComm),
}

/// The set of ranks a tool runs on.
pub struct World {
    backend: Backend,
}

impl World {
    /// MPI under a launcher (then `ranks`, when given, must equal the MPI size), otherwise
    /// `ranks` (default 1) in-process ranks. Under MPI this is an agreement point: a bad
    /// `--ranks` is reported once, by rank 0.
    pub fn init(ranks: Option<usize>) -> Result<World> {
        if under_mpi_launcher() {
            let Some(universe) = mpi::initialize() else {
                bail!("MPI was already initialised in this process");
            };
            let comm = MpiComm::new(universe.world());
            // MPI_Finalize is called by `cli::run` on the paths every rank takes, never by a
            // drop on an error path (a rank in MPI_Finalize waits for all the others).
            std::mem::forget(universe);
            cli::register_launcher(Launcher {
                size: comm.size(),
                finalize: crate::mpi::finalize,
                abort: crate::mpi::abort_world,
            });
            let size = comm.size();
            let world = World {
                backend: Backend::Mpi(comm),
            };
            let check = match ranks {
                Some(r) if r != size => Err(anyhow::anyhow!(
                    "--ranks {r} disagrees with the {size} ranks mpirun started (flag --ranks; drop it under mpirun)"
                )),
                _ => Ok(()),
            };
            world.agree(check)?;
            return Ok(world);
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
            Backend::Mpi(comm) => comm.size(),
        }
    }
    /// Whether this process does the file I/O: always for Local, rank 0 under MPI.
    pub fn is_io_rank(&self) -> bool {
        match &self.backend {
            Backend::Local(_) => true,
            Backend::Mpi(comm) => comm.rank() == 0,
        }
    }
    pub fn backend(&self) -> &'static str {
        match &self.backend {
            Backend::Local(_) => "local",
            Backend::Mpi(_) => "mpi",
        }
    }
    /// Runs `f` on every rank. Local: all ranks' results in rank order (the first error, if
    /// any). MPI: this process's result only; an error or a panic on any rank is reported by
    /// that rank and ends the whole job (`MPI_Abort`), so no rank waits for it forever.
    pub fn run<R, F>(&self, f: F) -> Result<Vec<R>>
    where
        R: Send,
        F: Fn(&dyn Comm) -> Result<R> + Sync,
    {
        match &self.backend {
            Backend::Local(p) => run_local(*p, f),
            Backend::Mpi(comm) => {
                comm.traffic().reset();
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    injected_fault(comm.rank())?;
                    f(comm)
                }));
                match r {
                    Ok(Ok(v)) => Ok(vec![v]),
                    Ok(Err(e)) if comm.size() == 1 => Err(e),
                    Ok(Err(e)) => {
                        cli::report(&e.context(format!("rank {}", comm.rank())));
                        comm.abort(1)
                    }
                    Err(_) => {
                        cli::report_line(&format!(
                            "error: rank {}: internal error (a bug in gradkit; please report it): {}",
                            comm.rank(),
                            cli::last_panic().unwrap_or_else(|| "a panic".into())
                        ));
                        comm.abort(1)
                    }
                }
            }
        }
    }

    /// An agreement point: every rank brings the outcome of its own checks (ranks with nothing
    /// to check pass `Ok`), and all learn whether every rank succeeded. In-process ranks share
    /// one outcome, returned as it is. Under MPI, on failure the lowest failing rank prints its
    /// message once (`error: rank R: …` when R is not 0), every rank waits until it is written,
    /// and every rank gets [`Silent`] (exit 1, nothing more printed).
    pub fn agree<T>(&self, ok: Result<T>) -> Result<T> {
        let comm = match &self.backend {
            Backend::Mpi(comm) if comm.size() > 1 => comm,
            _ => return ok,
        };
        let _io = comm.phase(crate::dist::IO_PHASE);
        // 0: fine; otherwise the exit status this rank's error asks for.
        let mine = ok.as_ref().err().map_or(0, cli::exit_code);
        let flags = comm.allgatherv(vec![mine]);
        let Some(reporter) = flags.iter().position(|f| f[0] != 0) else {
            return ok;
        };
        let code = flags[reporter][0];
        if reporter == comm.rank() {
            if let Err(e) = &ok {
                if reporter == 0 {
                    cli::report(e);
                } else {
                    cli::report_line(&format!("error: rank {reporter}: {e:#}"));
                }
            }
        }
        // Nobody exits before the reporter's line is out.
        comm.barrier();
        Err(anyhow::Error::new(Silent { code }))
    }
}

/// Fault injection for the reliability tests (docs/RELIABILITY.md): `GRADKIT_FAULT_RANK=R`
/// makes rank R fail as its collectives start, while the other ranks wait for its messages;
/// `GRADKIT_STALL_RANK=R` makes rank R hang there instead (a stuck node), which the receive
/// watchdog (`GRADKIT_COMM_TIMEOUT`) must end.
fn injected_fault(rank: usize) -> Result<()> {
    let is_me =
        |var: &str| std::env::var(var).is_ok_and(|r| r.trim().parse::<usize>().ok() == Some(rank));
    if is_me("GRADKIT_STALL_RANK") {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    if is_me("GRADKIT_FAULT_RANK") {
        bail!("injected fault (GRADKIT_FAULT_RANK={rank})");
    }
    Ok(())
}

/// Parses the command line like `P::parse()`, with one difference under mpirun: a usage
/// error (or `--help`) is printed by rank 0 only, and every rank waits until it is out before
/// exiting with clap's status — one message, not one per rank.
pub fn parse_args<P: clap::Parser>() -> P {
    parse_matches::<P>().0
}

/// [`parse_args`] that also returns the matches (to tell given flags from defaults).
pub fn parse_matches<P: clap::Parser>() -> (P, clap::ArgMatches) {
    let matches = match P::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => exit_with(e),
    };
    match P::from_arg_matches(&matches) {
        Ok(p) => (p, matches),
        Err(e) => exit_with(e.format(&mut P::command())),
    }
}

/// A usage error found after parsing (a flag that does not apply, a value out of range),
/// printed as clap prints its own (`error: …`, then the usage line), exit 2 — by rank 0 only
/// under mpirun.
pub fn usage_error<C: clap::CommandFactory>(msg: impl std::fmt::Display) -> ! {
    exit_with(cli::usage_clap_error::<C>(msg))
}

/// Prints a clap error (or help) and exits with its status; under mpirun rank 0 prints and
/// the others wait for it, so exactly one copy appears and none is lost.
fn exit_with(e: clap::Error) -> ! {
    let code = e.exit_code();
    if under_mpi_launcher() {
        if let Some(universe) = mpi::initialize() {
            use mpi::collective::CommunicatorCollectives;
            use mpi::topology::Communicator;
            let world = universe.world();
            if world.rank() == 0 {
                let _ = e.print();
            }
            world.barrier();
            drop(universe);
            std::process::exit(code)
        }
    }
    e.exit()
}
