//! The 32-lane 1-bit kernels of `gradkit_sparsify::onebit` (docs/MEMORY.md) against scalar
//! references written here, one element at a time (onebit-lamb.md §2: `c = x + e`,
//! `s = ‖c‖₂/√len`, bit 1 where `c ≥ 0` packed MSB-first, `e' = c − s·sign(c)`; the server
//! sums `(0 + Σ_m s_m·sign_m) + err`). Signs, packed bytes and error values must match bit
//! for bit; a scale may differ from the reference's one sequential f64 sum by at most one
//! f32 ulp (the kernels sum squares in eight f64 lanes). Inputs: random normals, ±0, NaN,
//! ±∞, subnormals, all-equal magnitudes, lengths that are not multiples of 8 or 32 and
//! zero-padded tails (`x` shorter than `e`, as the fused padded buffer).

#![allow(clippy::needless_range_loop)] // the references index arrays as the maths does

use gradkit_sparsify::onebit::{
    compress_deferred, compress_into, compress_with_feedback, pack_and_feedback, pack_signs, rms,
    server_sum_deferred, server_sum_sq, settle_errors, settled_sum_sq, sum_sq, unpack_accumulate,
    unpack_first, unpack_scaled,
};
use gradkit_testkit::rng::Rng;

// ---------------------------------------------------------------- references

/// Σv² in f64, one term after the other.
fn ref_sum_sq(v: &[f32]) -> f64 {
    let mut s = 0f64;
    for &c in v {
        s += c as f64 * c as f64;
    }
    s
}

fn ref_rms(v: &[f32]) -> f32 {
    if v.is_empty() {
        0.0
    } else {
        (ref_sum_sq(v) / v.len() as f64).sqrt() as f32
    }
}

/// MSB-first packing of `c ≥ 0`, one bit at a time.
fn ref_pack(c: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; c.len().div_ceil(8)];
    for (i, &v) in c.iter().enumerate() {
        if v >= 0.0 {
            out[i / 8] |= 0x80 >> (i % 8);
        }
    }
    out
}

fn ref_bit(bits: &[u8], i: usize) -> bool {
    bits[i / 8] & (0x80 >> (i % 8)) != 0
}

/// `c − s` where `c ≥ 0`, else `c + s` (NaN: `c + s`).
fn ref_feedback(c: f32, s: f32) -> f32 {
    if c >= 0.0 {
        c - s
    } else {
        c + s
    }
}

/// Same value: equal bits, or both NaN (payloads are not part of the contract).
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn assert_same(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for i in 0..got.len() {
        assert!(
            same(got[i], want[i]),
            "{what} [{i}]: {} ({:#x}) vs {} ({:#x})",
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

/// Scales agree to one f32 ulp (or are both NaN / both the same infinity).
fn assert_scale(got: f32, want: f32, what: &str) {
    if want.is_nan() || want.is_infinite() {
        assert!(same(got, want), "{what}: scale {got} vs {want}");
        return;
    }
    let d = (got.to_bits() as i64 - want.to_bits() as i64).abs();
    assert!(d <= 1, "{what}: scale {got} vs {want} ({d} ulps)");
}

// ---------------------------------------------------------------- inputs

/// A normal value, or (`special`) one of zeros, −0, subnormals, huge, tiny, ±0.75.
fn value(g: &mut Rng, special: bool) -> f32 {
    if !special {
        return g.normal_f64() as f32;
    }
    match g.below(8) {
        0 => 0.0,
        1 => -0.0,
        2 => f32::from_bits(1 + g.below(1000) as u32), // subnormal
        3 => -f32::from_bits(1 + g.below(1000) as u32),
        4 => 1e30,
        5 => -1e-30,
        6 => 0.75,
        _ => -0.75,
    }
}

/// `n` values, a fraction of them special (no NaN/∞: those are tested on their own).
fn values(g: &mut Rng, n: usize, special_per_8: u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let sp = g.below(8) < special_per_8;
            value(g, sp)
        })
        .collect()
}

/// Lengths around the 8- and 32-lane boundaries, padded ones among them.
const LENS: [usize; 14] = [0, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100, 1000, 4099];

// ---------------------------------------------------------------- worker compressor

/// `compress_with_feedback(x, e)` against the scalar reference, for `e` padded to
/// `npad ≥ x.len()`.
fn check_worker(x: &[f32], e0: &[f32], what: &str) {
    let npad = e0.len();
    let c: Vec<f32> = (0..npad)
        .map(|i| e0[i] + x.get(i).copied().unwrap_or(0.0))
        .collect();
    let want_s = ref_rms(&c);
    let mut e = e0.to_vec();
    let mut bits = vec![0x5Au8; npad / 8];
    let s = compress_with_feedback(x, &mut e, &mut bits);
    assert_scale(s, want_s, what);
    assert_eq!(bits, ref_pack(&c), "{what}: packed signs");
    // The errors with the kernel's own scale (checked above to one ulp): bit for bit.
    let want_e: Vec<f32> = c.iter().map(|&v| ref_feedback(v, s)).collect();
    assert_same(&e, &want_e, &format!("{what}: error"));
    // compress_into on the same c: the same scale, bits and errors (c.len() a multiple of 8).
    let mut buf = c.clone();
    let mut b2 = vec![0xA5u8; npad / 8];
    let s2 = compress_into(&mut buf, &mut b2);
    assert_scale(s2, want_s, what);
    assert_eq!(b2, bits, "{what}: compress_into bits");
    let want_e2: Vec<f32> = c.iter().map(|&v| ref_feedback(v, s2)).collect();
    assert_same(&buf, &want_e2, &format!("{what}: compress_into error"));
}

#[test]
fn worker_compressor_matches_the_scalar_reference() {
    let mut g = Rng::new(19);
    for &n in &LENS {
        for pad in [0usize, 1, 8, 57, 200] {
            let npad = (n + pad).div_ceil(8) * 8;
            for special in [0u64, 3, 8] {
                let x = values(&mut g, n, special);
                let e0: Vec<f32> = values(&mut g, npad, special)
                    .iter()
                    .map(|v| v / 4.0)
                    .collect();
                check_worker(&x, &e0, &format!("n={n} npad={npad} special={special}"));
                // A zero starting error (the first step) and an all-zero input.
                check_worker(&x, &vec![0.0; npad], &format!("n={n} e=0"));
                check_worker(&vec![0.0; n], &e0, &format!("n={n} x=0"));
            }
        }
    }
}

#[test]
fn worker_compressor_edge_values() {
    // All zeros, both signs: scale 0, every bit 1, errors ±0 − 0.
    let z: Vec<f32> = (0..40)
        .map(|i| if i % 3 == 0 { -0.0 } else { 0.0 })
        .collect();
    let mut e = vec![-0.0f32; 40];
    let mut b = vec![0u8; 5];
    let s = compress_with_feedback(&z, &mut e, &mut b);
    assert_eq!(s, 0.0);
    assert_eq!(b, vec![0xFF; 5]);
    check_worker(&z, &[-0.0; 40], "zeros");
    // All-equal magnitudes: the scale is that magnitude and the error exactly 0.
    let x: Vec<f32> = (0..72)
        .map(|i| if i % 5 < 2 { -0.75 } else { 0.75 })
        .collect();
    let mut e = vec![0f32; 72];
    let mut b = vec![0u8; 9];
    assert_eq!(compress_with_feedback(&x, &mut e, &mut b), 0.75);
    assert!(e.iter().all(|v| *v == 0.0));
    // NaN (bit 0, policy as before: the scale and every error become NaN) and ±∞.
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for at in [0usize, 5, 31, 32, 40, 70] {
            let mut x: Vec<f32> = (0..71).map(|i| i as f32 / 7.0 - 5.0).collect();
            x[at] = bad;
            check_worker(&x, &[0.125; 72], &format!("{bad} at {at}"));
            let mut e = vec![0f32; 72];
            let mut b = vec![0u8; 9];
            compress_with_feedback(&x, &mut e, &mut b);
            assert_eq!(ref_bit(&b, at), bad > 0.0, "{bad} at {at}: its bit");
        }
    }
    // Empty.
    assert_eq!(compress_with_feedback(&[], &mut [], &mut []), 0.0);
    assert_eq!(compress_into(&mut [], &mut []), 0.0);
}

#[test]
fn sums_of_squares_are_the_sequential_sum_to_rounding() {
    let mut g = Rng::new(5);
    for &n in &LENS {
        let x = values(&mut g, n, 2);
        let (a, b) = (sum_sq(&x), ref_sum_sq(&x));
        assert!((a - b).abs() <= 1e-12 * b, "n={n}: {a} vs {b}");
        assert_scale(rms(&x), ref_rms(&x), &format!("rms n={n}"));
    }
}

// ---------------------------------------------------------------- pack / unpack

#[test]
fn pack_and_feedback_and_pack_signs_match_the_reference() {
    let mut g = Rng::new(7);
    for &n in &LENS {
        let buf0 = values(&mut g, n, 3);
        let s = 0.3125f32;
        let groups = n / 8;
        // Exactly n/8 bytes, and one byte more than the buffer covers (left untouched).
        for extra in [0usize, 1] {
            let mut buf = buf0.clone();
            let mut bits = vec![0x33u8; groups + extra];
            pack_and_feedback(&mut buf, &mut bits, s);
            let mut want_bits = ref_pack(&buf0[..8 * groups]);
            want_bits.extend(std::iter::repeat_n(0x33, extra));
            assert_eq!(bits, want_bits, "n={n}: pack_and_feedback bits");
            let want: Vec<f32> = (0..n)
                .map(|i| {
                    if i < 8 * groups {
                        ref_feedback(buf0[i], s)
                    } else {
                        buf0[i] // past the whole groups: untouched
                    }
                })
                .collect();
            assert_same(&buf, &want, &format!("n={n}: pack_and_feedback"));
            let mut sb = vec![0x33u8; groups + extra];
            pack_signs(&buf0, &mut sb);
            assert_eq!(sb, want_bits, "n={n}: pack_signs");
        }
    }
    // Fewer bytes than the buffer's groups: only those groups.
    let buf0: Vec<f32> = (0..80).map(|i| i as f32 - 40.5).collect();
    let mut buf = buf0.clone();
    let mut bits = vec![0u8; 3];
    pack_and_feedback(&mut buf, &mut bits, 1.0);
    assert_eq!(bits, ref_pack(&buf0[..24]));
    assert_same(&buf[24..], &buf0[24..], "beyond the bytes");
}

#[test]
fn unpack_kernels_match_the_reference_with_partial_last_bytes() {
    let mut g = Rng::new(11);
    for &n in &LENS {
        let nb = n.div_ceil(8) + (n % 3 == 0) as usize; // sometimes one byte to spare
        let bits: Vec<u8> = (0..nb).map(|_| g.below(256) as u8).collect();
        for s in [0.5f32, -1.25, 0.0, -0.0, 3e-39, f32::NAN] {
            let signed = |i: usize| {
                if ref_bit(&bits, i) {
                    s
                } else {
                    -s
                }
            };
            let mut out = vec![7.0f32; n];
            unpack_scaled(&bits, s, &mut out);
            let want: Vec<f32> = (0..n).map(signed).collect();
            assert_same(&out, &want, &format!("unpack n={n} s={s}"));
            let acc0 = values(&mut g, n, 3);
            let mut acc = acc0.clone();
            unpack_accumulate(&bits, s, &mut acc);
            let want: Vec<f32> = (0..n).map(|i| acc0[i] + signed(i)).collect();
            assert_same(&acc, &want, &format!("accumulate n={n} s={s}"));
            let mut first = acc0.clone();
            unpack_first(&bits, s, &mut first);
            let want: Vec<f32> = (0..n).map(|i| 0.0 + signed(i)).collect();
            assert_same(&first, &want, &format!("first n={n} s={s}"));
        }
    }
    // −s is the sign-flipped s, and −0 terms become +0 in `unpack_first`.
    let mut out = [1.0f32; 8];
    unpack_scaled(&[0b0101_0101], 2.0, &mut out);
    assert_eq!(out, [-2.0, 2.0, -2.0, 2.0, -2.0, 2.0, -2.0, 2.0]);
    unpack_first(&[0xFF], -0.0, &mut out);
    assert!(out.iter().all(|v| v.to_bits() == 0));
}

#[test]
#[should_panic(expected = "1-bit unpack")]
fn unpack_refuses_too_few_bytes() {
    unpack_scaled(&[0u8; 2], 1.0, &mut [0.0; 17]);
}

// ---------------------------------------------------------------- server stage

#[test]
fn server_sum_matches_the_reference_for_chunks_not_a_multiple_of_32() {
    let mut g = Rng::new(23);
    for len in [0usize, 8, 24, 32, 40, 96, 104, 1000, 4104] {
        for p in [1usize, 2, 3, 5, 8] {
            let msgs: Vec<(Vec<u8>, f32)> = (0..p)
                .map(|m| {
                    let b = (0..len / 8).map(|_| g.below(256) as u8).collect();
                    (b, (m as f32 + 1.0) / 7.0)
                })
                .collect();
            let err0 = values(&mut g, len, 2);
            // z = (0 + Σ_m ±s_m in message order) + err, one element at a time.
            let z: Vec<f32> = (0..len)
                .map(|i| {
                    let mut acc = 0.0f32;
                    for (b, s) in &msgs {
                        acc += if ref_bit(b, i) { *s } else { -*s };
                    }
                    acc + err0[i]
                })
                .collect();
            let mut err = err0.clone();
            let ss = server_sum_sq(&msgs, &mut err);
            assert_same(&err, &z, &format!("len={len} p={p}: z"));
            let want = ref_sum_sq(&z);
            assert!(
                (ss - want).abs() <= 1e-12 * want,
                "len={len} p={p}: Σz² {ss} vs {want}"
            );
        }
    }
}

// ---------------------------------------------------------------- one-pass (deferred) forms

#[test]
fn deferred_worker_compressor_equals_the_two_pass_one_over_steps() {
    let mut g = Rng::new(31);
    for &n in &LENS {
        for pad in [0usize, 5, 64] {
            let npad = (n + pad).div_ceil(8) * 8;
            let (mut e2, mut ed) = (vec![0f32; npad], vec![0f32; npad]);
            let (mut b2, mut bd) = (vec![0u8; npad / 8], vec![0u8; npad / 8]);
            let mut due = 0.0f32; // a zero error is settled
            for step in 0..5 {
                let x = values(&mut g, n, step % 3);
                let what = format!("n={n} npad={npad} step {step}");
                // The reference's c = settled error + x, from the two-pass state.
                let c: Vec<f32> = (0..npad)
                    .map(|i| e2[i] + x.get(i).copied().unwrap_or(0.0))
                    .collect();
                let s2 = compress_with_feedback(&x, &mut e2, &mut b2);
                let sd = compress_deferred(&x, &mut ed, &mut bd, due);
                assert_eq!(sd.to_bits(), s2.to_bits(), "{what}: scale");
                assert_eq!(bd, b2, "{what}: bits");
                assert_same(&ed, &c, &format!("{what}: unsettled buffer holds c"));
                let want = sum_sq(&e2);
                assert_eq!(settled_sum_sq(&ed, sd).to_bits(), want.to_bits(), "{what}");
                let mut settled = ed.clone();
                settle_errors(&mut settled, sd);
                assert_same(&settled, &e2, &format!("{what}: settled error"));
                due = sd;
            }
        }
    }
    // Settling with due = 0 is the identity, −0 and NaN included.
    let v = [0.0f32, -0.0, 1.5, -2.5, f32::NAN, f32::INFINITY, -1e-45];
    let mut w = v;
    settle_errors(&mut w, 0.0);
    assert_same(&w, &v, "settle by 0");
}

#[test]
fn deferred_server_stage_equals_sum_then_pack_over_steps() {
    let mut g = Rng::new(37);
    for len in [0usize, 8, 24, 32, 40, 104, 1000] {
        for p in [1usize, 3, 4] {
            let (mut e2, mut ed) = (vec![0f32; len], vec![0f32; len]);
            let (mut b2, mut bd) = (vec![0u8; len / 8], vec![0x77u8; len / 8]);
            let mut due = 0.0f32;
            for step in 0..4 {
                let msgs: Vec<(Vec<u8>, f32)> = (0..p)
                    .map(|m| {
                        let b = (0..len / 8).map(|_| g.below(256) as u8).collect();
                        (b, (m + step) as f32 / 9.0 + 0.01)
                    })
                    .collect();
                let what = format!("len={len} p={p} step {step}");
                let ss2 = server_sum_sq(&msgs, &mut e2);
                let z = e2.clone();
                let s2 = if len == 0 {
                    0.0
                } else {
                    (ss2 / len as f64).sqrt() as f32
                };
                pack_and_feedback(&mut e2, &mut b2, s2);
                let ssd = server_sum_deferred(&msgs, &mut ed, due, &mut bd);
                assert_eq!(ssd.to_bits(), ss2.to_bits(), "{what}: Σz²");
                assert_eq!(bd, b2, "{what}: bits");
                assert_eq!(bd, ref_pack(&z), "{what}: bits vs reference");
                assert_same(&ed, &z, &format!("{what}: unsettled z"));
                let mut settled = ed.clone();
                settle_errors(&mut settled, s2);
                assert_same(&settled, &e2, &format!("{what}: settled error"));
                due = s2;
            }
        }
    }
}

#[test]
fn run_time_dispatch_gives_the_bits_of_the_baseline_build() {
    use gradkit_sparsify::onebit::portable;
    let mut g = Rng::new(41);
    for &n in &LENS {
        let npad = (n + 13).div_ceil(8) * 8;
        let (mut ea, mut eb) = (vec![0f32; npad], vec![0f32; npad]);
        let (mut ba, mut bb) = (vec![0u8; npad / 8], vec![0u8; npad / 8]);
        let (mut da, mut db) = (0f32, 0f32);
        for step in 0..3 {
            let x = values(&mut g, n, step);
            da = compress_deferred(&x, &mut ea, &mut ba, da);
            db = portable::compress_deferred(&x, &mut eb, &mut bb, db);
            assert_eq!(da.to_bits(), db.to_bits(), "n={n} step {step}: scale");
            assert_eq!(ba, bb, "n={n} step {step}: bits");
            assert_same(&ea, &eb, &format!("n={n} step {step}: buffer"));
        }
        let len = npad;
        let msgs: Vec<(Vec<u8>, f32)> = (0..3)
            .map(|m| {
                (
                    (0..len / 8).map(|_| g.below(256) as u8).collect(),
                    m as f32 + 0.5,
                )
            })
            .collect();
        let (mut sa, mut sb) = (ea.clone(), ea.clone());
        let (mut oa, mut ob) = (vec![0u8; len / 8], vec![0u8; len / 8]);
        let qa = server_sum_deferred(&msgs, &mut sa, 0.25, &mut oa);
        let qb = portable::server_sum_deferred(&msgs, &mut sb, 0.25, &mut ob);
        assert_eq!(qa.to_bits(), qb.to_bits(), "len={len}: Σz²");
        assert_eq!(oa, ob, "len={len}: server bits");
        assert_same(&sa, &sb, &format!("len={len}: server buffer"));
    }
}
