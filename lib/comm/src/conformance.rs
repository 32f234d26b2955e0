//! The Comm conformance suite: what every backend must do, checked on every rank.
//!
//! [`run`] is a collective: every rank of a world calls it with the same [`Options`] (inside
//! `World::run`, `run_local`, or a backend's own launcher). It exercises every primitive —
//! `exchange_raw` and `exchange` (with their byte and message counts), `send`/`recv`,
//! `sendrecv`, `allgatherv`, `allgather_one`, `alltoallv`, `broadcast` from every root,
//! `barrier`, the native allreduces, `allreduce_small_f64` and `allreduce_max_f64` — for
//! every element kind, with empty buffers, uneven sizes, a large message, messages to
//! oneself, errors every rank must see alike (a rank out of range, a wrong block count,
//! unequal reduction lengths) and device-located buffers on a backend that moves host
//! memory only (refused with [`CommError::UnsupportedLocation`], nothing posted).
//!
//! Expected results are computed independently of the backend: every payload is a pure
//! function of (sender, receiver, index, salt), so each rank knows what it must receive,
//! and every count is derived from the sizes the suite chose. The first mismatch is
//! returned as an error that names the check and the rank.
//!
//! Run by `lib/comm/tests/comm/conformance.rs` on Local (P = 1..5) and under `mpirun -np 1..4`
//! (`examples/conformance.rs`). A new backend (NCCL, a shaped-TCP cluster) runs it too.

use std::any::Any;
use std::sync::Arc;

use anyhow::{bail, ensure, Context, Result};

use crate::{Buf, Comm, CommError, CommExt, DeviceMemory, Elem, Kind, Location, PhaseCounts};

/// What the suite may spend.
#[derive(Clone, Debug)]
pub struct Options {
    /// Elements (u32) of the large message each rank sends (and receives) once.
    pub large_elems: usize,
}

impl Default for Options {
    /// 4 Mi elements: 16 MiB per rank.
    fn default() -> Self {
        Options {
            large_elems: 4 << 20,
        }
    }
}

/// What the suite checked on this rank.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Named checks passed, in order.
    pub checks: Vec<&'static str>,
    /// Checks skipped, with why (none on the Local and MPI backends).
    pub skipped: Vec<String>,
}

/// Runs every check on this rank (a collective: every rank calls it).
pub fn run(comm: &dyn Comm, opts: &Options) -> Result<Report> {
    let mut rep = Report::default();
    let (p, r) = (comm.size(), comm.rank());
    let ctx = |name: &'static str| format!("conformance check `{name}` on rank {r} of {p}");
    macro_rules! check {
        ($name:literal, $e:expr) => {{
            $e.with_context(|| ctx($name))?;
            rep.checks.push($name);
        }};
    }
    check!("identity", identity(comm));
    check!("exchange_raw_every_kind", exchange_every_kind(comm, false));
    check!("exchange_counts_traffic", exchange_every_kind(comm, true));
    check!("exchange_keeps_order", exchange_keeps_order(comm));
    check!("exchange_errors", exchange_errors(comm));
    check!("device_buffers", device_buffers(comm, &mut rep.skipped));
    check!("send_recv_chain", send_recv_chain(comm));
    check!("typed_f32", typed::<f32>(comm));
    check!("typed_f64", typed::<f64>(comm));
    check!("typed_u32", typed::<u32>(comm));
    check!("typed_u64", typed::<u64>(comm));
    check!("typed_u8", typed::<u8>(comm));
    check!("collective_counts", collective_counts(comm));
    check!("collective_errors", collective_errors(comm));
    check!("barrier", barrier(comm));
    check!("allreduce_native", allreduce_native(comm));
    check!("allreduce_small", allreduce_small(comm));
    check!("large_message", large_message(comm, opts.large_elems));
    Ok(rep)
}

// ---------------------------------------------------------------------------------------
// Payloads: pure functions of (sender, receiver, index, salt).

fn mix(src: usize, dst: usize, i: usize, salt: u64) -> u64 {
    let mut x = (src as u64) << 40 ^ (dst as u64) << 20 ^ i as u64 ^ salt.rotate_left(17);
    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    x.wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ (x >> 32)
}

/// An element kind the suite can generate exact values of.
trait Gen: Elem + PartialEq {
    fn gen(x: u64) -> Self;
}
impl Gen for f32 {
    fn gen(x: u64) -> Self {
        // Integers below 2^24 and halves: exact in f32, and negative values too.
        ((x >> 40) as i32 - (1 << 23)) as f32 * 0.5
    }
}
impl Gen for f64 {
    fn gen(x: u64) -> Self {
        ((x >> 11) as i64 - (1 << 52)) as f64 * 0.25
    }
}
impl Gen for u32 {
    fn gen(x: u64) -> Self {
        (x >> 32) as u32
    }
}
impl Gen for u64 {
    fn gen(x: u64) -> Self {
        x
    }
}
impl Gen for u8 {
    fn gen(x: u64) -> Self {
        (x >> 56) as u8
    }
}

fn payload<T: Gen>(src: usize, dst: usize, len: usize, salt: u64) -> Vec<T> {
    (0..len).map(|i| T::gen(mix(src, dst, i, salt))).collect()
}

/// `payload` of a run-time kind, as a host buffer.
fn payload_buf(kind: Kind, src: usize, dst: usize, len: usize, salt: u64) -> Buf {
    match kind {
        Kind::F32 => Buf::from_vec(payload::<f32>(src, dst, len, salt)),
        Kind::F64 => Buf::from_vec(payload::<f64>(src, dst, len, salt)),
        Kind::U32 => Buf::from_vec(payload::<u32>(src, dst, len, salt)),
        Kind::U64 => Buf::from_vec(payload::<u64>(src, dst, len, salt)),
        Kind::U8 => Buf::from_vec(payload::<u8>(src, dst, len, salt)),
    }
}

fn kind_index(k: Kind) -> usize {
    Kind::ALL.iter().position(|&x| x == k).unwrap_or(0)
}

/// Uneven lengths, zero included: 0..=6 elements, depending on both ends and the kind.
fn small_len(src: usize, dst: usize, k: Kind) -> usize {
    (src * 5 + dst * 3 + kind_index(k) * 2) % 7
}

fn expect_eq<T: PartialEq + std::fmt::Debug>(
    got: &T,
    want: &T,
    what: impl Fn() -> String,
) -> Result<()> {
    if got != want {
        let (g, w) = (format!("{got:?}"), format!("{want:?}"));
        let cut = |s: &str| s.chars().take(200).collect::<String>();
        bail!("{}: got {}, want {}", what(), cut(&g), cut(&w));
    }
    Ok(())
}

/// The counts of `phase` on this rank.
fn counts(comm: &dyn Comm, phase: &str) -> PhaseCounts {
    comm.traffic()
        .snapshot()
        .get(phase)
        .copied()
        .unwrap_or_default()
}

fn delta(a: PhaseCounts, b: PhaseCounts) -> (u64, u64, u64, u64) {
    (
        b.bytes_sent - a.bytes_sent,
        b.bytes_recv - a.bytes_recv,
        b.msgs_sent - a.msgs_sent,
        b.msgs_recv - a.msgs_recv,
    )
}

// ---------------------------------------------------------------------------------------
// The checks.

fn identity(comm: &dyn Comm) -> Result<()> {
    let (p, r) = (comm.size(), comm.rank());
    ensure!(p >= 1 && r < p, "rank {r} of a world of {p}");
    ensure!(
        !comm.backend().name().is_empty(),
        "a backend without a name"
    );
    ensure!(
        comm.backend().moves(Location::Host),
        "every backend moves host memory"
    );
    let ranks = comm.allgather_one(r as u64)?;
    expect_eq(&ranks, &(0..p as u64).collect(), || {
        "allgather_one of the ranks".into()
    })
}

/// Every rank sends every rank (itself included) one buffer of every kind with uneven,
/// possibly empty lengths, in one bucket; receives in a rotated order. With `counted`, the
/// exchange goes through `Comm::exchange` and the counters must show exactly the messages
/// to and from other ranks; without, through `exchange_raw`, which counts nothing.
fn exchange_every_kind(comm: &dyn Comm, counted: bool) -> Result<()> {
    let (p, r) = (comm.size(), comm.rank());
    let salt = if counted { 11 } else { 10 };
    let mut sends = Vec::new();
    for d in 0..p {
        for k in Kind::ALL {
            sends.push((d, payload_buf(k, r, d, small_len(r, d, k), salt)));
        }
    }
    let srcs: Vec<usize> = (0..p).map(|s| (r + p - s) % p).collect();
    let recvs: Vec<(usize, Kind)> = srcs
        .iter()
        .flat_map(|&s| Kind::ALL.map(|k| (s, k)))
        .collect();
    let phase = if counted {
        "conformance/exchange"
    } else {
        "conformance/raw"
    };
    let _g = comm.phase(phase);
    let before = counts(comm, phase);
    let got = if counted {
        comm.exchange(3, sends, &recvs)?
    } else {
        comm.exchange_raw(3, sends, &recvs)?
    };
    let after = counts(comm, phase);
    ensure!(
        got.len() == recvs.len(),
        "{} buffers for {} receives",
        got.len(),
        recvs.len()
    );
    for (&(s, k), b) in recvs.iter().zip(&got) {
        let want = payload_buf(k, s, r, small_len(s, r, k), salt);
        ensure!(
            b.location() == Location::Host,
            "a received buffer is not in host memory"
        );
        expect_eq(b, &want, || format!("{k:?} message from rank {s}"))?;
    }
    let want = if counted {
        let (mut bs, mut br) = (0u64, 0u64);
        for q in (0..p).filter(|&q| q != r) {
            for k in Kind::ALL {
                bs += (small_len(r, q, k) * k.bytes()) as u64;
                br += (small_len(q, r, k) * k.bytes()) as u64;
            }
        }
        let msgs = ((p - 1) * Kind::ALL.len()) as u64;
        (bs, br, msgs, msgs)
    } else {
        (0, 0, 0, 0)
    };
    expect_eq(&delta(before, after), &want, || {
        "traffic (bytes sent, bytes received, messages sent, messages received)".into()
    })
}

/// Several messages between one pair with one tag arrive in the order posted, within a
/// bucket and across buckets; an empty bucket is a no-op.
fn exchange_keeps_order(comm: &dyn Comm) -> Result<()> {
    let (p, r) = (comm.size(), comm.rank());
    let (right, left) = ((r + 1) % p, (r + p - 1) % p);
    let sends: Vec<(usize, Buf)> = (0..4)
        .map(|j| {
            (
                right,
                Buf::from_vec(payload::<u32>(r, right, j + 1, 20 + j as u64)),
            )
        })
        .collect();
    let recvs = [(left, Kind::U32); 4];
    let got = comm.exchange(4, sends, &recvs)?;
    for (j, b) in got.iter().enumerate() {
        let want = Buf::from_vec(payload::<u32>(left, r, j + 1, 20 + j as u64));
        expect_eq(b, &want, || format!("message {j} of 4 from rank {left}"))?;
    }
    // Order holds across buckets: two buckets in a row on one tag, one message each way
    // (the second empty).
    for (j, n) in [(0u64, 3usize), (1, 0)] {
        let got = comm.exchange(
            5,
            vec![(right, Buf::from_vec(payload::<u8>(r, right, n, 30 + j)))],
            &[(left, Kind::U8)],
        )?;
        expect_eq(
            &got,
            &vec![Buf::from_vec(payload::<u8>(left, r, n, 30 + j))],
            || format!("bucket {j} of two"),
        )?;
    }
    ensure!(
        comm.exchange(6, vec![], &[])?.is_empty(),
        "an empty bucket returned buffers"
    );
    Ok(())
}

/// A rank outside the world is refused on every rank, before anything is posted.
fn exchange_errors(comm: &dyn Comm) -> Result<()> {
    let p = comm.size();
    let r = comm.exchange(7, vec![(p, Buf::from_vec(vec![1u32]))], &[]);
    expect_eq(&r, &Err(CommError::NoSuchRank { rank: p, size: p }), || {
        "a send to rank P".into()
    })?;
    let r = comm.exchange(7, vec![], &[(p + 3, Kind::F32)]);
    expect_eq(
        &r,
        &Err(CommError::NoSuchRank {
            rank: p + 3,
            size: p,
        }),
        || "a receive from rank P+3".into(),
    )?;
    // Nothing of the refused buckets may be in flight: the next message on tag 7 is this one.
    let (right, left) = ((comm.rank() + 1) % p, (comm.rank() + p - 1) % p);
    let got = comm.sendrecv_tagged(7, right, payload::<u64>(comm.rank(), right, 2, 40), left)?;
    expect_eq(&got, &payload::<u64>(left, comm.rank(), 2, 40), || {
        "the message after refused buckets".into()
    })
}

/// Host memory standing in for an accelerator's, for the refusal check.
#[derive(Debug)]
struct FakeDevice {
    ordinal: usize,
    bytes: Vec<u8>,
}

impl DeviceMemory for FakeDevice {
    fn ordinal(&self) -> usize {
        self.ordinal
    }
    fn size_bytes(&self) -> usize {
        self.bytes.len()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A host-only backend refuses device buffers with an error naming it, posts nothing of
/// the bucket (not even its host buffers), and keeps working.
fn device_buffers(comm: &dyn Comm, skipped: &mut Vec<String>) -> Result<()> {
    let (p, r) = (comm.size(), comm.rank());
    let backend = comm.backend();
    let at = Location::Device(1);
    if backend.moves(at) {
        skipped.push(format!(
            "device_buffers: the {backend} backend moves device memory; its own tests must \
             check transfers with its allocator"
        ));
        return Ok(());
    }
    let mem = Arc::new(FakeDevice {
        ordinal: 1,
        bytes: vec![0; 64],
    });
    let dev = Buf::device(Kind::F32, 16, mem)?;
    ensure!(dev.location() == at, "location of a device buffer");
    let right = (r + 1) % p;
    let left = (r + p - 1) % p;
    // The host buffer comes first: a backend that posts before checking would send it.
    let sends = vec![(right, Buf::from_vec(vec![99u32; 3])), (right, dev.clone())];
    let got = comm.exchange(8, sends, &[]);
    let want = CommError::UnsupportedLocation {
        backend: backend.name(),
        location: at,
    };
    expect_eq(&got, &Err(want), || "a bucket with a device buffer".into())?;
    let msg = got.unwrap_err().to_string();
    ensure!(
        msg.contains(backend.name()),
        "the error does not name the backend: {msg}"
    );
    expect_eq(
        &comm.exchange_raw(8, vec![(r, dev)], &[]),
        &Err(CommError::UnsupportedLocation {
            backend: backend.name(),
            location: at,
        }),
        || "exchange_raw of a device buffer to oneself".into(),
    )?;
    let got = comm.sendrecv_tagged(8, right, vec![r as u32], left)?;
    expect_eq(&got, &vec![left as u32], || {
        "the message after a refused device bucket".into()
    })
}

/// Blocking `send` and `recv` along a chain 0 → 1 → … → P−1 (each rank receives before it
/// sends, so no send waits on an unposted receive), then back from P−1 to 0.
fn send_recv_chain(comm: &dyn Comm) -> Result<()> {
    let (p, r) = (comm.size(), comm.rank());
    let mut acc: Vec<u64> = if r == 0 {
        Vec::new()
    } else {
        comm.recv(r - 1)?
    };
    expect_eq(&acc, &(0..r as u64).map(|q| q * q + 1).collect(), || {
        "the chain so far".into()
    })?;
    acc.push((r * r + 1) as u64);
    if r + 1 < p {
        comm.send(r + 1, acc)?;
    } else if p > 1 {
        comm.send(0, acc)?;
    }
    if r == 0 && p > 1 {
        let all: Vec<u64> = comm.recv(p - 1)?;
        expect_eq(&all, &(0..p as u64).map(|q| q * q + 1).collect(), || {
            "the whole chain back at rank 0".into()
        })?;
    }
    // An empty message, and a typed message to oneself (via sendrecv, one bucket).
    if p > 1 {
        if r == 0 {
            comm.send::<f64>(1, Vec::new())?;
        } else if r == 1 {
            ensure!(
                comm.recv::<f64>(0)?.is_empty(),
                "an empty message arrived non-empty"
            );
        }
    }
    let me = comm.sendrecv(r, payload::<f32>(r, r, 5, 50), r)?;
    expect_eq(&me, &payload::<f32>(r, r, 5, 50), || {
        "sendrecv to oneself".into()
    })
}

/// sendrecv, allgatherv, allgather_one, alltoallv and broadcast for one element type, with
/// uneven and empty blocks.
fn typed<T: Gen>(comm: &dyn Comm) -> Result<()> {
    let (p, r) = (comm.size(), comm.rank());
    let k = T::KIND;
    // sendrecv at every shift.
    for s in 0..p {
        let (dest, src) = ((r + s) % p, (r + p - s) % p);
        let got = comm.sendrecv(dest, payload::<T>(r, dest, small_len(r, dest, k), 60), src)?;
        expect_eq(
            &got,
            &payload::<T>(src, r, small_len(src, r, k), 60),
            || format!("sendrecv shift {s}"),
        )?;
    }
    // allgatherv: uneven blocks, some empty; then every block empty.
    let len = |q: usize| (q * 3 + kind_index(k)) % 5;
    let all = comm.allgatherv(payload::<T>(r, 0, len(r), 61))?;
    ensure!(all.len() == p, "allgatherv returned {} blocks", all.len());
    for (q, b) in all.iter().enumerate() {
        expect_eq(b, &payload::<T>(q, 0, len(q), 61), || {
            format!("allgatherv block {q}")
        })?;
    }
    let all = comm.allgatherv(Vec::<T>::new())?;
    ensure!(
        all.len() == p && all.iter().all(Vec::is_empty),
        "allgatherv of empty blocks"
    );
    // allgather_one.
    let ones = comm.allgather_one(T::gen(mix(r, 0, 0, 62)))?;
    let want: Vec<T> = (0..p).map(|q| T::gen(mix(q, 0, 0, 62))).collect();
    expect_eq(&ones, &want, || "allgather_one".into())?;
    // alltoallv: block r→d has small_len(r, d) elements (self block included).
    let sends: Vec<Vec<T>> = (0..p)
        .map(|d| payload::<T>(r, d, small_len(r, d, k), 63))
        .collect();
    let got = comm.alltoallv(sends)?;
    ensure!(got.len() == p, "alltoallv returned {} blocks", got.len());
    for (s, b) in got.iter().enumerate() {
        expect_eq(b, &payload::<T>(s, r, small_len(s, r, k), 63), || {
            format!("alltoallv block from rank {s}")
        })?;
    }
    // broadcast from every root; the root with (root % 3 == 2) broadcasts nothing.
    for root in 0..p {
        let n = if root % 3 == 2 { 0 } else { root + 2 };
        let data = (r == root).then(|| payload::<T>(root, 0, n, 64));
        let got = comm.broadcast(root, data)?;
        expect_eq(&got, &payload::<T>(root, 0, n, 64), || {
            format!("broadcast from root {root}")
        })?;
    }
    Ok(())
}

/// The collectives move exactly their algorithm's bytes and messages.
fn collective_counts(comm: &dyn Comm) -> Result<()> {
    let (p, r) = (comm.size(), comm.rank());
    let len = |q: usize| q % 3 + 1;
    let phase = "conformance/collectives";
    let _g = comm.phase(phase);
    // Ring allgatherv: sends every block but rank r+1's, receives every block but its own,
    // in P−1 messages each way.
    let a = counts(comm, phase);
    comm.allgatherv(vec![0u32; len(r)])?;
    let b = counts(comm, phase);
    let total: u64 = (0..p).map(|q| len(q) as u64 * 4).sum();
    let want = if p == 1 {
        (0, 0, 0, 0)
    } else {
        (
            total - len((r + 1) % p) as u64 * 4,
            total - len(r) as u64 * 4,
            p as u64 - 1,
            p as u64 - 1,
        )
    };
    expect_eq(&delta(a, b), &want, || "allgatherv traffic".into())?;
    // alltoallv: one message to and from every other rank, its own block kept.
    let blk = |s: usize, d: usize| (s + 2 * d) % 4;
    let a = counts(comm, phase);
    comm.alltoallv((0..p).map(|d| vec![0u64; blk(r, d)]).collect())?;
    let b = counts(comm, phase);
    let others = (0..p).filter(|&q| q != r);
    let sent: u64 = others.clone().map(|d| blk(r, d) as u64 * 8).sum();
    let recv: u64 = others.map(|s| blk(s, r) as u64 * 8).sum();
    let m = p as u64 - 1;
    expect_eq(&delta(a, b), &(sent, recv, m, m), || {
        "alltoallv traffic".into()
    })?;
    // Binomial broadcast from root 0 of 6 bytes: every rank but the root receives once;
    // all P−1 messages are sent in total.
    let a = counts(comm, phase);
    comm.broadcast(0, (r == 0).then(|| vec![7u8; 6]))?;
    let b = counts(comm, phase);
    let d = delta(a, b);
    let want_recv = if r == 0 { (0, 0) } else { (6, 1) };
    expect_eq(&(d.1, d.3), &want_recv, || "broadcast received".into())?;
    let sent = comm.allreduce_small_f64(&[d.0 as f64, d.2 as f64])?;
    expect_eq(&sent, &vec![6.0 * (p - 1) as f64, (p - 1) as f64], || {
        "broadcast sent, summed over ranks".into()
    })
}

/// Misuse every rank makes alike is an error on every rank, with nothing sent.
fn collective_errors(comm: &dyn Comm) -> Result<()> {
    let p = comm.size();
    let r = comm.alltoallv(vec![vec![1u8]; p + 1]);
    ensure!(
        matches!(r, Err(CommError::SizeMismatch(_))),
        "alltoallv with P+1 blocks: {r:?}"
    );
    let r = comm.broadcast(p, Some(vec![1u8]));
    expect_eq(&r, &Err(CommError::NoSuchRank { rank: p, size: p }), || {
        "broadcast from rank P".into()
    })?;
    // Unequal reduction lengths (rank 0 reduces one value more) fail on every rank.
    if p > 1 {
        let vals = vec![1.0; if comm.rank() == 0 { 3 } else { 2 }];
        let r = comm.allreduce_small_f64(&vals);
        ensure!(
            matches!(r, Err(CommError::SizeMismatch(_))),
            "allreduce_small_f64 of unequal lengths: {r:?}"
        );
    }
    Ok(())
}

/// Barriers, and a barrier between two exchanges on different tags.
fn barrier(comm: &dyn Comm) -> Result<()> {
    for _ in 0..3 {
        comm.barrier()?;
    }
    let (p, r) = (comm.size(), comm.rank());
    let got = comm.sendrecv_tagged(9, (r + 1) % p, vec![r as u32], (r + p - 1) % p)?;
    comm.barrier()?;
    expect_eq(&got, &vec![((r + p - 1) % p) as u32], || {
        "a message around a barrier".into()
    })
}

/// The native allreduces sum exactly-representable values (so any summation order gives
/// the same result), for lengths 0, 1, uneven and a few MiB; the counters record the bytes.
fn allreduce_native(comm: &dyn Comm) -> Result<()> {
    let (p, r) = (comm.size(), comm.rank());
    let phase = "conformance/native";
    let _g = comm.phase(phase);
    for n in [0usize, 1, 37, 1 << 20] {
        let v = |q: usize, i: usize| ((q * 31 + i * 7) % 64) as i64 - 32;
        let mut x32: Vec<f32> = (0..n).map(|i| v(r, i) as f32).collect();
        let mut x64: Vec<f64> = (0..n).map(|i| v(r, i) as f64 * 0.5).collect();
        let a = counts(comm, phase);
        comm.allreduce_native_f32(&mut x32)?;
        comm.allreduce_native_f64(&mut x64)?;
        let b = counts(comm, phase);
        for i in 0..n {
            let s: i64 = (0..p).map(|q| v(q, i)).sum();
            if x32[i] != s as f32 || x64[i] != s as f64 * 0.5 {
                bail!(
                    "native allreduce of {n}: element {i} is {} (f32) / {} (f64), want {s} / {}",
                    x32[i],
                    x64[i],
                    s as f64 * 0.5
                );
            }
        }
        let bytes = (n * 12) as u64;
        expect_eq(&delta(a, b), &(bytes, bytes, 0, 0), || {
            format!("native allreduce traffic for {n} values")
        })?;
    }
    Ok(())
}

fn allreduce_small(comm: &dyn Comm) -> Result<()> {
    let (p, r) = (comm.size(), comm.rank());
    let v = |q: usize, i: usize| (q as f64 + 1.0) * (i as f64 - 1.5);
    let mine: Vec<f64> = (0..4).map(|i| v(r, i)).collect();
    let sum = comm.allreduce_small_f64(&mine)?;
    let max = comm.allreduce_max_f64(&mine)?;
    for i in 0..4 {
        let s: f64 = (0..p).map(|q| v(q, i)).sum();
        let m = (0..p).map(|q| v(q, i)).fold(f64::NEG_INFINITY, f64::max);
        expect_eq(&(sum[i], max[i]), &(s, m), || {
            format!("sum and max of value {i}")
        })?;
    }
    ensure!(
        comm.allreduce_small_f64(&[])?.is_empty() && comm.allreduce_max_f64(&[])?.is_empty(),
        "reductions of nothing"
    );
    Ok(())
}

/// One large message around the ring (to oneself when P = 1), checked element by element,
/// and its bytes counted.
fn large_message(comm: &dyn Comm, n: usize) -> Result<()> {
    let (p, r) = (comm.size(), comm.rank());
    let (right, left) = ((r + 1) % p, (r + p - 1) % p);
    let phase = "conformance/large";
    let _g = comm.phase(phase);
    let a = counts(comm, phase);
    let data: Vec<u32> = (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761) ^ right as u32)
        .collect();
    let got = comm.sendrecv(right, data, left)?;
    let b = counts(comm, phase);
    ensure!(got.len() == n, "{} elements of {n} arrived", got.len());
    if let Some(i) = (0..n).find(|&i| got[i] != (i as u32).wrapping_mul(2_654_435_761) ^ r as u32) {
        bail!("element {i} of {n} from rank {left} is wrong");
    }
    let (bytes, m) = if p == 1 { (0, 0) } else { (n as u64 * 4, 1) };
    expect_eq(&delta(a, b), &(bytes, bytes, m, m), || {
        "large message traffic".into()
    })
}

/// `sendrecv` on a given tag (the CommExt helpers use tag 0).
trait Tagged {
    fn sendrecv_tagged<T: Elem>(
        &self,
        tag: u32,
        dest: usize,
        data: Vec<T>,
        src: usize,
    ) -> Result<Vec<T>>;
}

impl Tagged for dyn Comm + '_ {
    fn sendrecv_tagged<T: Elem>(
        &self,
        tag: u32,
        dest: usize,
        data: Vec<T>,
        src: usize,
    ) -> Result<Vec<T>> {
        let got = self.exchange(tag, vec![(dest, T::wrap(data))], &[(src, T::KIND)])?;
        Ok(got.into_iter().next().context("no message")?.into_vec()?)
    }
}
