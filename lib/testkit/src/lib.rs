//! gradkit-testkit: what the tools' tests share (a dev-dependency only, never linked into a
//! tool): running a built binary as a user would and checking how it refused, and the plan/1
//! fixtures every plan consumer must treat alike.

pub mod cli;
pub mod mpi;
pub mod plans;
pub mod rng;
pub mod traces;

/// A fresh directory under the system's temporary directory, named `PREFIX…` with a random
/// tail, removed with everything in it when the guard drops (at the end of the test, and on
/// a failed assertion too, as the panic unwinds): a test run leaves nothing behind in /tmp.
pub fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("a directory under the system's temporary directory")
}

pub use tempfile::TempDir;
