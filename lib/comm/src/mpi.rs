//! The MPI backend: one rank per process under `mpirun`, on the `mpi` crate (rsmpi) and the
//! system MPI library. Messages are typed MPI messages; a receive probes for the length.
//! Host memory only: a device buffer is refused with [`CommError::UnsupportedLocation`].
//!
//! Buffer reuse (docs/MEMORY.md): the buffers of sends that have gone out are kept in a small pool
//! ([`BufPool`], at most two large buffers) and a large receive lands in one of them instead
//! of a fresh allocation, so a ring that sends one chunk and receives one per step
//! allocates and page-faults nothing once warm. A receive of 1 MiB or more that the pool
//! cannot take gets a [`crate::huge_vec`] (whole 2 MiB huge pages), so that the receiver's
//! single-copy read of it as the next message walks huge pages, not 4 KiB ones. The native
//! allreduce runs in place (`MPI_IN_PLACE`) on the caller's buffer.

use mpi::point_to_point::{Destination, MatchedReceiveVec, Source};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::CommunicatorCollectives;

use crate::buf::BufPool;
use crate::{
    check_exchange, Backend, Buf, Comm, CommError, CommResult, Elem, Kind, Traffic, Waiting,
};

/// `MPI_Finalize`, once (registered with `gradkit_core::cli::run`, which calls it on the paths
/// every rank takes). A watchdog ends the process if it has not returned after
/// `GRADKIT_COMM_TIMEOUT` seconds: a rank that left without reporting must not hold the job.
pub(crate) fn finalize() {
    if mpi::environment::is_finalized() {
        return;
    }
    if let Some(limit) = comm_timeout() {
        std::thread::spawn(move || {
            std::thread::sleep(limit);
            gradkit_core::cli::report_line(&format!(
                "error: MPI_Finalize waited {} s for the other ranks (GRADKIT_COMM_TIMEOUT); ending the job",
                limit.as_secs()
            ));
            std::process::exit(1);
        });
    }
    unsafe {
        mpi::ffi::MPI_Finalize();
    }
}

/// This process's rank of an MPI job, for a library that lives inside another program (the
/// Python module, `python/native`): MPI initialised with `MPI_THREAD_SERIALIZED`, since the
/// host program may call from several threads, one at a time (the caller holds the
/// communicator behind a lock). The caller finalizes with [`finalize_library`] at exit.
pub fn init_library() -> anyhow::Result<MpiComm> {
    if !gradkit_core::cli::under_mpi_launcher() {
        anyhow::bail!("this process was not started by mpirun or mpiexec (no MPI launcher in its environment)");
    }
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Serialized) else {
        anyhow::bail!("MPI was already initialised in this process (by mpi4py or another library): gradkit's MPI backend initialises it itself");
    };
    let comm = MpiComm::new(universe.world());
    // Finalized by `finalize_library` at the host program's exit, never by a drop.
    std::mem::forget(universe);
    Ok(comm)
}

/// `MPI_Finalize` for [`init_library`]'s caller (at most once; nothing if MPI was never
/// initialised), under the same watchdog as the tools'.
pub fn finalize_library() {
    if mpi::environment::is_initialized() {
        finalize();
    }
}

/// `MPI_Abort` on the world communicator: ends every rank of the job.
pub(crate) fn abort_world(code: i32) -> ! {
    unsafe {
        mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, code);
    }
    std::process::exit(code)
}

/// How long a receive may wait before the job is ended: `GRADKIT_COMM_TIMEOUT` seconds
/// (default 1800; 0 = forever). Every tool has refused a bad value at its start
/// ([`gradkit_core::env::check`]); a caller that did not check gets the default.
pub fn comm_timeout() -> Option<std::time::Duration> {
    gradkit_core::env::comm_timeout().unwrap_or(Some(std::time::Duration::from_secs(
        gradkit_core::env::DEFAULT_COMM_TIMEOUT_S,
    )))
}

/// One rank of an MPI world.
pub struct MpiComm {
    world: SimpleCommunicator,
    traffic: Traffic,
    timeout: Option<std::time::Duration>,
    /// Sent buffers kept for later receives.
    pool: BufPool,
}

impl MpiComm {
    pub(crate) fn new(world: SimpleCommunicator) -> Self {
        MpiComm {
            world,
            traffic: Traffic::default(),
            timeout: comm_timeout(),
            pool: BufPool::default(),
        }
    }

    /// Ends the whole job (every rank) with `code`.
    pub fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }

    /// Receives a probed message of kind `k`: into a pooled buffer when one fits, else into
    /// a new one.
    fn receive(
        &self,
        m: (mpi::point_to_point::Message, mpi::point_to_point::Status),
        k: Kind,
    ) -> Buf {
        match k {
            Kind::F32 => receive_pooled::<f32>(&self.pool, m),
            Kind::F64 => receive_pooled::<f64>(&self.pool, m),
            Kind::U32 => receive_pooled::<u32>(&self.pool, m),
            Kind::U64 => receive_pooled::<u64>(&self.pool, m),
            Kind::U8 => receive_pooled::<u8>(&self.pool, m),
        }
    }

    /// Waits for the next message from `src` with tag `t`, under the watchdog.
    fn probe(
        &self,
        src: usize,
        t: i32,
    ) -> CommResult<(mpi::point_to_point::Message, mpi::point_to_point::Status)> {
        let proc = self.world.process_at_rank(src as i32);
        let mut poll = Poll::new(self);
        loop {
            if let Some(m) = proc.immediate_matched_probe_with_tag(t) {
                return Ok(m);
            }
            poll.tick(src, Waiting::Recv)?;
        }
    }
}

/// A matched message received into a buffer from `pool` when one fits (no allocation, no
/// page faults), else into a new `Vec` of its length ([`crate::huge_vec`] when large).
fn receive_pooled<T: Elem + mpi::traits::Equivalence>(
    pool: &BufPool,
    (msg, status): (mpi::point_to_point::Message, mpi::point_to_point::Status),
) -> Buf {
    let len = usize::try_from(status.count(T::equivalent_datatype())).ok();
    match len.and_then(|n| pool.take::<T>(n)) {
        Some(mut v) => {
            msg.matched_receive_into(&mut v[..]);
            T::wrap(v)
        }
        None => match len {
            Some(n) if n * T::KIND.bytes() >= crate::buf::HUGE_ROUND_MIN_BYTES => {
                let mut v = crate::huge_vec::<T>(n);
                v.resize(n, T::default());
                msg.matched_receive_into(&mut v[..]);
                T::wrap(v)
            }
            _ => T::wrap((msg, status).matched_receive_vec().0),
        },
    }
}

/// A pending send of any element type (rsmpi types requests by their buffer).
enum AnyReq<'a, S: mpi::request::Scope<'a>> {
    F32(mpi::request::Request<'a, [f32], S>),
    F64(mpi::request::Request<'a, [f64], S>),
    U32(mpi::request::Request<'a, [u32], S>),
    U64(mpi::request::Request<'a, [u64], S>),
    U8(mpi::request::Request<'a, [u8], S>),
}

impl<'a, S: mpi::request::Scope<'a>> AnyReq<'a, S> {
    /// Gives up on a pending send: MPI keeps the request until it completes (or the job
    /// ends), so its buffer must outlive this process's use of it — the caller leaks it.
    fn abandon(self) {
        fn free<'a, D: ?Sized, S: mpi::request::Scope<'a>>(r: mpi::request::Request<'a, D, S>) {
            // SAFETY: `into_raw` unregisters the live request from its scope; MPI_Request_free
            // marks it for deallocation once the send completes. The buffer it reads is never
            // freed afterwards (`exchange_raw` forgets the send buffers on this path).
            unsafe {
                let (mut raw, _, _) = r.into_raw();
                mpi::ffi::MPI_Request_free(&mut raw);
            }
        }
        match self {
            AnyReq::F32(r) => free(r),
            AnyReq::F64(r) => free(r),
            AnyReq::U32(r) => free(r),
            AnyReq::U64(r) => free(r),
            AnyReq::U8(r) => free(r),
        }
    }
    /// Whether the send has completed; an unfinished request is handed back.
    fn test(self) -> Result<(), Self> {
        match self {
            AnyReq::F32(r) => r.test().map(drop).map_err(AnyReq::F32),
            AnyReq::F64(r) => r.test().map(drop).map_err(AnyReq::F64),
            AnyReq::U32(r) => r.test().map(drop).map_err(AnyReq::U32),
            AnyReq::U64(r) => r.test().map(drop).map_err(AnyReq::U64),
            AnyReq::U8(r) => r.test().map(drop).map_err(AnyReq::U8),
        }
    }
}

/// Polls a wait (driving MPI's progress), yielding the core once it is not short, and fails
/// with [`CommError::Timeout`] after the watchdog's limit.
struct Poll<'c> {
    comm: &'c MpiComm,
    polls: u64,
    start: Option<std::time::Instant>,
}

impl<'c> Poll<'c> {
    fn new(comm: &'c MpiComm) -> Self {
        Poll {
            comm,
            polls: 0,
            start: None,
        }
    }
    fn tick(&mut self, peer: usize, waiting: Waiting) -> CommResult<()> {
        self.polls += 1;
        if self.polls < 1024 {
            std::hint::spin_loop();
            return Ok(());
        }
        std::thread::yield_now();
        if self.polls.is_multiple_of(1024) {
            if let Some(limit) = self.comm.timeout {
                let t0 = *self.start.get_or_insert_with(std::time::Instant::now);
                if t0.elapsed() > limit {
                    return Err(CommError::Timeout {
                        peer,
                        waiting,
                        secs: limit.as_secs(),
                    });
                }
            }
        }
        Ok(())
    }
}

fn tag_of(tag: u32) -> i32 {
    (tag & 0x7fff) as i32
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }
    fn size(&self) -> usize {
        self.world.size() as usize
    }
    fn backend(&self) -> Backend {
        Backend::MPI
    }
    fn exchange_raw(
        &self,
        tag: u32,
        sends: Vec<(usize, Buf)>,
        recvs: &[(usize, Kind)],
    ) -> CommResult<Vec<Buf>> {
        check_exchange(Backend::MPI, self.size(), &sends, recvs)?;
        let t = tag_of(tag);
        let world = &self.world;
        let mut abandoned = false;
        let res = mpi::request::scope(|scope| {
            let mut reqs = Vec::with_capacity(sends.len());
            for (d, b) in &sends {
                let proc = world.process_at_rank(*d as i32);
                // Host buffers only (checked above): exactly one slice matches.
                let r = if let Some(v) = b.as_slice::<f32>() {
                    AnyReq::F32(proc.immediate_send_with_tag(scope, v, t))
                } else if let Some(v) = b.as_slice::<f64>() {
                    AnyReq::F64(proc.immediate_send_with_tag(scope, v, t))
                } else if let Some(v) = b.as_slice::<u32>() {
                    AnyReq::U32(proc.immediate_send_with_tag(scope, v, t))
                } else if let Some(v) = b.as_slice::<u64>() {
                    AnyReq::U64(proc.immediate_send_with_tag(scope, v, t))
                } else if let Some(v) = b.as_slice::<u8>() {
                    AnyReq::U8(proc.immediate_send_with_tag(scope, v, t))
                } else {
                    unreachable!("check_exchange admits host buffers only")
                };
                reqs.push(r);
            }
            let mut got: Vec<Buf> = Vec::with_capacity(recvs.len());
            let mut failed = None;
            for &(s, k) in recvs {
                match self.probe(s, t) {
                    Ok(m) => got.push(self.receive(m, k)),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            let mut pending = reqs.into_iter().zip(&sends);
            if failed.is_none() {
                'sends: for (mut r, (d, _)) in pending.by_ref() {
                    let mut poll = Poll::new(self);
                    while let Err(p) = r.test() {
                        if let Err(e) = poll.tick(*d, Waiting::Send) {
                            p.abandon();
                            failed = Some(e);
                            break 'sends;
                        }
                        r = p;
                    }
                }
            }
            if let Some(e) = failed {
                for (r, _) in pending {
                    // A send that has completed needs no more than its test.
                    if let Err(r) = r.test() {
                        r.abandon();
                    }
                }
                abandoned = true;
                return Err(e);
            }
            Ok(got)
        });
        if abandoned {
            // MPI may still read the abandoned sends' buffers: they must never be freed.
            std::mem::forget(sends);
        } else {
            // Every send has completed: its buffer can take a later receive.
            for (_, b) in sends {
                self.pool.put(b);
            }
        }
        res
    }
    fn barrier(&self) -> CommResult<()> {
        self.world.barrier();
        Ok(())
    }
    fn allreduce_native_f32(&self, data: &mut [f32]) -> CommResult<()> {
        self.traffic.add_opaque(data.len() * 4);
        if self.size() > 1 {
            allreduce_sum_in_place(&self.world, data);
        }
        Ok(())
    }
    fn allreduce_native_f64(&self, data: &mut [f64]) -> CommResult<()> {
        self.traffic.add_opaque(data.len() * 8);
        if self.size() > 1 {
            allreduce_sum_in_place(&self.world, data);
        }
        Ok(())
    }
    fn traffic(&self) -> &Traffic {
        &self.traffic
    }
}

/// `MPI_IN_PLACE` of the MPI library this process runs on, which rsmpi 0.8's `mpi-sys` does
/// not export: `(void *) 1` in Open MPI, `(void *) -1` in MPICH (and the libraries that
/// report themselves as MPICH). `None` for any other library: the caller then copies.
fn mpi_in_place() -> Option<*const std::ffi::c_void> {
    static IN_PLACE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let addr = *IN_PLACE.get_or_init(|| {
        let v = mpi::environment::library_version().ok()?;
        if v.contains("Open MPI") {
            Some(1)
        } else if v.contains("MPICH") {
            Some(usize::MAX)
        } else {
            None
        }
    });
    addr.map(|a| a as *const std::ffi::c_void)
}

/// `MPI_Allreduce(MPI_IN_PLACE, data, …, MPI_SUM)`: no copy of the input (in pieces of at
/// most `i32::MAX` elements, the largest MPI count). Falls back to rsmpi's
/// `all_reduce_into` from a copy when the library's `MPI_IN_PLACE` is not known.
fn allreduce_sum_in_place<T>(world: &SimpleCommunicator, data: &mut [T])
where
    T: mpi::traits::Equivalence + Copy,
{
    use mpi::collective::SystemOperation;
    use mpi::raw::AsRaw;
    let Some(in_place) = mpi_in_place() else {
        let send = data.to_vec();
        world.all_reduce_into(&send[..], data, SystemOperation::sum());
        return;
    };
    for piece in data.chunks_mut(i32::MAX as usize) {
        // SAFETY: `in_place` is this library's MPI_IN_PLACE sentinel (checked by name
        // above), so MPI reads and writes only `piece`, which is valid, exclusively
        // borrowed, and holds `piece.len()` (≤ i32::MAX) elements of `T`'s datatype; the
        // communicator and the predefined MPI_SUM handle outlive the call. Every rank makes
        // the same calls (same length, same pieces), as MPI_Allreduce requires.
        unsafe {
            mpi::ffi::MPI_Allreduce(
                in_place,
                piece.as_mut_ptr().cast(),
                piece.len() as std::os::raw::c_int,
                T::equivalent_datatype().as_raw(),
                SystemOperation::sum().as_raw(),
                world.as_raw(),
            );
        }
    }
}
