//! A `Comm` over NCCL (cudarc's `nccl`), one process per GPU under mpirun. Built with the
//! `cuda` feature; **never run**: no GPU was available where it was written (docs/GPU.md
//! §7). It compiles and is clippy-clean; `tests/nccl.rs` runs the Comm conformance suite over
//! it on a GPU node (`pipelines/gpu-check.sh`).
//!
//! * The world: an existing host `Comm` (MPI's) broadcasts NCCL's 128-byte unique id from
//!   rank 0; each rank opens its GPU (by local rank, `OMPI_COMM_WORLD_LOCAL_RANK`, unless
//!   given) and joins with `ncclCommInitRank`.
//! * `exchange_raw`: host buffers (this backend moves no device memory yet) are copied to
//!   the GPU, then two grouped rounds: every message's byte length (a `u64`), then the
//!   payloads, as `ncclSend`/`ncclRecv` in the order posted (NCCL matches the calls to one
//!   peer in order, which keeps the Comm contract of ordered messages per pair); messages to
//!   oneself are copied on the host. Empty payloads are not sent (both sides know the
//!   length by then).
//! * `allreduce_native_*`: `ncclAllReduce` (sum) in place; `barrier`: a one-element
//!   allreduce and a stream synchronisation.
//! * Traffic: counted by `Comm::exchange` from the buffers, as for MPI, so the counters of a
//!   run are the same on both backends.
//! * The watchdog: every wait for NCCL's work polls the stream (`cuStreamQuery`) instead of
//!   blocking on it, under the MPI backend's limit (`GRADKIT_COMM_TIMEOUT`, default 1800 s,
//!   0 = forever). Past it the communicator is aborted (`ncclCommAbort`, by dropping
//!   cudarc's `Comm`), which releases the stuck kernels, and the call fails with
//!   [`CommError::Timeout`] naming the peer waited on; the tool then ends the job as for
//!   MPI. Later calls fail at once. Not covered: an `ncclGroupEnd` that blocks while NCCL
//!   sets up its connections (NCCL's blocking mode).
//! * Not done: device-resident `Buf`s.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{cuStreamQuery, CUresult};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::{self, ReduceOp};
use gradkit_comm::{
    check_exchange, Backend, Buf, Comm, CommError, CommExt, Kind, Traffic, Waiting,
};

/// This backend's name and capabilities.
pub const BACKEND: Backend = Backend::new("nccl");

type CommResult<T> = Result<T, CommError>;

fn err(what: impl std::fmt::Display) -> CommError {
    CommError::Transport {
        backend: BACKEND.name(),
        message: what.to_string(),
    }
}

/// A rank of an NCCL world.
pub struct NcclComm {
    /// `None` once the watchdog has aborted it.
    comm: RefCell<Option<nccl::Comm>>,
    rank: usize,
    size: usize,
    stream: Arc<CudaStream>,
    traffic: Traffic,
    /// How long a wait for NCCL's work may take (`GRADKIT_COMM_TIMEOUT`; `None`: forever).
    timeout: Option<Duration>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclComm {{ rank: {}, size: {} }}", self.rank, self.size)
    }
}

/// The local rank mpirun gives (Open MPI, then MPICH/Slurm names), else 0.
pub fn local_rank() -> u32 {
    [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse().ok())
    .unwrap_or(0)
}

impl NcclComm {
    /// Joins the NCCL world of `host`'s ranks on GPU `ordinal` (every rank calls it
    /// together). The libraries are checked first (`probe`, `probe_nccl`), so a node without
    /// NCCL gets the one-line error, not cudarc's panic.
    pub fn over(host: &dyn Comm, ordinal: u32) -> anyhow::Result<NcclComm> {
        let info = crate::probe()?;
        crate::probe_nccl()?;
        if ordinal as usize >= info.count() {
            return Err(crate::DeviceError::NoSuchDevice {
                ordinal,
                count: info.count(),
            }
            .into());
        }
        let (rank, size) = (host.rank(), host.size());
        let ctx = CudaContext::new(ordinal as usize)?;
        let stream = ctx.default_stream();
        let id = if rank == 0 {
            let id = nccl::Id::new().map_err(|e| anyhow::anyhow!("ncclGetUniqueId: {e:?}"))?;
            Some(id.internal().iter().map(|&c| c as u8).collect::<Vec<u8>>())
        } else {
            None
        };
        let bytes = host.broadcast::<u8>(0, id)?;
        let mut internal = [0 as std::ffi::c_char; 128];
        anyhow::ensure!(
            bytes.len() == internal.len(),
            "the NCCL id from rank 0 has {} bytes, not 128",
            bytes.len()
        );
        for (d, s) in internal.iter_mut().zip(&bytes) {
            *d = *s as std::ffi::c_char;
        }
        let comm = nccl::Comm::from_rank(stream.clone(), rank, size, nccl::Id::uninit(internal))
            .map_err(|e| anyhow::anyhow!("ncclCommInitRank (rank {rank} of {size}): {e:?}"))?;
        Ok(NcclComm {
            comm: RefCell::new(Some(comm)),
            rank,
            size,
            stream,
            traffic: Traffic::default(),
            timeout: gradkit_comm::mpi::comm_timeout(),
        })
    }

    /// The communicator, unless the watchdog aborted it.
    fn with_comm<T>(&self, f: impl FnOnce(&nccl::Comm) -> CommResult<T>) -> CommResult<T> {
        match self.comm.borrow().as_ref() {
            Some(c) => f(c),
            None => Err(err(
                "the NCCL communicator was aborted after a timeout (GRADKIT_COMM_TIMEOUT)",
            )),
        }
    }

    /// Waits for everything enqueued on the stream, polling under the watchdog: past the
    /// limit the communicator is aborted (`ncclCommAbort`) and the wait fails with a timeout
    /// naming `peer`.
    fn wait(&self, peer: usize) -> CommResult<()> {
        let start = Instant::now();
        let mut polls = 0u64;
        loop {
            // SAFETY: the stream is alive (held by self) and the call only reads its state.
            match unsafe { cuStreamQuery(self.stream.cu_stream()) } {
                CUresult::CUDA_SUCCESS => return Ok(()),
                CUresult::CUDA_ERROR_NOT_READY => {}
                e => return Err(err(format!("waiting for NCCL: {e:?}"))),
            }
            polls += 1;
            if polls < 1024 {
                std::hint::spin_loop();
                continue;
            }
            std::thread::sleep(Duration::from_micros(50));
            if let Some(limit) = self.timeout.filter(|l| start.elapsed() > *l) {
                self.abort();
                return Err(CommError::Timeout {
                    peer,
                    waiting: Waiting::Recv,
                    secs: limit.as_secs(),
                });
            }
        }
    }

    /// `ncclCommAbort` (cudarc's `Comm` aborts when dropped): ends this rank's NCCL work,
    /// stuck kernels included. A failing abort (cudarc panics on it) is reported, not raised.
    fn abort(&self) {
        if let Some(c) = self.comm.borrow_mut().take() {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(c)));
            if r.is_err() {
                eprintln!("warning: ncclCommAbort failed after a timeout");
            }
        }
    }

    /// The peer a collective waits on: the next rank.
    fn next_peer(&self) -> usize {
        (self.rank + 1) % self.size.max(1)
    }

    fn up(&self, bytes: &[u8]) -> CommResult<CudaSlice<u8>> {
        self.stream.clone_htod(bytes).map_err(err)
    }

    fn down(&self, d: &CudaSlice<u8>) -> CommResult<Vec<u8>> {
        self.stream.clone_dtoh(d).map_err(err)
    }

    fn allreduce<T>(&self, data: &mut [T]) -> CommResult<()>
    where
        T: nccl::NcclType + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits,
    {
        if data.is_empty() {
            return Ok(());
        }
        let mut d = self.stream.clone_htod(&*data).map_err(err)?;
        self.with_comm(|c| {
            c.all_reduce_in_place(&mut d, &ReduceOp::Sum)
                .map_err(|e| err(format!("ncclAllReduce: {e:?}")))
        })?;
        // Polled before the copy down, which would block on a stuck allreduce.
        self.wait(self.next_peer())?;
        self.stream.memcpy_dtoh(&d, data).map_err(err)?;
        self.wait(self.next_peer())
    }
}

/// The peer an exchange waits on, for the watchdog's message: the first it receives from,
/// else the first it sends to.
fn waited_on(from: &[(usize, usize)], out_peer: &[usize], me: usize) -> usize {
    from.first()
        .map(|f| f.1)
        .or(out_peer.first().copied())
        .unwrap_or(me)
}

impl NcclComm {
    /// Round 1 of [`Comm::exchange_raw`]: every message's length to its receiver (grouped
    /// send/recv); the lengths of the messages from `from`, in order.
    fn exchange_lengths(
        &self,
        out_bytes: &[Vec<u8>],
        out_peer: &[usize],
        from: &[(usize, usize)],
    ) -> CommResult<Vec<usize>> {
        let send_lens: Vec<CudaSlice<u64>> = out_bytes
            .iter()
            .map(|v| self.stream.clone_htod(&[v.len() as u64]).map_err(err))
            .collect::<CommResult<_>>()?;
        let mut recv_lens: Vec<CudaSlice<u64>> = from
            .iter()
            .map(|_| self.stream.alloc_zeros::<u64>(1).map_err(err))
            .collect::<CommResult<_>>()?;
        self.with_comm(|c| {
            let mut g = c.group();
            for (s, &d) in send_lens.iter().zip(out_peer) {
                g.send(s.as_view(), d as i32)
                    .map_err(|e| err(format!("ncclSend: {e:?}")))?;
            }
            for (r, &(_, s)) in recv_lens.iter_mut().zip(from) {
                g.recv(r.as_view_mut(), s as i32)
                    .map_err(|e| err(format!("ncclRecv: {e:?}")))?;
            }
            Ok(())
        })?;
        self.wait(waited_on(from, out_peer, self.rank))?;
        recv_lens
            .iter()
            .map(|r| Ok(self.stream.clone_dtoh(r).map_err(err)?[0] as usize))
            .collect()
    }

    /// Round 2 of [`Comm::exchange_raw`]: the payloads (empty ones are not sent); what came
    /// from `from`, on the device.
    fn exchange_payloads(
        &self,
        out_bytes: &[Vec<u8>],
        out_peer: &[usize],
        from: &[(usize, usize)],
        lens: &[usize],
    ) -> CommResult<Vec<Option<CudaSlice<u8>>>> {
        let send_data: Vec<Option<CudaSlice<u8>>> = out_bytes
            .iter()
            .map(|v| (!v.is_empty()).then(|| self.up(v)).transpose())
            .collect::<CommResult<_>>()?;
        let mut recv_data: Vec<Option<CudaSlice<u8>>> = lens
            .iter()
            .map(|&n| {
                (n > 0)
                    .then(|| self.stream.alloc_zeros::<u8>(n).map_err(err))
                    .transpose()
            })
            .collect::<CommResult<_>>()?;
        self.with_comm(|c| {
            let mut g = c.group();
            for (s, &d) in send_data.iter().zip(out_peer) {
                if let Some(s) = s {
                    g.send(s.as_view(), d as i32)
                        .map_err(|e| err(format!("ncclSend: {e:?}")))?;
                }
            }
            for (r, &(_, s)) in recv_data.iter_mut().zip(from) {
                if let Some(r) = r {
                    g.recv(r.as_view_mut(), s as i32)
                        .map_err(|e| err(format!("ncclRecv: {e:?}")))?;
                }
            }
            Ok(())
        })?;
        self.wait(waited_on(from, out_peer, self.rank))?;
        Ok(recv_data)
    }
}

impl Comm for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn backend(&self) -> Backend {
        BACKEND
    }

    fn exchange_raw(
        &self,
        _tag: u32,
        sends: Vec<(usize, Buf)>,
        recvs: &[(usize, Kind)],
    ) -> CommResult<Vec<Buf>> {
        check_exchange(BACKEND, self.size(), &sends, recvs)?;
        let me = self.rank();
        // Messages to oneself, in order, on the host.
        let mut own: std::collections::VecDeque<Vec<u8>> = Default::default();
        let mut out_bytes = Vec::new();
        let mut out_peer = Vec::new();
        for (d, b) in &sends {
            let v = b
                .host_bytes()
                .ok_or_else(|| err("a send buffer not in host memory"))?
                .to_vec();
            if *d == me {
                own.push_back(v);
            } else {
                out_bytes.push(v);
                out_peer.push(*d);
            }
        }
        let from: Vec<(usize, usize)> = recvs
            .iter()
            .enumerate()
            .filter(|(_, (s, _))| *s != me)
            .map(|(i, (s, _))| (i, *s))
            .collect();
        let lens = self.exchange_lengths(&out_bytes, &out_peer, &from)?;
        let recv_data = self.exchange_payloads(&out_bytes, &out_peer, &from, &lens)?;
        let mut got: Vec<Option<Buf>> = (0..recvs.len()).map(|_| None).collect();
        for ((i, _), d) in from.iter().zip(&recv_data) {
            let bytes = match d {
                Some(d) => self.down(d)?,
                None => Vec::new(),
            };
            got[*i] = Some(Buf::from_host_bytes(recvs[*i].1, &bytes)?);
        }
        for (i, (s, k)) in recvs.iter().enumerate() {
            if *s == me {
                let v = own
                    .pop_front()
                    .ok_or_else(|| err("a receive from oneself with no message sent"))?;
                got[i] = Some(Buf::from_host_bytes(*k, &v)?);
            }
        }
        got.into_iter()
            .map(|b| b.ok_or_else(|| err("a receive was not completed")))
            .collect()
    }

    fn barrier(&self) -> CommResult<()> {
        self.allreduce(&mut [0f32])
    }

    // Counted as MPI counts its own allreduce (opaque bytes), so both backends' counters
    // agree for the same run.
    fn allreduce_native_f32(&self, data: &mut [f32]) -> CommResult<()> {
        self.traffic.add_opaque(data.len() * 4);
        self.allreduce(data)
    }

    fn allreduce_native_f64(&self, data: &mut [f64]) -> CommResult<()> {
        self.traffic.add_opaque(data.len() * 8);
        self.allreduce(data)
    }

    fn traffic(&self) -> &Traffic {
        &self.traffic
    }
}
