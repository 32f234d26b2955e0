//! The device seam on a GPU: [`DeviceKernels`] over [`Gpu`], the tensors held as
//! [`DevBuf`]s between calls (docs/GPU.md §7). Written once over the [`Backend`], so the
//! emulation tests of `gradkit-cuda-emu` run it on the CPU and compare it with the counting
//! host device.
//!
//! Equal to the CPU bit for bit: every selection, count, gather and zeroing (the kernels of
//! `Kernels`, plus `gk_add` and `gk_zero_at`, element-wise), and the 1-bit signs, errors and
//! decompressed values given the same scale. Not bit for bit: the f64 sums (`add_squared`,
//! `sum_squares`, `range_norms`, `zero_at`'s sum, `mean_std`, the 1-bit scale and server
//! Σz², `onebit_settled_sum_sq`) are reduced in a fixed tree, not the CPU's lanes: they feed
//! metrics (the residual norm), DEFT's k allocation, Gaussiank's fit and the 1-bit scales
//! (within an ulp, `check::check_onebit`), where a last-bit difference can move a threshold
//! (docs/GPU.md §2 bounds them).

use std::ops::Range;

use gradkit_sparsify::resident::{Counters, DBits, DIdx, DTensor, DVec, DeviceKernels, Transfers};

use crate::exec::{Arg, Backend, DevBuf, Gpu, Select};

/// The device-resident kernels on one GPU (or the emulator).
#[derive(Debug)]
pub struct Resident<B: Backend + 'static> {
    gpu: &'static Gpu<B>,
    counters: Counters,
}

impl<B: Backend + 'static> Resident<B> {
    pub fn new(gpu: &'static Gpu<B>) -> Self {
        Resident {
            gpu,
            counters: Counters::default(),
        }
    }
}

type Mem = DevBuf<'static>;

fn wrap<T>(len: usize, b: Mem) -> DTensor<T> {
    DTensor::new(len, Box::new(b))
}

fn buf<T>(t: &DTensor<T>) -> &Mem {
    t.mem::<Mem>()
}

fn n32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or_else(|_| panic!("CUDA kernels: {n} elements exceed 2^32 − 1"))
}

impl<B: Backend + 'static> DeviceKernels for Resident<B> {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn transfers(&self) -> Transfers {
        self.counters.get()
    }
    fn zeros(&self, n: usize) -> DVec {
        wrap(n, self.gpu.alloc(4 * n))
    }
    fn upload_f32(&self, x: &[f32]) -> DVec {
        self.counters.upload(4 * x.len());
        wrap(x.len(), self.gpu.upload(x))
    }
    fn upload_u32(&self, x: &[u32]) -> DIdx {
        self.counters.upload(4 * x.len());
        wrap(x.len(), self.gpu.upload(x))
    }
    fn download_f32(&self, x: &DVec) -> Vec<f32> {
        self.counters.download(4 * x.len());
        buf(x).read(x.len())
    }
    fn download_u32(&self, x: &DIdx) -> Vec<u32> {
        self.counters.download(4 * x.len());
        buf(x).read(x.len())
    }
    fn upload_u8(&self, x: &[u8]) -> DBits {
        self.counters.upload(x.len());
        wrap(x.len(), self.gpu.upload(x))
    }
    fn download_u8(&self, x: &DBits) -> Vec<u8> {
        self.counters.download(x.len());
        buf(x).read(x.len())
    }
    fn add_squared(&self, acc: &mut DVec, g: &DVec) -> f64 {
        assert_eq!(acc.len(), g.len(), "add_squared lengths");
        let n = n32(acc.len());
        let (a, b) = (buf(acc), buf(g));
        self.gpu.launch(
            "gk_add",
            self.gpu.grid(acc.len()),
            &[Arg::Ptr(a.ptr()), Arg::Ptr(b.ptr()), Arg::U32(n)],
        );
        self.gpu.sum_squares(a, n)
    }
    fn sum_squares(&self, x: &DVec) -> f64 {
        self.gpu.sum_squares(buf(x), n32(x.len()))
    }
    fn range_norms(&self, x: &DVec, ranges: &[Range<usize>]) -> Vec<f64> {
        let b = buf(x);
        ranges
            .iter()
            .map(|r| {
                let v = b.view(4 * r.start, 4 * r.len());
                self.gpu.sum_squares(&v, n32(r.len())).sqrt()
            })
            .collect()
    }
    fn zero_at(&self, x: &mut DVec, idx: &DIdx) -> f64 {
        if idx.is_empty() {
            return 0.0;
        }
        let m = n32(idx.len());
        let left = self.gather(x, idx);
        let sq = self.gpu.sum_squares(buf(&left), m);
        self.gpu.launch(
            "gk_zero_at",
            self.gpu.grid(idx.len()),
            &[
                Arg::Ptr(buf(x).ptr()),
                Arg::Ptr(buf(idx).ptr()),
                Arg::U32(m),
            ],
        );
        sq
    }
    fn topk(&self, x: &DVec, range: Range<usize>, k: usize) -> (DIdx, DVec, Option<f32>) {
        assert!(range.end <= x.len(), "topk range past the tensor");
        let v = buf(x).view(4 * range.start, 4 * range.len());
        let n = n32(range.len());
        let k = n32(k.min(range.len()));
        let s = self.gpu.select(&v, n, Select::Top(k), true);
        let c = s.count as usize;
        (
            wrap(c, s.idx),
            wrap(c, s.val),
            s.kth_key.map(f32::from_bits),
        )
    }
    fn select_above(&self, x: &DVec, th: f32) -> (DIdx, DVec) {
        let s = self
            .gpu
            .select(buf(x), n32(x.len()), Select::Above(th), true);
        let c = s.count as usize;
        (wrap(c, s.idx), wrap(c, s.val))
    }
    fn count_above(&self, x: &DVec, th: f32) -> u64 {
        u64::from(self.gpu.count_above(buf(x), n32(x.len()), th))
    }
    fn kth_largest_magnitude(&self, x: &DVec, k: usize) -> f32 {
        assert!(
            k >= 1 && k <= x.len(),
            "kth_largest_abs: k = {k} not in 1..={}",
            x.len()
        );
        let st = self.gpu.kth_key(buf(x), n32(x.len()), k as u32);
        f32::from_bits(st.read::<u32>(1)[0])
    }
    fn mean_std(&self, x: &DVec) -> (f64, f64) {
        self.gpu.mean_std_resident(buf(x), n32(x.len()))
    }
    fn gather(&self, x: &DVec, idx: &DIdx) -> DVec {
        let m = idx.len();
        let out = self.gpu.alloc(4 * m);
        if m > 0 {
            self.gpu.launch(
                "gk_gather",
                self.gpu.grid(m),
                &[
                    Arg::Ptr(buf(x).ptr()),
                    Arg::Ptr(buf(idx).ptr()),
                    Arg::U32(n32(m)),
                    Arg::Ptr(out.ptr()),
                ],
            );
        }
        wrap(m, out)
    }
    fn onebit_compress_deferred(&self, x: &DVec, e: &mut DVec, due: f32) -> (DBits, f32) {
        assert!(
            e.len().is_multiple_of(8) && x.len() <= e.len(),
            "1-bit lengths {} and {}",
            x.len(),
            e.len()
        );
        let nb = e.len() / 8;
        let bits = self.gpu.alloc(nb);
        let s = self
            .gpu
            .onebit_deferred((buf(x), n32(x.len())), buf(e), &bits, n32(nb), due);
        (wrap(nb, bits), s)
    }
    fn onebit_server_deferred(
        &self,
        msgs: &DBits,
        scales: &[f32],
        err: &mut DVec,
        due: f32,
    ) -> (DBits, f64) {
        assert!(
            err.len().is_multiple_of(8),
            "1-bit server chunks are whole bytes"
        );
        let nb = err.len() / 8;
        assert_eq!(msgs.len(), scales.len() * nb, "1-bit server messages");
        let out = self.gpu.alloc(nb);
        let ss = self
            .gpu
            .onebit_server(buf(msgs), scales, buf(err), (&out, n32(nb)), due);
        (wrap(nb, out), ss)
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
        assert!(
            range.end <= out.len() && 8 * (byte_at + range.len().div_ceil(8)) <= 8 * bits.len(),
            "1-bit unpack past a tensor"
        );
        let b = buf(bits).view(byte_at, range.len().div_ceil(8));
        let o = buf(out).view(4 * range.start, 4 * range.len());
        self.gpu.onebit_unpack(&b, s, &o, n32(range.len()), add);
    }
    fn onebit_settled_sum_sq(&self, e: &DVec, due: f32) -> f64 {
        assert!(
            e.len().is_multiple_of(8),
            "1-bit error buffers are whole bytes"
        );
        let n = e.len();
        if n == 0 {
            return 0.0;
        }
        // Settled in a copy (the pack kernel with the owed scale; its bits are discarded).
        let (tmp, scratch) = (self.gpu.alloc(4 * n), self.gpu.alloc(n / 8));
        self.gpu.copy(&tmp, buf(e), 4 * n);
        self.gpu.launch(
            "gk_onebit_pack",
            self.gpu.grid(n / 8),
            &[
                Arg::Ptr(tmp.ptr()),
                Arg::U32(n32(n / 8)),
                Arg::Ptr(scratch.ptr()),
                Arg::F32(due),
            ],
        );
        self.gpu.sum_squares(&tmp, n32(n))
    }
}
