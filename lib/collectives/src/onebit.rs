//! DeepSpeed's error-compensated 1-bit compressed allreduce (1-bit Adam / 1-bit LAMB,
//! onebit-lamb.md §2, anchors.md §3): the communication half of 1-bit LAMB.
//!
//! All layers are **fused** into one buffer in `layer_id` order (as DeepSpeed fuses every
//! momentum into one flat buffer), zero-padded to a multiple of `P·lcm(P, 8)`, then on each
//! rank:
//! 1. `buf = x + worker_error`; `s_w = ‖buf‖₂/√len`; sign bit 1 where `buf ≥ 0` (zero and −0
//!    count as +1); `worker_error = buf − s_w·sign`.
//! 2. The bits are packed MSB-first into bytes and cut into P chunks; chunk k goes to rank k
//!    (alltoall), every rank's `s_w` travels with it (the scale allgather).
//! 3. Rank j, the server of chunk j: `z = Σ_i (s_w⁽ⁱ⁾/P)·sign_i + server_error`;
//!    `s_s = ‖z‖₂/√len(z)`; `server_error = z − s_s·sign(z)`.
//! 4. The packed server chunks and their scales are allgathered (ring); the result is
//!    `s_s⁽ʲ⁾·sign_j` on chunk j, unpadded: the compressed **average**, bit-identical on all
//!    ranks.
//!
//! Bytes sent per rank per call: `2(P−1)·(d_pad/(8P) + 4)` — the P−1 sign chunks of the
//! alltoall and the P−1 of the ring allgather, each carrying one f32 scale (the scale rides in
//! the same message as its chunk, so the 2(P−1) scales cost no extra messages). P = 1 skips
//! communication and compression entirely (as DeepSpeed does): the output is the input.
//!
//! Worker and server errors persist across calls ([`OneBitState`]). The reducer saves them
//! with `--state FILE` in [`StateFile`] format and loads them when the file exists —
//! DeepSpeed drops them on checkpoint load; we keep them.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use gradkit_comm::{Comm, CommExt};
use gradkit_core::trace::Layout;

use crate::{Flat, Reducer, StepOutput};

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Length of the fused buffer after DeepSpeed's padding: the next multiple of
/// `P·lcm(P, 8)` (so every server chunk is a whole number of bytes).
pub fn padded_len(p: usize, n: usize) -> usize {
    let lcm = p * 8 / gcd(p, 8);
    let unit = p * lcm;
    n.div_ceil(unit) * unit
}

/// √(Σx²/len) accumulated in f64 (eight fixed lanes, so the result does not depend on
/// threads or vector width).
pub fn rms(x: &[f32]) -> f32 {
    if x.is_empty() {
        return 0.0;
    }
    (sum_sq(x) / x.len() as f64).sqrt() as f32
}

/// Σx² in f64: lane `j` sums the elements `≡ j (mod 8)` of the whole chunks, the lanes are
/// added in order, then the remainder one by one. Every kernel below that computes a sum of
/// squares uses exactly this order, so they agree bit for bit.
fn sum_sq(x: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let mut it = x.chunks_exact(8);
    for c in &mut it {
        sq8(&mut lanes, c.try_into().expect("8 lanes"));
    }
    let mut s: f64 = lanes.iter().sum();
    for &v in it.remainder() {
        s += (v as f64) * (v as f64);
    }
    s
}

/// `lanes[j] += c[j]²` in f64 (eight independent lanes: the compiler keeps them in vector
/// registers).
#[inline(always)]
fn sq8(lanes: &mut [f64; 8], c: &[f32; 8]) {
    for j in 0..8 {
        let v = c[j] as f64;
        lanes[j] += v * v;
    }
}

/// `x + e` for eight lanes.
#[inline(always)]
fn add8(e: &[f32; 8], x: &[f32; 8]) -> [f32; 8] {
    let mut c = [0f32; 8];
    for j in 0..8 {
        c[j] = e[j] + x[j];
    }
    c
}

/// Sign byte (MSB-first, bit 1 where `c ≥ 0`, so ±0 count as +1) of eight lanes and the
/// error `c − s·sign(c)`, written to `out`. `±s` is `s` with its sign bit flipped where the
/// bit is 0 (exactly `-s`), so `out` equals `c − (if c ≥ 0 { s } else { −s })`.
#[inline(always)]
fn pack8(c: &[f32; 8], sb: u32, out: &mut [f32; 8]) -> u8 {
    let mut m = [0u32; 8];
    for j in 0..8 {
        let pos = c[j] >= 0.0;
        m[j] = pos as u32;
        let signed = f32::from_bits(sb ^ ((pos as u32 ^ 1) << 31));
        out[j] = c[j] - signed;
    }
    let mut b = 0u32;
    for (j, mj) in m.iter().enumerate() {
        b |= mj << (7 - j);
    }
    b as u8
}

/// `±s` by bit: the sign bit of `s` flipped where the packed bit is 0.
#[inline(always)]
fn signed(s_bits: u32, byte: u8, j: usize) -> f32 {
    let neg = (((byte >> (7 - j)) & 1) ^ 1) as u32;
    f32::from_bits(s_bits ^ (neg << 31))
}

/// The eight values `±s` of one sign byte.
#[inline(always)]
fn unpack8(sb: u32, byte: u8) -> [f32; 8] {
    std::array::from_fn(|j| signed(sb, byte, j))
}

fn lanes8(c: &[f32]) -> &[f32; 8] {
    c.try_into().expect("8 lanes")
}

fn lanes8_mut(c: &mut [f32]) -> &mut [f32; 8] {
    c.try_into().expect("8 lanes")
}

/// The 1-bit compressor with error feedback, in place: on entry `buf` holds `x + error`,
/// on return it holds the new error `buf − scale·sign(buf)`; the sign bits (1 where
/// `buf ≥ 0`) are written MSB-first into `bits` (`buf.len()/8` bytes). Returns the scale
/// `‖buf‖₂/√len`. `buf.len()` must be a multiple of 8. Two passes: the scale needs the
/// whole sum of squares before the first error can be written.
pub fn compress_into(buf: &mut [f32], bits: &mut [u8]) -> f32 {
    assert_eq!(
        buf.len() % 8,
        0,
        "1-bit buffers are padded to a multiple of 8"
    );
    assert_eq!(bits.len(), buf.len() / 8);
    let s = rms(buf);
    pack_and_feedback(buf, bits, s);
    s
}

/// The worker's compressor: `e ← e + x` (elements of `e` past `x.len()`, the padding, get
/// `+ 0.0`) fused with the f64 sum of squares (the lanes of [`rms`]), then the sign bits of
/// `c = e + x` MSB-first into `bits` and `e ← c − s·sign(c)`. Returns `s = ‖c‖₂/√len(e)`.
/// Bit for bit what `e += x` (zero-padded) followed by [`compress_into`] gives. Two passes
/// (the scale needs the whole sum before the first error can be written): read `x`,
/// read-modify-write `e`; then read-modify-write `e`. `e.len()` must be a multiple of 8 and
/// `≥ x.len()`; `bits.len() == e.len()/8`.
pub fn compress_with_feedback(x: &[f32], e: &mut [f32], bits: &mut [u8]) -> f32 {
    assert_eq!(
        e.len() % 8,
        0,
        "1-bit buffers are padded to a multiple of 8"
    );
    assert!(x.len() <= e.len());
    assert_eq!(bits.len(), e.len() / 8);
    let full = x.len() / 8 * 8;
    let mut lanes = [0f64; 8];
    let (eh, et) = e.split_at_mut(full);
    for (ec, xc) in eh.chunks_exact_mut(8).zip(x.chunks_exact(8)) {
        let ec = lanes8_mut(ec);
        *ec = add8(ec, lanes8(xc));
        sq8(&mut lanes, ec);
    }
    let mut ss: f64 = lanes.iter().sum();
    for (k, v) in et.iter_mut().enumerate() {
        *v += x.get(full + k).copied().unwrap_or(0.0);
        ss += *v as f64 * *v as f64;
    }
    let s = (ss / e.len() as f64).sqrt() as f32;
    pack_and_feedback(e, bits, s);
    s
}

/// Sign bits (MSB-first) of `buf` into `bits` and `buf ← buf − s·sign(buf)`.
pub fn pack_and_feedback(buf: &mut [f32], bits: &mut [u8], s: f32) {
    let sb = s.to_bits();
    for (c, byte) in buf.chunks_exact_mut(8).zip(bits.iter_mut()) {
        let c = lanes8_mut(c);
        let v = *c;
        *byte = pack8(&v, sb, c);
    }
}

/// Packs the signs of `x` (1 where `x ≥ 0`) MSB-first; `x.len()` a multiple of 8.
pub fn pack_signs(x: &[f32], bits: &mut [u8]) {
    for (c, byte) in x.chunks_exact(8).zip(bits.iter_mut()) {
        let mut b = 0u32;
        for (j, v) in c.iter().enumerate() {
            b |= ((*v >= 0.0) as u32) << (7 - j);
        }
        *byte = b as u8;
    }
}

/// Decompression: `out[i] = s·(2·bit_i − 1)` for the MSB-first bits (`out.len() ≤ 8·bits`).
pub fn unpack_scaled(bits: &[u8], s: f32, out: &mut [f32]) {
    let sb = s.to_bits();
    let full = out.len() / 8;
    let mut it = out.chunks_exact_mut(8);
    for (c, &b) in (&mut it).zip(bits) {
        *lanes8_mut(c) = unpack8(sb, b);
    }
    for (j, o) in it.into_remainder().iter_mut().enumerate() {
        *o = signed(sb, bits[full], j);
    }
}

/// `acc[i] += s·(2·bit_i − 1)` (the server's weighted sum of decompressed chunks);
/// `acc.len() ≤ 8·bits` (a partial last byte uses its leading bits).
pub fn unpack_accumulate(bits: &[u8], s: f32, acc: &mut [f32]) {
    unpack_with(bits, s, acc, |a, v| *a += v);
}

/// `acc[i] = 0.0 + s·(2·bit_i − 1)`: the first term of a sum that starts at zero, without
/// zeroing `acc` first (`0.0 + v` is kept: it turns −0 into +0 exactly as the zeroed sum).
pub fn unpack_first(bits: &[u8], s: f32, acc: &mut [f32]) {
    unpack_with(bits, s, acc, |a, v| *a = 0.0 + v);
}

/// Applies `f(acc[i], s·(2·bit_i − 1))` over 8-lane chunks, then the remainder.
#[inline(always)]
fn unpack_with(bits: &[u8], s: f32, acc: &mut [f32], f: impl Fn(&mut f32, f32)) {
    let sb = s.to_bits();
    let full = acc.len() / 8;
    let mut it = acc.chunks_exact_mut(8);
    for (c, &b) in (&mut it).zip(bits) {
        let c = lanes8_mut(c);
        let v = unpack8(sb, b);
        for j in 0..8 {
            f(&mut c[j], v[j]);
        }
    }
    for (j, o) in it.into_remainder().iter_mut().enumerate() {
        f(o, signed(sb, bits[full], j));
    }
}

/// The server's sum in one pass: `err ← ((0.0 + Σ_i s_i·sign_i) + err)` (terms added in
/// message order, as a zeroed accumulator would) and returns Σ of its squares in the lanes
/// of [`rms`]. Every message holds `err.len()/8` bytes; `err.len()` a multiple of 8.
fn server_sum_sq(msgs: &[(Vec<u8>, f32)], err: &mut [f32]) -> f64 {
    let sbs: Vec<u32> = msgs.iter().map(|(_, s)| s.to_bits()).collect();
    let mut lanes = [0f64; 8];
    for (k, ec) in err.chunks_exact_mut(8).enumerate() {
        let ec = lanes8_mut(ec);
        let mut z = [0f32; 8];
        for ((b, _), &sb) in msgs.iter().zip(&sbs) {
            let v = unpack8(sb, b[k]);
            for j in 0..8 {
                z[j] += v[j];
            }
        }
        for j in 0..8 {
            ec[j] += z[j];
        }
        // `ec` now holds z + err; the sum order above is (0 + a_1 + … + a_P) + err.
        sq8(&mut lanes, ec);
    }
    lanes.iter().sum()
}

fn push_scale(v: &mut Vec<u8>, s: f32) {
    v.extend_from_slice(&s.to_le_bytes());
}

fn split_scale(mut v: Vec<u8>) -> Result<(Vec<u8>, f32)> {
    if v.len() < 4 {
        bail!("1-bit message of {} bytes lacks its scale", v.len());
    }
    let at = v.len() - 4;
    let s = f32::from_le_bytes(v[at..].try_into().expect("4 bytes"));
    v.truncate(at);
    Ok((v, s))
}

/// Which 1-bit variant a [`OneBitState`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// DeepSpeed's two-stage compressed allreduce (worker and server compression).
    Server,
    /// Baseline: every rank allgathers every rank's packed signs and scale, then averages;
    /// no server stage (pads to a multiple of 8 only).
    Naive,
}

/// The error buffers of one rank, kept across the calls of a run.
#[derive(Clone, Debug)]
pub struct OneBitState {
    pub variant: Variant,
    /// World size the buffers were sized for.
    pub p: usize,
    /// Unpadded fused length.
    pub n: usize,
    /// Worker error, padded length.
    pub worker_error: Vec<f32>,
    /// Server error of this rank's chunk (`padded/P`; empty for [`Variant::Naive`]).
    pub server_error: Vec<f32>,
    /// Buffers reused across calls (fresh allocations of this size cost page faults).
    scratch: Scratch,
}

#[derive(Clone, Debug, Default)]
struct Scratch {
    bits: Vec<u8>,
}

impl OneBitState {
    /// Zero errors for a fused buffer of `n` elements on `p` ranks.
    pub fn new(variant: Variant, p: usize, n: usize) -> Self {
        let npad = match variant {
            Variant::Server => padded_len(p, n),
            Variant::Naive => n.div_ceil(8) * 8,
        };
        let server = match variant {
            Variant::Server if p > 1 => npad / p,
            _ => 0,
        };
        OneBitState {
            variant,
            p,
            n,
            worker_error: vec![0.0; npad],
            server_error: vec![0.0; server],
            scratch: Scratch::default(),
        }
    }

    /// Padded length of the fused buffer.
    pub fn padded(&self) -> usize {
        self.worker_error.len()
    }

    /// Compressed allreduce of `data` in place: on return every rank holds the same
    /// compressed average. `data.len()` must equal the `n` the state was made for.
    pub fn allreduce(&mut self, comm: &dyn Comm, data: &mut [f32]) -> Result<()> {
        let p = comm.size();
        if p != self.p || data.len() != self.n {
            bail!(
                "1-bit state is for {} ranks and {} elements, but this call has {} ranks and {} elements",
                self.p,
                self.n,
                p,
                data.len()
            );
        }
        if p == 1 {
            return Ok(()); // DeepSpeed skips the compressed allreduce when n == 1.
        }
        match self.variant {
            Variant::Server => self.allreduce_server(comm, data),
            Variant::Naive => self.allreduce_naive(comm, data),
        }
    }

    /// Step 1 on this rank: the sign bits of `x + worker_error` into `scratch.bits` and the
    /// new worker error, in the two passes of [`compress_with_feedback`]. Returns the scale.
    fn worker_compress(&mut self, comm: &dyn Comm, data: &[f32]) -> f32 {
        let _ph = comm.phase("compress");
        let e = &mut self.worker_error;
        self.scratch.bits.resize(e.len() / 8, 0);
        compress_with_feedback(data, e, &mut self.scratch.bits)
    }

    fn allreduce_server(&mut self, comm: &dyn Comm, data: &mut [f32]) -> Result<()> {
        let p = comm.size();
        let s_w = self.worker_compress(comm, data);
        let bits = &self.scratch.bits;
        let cb = bits.len() / p; // bytes per chunk
        let chunk_len = cb * 8;
        // Phase 1: alltoall of the sign chunks, each with the sender's worker scale.
        let sends: Vec<Vec<u8>> = (0..p)
            .map(|k| {
                let mut m = Vec::with_capacity(cb + 4);
                m.extend_from_slice(&bits[k * cb..(k + 1) * cb]);
                push_scale(&mut m, s_w);
                m
            })
            .collect();
        let got = {
            let _ph = comm.phase("alltoall");
            comm.alltoallv(sends)
        };
        // Server stage on chunk r: z = Σ_i (s_i/P)·sign_i (rank order) + server_error, summed
        // in one pass into the server error's buffer together with Σz²; one more pass packs
        // z and leaves the new error there.
        let mine = {
            let _ph = comm.phase("server");
            let mut msgs = Vec::with_capacity(p);
            for m in got {
                let (b, s) = split_scale(m)?;
                if b.len() != cb {
                    bail!("1-bit chunk of {} bytes, expected {cb}", b.len());
                }
                msgs.push((b, s));
            }
            for (_, s) in &mut msgs {
                *s /= p as f32;
            }
            let err = &mut self.server_error;
            let ss = server_sum_sq(&msgs, err);
            let s_s = if err.is_empty() {
                0.0
            } else {
                (ss / err.len() as f64).sqrt() as f32
            };
            let mut sb = vec![0u8; cb + 4];
            pack_and_feedback(err, &mut sb[..cb], s_s);
            sb[cb..].copy_from_slice(&s_s.to_le_bytes());
            sb
        };
        // Phase 2: ring allgather of the packed server chunks with their scales.
        let all = {
            let _ph = comm.phase("allgather");
            comm.allgatherv(mine)
        };
        let _ph = comm.phase("decompress");
        for (k, m) in all.into_iter().enumerate() {
            let (b, s) = split_scale(m)?;
            let lo = k * chunk_len;
            if lo >= data.len() {
                break;
            }
            let hi = ((k + 1) * chunk_len).min(data.len());
            unpack_scaled(&b, s, &mut data[lo..hi]);
        }
        Ok(())
    }

    fn allreduce_naive(&mut self, comm: &dyn Comm, data: &mut [f32]) -> Result<()> {
        let p = comm.size();
        let s_w = self.worker_compress(comm, data);
        let mut bits = std::mem::take(&mut self.scratch.bits);
        push_scale(&mut bits, s_w);
        let all = {
            let _ph = comm.phase("allgather");
            comm.allgatherv(bits)
        };
        // The average straight into `data` (the padding is never read): the first term
        // written, the others added, in rank order.
        let _ph = comm.phase("decompress");
        for (i, m) in all.into_iter().enumerate() {
            let (b, s) = split_scale(m)?;
            if b.len() * 8 < data.len() {
                bail!("1-bit message of {} bytes is too short", b.len());
            }
            if i == 0 {
                unpack_first(&b, s / p as f32, data);
            } else {
                unpack_accumulate(&b, s / p as f32, data);
            }
        }
        Ok(())
    }
}

/// The `--state` file: every rank's error buffers, little-endian.
///
/// ```text
/// magic        8 bytes  "GKONEBIT"
/// version      u32      1
/// variant      u32      0 = onebit (server), 1 = onebit-naive
/// world_size   u32      P
/// n            u64      unpadded fused length
/// padded       u64      worker error length
/// server_len   u64      server error length per rank (padded/P, or 0)
/// then for rank 0..P: worker_error (padded × f32), server_error (server_len × f32)
/// ```
pub struct StateFile;

const MAGIC: &[u8; 8] = b"GKONEBIT";

impl StateFile {
    /// Writes `states` (rank order) to `path` atomically (temporary file and rename).
    pub fn save(path: &Path, states: &[OneBitState]) -> Result<()> {
        let first = states.first().context("no 1-bit state to save")?;
        let mut w: Vec<u8> = Vec::new();
        w.extend_from_slice(MAGIC);
        w.extend_from_slice(&1u32.to_le_bytes());
        let v = match first.variant {
            Variant::Server => 0u32,
            Variant::Naive => 1,
        };
        w.extend_from_slice(&v.to_le_bytes());
        w.extend_from_slice(&(states.len() as u32).to_le_bytes());
        w.extend_from_slice(&(first.n as u64).to_le_bytes());
        w.extend_from_slice(&(first.padded() as u64).to_le_bytes());
        w.extend_from_slice(&(first.server_error.len() as u64).to_le_bytes());
        for s in states {
            for x in s.worker_error.iter().chain(&s.server_error) {
                w.extend_from_slice(&x.to_le_bytes());
            }
        }
        gradkit_core::io::write_file_atomic(path, &w)
            .with_context(|| format!("writing 1-bit state (--state {})", path.display()))
    }

    /// Reads every rank's state; checks it matches (variant, P, n).
    pub fn load(path: &Path, variant: Variant, p: usize, n: usize) -> Result<Vec<OneBitState>> {
        let ctx = || format!("reading 1-bit state (--state {})", path.display());
        let mut f = std::io::BufReader::new(std::fs::File::open(path).with_context(ctx)?);
        let mut head = [0u8; 44];
        f.read_exact(&mut head)
            .with_context(|| format!("{}: file too short", ctx()))?;
        let u32_at = |o: usize| u32::from_le_bytes(head[o..o + 4].try_into().expect("4"));
        let u64_at = |o: usize| u64::from_le_bytes(head[o..o + 8].try_into().expect("8"));
        if &head[..8] != MAGIC || u32_at(8) != 1 {
            bail!("{}: not a gradkit 1-bit state file", ctx());
        }
        let fv = if u32_at(12) == 0 {
            Variant::Server
        } else {
            Variant::Naive
        };
        let (fp, fnn) = (u32_at(16) as usize, u64_at(20) as usize);
        if fv != variant || fp != p || fnn != n {
            bail!(
                "{}: saved for {:?} on {fp} ranks with {fnn} elements, but this run is {:?} on {p} ranks with {n} elements",
                ctx(), fv, variant
            );
        }
        let proto = OneBitState::new(variant, p, n);
        if u64_at(28) as usize != proto.padded() || u64_at(36) as usize != proto.server_error.len()
        {
            bail!("{}: buffer lengths do not match the padding rule", ctx());
        }
        let mut out = Vec::with_capacity(p);
        let mut buf = vec![0u8; 4 * (proto.padded() + proto.server_error.len())];
        for _ in 0..p {
            f.read_exact(&mut buf)
                .with_context(|| format!("{}: file truncated", ctx()))?;
            let vals: Vec<f32> = buf
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
                .collect();
            let mut s = proto.clone();
            let (w, sv) = vals.split_at(proto.padded());
            s.worker_error.copy_from_slice(w);
            s.server_error.copy_from_slice(sv);
            out.push(s);
        }
        Ok(out)
    }
}

/// `--algo onebit` / `onebit-naive` as a [`Reducer`]: dense input (sparse is densified),
/// dense output = the compressed average. Uses `params.state`.
pub struct OneBitReducer {
    variant: Variant,
    state_path: Option<PathBuf>,
    state: Option<OneBitState>,
}

impl OneBitReducer {
    pub fn new(variant: Variant, state_path: Option<PathBuf>) -> Self {
        OneBitReducer {
            variant,
            state_path,
            state: None,
        }
    }

    /// Fresh zero errors, or this rank's share of the `--state` file when it exists
    /// (rank 0 reads it and sends every rank its buffers in the `io` phase).
    fn init_state(&self, comm: &dyn Comm, n: usize) -> Result<OneBitState> {
        let (p, r) = (comm.size(), comm.rank());
        let fresh = OneBitState::new(self.variant, p, n);
        let Some(path) = &self.state_path else {
            return Ok(fresh);
        };
        let _io = comm.phase(gradkit_comm::dist::IO_PHASE);
        // Rank 0 decides (exists / loaded / error) and tells everyone, so no rank blocks.
        let loaded = if r == 0 {
            let res = if path.exists() {
                StateFile::load(path, self.variant, p, n).map(Some)
            } else {
                Ok(None)
            };
            let code: u32 = match &res {
                Ok(Some(_)) => 1,
                Ok(None) => 0,
                Err(_) => 2,
            };
            comm.broadcast(0, Some(vec![code]));
            match res? {
                Some(mut all) => {
                    for (q, s) in all.iter().enumerate().skip(1) {
                        comm.send(q, s.worker_error.clone());
                        comm.send(q, s.server_error.clone());
                    }
                    Some(all.swap_remove(0))
                }
                None => None,
            }
        } else {
            let code: Vec<u32> = comm.broadcast(0, None);
            match code[0] {
                0 => None,
                1 => {
                    let mut s = fresh.clone();
                    s.worker_error = comm.recv(0);
                    s.server_error = comm.recv(0);
                    Some(s)
                }
                _ => bail!("rank 0 could not read --state {}", path.display()),
            }
        };
        Ok(loaded.unwrap_or(fresh))
    }
}

impl Reducer for OneBitReducer {
    fn name(&self) -> &'static str {
        match self.variant {
            Variant::Server => "onebit",
            Variant::Naive => "onebit-naive",
        }
    }

    fn reduce(
        &mut self,
        comm: &dyn Comm,
        _step: u32,
        layout: &Layout,
        input: Flat,
    ) -> Result<StepOutput> {
        let n = layout.total() as usize;
        let mut data = match input {
            Flat::Dense(v) => v,
            s @ Flat::Sparse(_) => s.to_dense(n),
        };
        if data.len() != n {
            bail!(
                "1-bit input has {} values but the layout has {n}",
                data.len()
            );
        }
        if self.state.is_none() {
            self.state = Some(self.init_state(comm, n)?);
        }
        let st = self.state.as_mut().expect("initialised");
        st.allreduce(comm, &mut data)?;
        let mut out = StepOutput::new(Flat::Dense(data));
        out.metrics.push(("padded_len".into(), st.padded() as f64));
        out.metrics
            .push(("worker_error_norm".into(), sum_sq(&st.worker_error).sqrt()));
        out.metrics
            .push(("server_error_norm".into(), sum_sq(&st.server_error).sqrt()));
        Ok(out)
    }

    /// Saves every rank's errors to `--state` (gathered to rank 0 in the `io` phase).
    fn finish(&mut self, comm: &dyn Comm) -> Result<()> {
        let (Some(path), Some(st)) = (&self.state_path, &self.state) else {
            return Ok(());
        };
        let _io = comm.phase(gradkit_comm::dist::IO_PHASE);
        let (p, r) = (comm.size(), comm.rank());
        if r == 0 {
            let mut all = vec![st.clone()];
            for q in 1..p {
                let mut s = st.clone();
                s.worker_error = comm.recv(q);
                s.server_error = comm.recv(q);
                all.push(s);
            }
            StateFile::save(path, &all)
        } else {
            comm.send(0, st.worker_error.clone());
            comm.send(0, st.server_error.clone());
            Ok(())
        }
    }
}
