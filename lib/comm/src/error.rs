//! [`CommError`]: why a communication call failed. Every [`crate::Comm`] primitive and every
//! [`crate::CommExt`] collective returns `Result<_, CommError>`; it implements
//! `std::error::Error`, so `?` turns it into an `anyhow::Error`.

use std::fmt;

use crate::{Kind, Location};

/// Which way a wait that timed out was waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// A receive: no message arrived from the peer.
    Recv,
    /// A send: the peer did not take the message.
    Send,
}

/// Why a communication call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommError {
    /// Another rank of the world failed, and this rank's call was ended so that it does not
    /// wait for it forever (in-process backends). The failed rank's own error is the one to
    /// report; `run_local` does so.
    PeerFailed,
    /// A wait passed the watchdog's limit (`GRADKIT_COMM_TIMEOUT`): `peer` is the rank this
    /// rank waited on, which may itself be waiting on the rank that is stuck.
    Timeout {
        peer: usize,
        waiting: Waiting,
        secs: u64,
    },
    /// The backend cannot move a buffer that lives at `location` (device memory on a
    /// host-only transport).
    UnsupportedLocation {
        backend: &'static str,
        location: Location,
    },
    /// A buffer that is not in host memory was read as a host `Vec`.
    NotOnHost { location: Location },
    /// A message's element kind is not the one the receiver asked for (an algorithm bug).
    KindMismatch {
        from: Option<usize>,
        expected: Kind,
        got: Kind,
    },
    /// Sizes that must agree do not (one block per rank, equal lengths on every rank, a
    /// device allocation smaller than its buffer…).
    SizeMismatch(String),
    /// A rank number outside the world.
    NoSuchRank { rank: usize, size: usize },
    /// A collective was called with arguments it cannot use (a broadcast root without data).
    InvalidArgument(String),
    /// The transport itself failed (an MPI error, a lost connection).
    Transport {
        backend: &'static str,
        message: String,
    },
}

impl CommError {
    /// Whether this error only reports that some *other* rank failed.
    pub fn is_peer_failure(&self) -> bool {
        matches!(self, CommError::PeerFailed)
    }
}

impl fmt::Display for CommError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommError::PeerFailed => write!(f, "a peer rank failed"),
            CommError::Timeout {
                peer,
                waiting,
                secs,
            } => {
                match waiting {
                    Waiting::Recv => write!(f, "no message from rank {peer}")?,
                    Waiting::Send => write!(f, "a message to rank {peer} was not taken")?,
                }
                write!(f, " for {secs} s (GRADKIT_COMM_TIMEOUT); ending the job")
            }
            CommError::UnsupportedLocation { backend, location } => write!(
                f,
                "the {backend} backend cannot move a buffer in {location} memory"
            ),
            CommError::NotOnHost { location } => write!(
                f,
                "a buffer in {location} memory cannot be read as host memory"
            ),
            CommError::KindMismatch {
                from,
                expected,
                got,
            } => {
                write!(f, "message type mismatch")?;
                if let Some(r) = from {
                    write!(f, " from rank {r}")?;
                }
                write!(f, ": expected {expected:?}, got {got:?} (algorithm bug)")
            }
            CommError::SizeMismatch(s) => write!(f, "size mismatch: {s}"),
            CommError::NoSuchRank { rank, size } => {
                write!(f, "rank {rank} does not exist in a world of {size}")
            }
            CommError::InvalidArgument(s) => write!(f, "{s}"),
            CommError::Transport { backend, message } => {
                write!(f, "{backend} transport failed: {message}")
            }
        }
    }
}

impl std::error::Error for CommError {}

/// Whether an `anyhow` error is, or wraps, a [`CommError::PeerFailed`].
pub fn is_peer_failure(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<CommError>()
            .is_some_and(CommError::is_peer_failure)
    })
}
