//! gradkit-comm: the one communication interface every gradkit algorithm is written against.
//!
//! [`Comm`] is a small, object-safe trait (rank, size, a bucket of point-to-point messages,
//! barrier, a native allreduce); [`CommExt`] builds typed send/recv, sendrecv, allgather(v),
//! alltoall(v) and broadcast on top of it, so those collectives move exactly the bytes their
//! algorithm says on every backend. Backends: [`local`] (P threads in one process, the
//! embedded default and the test harness) and [`mpi`] (rsmpi on the system MPI, under
//! `mpirun`). Every backend counts bytes and messages per rank and per phase ([`Traffic`]).
//!
//! Not here: any reduction algorithm (see gradkit-collectives) or file I/O.

pub mod dist;
pub mod launch;
pub mod local;
pub mod mpi;
mod traffic;

pub use launch::World;
pub use local::run_local;
pub use traffic::{PhaseCounts, PhaseGuard, Traffic};

/// The element kinds that travel in messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    F32,
    F64,
    U32,
    U64,
    U8,
}

impl Kind {
    pub fn bytes(self) -> usize {
        match self {
            Kind::F32 | Kind::U32 => 4,
            Kind::F64 | Kind::U64 => 8,
            Kind::U8 => 1,
        }
    }
}

/// An owned, typed message payload. The Local backend moves it between threads as it is.
#[derive(Clone, Debug, PartialEq)]
pub enum Buf {
    F32(Vec<f32>),
    F64(Vec<f64>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    U8(Vec<u8>),
}

impl Buf {
    pub fn kind(&self) -> Kind {
        match self {
            Buf::F32(_) => Kind::F32,
            Buf::F64(_) => Kind::F64,
            Buf::U32(_) => Kind::U32,
            Buf::U64(_) => Kind::U64,
            Buf::U8(_) => Kind::U8,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Buf::F32(v) => v.len(),
            Buf::F64(v) => v.len(),
            Buf::U32(v) => v.len(),
            Buf::U64(v) => v.len(),
            Buf::U8(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Payload size in bytes (what the traffic counters add up).
    pub fn bytes(&self) -> usize {
        self.len() * self.kind().bytes()
    }
}

/// A Rust type that can travel in a [`Buf`].
pub trait Elem: Copy + Send + Default + 'static {
    const KIND: Kind;
    fn wrap(v: Vec<Self>) -> Buf;
    fn unwrap(b: Buf) -> Vec<Self>;
}

macro_rules! elem {
    ($t:ty, $k:ident) => {
        impl Elem for $t {
            const KIND: Kind = Kind::$k;
            fn wrap(v: Vec<Self>) -> Buf {
                Buf::$k(v)
            }
            fn unwrap(b: Buf) -> Vec<Self> {
                match b {
                    Buf::$k(v) => v,
                    other => panic!(
                        "message type mismatch: expected {:?}, got {:?} (algorithm bug)",
                        Kind::$k,
                        other.kind()
                    ),
                }
            }
        }
    };
}
elem!(f32, F32);
elem!(f64, F64);
elem!(u32, U32);
elem!(u64, U64);
elem!(u8, U8);

/// The communication interface. Object-safe: algorithms take `&dyn Comm`.
///
/// A backend implements [`Comm::exchange_raw`]; [`Comm::exchange`] adds the traffic counts.
/// Messages between one pair of ranks with one tag arrive in the order they were posted.
/// A failed peer makes blocked calls panic with "peer rank failed" (Local) or aborts the job
/// (MPI), so no rank waits forever.
pub trait Comm {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// `local` or `mpi`.
    fn backend(&self) -> &'static str;
    /// Posts every send without blocking, then completes the receives in the order given,
    /// then waits for the sends: one bucket of overlapping messages.
    fn exchange_raw(&self, tag: u32, sends: Vec<(usize, Buf)>, recvs: &[(usize, Kind)])
        -> Vec<Buf>;
    fn barrier(&self);
    /// The backend's own sum-allreduce (MPI_Allreduce under MPI).
    fn allreduce_native_f32(&self, data: &mut [f32]);
    /// The backend's own sum-allreduce on f64 (checksums, metrics).
    fn allreduce_native_f64(&self, data: &mut [f64]);
    /// This rank's traffic counters.
    fn traffic(&self) -> &Traffic;

    /// [`Comm::exchange_raw`] with traffic counted (messages to oneself are not counted).
    fn exchange(&self, tag: u32, sends: Vec<(usize, Buf)>, recvs: &[(usize, Kind)]) -> Vec<Buf> {
        let me = self.rank();
        for (d, b) in &sends {
            if *d != me {
                self.traffic().add_sent(b.bytes());
            }
        }
        let got = self.exchange_raw(tag, sends, recvs);
        for ((s, _), b) in recvs.iter().zip(&got) {
            if *s != me {
                self.traffic().add_recv(b.bytes());
            }
        }
        got
    }
}

/// Typed point-to-point helpers and the collectives built on them, for every [`Comm`].
pub trait CommExt: Comm {
    /// Sets the phase the traffic counters charge until the guard drops.
    fn phase(&self, name: &str) -> PhaseGuard<'_> {
        self.traffic().enter(name)
    }
    fn send<T: Elem>(&self, dest: usize, data: Vec<T>) {
        self.exchange(0, vec![(dest, T::wrap(data))], &[]);
    }
    fn recv<T: Elem>(&self, src: usize) -> Vec<T> {
        let mut v = self.exchange(0, vec![], &[(src, T::KIND)]);
        T::unwrap(v.pop().expect("one message"))
    }
    /// Sends to `dest` and receives from `src` in one step.
    fn sendrecv<T: Elem>(&self, dest: usize, data: Vec<T>, src: usize) -> Vec<T> {
        let mut v = self.exchange(0, vec![(dest, T::wrap(data))], &[(src, T::KIND)]);
        T::unwrap(v.pop().expect("one message"))
    }

    /// Ring allgather of variable-size blocks: P−1 steps; in step s every rank forwards the
    /// block that originated at rank r−s. Rank r sends every block but rank r+1's, and
    /// receives every block but its own; no counts travel (messages carry their length).
    fn allgatherv<T: Elem>(&self, mine: Vec<T>) -> Vec<Vec<T>> {
        let (p, r) = (self.size(), self.rank());
        let mut blocks: Vec<Option<Vec<T>>> = (0..p).map(|_| None).collect();
        let right = (r + 1) % p;
        let left = (r + p - 1) % p;
        let mut carry = mine;
        for s in 0..p.saturating_sub(1) {
            let recv = self.sendrecv(right, carry.clone(), left);
            blocks[(r + p - s) % p] = Some(std::mem::replace(&mut carry, recv));
        }
        // After P−1 steps the carried block is the one that started at rank r+1.
        blocks[(r + 1) % p] = Some(carry);
        blocks.into_iter().map(|b| b.unwrap_or_default()).collect()
    }

    /// Allgather of one value per rank.
    fn allgather_one<T: Elem>(&self, v: T) -> Vec<T> {
        self.allgatherv(vec![v]).into_iter().map(|b| b[0]).collect()
    }

    /// Personalised all-to-all: `sends[d]` goes to rank d; returns what each rank sent here.
    /// All P−1 messages are posted at once with rotated destinations (step s: r+s).
    fn alltoallv<T: Elem>(&self, mut sends: Vec<Vec<T>>) -> Vec<Vec<T>> {
        let (p, r) = (self.size(), self.rank());
        assert_eq!(sends.len(), p, "alltoallv needs one block per rank");
        let own = std::mem::take(&mut sends[r]);
        let mut out: Vec<(usize, Buf)> = Vec::with_capacity(p - 1);
        for s in 1..p {
            let d = (r + s) % p;
            out.push((d, T::wrap(std::mem::take(&mut sends[d]))));
        }
        let srcs: Vec<(usize, Kind)> = (1..p).map(|s| ((r + p - s) % p, T::KIND)).collect();
        let got = self.exchange(0, out, &srcs);
        let mut res: Vec<Vec<T>> = (0..p).map(|_| Vec::new()).collect();
        res[r] = own;
        for ((src, _), b) in srcs.iter().zip(got) {
            res[*src] = T::unwrap(b);
        }
        res
    }

    /// Binomial-tree broadcast from `root` (⌈log2 P⌉ rounds).
    fn broadcast<T: Elem>(&self, root: usize, data: Option<Vec<T>>) -> Vec<T> {
        let (p, r) = (self.size(), self.rank());
        let vr = (r + p - root) % p;
        let mut buf = if vr == 0 {
            data.expect("root must supply the broadcast data")
        } else {
            Vec::new()
        };
        // Receive from the parent: the highest set bit of vr.
        if vr != 0 {
            let hb = usize::BITS - 1 - vr.leading_zeros();
            let parent = ((vr - (1 << hb)) + root) % p;
            buf = self.recv(parent);
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
            self.exchange(0, sends, &[]);
        }
        buf
    }

    /// Sum-allreduce of a few f64 values (control data: counts, norms, checksums), counted.
    fn allreduce_small_f64(&self, vals: &[f64]) -> Vec<f64> {
        let all = self.allgatherv(vals.to_vec());
        (0..vals.len())
            .map(|i| all.iter().map(|b| b[i]).sum())
            .collect()
    }

    /// Max over ranks of a few f64 values.
    fn allreduce_max_f64(&self, vals: &[f64]) -> Vec<f64> {
        let all = self.allgatherv(vals.to_vec());
        (0..vals.len())
            .map(|i| all.iter().map(|b| b[i]).fold(f64::NEG_INFINITY, f64::max))
            .collect()
    }
}

impl<C: Comm + ?Sized> CommExt for C {}
