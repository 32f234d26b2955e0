//! What this process is and how it talks to the user before anything else exists: the MPI
//! launcher it was started by (from the environment, before MPI starts), the launch the
//! communication layer registers, and notes on stderr that never fail a run. A leaf module:
//! it uses nothing else of gradkit-core, so both `cli` and `io` can use it.

use std::io::Write;

/// How the process was launched, registered by the communication layer when it starts MPI
/// (gradkit-core knows nothing of MPI; these hooks are how [`run`] ends an MPI job).
#[derive(Clone, Copy, Debug)]
pub struct Launcher {
    /// The job's size (ranks).
    pub size: usize,
    /// Ends MPI on a path every rank takes (success, or an error all ranks agreed on).
    pub finalize: fn(),
    /// Ends the whole job at once (MPI_Abort): the path for an error other ranks do not know of.
    pub abort: fn(i32) -> !,
}

/// Environment variables that MPI launchers set in every rank (Open MPI, PMIx, MPICH/Hydra,
/// Intel MPI, Slurm's PMI).
const LAUNCHER_VARS: &[&str] = &[
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",
    "PMI_SIZE",
    "PMI_RANK",
    "MPI_LOCALNRANKS",
];

/// Whether this process was started by an MPI launcher (`mpirun`, `mpiexec`, `srun`).
pub fn under_mpi_launcher() -> bool {
    LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some())
}

pub(crate) fn launcher_var(names: &[&str]) -> Option<usize> {
    names
        .iter()
        .find_map(|n| std::env::var(n).ok()?.trim().parse::<usize>().ok())
}

/// This process's rank as the MPI launcher's environment gives it (0 without a launcher):
/// known before MPI starts, for the checks only rank 0 (the I/O rank) makes.
pub fn launcher_rank() -> usize {
    launcher_var(&["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"]).unwrap_or(0)
}

static LAUNCHER: std::sync::OnceLock<Launcher> = std::sync::OnceLock::new();

/// Called once by the communication layer after MPI is initialised.
pub fn register_launcher(l: Launcher) {
    let _ = LAUNCHER.set(l);
}

/// The MPI launch this process is part of, if any.
pub fn launcher() -> Option<&'static Launcher> {
    LAUNCHER.get()
}

/// Writes human text (progress, a summary, a note) to stderr, best-effort: a closed, broken
/// or full stderr must never cost a run its output file, so write errors are ignored (where
/// `eprint!` would panic). Use through [`note!`](crate::note) and [`noteln!`](crate::noteln).
pub fn note_fmt(args: std::fmt::Arguments) {
    let text = std::fmt::format(args);
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

/// `eprint!` that never panics: see [`process::note_fmt`](crate::process::note_fmt).
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => { $crate::process::note_fmt(format_args!($($arg)*)) };
}

/// `eprintln!` that never panics: see [`process::note_fmt`](crate::process::note_fmt).
#[macro_export]
macro_rules! noteln {
    () => { $crate::process::note_fmt(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::process::note_fmt(format_args!("{}\n", format_args!($($arg)*))) };
}
