//! The MPI backend: one rank per process under `mpirun`, on the `mpi` crate (rsmpi) and the
//! system MPI library. Messages are typed MPI messages; a receive probes for the length.

use mpi::point_to_point::{Destination, MatchedReceiveVec, Source};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::CommunicatorCollectives;

use crate::{Buf, Comm, Kind, Traffic};

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

/// `MPI_Abort` on the world communicator: ends every rank of the job.
pub(crate) fn abort_world(code: i32) -> ! {
    unsafe {
        mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, code);
    }
    std::process::exit(code)
}

/// How long a receive may wait before the job is ended: `GRADKIT_COMM_TIMEOUT` seconds
/// (default 1800; 0 = forever).
pub fn comm_timeout() -> Option<std::time::Duration> {
    let secs = std::env::var("GRADKIT_COMM_TIMEOUT")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(1800.0);
    (secs > 0.0 && secs.is_finite()).then(|| std::time::Duration::from_secs_f64(secs))
}

/// One rank of an MPI world.
pub struct MpiComm {
    world: SimpleCommunicator,
    traffic: Traffic,
    timeout: Option<std::time::Duration>,
}

impl MpiComm {
    pub(crate) fn new(world: SimpleCommunicator) -> Self {
        MpiComm {
            world,
            traffic: Traffic::default(),
            timeout: comm_timeout(),
        }
    }

    /// Ends the whole job (every rank) with `code`.
    pub fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }

    /// Waits for the next message from `src` with tag `t`, under the watchdog.
    fn probe(
        &self,
        src: usize,
        t: i32,
    ) -> (mpi::point_to_point::Message, mpi::point_to_point::Status) {
        let proc = self.world.process_at_rank(src as i32);
        let mut poll = Poll::new(self);
        loop {
            if let Some(m) = proc.immediate_matched_probe_with_tag(t) {
                return m;
            }
            poll.tick(|| format!("no message from rank {src}"));
        }
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

/// Polls a wait (driving MPI's progress), yielding the core once it is not short, and ends
/// the job with `what` after the watchdog's limit.
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
    fn tick(&mut self, what: impl FnOnce() -> String) {
        self.polls += 1;
        if self.polls < 1024 {
            std::hint::spin_loop();
            return;
        }
        std::thread::yield_now();
        if self.polls.is_multiple_of(1024) {
            if let Some(limit) = self.comm.timeout {
                let t0 = *self.start.get_or_insert_with(std::time::Instant::now);
                if t0.elapsed() > limit {
                    gradkit_core::cli::report_line(&format!(
                        "error: rank {}: {} for {} s (GRADKIT_COMM_TIMEOUT); ending the job",
                        self.comm.rank(),
                        what(),
                        limit.as_secs()
                    ));
                    self.comm.abort(1);
                }
            }
        }
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
    fn backend(&self) -> &'static str {
        "mpi"
    }
    fn exchange_raw(
        &self,
        tag: u32,
        sends: Vec<(usize, Buf)>,
        recvs: &[(usize, Kind)],
    ) -> Vec<Buf> {
        let t = tag_of(tag);
        let world = &self.world;
        mpi::request::scope(|scope| {
            let mut reqs = Vec::with_capacity(sends.len());
            for (d, b) in &sends {
                let proc = world.process_at_rank(*d as i32);
                let r = match b {
                    Buf::F32(v) => AnyReq::F32(proc.immediate_send_with_tag(scope, &v[..], t)),
                    Buf::F64(v) => AnyReq::F64(proc.immediate_send_with_tag(scope, &v[..], t)),
                    Buf::U32(v) => AnyReq::U32(proc.immediate_send_with_tag(scope, &v[..], t)),
                    Buf::U64(v) => AnyReq::U64(proc.immediate_send_with_tag(scope, &v[..], t)),
                    Buf::U8(v) => AnyReq::U8(proc.immediate_send_with_tag(scope, &v[..], t)),
                };
                reqs.push(r);
            }
            let got: Vec<Buf> = recvs
                .iter()
                .map(|&(s, k)| {
                    let m = self.probe(s, t);
                    match k {
                        Kind::F32 => Buf::F32(m.matched_receive_vec().0),
                        Kind::F64 => Buf::F64(m.matched_receive_vec().0),
                        Kind::U32 => Buf::U32(m.matched_receive_vec().0),
                        Kind::U64 => Buf::U64(m.matched_receive_vec().0),
                        Kind::U8 => Buf::U8(m.matched_receive_vec().0),
                    }
                })
                .collect();
            for (mut r, (d, _)) in reqs.into_iter().zip(&sends) {
                let mut poll = Poll::new(self);
                while let Err(pending) = r.test() {
                    r = pending;
                    poll.tick(|| format!("a message to rank {d} was not taken"));
                }
            }
            got
        })
    }
    fn barrier(&self) {
        self.world.barrier();
    }
    fn allreduce_native_f32(&self, data: &mut [f32]) {
        self.traffic.add_opaque(data.len() * 4);
        if self.size() > 1 {
            allreduce_sum_in_place(&self.world, data);
        }
    }
    fn allreduce_native_f64(&self, data: &mut [f64]) {
        self.traffic.add_opaque(data.len() * 8);
        if self.size() > 1 {
            allreduce_sum_in_place(&self.world, data);
        }
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
