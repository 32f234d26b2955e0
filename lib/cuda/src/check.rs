//! The GPU-vs-CPU equivalence checks: every method of a [`Kernels`] implementation (and the
//! extras of [`Gpu`]: moments, the fp16 wire) against the CPU reference
//! [`gradkit_sparsify::kernels::cpu`], on adversarial inputs — ties at the threshold, ±0,
//! NaN (several payloads, both signs), ±inf, subnormals, lengths that are not a multiple of
//! the block or the tile, k = 0, 1, n. Used by the emulation tests (`gradkit-cuda-emu`, in
//! `make test`) and by the GPU test (`tests/gpu.rs`, on a GPU node).
//!
//! What "equal" means, per result (module docs of [`crate::exec`] say why):
//! * selections (indices, selected values, the k-th magnitude), gathered values, 1-bit sign
//!   bits, decompression, fp16 bits: **bit for bit**;
//! * a float computed by arithmetic (the 1-bit errors, decompress-add, scatter-add): bit for
//!   bit, except that any NaN equals any NaN (a GPU returns its canonical NaN, not the
//!   operand's payload);
//! * the 1-bit scale: within 1 ulp of f32 (an f64 sum in another order), and the errors then
//!   exactly `c − s·sign(c)` for the GPU's own `s`;
//! * mean/std: relative 1e-9; scatter-add with repeated indices: the sum's rounding.

use gradkit_sparsify::kernels::{cpu, Kernels};
use gradkit_sparsify::resident::{self, Counting, DeviceKernels};

use crate::exec::{Backend, Gpu, TILE};

/// A small deterministic generator (xorshift64*), so the inputs are the same everywhere.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded (any seed; 0 is mapped to 1).
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    /// Roughly normal (sum of four uniforms, centred).
    pub fn normal(&mut self) -> f32 {
        let u = |r: &mut Self| (r.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        (u(self) + u(self) + u(self) + u(self) - 2.0) * 1.7
    }
}

/// The special values every adversarial input mixes in.
pub fn specials() -> Vec<f32> {
    vec![
        0.0,
        -0.0,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7fa0_0001), // a signalling NaN's payload
        f32::from_bits(0xffc0_1234),
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(1), // the smallest subnormal
        f32::from_bits(0x8000_0001),
        f32::from_bits(0x007f_ffff), // the largest subnormal
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::MAX,
        f32::MIN,
        1.0,
        -1.0,
        65504.0, // fp16's largest
        65520.0, // rounds to fp16 infinity
        6.1e-5,  // near fp16's smallest normal
        5.96e-8, // fp16's smallest subnormal
        1.0e-8,  // under fp16's subnormals
    ]
}

/// Named inputs of length `n`: random normals with the specials sprinkled in, heavy ties
/// (few distinct magnitudes, both signs), all equal, all zeros of both signs.
pub fn inputs(n: usize, seed: u64) -> Vec<(String, Vec<f32>)> {
    let mut r = Rng::new(seed ^ (n as u64).wrapping_mul(0x9e37_79b9));
    let sp = specials();
    let mut mixed: Vec<f32> = (0..n).map(|_| r.normal()).collect();
    for i in 0..n.min(4 * sp.len()) {
        let at = r.below(n);
        mixed[at] = sp[i % sp.len()];
    }
    let ties: Vec<f32> = (0..n)
        .map(|_| {
            let m = [0.0f32, 0.5, 1.0, 2.0][r.below(4)];
            if r.below(2) == 0 {
                m
            } else {
                -m
            }
        })
        .collect();
    let same = vec![-3.25f32; n];
    let zeros: Vec<f32> = (0..n)
        .map(|i| if i % 3 == 0 { -0.0 } else { 0.0 })
        .collect();
    vec![
        (format!("mixed[{n}]"), mixed),
        (format!("ties[{n}]"), ties),
        (format!("equal[{n}]"), same),
        (format!("zeros[{n}]"), zeros),
    ]
}

/// The lengths the emulation checks use: empty, one, under a block, a block plus one, a
/// tile plus one, and a few tiles less a few (none a multiple of the block or the tile but
/// the empty one).
pub fn small_lengths() -> Vec<usize> {
    let t = TILE as usize;
    vec![0, 1, 7, 257, t + 1, 3 * t - 5]
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Bit for bit, any NaN equal to any NaN.
fn same_or_nan(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

fn first_diff<T: PartialEq + std::fmt::Debug>(a: &[T], b: &[T]) -> String {
    if a.len() != b.len() {
        return format!("lengths {} vs {}", a.len(), b.len());
    }
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("first difference at {i}: {:?} vs {:?}", a[i], b[i]),
        None => "equal".into(),
    }
}

fn fdiff(a: &[f32], b: &[f32]) -> String {
    let ab: Vec<u32> = a.iter().map(|v| v.to_bits()).collect();
    let bb: Vec<u32> = b.iter().map(|v| v.to_bits()).collect();
    first_diff(&ab, &bb)
}

fn ulps(a: f32, b: f32) -> u32 {
    if a.to_bits() == b.to_bits() {
        return 0;
    }
    if a.is_sign_negative() != b.is_sign_negative() {
        return u32::MAX;
    }
    a.to_bits().abs_diff(b.to_bits())
}

/// Counts what was compared, for the report.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Calls compared.
    pub cases: usize,
    /// Elements in the inputs of those calls.
    pub elements: usize,
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        let holds: bool = $cond;
        if !holds {
            return Err(format!($($fmt)*));
        }
    };
}

/// Every selection method on `x`: top-k (indices; with values and the k-th magnitude) for
/// k in {0, 1, 2, n/2, n−1, n, n+3}, the k-th largest, threshold selection at thresholds
/// taken from the data (so ties sit exactly at the threshold) and at −1, 0, a subnormal,
/// +inf and NaN.
pub fn check_selection(
    g: &dyn Kernels,
    name: &str,
    x: &[f32],
    t: &mut Tally,
) -> Result<(), String> {
    let c = cpu();
    let n = x.len();
    let mut ks = vec![0, 1, 2, n / 2, n.saturating_sub(1), n, n + 3];
    ks.dedup();
    for &k in &ks {
        let (gi, ci) = (g.topk_by_magnitude(x, k), c.topk_by_magnitude(x, k));
        ensure!(
            gi == ci,
            "{name}: topk_by_magnitude k={k}: {}",
            first_diff(&gi, &ci)
        );
        let (gi, gv, gt) = g.topk_with_values(x, k);
        let (ci, cv, ct) = c.topk_with_values(x, k);
        ensure!(
            gi == ci,
            "{name}: topk_with_values k={k} indices: {}",
            first_diff(&gi, &ci)
        );
        ensure!(
            same_bits(&gv, &cv),
            "{name}: topk_with_values k={k} values: {}",
            fdiff(&gv, &cv)
        );
        ensure!(
            gt.map(f32::to_bits) == ct.map(f32::to_bits),
            "{name}: topk_with_values k={k} threshold {gt:?} vs {ct:?}"
        );
        // topk_with_values compares the k-th magnitude at every k; the method itself at the
        // ends of its range.
        if k >= 1 && k <= n && (k == 1 || k == n) {
            let (a, b) = (g.kth_largest_magnitude(x, k), c.kth_largest_magnitude(x, k));
            ensure!(
                a.to_bits() == b.to_bits(),
                "{name}: kth_largest_magnitude k={k}: {a:?} vs {b:?}"
            );
            t.cases += 1;
            t.elements += n;
        }
        t.cases += 2;
        t.elements += 2 * n;
    }
    let mut ths = vec![-1.0f32, 0.0, f32::from_bits(1), f32::INFINITY, f32::NAN];
    for k in [1, n / 3, n / 2] {
        if k >= 1 && k <= n {
            ths.push(c.kth_largest_magnitude(x, k));
        }
    }
    for th in ths {
        let (gi, ci) = (g.select_above(x, th), c.select_above(x, th));
        ensure!(
            gi == ci,
            "{name}: select_above th={th:?}: {}",
            first_diff(&gi, &ci)
        );
        let (gi, gv) = g.select_above_with_values(x, th);
        let (ci, cv) = c.select_above_with_values(x, th);
        ensure!(
            gi == ci,
            "{name}: select_above_with_values th={th:?}: {}",
            first_diff(&gi, &ci)
        );
        ensure!(
            same_bits(&gv, &cv),
            "{name}: select_above_with_values th={th:?} values: {}",
            fdiff(&gv, &cv)
        );
        t.cases += 2;
        t.elements += 2 * n;
    }
    Ok(())
}

/// Gather and scatter-add: distinct indices (bit for bit), and with repeats (the sum's
/// rounding).
pub fn check_moves(g: &dyn Kernels, name: &str, x: &[f32], t: &mut Tally) -> Result<(), String> {
    let c = cpu();
    let n = x.len();
    if n == 0 {
        ensure!(g.gather(x, &[]).is_empty(), "{name}: gather of nothing");
        return Ok(());
    }
    let mut r = Rng::new(n as u64 + 17);
    // Distinct: every other index, descending (the order of idx is the output's).
    let idx: Vec<u32> = (0..n as u32).rev().step_by(2).collect();
    let (gv, cv) = (g.gather(x, &idx), c.gather(x, &idx));
    ensure!(same_bits(&gv, &cv), "{name}: gather: {}", fdiff(&gv, &cv));
    let base: Vec<f32> = (0..n).map(|_| r.normal()).collect();
    let (mut gd, mut cd) = (base.clone(), base.clone());
    g.scatter_add(&mut gd, &idx, &gv);
    c.scatter_add(&mut cd, &idx, &cv);
    ensure!(
        same_or_nan(&gd, &cd),
        "{name}: scatter_add: {}",
        fdiff(&gd, &cd)
    );
    // Repeats: finite values only, so the bound is meaningful.
    let m = 3 * n;
    let idx: Vec<u32> = (0..m).map(|_| r.below(n) as u32).collect();
    let vals: Vec<f32> = (0..m).map(|_| r.normal()).collect();
    let (mut gd, mut cd) = (base.clone(), base);
    g.scatter_add(&mut gd, &idx, &vals);
    c.scatter_add(&mut cd, &idx, &vals);
    let mut mass = vec![0f32; n];
    for (&i, &v) in idx.iter().zip(&vals) {
        mass[i as usize] += v.abs();
    }
    for i in 0..n {
        let tol = (mass[i] + cd[i].abs()) * 4.0 * f32::EPSILON;
        ensure!(
            (gd[i] - cd[i]).abs() <= tol,
            "{name}: scatter_add with repeated indices at {i}: {} vs {} (bound {tol})",
            gd[i],
            cd[i]
        );
    }
    t.cases += 3;
    t.elements += 5 * n;
    Ok(())
}

/// The 1-bit kernels on `x` with a padded error buffer: compress with feedback (settled and
/// deferred), pack for a given scale, decompress and decompress-add.
pub fn check_onebit(g: &dyn Kernels, name: &str, x: &[f32], t: &mut Tally) -> Result<(), String> {
    let c = cpu();
    let n = x.len();
    let len = n.div_ceil(8) * 8 + 8; // one padding byte's worth past x
    let mut r = Rng::new(n as u64 + 29);
    let e0: Vec<f32> = (0..len)
        .map(|i| match i % 11 {
            0 => 0.0,
            1 => -0.0,
            _ => r.normal() * 0.1,
        })
        .collect();
    let nb = len / 8;
    // Settled compressor.
    let (mut ge, mut ce) = (e0.clone(), e0.clone());
    let (mut gb, mut cb) = (vec![0u8; nb], vec![0u8; nb]);
    let gs = g.onebit_compress_with_feedback(x, &mut ge, &mut gb);
    let cs = c.onebit_compress_with_feedback(x, &mut ce, &mut cb);
    ensure!(
        gb == cb,
        "{name}: onebit_compress_with_feedback bits: {}",
        first_diff(&gb, &cb)
    );
    ensure!(
        ulps(gs, cs) <= 1 || (gs.is_nan() && cs.is_nan()),
        "{name}: onebit_compress_with_feedback scale {gs:?} vs {cs:?}"
    );
    // The errors for the GPU's own scale: c − s·sign(c), by the CPU.
    let mut cc: Vec<f32> = e0
        .iter()
        .enumerate()
        .map(|(i, &e)| e + x.get(i).copied().unwrap_or(0.0))
        .collect();
    let mut bb = vec![0u8; nb];
    c.onebit_pack_with_feedback(&mut cc, &mut bb, gs);
    ensure!(bb == cb, "{name}: the sign bits of e + x");
    ensure!(
        same_or_nan(&ge, &cc),
        "{name}: onebit_compress_with_feedback errors: {}",
        fdiff(&ge, &cc)
    );
    // Deferred: last call's c' in e, its due scale applied while reading.
    for due in [0.0f32, 0.37] {
        let (mut ge, mut ce) = (e0.clone(), e0.clone());
        let (mut gb, mut cb) = (vec![0u8; nb], vec![0u8; nb]);
        let gs = g.onebit_compress_deferred(x, &mut ge, &mut gb, due);
        let cs = c.onebit_compress_deferred(x, &mut ce, &mut cb, due);
        ensure!(
            gb == cb,
            "{name}: onebit_compress_deferred due={due} bits: {}",
            first_diff(&gb, &cb)
        );
        ensure!(
            same_or_nan(&ge, &ce),
            "{name}: onebit_compress_deferred due={due} values: {}",
            fdiff(&ge, &ce)
        );
        ensure!(
            ulps(gs, cs) <= 1 || (gs.is_nan() && cs.is_nan()),
            "{name}: onebit_compress_deferred due={due} scale {gs:?} vs {cs:?}"
        );
    }
    check_onebit_server(g, name, &e0, nb, &mut r)?;
    check_onebit_pack(g, name, x, &e0, nb)?;
    t.cases += 9;
    t.elements += 9 * n;
    Ok(())
}

/// [`check_onebit`]'s server stage, deferred.
fn check_onebit_server(
    g: &dyn Kernels,
    name: &str,
    e0: &[f32],
    nb: usize,
    r: &mut Rng,
) -> Result<(), String> {
    let c = cpu();
    // The server stage, deferred: three messages (one of them longer than needed), their
    // sum and sign pack; Σz² to relative 1e-12 (an f64 sum in another order).
    let msgs: Vec<(Vec<u8>, f32)> = (0..3)
        .map(|m| {
            let bytes = (0..nb + 2 * (m == 1) as usize)
                .map(|_| r.next_u64() as u8)
                .collect();
            (bytes, [0.5f32, 1.25, 0.0][m])
        })
        .collect();
    for due in [0.0f32, 0.37] {
        let (mut ge, mut ce) = (e0.to_vec(), e0.to_vec());
        let (mut gb, mut cb) = (vec![0u8; nb], vec![0u8; nb]);
        let gs = g.onebit_server_deferred(&msgs, &mut ge, due, &mut gb);
        let cs = c.onebit_server_deferred(&msgs, &mut ce, due, &mut cb);
        ensure!(
            gb == cb,
            "{name}: onebit_server_deferred due={due} bits: {}",
            first_diff(&gb, &cb)
        );
        ensure!(
            same_or_nan(&ge, &ce),
            "{name}: onebit_server_deferred due={due} values: {}",
            fdiff(&ge, &ce)
        );
        ensure!(
            (gs - cs).abs() <= 1e-12 * cs.abs() || (gs.is_nan() && cs.is_nan()),
            "{name}: onebit_server_deferred due={due} sum of squares {gs:?} vs {cs:?}"
        );
    }
    Ok(())
}

/// [`check_onebit`]'s pack for a given scale, decompress and decompress-add.
fn check_onebit_pack(
    g: &dyn Kernels,
    name: &str,
    x: &[f32],
    e0: &[f32],
    nb: usize,
) -> Result<(), String> {
    let c = cpu();
    // Pack for a given scale (a buffer whose length is not a multiple of 8: its whole bytes).
    let mut buf: Vec<f32> = x.to_vec();
    buf.extend_from_slice(&e0[..3]);
    let (mut gbuf, mut cbuf) = (buf.clone(), buf);
    let k = gbuf.len() / 8;
    let (mut gb, mut cb) = (vec![0u8; k], vec![0u8; k]);
    g.onebit_pack_with_feedback(&mut gbuf, &mut gb, 0.75);
    c.onebit_pack_with_feedback(&mut cbuf, &mut cb, 0.75);
    ensure!(
        gb == cb,
        "{name}: onebit_pack_with_feedback bits: {}",
        first_diff(&gb, &cb)
    );
    ensure!(
        same_or_nan(&gbuf, &cbuf),
        "{name}: onebit_pack_with_feedback: {}",
        fdiff(&gbuf, &cbuf)
    );
    // Decompress (a length that ends inside a byte) and decompress-add.
    let m = (8 * nb).saturating_sub(5);
    let (mut go, mut co) = (vec![9f32; m], vec![9f32; m]);
    g.onebit_decompress(&cb_or(&cb, nb), 1.5, &mut go);
    c.onebit_decompress(&cb_or(&cb, nb), 1.5, &mut co);
    ensure!(
        same_bits(&go, &co),
        "{name}: onebit_decompress: {}",
        fdiff(&go, &co)
    );
    let (mut ga, mut ca) = (e0[..m].to_vec(), e0[..m].to_vec());
    g.onebit_decompress_add(&cb_or(&cb, nb), -0.25, &mut ga);
    c.onebit_decompress_add(&cb_or(&cb, nb), -0.25, &mut ca);
    ensure!(
        same_or_nan(&ga, &ca),
        "{name}: onebit_decompress_add: {}",
        fdiff(&ga, &ca)
    );
    Ok(())
}

/// Bits to decompress: `bits` padded with a pattern to `nb` bytes.
fn cb_or(bits: &[u8], nb: usize) -> Vec<u8> {
    let mut b = bits.to_vec();
    b.resize(nb, 0b1010_0110);
    b
}

/// The extras of [`Gpu`]: Gaussiank's mean/std (relative 1e-9 of the scale of x) and the
/// fp16 wire (bit for bit against the `half` crate, both ways).
pub fn check_extras<B: Backend>(
    g: &Gpu<B>,
    name: &str,
    x: &[f32],
    t: &mut Tally,
) -> Result<(), String> {
    let finite: Vec<f32> = x
        .iter()
        .copied()
        .filter(|v| v.is_finite() && v.abs() < 1e30)
        .collect();
    let (gm, gsd) = g.mean_std(&finite);
    let (cm, csd) = gradkit_sparsify::gaussiank::mean_std(&finite);
    let scale = finite
        .iter()
        .fold(0f64, |a, &v| a.max((v as f64).abs()))
        .max(1e-30);
    ensure!(
        (gm - cm).abs() <= 1e-9 * scale && (gsd - csd).abs() <= 1e-9 * scale,
        "{name}: mean_std ({gm}, {gsd}) vs ({cm}, {csd})"
    );
    let gh = g.to_f16(x);
    let ch: Vec<u16> = x
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    ensure!(gh == ch, "{name}: fp16 wire: {}", first_diff(&gh, &ch));
    let gf = g.from_f16(&ch);
    let cf: Vec<f32> = ch
        .iter()
        .map(|&h| half::f16::from_bits(h).to_f32())
        .collect();
    ensure!(
        same_bits(&gf, &cf),
        "{name}: fp16 back to f32: {}",
        fdiff(&gf, &cf)
    );
    t.cases += 3;
    t.elements += 3 * x.len();
    Ok(())
}

/// Every check on the inputs of every length in `lengths` (selection and moves on all four
/// inputs, 1-bit and extras on the mixed and tied ones).
pub fn check_all<B: Backend>(g: &Gpu<B>, lengths: &[usize], seed: u64) -> Result<Tally, String> {
    let mut t = Tally::default();
    for &n in lengths {
        for (i, (name, x)) in inputs(n, seed).iter().enumerate() {
            check_selection(g, name, x, &mut t)?;
            check_moves(g, name, x, &mut t)?;
            if i < 2 {
                check_onebit(g, name, x, &mut t)?;
                check_extras(g, name, x, &mut t)?;
            }
        }
    }
    Ok(t)
}

/// The fp16 wire on every binary16 bit pattern and on f32 bit patterns around every
/// rounding boundary class (random, specials).
pub fn check_f16_exhaustive<B: Backend>(g: &Gpu<B>) -> Result<(), String> {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let gf = g.from_f16(&all);
    let cf: Vec<f32> = all
        .iter()
        .map(|&h| half::f16::from_bits(h).to_f32())
        .collect();
    ensure!(
        same_bits(&gf, &cf),
        "fp16 → f32 over all 65536 patterns: {}",
        fdiff(&gf, &cf)
    );
    let mut r = Rng::new(5);
    let mut x: Vec<f32> = (0..1 << 16)
        .map(|_| f32::from_bits(r.next_u64() as u32))
        .collect();
    // Halfway cases: every fp16 value ± half an fp16 ulp, exactly representable in f32.
    for &h in &all {
        let v = half::f16::from_bits(h).to_f32();
        if v.is_finite() {
            let b = v.to_bits();
            x.extend([
                f32::from_bits(b + 0x1000),
                f32::from_bits(b.wrapping_sub(0x1000)),
            ]);
        }
    }
    x.extend(specials());
    let gh = g.to_f16(&x);
    let ch: Vec<u16> = x
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    ensure!(gh == ch, "f32 → fp16: {}", first_diff(&gh, &ch));
    Ok(())
}

/// One row of [`check_large`]: the method, whether it equals the CPU, and the detail.
pub type Row = (String, bool, String);

/// The GPU-vs-CPU equivalence at one (large) length `n`, one call per method on a mixed
/// input (normals and the specials): top-k at k = 1 % (indices, values, k-th magnitude),
/// threshold selection at that k-th magnitude, gather and scatter-add of the selection,
/// 1-bit compress with feedback and decompress-add, Gaussiank's moments, the fp16 wire.
/// Every row is computed (no early return), so a table shows them all.
pub fn check_large<B: Backend>(g: &Gpu<B>, n: usize, seed: u64) -> Vec<Row> {
    let c = cpu();
    let x = inputs(n, seed).swap_remove(0).1;
    let mut rows: Vec<Row> = Vec::new();
    let mut row = |m: &str, r: Result<(), String>| {
        let ok = r.is_ok();
        rows.push((m.to_string(), ok, r.err().unwrap_or_default()));
    };
    let k = (n / 100).max(1);
    let (gi, gv, gt) = g.topk_with_values(&x, k);
    let (ci, cv, ct) = c.topk_with_values(&x, k);
    row(
        "topk_with_values (k = 1 %)",
        if gi != ci {
            Err(format!("indices: {}", first_diff(&gi, &ci)))
        } else if !same_bits(&gv, &cv) {
            Err(format!("values: {}", fdiff(&gv, &cv)))
        } else if gt.map(f32::to_bits) != ct.map(f32::to_bits) {
            Err(format!("k-th magnitude {gt:?} vs {ct:?}"))
        } else {
            Ok(())
        },
    );
    let th = ct.unwrap_or(0.0);
    let (gs, gsv) = g.select_above_with_values(&x, th);
    let (cs, csv) = c.select_above_with_values(&x, th);
    row(
        "select_above_with_values (th = k-th magnitude)",
        if gs == cs && same_bits(&gsv, &csv) {
            Ok(())
        } else {
            Err(first_diff(&gs, &cs))
        },
    );
    let (gg, cg) = (g.gather(&x, &ci), c.gather(&x, &ci));
    row(
        "gather",
        if same_bits(&gg, &cg) {
            Ok(())
        } else {
            Err(fdiff(&gg, &cg))
        },
    );
    let (mut gd, mut cd) = (vec![0.5f32; n], vec![0.5f32; n]);
    g.scatter_add(&mut gd, &ci, &cv);
    c.scatter_add(&mut cd, &ci, &cv);
    row(
        "scatter_add (distinct indices)",
        if same_or_nan(&gd, &cd) {
            Ok(())
        } else {
            Err(fdiff(&gd, &cd))
        },
    );
    let mut t = Tally::default();
    row(
        "onebit (compress, deferred, pack, decompress)",
        check_onebit(g, "large", &x, &mut t),
    );
    row("mean_std, fp16 wire", check_extras(g, "large", &x, &mut t));
    rows
}

// ---- the device seam (resident.rs) ------------------------------------------------------

fn bits_of(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Equal bits, any NaN equal to any NaN (the GPU's arithmetic NaN is canonical).
fn same_any_nan(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

fn close_rel(a: f64, b: f64, rel: f64) -> bool {
    a == b || (a - b).abs() <= rel * a.abs().max(b.abs()) || (a.is_nan() && b.is_nan())
}

/// Every primitive of `g` against the counting device on `x`; the first difference.
fn check_resident_one(g: &dyn DeviceKernels, name: &str, x: &[f32]) -> Result<(), String> {
    let c = Counting::new();
    let n = x.len();
    let (xg, xc) = (g.upload_f32(x), c.upload_f32(x));
    let err = |what: &str| Err(format!("{what} differs on {name} (n = {n})"));
    if bits_of(&g.download_f32(&xg)) != bits_of(x) {
        return err("upload/download");
    }
    let ranges = [0..n, n / 3..n - n / 5];
    check_resident_topk(g, &c, (&xg, &xc), &ranges, name)?;
    let mut ths = vec![-1.0, 0.0, f32::from_bits(1), f32::INFINITY, f32::NAN];
    if n > 0 {
        ths.extend([x[n / 2].abs(), c.kth_largest_magnitude(&xc, n.div_ceil(3))]);
        for k in [1, n.div_ceil(3), n] {
            if g.kth_largest_magnitude(&xg, k).to_bits()
                != c.kth_largest_magnitude(&xc, k).to_bits()
            {
                return err(&format!("kth_largest_magnitude k = {k}"));
            }
        }
    }
    for th in ths {
        let (gi, gv) = g.select_above(&xg, th);
        let (ci, cv) = c.select_above(&xc, th);
        if g.download_u32(&gi) != c.download_u32(&ci)
            || !same_any_nan(&g.download_f32(&gv), &c.download_f32(&cv))
        {
            return err(&format!("select_above th = {th}"));
        }
        if g.count_above(&xg, th) != c.count_above(&xc, th) {
            return err(&format!("count_above th = {th}"));
        }
    }
    let idx: Vec<u32> = (0..n as u32).filter(|i| i % 3 == 1).collect();
    let (ig, ic) = (g.upload_u32(&idx), c.upload_u32(&idx));
    if !same_any_nan(
        &g.download_f32(&g.gather(&xg, &ig)),
        &c.download_f32(&c.gather(&xc, &ic)),
    ) {
        return err("gather");
    }
    // acc = x + y, then the entries at idx zeroed: the residual of error feedback.
    let y: Vec<f32> = x.iter().rev().copied().collect();
    let (mut ag, mut ac) = (g.upload_f32(x), c.upload_f32(x));
    let (sg, sc) = (
        g.add_squared(&mut ag, &g.upload_f32(&y)),
        c.add_squared(&mut ac, &c.upload_f32(&y)),
    );
    if !same_any_nan(&g.download_f32(&ag), &c.download_f32(&ac)) || !close_rel(sg, sc, 1e-12) {
        return err("add_squared");
    }
    let (lg, lc) = (g.zero_at(&mut ag, &ig), c.zero_at(&mut ac, &ic));
    if !same_any_nan(&g.download_f32(&ag), &c.download_f32(&ac)) || !close_rel(lg, lc, 1e-12) {
        return err("zero_at");
    }
    let (ng, nc) = (g.range_norms(&xg, &ranges), c.range_norms(&xc, &ranges));
    if ng.iter().zip(&nc).any(|(a, b)| !close_rel(*a, *b, 1e-12)) {
        return err("range_norms");
    }
    if n > 0 {
        let ((mg, sg), (mc, sc)) = (g.mean_std(&xg), c.mean_std(&xc));
        if !close_rel(mg, mc, 1e-9) || !close_rel(sg, sc, 1e-9) {
            return err("mean_std");
        }
    }
    check_resident_onebit(g, &c, name, x)
}

/// Both devices' copies of a host buffer.
type Pair = (resident::DVec, resident::DVec);

fn up2(g: &dyn DeviceKernels, c: &Counting, x: &[f32]) -> Pair {
    (g.upload_f32(x), c.upload_f32(x))
}

fn same2(g: &dyn DeviceKernels, c: &Counting, (a, b): &Pair) -> bool {
    same_any_nan(&g.download_f32(a), &c.download_f32(b))
}

/// The 1-bit primitives of `g` against the counting device on `x` with a padded error
/// buffer (one byte's worth past x): the deferred compressor and server stage (signs and
/// buffers bit for bit, the scale within an ulp, Σz² to 1e-12), the settled sum of squares,
/// and decompression (set and add) into a range from a byte offset.
fn check_resident_onebit(
    g: &dyn DeviceKernels,
    c: &Counting,
    name: &str,
    x: &[f32],
) -> Result<(), String> {
    let n = x.len();
    let err = |what: &str| Err(format!("{what} differs on {name} (n = {n})"));
    let len = n.div_ceil(8) * 8 + 8;
    let mut r = Rng::new(n as u64 + 31);
    let e0: Vec<f32> = (0..len)
        .map(|i| match i % 11 {
            0 => 0.0,
            1 => -0.0,
            2 => x.get(len - 1 - i).copied().unwrap_or(1.0),
            _ => r.normal() * 0.1,
        })
        .collect();
    let xs = up2(g, c, x);
    let mut es = up2(g, c, &e0);
    let mut last = None;
    for due in [0.0f32, 0.37] {
        let (gb, gs) = g.onebit_compress_deferred(&xs.0, &mut es.0, due);
        let (cb, cs) = c.onebit_compress_deferred(&xs.1, &mut es.1, due);
        if g.download_u8(&gb) != c.download_u8(&cb) || !same2(g, c, &es) {
            return err(&format!("onebit_compress_deferred due = {due}"));
        }
        if ulps(gs, cs) > 1 && !(gs.is_nan() && cs.is_nan()) {
            return err(&format!("onebit_compress_deferred due = {due}: scale"));
        }
        let (gq, cq) = (
            g.onebit_settled_sum_sq(&es.0, cs),
            c.onebit_settled_sum_sq(&es.1, cs),
        );
        if !close_rel(gq, cq, 1e-12) {
            return err("onebit_settled_sum_sq");
        }
        last = Some(c.download_u8(&cb));
    }
    let bits = last.expect("two rounds");
    check_resident_onebit_server(g, c, (name, n), &e0, &mut r)?;
    // Decompress 8·(bytes − 1) − 3 values from byte 1 into out[2..], set, then added.
    let m = (8 * (bits.len() - 1)).saturating_sub(3);
    let mut outs = up2(g, c, &e0[..m + 5]);
    let bs = (g.upload_u8(&bits), c.upload_u8(&bits));
    for (s, add) in [
        (1.5f32, false),
        (-0.25, true),
        (f32::NAN, true),
        (-0.0, false),
    ] {
        g.onebit_unpack(&bs.0, 1, s, &mut outs.0, 2..2 + m, add);
        c.onebit_unpack(&bs.1, 1, s, &mut outs.1, 2..2 + m, add);
        if !same2(g, c, &outs) {
            return err(&format!("onebit_unpack s = {s} add = {add}"));
        }
    }
    Ok(())
}

/// [`check_resident_onebit`]'s server stage: three chunks (scales 0.5, 1.25, −0.0) of random
/// signs summed into the error, settling `due`.
fn check_resident_onebit_server(
    g: &dyn DeviceKernels,
    c: &Counting,
    (name, n): (&str, usize),
    e0: &[f32],
    r: &mut Rng,
) -> Result<(), String> {
    let nb = e0.len() / 8;
    let msgs: Vec<u8> = (0..3 * nb).map(|_| r.next_u64() as u8).collect();
    let scales = [0.5f32, 1.25, -0.0];
    let ms = (g.upload_u8(&msgs), c.upload_u8(&msgs));
    let mut es = up2(g, c, e0);
    for due in [0.0f32, 0.37] {
        let (gb, gq) = g.onebit_server_deferred(&ms.0, &scales, &mut es.0, due);
        let (cb, cq) = c.onebit_server_deferred(&ms.1, &scales, &mut es.1, due);
        if g.download_u8(&gb) != c.download_u8(&cb)
            || !same2(g, c, &es)
            || !close_rel(gq, cq, 1e-12)
        {
            return Err(format!(
                "onebit_server_deferred due = {due} differs on {name} (n = {n})"
            ));
        }
    }
    Ok(())
}

/// The device seam's primitives of `g` against the counting host device (the CPU functions)
/// on [`inputs`] of each length: bit for bit, the f64 sums to 1e-12 relative (Gaussiank's
/// moments 1e-9). Returns the inputs checked, or the first difference naming the primitive.
pub fn check_resident(g: &dyn DeviceKernels, lengths: &[usize]) -> Result<usize, String> {
    let mut cases = 0;
    for &n in lengths {
        for (name, x) in inputs(n, 5) {
            check_resident_one(g, &name, &x)?;
            cases += 1;
        }
    }
    Ok(cases)
}

/// [`check_resident`]'s top-k of each range and k.
fn check_resident_topk(
    g: &dyn DeviceKernels,
    c: &Counting,
    (xg, xc): (&resident::DVec, &resident::DVec),
    ranges: &[std::ops::Range<usize>],
    name: &str,
) -> Result<(), String> {
    let n = xg.len();
    let err = |what: &str| Err(format!("{what} differs on {name} (n = {n})"));
    for r in ranges {
        for k in [0, 1, 2, r.len() / 2, r.len()] {
            let (gi, gv, gt) = g.topk(xg, r.clone(), k);
            let (ci, cv, ct) = c.topk(xc, r.clone(), k);
            if g.download_u32(&gi) != c.download_u32(&ci)
                || !same_any_nan(&g.download_f32(&gv), &c.download_f32(&cv))
                || gt.map(f32::to_bits) != ct.map(f32::to_bits)
            {
                return err(&format!("topk k = {k} in {r:?}"));
            }
        }
    }
    Ok(())
}
