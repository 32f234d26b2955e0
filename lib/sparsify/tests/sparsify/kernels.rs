//! The `Kernels` interface's CPU implementation against brute-force references written here
//! (sort-based top-k, loop-based threshold, dense scatter-add, a scalar 1-bit compressor),
//! on the edge cases (n = 0, k = 0, k ≥ n, all-equal magnitudes, ±0, NaN) and as property
//! tests; plus the 1-bit state identities (decompressed + new error = input + old error,
//! worker and server side) and a `Selector` running on kernels supplied by the caller.

#![allow(clippy::needless_range_loop)] // the references index arrays as the maths does

use std::cmp::Ordering;

use gradkit_sparsify::kernels::{cpu, Kernels};
use gradkit_sparsify::onebit;
use gradkit_sparsify::{Method, Selector};
use gradkit_testkit::rng::Rng;
use proptest::prelude::*;

// ---------------------------------------------------------------- references

/// Magnitude order of the references: NaN above every number, otherwise |a| vs |b| as floats
/// (so −0 == +0). Only canonical NaNs are used in these tests.
fn mag_cmp(a: f32, b: f32) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.abs().partial_cmp(&b.abs()).unwrap(),
    }
}

/// Top-k by sorting every index by (magnitude desc, index asc), then ascending.
fn ref_topk(x: &[f32], k: usize) -> Vec<u32> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| mag_cmp(x[b], x[a]).then(a.cmp(&b)));
    let mut out: Vec<u32> = order
        .into_iter()
        .take(k.min(x.len()))
        .map(|i| i as u32)
        .collect();
    out.sort_unstable();
    out
}

/// The k-th largest |x| by a full sort (k ≥ 1).
fn ref_kth(x: &[f32], k: usize) -> f32 {
    let mut m: Vec<f32> = x.to_vec();
    m.sort_by(|a, b| mag_cmp(*b, *a));
    m[k - 1].abs()
}

fn ref_above(x: &[f32], th: f32) -> Vec<u32> {
    let mut out = Vec::new();
    for (i, v) in x.iter().enumerate() {
        if v.abs() > th {
            out.push(i as u32);
        }
    }
    out
}

/// Scalar 1-bit compressor with error feedback (onebit-lamb.md §2): c = x + e (zero-padded
/// x), s = ‖c‖₂/√len in f64, bit 1 where c ≥ 0, e' = c − (±s). Returns (bits as bools, s, e').
fn ref_compress(x: &[f32], e: &[f32]) -> (Vec<bool>, f32, Vec<f32>) {
    let c: Vec<f32> = (0..e.len())
        .map(|i| x.get(i).copied().unwrap_or(0.0) + e[i])
        .collect();
    let ss: f64 = c.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let s = if c.is_empty() {
        0.0
    } else {
        (ss / c.len() as f64).sqrt() as f32
    };
    let bits: Vec<bool> = c.iter().map(|&v| v >= 0.0).collect();
    let e_new = c
        .iter()
        .zip(&bits)
        .map(|(&v, &b)| v - if b { s } else { -s })
        .collect();
    (bits, s, e_new)
}

/// Bit j of the MSB-first packing.
fn bit(bytes: &[u8], j: usize) -> bool {
    (bytes[j / 8] >> (7 - j % 8)) & 1 == 1
}

fn pack_ref(bits: &[bool]) -> Vec<u8> {
    let mut out = vec![0u8; bits.len().div_ceil(8)];
    for (j, &b) in bits.iter().enumerate() {
        if b {
            out[j / 8] |= 1 << (7 - j % 8);
        }
    }
    out
}

fn bits_of(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Deterministic values with many ties: multiples of 1/4 in [−4, 4], both zeros included.
fn tied(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            let r = rng.next_u64();
            let q = (r % 33) as i32 - 16;
            if q == 0 && r & (1 << 40) != 0 {
                -0.0
            } else {
                q as f32 / 4.0
            }
        })
        .collect()
}

// ---------------------------------------------------------------- top-k, k-th, threshold

#[test]
fn topk_edge_cases_match_the_sort_reference() {
    let k = cpu();
    assert_eq!(k.name(), "cpu");
    // n = 0: any k.
    for kk in [0, 1, 5] {
        assert!(k.topk_by_magnitude(&[], kk).is_empty());
        let (i, v, th) = k.topk_with_values(&[], kk);
        assert!(i.is_empty() && v.is_empty() && th.is_none());
    }
    let x = [0.5f32, -3.0, 0.0, 2.0, -0.0, 1.0];
    // k = 0.
    assert!(k.topk_by_magnitude(&x, 0).is_empty());
    assert_eq!(k.topk_with_values(&x, 0).2, None);
    // k ≥ n: every index.
    for kk in [6, 7, 100] {
        assert_eq!(k.topk_by_magnitude(&x, kk), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(ref_topk(&x, kk), vec![0, 1, 2, 3, 4, 5]);
    }
    for kk in 1..=6 {
        assert_eq!(k.topk_by_magnitude(&x, kk), ref_topk(&x, kk), "k={kk}");
        assert_eq!(k.kth_largest_magnitude(&x, kk), ref_kth(&x, kk), "k={kk}");
    }
    // All-equal magnitudes: the lowest indices win.
    let eq: Vec<f32> = (0..40)
        .map(|i| if i % 2 == 0 { 1.5 } else { -1.5 })
        .collect();
    for kk in [1, 7, 39, 40] {
        assert_eq!(
            k.topk_by_magnitude(&eq, kk),
            (0..kk as u32).collect::<Vec<_>>()
        );
        assert_eq!(k.kth_largest_magnitude(&eq, kk), 1.5);
    }
    // Zeros of both signs tie with each other: lower index first; the k-th is +0.
    let z = [-0.0f32, 0.0, 2.0, -0.0, 0.0];
    assert_eq!(k.topk_by_magnitude(&z, 3), vec![0, 1, 2]);
    assert_eq!(ref_topk(&z, 3), vec![0, 1, 2]);
    let th = k.kth_largest_magnitude(&z, 3);
    assert_eq!(th.to_bits(), 0.0f32.to_bits(), "k-th largest of ±0 is +0");
    // NaN ranks above +inf.
    let n = [1.0f32, f32::INFINITY, f32::NAN, -5.0];
    assert_eq!(k.topk_by_magnitude(&n, 1), vec![2]);
    assert_eq!(k.topk_by_magnitude(&n, 2), vec![1, 2]);
    assert_eq!(ref_topk(&n, 2), vec![1, 2]);
    assert!(k.kth_largest_magnitude(&n, 1).is_nan());
    assert_eq!(k.kth_largest_magnitude(&n, 2), f32::INFINITY);
}

#[test]
#[should_panic(expected = "kth_largest_abs")]
fn kth_largest_of_k_zero_panics() {
    cpu().kth_largest_magnitude(&[1.0, 2.0], 0);
}

#[test]
#[should_panic(expected = "kth_largest_abs")]
fn kth_largest_past_the_length_panics() {
    cpu().kth_largest_magnitude(&[1.0, 2.0], 3);
}

#[test]
fn topk_on_large_tied_inputs_matches_the_sort_reference() {
    // Past the sample-then-filter size (2^16), with heavy ties at the threshold.
    let x = tied(200_003, 7);
    for kk in [1usize, 100, 2_000, 60_000, 199_999] {
        let want = ref_topk(&x, kk);
        assert_eq!(cpu().topk_by_magnitude(&x, kk), want, "k={kk}");
        let (i, v, th) = cpu().topk_with_values(&x, kk);
        assert_eq!(i, want);
        assert_eq!(
            bits_of(&v),
            bits_of(&want.iter().map(|&j| x[j as usize]).collect::<Vec<_>>())
        );
        assert_eq!(th, Some(ref_kth(&x, kk)));
    }
}

#[test]
fn threshold_selection_is_strict_and_drops_nan() {
    let k = cpu();
    assert!(k.select_above(&[], 0.0).is_empty());
    let x = [
        1.0f32,
        -2.0,
        2.0,
        f32::NAN,
        -0.0,
        0.0,
        3.0,
        f32::NEG_INFINITY,
    ];
    assert_eq!(
        k.select_above(&x, 2.0),
        vec![6, 7],
        "|x| = th does not pass"
    );
    assert_eq!(k.select_above(&x, 2.0), ref_above(&x, 2.0));
    assert_eq!(
        k.select_above(&x, 0.0),
        vec![0, 1, 2, 6, 7],
        "±0 and NaN fail"
    );
    assert_eq!(k.select_above(&x, -1.0), vec![0, 1, 2, 4, 5, 6, 7]);
    assert!(k.select_above(&x, f32::INFINITY).is_empty());
    assert!(k.select_above(&x, f32::NAN).is_empty());
    let (i, v) = k.select_above_with_values(&x, 0.5);
    assert_eq!(i, ref_above(&x, 0.5));
    assert_eq!(v, vec![1.0, -2.0, 2.0, 3.0, f32::NEG_INFINITY]);
    // Past the parallel size (2·2^18), at every quarter step as threshold.
    let big = tied(600_001, 3);
    for th in [-0.25f32, 0.0, 0.25, 2.0, 3.75, 4.0] {
        assert_eq!(k.select_above(&big, th), ref_above(&big, th), "th={th}");
    }
}

// ---------------------------------------------------------------- gather, scatter-add

#[test]
fn gather_and_scatter_add_match_dense_loops() {
    let k = cpu();
    let x = [1.5f32, -0.0, f32::NAN, 4.0];
    let g = k.gather(&x, &[3, 1, 1, 2]);
    assert_eq!(g[0], 4.0);
    assert_eq!(g[1].to_bits(), (-0.0f32).to_bits());
    assert!(g[3].is_nan());
    assert!(k.gather(&x, &[]).is_empty());

    // Dense reference: a [n × m] matrix of one-hot rows summed in f64 (exact for dyadics).
    let n = 37;
    let idx: Vec<u32> = (0..200u32).map(|j| (j * 7 + j / 5) % n as u32).collect();
    let vals: Vec<f32> = (0..200).map(|j| (j as f32 - 100.0) / 8.0).collect();
    let mut want = vec![0f64; n];
    for i in 0..n {
        for (j, &ix) in idx.iter().enumerate() {
            if ix as usize == i {
                want[i] += vals[j] as f64;
            }
        }
    }
    let mut dense: Vec<f32> = (0..n).map(|i| i as f32).collect();
    k.scatter_add(&mut dense, &idx, &vals);
    for i in 0..n {
        assert_eq!(dense[i] as f64, i as f64 + want[i], "index {i}");
    }
    // Empty scatter leaves the dense vector as it was; n = 0 works.
    let before = dense.clone();
    k.scatter_add(&mut dense, &[], &[]);
    assert_eq!(dense, before);
    k.scatter_add(&mut [], &[], &[]);
}

#[test]
#[should_panic(expected = "scatter_add")]
fn scatter_add_with_mismatched_lengths_panics() {
    cpu().scatter_add(&mut [0.0; 4], &[1, 2], &[1.0]);
}

#[test]
#[should_panic]
fn scatter_add_out_of_range_panics() {
    cpu().scatter_add(&mut [0.0; 4], &[4], &[1.0]);
}

// ---------------------------------------------------------------- 1-bit

/// Checks the kernel against the scalar reference for one (x, e); returns nothing, panics.
fn check_compress(x: &[f32], e0: &[f32]) {
    let mut e = e0.to_vec();
    let mut bits = vec![0xAAu8; e.len() / 8];
    let s = cpu().onebit_compress_with_feedback(x, &mut e, &mut bits);
    let (rb, rs, re) = ref_compress(x, e0);
    // The scale: same formula, sums in a different order (eight f64 lanes vs one).
    assert!(
        (s as f64 - rs as f64).abs() <= 1e-6 * (rs as f64).max(1e-30),
        "scale {s} vs {rs}"
    );
    assert_eq!(bits, pack_ref(&rb), "sign bits");
    for i in 0..e.len() {
        let c = x.get(i).copied().unwrap_or(0.0) + e0[i];
        let tol = 4.0 * f32::EPSILON * (c.abs() + s.abs());
        assert!(
            (e[i] - re[i]).abs() <= tol,
            "error {i}: {} vs {}",
            e[i],
            re[i]
        );
        // The state identity: decompressed + new error == x + old error, elementwise.
        let d = if bit(&bits, i) { s } else { -s };
        assert!(
            ((d as f64 + e[i] as f64) - c as f64).abs() <= tol as f64,
            "identity at {i}"
        );
    }
    // Decompression of these bits: ±s exactly.
    let mut out = vec![7.0f32; e.len()];
    cpu().onebit_decompress(&bits, s, &mut out);
    for (i, o) in out.iter().enumerate() {
        let want = if rb[i] { s } else { -s };
        assert_eq!(o.to_bits(), want.to_bits(), "decompress {i}");
    }
}

#[test]
fn onebit_compress_matches_the_scalar_reference_on_edge_cases() {
    // Empty buffer.
    check_compress(&[], &[]);
    let mut e: Vec<f32> = Vec::new();
    assert_eq!(
        cpu().onebit_compress_with_feedback(&[], &mut e, &mut []),
        0.0
    );
    // ±0 count as +1; all zeros give scale 0 and zero error.
    let z = [0.0f32, -0.0, 0.0, -0.0, 0.0, 0.0, -0.0, -0.0];
    let mut e = vec![0f32; 8];
    let mut b = [0u8; 1];
    let s = cpu().onebit_compress_with_feedback(&z, &mut e, &mut b);
    assert_eq!((s, b[0]), (0.0, 0xFF));
    assert!(e.iter().all(|v| *v == 0.0));
    // All-equal magnitudes: scale = that magnitude, error exactly 0.
    let x: Vec<f32> = (0..24)
        .map(|i| if i % 3 == 0 { -0.75 } else { 0.75 })
        .collect();
    let mut e = vec![0f32; 24];
    let mut b = vec![0u8; 3];
    let s = cpu().onebit_compress_with_feedback(&x, &mut e, &mut b);
    assert_eq!(s, 0.75);
    assert!(e.iter().all(|v| *v == 0.0));
    assert_eq!(
        b,
        pack_ref(&x.iter().map(|v| *v >= 0.0).collect::<Vec<_>>())
    );
    // Padding: x shorter than e (the fused buffer's zero padding), non-zero old error.
    let x: Vec<f32> = (0..13).map(|i| (i as f32 - 6.0) / 4.0).collect();
    let e0: Vec<f32> = (0..24).map(|i| ((i * 5) % 7) as f32 / 16.0 - 0.2).collect();
    check_compress(&x, &e0);
    // A longer random-ish buffer with a tail (not a multiple of 64).
    let x = tied(1000, 11);
    let e0: Vec<f32> = tied(1000, 12).iter().map(|v| v / 8.0).collect();
    check_compress(&x, &e0);
}

#[test]
fn onebit_pack_with_given_scale_and_decompress_add_match_the_reference() {
    let buf0: Vec<f32> = tied(40, 5);
    let s = 0.625f32;
    let mut buf = buf0.clone();
    let mut bits = vec![0u8; 5];
    cpu().onebit_pack_with_feedback(&mut buf, &mut bits, s);
    let rb: Vec<bool> = buf0.iter().map(|v| *v >= 0.0).collect();
    assert_eq!(bits, pack_ref(&rb));
    for i in 0..40 {
        let want = buf0[i] - if rb[i] { s } else { -s };
        assert_eq!(buf[i].to_bits(), want.to_bits(), "{i}");
    }
    // Decompress-add, with a partial last byte (acc of 19 < 24 = 8·3 bits).
    let acc0: Vec<f32> = (0..19).map(|i| i as f32 / 2.0).collect();
    let mut acc = acc0.clone();
    cpu().onebit_decompress_add(&bits[..3], -1.25, &mut acc);
    for i in 0..19 {
        let want = acc0[i] + if rb[i] { -1.25 } else { 1.25 };
        assert_eq!(acc[i], want, "{i}");
    }
    let mut out = vec![0f32; 11];
    cpu().onebit_decompress(&bits[..2], 2.0, &mut out);
    for i in 0..11 {
        assert_eq!(out[i], if rb[i] { 2.0 } else { -2.0 });
    }
}

#[test]
fn onebit_server_stage_keeps_decompressed_plus_error_equal_to_its_input() {
    // Server side (onebit-lamb.md §2 step 3): z = Σ_i (s_i/P)·sign_i + old error; the
    // compressed z plus the new server error gives back z.
    let len = 64;
    let p = 3;
    let msgs: Vec<(Vec<u8>, f32)> = (0..p)
        .map(|r| {
            let v = tied(len, 100 + r as u64);
            (
                pack_ref(&v.iter().map(|x| *x >= 0.0).collect::<Vec<_>>()),
                (r as f32 + 1.0) / 8.0,
            )
        })
        .collect();
    let err0: Vec<f32> = tied(len, 9).iter().map(|v| v / 16.0).collect();
    // Reference z in f64 (exact: dyadic values).
    let z: Vec<f64> = (0..len)
        .map(|j| {
            msgs.iter()
                .map(|(b, s)| if bit(b, j) { *s as f64 } else { -(*s as f64) })
                .sum::<f64>()
                + err0[j] as f64
        })
        .collect();
    let mut err = err0.clone();
    let ss = onebit::server_sum_sq(&msgs, &mut err);
    for j in 0..len {
        assert_eq!(err[j] as f64, z[j], "z at {j}");
    }
    let want_ss: f64 = z.iter().map(|v| v * v).sum();
    assert!((ss - want_ss).abs() <= 1e-12 * want_ss);
    let s_s = (ss / len as f64).sqrt() as f32;
    let mut bits = vec![0u8; len / 8];
    cpu().onebit_pack_with_feedback(&mut err, &mut bits, s_s);
    let mut dec = vec![0f32; len];
    cpu().onebit_decompress(&bits, s_s, &mut dec);
    for j in 0..len {
        assert_eq!(bit(&bits, j), z[j] >= 0.0, "sign {j}");
        let tol = 2.0 * f32::EPSILON as f64 * (z[j].abs() + s_s as f64);
        assert!(
            (dec[j] as f64 + err[j] as f64 - z[j]).abs() <= tol,
            "identity at {j}"
        );
    }
}

#[test]
fn collectives_and_the_kernels_share_one_compressor() {
    // `compress_into` (in place on x + e) and the fused kernel agree bit for bit.
    let x = tied(96, 21);
    let e0: Vec<f32> = tied(96, 22).iter().map(|v| v / 4.0).collect();
    let mut e = e0.clone();
    let mut b1 = vec![0u8; 12];
    let s1 = cpu().onebit_compress_with_feedback(&x, &mut e, &mut b1);
    let mut buf: Vec<f32> = x.iter().zip(&e0).map(|(a, b)| b + a).collect();
    let mut b2 = vec![0u8; 12];
    let s2 = onebit::compress_into(&mut buf, &mut b2);
    assert_eq!((s1.to_bits(), &b1), (s2.to_bits(), &b2));
    assert_eq!(bits_of(&e), bits_of(&buf));
    let (rb, rs, _) = ref_compress(&x, &e0);
    assert_eq!(b1, pack_ref(&rb));
    assert!((s1 - rs).abs() <= 1e-6 * rs);
}

// ---------------------------------------------------------------- Selector on given kernels

/// Kernels written out as loops, with the provided `*_with_values` methods left to their
/// default bodies: a second implementation, as a GPU one would be.
#[derive(Debug)]
struct Loops;

static LOOPS: Loops = Loops;

impl Kernels for Loops {
    fn name(&self) -> &'static str {
        "loops"
    }
    fn topk_by_magnitude(&self, x: &[f32], k: usize) -> Vec<u32> {
        ref_topk(x, k)
    }
    fn kth_largest_magnitude(&self, x: &[f32], k: usize) -> f32 {
        ref_kth(x, k)
    }
    fn select_above(&self, x: &[f32], th: f32) -> Vec<u32> {
        ref_above(x, th)
    }
    fn gather(&self, x: &[f32], idx: &[u32]) -> Vec<f32> {
        idx.iter().map(|&i| x[i as usize]).collect()
    }
    fn scatter_add(&self, dense: &mut [f32], idx: &[u32], values: &[f32]) {
        for (i, v) in idx.iter().zip(values) {
            dense[*i as usize] += v;
        }
    }
    fn onebit_compress_with_feedback(&self, x: &[f32], e: &mut [f32], bits: &mut [u8]) -> f32 {
        let (b, s, en) = ref_compress(x, e);
        bits.copy_from_slice(&pack_ref(&b));
        e.copy_from_slice(&en);
        s
    }
    fn onebit_pack_with_feedback(&self, buf: &mut [f32], bits: &mut [u8], s: f32) {
        let b: Vec<bool> = buf.iter().map(|v| *v >= 0.0).collect();
        for (v, &p) in buf.iter_mut().zip(&b) {
            *v -= if p { s } else { -s };
        }
        bits.copy_from_slice(&pack_ref(&b));
    }
    fn onebit_decompress(&self, bits: &[u8], s: f32, out: &mut [f32]) {
        for (j, o) in out.iter_mut().enumerate() {
            *o = if bit(bits, j) { s } else { -s };
        }
    }
    fn onebit_decompress_add(&self, bits: &[u8], s: f32, acc: &mut [f32]) {
        for (j, o) in acc.iter_mut().enumerate() {
            *o += if bit(bits, j) { s } else { -s };
        }
    }
}

#[test]
fn selector_runs_topk_and_threshold_on_the_kernels_it_is_given() {
    let acc = tied(5_000, 31);
    for kk in [0usize, 1, 50, 4_999, 5_000, 9_000] {
        let mut a = Selector::new(Method::Topk, 0);
        let mut b = Selector::with_kernels(Method::Topk, 0, &LOOPS);
        assert_eq!(a.kernels().name(), "cpu");
        assert_eq!(b.kernels().name(), "loops");
        let sa = a.select(0, &acc, kk);
        let sb = b.select(0, &acc, kk);
        assert_eq!(sa.indices, ref_topk(&acc, kk), "k={kk}");
        assert_eq!(sa, sb, "k={kk}");
    }
    for th in [0.0f32, 1.0, 3.9] {
        let mut a = Selector::new(Method::Threshold(th), 0);
        let mut b = Selector::with_kernels(Method::Threshold(th), 0, &LOOPS);
        let sa = a.select(0, &acc, 10);
        assert_eq!(sa.indices, ref_above(&acc, th));
        assert_eq!(sa, b.select(0, &acc, 10));
    }
}

// ---------------------------------------------------------------- properties

/// Small dyadic values (ties likely) with the odd −0 and NaN.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => (-16i32..=16).prop_map(|q| q as f32 / 4.0),
        1 => Just(-0.0f32),
        1 => any::<f32>().prop_filter("finite", |v| v.is_finite()),
    ]
}

proptest! {
    #![proptest_config(gradkit_testkit::proptest_config(64))]

    #[test]
    fn prop_topk_and_kth_match_the_sort_reference(
        x in prop::collection::vec(value(), 0..300),
        k in 0usize..320,
    ) {
        let got = cpu().topk_by_magnitude(&x, k);
        prop_assert_eq!(&got, &ref_topk(&x, k));
        let kc = k.min(x.len());
        if kc > 0 {
            prop_assert_eq!(cpu().kth_largest_magnitude(&x, kc), ref_kth(&x, kc));
        }
        let (i, v, th) = cpu().topk_with_values(&x, k);
        prop_assert_eq!(&i, &got);
        prop_assert_eq!(bits_of(&v), bits_of(&LOOPS.gather(&x, &i)));
        prop_assert_eq!(th, if kc > 0 { Some(ref_kth(&x, kc)) } else { None });
    }

    #[test]
    fn prop_threshold_matches_the_loop(
        x in prop::collection::vec(value(), 0..300),
        th in prop_oneof![(-4i32..=20).prop_map(|q| q as f32 / 4.0), Just(f32::NAN)],
    ) {
        let (i, v) = cpu().select_above_with_values(&x, th);
        prop_assert_eq!(&i, &ref_above(&x, th));
        prop_assert_eq!(bits_of(&v), bits_of(&LOOPS.gather(&x, &i)));
    }

    #[test]
    fn prop_scatter_add_matches_the_dense_sum(
        n in 1usize..64,
        pairs in prop::collection::vec((0u32..1000, -64i32..=64), 0..200),
    ) {
        let idx: Vec<u32> = pairs.iter().map(|p| p.0 % n as u32).collect();
        let vals: Vec<f32> = pairs.iter().map(|p| p.1 as f32 / 8.0).collect();
        let mut want = vec![0f64; n];
        for (i, v) in idx.iter().zip(&vals) {
            want[*i as usize] += *v as f64;
        }
        let mut got = vec![0f32; n];
        cpu().scatter_add(&mut got, &idx, &vals);
        prop_assert_eq!(got.iter().map(|v| *v as f64).collect::<Vec<_>>(), want);
    }

    #[test]
    fn prop_onebit_state_identity_over_steps(
        groups in 0usize..20,
        short in 0usize..8,
        steps in prop::collection::vec(prop::collection::vec(-1000i32..1000, 160), 1..5),
    ) {
        // Several steps of compress-with-feedback on one error buffer: every step,
        // decompressed + new error == x + old error (elementwise, up to one rounding), and
        // summed over the steps Σ decompressed + final error == Σ x (f64, tolerance).
        let len = 8 * groups;
        let xl = len.saturating_sub(short);
        let mut e = vec![0f32; len];
        let mut bits = vec![0u8; groups];
        let mut sum_x = vec![0f64; len];
        let mut sum_d = vec![0f64; len];
        let mut bound = 0f64;
        for raw in &steps {
            let x: Vec<f32> = raw[..xl].iter().map(|q| *q as f32 / 64.0).collect();
            let e0 = e.clone();
            let s = cpu().onebit_compress_with_feedback(&x, &mut e, &mut bits);
            let (_, rs, _) = ref_compress(&x, &e0);
            prop_assert!((s - rs).abs() <= 1e-6 * rs.max(1e-30));
            let mut dec = vec![0f32; len];
            cpu().onebit_decompress(&bits, s, &mut dec);
            for i in 0..len {
                let xi = x.get(i).copied().unwrap_or(0.0);
                let c = xi as f64 + e0[i] as f64;
                let tol = 4.0 * f32::EPSILON as f64 * (c.abs() + s as f64);
                prop_assert!((dec[i] as f64 + e[i] as f64 - c).abs() <= tol, "step identity {}", i);
                sum_x[i] += xi as f64;
                sum_d[i] += dec[i] as f64;
                bound += tol;
            }
        }
        for i in 0..len {
            prop_assert!((sum_d[i] + e[i] as f64 - sum_x[i]).abs() <= bound, "conservation {}", i);
        }
    }
}
