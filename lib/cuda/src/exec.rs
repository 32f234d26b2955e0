//! The host side of the CUDA kernels (`kernels/gradkit.cu`): which kernels run, in what
//! order, on what buffers — written once, over a small [`Backend`] (allocate, copy, launch).
//! The cudarc backend runs it on a GPU (`nv`, feature `cuda`); the emulation backend of the
//! test crate `gradkit-cuda-emu` runs the very same sequence on the CPU, with the `.cu`
//! source compiled by the host C++ compiler, so this file is checked in `make test` although
//! no GPU is there.
//!
//! Two layers:
//! * **device-resident** ([`Gpu::select`], [`Gpu::kth_key`], …): inputs and outputs are
//!   [`DevBuf`]s, nothing crosses to the host but a count or a scalar;
//! * **[`Kernels`] over host slices**: upload, the device calls, download — what the
//!   collectives call today (the trait takes host slices; docs/GPU.md says what moving the
//!   seam to device buffers would take).
//!
//! Equal to the CPU `Kernels` bit for bit: every selection (indices, values, the k-th
//! magnitude), the 1-bit signs and packing, decompression, gather, the fp16 wire. Not bit for
//! bit, and why: the f64 sums (Gaussiank's moments, the 1-bit scale) are reduced in a fixed
//! tree, not the CPU's eight sequential lanes (the scale agrees to within 1 ulp of f32 in the
//! tests; the error written with it is then exactly `c − s·sign(c)` for that scale);
//! scatter-add with *repeated* indices adds them in an unspecified order (atomics).

use std::fmt;

use gradkit_sparsify::kernels::Kernels;

/// The kernels' source, compiled by NVRTC at run time (and by the host compiler in the
/// emulation tests).
pub const SOURCE: &str = include_str!("../kernels/gradkit.cu");

/// Threads per block (`GK_BLOCK` in the source).
pub const BLOCK: u32 = 256;
/// Elements per block of the ordered (tiled) kernels (`GK_TILE` = `GK_BLOCK * GK_ITEMS`).
pub const TILE: u32 = 2048;
/// Most blocks of a grid-stride launch.
const MAX_GRID: u32 = 4096;

/// Every `extern "C"` kernel of [`SOURCE`].
pub const KERNEL_NAMES: [&str; 21] = [
    "gk_count",
    "gk_scan",
    "gk_compact",
    "gk_radix_hist",
    "gk_radix_pick",
    "gk_moments_part",
    "gk_moments_final",
    "gk_sumsq_sum",
    "gk_scale_final",
    "gk_onebit_compress",
    "gk_onebit_deferred",
    "gk_onebit_server",
    "gk_sum_final",
    "gk_onebit_pack",
    "gk_onebit_unpack",
    "gk_gather",
    "gk_scatter_add",
    "gk_to_f16",
    "gk_from_f16",
    "gk_add",
    "gk_zero_at",
];

/// One kernel argument, passed by value as `cuLaunchKernel` takes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A device pointer (0: null).
    Ptr(u64),
    /// `unsigned int`.
    U32(u32),
    /// `float`.
    F32(f32),
}

impl Arg {
    /// The argument's bytes in an 8-byte slot (little-endian, the low bytes used).
    pub fn slot(self) -> u64 {
        match self {
            Arg::Ptr(p) => p,
            Arg::U32(v) => u64::from(v),
            Arg::F32(v) => u64::from(v.to_bits()),
        }
    }
}

/// What the kernels need of a device. Pointers are device addresses (`CUdeviceptr`); every
/// call is ordered after the previous ones (one stream) and copies are synchronous.
pub trait Backend: Send + Sync + fmt::Debug {
    /// A short name for logs (`"cuda:0 NVIDIA H100"`, `"emulation"`).
    fn name(&self) -> String;
    /// `bytes` of zeroed device memory (`bytes > 0`).
    fn alloc(&self, bytes: usize) -> Result<u64, String>;
    /// Frees what [`Backend::alloc`] gave.
    fn free(&self, ptr: u64);
    /// Host → device.
    fn upload(&self, dst: u64, src: &[u8]) -> Result<(), String>;
    /// Device → host (waits for the kernels before it).
    fn download(&self, src: u64, dst: &mut [u8]) -> Result<(), String>;
    /// The most blocks of a grid-stride launch (the kernels are correct for any grid; a GPU
    /// wants enough blocks to fill its SMs, an emulator as few as still exercise the stride).
    fn max_grid(&self) -> u32 {
        MAX_GRID
    }
    /// Device → device, `bytes` bytes (the bandwidth the benches compare with). The default
    /// goes through the host.
    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), String> {
        let mut tmp = vec![0u8; bytes];
        self.download(src, &mut tmp)?;
        self.upload(dst, &tmp)
    }
    /// Waits for everything launched so far.
    fn sync(&self) -> Result<(), String> {
        Ok(())
    }
    /// Runs `kernel` on `grid` blocks of `block` threads.
    fn launch(
        &self,
        kernel: &'static str,
        grid: u32,
        block: u32,
        args: &[Arg],
    ) -> Result<(), String>;
}

/// Device memory, freed on drop. A zero-length buffer holds the null pointer.
#[derive(Debug)]
pub struct DevBuf<'a> {
    be: &'a dyn Backend,
    ptr: u64,
    bytes: usize,
}

impl DevBuf<'_> {
    /// The device address (for [`Arg::Ptr`]).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// The size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    /// Device → host, the first `dst.len()` bytes.
    pub fn read_into(&self, dst: &mut [u8]) {
        assert!(dst.len() <= self.bytes, "read past a device buffer");
        if !dst.is_empty() {
            ok(self.be.download(self.ptr, dst));
        }
    }
    /// The first `n` elements as `T` (plain numbers only).
    pub fn read<T: Pod>(&self, n: usize) -> Vec<T> {
        let mut v = vec![T::ZERO; n];
        self.read_into(T::as_bytes_mut(&mut v));
        v
    }
    /// `bytes` bytes from `offset` as a buffer of their own, not freed on drop (a range of
    /// a resident tensor).
    pub fn view(&self, offset: usize, bytes: usize) -> std::mem::ManuallyDrop<DevBuf<'_>> {
        assert!(offset + bytes <= self.bytes, "a view past a device buffer");
        std::mem::ManuallyDrop::new(DevBuf {
            be: self.be,
            ptr: if bytes == 0 {
                0
            } else {
                self.ptr + offset as u64
            },
            bytes,
        })
    }
    /// Host → device at the start of the buffer.
    pub fn write<T: Pod>(&self, src: &[T]) {
        let b = T::as_bytes(src);
        assert!(b.len() <= self.bytes, "write past a device buffer");
        if !b.is_empty() {
            ok(self.be.upload(self.ptr, b));
        }
    }
}

impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        if self.ptr != 0 {
            self.be.free(self.ptr);
        }
    }
}

/// Plain numbers that can be copied to and from the device as bytes.
pub trait Pod: Copy {
    /// Zero.
    const ZERO: Self;
    /// The bytes of a slice.
    fn as_bytes(s: &[Self]) -> &[u8];
    /// The bytes of a slice, writable.
    fn as_bytes_mut(s: &mut [Self]) -> &mut [u8];
}

macro_rules! pod {
    ($($t:ty),*) => {$(
        impl Pod for $t {
            const ZERO: Self = 0 as $t;
            fn as_bytes(s: &[Self]) -> &[u8] {
                // SAFETY: a plain number type has no padding and every byte is initialised.
                unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), std::mem::size_of_val(s)) }
            }
            fn as_bytes_mut(s: &mut [Self]) -> &mut [u8] {
                // SAFETY: as above, and every bit pattern is a valid value of the type.
                unsafe {
                    std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), std::mem::size_of_val(s))
                }
            }
        }
    )*};
}
pod!(u8, u16, u32, f32, f64);

/// A backend error after the device was opened: the `Kernels` methods cannot return it, so
/// it ends the call with the device's own words.
fn ok<T>(r: Result<T, String>) -> T {
    r.unwrap_or_else(|e| panic!("CUDA kernels: {e}"))
}

/// What [`Gpu::select`] keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Select {
    /// Every index with `|x| > th` (strict, a float compare).
    Above(f32),
    /// Exact top-k by magnitude, ties to the lower index (`1 ≤ k ≤ n`).
    Top(u32),
}

/// A selection on the device: ascending indices and their values, `count` of each.
#[derive(Debug)]
pub struct Selection<'a> {
    /// The selected indices.
    pub idx: DevBuf<'a>,
    /// Their values (empty unless asked for).
    pub val: DevBuf<'a>,
    /// How many were selected.
    pub count: u32,
    /// For [`Select::Top`], the k-th largest magnitude's bits (`bits & 0x7fff_ffff`).
    pub kth_key: Option<u32>,
}

/// The CUDA kernels over a [`Backend`].
#[derive(Debug)]
pub struct Gpu<B: Backend> {
    be: B,
}

fn blocks(n: usize, per: u32) -> u32 {
    n.div_ceil(per as usize) as u32
}

fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or_else(|_| panic!("CUDA kernels: {n} elements exceed 2^32 − 1"))
}

impl<B: Backend> Gpu<B> {
    /// The kernels on `be`.
    pub fn new(be: B) -> Self {
        Gpu { be }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.be
    }

    /// The backend's name (the GPU, its architecture).
    pub fn backend_name(&self) -> String {
        self.be.name()
    }

    /// `bytes` of zeroed device memory.
    pub fn alloc(&self, bytes: usize) -> DevBuf<'_> {
        let ptr = if bytes == 0 {
            0
        } else {
            ok(self.be.alloc(bytes))
        };
        DevBuf {
            be: &self.be,
            ptr,
            bytes,
        }
    }

    /// A device copy of `src`.
    pub fn upload<T: Pod>(&self, src: &[T]) -> DevBuf<'_> {
        let b = self.alloc(std::mem::size_of_val(src));
        b.write(src);
        b
    }

    pub(crate) fn launch(&self, kernel: &'static str, grid: u32, args: &[Arg]) {
        if grid > 0 {
            ok(self.be.launch(kernel, grid, BLOCK, args));
        }
    }

    /// Blocks of a grid-stride launch over `n` items.
    pub(crate) fn grid(&self, n: usize) -> u32 {
        blocks(n, BLOCK).clamp(1, self.be.max_grid().max(1))
    }

    /// The k-th largest key (`bits & 0x7fff_ffff`) of `x[..n]` by radix select, left on the
    /// device as the state `[key, rank among equal keys, k, 0]` that [`Gpu::select`] reads.
    /// `1 ≤ k ≤ n`.
    pub fn kth_key(&self, x: &DevBuf<'_>, n: u32, k: u32) -> DevBuf<'_> {
        assert!(k >= 1 && k <= n, "kth_key: k = {k} not in 1..={n}");
        let st = self.upload(&[0u32, k, k, 0]);
        let hist = self.alloc(256 * 4);
        let grid = self.grid(n as usize);
        for shift in [24u32, 16, 8, 0] {
            self.launch(
                "gk_radix_hist",
                grid,
                &[
                    Arg::Ptr(x.ptr()),
                    Arg::U32(n),
                    Arg::U32(shift),
                    Arg::Ptr(st.ptr()),
                    Arg::Ptr(hist.ptr()),
                ],
            );
            self.launch(
                "gk_radix_pick",
                1,
                &[Arg::U32(shift), Arg::Ptr(st.ptr()), Arg::Ptr(hist.ptr())],
            );
        }
        st
    }

    /// Ordered selection of `x[..n]`: count per tile, scan, compact. Values are written
    /// beside the indices when `values`.
    pub fn select(&self, x: &DevBuf<'_>, n: u32, how: Select, values: bool) -> Selection<'_> {
        let nothing = |kth_key| Selection {
            idx: self.alloc(0),
            val: self.alloc(0),
            count: 0,
            kth_key,
        };
        if n == 0 {
            return nothing(None);
        }
        let (mode, th, st) = match how {
            Select::Above(th) => (0u32, th, self.alloc(16)),
            Select::Top(0) => return nothing(None),
            Select::Top(k) => (1u32, 0.0, self.kth_key(x, n, k.min(n))),
        };
        let nb = blocks(n as usize, TILE);
        let counts = self.alloc(2 * nb as usize * 4);
        let totals = self.alloc(8);
        let common = [
            Arg::Ptr(x.ptr()),
            Arg::U32(n),
            Arg::U32(mode),
            Arg::F32(th),
            Arg::Ptr(st.ptr()),
            Arg::Ptr(counts.ptr()),
            Arg::U32(nb),
        ];
        self.launch("gk_count", nb, &common);
        self.launch(
            "gk_scan",
            1,
            &[Arg::Ptr(counts.ptr()), Arg::U32(nb), Arg::Ptr(totals.ptr())],
        );
        let (count, kth_key) = match how {
            Select::Above(_) => (totals.read::<u32>(1)[0], None),
            Select::Top(k) => (k.min(n), Some(st.read::<u32>(1)[0])),
        };
        let idx = self.alloc(count as usize * 4);
        let val = self.alloc(if values { count as usize * 4 } else { 0 });
        if count > 0 {
            let mut args = common.to_vec();
            args.extend([
                Arg::Ptr(totals.ptr()),
                Arg::Ptr(idx.ptr()),
                Arg::Ptr(val.ptr()),
            ]);
            self.launch("gk_compact", nb, &args);
        }
        Selection {
            idx,
            val,
            count,
            kth_key,
        }
    }

    /// `#{i < n : |x_i| > th}` (the count pass of [`Gpu::select`], no compaction).
    pub fn count_above(&self, x: &DevBuf<'_>, n: u32, th: f32) -> u32 {
        if n == 0 {
            return 0;
        }
        let st = self.alloc(16);
        let nb = blocks(n as usize, TILE);
        let counts = self.alloc(2 * nb as usize * 4);
        let totals = self.alloc(8);
        self.launch(
            "gk_count",
            nb,
            &[
                Arg::Ptr(x.ptr()),
                Arg::U32(n),
                Arg::U32(0),
                Arg::F32(th),
                Arg::Ptr(st.ptr()),
                Arg::Ptr(counts.ptr()),
                Arg::U32(nb),
            ],
        );
        self.launch(
            "gk_scan",
            1,
            &[Arg::Ptr(counts.ptr()), Arg::U32(nb), Arg::Ptr(totals.ptr())],
        );
        totals.read::<u32>(1)[0]
    }

    /// `Σ (x[i] + 0)²` over `x[..n]` in f64 (per-block partial sums, then one block).
    pub fn sum_squares(&self, x: &DevBuf<'_>, n: u32) -> f64 {
        if n == 0 {
            return 0.0;
        }
        let grid = self.grid(n as usize);
        let part = self.alloc(grid as usize * 8);
        let total = self.alloc(8);
        self.launch(
            "gk_sumsq_sum",
            grid,
            &[
                Arg::Ptr(0),
                Arg::U32(0),
                Arg::Ptr(x.ptr()),
                Arg::U32(n),
                Arg::Ptr(part.ptr()),
            ],
        );
        self.launch(
            "gk_sum_final",
            1,
            &[Arg::Ptr(part.ptr()), Arg::U32(grid), Arg::Ptr(total.ptr())],
        );
        total.read::<f64>(1)[0]
    }

    /// Gaussiank's mean and population standard deviation of `x` (f64; a fixed tree order,
    /// not the CPU's lanes: equal to `gaussiank::mean_std` up to rounding).
    pub fn mean_std(&self, x: &[f32]) -> (f64, f64) {
        self.mean_std_resident(&self.upload(x), len32(x.len()))
    }

    /// [`Gpu::mean_std`] of `xd[..n]` on the device.
    pub fn mean_std_resident(&self, xd: &DevBuf<'_>, n: u32) -> (f64, f64) {
        let grid = self.grid(n as usize);
        let part = self.alloc(2 * grid as usize * 8);
        let out = self.alloc(16);
        self.launch(
            "gk_moments_part",
            grid,
            &[Arg::Ptr(xd.ptr()), Arg::U32(n), Arg::Ptr(part.ptr())],
        );
        self.launch(
            "gk_moments_final",
            1,
            &[
                Arg::Ptr(part.ptr()),
                Arg::U32(grid),
                Arg::U32(n),
                Arg::Ptr(out.ptr()),
            ],
        );
        let v = out.read::<f64>(2);
        (v[0], v[1])
    }

    /// The fp16 wire: IEEE binary16 bits of every element, as `half::f16::from_f32`.
    pub fn to_f16(&self, x: &[f32]) -> Vec<u16> {
        let n = len32(x.len());
        let xd = self.upload(x);
        let out = self.alloc(2 * x.len());
        self.launch(
            "gk_to_f16",
            self.grid(x.len()),
            &[Arg::Ptr(xd.ptr()), Arg::U32(n), Arg::Ptr(out.ptr())],
        );
        out.read(x.len())
    }

    /// The fp16 wire back to f32, as `half::f16::to_f32`.
    pub fn from_f16(&self, h: &[u16]) -> Vec<f32> {
        let n = len32(h.len());
        let hd = self.upload(h);
        let out = self.alloc(4 * h.len());
        self.launch(
            "gk_from_f16",
            self.grid(h.len()),
            &[Arg::Ptr(hd.ptr()), Arg::U32(n), Arg::Ptr(out.ptr())],
        );
        out.read(h.len())
    }

    /// The RMS scale `√(Σ part / len)` from per-block partial sums, on the device.
    fn scale(&self, part: &DevBuf<'_>, np: u32, len: u32) -> DevBuf<'_> {
        let s = self.alloc(4);
        self.launch(
            "gk_scale_final",
            1,
            &[
                Arg::Ptr(part.ptr()),
                Arg::U32(np),
                Arg::U32(len),
                Arg::Ptr(s.ptr()),
            ],
        );
        s
    }

    /// DeepSpeed's worker compressor on device buffers: `x[..nx]`, the error `e[..ne]`
    /// (`ne` a multiple of 8, `nx ≤ ne`), the sign bits into `bits` (`ne/8` bytes); returns
    /// the scale, left on the device.
    pub fn onebit_compress(
        &self,
        x: &DevBuf<'_>,
        nx: u32,
        e: &DevBuf<'_>,
        ne: u32,
        bits: &DevBuf<'_>,
    ) -> DevBuf<'_> {
        assert!(
            ne.is_multiple_of(8) && nx <= ne,
            "1-bit lengths {nx} and {ne}"
        );
        let grid = self.grid(ne as usize);
        let part = self.alloc(grid as usize * 8);
        self.launch(
            "gk_sumsq_sum",
            grid,
            &[
                Arg::Ptr(x.ptr()),
                Arg::U32(nx),
                Arg::Ptr(e.ptr()),
                Arg::U32(ne),
                Arg::Ptr(part.ptr()),
            ],
        );
        let s = self.scale(&part, grid, ne);
        self.launch(
            "gk_onebit_compress",
            self.grid(ne as usize / 8),
            &[
                Arg::Ptr(x.ptr()),
                Arg::U32(nx),
                Arg::Ptr(e.ptr()),
                Arg::U32(ne / 8),
                Arg::Ptr(bits.ptr()),
                Arg::Ptr(s.ptr()),
            ],
        );
        s
    }

    /// Device → device copy of `bytes` bytes.
    pub fn copy(&self, dst: &DevBuf<'_>, src: &DevBuf<'_>, bytes: usize) {
        assert!(
            bytes <= dst.bytes() && bytes <= src.bytes(),
            "copy past a buffer"
        );
        if bytes > 0 {
            ok(self.be.copy(dst.ptr(), src.ptr(), bytes));
        }
    }

    /// Waits for the device.
    pub fn sync(&self) {
        ok(self.be.sync());
    }

    fn unpack(&self, bits: &[u8], s: f32, out: &mut [f32], add: bool) {
        assert!(
            out.len() <= 8 * bits.len(),
            "1-bit decompression: {} values from {} bytes",
            out.len(),
            bits.len()
        );
        if out.is_empty() {
            return;
        }
        let bd = self.upload(&bits[..out.len().div_ceil(8)]);
        let od = if add {
            self.upload(out)
        } else {
            self.alloc(4 * out.len())
        };
        self.onebit_unpack(&bd, s, &od, len32(out.len()), add);
        od.read_into(f32::as_bytes_mut(out));
    }

    /// 1-bit decompression on device buffers: `out[i] = ±s` (or `+= ±s` when `add`) from
    /// the MSB-first bits of `bits`, `i < n`.
    pub fn onebit_unpack(&self, bits: &DevBuf<'_>, s: f32, out: &DevBuf<'_>, n: u32, add: bool) {
        assert!(
            n as usize <= 8 * bits.bytes() && 4 * n as usize <= out.bytes(),
            "1-bit decompression of {n} values past a buffer"
        );
        if n == 0 {
            return;
        }
        self.launch(
            "gk_onebit_unpack",
            self.grid(n as usize),
            &[
                Arg::Ptr(bits.ptr()),
                Arg::F32(s),
                Arg::Ptr(out.ptr()),
                Arg::U32(n),
                Arg::U32(add as u32),
            ],
        );
    }

    /// The deferred worker compressor on device buffers (`onebit::compress_deferred`):
    /// `x[..nx]`, the error `e` (`8·nbytes` values, `nx ≤` that), the sign bits into `bits`
    /// (`nbytes`); returns the scale.
    pub fn onebit_deferred(
        &self,
        (x, nx): (&DevBuf<'_>, u32),
        e: &DevBuf<'_>,
        bits: &DevBuf<'_>,
        nbytes: u32,
        due: f32,
    ) -> f32 {
        let ne = nbytes as usize * 8;
        assert!(
            nx as usize <= ne && 4 * ne <= e.bytes() && nbytes as usize <= bits.bytes(),
            "1-bit lengths {nx} and {ne}"
        );
        if nbytes == 0 {
            return 0.0;
        }
        let grid = self.grid(nbytes as usize);
        let part = self.alloc(grid as usize * 8);
        self.launch(
            "gk_onebit_deferred",
            grid,
            &[
                Arg::Ptr(x.ptr()),
                Arg::U32(nx),
                Arg::Ptr(e.ptr()),
                Arg::U32(nbytes),
                Arg::Ptr(bits.ptr()),
                Arg::F32(due),
                Arg::Ptr(part.ptr()),
            ],
        );
        self.scale(&part, grid, len32(ne)).read::<f32>(1)[0]
    }

    /// The deferred server stage on device buffers (`onebit::server_sum_deferred`):
    /// `scales.len()` messages of `nbytes` bytes side by side in `msgs`, the error `err`
    /// (`8·nbytes` values), the sign bits of z into `out`; returns Σz².
    pub fn onebit_server(
        &self,
        msgs: &DevBuf<'_>,
        scales: &[f32],
        err: &DevBuf<'_>,
        (out, nbytes): (&DevBuf<'_>, u32),
        due: f32,
    ) -> f64 {
        let nb = nbytes as usize;
        assert!(
            msgs.bytes() >= scales.len() * nb && err.bytes() >= 32 * nb && out.bytes() >= nb,
            "1-bit server buffers"
        );
        if nbytes == 0 {
            return 0.0;
        }
        let sd = self.upload(scales);
        let grid = self.grid(nb);
        let part = self.alloc(grid as usize * 8);
        let total = self.alloc(8);
        self.launch(
            "gk_onebit_server",
            grid,
            &[
                Arg::Ptr(msgs.ptr()),
                Arg::U32(nbytes),
                Arg::Ptr(sd.ptr()),
                Arg::U32(len32(scales.len())),
                Arg::Ptr(err.ptr()),
                Arg::U32(nbytes),
                Arg::Ptr(out.ptr()),
                Arg::F32(due),
                Arg::Ptr(part.ptr()),
            ],
        );
        self.launch(
            "gk_sum_final",
            1,
            &[Arg::Ptr(part.ptr()), Arg::U32(grid), Arg::Ptr(total.ptr())],
        );
        total.read::<f64>(1)[0]
    }
}

/// The length contract of the worker compressors (as `onebit::compress_with_feedback`).
fn check_onebit(x: &[f32], e: &[f32], bits: &[u8]) {
    assert_eq!(
        e.len() % 8,
        0,
        "1-bit buffers are padded to a multiple of 8"
    );
    assert!(x.len() <= e.len());
    assert_eq!(bits.len(), e.len() / 8);
}

fn check_indices(idx: &[u32], len: usize, what: &str) {
    if let Some(&i) = idx.iter().find(|&&i| i as usize >= len) {
        panic!("{what}: index {i} out of range for length {len}");
    }
}

impl<B: Backend> Kernels for Gpu<B> {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn topk_by_magnitude(&self, x: &[f32], k: usize) -> Vec<u32> {
        let n = len32(x.len());
        let k = k.min(x.len()) as u32;
        let xd = self.upload(x);
        let s = self.select(&xd, n, Select::Top(k), false);
        s.idx.read(s.count as usize)
    }

    fn kth_largest_magnitude(&self, x: &[f32], k: usize) -> f32 {
        assert!(
            k >= 1 && k <= x.len(),
            "kth_largest_abs: k = {k} not in 1..={}",
            x.len()
        );
        let xd = self.upload(x);
        let st = self.kth_key(&xd, len32(x.len()), k as u32);
        f32::from_bits(st.read::<u32>(1)[0])
    }

    fn select_above(&self, x: &[f32], th: f32) -> Vec<u32> {
        let xd = self.upload(x);
        let s = self.select(&xd, len32(x.len()), Select::Above(th), false);
        s.idx.read(s.count as usize)
    }

    fn gather(&self, x: &[f32], idx: &[u32]) -> Vec<f32> {
        check_indices(idx, x.len(), "gather");
        if idx.is_empty() {
            return Vec::new();
        }
        let m = len32(idx.len());
        let (xd, id) = (self.upload(x), self.upload(idx));
        let out = self.alloc(4 * idx.len());
        self.launch(
            "gk_gather",
            self.grid(idx.len()),
            &[
                Arg::Ptr(xd.ptr()),
                Arg::Ptr(id.ptr()),
                Arg::U32(m),
                Arg::Ptr(out.ptr()),
            ],
        );
        out.read(idx.len())
    }

    fn scatter_add(&self, dense: &mut [f32], idx: &[u32], values: &[f32]) {
        assert_eq!(
            idx.len(),
            values.len(),
            "scatter_add: {} indices but {} values",
            idx.len(),
            values.len()
        );
        check_indices(idx, dense.len(), "scatter_add");
        if idx.is_empty() {
            return;
        }
        let dd = self.upload(dense);
        let (id, vd) = (self.upload(idx), self.upload(values));
        self.launch(
            "gk_scatter_add",
            self.grid(idx.len()),
            &[
                Arg::Ptr(dd.ptr()),
                Arg::Ptr(id.ptr()),
                Arg::Ptr(vd.ptr()),
                Arg::U32(len32(idx.len())),
            ],
        );
        dd.read_into(f32::as_bytes_mut(dense));
    }

    fn onebit_compress_with_feedback(&self, x: &[f32], e: &mut [f32], bits: &mut [u8]) -> f32 {
        check_onebit(x, e, bits);
        if e.is_empty() {
            return 0.0;
        }
        let (xd, ed) = (self.upload(x), self.upload(e));
        let bd = self.alloc(bits.len());
        let s = self.onebit_compress(&xd, len32(x.len()), &ed, len32(e.len()), &bd);
        ed.read_into(f32::as_bytes_mut(e));
        bd.read_into(bits);
        s.read::<f32>(1)[0]
    }

    fn onebit_pack_with_feedback(&self, buf: &mut [f32], bits: &mut [u8], s: f32) {
        let nbytes = (buf.len() / 8).min(bits.len());
        if nbytes == 0 {
            return;
        }
        let body = &mut buf[..8 * nbytes];
        let bd = self.upload(&*body);
        let od = self.alloc(nbytes);
        self.launch(
            "gk_onebit_pack",
            self.grid(nbytes),
            &[
                Arg::Ptr(bd.ptr()),
                Arg::U32(len32(nbytes)),
                Arg::Ptr(od.ptr()),
                Arg::F32(s),
            ],
        );
        bd.read_into(f32::as_bytes_mut(body));
        od.read_into(&mut bits[..nbytes]);
    }

    fn onebit_decompress(&self, bits: &[u8], s: f32, out: &mut [f32]) {
        self.unpack(bits, s, out, false)
    }

    fn onebit_decompress_add(&self, bits: &[u8], s: f32, acc: &mut [f32]) {
        self.unpack(bits, s, acc, true)
    }

    fn onebit_compress_deferred(&self, x: &[f32], e: &mut [f32], bits: &mut [u8], due: f32) -> f32 {
        check_onebit(x, e, bits);
        if e.is_empty() {
            return 0.0;
        }
        let (xd, ed) = (self.upload(x), self.upload(e));
        let bd = self.alloc(bits.len());
        let s = self.onebit_deferred((&xd, len32(x.len())), &ed, &bd, len32(bits.len()), due);
        ed.read_into(f32::as_bytes_mut(e));
        bd.read_into(bits);
        s
    }

    fn onebit_server_deferred(
        &self,
        msgs: &[(Vec<u8>, f32)],
        err: &mut [f32],
        due: f32,
        out: &mut [u8],
    ) -> f64 {
        assert_eq!(err.len() % 8, 0, "1-bit server chunks are whole bytes");
        assert_eq!(out.len(), err.len() / 8, "1-bit server output bytes");
        for (b, _) in msgs {
            assert!(b.len() * 8 >= err.len(), "1-bit server message too short");
        }
        if err.is_empty() {
            return 0.0;
        }
        let nbytes = out.len();
        // The messages side by side, each cut to the bytes the server reads.
        let mut all = Vec::with_capacity(msgs.len() * nbytes);
        for (b, _) in msgs {
            all.extend_from_slice(&b[..nbytes]);
        }
        let scales: Vec<f32> = msgs.iter().map(|(_, s)| *s).collect();
        let (md, ed) = (self.upload(&all), self.upload(&*err));
        let od = self.alloc(nbytes);
        let ss = self.onebit_server(&md, &scales, &ed, (&od, len32(nbytes)), due);
        ed.read_into(f32::as_bytes_mut(err));
        od.read_into(out);
        ss
    }

    fn topk_with_values(&self, x: &[f32], k: usize) -> (Vec<u32>, Vec<f32>, Option<f32>) {
        let n = len32(x.len());
        let k = k.min(x.len()) as u32;
        if k == 0 {
            return (Vec::new(), Vec::new(), None);
        }
        let xd = self.upload(x);
        let s = self.select(&xd, n, Select::Top(k), true);
        (
            s.idx.read(s.count as usize),
            s.val.read(s.count as usize),
            s.kth_key.map(f32::from_bits),
        )
    }

    fn select_above_with_values(&self, x: &[f32], th: f32) -> (Vec<u32>, Vec<f32>) {
        let xd = self.upload(x);
        let s = self.select(&xd, len32(x.len()), Select::Above(th), true);
        (s.idx.read(s.count as usize), s.val.read(s.count as usize))
    }
}
