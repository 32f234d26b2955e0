//! The device seam: a step's tensors stay in a device's memory (docs/GPU.md §7).
//!
//! [`crate::kernels::Kernels`] takes host slices, so a GPU behind it copies every call's
//! inputs up and its results down. [`DeviceKernels`] takes [`DVec`]/[`DIdx`] handles to
//! memory the device owns instead: the caller uploads the step's gradient once
//! ([`accumulate`]), selects on the device, downloads only what leaves it (the selection that
//! goes on the wire), and settles its error feedback there ([`settle`]); the residual lives on
//! the device across steps. The algorithms over these handles ([`accumulate`], [`settle`],
//! [`topk_select`], [`gaussiank_select`], [`ranges_select`] and
//! [`crate::oktopk::OkTopk::select_values_resident`]) are written once; a device supplies the
//! primitive operations. The 1-bit primitives (`onebit_*`, packed signs as [`DBits`]) keep
//! the compressed allreduce's worker and server errors on the device: only packed signs
//! cross besides the gradient and the result (`gradkit_collectives::onebit`).
//!
//! [`Counting`] is a device whose memory is host memory but whose transfers are explicit
//! copies and counted ([`Transfers`]): the collectives run over it in tests on a machine
//! with no GPU, and its results must equal the plain host path bit for bit (it runs the CPU
//! functions); the counters say what crossed. The CUDA device is gradkit-cuda's
//! `resident::Resident`, over the same kernels as its `Kernels`.

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use gradkit_core::trace::Sparse;

use crate::feedback::{self, Leaves};
use crate::{gaussiank, onebit, threshold, topk};

/// A device buffer of `T` (f32 values, u32 indices or packed u8 signs), owned by the device that made it:
/// only that device's methods read it ([`DeviceKernels`]).
pub struct DTensor<T> {
    len: usize,
    mem: Box<dyn Any + Send + Sync>,
    _t: PhantomData<T>,
}

/// Values on the device.
pub type DVec = DTensor<f32>;
/// Indices on the device.
pub type DIdx = DTensor<u32>;
/// Packed 1-bit signs on the device: bytes, eight signs each, MSB-first (the wire format of
/// `gradkit_collectives::onebit`, so a chunk downloads straight into a message). Bytes rather
/// than u32 words: the server chunks are whole bytes but not whole words (`padded/(8P)`
/// bytes), and the kernels address them by byte.
pub type DBits = DTensor<u8>;

impl<T> DTensor<T> {
    /// A handle to `len` elements in `mem` (a device's own memory type).
    pub fn new(len: usize, mem: Box<dyn Any + Send + Sync>) -> Self {
        DTensor {
            len,
            mem,
            _t: PhantomData,
        }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The device's memory as its own type.
    ///
    /// # Panics
    /// If the tensor belongs to another kind of device.
    pub fn mem<M: 'static>(&self) -> &M {
        self.mem
            .downcast_ref()
            .expect("a device tensor used with another device")
    }
    /// As [`DTensor::mem`], writable.
    pub fn mem_mut<M: 'static>(&mut self) -> &mut M {
        self.mem
            .downcast_mut()
            .expect("a device tensor used with another device")
    }
}

impl<T> fmt::Debug for DTensor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DTensor({} elements)", self.len)
    }
}

/// Host ↔ device copies so far: how many and how many bytes each way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transfers {
    pub uploads: u64,
    pub upload_bytes: u64,
    pub downloads: u64,
    pub download_bytes: u64,
}

impl Transfers {
    /// What happened between `before` and `self`.
    pub fn since(&self, before: &Transfers) -> Transfers {
        Transfers {
            uploads: self.uploads - before.uploads,
            upload_bytes: self.upload_bytes - before.upload_bytes,
            downloads: self.downloads - before.downloads,
            download_bytes: self.download_bytes - before.download_bytes,
        }
    }
}

/// Transfer counters a device keeps (atomics: a device is shared by reference).
#[derive(Debug, Default)]
pub struct Counters {
    uploads: AtomicU64,
    upload_bytes: AtomicU64,
    downloads: AtomicU64,
    download_bytes: AtomicU64,
}

impl Counters {
    pub fn upload(&self, bytes: usize) {
        self.uploads.fetch_add(1, Relaxed);
        self.upload_bytes.fetch_add(bytes as u64, Relaxed);
    }
    pub fn download(&self, bytes: usize) {
        self.downloads.fetch_add(1, Relaxed);
        self.download_bytes.fetch_add(bytes as u64, Relaxed);
    }
    pub fn get(&self) -> Transfers {
        Transfers {
            uploads: self.uploads.load(Relaxed),
            upload_bytes: self.upload_bytes.load(Relaxed),
            downloads: self.downloads.load(Relaxed),
            download_bytes: self.download_bytes.load(Relaxed),
        }
    }
}

/// The primitive operations on device-resident data. Every method has the semantics of the
/// CPU function it names; only uploads and downloads move data between host and device (a
/// count or a scalar result is not counted). Magnitude order and tie rules as in
/// [`crate::kernels::Kernels`].
pub trait DeviceKernels: Send + Sync + fmt::Debug {
    /// A short name for logs (`"counting"`, `"cuda"`).
    fn name(&self) -> &'static str;
    /// The transfers so far.
    fn transfers(&self) -> Transfers;
    /// `n` zeros allocated on the device (no transfer).
    fn zeros(&self, n: usize) -> DVec;
    /// Host → device.
    fn upload_f32(&self, x: &[f32]) -> DVec;
    /// Host → device.
    fn upload_u32(&self, x: &[u32]) -> DIdx;
    /// Device → host.
    fn download_f32(&self, x: &DVec) -> Vec<f32>;
    /// Device → host.
    fn download_u32(&self, x: &DIdx) -> Vec<u32>;
    /// Host → device (packed signs).
    fn upload_u8(&self, x: &[u8]) -> DBits;
    /// Device → host (packed signs).
    fn download_u8(&self, x: &DBits) -> Vec<u8>;
    /// `acc += g` element by element; returns `Σ acc²` in f64 (as
    /// [`feedback::add_squared`]).
    fn add_squared(&self, acc: &mut DVec, g: &DVec) -> f64;
    /// `Σ x²` in f64 (as [`feedback::sum_squares`]).
    fn sum_squares(&self, x: &DVec) -> f64;
    /// The L2 norm of each range of `x`, in f64 (as [`crate::deft::range_norm`]).
    fn range_norms(&self, x: &DVec, ranges: &[Range<usize>]) -> Vec<f64>;
    /// Sets `x[i] = +0.0` at the (distinct) indices; returns the sum of the squares of the
    /// values zeroed, in f64.
    fn zero_at(&self, x: &mut DVec, idx: &DIdx) -> f64;
    /// Exact top-k of `x[range]` by magnitude with the values and the k-th largest magnitude,
    /// as [`topk::topk_with_values`]; the indices are relative to `range.start`.
    fn topk(&self, x: &DVec, range: Range<usize>, k: usize) -> (DIdx, DVec, Option<f32>);
    /// `{i : |x_i| > th}` ascending, with the values, as [`threshold::above_with_values`].
    fn select_above(&self, x: &DVec, th: f32) -> (DIdx, DVec);
    /// `#{i : |x_i| > th}`, as [`threshold::count_above`].
    fn count_above(&self, x: &DVec, th: f32) -> u64;
    /// The k-th largest magnitude, as [`topk::kth_largest_abs`] (`1 ≤ k ≤ len`).
    fn kth_largest_magnitude(&self, x: &DVec, k: usize) -> f32;
    /// Mean and population std in f64, as [`gaussiank::mean_std`].
    fn mean_std(&self, x: &DVec) -> (f64, f64);
    /// `x[idx[j]]` for every j.
    fn gather(&self, x: &DVec, idx: &DIdx) -> DVec;
    /// The 1-bit worker compressor with deferred error feedback, as
    /// [`onebit::compress_deferred`] (and `Kernels::onebit_compress_deferred`): `e` holds the
    /// last call's `c'`, owing `due·sign(c')`; leaves `c = settled e + x` (padding `+ 0.0`)
    /// in `e` and returns its packed signs (`e.len()/8` bytes) and scale.
    ///
    /// # Panics
    /// Unless `e.len()` is a multiple of 8 and `x.len() ≤ e.len()`.
    fn onebit_compress_deferred(&self, x: &DVec, e: &mut DVec, due: f32) -> (DBits, f32);
    /// The 1-bit server stage with deferred error feedback, as
    /// [`onebit::server_sum_deferred`]: `msgs` holds `scales.len()` chunks of `err.len()/8`
    /// bytes side by side, chunk `m` weighted by `scales[m]` (host arguments, like a
    /// threshold: not counted as transfers); leaves `z` in `err` and returns its packed
    /// signs (`err.len()/8` bytes) and Σz² in f64.
    ///
    /// # Panics
    /// Unless `err.len()` is a multiple of 8 and `msgs.len() == scales.len()·err.len()/8`.
    fn onebit_server_deferred(
        &self,
        msgs: &DBits,
        scales: &[f32],
        err: &mut DVec,
        due: f32,
    ) -> (DBits, f64);
    /// 1-bit decompression into `out[range]` from the bits starting at byte `byte_at` of
    /// `bits`: `out[range.start + i] = ±s` ([`onebit::unpack_scaled`]), or `+= ±s` when
    /// `add` ([`onebit::unpack_accumulate`]).
    fn onebit_unpack(
        &self,
        bits: &DBits,
        byte_at: usize,
        s: f32,
        out: &mut DVec,
        range: Range<usize>,
        add: bool,
    );
    /// Σ of the squares of the settled values `e − due·sign(e)`, in f64, without writing
    /// `e` (as [`onebit::settled_sum_sq`]): the error norms of a deferred buffer.
    fn onebit_settled_sum_sq(&self, e: &DVec, due: f32) -> f64;
}

/// Downloads a selection (indices and values) as a host [`Sparse`], offsetting the indices.
pub fn download_sparse(dev: &dyn DeviceKernels, idx: &DIdx, val: &DVec, offset: u32) -> Sparse {
    let mut indices = dev.download_u32(idx);
    if offset != 0 {
        indices.iter_mut().for_each(|i| *i += offset);
    }
    Sparse {
        indices,
        values: dev.download_f32(val),
    }
}

/// Error feedback's accumulation on the device: uploads the gradient (the step's one
/// upload of it) and returns `acc = residual + g` (in the residual's memory; `g` itself
/// without a residual) and `Σ acc²`, as [`feedback::Residual::absorb_squared`].
pub fn accumulate(dev: &dyn DeviceKernels, residual: Option<DVec>, g: &[f32]) -> (DVec, f64) {
    let gd = dev.upload_f32(g);
    match residual {
        Some(mut acc) => {
            assert_eq!(acc.len(), g.len(), "gradient and residual lengths");
            let sq = dev.add_squared(&mut acc, &gd);
            (acc, sq)
        }
        None => {
            let sq = dev.sum_squares(&gd);
            (gd, sq)
        }
    }
}

/// The entries `rule` names for `sent` and `result` (both ascending), as
/// [`feedback::Residual::settle`] zeroes them.
pub fn leaving(rule: Leaves, sent: &[u32], result: &[u32]) -> Vec<u32> {
    match rule {
        Leaves::Sent => sent.to_vec(),
        Leaves::Result => result.to_vec(),
        Leaves::SentInResult => {
            let mut out = Vec::with_capacity(sent.len().min(result.len()));
            let mut r = result.iter().peekable();
            for &i in sent {
                while r.next_if(|&&j| j < i).is_some() {}
                if r.peek() == Some(&&i) {
                    out.push(i);
                }
            }
            out
        }
    }
}

/// [`feedback::Residual::settle_norm`] on the device: `acc` with the entries `rule` names
/// zeroed becomes the residual (returned), with its L2 norm. Uploads the indices that leave.
pub fn settle(
    dev: &dyn DeviceKernels,
    mut acc: DVec,
    rule: Leaves,
    sent: &[u32],
    result: &[u32],
    acc_sq: f64,
) -> (DVec, f64) {
    let idx = dev.upload_u32(&leaving(rule, sent, result));
    let left = dev.zero_at(&mut acc, &idx);
    let norm = feedback::norm_after(acc_sq, left, || dev.sum_squares(&acc));
    (acc, norm)
}

/// Exact top-k of `acc` (as `Kernels::topk_with_values`), downloaded.
pub fn topk_select(dev: &dyn DeviceKernels, acc: &DVec, k: usize) -> Sparse {
    let (i, v, _) = dev.topk(acc, 0..acc.len(), k);
    download_sparse(dev, &i, &v, 0)
}

/// Gaussiank's selection ([`gaussiank::select_values`]) on the device: the fit from the
/// device's mean and std, halved until ⌈3k/4⌉ entries pass ([`gaussiank::lower_until`]),
/// then `{|acc| > th}` downloaded, with th.
pub fn gaussiank_select(dev: &dyn DeviceKernels, acc: &DVec, k: usize) -> (Sparse, f32) {
    let n = acc.len();
    if n == 0 || k == 0 {
        return (Sparse::default(), f32::INFINITY);
    }
    let (mean, std) = dev.mean_std(acc);
    let fit = gaussiank::fit_from(mean, std, k as f64 / n as f64);
    let th = gaussiank::lower_until(fit, (3 * k).div_ceil(4), |t| {
        dev.count_above(acc, t) as usize
    });
    let (i, v) = dev.select_above(acc, th);
    (download_sparse(dev, &i, &v, 0), th)
}

/// DEFT's per-range selection ([`crate::deft::select_in_ranges`]) on the device: exact top-k
/// in each `(range, k)`, flat indices ascending, downloaded (the values stay: DEFT sends
/// every rank's values at the gathered indices).
pub fn ranges_select(
    dev: &dyn DeviceKernels,
    acc: &DVec,
    ranges: &[(Range<usize>, usize)],
) -> Vec<u32> {
    let mut sel = Vec::new();
    for (rg, k) in ranges {
        let (i, _, _) = dev.topk(acc, rg.clone(), *k);
        let off = rg.start as u32;
        sel.extend(dev.download_u32(&i).into_iter().map(|i| i + off));
    }
    sel.sort_unstable();
    sel
}

/// A device whose memory is host memory and whose transfers are explicit, counted copies:
/// the CPU functions on resident data. For tests of the seam on a machine with no GPU.
#[derive(Debug, Default)]
pub struct Counting {
    counters: Counters,
}

impl Counting {
    pub fn new() -> Self {
        Counting::default()
    }
}

fn host<T: Copy + Send + Sync + 'static>(v: Vec<T>) -> DTensor<T> {
    DTensor::new(v.len(), Box::new(v))
}

impl DeviceKernels for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn transfers(&self) -> Transfers {
        self.counters.get()
    }
    fn zeros(&self, n: usize) -> DVec {
        host(vec![0.0; n])
    }
    fn upload_f32(&self, x: &[f32]) -> DVec {
        self.counters.upload(4 * x.len());
        host(x.to_vec())
    }
    fn upload_u32(&self, x: &[u32]) -> DIdx {
        self.counters.upload(4 * x.len());
        host(x.to_vec())
    }
    fn download_f32(&self, x: &DVec) -> Vec<f32> {
        self.counters.download(4 * x.len());
        x.mem::<Vec<f32>>().clone()
    }
    fn download_u32(&self, x: &DIdx) -> Vec<u32> {
        self.counters.download(4 * x.len());
        x.mem::<Vec<u32>>().clone()
    }
    fn upload_u8(&self, x: &[u8]) -> DBits {
        self.counters.upload(x.len());
        host(x.to_vec())
    }
    fn download_u8(&self, x: &DBits) -> Vec<u8> {
        self.counters.download(x.len());
        x.mem::<Vec<u8>>().clone()
    }
    fn add_squared(&self, acc: &mut DVec, g: &DVec) -> f64 {
        feedback::add_squared(acc.mem_mut::<Vec<f32>>(), g.mem::<Vec<f32>>())
    }
    fn sum_squares(&self, x: &DVec) -> f64 {
        feedback::sum_squares(x.mem::<Vec<f32>>())
    }
    fn range_norms(&self, x: &DVec, ranges: &[Range<usize>]) -> Vec<f64> {
        let x = x.mem::<Vec<f32>>();
        ranges
            .iter()
            .map(|r| crate::deft::range_norm(&x[r.clone()]))
            .collect()
    }
    fn zero_at(&self, x: &mut DVec, idx: &DIdx) -> f64 {
        let x = x.mem_mut::<Vec<f32>>();
        let mut left = 0f64;
        for &i in idx.mem::<Vec<u32>>() {
            let v = std::mem::take(&mut x[i as usize]) as f64;
            left += v * v;
        }
        left
    }
    fn topk(&self, x: &DVec, range: Range<usize>, k: usize) -> (DIdx, DVec, Option<f32>) {
        let (i, v, t) = topk::topk_with_values(&x.mem::<Vec<f32>>()[range], k);
        (host(i), host(v), t)
    }
    fn select_above(&self, x: &DVec, th: f32) -> (DIdx, DVec) {
        let (i, v) = threshold::above_with_values(x.mem::<Vec<f32>>(), th);
        (host(i), host(v))
    }
    fn count_above(&self, x: &DVec, th: f32) -> u64 {
        threshold::count_above(x.mem::<Vec<f32>>(), th) as u64
    }
    fn kth_largest_magnitude(&self, x: &DVec, k: usize) -> f32 {
        topk::kth_largest_abs(x.mem::<Vec<f32>>(), k)
    }
    fn mean_std(&self, x: &DVec) -> (f64, f64) {
        gaussiank::mean_std(x.mem::<Vec<f32>>())
    }
    fn gather(&self, x: &DVec, idx: &DIdx) -> DVec {
        let x = x.mem::<Vec<f32>>();
        host(
            idx.mem::<Vec<u32>>()
                .iter()
                .map(|&i| x[i as usize])
                .collect(),
        )
    }
    fn onebit_compress_deferred(&self, x: &DVec, e: &mut DVec, due: f32) -> (DBits, f32) {
        let e = e.mem_mut::<Vec<f32>>();
        let mut bits = vec![0u8; e.len() / 8];
        let s = onebit::compress_deferred(x.mem::<Vec<f32>>(), e, &mut bits, due);
        (host(bits), s)
    }
    fn onebit_server_deferred(
        &self,
        msgs: &DBits,
        scales: &[f32],
        err: &mut DVec,
        due: f32,
    ) -> (DBits, f64) {
        let err = err.mem_mut::<Vec<f32>>();
        let nb = err.len() / 8;
        let all = msgs.mem::<Vec<u8>>();
        assert_eq!(all.len(), scales.len() * nb, "1-bit server messages");
        let split: Vec<(Vec<u8>, f32)> = scales
            .iter()
            .enumerate()
            .map(|(m, &s)| (all[m * nb..(m + 1) * nb].to_vec(), s))
            .collect();
        let mut out = vec![0u8; nb];
        let ss = onebit::server_sum_deferred(&split, err, due, &mut out);
        (host(out), ss)
    }
    fn onebit_unpack(
        &self,
        bits: &DBits,
        byte_at: usize,
        s: f32,
        out: &mut DVec,
        range: Range<usize>,
        add: bool,
    ) {
        let b = &bits.mem::<Vec<u8>>()[byte_at..];
        let o = &mut out.mem_mut::<Vec<f32>>()[range];
        if add {
            onebit::unpack_accumulate(b, s, o);
        } else {
            onebit::unpack_scaled(b, s, o);
        }
    }
    fn onebit_settled_sum_sq(&self, e: &DVec, due: f32) -> f64 {
        onebit::settled_sum_sq(e.mem::<Vec<f32>>(), due)
    }
}
