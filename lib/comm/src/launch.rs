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

use std::ops::Range;
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use gradkit_core::cli::{self, Launcher, Silent};

use crate::local::run_local;
use crate::mpi::MpiComm;
use crate::{Backend, Comm, CommExt};

pub use gradkit_core::cli::under_mpi_launcher;

/// How a backend starts its ranks: the other half of a backend, next to its [`Comm`]. To add
/// a backend, give it a [`Backend`] value, implement [`Comm`] for its communicator and
/// `Launch` for its world, hand a `Box<dyn Launch>` to [`World::from_launch`], and run
/// [`crate::conformance`] on it.
pub trait Launch {
    fn backend(&self) -> Backend;
    /// The number of ranks in the world.
    fn size(&self) -> usize;
    /// The ranks that run in this process: all of them for an in-process backend, this
    /// process's own rank for one rank per process.
    fn ranks_here(&self) -> Range<usize>;
    /// Runs `f` once on every rank of this process and returns when all have, with the first
    /// error. A backend whose ranks live in separate processes ends the whole job when `f`
    /// fails or panics on one of them (its peers may be waiting for it), after printing
    /// `error: rank R: …` once.
    fn run(&self, f: &(dyn Fn(&dyn Comm) -> Result<()> + Sync)) -> Result<()>;
    /// The communicator [`World::agree`] uses when ranks live in separate processes; `None`
    /// when every rank of the world shares this process's outcome.
    fn agreement(&self) -> Option<&dyn Comm> {
        None
    }
}

/// P ranks as threads of this process.
struct LocalLaunch(usize);

impl Launch for LocalLaunch {
    fn backend(&self) -> Backend {
        Backend::LOCAL
    }
    fn size(&self) -> usize {
        self.0
    }
    fn ranks_here(&self) -> Range<usize> {
        0..self.0
    }
    fn run(&self, f: &(dyn Fn(&dyn Comm) -> Result<()> + Sync)) -> Result<()> {
        run_local(self.0, f).map(drop)
    }
}

/// This process's rank of an MPI job.
struct MpiLaunch(MpiComm);

impl Launch for MpiLaunch {
    fn backend(&self) -> Backend {
        Backend::MPI
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn ranks_here(&self) -> Range<usize> {
        let r = self.0.rank();
        r..r + 1
    }
    fn run(&self, f: &(dyn Fn(&dyn Comm) -> Result<()> + Sync)) -> Result<()> {
        let comm = &self.0;
        comm.traffic().reset();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            injected_fault(comm.rank())?;
            f(comm)
        }));
        match r {
            Ok(Ok(())) => Ok(()),
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
    fn agreement(&self) -> Option<&dyn Comm> {
        (self.0.size() > 1).then_some(&self.0 as &dyn Comm)
    }
}

/// The most in-process ranks (`--ranks N` without mpirun). Each is a thread of this process
/// and every step of a collective waits for all of them, so a call costs O(P) rounds of
/// thread hand-offs and the ring O(P²) messages: one 1 KiB `bench` row of the ring (12
/// calls) took 38 s at 2,000 ranks and 19 s at 1,024 on a busy 2-core machine — the most a
/// run that prints nothing meanwhile should take. More ranks run under mpirun, which has no
/// such limit here.
pub const MAX_LOCAL_RANKS: usize = 1024;

/// `--ranks` checked on the command line alone, before any rank starts (a usage error): at
/// least 1, and at most [`MAX_LOCAL_RANKS`] in-process ranks. Under mpirun it must equal the job's size,
/// which [`World::init`] checks.
pub fn check_ranks_flag(ranks: Option<usize>) -> Result<()> {
    match ranks {
        Some(0) => bail!("--ranks must be at least 1 (flag --ranks)"),
        Some(r) if r > MAX_LOCAL_RANKS && !under_mpi_launcher() => bail!(
            "--ranks {r} is more than the {MAX_LOCAL_RANKS} ranks a process can run (in-process ranks are threads, and each collective step waits for all of them); run more ranks under mpirun -np (flag --ranks)"
        ),
        _ => Ok(()),
    }
}

/// The set of ranks a tool runs on, on one backend ([`Launch`]).
pub struct World {
    launch: Box<dyn Launch>,
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
            let world = World::from_launch(Box::new(MpiLaunch(comm)));
            let check = match ranks {
                Some(r) if r != size => Err(anyhow::anyhow!(
                    "--ranks {r} disagrees with the {size} ranks mpirun started (flag --ranks; drop it under mpirun)"
                )),
                _ => Ok(()),
            };
            world.agree(check)?;
            return Ok(world);
        }
        // The tools check it with their flags (a usage error); this is for other callers.
        check_ranks_flag(ranks)?;
        let p = ranks.unwrap_or(1);
        Ok(World::local(p))
    }
    /// A Local world of `p` ranks (tests, benchmarks).
    pub fn local(p: usize) -> World {
        World::from_launch(Box::new(LocalLaunch(p)))
    }
    /// A world on any backend.
    pub fn from_launch(launch: Box<dyn Launch>) -> World {
        World { launch }
    }
    pub fn size(&self) -> usize {
        self.launch.size()
    }
    /// The ranks that run in this process (all of them in-process; one under MPI).
    pub fn ranks_here(&self) -> Range<usize> {
        self.launch.ranks_here()
    }
    /// Whether this process does the file I/O: the one that runs rank 0 (always, in-process).
    pub fn is_io_rank(&self) -> bool {
        self.launch.ranks_here().contains(&0)
    }
    /// The backend: ask it capabilities ([`Backend::in_process`]…); its name is for metadata.
    pub fn backend(&self) -> Backend {
        self.launch.backend()
    }
    /// Runs `f` on every rank. In-process: all ranks' results in rank order (the first error,
    /// if any). MPI: this process's result only; an error or a panic on any rank is reported
    /// by that rank and ends the whole job (`MPI_Abort`), so no rank waits for it forever.
    pub fn run<R, F>(&self, f: F) -> Result<Vec<R>>
    where
        R: Send,
        F: Fn(&dyn Comm) -> Result<R> + Sync,
    {
        let here = self.launch.ranks_here();
        let slots: Vec<Mutex<Option<R>>> = here.clone().map(|_| Mutex::new(None)).collect();
        self.launch.run(&|comm: &dyn Comm| {
            let v = f(comm)?;
            let slot = comm
                .rank()
                .checked_sub(here.start)
                .and_then(|i| slots.get(i))
                .context("a rank ran outside this process's ranks (backend bug)")?;
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
            Ok(())
        })?;
        slots
            .into_iter()
            .map(|m| {
                m.into_inner()
                    .unwrap_or_else(|e| e.into_inner())
                    .context("a rank returned no result (backend bug)")
            })
            .collect()
    }

    /// An agreement point: every rank brings the outcome of its own checks (ranks with nothing
    /// to check pass `Ok`), and all learn whether every rank succeeded. In-process ranks share
    /// one outcome, returned as it is. Under MPI, on failure the lowest failing rank prints its
    /// message once (`error: rank R: …` when R is not 0), every rank waits until it is written,
    /// and every rank gets [`Silent`] (exit 1, nothing more printed).
    pub fn agree<T>(&self, ok: Result<T>) -> Result<T> {
        let Some(comm) = self.launch.agreement() else {
            return ok;
        };
        let _io = comm.phase(crate::dist::IO_PHASE);
        // 0: fine; otherwise the exit status this rank's error asks for.
        let mine = ok.as_ref().err().map_or(0, cli::exit_code);
        let flags = comm.allgatherv(vec![mine])?;
        let Some(reporter) = flags.iter().position(|f| f.first() != Some(&0)) else {
            return ok;
        };
        let code = flags[reporter].first().copied().unwrap_or(1);
        if reporter == comm.rank() {
            if let Err(e) = &ok {
                if reporter == 0 {
                    cli::report(e);
                } else {
                    cli::report_line(&format!("error: rank {reporter}: {}", cli::chain_text(e)));
                }
            }
        }
        // Nobody exits before the reporter's line is out.
        comm.barrier()?;
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

/// Parses the command line like `P::parse()`, then checks the environment variables
/// ([`gradkit_core::env::check`]), with one difference under mpirun: a usage error (or
/// `--help`, or a bad variable) is printed by rank 0 only, and every rank waits until it is
/// out before exiting with clap's status — one message, not one per rank.
pub fn parse_args<P: clap::Parser>() -> P {
    parse_matches::<P>().0
}

/// [`parse_args`] that also returns the matches (to tell given flags from defaults).
pub fn parse_matches<P: clap::Parser>() -> (P, clap::ArgMatches) {
    let matches = match P::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => exit_with(e),
    };
    let p = match P::from_arg_matches(&matches) {
        Ok(p) => p,
        Err(e) => exit_with(e.format(&mut P::command())),
    };
    // The environment is checked like the flags, once per job.
    if let Err(e) = gradkit_core::env::check() {
        exit_with(cli::env_clap_error(&e));
    }
    (p, matches)
}

/// A usage error found after parsing (a flag that does not apply, a value out of range),
/// printed as clap prints its own (`error: …`, then the usage line), exit 2 — by rank 0 only
/// under mpirun.
pub fn usage_error<C: clap::CommandFactory>(msg: impl std::fmt::Display) -> ! {
    exit_with(cli::usage_clap_error::<C>(msg))
}

/// [`usage_error`] of subcommand `sub` of `C`: the usage line printed is the subcommand's
/// (`gradallreduce bench …`), as clap prints for its own errors there.
pub fn subcommand_usage_error<C: clap::CommandFactory>(
    sub: &str,
    msg: impl std::fmt::Display,
) -> ! {
    exit_with(cli::subcommand_usage_clap_error::<C>(sub, msg))
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
