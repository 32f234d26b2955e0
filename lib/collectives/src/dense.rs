//! Dense allreduces, the baselines of every paper (Ok-Topk Table 1 "Dense"; Thakur,
//! Rabenseifner & Gropp 2005): ring, Rabenseifner (recursive halving + doubling, any P),
//! binomial tree, and the backend's native allreduce. Correct for any n, also n < P.

use anyhow::{bail, Result};
use gradkit_comm::{Comm, CommExt};
use gradkit_core::trace::Layout;

use crate::algo::{CostFn, Descriptor, Family, Knob};
use crate::{Flat, Op, Reducer, StepOutput};

/// Start of chunk `i` when n elements are cut into p near-equal contiguous chunks.
pub fn chunk_start(n: usize, p: usize, i: usize) -> usize {
    (n as u128 * i as u128 / p as u128) as usize
}

fn chunk(n: usize, p: usize, i: usize) -> std::ops::Range<usize> {
    chunk_start(n, p, i)..chunk_start(n, p, i + 1)
}

fn add_into(dst: &mut [f32], src: &[f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d += *s;
    }
}

/// Ring allreduce (sum) in place: P−1 reduce-scatter steps, then P−1 allgather steps, each
/// sending one chunk to the right neighbour. Rank r sends `n − |c_{r+1}| − |c_{r+2}| + n`
/// elements in 2(P−1) messages (chunks cut as `i·n/P`). Traffic is charged to the phases
/// `reduce_scatter` and `allgather`.
pub fn ring(comm: &dyn Comm, data: &mut [f32]) -> Result<()> {
    ring_with_scratch(comm, data, &mut Vec::new())
}

/// [`ring`] that builds its first message in `scratch` and leaves its last received chunk
/// there: a caller that keeps `scratch` between calls (as [`DenseReducer`] does) allocates
/// and page-faults nothing per call once `scratch` has grown to a chunk. Same sums, same
/// traffic.
pub fn ring_with_scratch(comm: &dyn Comm, data: &mut [f32], scratch: &mut Vec<f32>) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let buf = {
        let _ph = comm.phase("reduce_scatter");
        ring_reduce_scatter(comm, data, std::mem::take(scratch))?
    };
    let _ph = comm.phase("allgather");
    *scratch = ring_allgather(comm, data, buf)?;
    Ok(())
}

/// [`ring`] with its traffic charged to the caller's phase (for algorithms that ring-reduce
/// one of their own stages, e.g. DEFT's values or EmbRace's dense layers).
pub fn ring_in_caller_phase(comm: &dyn Comm, data: &mut [f32]) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let buf = ring_reduce_scatter(comm, data, Vec::new())?;
    ring_allgather(comm, data, buf)?;
    Ok(())
}

/// Ring reduce-scatter: afterwards rank r holds the full sum of chunk r+1, which it also
/// returns as an owned buffer (the first message of [`ring_allgather`]). The first message
/// is built in `first` (any contents; its capacity is reused).
///
/// The chunk a rank sends in step s+1 is the one it reduced in step s, so the received
/// buffer, once it holds the sum, is sent on as it is: one copy of a chunk per call (the
/// first message) and no allocation per step. The sum `data + got` is written to `got`, and
/// to `data` only in the last step (chunk r+1, the one this rank keeps).
///
/// Every other chunk of `data` is dead once sent or summed (the allgather overwrites it
/// before anything reads it), so for in-process ranks ([`releases`]) its memory pages are
/// given back ([`gradkit_comm::release`]): docs/MEMORY.md, the messages in flight then take the
/// room of chunks no longer needed instead of adding to P in-process ranks' inputs.
fn ring_reduce_scatter(comm: &dyn Comm, data: &mut [f32], mut first: Vec<f32>) -> Result<Vec<f32>> {
    let (p, r, n) = (comm.size(), comm.rank(), data.len());
    let (right, left) = ((r + 1) % p, (r + p - 1) % p);
    let on = releases(comm);
    let mut buf = message_releasing(on, &mut first, &mut data[chunk(n, p, r)]);
    for s in 0..p - 1 {
        let recv_c = (r + 2 * p - s - 1) % p;
        let mut got: Vec<f32> = comm.sendrecv(right, buf, left)?;
        let dst = &mut data[chunk(n, p, recv_c)];
        assert_eq!(got.len(), dst.len(), "ring chunk of the wrong length");
        if s + 2 < p {
            for (d, g) in dst.iter().zip(got.iter_mut()) {
                *g += *d;
            }
            release_if(on, dst);
        } else {
            for (d, g) in dst.iter_mut().zip(got.iter_mut()) {
                let v = *d + *g;
                *d = v;
                *g = v;
            }
        }
        buf = got;
    }
    Ok(buf)
}

/// Ring allgather of the reduced chunks: rank r starts with chunk r+1 in `buf` (as
/// [`ring_reduce_scatter`] leaves it) and forwards each received chunk as it came, after
/// copying it into place; no allocation per step. Returns the last chunk received, its
/// memory pages given back (it is only kept for its capacity: [`retire`]).
fn ring_allgather(comm: &dyn Comm, data: &mut [f32], mut buf: Vec<f32>) -> Result<Vec<f32>> {
    let (p, r, n) = (comm.size(), comm.rank(), data.len());
    let (right, left) = ((r + 1) % p, (r + p - 1) % p);
    let on = releases(comm);
    for s in 0..p - 1 {
        let recv_c = (r + p - s) % p;
        let mut got: Vec<f32> = comm.sendrecv(right, buf, left)?;
        // The last chunk is not sent on: dead once in place.
        place(on && s + 2 == p, &mut data[chunk(n, p, recv_c)], &mut got);
        buf = got;
    }
    retire(on, &mut buf);
    Ok(buf)
}

/// The fp16 wire format: IEEE binary16, little-endian, two bytes per element.
fn to_f16_bytes(x: &[f32], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(2 * x.len());
    for v in x {
        out.extend_from_slice(&half::f16::from_f32(*v).to_le_bytes());
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32()
}

/// [`ring`] with an fp16 wire format, as mixed-precision training communicates (the 1-bit
/// LAMB paper's baseline, §6.3: "FP16 ring allreduce costs 2(n−1)/n·2d bytes"): every message
/// carries binary16 values (2 bytes per element, half of [`ring`]'s bytes in the same
/// messages). Each hop adds the received fp16 partial sum to the local f32 chunk and rounds
/// the result to fp16 before sending it on; the owner rounds the finished chunk the same way,
/// so every rank ends with the same values, each exactly representable in fp16. Phases
/// `reduce_scatter` and `allgather`.
pub fn ring_fp16(comm: &dyn Comm, data: &mut [f32]) -> Result<()> {
    let (p, r, n) = (comm.size(), comm.rank(), data.len());
    if p == 1 {
        data.iter_mut()
            .for_each(|v| *v = half::f16::from_f32(*v).to_f32());
        return Ok(());
    }
    let mut buf = Vec::new();
    {
        let _ph = comm.phase("reduce_scatter");
        // Every chunk but r+1 is dead once sent (the allgather overwrites it): its memory
        // pages are given back, as in `ring_reduce_scatter`.
        let on = releases(comm);
        let first = &mut data[chunk(n, p, r)];
        to_f16_bytes(first, &mut buf);
        release_if(on, first);
        for s in 0..p - 1 {
            let dst = &mut data[chunk(n, p, (r + 2 * p - s - 1) % p)];
            buf = fp16_hop(comm, buf, dst, |d, g| {
                *d = half::f16::from_f32(*d + g).to_f32()
            })?;
            to_f16_bytes(dst, &mut buf);
            if s + 2 < p {
                release_if(on, dst);
            }
        }
    }
    let _ph = comm.phase("allgather");
    for s in 0..p - 1 {
        let dst = &mut data[chunk(n, p, (r + p - s) % p)];
        buf = fp16_hop(comm, buf, dst, |d, g| *d = g)?;
    }
    Ok(())
}

/// One hop of [`ring_fp16`]: sends `buf` right, receives the left neighbour's fp16 chunk and
/// applies `f(dst[i], received[i])`; returns the received buffer for reuse.
fn fp16_hop(
    comm: &dyn Comm,
    buf: Vec<u8>,
    dst: &mut [f32],
    f: impl Fn(&mut f32, f32),
) -> Result<Vec<u8>> {
    let (p, r) = (comm.size(), comm.rank());
    let got: Vec<u8> = comm.sendrecv((r + 1) % p, buf, (r + p - 1) % p)?;
    if got.len() != 2 * dst.len() {
        bail!(
            "fp16 ring: a chunk of {} bytes, expected {}",
            got.len(),
            2 * dst.len()
        );
    }
    for (i, d) in dst.iter_mut().enumerate() {
        f(d, f16_at(&got, i));
    }
    Ok(got)
}

/// Rabenseifner's allreduce (sum) in place, for any P: with p' the largest power of two
/// ≤ P and q = P − p', ranks 0..2q first fold pairwise (even → odd), the p' remaining ranks
/// run recursive-halving reduce-scatter and recursive-doubling allgather, and the folded
/// ranks get the result back.
pub fn rabenseifner(comm: &dyn Comm, data: &mut [f32]) -> Result<()> {
    rabenseifner_with_scratch(comm, data, &mut Vec::new())
}

/// Whether dead chunks' memory pages are given back ([`gradkit_comm::release`]): for
/// in-process ranks, which share one address space (P ranks' inputs in one process, issue
/// 19's memory bound). Under MPI a rank keeps its buffers resident, so that a steady-state
/// call faults no page in (buffer reuse, docs/MEMORY.md): a released chunk is faulted in again
/// when the allgather writes it.
fn releases(comm: &dyn Comm) -> bool {
    comm.backend().in_process()
}

/// Gives back `s`'s memory pages when `on` ([`releases`]).
fn release_if(on: bool, s: &mut [f32]) {
    if on {
        gradkit_comm::release(s);
    }
}

/// Moves a copy of `src` out in `scratch`'s memory (its capacity is reused: a message built
/// here allocates nothing once `scratch` has grown; when it must grow, a large one gets
/// huge pages, [`gradkit_comm::huge_vec`]). With `on` ([`releases`]) the stale pages past
/// the message are given back ([`gradkit_comm::release_spare`]).
fn message(on: bool, scratch: &mut Vec<f32>, src: &[f32]) -> Vec<f32> {
    message_with(on, scratch, src.len(), |m| m.extend_from_slice(src))
}

/// [`message`] from a source that is dead once copied (overwritten before it is read again):
/// with `on`, its memory pages are given back as it is copied
/// ([`gradkit_comm::release_into`]), so the message and its source are never both resident
/// in full (docs/MEMORY.md).
fn message_releasing(on: bool, scratch: &mut Vec<f32>, src: &mut [f32]) -> Vec<f32> {
    message_with(on, scratch, src.len(), |m| match on {
        true => gradkit_comm::release_into(m, src),
        false => m.extend_from_slice(src),
    })
}

/// A message of `len` values written by `fill` into `scratch`'s memory ([`message`]).
fn message_with(
    on: bool,
    scratch: &mut Vec<f32>,
    len: usize,
    fill: impl FnOnce(&mut Vec<f32>),
) -> Vec<f32> {
    let mut m = std::mem::take(scratch);
    m.clear();
    gradkit_comm::reserve_huge(&mut m, len);
    fill(&mut m);
    if on {
        gradkit_comm::release_spare(&mut m);
    }
    m
}

/// Copies a received message into place; with `on` ([`releases`]) the message's pages are
/// given back as it is copied ([`gradkit_comm::copy_release`]): for a message that is dead
/// once in place.
fn place(on: bool, dst: &mut [f32], got: &mut [f32]) {
    if on {
        gradkit_comm::copy_release(dst, got);
    } else {
        dst.copy_from_slice(got);
    }
}

/// With `on` ([`releases`]): empties a buffer kept only for its capacity (the scratch a
/// caller keeps between calls) and gives back all its memory pages, so that it holds no
/// resident memory between calls. One release over the whole capacity: its 2 MiB huge pages
/// go back whole (not split), so the next call faults them in as huge pages again.
fn retire(on: bool, buf: &mut Vec<f32>) {
    if on {
        buf.clear();
        gradkit_comm::release_spare(buf);
    }
}

/// [`rabenseifner`] that builds its messages in `scratch` and keeps the last received
/// buffer there for the next message (and the next call): each step sends the scratch and
/// receives the buffer that becomes the next scratch, so a caller that keeps `scratch`
/// across calls allocates nothing per step on a backend that reuses its receive buffers.
/// Same messages, same sums.
pub fn rabenseifner_with_scratch(
    comm: &dyn Comm,
    data: &mut [f32],
    scratch: &mut Vec<f32>,
) -> Result<()> {
    let (p, r) = (comm.size(), comm.rank());
    if p == 1 {
        return Ok(());
    }
    let pp = 1usize << (usize::BITS - 1 - p.leading_zeros());
    let q = p - pp;
    let on = releases(comm);
    // Fold the extra ranks into their odd neighbours.
    let newrank: Option<usize> = {
        let _ph = comm.phase("fold");
        if r < 2 * q {
            if r % 2 == 0 {
                // `data` is dead until the unfold overwrites it.
                comm.send(r + 1, message_releasing(on, scratch, data))?;
                None
            } else {
                let got: Vec<f32> = comm.recv(r - 1)?;
                add_into(data, &got);
                *scratch = got;
                Some(r / 2)
            }
        } else {
            Some(r - q)
        }
    };
    if let Some(nr) = newrank {
        halving_doubling(comm, data, scratch, nr, pp, q)?;
    }
    let _ph = comm.phase("unfold");
    if r < 2 * q {
        if r % 2 == 1 {
            comm.send(r - 1, message(on, scratch, data))?;
        } else {
            let mut got: Vec<f32> = comm.recv(r + 1)?;
            if got.len() != data.len() {
                bail!(
                    "rabenseifner: an unfold of {} values, expected {}",
                    got.len(),
                    data.len()
                );
            }
            place(on, data, &mut got);
            *scratch = got;
        }
    }
    retire(on, scratch);
    Ok(())
}

/// The power-of-two core of [`rabenseifner_with_scratch`] on new rank `nr` of `pp`:
/// recursive-halving reduce-scatter, then recursive-doubling allgather retracing the halving
/// steps in reverse (Thakur, Rabenseifner & Gropp 2005, Rabenseifner's allreduce).
fn halving_doubling(
    comm: &dyn Comm,
    data: &mut [f32],
    scratch: &mut Vec<f32>,
    nr: usize,
    pp: usize,
    q: usize,
) -> Result<()> {
    let real = |nr: usize| if nr < q { 2 * nr + 1 } else { nr + q };
    let on = releases(comm);
    // Recursive halving: keep the half of the current range on this rank's side.
    let mut ranges = Vec::new();
    let (mut lo, mut hi) = (0usize, data.len());
    let mut mask = pp >> 1;
    {
        let _ph = comm.phase("reduce_scatter");
        while mask > 0 {
            let partner = real(nr ^ mask);
            let mid = lo + (hi - lo) / 2;
            let (keep, give) = if nr & mask == 0 {
                ((lo, mid), (mid, hi))
            } else {
                ((mid, hi), (lo, mid))
            };
            // The half given is dead until the doubling step of this level overwrites it.
            let send = message_releasing(on, scratch, &mut data[give.0..give.1]);
            let got: Vec<f32> = comm.sendrecv(partner, send, partner)?;
            add_into(&mut data[keep.0..keep.1], &got);
            *scratch = got;
            ranges.push((lo, hi));
            (lo, hi) = keep;
            mask >>= 1;
        }
    }
    // Recursive doubling: retrace the halving steps in reverse.
    let _ph = comm.phase("allgather");
    let mut mask = 1;
    while mask < pp {
        let partner = real(nr ^ mask);
        let (plo, phi) = ranges.pop().expect("one range per halving step");
        let mid = plo + (phi - plo) / 2;
        let other = if nr & mask == 0 {
            (mid, phi)
        } else {
            (plo, mid)
        };
        let send = message(on, scratch, &data[lo..hi]);
        let mut got: Vec<f32> = comm.sendrecv(partner, send, partner)?;
        let dst = &mut data[other.0..other.1];
        if got.len() != dst.len() {
            bail!(
                "rabenseifner: a half of {} values, expected {}",
                got.len(),
                dst.len()
            );
        }
        // The last message received is dead once in place; the others are kept: the next
        // message is built in their memory.
        place(on && mask << 1 >= pp, dst, &mut got);
        *scratch = got;
        (lo, hi) = (plo, phi);
        mask <<= 1;
    }
    Ok(())
}

/// Binomial-tree allreduce (sum) in place: reduce to rank 0 (each rank adds its children's
/// vectors, then sends the sum to its parent), then a binomial broadcast.
pub fn tree(comm: &dyn Comm, data: &mut [f32]) -> Result<()> {
    tree_with_scratch(comm, data, &mut Vec::new())
}

/// The children of rank `r` of `p` in the binomial tree rooted at 0, in the order their
/// sums are added: r + 2^j for every j above r's highest set bit (the mirror of the
/// broadcast).
fn tree_children(r: usize, p: usize) -> impl Iterator<Item = usize> {
    let start = if r == 0 {
        0
    } else {
        usize::BITS - r.leading_zeros()
    };
    (start..usize::BITS)
        .map(|j| 1usize << j)
        .take_while(move |&bit| bit < p)
        .map(move |bit| r + bit)
        .filter(move |&c| c < p)
}

/// The parent of rank `r` > 0 in that tree: `r` without its highest set bit.
fn tree_parent(r: usize) -> usize {
    r - (1 << (usize::BITS - 1 - r.leading_zeros()))
}

/// [`tree`] on a copy of `data` built in `scratch` ([`tree_owned`]; the copy is moved to the
/// parent or broadcast, and the broadcast's buffer is kept in `scratch`). Same messages,
/// same sums.
pub fn tree_with_scratch(comm: &dyn Comm, data: &mut [f32], scratch: &mut Vec<f32>) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let on = releases(comm);
    let mut v = message(on, scratch, data);
    tree_owned(comm, &mut v)?;
    data.copy_from_slice(&v);
    *scratch = v;
    retire(on, scratch);
    Ok(())
}

/// [`tree`] on an owned vector, as [`DenseReducer`] calls it: a rank's reduced vector is
/// moved to its parent instead of copied (it is not read again before the broadcast
/// overwrites it), the root's result goes out as the broadcast's data, every other rank's
/// result is the broadcast's buffer itself, and each child's vector is dropped once added.
/// Same messages, same sums as [`tree`]; docs/MEMORY.md: in-process, the ranks together hold
/// about P vectors (theirs, or in flight) instead of P plus a copy per message and a kept
/// full-length scratch per rank.
pub fn tree_owned(comm: &dyn Comm, data: &mut Vec<f32>) -> Result<()> {
    let (p, r, n) = (comm.size(), comm.rank(), data.len());
    if p == 1 {
        return Ok(());
    }
    {
        let _ph = comm.phase("reduce");
        for child in tree_children(r, p) {
            let got: Vec<f32> = comm.recv(child)?;
            add_into(data, &got);
        }
        if r != 0 {
            comm.send(tree_parent(r), std::mem::take(data))?;
        }
    }
    let _ph = comm.phase("broadcast");
    *data = comm.broadcast(0, (r == 0).then(|| std::mem::take(data)))?;
    if data.len() != n {
        bail!("tree: a broadcast of {} values, expected {n}", data.len());
    }
    Ok(())
}

/// The backend's own allreduce (MPI_Allreduce under MPI, shared memory on Local ranks).
pub fn native(comm: &dyn Comm, data: &mut [f32]) -> Result<()> {
    let _ph = comm.phase("native");
    comm.allreduce_native_f32(data)?;
    Ok(())
}

/// A dense allreduce (sum) in place.
pub type DenseFn = fn(&dyn Comm, &mut [f32]) -> Result<()>;

/// A dense allreduce (sum) in place that may build its messages in, and leave a buffer in,
/// the caller's scratch `Vec` (kept across calls by [`DenseReducer`]).
pub type DenseScratchFn = fn(&dyn Comm, &mut [f32], &mut Vec<f32>) -> Result<()>;

/// The dense algorithms by `--algo` name, in their scratch-reusing form (native and
/// ring-fp16 use no scratch).
pub fn by_name_reusing(name: &str) -> Option<DenseScratchFn> {
    Some(match name {
        "ring" => ring_with_scratch,
        "rabenseifner" => rabenseifner_with_scratch,
        "tree" => tree_with_scratch,
        "native" => |c, d, _| native(c, d),
        "ring-fp16" => |c, d, _| ring_fp16(c, d),
        _ => return None,
    })
}

/// The dense algorithms by `--algo` name.
pub fn by_name(name: &str) -> Option<DenseFn> {
    Some(match name {
        "ring" => ring,
        "rabenseifner" => rabenseifner,
        "tree" => tree,
        "native" => native,
        "ring-fp16" => ring_fp16,
        _ => return None,
    })
}

/// Allreduce with `op` by the dense algorithm `algo` (an error for any other family).
pub fn allreduce(comm: &dyn Comm, algo: crate::Algo, op: Op, data: &mut [f32]) -> Result<()> {
    allreduce_reusing(comm, algo.name(), op, data, &mut Vec::new())
}

/// [`allreduce`] with a scratch buffer kept by the caller across calls ([`by_name_reusing`]):
/// same messages and bits, no per-call allocation once `scratch` has grown.
pub fn allreduce_reusing(
    comm: &dyn Comm,
    name: &str,
    op: Op,
    data: &mut [f32],
    scratch: &mut Vec<f32>,
) -> Result<()> {
    let Some(f) = by_name_reusing(name) else {
        bail!("unknown dense algorithm `{name}`")
    };
    f(comm, data, scratch)?;
    finish_op(comm, op, data);
    Ok(())
}

/// [`allreduce_reusing`] of a vector the caller gives up while the call runs: tree moves
/// it to its parent or broadcasts it ([`tree_owned`]) instead of copying it; the others
/// work in place as [`allreduce_reusing`] does. Same messages and bits.
pub fn allreduce_owned(
    comm: &dyn Comm,
    name: &str,
    op: Op,
    data: &mut Vec<f32>,
    scratch: &mut Vec<f32>,
) -> Result<()> {
    if name != "tree" {
        return allreduce_reusing(comm, name, op, data, scratch);
    }
    tree_owned(comm, data)?;
    finish_op(comm, op, data);
    Ok(())
}

/// Turns a sum into `op`'s result (the mean divides by P).
fn finish_op(comm: &dyn Comm, op: Op, data: &mut [f32]) {
    if op == Op::Mean {
        let inv = 1.0 / comm.size() as f32;
        data.iter_mut().for_each(|v| *v *= inv);
    }
}

/// [`finish_op`] that also counts the result's nonzero entries on its pass over it (the
/// mean's); `None` for the sum, which makes no pass.
fn finish_op_counting(comm: &dyn Comm, op: Op, data: &mut [f32]) -> Option<usize> {
    if op != Op::Mean {
        return None;
    }
    let inv = 1.0 / comm.size() as f32;
    let mut nnz = 0usize;
    for v in data.iter_mut() {
        *v *= inv;
        nnz += usize::from(*v != 0.0);
    }
    Some(nnz)
}

/// A dense descriptor: `name` run by [`DenseReducer`], reading `--op` (and `reads`).
const fn dense_algo(
    name: &'static str,
    description: &'static str,
    reads: &'static [Knob],
    cost: CostFn,
    make: fn(&crate::Params) -> Result<Box<dyn Reducer>>,
) -> Descriptor {
    Descriptor {
        name,
        family: Family::Dense,
        paper: "Ok-Topk Table 1, Dense; Thakur, Rabenseifner & Gropp 2005",
        description,
        reads,
        cost: Some(cost),
        ..Descriptor::base(make)
    }
}

/// The ring's formula by phase: a reduce-scatter and an allgather, each P − 1 messages of
/// n/P words.
fn ring_phases(p: usize, n: f64) -> Vec<(&'static str, gradkit_cost::Cost)> {
    let half = gradkit_cost::Cost {
        latency: p as f64 - 1.0,
        words: n * (p as f64 - 1.0) / p as f64,
    };
    vec![("reduce_scatter", half), ("allgather", half)]
}

/// `--algo ring`.
pub const RING: Descriptor = Descriptor {
    phases: Some(|p, n, _| ring_phases(p, n)),
    exchange: Some(crate::algo::AsExchange {
        help: "ring allreduce of the gradients, mean",
        aliases: &["dense"],
    }),
    ..dense_algo(
        "ring",
        "reduce-scatter + allgather ring (bandwidth-optimal)",
        &[Knob::Op, Knob::Wire],
        |p, n, _| gradkit_cost::ring(p, n),
        |params| Ok(Box::new(DenseReducer::new("ring", params.op)?)),
    )
};

/// `--algo ring-fp16` (`ring --wire fp16`); its formula counts half-size words: the same
/// messages carry 2-byte values.
pub const RING_FP16: Descriptor = Descriptor {
    phases: Some(|p, n, _| ring_phases(p, n / 2.0)),
    ..dense_algo(
        "ring-fp16",
        "the ring with an fp16 wire format (half the bytes; sums rounded to fp16)",
        &[Knob::Op, Knob::Wire],
        |p, n, _| gradkit_cost::ring(p, n / 2.0),
        |params| Ok(Box::new(DenseReducer::new("ring-fp16", params.op)?)),
    )
};

/// `--algo rabenseifner`.
pub const RABENSEIFNER: Descriptor = dense_algo(
    "rabenseifner",
    "recursive halving reduce-scatter + doubling allgather, any P",
    &[Knob::Op],
    |p, n, _| gradkit_cost::dense(p, n),
    |params| Ok(Box::new(DenseReducer::new("rabenseifner", params.op)?)),
);

/// `--algo tree`.
pub const TREE: Descriptor = dense_algo(
    "tree",
    "binomial-tree reduce + broadcast",
    &[Knob::Op],
    |p, n, _| gradkit_cost::tree(p, n),
    |params| Ok(Box::new(DenseReducer::new("tree", params.op)?)),
);

/// `--algo native`.
pub const NATIVE: Descriptor = dense_algo(
    "native",
    "the backend's own allreduce (MPI_Allreduce under mpirun)",
    &[Knob::Op],
    |p, n, _| gradkit_cost::dense(p, n),
    |params| Ok(Box::new(DenseReducer::new("native", params.op)?)),
);

/// The dense algorithms, in `--help` order.
pub const ALGOS: &[crate::Algo] = &[
    crate::Algo(&RING),
    crate::Algo(&RING_FP16),
    crate::Algo(&RABENSEIFNER),
    crate::Algo(&TREE),
    crate::Algo(&NATIVE),
];

/// The algorithm whose `--wire fp16` variant `algo` is (`ring-fp16`: `ring`), or `None`.
pub fn fp16_wire_of(algo: crate::Algo) -> Option<crate::Algo> {
    (algo == crate::Algo(&RING_FP16)).then_some(crate::Algo(&RING))
}

/// `ring` with `--wire fp16` is `ring-fp16`; any other algorithm is itself.
pub fn with_fp16_wire(algo: crate::Algo) -> crate::Algo {
    if algo == crate::Algo(&RING) {
        crate::Algo(&RING_FP16)
    } else {
        algo
    }
}

/// A dense algorithm as a [`Reducer`]: sparse input is densified first.
pub struct DenseReducer {
    name: &'static str,
    op: Op,
    /// The message buffer of ring and Rabenseifner, kept across steps
    /// ([`allreduce_reusing`]; tree moves the step's own vector, [`allreduce_owned`]).
    scratch: Vec<f32>,
}

impl DenseReducer {
    pub fn new(name: &str, op: Op) -> Result<Self> {
        let name = match name {
            "ring" => "ring",
            "ring-fp16" => "ring-fp16",
            "rabenseifner" => "rabenseifner",
            "tree" => "tree",
            "native" => "native",
            _ => bail!("unknown dense algorithm `{name}`"),
        };
        Ok(DenseReducer {
            name,
            op,
            scratch: Vec::new(),
        })
    }
}

impl Reducer for DenseReducer {
    fn name(&self) -> &'static str {
        self.name
    }
    fn reduce(
        &mut self,
        comm: &dyn Comm,
        _step: u32,
        layout: &Layout,
        input: Flat,
    ) -> Result<StepOutput> {
        let mut data = input.into_dense(layout.total() as usize);
        allreduce_owned(comm, self.name, self.op, &mut data, &mut self.scratch)?;
        Ok(StepOutput::new(Flat::Dense(data)))
    }
    fn reduce_in_place(
        &mut self,
        comm: &dyn Comm,
        _step: u32,
        _layout: &Layout,
        data: &mut [f32],
    ) -> Option<Result<crate::InPlaceOutput>> {
        // Tree's owned path only saves a copy of a vector it owns: in place it runs
        // `tree_with_scratch`, the same messages and bits ([`allreduce_owned`]).
        let f = by_name_reusing(self.name)?;
        Some(
            f(comm, data, &mut self.scratch).map(|()| crate::InPlaceOutput {
                metrics: Vec::new(),
                nnz: finish_op_counting(comm, self.op, data),
            }),
        )
    }
}
