//! The selection and compression kernels behind one interface (docs/ALGORITHMS.md).
//!
//! [`Kernels`] names every per-element kernel the papers' exchanges are built from: exact
//! top-k by magnitude and the exact k-th largest magnitude (Ok-Topk §3.1.3
//! `th_re_evaluate`), threshold selection (Ok-Topk §3.1.3 reuse steps, DEFT Table 1 hard
//! threshold), gather and scatter-add (the COO ↔ dense moves of every sparse allreduce,
//! Ok-Topk Table 1), and DeepSpeed's 1-bit compressor with error feedback and its
//! decompression (onebit-lamb.md §2). [`Cpu`] is the reference implementation: it delegates to
//! the free functions of [`crate::topk`], [`crate::threshold`] and [`crate::onebit`], so every
//! caller gets bit-identical results whichever way it calls them. Another implementation (a
//! GPU one) must reproduce the semantics documented on each method; the provided methods have
//! default bodies built from the required ones, which an implementation may replace with a
//! fused kernel.
//!
//! Buffers are host slices (`&[f32]`); nothing here is device-specific.
//!
//! ```
//! use gradkit_sparsify::kernels::{cpu, Kernels};
//! let k = cpu();
//! let x = [0.5f32, -3.0, 0.0, 2.0];
//! assert_eq!(k.topk_by_magnitude(&x, 2), vec![1, 3]);
//! assert_eq!(k.select_above(&x, 0.5), vec![1, 3]);
//! let mut dense = [0f32; 4];
//! k.scatter_add(&mut dense, &[1, 3], &k.gather(&x, &[1, 3]));
//! assert_eq!(dense, [0.0, -3.0, 0.0, 2.0]);
//! ```

use std::fmt;

use crate::{onebit, threshold, topk};

/// The selection/compression kernels. Every method is a pure function of its arguments (no
/// state across calls); results must not depend on thread count or vector width.
///
/// **Magnitude order** (top-k, k-th largest): magnitudes are compared through the IEEE bit
/// pattern with the sign cleared (`bits & 0x7fff_ffff`), which orders every non-NaN `|x|`
/// exactly, makes `−0` and `+0` equal, and puts any NaN above `+inf` (a NaN is selected
/// before every number).
pub trait Kernels: Send + Sync + fmt::Debug {
    /// A short name for logs and metrics (`"cpu"`).
    fn name(&self) -> &'static str;

    /// Exact top-k by magnitude (Alistarh et al. 2018; Ok-Topk §3.1.3): exactly
    /// `min(k, x.len())` indices, **ascending**, such that every selected magnitude is ≥
    /// every unselected one in the magnitude order above; among equal magnitudes the lower
    /// indices are taken. `k = 0` or `x` empty gives an empty vector; `k ≥ x.len()` gives
    /// every index. Zeros are ordinary values (selected when k exceeds the non-zeros).
    fn topk_by_magnitude(&self, x: &[f32], k: usize) -> Vec<u32>;

    /// The k-th largest magnitude `|x|` in the magnitude order above (Ok-Topk's exact
    /// threshold, `th_re_evaluate`), returned with its sign bit cleared (`+0.0` for a zero
    /// or −0; a NaN when at least k entries are NaN).
    ///
    /// # Panics
    /// If `k == 0` or `k > x.len()`.
    fn kth_largest_magnitude(&self, x: &[f32], k: usize) -> f32;

    /// Threshold selection (Ok-Topk §3.1.3, as the authors' code: **strict**): every index
    /// with `|x_i| > th`, ascending, as a float comparison. Hence a NaN never passes, `±0`
    /// pass only a negative threshold, and an entry equal in magnitude to `th` does not pass.
    fn select_above(&self, x: &[f32], th: f32) -> Vec<u32>;

    /// Gather: `x[idx[j]]` for every j, in the order of `idx` (bit-exact copies, NaN and −0
    /// included).
    ///
    /// # Panics
    /// If an index is `≥ x.len()`.
    fn gather(&self, x: &[f32], idx: &[u32]) -> Vec<f32>;

    /// Scatter-add (dense += sparse, the sum of every COO exchange): `dense[idx[j]] +=
    /// values[j]` for j in order, so repeated indices accumulate in list order. `idx` need
    /// not be sorted.
    ///
    /// # Panics
    /// If `idx.len() != values.len()` or an index is `≥ dense.len()`.
    fn scatter_add(&self, dense: &mut [f32], idx: &[u32], values: &[f32]);

    /// DeepSpeed's 1-bit compressor with error feedback, fused (onebit-lamb.md §2, worker
    /// side): with `c = x + e` (entries of `e` past `x.len()`, the padding, get `+ 0.0`),
    /// writes the sign bits of `c` MSB-first into `bits` (bit 1 where `c ≥ 0`, so `±0` count
    /// as +1 and a NaN as −1), sets `e ← c − s·sign(c)` and returns the scale
    /// `s = ‖c‖₂/√len(e)` (RMS of c, its sum of squares accumulated in f64 in eight fixed
    /// lanes, see [`crate::onebit::sum_sq`]; 0 for an empty buffer). Hence
    /// `s·sign(c) + e_new == c` up to one f32 rounding per element.
    ///
    /// # Panics
    /// Unless `e.len()` is a multiple of 8, `x.len() ≤ e.len()` and `bits.len() == e.len()/8`.
    fn onebit_compress_with_feedback(&self, x: &[f32], e: &mut [f32], bits: &mut [u8]) -> f32;

    /// The second half of the compressor for a scale computed elsewhere (the server stage of
    /// onebit-lamb.md §2): sign bits of `buf` MSB-first into `bits` (1 where `buf ≥ 0`) and
    /// `buf ← buf − s·sign(buf)`, for `buf.len() == 8·bits.len()` (with other lengths, the
    /// first `min(buf.len()/8, bits.len())` groups of eight).
    fn onebit_pack_with_feedback(&self, buf: &mut [f32], bits: &mut [u8], s: f32);

    /// 1-bit decompression: `out[i] = s·(2·bit_i − 1)` for the MSB-first bits, i.e. `s` where
    /// the bit is 1 and exactly `−s` (sign bit flipped) where it is 0. `out.len() ≤
    /// 8·bits.len()`; a partial last byte uses its leading bits.
    fn onebit_decompress(&self, bits: &[u8], s: f32, out: &mut [f32]);

    /// 1-bit decompress-and-accumulate (the server's and the naive variant's weighted sum):
    /// `acc[i] += s·(2·bit_i − 1)`, same bit convention and lengths as
    /// [`Kernels::onebit_decompress`].
    fn onebit_decompress_add(&self, bits: &[u8], s: f32, acc: &mut [f32]);

    /// [`Kernels::onebit_compress_with_feedback`] in one pass, the error kept unsettled
    /// between calls (docs/MEMORY.md, [`crate::onebit::compress_deferred`]): `e` holds last call's
    /// `c'`, whose feedback `− due·sign(c')` is applied while reading it (`due = 0.0`: a
    /// settled error); leaves `c` in `e` and returns its scale, the next call's `due`.
    fn onebit_compress_deferred(&self, x: &[f32], e: &mut [f32], bits: &mut [u8], due: f32) -> f32 {
        onebit::compress_deferred(x, e, bits, due)
    }

    /// The server's sum and sign pack in one pass, the error unsettled as above
    /// ([`crate::onebit::server_sum_deferred`]); returns Σz².
    fn onebit_server_deferred(
        &self,
        msgs: &[(Vec<u8>, f32)],
        err: &mut [f32],
        due: f32,
        out: &mut [u8],
    ) -> f64 {
        onebit::server_sum_deferred(msgs, err, due, out)
    }

    /// [`Kernels::topk_by_magnitude`] with the selected values `x[i]` and the k-th largest
    /// magnitude (`None` when `min(k, x.len()) == 0`).
    fn topk_with_values(&self, x: &[f32], k: usize) -> (Vec<u32>, Vec<f32>, Option<f32>) {
        let k = k.min(x.len());
        if k == 0 {
            return (Vec::new(), Vec::new(), None);
        }
        let idx = self.topk_by_magnitude(x, k);
        let val = self.gather(x, &idx);
        (idx, val, Some(self.kth_largest_magnitude(x, k)))
    }

    /// [`Kernels::select_above`] with the selected values `x[i]`.
    fn select_above_with_values(&self, x: &[f32], th: f32) -> (Vec<u32>, Vec<f32>) {
        let idx = self.select_above(x, th);
        let val = self.gather(x, &idx);
        (idx, val)
    }
}

/// The reference implementation on the host: the free functions of this crate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cpu;

/// The one [`Cpu`] instance, for callers that hold `&'static dyn Kernels`.
pub static CPU: Cpu = Cpu;

/// The CPU kernels as a trait object (the default of every caller).
pub fn cpu() -> &'static dyn Kernels {
    &CPU
}

impl Kernels for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn topk_by_magnitude(&self, x: &[f32], k: usize) -> Vec<u32> {
        topk::topk_indices(x, k)
    }

    fn kth_largest_magnitude(&self, x: &[f32], k: usize) -> f32 {
        topk::kth_largest_abs(x, k)
    }

    fn select_above(&self, x: &[f32], th: f32) -> Vec<u32> {
        threshold::above(x, th)
    }

    fn gather(&self, x: &[f32], idx: &[u32]) -> Vec<f32> {
        idx.iter().map(|&i| x[i as usize]).collect()
    }

    fn scatter_add(&self, dense: &mut [f32], idx: &[u32], values: &[f32]) {
        assert_eq!(
            idx.len(),
            values.len(),
            "scatter_add: {} indices but {} values",
            idx.len(),
            values.len()
        );
        for (&i, &v) in idx.iter().zip(values) {
            dense[i as usize] += v;
        }
    }

    fn onebit_compress_with_feedback(&self, x: &[f32], e: &mut [f32], bits: &mut [u8]) -> f32 {
        onebit::compress_with_feedback(x, e, bits)
    }

    fn onebit_pack_with_feedback(&self, buf: &mut [f32], bits: &mut [u8], s: f32) {
        onebit::pack_and_feedback(buf, bits, s)
    }

    fn onebit_decompress(&self, bits: &[u8], s: f32, out: &mut [f32]) {
        onebit::unpack_scaled(bits, s, out)
    }

    fn onebit_decompress_add(&self, bits: &[u8], s: f32, acc: &mut [f32]) {
        onebit::unpack_accumulate(bits, s, acc)
    }

    fn topk_with_values(&self, x: &[f32], k: usize) -> (Vec<u32>, Vec<f32>, Option<f32>) {
        topk::topk_with_values(x, k)
    }

    fn select_above_with_values(&self, x: &[f32], th: f32) -> (Vec<u32>, Vec<f32>) {
        threshold::above_with_values(x, th)
    }
}
