//! gradkit-comm: the one communication interface every gradkit algorithm is written against.
//!
//! [`Comm`] is a small, object-safe trait (rank, size, a bucket of point-to-point messages,
//! barrier, a native allreduce); [`CommExt`] builds typed send/recv, sendrecv, allgather(v),
//! alltoall(v) and broadcast on top of it, so those collectives move exactly the bytes their
//! algorithm says on every backend. Payloads are [`Buf`]s, in host memory or on a device
//! ([`Location`], [`DeviceMemory`]); every call returns `Result<_, CommError>`.
//!
//! Backends: [`local`] (P threads in one process, the embedded default and the test harness)
//! and [`mpi`] (rsmpi on the system MPI, under `mpirun`). The set is open: a backend is a
//! [`Backend`] value (name and capabilities), a [`Comm`] implementation and a [`Launch`]
//! implementation that [`World::from_launch`] accepts; [`conformance`] is the suite every
//! backend must pass. Every backend counts bytes and messages per rank and per phase
//! ([`Traffic`]).
//!
//! Not here: any reduction algorithm (see gradkit-collectives) or file I/O.

mod backend;
mod buf;
pub mod conformance;
pub mod dist;
mod error;
pub mod launch;
pub mod local;
pub mod mpi;
pub mod record;
mod traffic;

pub use backend::Backend;
pub use buf::{
    copy_release, elem_bytes, elem_bytes_mut, huge_vec, release, release_into, release_spare,
    reserve_huge, Buf, DeviceMemory, Elem, Kind, Location,
};
pub use error::{is_peer_failure, CommError, Waiting};
pub use launch::{Launch, World};
pub use local::run_local;
pub use traffic::{Fixed, FixedGuard, PhaseCounts, PhaseGuard, Traffic};

/// The result of a communication call.
pub type CommResult<T> = Result<T, CommError>;

/// The communication interface. Object-safe: algorithms take `&dyn Comm`.
///
/// A backend implements [`Comm::exchange_raw`]; [`Comm::exchange`] adds the traffic counts.
/// Messages between one pair of ranks with one tag arrive in the order they were posted.
/// Every call returns `Err` instead of waiting forever: [`CommError::PeerFailed`] when
/// another rank failed (Local), [`CommError::Timeout`] after `GRADKIT_COMM_TIMEOUT` (MPI).
/// After an error the world is broken: the caller should return the error, and
/// [`World::run`] ends the run (under MPI, the job).
pub trait Comm {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// What this backend is and can do.
    fn backend(&self) -> Backend;
    /// Posts every send without blocking, then completes the receives in the order given,
    /// then waits for the sends: one bucket of overlapping messages. Received buffers are in
    /// host memory on host-only backends. A send buffer in a location the backend cannot
    /// move ([`Backend::moves`]) is refused with [`CommError::UnsupportedLocation`] before
    /// anything is posted, a rank outside the world with [`CommError::NoSuchRank`]. Sender and
    /// receiver must agree on each message's kind; a backend that can tell (Local) reports a
    /// disagreement as [`CommError::KindMismatch`] (MPI messages carry no kind).
    fn exchange_raw(
        &self,
        tag: u32,
        sends: Vec<(usize, Buf)>,
        recvs: &[(usize, Kind)],
    ) -> CommResult<Vec<Buf>>;
    fn barrier(&self) -> CommResult<()>;
    /// The backend's own sum-allreduce (MPI_Allreduce under MPI). Every rank passes the
    /// same length.
    fn allreduce_native_f32(&self, data: &mut [f32]) -> CommResult<()>;
    /// The backend's own sum-allreduce on f64 (checksums, metrics).
    fn allreduce_native_f64(&self, data: &mut [f64]) -> CommResult<()>;
    /// This rank's traffic counters.
    fn traffic(&self) -> &Traffic;

    /// [`Comm::exchange_raw`] with traffic counted (messages to oneself are not counted).
    fn exchange(
        &self,
        tag: u32,
        sends: Vec<(usize, Buf)>,
        recvs: &[(usize, Kind)],
    ) -> CommResult<Vec<Buf>> {
        let me = self.rank();
        let sent: Vec<(usize, usize)> = sends
            .iter()
            .filter(|(d, _)| *d != me)
            .map(|(d, b)| (*d, b.bytes()))
            .collect();
        let t0 = self.traffic().call_start();
        let got = self.exchange_raw(tag, sends, recvs)?;
        for &(_, b) in &sent {
            self.traffic().add_sent(b);
        }
        let mut received = Vec::new();
        for ((s, _), b) in recvs.iter().zip(&got) {
            if *s != me {
                self.traffic().add_recv(b.bytes());
                received.push((*s, b.bytes()));
            }
        }
        if let Some(t0) = t0 {
            self.traffic().record_call(t0, tag, &sent, &received);
        }
        Ok(got)
    }
}

/// Checks what every backend's `exchange_raw` must check before it posts anything: ranks in
/// range, and send buffers in memory the backend can move.
pub fn check_exchange(
    backend: Backend,
    size: usize,
    sends: &[(usize, Buf)],
    recvs: &[(usize, Kind)],
) -> CommResult<()> {
    for &rank in sends
        .iter()
        .map(|(d, _)| d)
        .chain(recvs.iter().map(|(s, _)| s))
    {
        if rank >= size {
            return Err(CommError::NoSuchRank { rank, size });
        }
    }
    for (_, b) in sends {
        if !backend.moves(b.location()) {
            return Err(CommError::UnsupportedLocation {
                backend: backend.name(),
                location: b.location(),
            });
        }
    }
    Ok(())
}

/// The one buffer a single receive returns, as `T`.
fn one<T: Elem>(v: Vec<Buf>, from: usize) -> CommResult<Vec<T>> {
    let b = v.into_iter().next().ok_or_else(|| CommError::Transport {
        backend: "comm",
        message: "a receive returned no message".into(),
    })?;
    T::try_unwrap(b).map_err(|e| match e {
        CommError::KindMismatch { expected, got, .. } => CommError::KindMismatch {
            from: Some(from),
            expected,
            got,
        },
        e => e,
    })
}

/// Typed point-to-point helpers and the collectives built on them, for every [`Comm`].
/// Every collective is called by every rank of the world, with the same arguments where the
/// arguments are not per-rank data.
pub trait CommExt: Comm {
    /// Sets the phase the traffic counters charge until the guard drops.
    fn phase(&self, name: &str) -> PhaseGuard<'_> {
        self.traffic().enter(name)
    }
    /// Marks what of the messages sent until the guard drops does not grow with the model's
    /// size (control messages, headers, padding: [`Fixed`]), for the recording's replay at
    /// another size.
    fn fixed(&self, rule: Fixed) -> FixedGuard<'_> {
        self.traffic().fixed(rule)
    }
    fn send<T: Elem>(&self, dest: usize, data: Vec<T>) -> CommResult<()> {
        self.exchange(0, vec![(dest, T::wrap(data))], &[])?;
        Ok(())
    }
    fn recv<T: Elem>(&self, src: usize) -> CommResult<Vec<T>> {
        one(self.exchange(0, vec![], &[(src, T::KIND)])?, src)
    }
    /// Sends to `dest` and receives from `src` in one step.
    fn sendrecv<T: Elem>(&self, dest: usize, data: Vec<T>, src: usize) -> CommResult<Vec<T>> {
        one(
            self.exchange(0, vec![(dest, T::wrap(data))], &[(src, T::KIND)])?,
            src,
        )
    }

    /// Ring allgather of variable-size blocks: P−1 steps; in step s every rank forwards the
    /// block that originated at rank r−s. Rank r sends every block but rank r+1's, and
    /// receives every block but its own; no counts travel (messages carry their length).
    fn allgatherv<T: Elem>(&self, mine: Vec<T>) -> CommResult<Vec<Vec<T>>> {
        let (p, r) = (self.size(), self.rank());
        let mut blocks: Vec<Option<Vec<T>>> = (0..p).map(|_| None).collect();
        let right = (r + 1) % p;
        let left = (r + p - 1) % p;
        let mut carry = mine;
        for s in 0..p.saturating_sub(1) {
            let recv = self.sendrecv(right, carry.clone(), left)?;
            blocks[(r + p - s) % p] = Some(std::mem::replace(&mut carry, recv));
        }
        // After P−1 steps the carried block is the one that started at rank r+1.
        blocks[(r + 1) % p] = Some(carry);
        Ok(blocks.into_iter().map(|b| b.unwrap_or_default()).collect())
    }

    /// Allgather of one value per rank (a control message: its size does not grow with the
    /// model's).
    fn allgather_one<T: Elem>(&self, v: T) -> CommResult<Vec<T>> {
        let _fixed = self.fixed(Fixed::All);
        self.allgatherv(vec![v])?
            .into_iter()
            .enumerate()
            .map(|(q, b)| match b[..] {
                [x] => Ok(x),
                _ => Err(CommError::SizeMismatch(format!(
                    "allgather_one: rank {q} sent {} values, not 1",
                    b.len()
                ))),
            })
            .collect()
    }

    /// Personalised all-to-all: `sends[d]` goes to rank d; returns what each rank sent here.
    /// All P−1 messages are posted at once with rotated destinations (step s: r+s).
    fn alltoallv<T: Elem>(&self, mut sends: Vec<Vec<T>>) -> CommResult<Vec<Vec<T>>> {
        let (p, r) = (self.size(), self.rank());
        if sends.len() != p {
            return Err(CommError::SizeMismatch(format!(
                "alltoallv needs one block per rank: {} blocks for {p} ranks",
                sends.len()
            )));
        }
        let own = std::mem::take(&mut sends[r]);
        let mut out: Vec<(usize, Buf)> = Vec::with_capacity(p - 1);
        for s in 1..p {
            let d = (r + s) % p;
            out.push((d, T::wrap(std::mem::take(&mut sends[d]))));
        }
        let srcs: Vec<(usize, Kind)> = (1..p).map(|s| ((r + p - s) % p, T::KIND)).collect();
        let got = self.exchange(0, out, &srcs)?;
        let mut res: Vec<Vec<T>> = (0..p).map(|_| Vec::new()).collect();
        res[r] = own;
        for ((src, _), b) in srcs.iter().zip(got) {
            res[*src] = one(vec![b], *src)?;
        }
        Ok(res)
    }

    /// Binomial-tree broadcast from `root` (⌈log2 P⌉ rounds). The root passes `Some(data)`,
    /// the others `None`.
    fn broadcast<T: Elem>(&self, root: usize, data: Option<Vec<T>>) -> CommResult<Vec<T>> {
        let (p, r) = (self.size(), self.rank());
        if root >= p {
            return Err(CommError::NoSuchRank {
                rank: root,
                size: p,
            });
        }
        let vr = (r + p - root) % p;
        let mut buf = if vr == 0 {
            data.ok_or_else(|| {
                CommError::InvalidArgument("the broadcast root must supply the data".into())
            })?
        } else {
            Vec::new()
        };
        // Receive from the parent: the highest set bit of vr.
        if vr != 0 {
            let hb = usize::BITS - 1 - vr.leading_zeros();
            let parent = ((vr - (1 << hb)) + root) % p;
            buf = self.recv(parent)?;
        }
        let start = if vr == 0 {
            0
        } else {
            usize::BITS - vr.leading_zeros()
        };
        let mut sends = Vec::new();
        let mut bit = 1usize << start;
        while bit < p {
            let child = vr + bit;
            if child < p {
                sends.push(((child + root) % p, T::wrap(buf.clone())));
            }
            bit <<= 1;
        }
        if !sends.is_empty() {
            self.exchange(0, sends, &[])?;
        }
        Ok(buf)
    }

    /// Sum-allreduce of a few f64 values (control data: counts, norms, checksums), counted.
    /// Every rank passes the same number of values.
    fn allreduce_small_f64(&self, vals: &[f64]) -> CommResult<Vec<f64>> {
        let all = gather_equal(self, vals)?;
        Ok((0..vals.len())
            .map(|i| all.iter().map(|b| b[i]).sum())
            .collect())
    }

    /// Max over ranks of a few f64 values.
    fn allreduce_max_f64(&self, vals: &[f64]) -> CommResult<Vec<f64>> {
        let all = gather_equal(self, vals)?;
        Ok((0..vals.len())
            .map(|i| all.iter().map(|b| b[i]).fold(f64::NEG_INFINITY, f64::max))
            .collect())
    }
}

impl<C: Comm + ?Sized> CommExt for C {}

/// Every rank's `vals`, checked to be of one length.
fn gather_equal<C: CommExt + ?Sized>(c: &C, vals: &[f64]) -> CommResult<Vec<Vec<f64>>> {
    let all = c.allgatherv(vals.to_vec())?;
    if let Some(q) = all.iter().position(|b| b.len() != vals.len()) {
        return Err(CommError::SizeMismatch(format!(
            "rank {q} reduces {} values, rank {} reduces {}",
            all[q].len(),
            c.rank(),
            vals.len()
        )));
    }
    Ok(all)
}
