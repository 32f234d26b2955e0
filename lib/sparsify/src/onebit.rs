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
//! * sign bits are packed MSB-first, bit 1 where `c ≥ 0` (so +0 **and −0** count as +1; a NaN
//!   compares false and gets bit 0, i.e. `−s`);
//! * a decompressed value is `±s` built from the bits of `s` (sign bit flipped where the
//!   packed bit is 0), i.e. exactly `s·(2·bit − 1)`.

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
    let s = if e.is_empty() {
        0.0 // as [`rms`]: an empty buffer has scale 0, not 0/0
    } else {
        (ss / e.len() as f64).sqrt() as f32
    };
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
pub fn server_sum_sq(msgs: &[(Vec<u8>, f32)], err: &mut [f32]) -> f64 {
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
