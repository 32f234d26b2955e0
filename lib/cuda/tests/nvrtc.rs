//! Every kernel compiles (docs/GPU.md, "What is verified here"): the source that the CUDA
//! `Kernels` compile at run time, through the same code (`nv::compile`: cudarc's NVRTC with
//! dynamic loading, the same options), for compute_80 and compute_90, then assembled by
//! `ptxas -arch=sm_80|sm_90 -v`, failing on any error or register spill; and the CUBIN path
//! (`nvrtcGetCUBIN`) that a GPU node takes. No GPU and no driver needed.
//!
//! NVRTC and ptxas come from the CUDA 13.0 Python wheels (`nvidia-cuda-nvrtc==13.0.*`,
//! `nvidia-cuda-nvcc==13.0.*`) that `make deps` installs into `.venv` (or the folder named by
//! `GRADKIT_CUDA_WHEELS`, holding `lib/libnvrtc.so.13` and `bin/ptxas`). Without them the
//! test prints SKIPPED and passes — unless `GRADKIT_REQUIRE_NVRTC=1`, as `make test` sets
//! after installing them, where their absence fails it.

#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::process::Command;

use gradkit_cuda::exec::KERNEL_NAMES;
use gradkit_cuda::nv::{self, Image};

/// Says SKIPPED on the real stderr: the test harness captures `eprintln!` of a passing test,
/// not a direct write.
fn skipped(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED: {what} ***\n");
}

/// The wheels' `nvidia/cu13` folder, if installed.
fn wheels() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GRADKIT_CUDA_WHEELS") {
        return Some(PathBuf::from(p));
    }
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/lib");
    std::fs::read_dir(lib)
        .ok()?
        .flatten()
        .map(|d| d.path().join("site-packages/nvidia/cu13"))
        .find(|p| p.join("lib/libnvrtc.so.13").is_file() && p.join("bin/ptxas").is_file())
}

/// Loads the wheel's NVRTC by full path (and its builtins first), so that cudarc's `dlopen`
/// of the bare name `libnvrtc.so.13` finds the loaded library by its soname.
fn load_nvrtc(dir: &Path) {
    for name in ["libnvrtc-builtins.so.13.0", "libnvrtc.so.13"] {
        let p = dir.join("lib").join(name);
        // SAFETY: loading NVIDIA's library runs only its initialisers; the handle is leaked
        // so the library stays loaded for the process.
        let lib = unsafe {
            libloading::os::unix::Library::open(
                Some(&p),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
            )
        }
        .unwrap_or_else(|e| panic!("loading {}: {e}", p.display()));
        std::mem::forget(lib);
    }
    // SAFETY: only tries dlopen on cudarc's candidate names.
    assert!(
        unsafe { cudarc::nvrtc::sys::is_culib_present() },
        "cudarc does not find the NVRTC loaded from {}",
        dir.display()
    );
}

/// `ptxas -v` on `ptx` for `arch`: its report, or the failure.
fn ptxas(dir: &Path, ptx: &[u8], arch: &str) -> String {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let src = tmp.path().join("gradkit.ptx");
    let text = ptx.strip_suffix(&[0]).unwrap_or(ptx);
    std::fs::write(&src, text).expect("write the PTX");
    let out = Command::new(dir.join("bin/ptxas"))
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(&src)
        .arg("-o")
        .arg(tmp.path().join("gradkit.cubin"))
        .output()
        .expect("run ptxas");
    let report =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ptxas -arch={arch} failed ({}): {report}",
        out.status
    );
    report
}

#[test]
fn every_kernel_compiles_for_sm80_and_sm90_without_spills() {
    let Some(dir) = wheels() else {
        if std::env::var_os("GRADKIT_REQUIRE_NVRTC").is_some_and(|v| v == "1") {
            panic!("GRADKIT_REQUIRE_NVRTC=1 but the CUDA 13.0 wheels are not in .venv (make deps installs them) and GRADKIT_CUDA_WHEELS is not set");
        }
        skipped("NVRTC/ptxas compile check: no CUDA 13.0 wheels in .venv (run make deps, or set GRADKIT_CUDA_WHEELS)");
        return;
    };
    load_nvrtc(&dir);
    let (major, minor) = nv::nvrtc_version().expect("nvrtcVersion");
    assert_eq!(
        major, 13,
        "the wheels' NVRTC is {major}.{minor}, expected 13.0"
    );
    for (cc, sm) in [("compute_80", "sm_80"), ("compute_90", "sm_90")] {
        let Image::Ptx(ptx) = nv::compile(cc).unwrap_or_else(|e| panic!("{e}")) else {
            panic!("{cc} gave no PTX")
        };
        let text = String::from_utf8_lossy(&ptx);
        for k in KERNEL_NAMES {
            assert!(
                text.contains(&format!(".entry {k}(")),
                "{cc}: no kernel {k} in the PTX"
            );
        }
        let report = ptxas(&dir, &ptx, sm);
        let mut rows = Vec::new();
        let mut current = String::new();
        for line in report.lines() {
            if let Some(rest) = line.split("Compiling entry function '").nth(1) {
                current = rest.split('\'').next().unwrap_or("").to_string();
            }
            if line.contains("spill stores") {
                assert!(
                    line.contains(" 0 bytes spill stores, 0 bytes spill loads"),
                    "{sm}: {current} spills registers: {line}"
                );
            }
            if let Some(r) = line.split("Used ").nth(1) {
                rows.push(format!("{current}: {}", r.trim()));
            }
        }
        for k in KERNEL_NAMES {
            assert!(
                report.contains(&format!("'{k}' for '{sm}'")),
                "{sm}: ptxas did not assemble {k}: {report}"
            );
        }
        eprintln!(
            "ptxas -arch={sm}: {} kernels, no spills\n  {}",
            KERNEL_NAMES.len(),
            rows.join("\n  ")
        );
        // The CUBIN a GPU node builds for its own architecture.
        let Image::Cubin(cubin) = nv::compile(sm).unwrap_or_else(|e| panic!("{e}")) else {
            panic!("{sm} gave no CUBIN")
        };
        assert_eq!(&cubin[..4], b"\x7fELF", "{sm}: the CUBIN is an ELF image");
    }
}

/// A kernel that does not compile is an error carrying NVRTC's log, not a panic (what a
/// GPU node would print if the source and the NVRTC disagreed).
#[test]
fn a_compile_error_is_reported_with_the_log() {
    let Some(dir) = wheels() else {
        skipped("NVRTC error path: no CUDA 13.0 wheels");
        return;
    };
    load_nvrtc(&dir);
    let e = match nv::compile("sm_5") {
        Ok(_) => panic!("sm_5 compiled"),
        Err(e) => e,
    };
    assert!(
        e.contains("NVRTC could not compile the kernels for sm_5"),
        "{e}"
    );
}
