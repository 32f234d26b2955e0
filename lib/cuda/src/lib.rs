//! gradkit-cuda: the device a tool's selection and compression run on (`--device cpu|cuda[:N]`),
//! the probe for the CUDA libraries, the kernels for a device, and an NCCL `Comm` (docs/GPU.md).
//!
//! Built without the `cuda` feature (the default), this crate needs nothing of CUDA: `cpu`
//! works and `cuda` is refused with a message that says how to rebuild. With the feature it
//! links cudarc with **dynamic loading**, so it still builds on a machine with no CUDA toolkit
//! and no driver; at run time [`probe`] checks that `libcuda` and `libnvrtc` can be loaded
//! *before* any cudarc call (cudarc panics when a library is absent) and turns every failure
//! into one [`DeviceError`] line.
//!
//! With the feature, [`kernels_for`] gives the CUDA implementation of
//! [`Kernels`]: the kernels of `kernels/gradkit.cu`,
//! compiled by NVRTC once per process for the GPU's own architecture (`nv`), driven by
//! [`exec`] (also run on the CPU by the emulation tests of `gradkit-cuda-emu`), and
//! [`check`] compares any implementation with the CPU one. `nccl` is a `Comm` over NCCL
//! (written, never run: no GPU where it was built). Not built yet (docs/GPU.md): device
//! buffers through the collectives.

use std::fmt;
use std::str::FromStr;

use gradkit_sparsify::kernels::{self, Kernels};

#[cfg(feature = "comm")]
pub mod backend;
pub mod check;
pub mod exec;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "cuda")]
pub mod nv;
pub mod resident;

/// Where selection and compression run: `--device cpu` (the default), `cuda` (= `cuda:0`) or
/// `cuda:N`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Device {
    /// The CPU reference kernels ([`gradkit_sparsify::kernels::cpu`]).
    #[default]
    Cpu,
    /// The CUDA GPU with this ordinal (as the driver numbers them, after
    /// `CUDA_VISIBLE_DEVICES`).
    Cuda(u32),
    /// The device seam's test device (`--device counting`, not listed in `--help`): host
    /// memory, the CPU kernels, every host ↔ device copy explicit and counted
    /// ([`gradkit_sparsify::resident::Counting`]; docs/GPU.md §3). Runs anywhere.
    Counting,
}

impl Device {
    /// The values `--device` takes, as help texts and error messages list them.
    pub const VALUES: &'static str = "cpu, cuda, cuda:N";

    /// `--device`'s value parser, every tool's (`value_parser = Device::parse_flag`): a typo is
    /// a usage error (exit 2) with [`FromStr`]'s message, which lists the values.
    pub fn parse_flag(s: &str) -> Result<Device, String> {
        s.parse()
    }

    /// True for [`Device::Cuda`].
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::Counting => f.write_str("counting"),
        }
    }
}

impl FromStr for Device {
    type Err = String;

    /// `cpu`, `cuda` (GPU 0) or `cuda:N`; anything else is an error that lists the values.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => return Ok(Device::Cpu),
            "counting" => return Ok(Device::Counting),
            "cuda" => return Ok(Device::Cuda(0)),
            _ => {}
        }
        if let Some(n) = s.strip_prefix("cuda:") {
            // Digits only: `u32::from_str` would also take a leading `+`.
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                if let Ok(n) = n.parse::<u32>() {
                    return Ok(Device::Cuda(n));
                }
            }
            return Err(format!(
                "`{s}` names no GPU: expected cuda:N with N a GPU ordinal (0, 1, …); the values are {}",
                Device::VALUES
            ));
        }
        Err(format!(
            "unknown device `{s}`: the values are {} (cuda is cuda:0)",
            Device::VALUES
        ))
    }
}

/// A CUDA library gradkit loads at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Library {
    /// The driver API, `libcuda.so` (installed with the NVIDIA driver).
    Driver,
    /// The run-time compiler for the kernels, `libnvrtc.so`.
    Nvrtc,
    /// The collectives, `libnccl.so`.
    Nccl,
}

/// Why a device cannot be used. Every message is one line, for `error: …`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceError {
    /// This build has no CUDA support (the `cuda` cargo feature is off).
    NotBuilt,
    /// A library cannot be loaded (not on the loader path, or not installed).
    Missing(Library),
    /// The driver failed, or a call into it did not work (for example a symbol missing from
    /// an older `libcuda`): the driver's or cudarc's own words.
    Driver(String),
    /// The driver works but sees no GPU.
    NoDevices,
    /// `cuda:N` past the GPUs the driver sees.
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// How many GPUs there are.
        count: usize,
    },
    /// A GPU is there but could not be opened, or the kernels not compiled or loaded on it
    /// (the device and the driver's or NVRTC's words).
    Open(String),
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::NotBuilt => f.write_str(
                "gradkit was built without the `cuda` feature: rebuild with `cargo build --release --features cuda`",
            ),
            DeviceError::Missing(Library::Driver) => f.write_str(
                "no CUDA driver found (libcuda.so): is this a GPU node? set LD_LIBRARY_PATH to the folder that holds libcuda.so.1 (see docs/GPU.md)",
            ),
            DeviceError::Missing(Library::Nvrtc) => f.write_str(
                "no NVRTC library found (libnvrtc.so): set LD_LIBRARY_PATH to the folder that holds it (the CUDA toolkit's lib64, or a Python package's nvidia/*/lib; see docs/GPU.md)",
            ),
            DeviceError::Missing(Library::Nccl) => f.write_str(
                "no NCCL library found (libnccl.so): set LD_LIBRARY_PATH to a folder that holds libnccl.so; pip's nvidia-nccl ships only libnccl.so.2, so add a symlink libnccl.so -> libnccl.so.2 there (see docs/GPU.md)",
            ),
            DeviceError::Driver(what) => {
                write!(f, "the CUDA driver could not be used: {}", one_line(what))
            }
            DeviceError::NoDevices => f.write_str(
                "the CUDA driver sees no GPU: check nvidia-smi and CUDA_VISIBLE_DEVICES",
            ),
            DeviceError::NoSuchDevice { ordinal, count } => {
                let range = match count {
                    0 => String::new(),
                    1 => " (cuda:0)".into(),
                    n => format!(" (cuda:0 to cuda:{})", n - 1),
                };
                write!(
                    f,
                    "no GPU cuda:{ordinal}: the CUDA driver sees {count} GPU{}{range}; check CUDA_VISIBLE_DEVICES",
                    if *count == 1 { "" } else { "s" }
                )
            }
            DeviceError::Open(what) => write!(
                f,
                "the CUDA kernels could not be loaded on {}: use --device cpu, or see docs/GPU.md",
                one_line(what)
            ),
        }
    }
}

impl std::error::Error for DeviceError {}

/// `s` on one line (a driver message or a panic's text may hold newlines).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What [`probe`] found: the GPUs the driver sees, by ordinal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The driver's CUDA version, as `cuDriverGetVersion` gives it (13000 for 13.0).
    pub driver_version: i32,
    /// Each GPU's name, index = ordinal.
    pub names: Vec<String>,
}

impl DeviceInfo {
    /// How many GPUs the driver sees.
    pub fn count(&self) -> usize {
        self.names.len()
    }
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CUDA driver {}.{}, {} GPU(s)",
            self.driver_version / 1000,
            self.driver_version % 1000 / 10,
            self.count()
        )?;
        for (i, n) in self.names.iter().enumerate() {
            write!(f, "{} cuda:{i} {n}", if i == 0 { ":" } else { "," })?;
        }
        Ok(())
    }
}

/// True when this build has CUDA support (the `cuda` cargo feature).
pub const fn built_with_cuda() -> bool {
    cfg!(feature = "cuda")
}

/// Looks for the CUDA driver and NVRTC, then asks the driver for its GPUs. The libraries'
/// presence is checked before any cudarc call, and a panic inside cudarc (a symbol missing
/// from an old driver, say) is caught, so this returns an error and never panics. The
/// outcome is computed once per process.
pub fn probe() -> Result<DeviceInfo, DeviceError> {
    #[cfg(feature = "cuda")]
    {
        static PROBE: std::sync::OnceLock<Result<DeviceInfo, DeviceError>> =
            std::sync::OnceLock::new();
        PROBE.get_or_init(imp::probe).clone()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(DeviceError::NotBuilt)
    }
}

/// Checks that NCCL can be loaded (the NCCL backend needs it; the kernels do not).
pub fn probe_nccl() -> Result<(), DeviceError> {
    #[cfg(feature = "cuda")]
    {
        imp::present(Library::Nccl)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(DeviceError::NotBuilt)
    }
}

/// The selection and compression kernels for `device`: the CPU reference for
/// [`Device::Cpu`]; for [`Device::Cuda`], the probe's error where CUDA is not usable,
/// [`DeviceError::NoSuchDevice`] past the GPUs, else the CUDA kernels on that GPU (opened,
/// compiled and loaded once per process; [`DeviceError::Open`] when that fails).
pub fn kernels_for(device: Device) -> Result<&'static dyn Kernels, DeviceError> {
    match device {
        Device::Cpu | Device::Counting => Ok(kernels::cpu()),
        Device::Cuda(ordinal) => {
            let info = probe()?;
            if ordinal as usize >= info.count() {
                return Err(DeviceError::NoSuchDevice {
                    ordinal,
                    count: info.count(),
                });
            }
            #[cfg(feature = "cuda")]
            {
                imp::gpu(ordinal, &info)
            }
            #[cfg(not(feature = "cuda"))]
            {
                unreachable!("probe() fails without the cuda feature")
            }
        }
    }
}

/// The device that keeps a step's tensors resident for `device` (`Params::resident`,
/// docs/GPU.md §7): `None` for [`Device::Cpu`] (host memory); for [`Device::Cuda`] the GPU's
/// [`resident::Resident`], one per process and GPU, opened as [`kernels_for`] opens it (the
/// same errors).
pub fn resident_for(
    device: Device,
) -> Result<Option<&'static dyn gradkit_sparsify::resident::DeviceKernels>, DeviceError> {
    match device {
        Device::Cpu => Ok(None),
        Device::Counting => Ok(Some(counting())),
        Device::Cuda(ordinal) => {
            kernels_for(device)?;
            #[cfg(feature = "cuda")]
            {
                use std::collections::HashMap;
                use std::sync::{Mutex, OnceLock};
                type R = &'static resident::Resident<nv::Nv>;
                static RESIDENT: OnceLock<Mutex<HashMap<u32, R>>> = OnceLock::new();
                let g = gpu(ordinal)?;
                let mut m = RESIDENT
                    .get_or_init(Default::default)
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let r: R = *m
                    .entry(ordinal)
                    .or_insert_with(|| Box::leak(Box::new(resident::Resident::new(g))));
                Ok(Some(
                    r as &'static dyn gradkit_sparsify::resident::DeviceKernels,
                ))
            }
            #[cfg(not(feature = "cuda"))]
            {
                let _ = ordinal;
                unreachable!("kernels_for fails without the cuda feature")
            }
        }
    }
}

/// One line for a tool's summary: the host ↔ device copies this process made on `device`'s
/// resident tensors (`None` for the CPU).
pub fn transfer_note(tool: &str, device: Device) -> Option<String> {
    let d = resident_for(device).ok()??;
    let t = d.transfers();
    Some(format!(
        "{tool}: device {device}: {} uploads ({} bytes), {} downloads ({} bytes)",
        t.uploads, t.upload_bytes, t.downloads, t.download_bytes
    ))
}

/// The process's one counting device ([`Device::Counting`]).
pub fn counting() -> &'static gradkit_sparsify::resident::Counting {
    static C: std::sync::OnceLock<gradkit_sparsify::resident::Counting> =
        std::sync::OnceLock::new();
    C.get_or_init(Default::default)
}

/// The CUDA kernels on GPU `ordinal` as their concrete type (device-resident calls, the
/// extras: moments, fp16), opened as [`kernels_for`] opens them.
#[cfg(feature = "cuda")]
pub fn gpu(ordinal: u32) -> Result<&'static exec::Gpu<nv::Nv>, DeviceError> {
    let info = probe()?;
    if ordinal as usize >= info.count() {
        return Err(DeviceError::NoSuchDevice {
            ordinal,
            count: info.count(),
        });
    }
    imp::open(ordinal, &info)
}

#[cfg(feature = "cuda")]
mod imp {
    //! The probe proper: presence checks first, then the driver calls under a panic guard.

    use super::{DeviceError, DeviceInfo, Library};
    use cudarc::driver::{result, sys};

    /// Whether `lib` can be loaded, by cudarc's own search (the names it will try later).
    pub fn present(lib: Library) -> Result<(), DeviceError> {
        // SAFETY: these only try `dlopen` on cudarc's candidate names and close the handle.
        let found = unsafe {
            match lib {
                Library::Driver => cudarc::driver::sys::is_culib_present(),
                Library::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                Library::Nccl => cudarc::nccl::sys::is_culib_present(),
            }
        };
        if found {
            Ok(())
        } else {
            Err(DeviceError::Missing(lib))
        }
    }

    /// The CUDA kernels on GPU `ordinal` as a trait object.
    pub fn gpu(
        ordinal: u32,
        info: &DeviceInfo,
    ) -> Result<&'static dyn gradkit_sparsify::kernels::Kernels, DeviceError> {
        open(ordinal, info).map(|g| g as &'static dyn gradkit_sparsify::kernels::Kernels)
    }

    /// The CUDA kernels on GPU `ordinal`, opened once per process (the outcome, success or
    /// error, is kept).
    pub fn open(
        ordinal: u32,
        info: &DeviceInfo,
    ) -> Result<&'static crate::exec::Gpu<crate::nv::Nv>, DeviceError> {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        type Opened = Result<&'static crate::exec::Gpu<crate::nv::Nv>, DeviceError>;
        static GPUS: OnceLock<Mutex<HashMap<u32, Opened>>> = OnceLock::new();
        let mut gpus = GPUS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let name = info.names[ordinal as usize].clone();
        let version = info.driver_version;
        let got = gpus
            .entry(ordinal)
            .or_insert_with(|| {
                let label = format!("cuda:{ordinal} ({name})");
                match guarded(|| crate::nv::Nv::open(ordinal, &name, version)) {
                    Ok(Ok(nv)) => Ok(&*Box::leak(Box::new(crate::exec::Gpu::new(nv)))),
                    Ok(Err(e)) => Err(DeviceError::Open(format!("{label}: {e}"))),
                    Err(DeviceError::Driver(e)) => Err(DeviceError::Open(format!("{label}: {e}"))),
                    Err(e) => Err(e),
                }
            })
            .clone();
        got
    }

    pub fn probe() -> Result<DeviceInfo, DeviceError> {
        present(Library::Driver)?;
        present(Library::Nvrtc)?;
        guarded(query)?
    }

    fn driver(e: result::DriverError) -> DeviceError {
        if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE {
            DeviceError::NoDevices
        } else {
            DeviceError::Driver(format!("{e}"))
        }
    }

    fn query() -> Result<DeviceInfo, DeviceError> {
        result::init().map_err(driver)?;
        let mut version = 0i32;
        // SAFETY: `cuDriverGetVersion` writes one int through a valid pointer.
        unsafe { sys::cuDriverGetVersion(&mut version).result() }.map_err(driver)?;
        let count = result::device::get_count().map_err(driver)?;
        if count <= 0 {
            return Err(DeviceError::NoDevices);
        }
        let names = (0..count)
            .map(|i| {
                let dev = result::device::get(i).map_err(driver)?;
                result::device::get_name(dev).map_err(driver)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DeviceInfo {
            driver_version: version,
            names,
        })
    }

    /// Runs `f`, turning a panic (cudarc panics on a missing symbol) into
    /// [`DeviceError::Driver`]. The panic hook is silenced meanwhile, so nothing but the
    /// caller's one line reaches stderr.
    fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, DeviceError> {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        std::panic::set_hook(hook);
        outcome.map_err(|payload| {
            let what = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic in cudarc".into());
            DeviceError::Driver(what)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_parses_and_prints() {
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:0".parse::<Device>(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:7".parse::<Device>(), Ok(Device::Cuda(7)));
        assert_eq!(Device::default(), Device::Cpu);
        for d in [Device::Cpu, Device::Cuda(0), Device::Cuda(3)] {
            assert_eq!(d.to_string().parse::<Device>(), Ok(d));
        }
        assert!(Device::Cuda(1).is_cuda() && !Device::Cpu.is_cuda());
    }

    #[test]
    fn bad_devices_are_refused_listing_the_values() {
        for bad in [
            "gpu", "CPU", "cuda:", "cuda:-1", "cuda:+1", "cuda:x", "cuda0", " cpu", "",
        ] {
            let e = bad.parse::<Device>().unwrap_err();
            assert!(e.contains(Device::VALUES), "{bad:?}: {e}");
            assert!(e.contains(&format!("`{bad}`")), "{bad:?}: {e}");
        }
        assert!("cuda:99999999999".parse::<Device>().is_err());
    }

    #[test]
    fn cpu_kernels_are_the_reference() {
        let k = kernels_for(Device::Cpu).unwrap();
        assert_eq!(k.name(), kernels::cpu().name());
        // The same object as every other caller's default.
        assert!(std::ptr::addr_eq(k, kernels::cpu()));
    }

    #[test]
    fn every_message_is_one_line() {
        let all = [
            DeviceError::NotBuilt,
            DeviceError::Missing(Library::Driver),
            DeviceError::Missing(Library::Nvrtc),
            DeviceError::Missing(Library::Nccl),
            DeviceError::Driver("Missing symbol cuInit:\n  undefined".into()),
            DeviceError::NoDevices,
            DeviceError::NoSuchDevice {
                ordinal: 2,
                count: 1,
            },
            DeviceError::Open("cuda:0 (X): NVRTC could not compile\nline 2".into()),
        ];
        for e in all {
            let m = e.to_string();
            assert!(!m.contains('\n') && !m.is_empty(), "{m:?}");
        }
        assert!(DeviceError::Missing(Library::Driver)
            .to_string()
            .starts_with("no CUDA driver found (libcuda.so)"));
        assert!(DeviceError::Missing(Library::Nccl)
            .to_string()
            .starts_with("no NCCL library found (libnccl.so)"));
    }

    /// Without the feature, `cuda` is refused with the rebuild hint — never a panic.
    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_the_feature_cuda_says_to_rebuild() {
        assert!(!built_with_cuda());
        assert_eq!(probe(), Err(DeviceError::NotBuilt));
        assert_eq!(probe_nccl(), Err(DeviceError::NotBuilt));
        let e = kernels_for(Device::Cuda(0)).unwrap_err();
        assert_eq!(e, DeviceError::NotBuilt);
        assert!(e.to_string().contains("--features cuda"), "{e}");
    }
}
