//! Test-only: the CUDA kernels of `lib/cuda/kernels/gradkit.cu`, compiled by the host C++
//! compiler under `src/emu.h` (the threads of a block as OS threads, `__syncthreads` as a
//! barrier, atomics through `std::atomic_ref`), behind gradkit-cuda's [`Backend`]. So
//! [`gradkit_cuda::exec::Gpu`] — the very host code that drives a real GPU — runs here on the
//! CPU, and the tests compare it with the CPU `Kernels`. Device memory is host memory with
//! guard words on both sides, checked when a buffer is freed ([`Emu::overruns`]).
//!
//! [`Variant`]s other than `Plain` are the same source with one planted bug each; the tests
//! assert that the checks catch every one.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use gradkit_cuda::exec::{Arg, Backend, Gpu};

type Entry = unsafe extern "C" fn(*const c_char, u32, u32, *mut *mut c_void) -> c_int;

extern "C" {
    fn gk_emu_launch(name: *const c_char, grid: u32, block: u32, p: *mut *mut c_void) -> c_int;
    fn gk_emu_launch_threads(
        name: *const c_char,
        grid: u32,
        block: u32,
        p: *mut *mut c_void,
    ) -> c_int;
    fn gk_emu_launch_plant_compact(
        name: *const c_char,
        grid: u32,
        block: u32,
        p: *mut *mut c_void,
    ) -> c_int;
    fn gk_emu_launch_plant_sign(
        name: *const c_char,
        grid: u32,
        block: u32,
        p: *mut *mut c_void,
    ) -> c_int;
    fn gk_emu_launch_plant_threshold(
        name: *const c_char,
        grid: u32,
        block: u32,
        p: *mut *mut c_void,
    ) -> c_int;
}

/// Which build of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The source as it is (the threads of a block as fibers).
    Plain,
    /// The source as it is, the threads of a block as OS threads (`GK_EMU_THREADS`).
    PlainThreads,
    /// The compaction stops one element short of the end (`GRADKIT_PLANT_COMPACT_OFF_BY_ONE`).
    CompactOffByOne,
    /// The 1-bit sign test `c > 0` instead of `c ≥ 0` (`GRADKIT_PLANT_SIGN_GT_FOR_GE`).
    SignGtForGe,
    /// Threshold selection `|x| ≥ th` instead of `|x| > th`
    /// (`GRADKIT_PLANT_THRESHOLD_GE_FOR_GT`).
    ThresholdGeForGt,
}

impl Variant {
    /// Every planted bug.
    pub const PLANTED: [Variant; 3] = [
        Variant::CompactOffByOne,
        Variant::SignGtForGe,
        Variant::ThresholdGeForGt,
    ];

    fn entry(self) -> Entry {
        match self {
            Variant::Plain => gk_emu_launch,
            Variant::PlainThreads => gk_emu_launch_threads,
            Variant::CompactOffByOne => gk_emu_launch_plant_compact,
            Variant::SignGtForGe => gk_emu_launch_plant_sign,
            Variant::ThresholdGeForGt => gk_emu_launch_plant_threshold,
        }
    }
}

/// Guard words on each side of an allocation.
const GUARD: usize = 2;
const PATTERN: u64 = 0xdead_beef_cafe_f00d;

/// The emulated device.
#[derive(Debug)]
pub struct Emu {
    variant: Variant,
    /// Live allocations by device address: the words, guards included.
    mem: Mutex<HashMap<u64, Vec<u64>>>,
    overruns: AtomicUsize,
    launches: AtomicUsize,
}

impl Emu {
    /// A device running `variant`.
    pub fn new(variant: Variant) -> Self {
        Emu {
            variant,
            mem: Mutex::new(HashMap::new()),
            overruns: AtomicUsize::new(0),
            launches: AtomicUsize::new(0),
        }
    }

    /// Buffers whose guard words were overwritten (checked as each is freed).
    pub fn overruns(&self) -> usize {
        self.overruns.load(Ordering::Relaxed)
    }

    /// Buffers not freed yet.
    pub fn live(&self) -> usize {
        self.mem.lock().unwrap().len()
    }

    /// Kernel launches so far.
    pub fn launches(&self) -> usize {
        self.launches.load(Ordering::Relaxed)
    }
}

/// The emulated GPU kernels of `variant`.
pub fn gpu(variant: Variant) -> Gpu<Emu> {
    Gpu::new(Emu::new(variant))
}

impl Backend for Emu {
    fn name(&self) -> String {
        format!("emulation ({:?})", self.variant)
    }

    /// Few blocks: each costs a round of every thread here, and three still make every
    /// grid-stride loop stride.
    fn max_grid(&self) -> u32 {
        3
    }

    fn alloc(&self, bytes: usize) -> Result<u64, String> {
        let words = bytes.div_ceil(8);
        let mut v = vec![0u64; words + 2 * GUARD];
        v[..GUARD].fill(PATTERN);
        v[GUARD + words..].fill(PATTERN);
        // The tail of the last word past `bytes` is not guarded (at most 7 bytes).
        let ptr = v[GUARD..].as_mut_ptr() as u64;
        self.mem.lock().unwrap().insert(ptr, v);
        Ok(ptr)
    }

    fn free(&self, ptr: u64) {
        if let Some(v) = self.mem.lock().unwrap().remove(&ptr) {
            let words = v.len() - 2 * GUARD;
            if v[..GUARD]
                .iter()
                .chain(&v[GUARD + words..])
                .any(|&w| w != PATTERN)
            {
                self.overruns.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn upload(&self, dst: u64, src: &[u8]) -> Result<(), String> {
        // SAFETY: `dst` is a live allocation of at least `src.len()` bytes (DevBuf checks the
        // size), and it does not overlap `src`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    fn download(&self, src: u64, dst: &mut [u8]) -> Result<(), String> {
        // SAFETY: as `upload`, the other way.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn launch(
        &self,
        kernel: &'static str,
        grid: u32,
        block: u32,
        args: &[Arg],
    ) -> Result<(), String> {
        self.launches.fetch_add(1, Ordering::Relaxed);
        let mut slots: Vec<u64> = args.iter().map(|a| a.slot()).collect();
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| (s as *mut u64).cast::<c_void>())
            .collect();
        let name = CString::new(kernel).expect("a kernel name");
        // SAFETY: the kernel reads its parameters from the slots as the source declares them
        // (exec.rs passes them in that order and size), and the pointers among them are live
        // allocations of this device.
        let rc = unsafe { (self.variant.entry())(name.as_ptr(), grid, block, params.as_mut_ptr()) };
        match rc {
            0 => Ok(()),
            1 => Err(format!("no kernel {kernel}")),
            2 => Err(format!(
                "{kernel}: block size {block} is not the kernels' GK_BLOCK"
            )),
            r => Err(format!("{kernel}: emulator error {r}")),
        }
    }
}
