//! The cudarc backend of [`crate::exec`]: the kernels compiled by NVRTC once per process, to
//! a CUBIN for the device's own `sm_XY` (a PTX for `compute_XY` only when NVRTC cannot emit
//! that CUBIN and is not newer than the driver, which could not JIT a newer PTX), launched
//! on the legacy default stream with the driver API. Built with the `cuda` feature; it cannot
//! run without a GPU, so the emulation tests check the host sequence and the NVRTC test the
//! compilation.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use crate::exec::{Arg, Backend, KERNEL_NAMES, SOURCE};

/// NVRTC's options for the kernels: no FMA contraction (the CPU rounds `a*b + c` twice, and
/// the bit-identical results depend on it), and the architecture.
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--fmad=false".into(),
        "--std=c++17".into(),
    ]
}

/// NVRTC's version as (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints through valid pointers.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| format!("nvrtcVersion: {e:?}"))?;
    Ok((major, minor))
}

/// What NVRTC made of [`SOURCE`].
#[derive(Clone, Debug)]
pub enum Image {
    /// A CUBIN for a real `sm_XY`.
    Cubin(Vec<u8>),
    /// PTX text (NUL-terminated for `cuModuleLoadData`).
    Ptx(Vec<u8>),
}

/// Compiles [`SOURCE`] for `arch` (`sm_90`: a CUBIN; `compute_90`: PTX). Errors carry
/// NVRTC's log.
pub fn compile(arch: &str) -> Result<Image, String> {
    let src = CString::new(SOURCE).expect("no NUL in the source");
    let name = CString::new("gradkit.cu").expect("no NUL");
    let prog = nvrtc::create_program(&src, Some(&name)).map_err(|e| format!("NVRTC: {e:?}"))?;
    // SAFETY: `prog` is a live program until destroyed below; the buffers are sized by
    // NVRTC's own size queries.
    unsafe {
        let out = (|| {
            if let Err(e) = nvrtc::compile_program(prog, &nvrtc_options(arch)) {
                let log = nvrtc::get_program_log(prog)
                    .map(|l| {
                        let b: Vec<u8> = l.iter().map(|&c| c as u8).collect();
                        String::from_utf8_lossy(&b)
                            .trim_end_matches('\0')
                            .to_string()
                    })
                    .unwrap_or_default();
                return Err(format!(
                    "NVRTC could not compile the kernels for {arch}: {e:?}: {log}"
                ));
            }
            if arch.starts_with("sm_") {
                let mut size = 0usize;
                nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(|e| format!("nvrtcGetCUBINSize: {e:?}"))?;
                let mut cubin = vec![0u8; size];
                nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                    .result()
                    .map_err(|e| format!("nvrtcGetCUBIN: {e:?}"))?;
                Ok(Image::Cubin(cubin))
            } else {
                let ptx = nvrtc::get_ptx(prog).map_err(|e| format!("nvrtcGetPTX: {e:?}"))?;
                let mut b: Vec<u8> = ptx.iter().map(|&c| c as u8).collect();
                if b.last() != Some(&0) {
                    b.push(0);
                }
                Ok(Image::Ptx(b))
            }
        })();
        let _ = nvrtc::destroy_program(prog);
        out
    }
}

/// One GPU with the kernels loaded.
#[derive(Debug)]
pub struct Nv {
    ctx: Arc<CudaContext>,
    label: String,
    funcs: HashMap<&'static str, Func>,
}

/// A `CUfunction` handle (a driver pointer, valid in the context from any thread).
#[derive(Clone, Copy, Debug)]
struct Func(sys::CUfunction);

// SAFETY: driver handles may be used from any thread once their context is current, which
// every call below makes it first (`bind_to_thread`).
unsafe impl Send for Func {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Func {}

fn drv(e: result::DriverError) -> String {
    format!("{e}")
}

impl Nv {
    /// Opens GPU `ordinal` and compiles and loads the kernels for it.
    pub fn open(ordinal: u32, name: &str, driver_version: i32) -> Result<Self, String> {
        let ctx = CudaContext::new(ordinal as usize).map_err(drv)?;
        ctx.bind_to_thread().map_err(drv)?;
        let (major, minor) = ctx.compute_capability().map_err(drv)?;
        let image = match compile(&format!("sm_{major}{minor}")) {
            Ok(img) => img,
            Err(cubin_err) => {
                // PTX only when the driver can JIT it: an NVRTC newer than the driver emits a
                // PTX version the driver rejects.
                let (vmaj, vmin) = nvrtc_version()?;
                if vmaj * 1000 + vmin * 10 > driver_version {
                    return Err(cubin_err);
                }
                compile(&format!("compute_{major}{minor}"))?
            }
        };
        let bytes = match &image {
            Image::Cubin(b) | Image::Ptx(b) => b,
        };
        // SAFETY: the image is a complete CUBIN or NUL-terminated PTX from NVRTC; the module
        // stays loaded for the process (the kernels are a process-wide singleton).
        let module = unsafe { result::module::load_data(bytes.as_ptr().cast()) }.map_err(drv)?;
        let mut funcs = HashMap::new();
        for k in KERNEL_NAMES {
            let f = unsafe { result::module::get_function(module, CString::new(k).expect("name")) }
                .map_err(|e| format!("kernel {k}: {e}"))?;
            funcs.insert(k, Func(f));
        }
        Ok(Nv {
            ctx,
            label: format!("cuda:{ordinal} {name} (sm_{major}{minor})"),
            funcs,
        })
    }

    fn bind(&self) -> Result<(), String> {
        self.ctx.bind_to_thread().map_err(drv)
    }
}

impl Backend for Nv {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn alloc(&self, bytes: usize) -> Result<u64, String> {
        self.bind()?;
        // SAFETY: a fresh allocation of `bytes`, zeroed before use.
        unsafe {
            let p = result::malloc_sync(bytes).map_err(drv)?;
            result::memset_d8_sync(p, 0, bytes).map_err(drv)?;
            Ok(p)
        }
    }

    fn free(&self, ptr: u64) {
        if self.bind().is_ok() {
            // SAFETY: `ptr` came from `alloc` and is freed once (DevBuf's drop).
            let _ = unsafe { result::free_sync(ptr) };
        }
    }

    fn upload(&self, dst: u64, src: &[u8]) -> Result<(), String> {
        self.bind()?;
        // SAFETY: `dst` holds at least `src.len()` bytes (DevBuf checks).
        unsafe { result::memcpy_htod_sync(dst, src) }.map_err(drv)
    }

    fn download(&self, src: u64, dst: &mut [u8]) -> Result<(), String> {
        self.bind()?;
        // SAFETY: `src` holds at least `dst.len()` bytes; the legacy default stream orders
        // this copy after every kernel launched before it.
        unsafe { result::memcpy_dtoh_sync(dst, src) }.map_err(drv)
    }

    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), String> {
        self.bind()?;
        // SAFETY: both are live allocations of at least `bytes` bytes (Gpu::copy checks).
        unsafe { result::memcpy_dtod_sync(dst, src, bytes) }.map_err(drv)
    }

    fn sync(&self) -> Result<(), String> {
        self.bind()?;
        result::ctx::synchronize().map_err(drv)
    }

    fn launch(
        &self,
        kernel: &'static str,
        grid: u32,
        block: u32,
        args: &[Arg],
    ) -> Result<(), String> {
        self.bind()?;
        let f = self
            .funcs
            .get(kernel)
            .ok_or_else(|| format!("no kernel {kernel}"))?;
        let mut slots: Vec<u64> = args.iter().map(|a| a.slot()).collect();
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| (s as *mut u64).cast::<c_void>())
            .collect();
        // SAFETY: the arguments match the kernel's parameters in number and size (exec.rs
        // passes them as the source declares them: pointers 8 bytes, u32/f32 4 bytes read
        // from the low end of a little-endian slot); the slots outlive the call, which copies
        // them.
        unsafe {
            result::launch_kernel(
                f.0,
                (grid, 1, 1),
                (block, 1, 1),
                0,
                std::ptr::null_mut(),
                &mut params,
            )
        }
        .map_err(|e| format!("launching {kernel}: {e}"))
    }
}
