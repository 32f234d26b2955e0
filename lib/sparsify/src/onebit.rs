//! The pure kernels of DeepSpeed's error-compensated 1-bit compressor (1-bit Adam / 1-bit
//! LAMB, onebit-lamb.md §2): the fused `x + e → signs, scale, new e` pass, sign packing and
//! the decompress/accumulate passes. No communication: `gradkit_collectives::onebit` runs the
//! compressed allreduce on top of these (and re-exports them), and [`crate::kernels::Cpu`]
//! exposes them behind the [`crate::kernels::Kernels`] interface.
//!
//! Conventions shared by every function here:
//! * the scale is the RMS `‖c‖₂/√len` of the compressed buffer, its sum of squares
//!   accumulated in f64 in eight fixed lanes ([`sum_sq`]), so the result does not depend on
//!   threads or vector width;
//! * sign bits are packed MSB-first (`cupy.packbits`, onebit-lamb.md §2 "Packing"), bit 1
//!   where `c ≥ 0` (so +0 **and −0** count as +1; a NaN compares false and gets bit 0, i.e.
//!   `−s`);
//! * a decompressed value is `±s` built from the bits of `s` (sign bit flipped where the
//!   packed bit is 0), i.e. exactly `s·(2·bit − 1)`.
//!
//! Speed (docs/MEMORY.md): every pass runs over blocks of [`WORD`] = 32 lanes, i.e. one
//! little-endian `u32` of packed bits (four MSB-first bytes). Lane `i` of a block owns the bit
//! [`LANE_BIT`]`[i]` of that word, so packing is "compare, AND with a constant, OR" and
//! unpacking is "AND with a constant, compare with 0, flip the sign bit" on whole vectors of
//! lanes: plain safe Rust that LLVM vectorises (SSE2 on the default x86-64 target), no
//! shifts by per-lane amounts; the two one-pass kernels are also compiled for AVX2 and
//! picked at run time (the module `avx2`, the only `unsafe` here: the call after the CPU
//! check). Lengths that are not a multiple of 32 finish
//! byte by byte (eight lanes) and then bit by bit. The f64 sums of squares keep the order of
//! the scalar eight-lane loop, so the scales are bit-identical to it.

/// Lanes per block: the 32 bits of one little-endian `u32` word of packed signs.
pub const WORD: usize = 32;

/// `LANE_BIT[i]`: the bit of the little-endian `u32` word that holds lane `i` of a block
/// (byte `i/8`, MSB-first inside the byte).
pub const LANE_BIT: [u32; WORD] = lane_bits();

const fn lane_bits() -> [u32; WORD] {
    let mut w = [0u32; WORD];
    let mut i = 0;
    while i < WORD {
        w[i] = 1 << (8 * (i / 8) + 7 - i % 8);
        i += 1;
    }
    w
}

const SIGN: u32 = 0x8000_0000;

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
pub fn sum_sq(x: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let mut it = x.chunks_exact(8);
    for c in &mut it {
        sq8(&mut lanes, c);
    }
    let mut s: f64 = lanes.iter().sum();
    for &v in it.remainder() {
        s += (v as f64) * (v as f64);
    }
    s
}

/// `lanes[j] += c[j]²` in f64 (eight independent lanes: the compiler keeps them in vector
/// registers). `c` holds at least eight values; the first eight are used.
#[inline(always)]
fn sq8(lanes: &mut [f64; 8], c: &[f32]) {
    let c: &[f32; 8] = c[..8].try_into().expect("8 lanes");
    for j in 0..8 {
        let v = c[j] as f64;
        lanes[j] += v * v;
    }
}

/// `±s` for one lane: the bits of `s` with the sign bit flipped unless `pos`.
#[inline(always)]
fn signed(s_bits: u32, pos: bool) -> f32 {
    f32::from_bits(s_bits ^ if pos { 0 } else { SIGN })
}

/// Whether bit `j` (MSB-first) of `byte` is set.
#[inline(always)]
fn bit_of(byte: u8, j: usize) -> bool {
    byte & (0x80 >> j) != 0
}

/// One lane of the compressor: sign of `c` (1 where `c ≥ 0`) and the error `c − (±s)`.
#[inline(always)]
fn feedback(c: f32, s_bits: u32) -> (bool, f32) {
    let pos = c >= 0.0;
    (pos, c - signed(s_bits, pos))
}

/// The packed word of 32 lanes after `out[i] = f(i, out[i]).1` for each lane, where `f`
/// returns the lane's sign and new value: the fused pack + feedback body of every
/// compressor here.
#[inline(always)]
fn pack_block(out: &mut [f32], f: impl Fn(usize, f32) -> (bool, f32)) -> u32 {
    let out: &mut [f32; WORD] = out.try_into().expect("32 lanes");
    let mut w = 0u32;
    for i in 0..WORD {
        let (pos, v) = f(i, out[i]);
        out[i] = v;
        w |= if pos { LANE_BIT[i] } else { 0 };
    }
    w
}

/// The byte-by-byte tail of a fused pack + feedback: for each whole group of eight lanes of
/// `out`, its sign byte into `bits` and `out[i] = f(i, out[i]).1` (indices relative to
/// `out`).
#[inline(always)]
fn pack_tail(out: &mut [f32], bits: &mut [u8], f: impl Fn(usize, f32) -> (bool, f32)) {
    for (k, (c, byte)) in out.chunks_exact_mut(8).zip(bits.iter_mut()).enumerate() {
        let mut b = 0u8;
        for (j, o) in c.iter_mut().enumerate() {
            let (pos, v) = f(8 * k + j, *o);
            *o = v;
            b |= (pos as u8) << (7 - j);
        }
        *byte = b;
    }
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

/// Pass 1 of the worker's compressor: Σ(e + x)² in f64 without writing anything (`x`
/// zero-padded to `e.len()`). Lanes over the whole eight-lane chunks of `x`, added in order,
/// then the rest of `e` one by one — the order of `e += x` followed by the loop of
/// [`sum_sq`] over `x`'s chunks, so the scale is bit-identical to that two-step form.
fn sum_sq_of_sum(x: &[f32], e: &[f32]) -> f64 {
    let full = x.len() / 8 * 8;
    let mut lanes = [0f64; 8];
    for (ec, xc) in e[..full].chunks_exact(8).zip(x.chunks_exact(8)) {
        let c: [f32; 8] = std::array::from_fn(|j| ec[j] + xc[j]);
        sq8(&mut lanes, &c);
    }
    let mut ss: f64 = lanes.iter().sum();
    for (k, &v) in e[full..].iter().enumerate() {
        let c = v + x.get(full + k).copied().unwrap_or(0.0);
        ss += c as f64 * c as f64;
    }
    ss
}

/// The worker's compressor (onebit-lamb.md §2, step 1): with `c = e + x` (elements of `e`
/// past `x.len()`, the padding, get `+ 0.0`), the sign bits of `c` MSB-first into `bits`,
/// `e ← c − s·sign(c)`, returns `s = ‖c‖₂/√len(e)`. Bit for bit what `e += x` (zero-padded)
/// followed by [`compress_into`] gives. Two passes, because the scale needs the whole sum
/// before the first error can be written: pass 1 reads `x` and `e` (Σc² in f64, nothing
/// written); pass 2 reads `x` and `e` again, recomputes the same `c` and writes `e` and the
/// bits — five streams of the buffer in all, the least a settled error allows.
/// `e.len()` must be a multiple of 8 and `≥ x.len()`; `bits.len() == e.len()/8`.
pub fn compress_with_feedback(x: &[f32], e: &mut [f32], bits: &mut [u8]) -> f32 {
    check_lengths(x, e, bits);
    if e.is_empty() {
        return 0.0; // as [`rms`]: an empty buffer has scale 0, not 0/0
    }
    let s = (sum_sq_of_sum(x, e) / e.len() as f64).sqrt() as f32;
    let sb = s.to_bits();
    let blocks = x.len() / WORD;
    let (eh, et) = e.split_at_mut(blocks * WORD);
    let (bh, bt) = bits.split_at_mut(blocks * WORD / 8);
    for ((ec, xc), bw) in eh
        .chunks_exact_mut(WORD)
        .zip(x.chunks_exact(WORD))
        .zip(bh.chunks_exact_mut(4))
    {
        let xc: &[f32; WORD] = xc.try_into().expect("32 lanes");
        let w = pack_block(ec, |i, e| feedback(e + xc[i], sb));
        bw.copy_from_slice(&w.to_le_bytes());
    }
    let xt = &x[blocks * WORD..];
    pack_tail(et, bt, |i, e| {
        feedback(e + xt.get(i).copied().unwrap_or(0.0), sb)
    });
    s
}

/// The length contract of the worker compressors: `e` padded to a multiple of 8, at least as
/// long as `x`, one bit per element in `bits`.
fn check_lengths(x: &[f32], e: &[f32], bits: &[u8]) {
    assert_eq!(
        e.len() % 8,
        0,
        "1-bit buffers are padded to a multiple of 8"
    );
    assert!(x.len() <= e.len());
    assert_eq!(bits.len(), e.len() / 8);
}

/// The error `c − due·sign(c)` that a buffer holding the compressed values `c` of the last
/// call still owes (`due` = that call's scale; `due = 0.0` is exactly the identity, so a
/// settled buffer passes through unchanged).
#[inline(always)]
fn settle(c: f32, due_bits: u32) -> f32 {
    feedback(c, due_bits).1
}

/// The worker's compressor in **one pass**, with the error kept *unsettled* between calls
/// (docs/MEMORY.md): on entry `e` holds the compressed input `c'` of the previous call, whose
/// feedback `e = c' − due·sign(c')` is applied here while reading it (`due = 0.0` for an
/// error that is already settled: the identity). With `c = e + x` (padding `+ 0.0`), writes
/// `c` into `e` and its sign bits MSB-first into `bits`, and returns `s = ‖c‖₂/√len(e)` —
/// the next call's `due`. Reads `x` and `e` and writes `e` once: three streams instead of
/// five. Bit for bit what [`compress_with_feedback`] computes (scale, bits, and the settled
/// error `settle_errors(e, s)`), since it applies the same f32 operations in the same order
/// and sums squares in the same lanes. Lengths as [`compress_with_feedback`].
pub fn compress_deferred(x: &[f32], e: &mut [f32], bits: &mut [u8], due: f32) -> f32 {
    check_lengths(x, e, bits);
    if e.is_empty() {
        return 0.0;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the function only needs AVX2, which this CPU was just checked to have.
        return unsafe { avx2::compress_deferred(x, e, bits, due) };
    }
    compress_deferred_body(x, e, bits, due)
}

/// The body of [`compress_deferred`] after its checks, compiled into both the baseline build
/// and [`avx2`].
#[inline(always)]
fn compress_deferred_body(x: &[f32], e: &mut [f32], bits: &mut [u8], due: f32) -> f32 {
    let db = due.to_bits();
    let (b32, b8) = (x.len() / WORD * WORD, x.len() / 8 * 8);
    let mut lanes = [0f64; 8];
    for ((ec, xc), bw) in e[..b32]
        .chunks_exact_mut(WORD)
        .zip(x.chunks_exact(WORD))
        .zip(bits.chunks_exact_mut(4))
    {
        let w = pack_block(ec, |i, v| {
            let c = settle(v, db) + xc[i];
            (c >= 0.0, c)
        });
        bw.copy_from_slice(&w.to_le_bytes());
        for q in 0..4 {
            sq8(&mut lanes, &ec[8 * q..]);
        }
    }
    let (xt, et, bt) = (&x[b32..], &mut e[b32..], &mut bits[b32 / 8..]);
    pack_tail(et, bt, |i, v| {
        let c = settle(v, db) + xt.get(i).copied().unwrap_or(0.0);
        (c >= 0.0, c)
    });
    for c in et[..b8 - b32].chunks_exact(8) {
        sq8(&mut lanes, c);
    }
    let mut ss: f64 = lanes.iter().sum();
    for &c in &et[b8 - b32..] {
        ss += c as f64 * c as f64;
    }
    (ss / e.len() as f64).sqrt() as f32
}

/// Settles a buffer left by [`compress_deferred`] / [`server_sum_deferred`] in place:
/// `e ← e − due·sign(e)` (what [`compress_with_feedback`] would have left there).
pub fn settle_errors(e: &mut [f32], due: f32) {
    let db = due.to_bits();
    for v in e.iter_mut() {
        *v = settle(*v, db);
    }
}

/// Σ of the squares of the settled values `e − due·sign(e)` in the lanes of [`sum_sq`],
/// without writing: `sum_sq` of what [`settle_errors`] would leave, bit for bit.
pub fn settled_sum_sq(e: &[f32], due: f32) -> f64 {
    let db = due.to_bits();
    let mut lanes = [0f64; 8];
    let mut it = e.chunks_exact(8);
    for c in &mut it {
        let v: [f32; 8] = std::array::from_fn(|j| settle(c[j], db));
        sq8(&mut lanes, &v);
    }
    let mut s: f64 = lanes.iter().sum();
    for &c in it.remainder() {
        let v = settle(c, db) as f64;
        s += v * v;
    }
    s
}

/// The server stage in **one pass** (onebit-lamb.md §2 step 3, error kept unsettled as in
/// [`compress_deferred`]): `err` holds last call's `z'` with `due·sign(z')` still owed;
/// writes `z = (0.0 + Σ_i s_i·sign_i) + (z' − due·sign(z'))` into `err` and the sign bits
/// of `z` MSB-first into `out` (`err.len()/8` bytes), returns Σz² in the lanes of [`rms`].
/// The scale `√(Σz²/len)` is the next call's `due`. Bit for bit [`server_sum_sq`] followed
/// by [`pack_and_feedback`] (bits, and the error once settled).
pub fn server_sum_deferred(
    msgs: &[(Vec<u8>, f32)],
    err: &mut [f32],
    due: f32,
    out: &mut [u8],
) -> f64 {
    check_server(msgs, err, out);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the function only needs AVX2, which this CPU was just checked to have.
        return unsafe { avx2::server_sum_deferred(msgs, err, due, out) };
    }
    server_sum_deferred_body(msgs, err, due, out)
}

/// The body of [`server_sum_deferred`] after its checks (baseline build and [`avx2`]).
#[inline(always)]
fn server_sum_deferred_body(
    msgs: &[(Vec<u8>, f32)],
    err: &mut [f32],
    due: f32,
    out: &mut [u8],
) -> f64 {
    let sbs: Vec<u32> = msgs.iter().map(|(_, s)| s.to_bits()).collect();
    let db = due.to_bits();
    let mut lanes = [0f64; 8];
    let blocks = err.len() / WORD;
    let (head, tail) = err.split_at_mut(blocks * WORD);
    let (oh, ot) = out.split_at_mut(blocks * 4);
    for (k, (ec, ow)) in head
        .chunks_exact_mut(WORD)
        .zip(oh.chunks_exact_mut(4))
        .enumerate()
    {
        let z = block_sum(&sbs, |m| {
            u32::from_le_bytes(msgs[m].0[4 * k..4 * k + 4].try_into().expect("4 bytes"))
        });
        let w = pack_block(ec, |i, v| {
            let c = z[i] + settle(v, db);
            (c >= 0.0, c)
        });
        ow.copy_from_slice(&w.to_le_bytes());
        for q in 0..4 {
            sq8(&mut lanes, &ec[8 * q..]);
        }
    }
    for (k, (ec, ob)) in tail.chunks_exact_mut(8).zip(ot.iter_mut()).enumerate() {
        let z = block_sum(&sbs, |m| u32::from(msgs[m].0[blocks * 4 + k]));
        // The byte sits in the low 8 bits of the word, where lanes 0..8 read it.
        pack_tail(ec, std::slice::from_mut(ob), |j, v| {
            let c = z[j] + settle(v, db);
            (c >= 0.0, c)
        });
        sq8(&mut lanes, ec);
    }
    lanes.iter().sum()
}

/// The two one-pass kernels compiled for AVX2, chosen at run time on x86-64 CPUs that have
/// it. Same f32/f64 operations in the same order as the baseline (SSE2) build — Rust never
/// fuses or reassociates floating point — so both give the same bits; AVX2 halves the
/// instructions per byte, which counts when ranks share cores (docs/MEMORY.md: 4 ranks on 2
/// cores). Measured on the development machine, one thread, 64 MiB: the one-pass compress
/// 9.9–11.3 ms vs 14.3–17.9 ms, the server stage 3.6–3.8 vs 5.5–5.6 ms
/// (docs/results/onebit-embrace.md).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    #[target_feature(enable = "avx2")]
    pub(super) fn compress_deferred(x: &[f32], e: &mut [f32], bits: &mut [u8], due: f32) -> f32 {
        super::compress_deferred_body(x, e, bits, due)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn server_sum_deferred(
        msgs: &[(Vec<u8>, f32)],
        err: &mut [f32],
        due: f32,
        out: &mut [u8],
    ) -> f64 {
        super::server_sum_deferred_body(msgs, err, due, out)
    }
}

/// The length contract of [`server_sum_deferred`].
fn check_server(msgs: &[(Vec<u8>, f32)], err: &[f32], out: &[u8]) {
    assert_eq!(err.len() % 8, 0, "1-bit server chunks are whole bytes");
    assert_eq!(out.len(), err.len() / 8, "1-bit server output bytes");
    for (b, _) in msgs {
        assert!(b.len() * 8 >= err.len(), "1-bit server message too short");
    }
}

/// The baseline (no AVX2) builds of the one-pass kernels, whatever the CPU: for tests that
/// check the run-time dispatch gives the same bits.
#[doc(hidden)]
pub mod portable {
    /// [`super::compress_deferred`] without the AVX2 dispatch.
    pub fn compress_deferred(x: &[f32], e: &mut [f32], bits: &mut [u8], due: f32) -> f32 {
        super::check_lengths(x, e, bits);
        if e.is_empty() {
            return 0.0;
        }
        super::compress_deferred_body(x, e, bits, due)
    }

    /// [`super::server_sum_deferred`] without the AVX2 dispatch.
    pub fn server_sum_deferred(
        msgs: &[(Vec<u8>, f32)],
        err: &mut [f32],
        due: f32,
        out: &mut [u8],
    ) -> f64 {
        super::check_server(msgs, err, out);
        super::server_sum_deferred_body(msgs, err, due, out)
    }
}

/// Sign bits (MSB-first) of `buf` into `bits` and `buf ← buf − s·sign(buf)`, for the first
/// `min(buf.len()/8, bits.len())` groups of eight (the server's second pass,
/// onebit-lamb.md §2 step 3). One read-modify-write pass of `buf`.
pub fn pack_and_feedback(buf: &mut [f32], bits: &mut [u8], s: f32) {
    let groups = (buf.len() / 8).min(bits.len());
    let (buf, bits) = (&mut buf[..8 * groups], &mut bits[..groups]);
    let sb = s.to_bits();
    let blocks = groups / 4;
    let (bh, btail) = buf.split_at_mut(blocks * WORD);
    let (wh, wtail) = bits.split_at_mut(blocks * 4);
    for (c, bw) in bh.chunks_exact_mut(WORD).zip(wh.chunks_exact_mut(4)) {
        let w = pack_block(c, |_, v| feedback(v, sb));
        bw.copy_from_slice(&w.to_le_bytes());
    }
    pack_tail(btail, wtail, |_, v| feedback(v, sb));
}

/// Packs the signs of `x` (1 where `x ≥ 0`) MSB-first into the first `x.len()/8` bytes of
/// `bits` (at most `bits.len()`).
pub fn pack_signs(x: &[f32], bits: &mut [u8]) {
    let groups = (x.len() / 8).min(bits.len());
    let blocks = groups / 4;
    for (c, bw) in x
        .chunks_exact(WORD)
        .zip(bits.chunks_exact_mut(4))
        .take(blocks)
    {
        let mut w = 0u32;
        for i in 0..WORD {
            w |= if c[i] >= 0.0 { LANE_BIT[i] } else { 0 };
        }
        bw.copy_from_slice(&w.to_le_bytes());
    }
    let tail = &x[blocks * WORD..8 * groups];
    for (c, byte) in tail.chunks_exact(8).zip(&mut bits[blocks * 4..groups]) {
        let mut b = 0u8;
        for (j, v) in c.iter().enumerate() {
            b |= ((*v >= 0.0) as u8) << (7 - j);
        }
        *byte = b;
    }
}

/// Decompression: `out[i] = s·(2·bit_i − 1)` for the MSB-first bits (`out.len() ≤ 8·bits`).
pub fn unpack_scaled(bits: &[u8], s: f32, out: &mut [f32]) {
    unpack_with(bits, s, out, |o, v| *o = v);
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

/// Applies `f(acc[i], s·(2·bit_i − 1))` in one pass: over 32-lane blocks (one `u32` of bits
/// each: AND with [`LANE_BIT`], compare, flip the sign bit — vectorised), then whole bytes,
/// then the leading bits of a partial last byte.
#[inline(always)]
fn unpack_with(bits: &[u8], s: f32, acc: &mut [f32], f: impl Fn(&mut f32, f32)) {
    assert!(
        acc.len() <= 8 * bits.len(),
        "1-bit unpack: {} values from {} bytes",
        acc.len(),
        bits.len()
    );
    let sb = s.to_bits();
    let blocks = acc.len() / WORD;
    let (head, tail) = acc.split_at_mut(blocks * WORD);
    for (c, bw) in head.chunks_exact_mut(WORD).zip(bits.chunks_exact(4)) {
        let c: &mut [f32; WORD] = c.try_into().expect("32 lanes");
        let w = u32::from_le_bytes(bw.try_into().expect("4 bytes"));
        for i in 0..WORD {
            f(&mut c[i], signed(sb, w & LANE_BIT[i] != 0));
        }
    }
    for (k, o) in tail.iter_mut().enumerate() {
        f(o, signed(sb, bit_of(bits[blocks * 4 + k / 8], k % 8)));
    }
}

/// The 32 values `Σ_m (±s_m)` of one block, terms added in message order from `0.0` (as a
/// zeroed accumulator would). `word(m)` is message m's packed word for the block.
#[inline(always)]
fn block_sum(sbs: &[u32], word: impl Fn(usize) -> u32) -> [f32; WORD] {
    let mut z = [0f32; WORD];
    for (m, &sb) in sbs.iter().enumerate() {
        let w = word(m);
        for i in 0..WORD {
            z[i] += signed(sb, w & LANE_BIT[i] != 0);
        }
    }
    z
}

/// The server's sum in one pass (onebit-lamb.md §2 step 3): `err ← ((0.0 + Σ_i s_i·sign_i)
/// + err)` (terms added in message order, as a zeroed accumulator would) and returns Σ of
/// its squares in the lanes of [`rms`]. Every message holds `err.len()/8` bytes; `err.len()`
/// a multiple of 8. Reads the P sign chunks and read-modify-writes `err` once.
pub fn server_sum_sq(msgs: &[(Vec<u8>, f32)], err: &mut [f32]) -> f64 {
    assert_eq!(err.len() % 8, 0, "1-bit server chunks are whole bytes");
    for (b, _) in msgs {
        assert!(b.len() * 8 >= err.len(), "1-bit server message too short");
    }
    let sbs: Vec<u32> = msgs.iter().map(|(_, s)| s.to_bits()).collect();
    let mut lanes = [0f64; 8];
    let blocks = err.len() / WORD;
    let (head, tail) = err.split_at_mut(blocks * WORD);
    for (k, ec) in head.chunks_exact_mut(WORD).enumerate() {
        let z = block_sum(&sbs, |m| {
            u32::from_le_bytes(msgs[m].0[4 * k..4 * k + 4].try_into().expect("4 bytes"))
        });
        for i in 0..WORD {
            ec[i] += z[i];
        }
        for q in 0..4 {
            sq8(&mut lanes, &ec[8 * q..]);
        }
    }
    for (k, ec) in tail.chunks_exact_mut(8).enumerate() {
        let byte = |m: usize| msgs[m].0[blocks * 4 + k];
        let z = block_sum(&sbs, |m| u32::from(byte(m)));
        for j in 0..8 {
            // The byte sits in the low 8 bits of the word, where lanes 0..8 read it.
            ec[j] += z[j];
        }
        sq8(&mut lanes, ec);
    }
    lanes.iter().sum()
}
