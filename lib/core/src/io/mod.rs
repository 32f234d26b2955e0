//! Parquet I/O for the three tables: inputs from a path or stdin, outputs to a path (written as
//! `PATH.tmp-<pid>` and renamed on success) or to stdout when it is not a terminal.
//!
//! [`read`]: whole tables; [`stream`]: one step at a time; [`write`]: the streaming writer;
//! [`atomic`]: whole files, renamed into place.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use bytes::Bytes;

use crate::tables::Table;

mod atomic;
pub(crate) mod checksum;
pub use checksum::KEY as CHECKSUM_KEY;
mod read;
mod reader;
mod stream;
mod write;

pub use atomic::*;
pub use read::*;
pub use reader::{Expect, RankRows, TraceReader};
pub use stream::*;
pub use write::*;

/// Key-value metadata of a gradkit file (`gradkit.schema`, `gradkit.producer`, parameters…).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Meta(pub BTreeMap<String, String>);

impl Meta {
    /// Metadata naming the producing tool, its version and its full argv.
    pub fn producer(tool: &str) -> Self {
        let argv: Vec<String> = std::env::args().collect();
        let mut m = Meta::default();
        m.set(
            "gradkit.producer",
            format!(
                "{tool} {} argv={}",
                env!("CARGO_PKG_VERSION"),
                argv.join(" ")
            ),
        );
        // Where the ranks ran, set by pipelines/cluster.sh run (e.g. `backend=mpi-tcp hosts=4
        // ranks=4 rate=1gbit id=…`), so every output says which network made its numbers.
        if let Some(info) = std::env::var("GRADKIT_CLUSTER_INFO")
            .ok()
            .filter(|s| !s.is_empty())
        {
            m.set("gradkit.cluster", info);
        }
        m
    }
    /// Sets `key` (a `gradkit.` prefix is added when missing).
    pub fn set(&mut self, key: &str, value: impl ToString) -> &mut Self {
        let key = if key.starts_with("gradkit.") {
            key.to_string()
        } else {
            format!("gradkit.{key}")
        };
        self.0.insert(key, value.to_string());
        self
    }
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .or_else(|| self.0.get(&format!("gradkit.{key}")))
            .map(|s| s.as_str())
    }
}

/// Where a table is read from.
#[derive(Clone, Debug)]
pub enum Input {
    Stdin,
    Path(PathBuf),
}

impl Input {
    /// `None` or `-` means stdin; stdin that is a terminal is refused with a hint.
    pub fn from_arg(arg: Option<&Path>) -> Result<Self> {
        match arg {
            Some(p) if p.as_os_str() != "-" => Ok(Input::Path(p.to_path_buf())),
            _ => {
                if std::io::stdin().is_terminal() {
                    bail!("no input: give a FILE, or pipe a table into stdin (e.g. `gradtrace synthetic … | TOOL`)");
                }
                Ok(Input::Stdin)
            }
        }
    }
    pub fn name(&self) -> String {
        match self {
            Input::Stdin => "<stdin>".into(),
            Input::Path(p) => p.display().to_string(),
        }
    }
    /// The whole input in memory (stdin is buffered: Parquet needs random access to read).
    fn bytes(&self) -> Result<Bytes> {
        match self {
            Input::Stdin => {
                let mut buf = Vec::new();
                std::io::stdin().lock().read_to_end(&mut buf)?;
                Ok(Bytes::from(buf))
            }
            Input::Path(p) => Ok(Bytes::from(
                std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?,
            )),
        }
    }
}

/// Where a table is written.
#[derive(Clone, Debug)]
pub enum Output {
    Stdout,
    Path(PathBuf),
}

impl Output {
    /// `None` or `-` means stdout, refused when stdout is a terminal (Parquet is binary) and
    /// under mpirun: there every rank's stdout is a pseudo-terminal that mpirun forwards, so
    /// rank 0 cannot tell a pipe from the user's terminal, and Open MPI does not promise to
    /// forward binary data unchanged (docs/RELIABILITY.md).
    ///
    /// A file path is checked at once ([`crate::paths::check_creatable`]): a missing or
    /// read-only directory stops the run before it does any work, not after.
    pub fn from_arg(arg: Option<&Path>) -> Result<Self> {
        Self::for_flag("-o", arg)
    }

    /// [`Output::from_arg`] for the output given by `flag` (named in its errors).
    pub fn for_flag(flag: &str, arg: Option<&Path>) -> Result<Self> {
        match arg {
            Some(p) if p.as_os_str() != "-" => {
                crate::paths::check_creatable(flag, p)?;
                Ok(Output::Path(p.to_path_buf()))
            }
            _ => {
                if crate::process::under_mpi_launcher() {
                    bail!("under mpirun a table cannot go to stdout (rank 0's stdout is mpirun's pseudo-terminal, so a terminal cannot be told from a pipe): give `-o FILE` (stdin works: rank 0 reads it)");
                }
                if std::io::stdout().is_terminal() {
                    bail!("refusing to write Parquet to a terminal: give `-o FILE`, or pipe into another tool (e.g. `| gradtrace inspect`)");
                }
                Ok(Output::Stdout)
            }
        }
    }
    pub fn name(&self) -> String {
        match self {
            Output::Stdout => "<stdout>".into(),
            Output::Path(p) => p.display().to_string(),
        }
    }
}

/// A table read from a file: its rows and its key-value metadata.
#[derive(Clone, Debug)]
pub struct Loaded<T> {
    pub rows: Vec<T>,
    pub meta: Meta,
    pub source: String,
}

/// Options for reading `tensor/1`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadOptions {
    pub allow_nonfinite: bool,
}

/// Reads a whole table of type `T`, validating the schema (and for `tensor/1` every row).
pub fn read_table<T: Table>(input: &Input, _opts: ReadOptions) -> Result<Loaded<T>> {
    let name = input.name();
    read_table_inner::<T>(input).with_context(|| format!("in {name}"))
}
