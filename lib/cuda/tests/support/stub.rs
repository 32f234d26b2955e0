//! Stand-in CUDA libraries for tests on machines without a GPU: tiny shared objects built with
//! `cc` that export the few driver functions gradkit's probe calls (or none at all), put in a
//! folder that the child process gets as `LD_LIBRARY_PATH`. They test gradkit's handling of
//! what a driver answers; they say nothing about a real GPU.
//!
//! Shared by lib/cuda/tests and the tools' device tests (`#[path]`).

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// What the stand-in `libcuda.so` does.
#[derive(Clone, Copy, Debug)]
pub enum Driver {
    /// Exports no driver function (an unrelated or much older library): cudarc's first call
    /// panics with "Missing symbol cuInit".
    Empty,
    /// `cuInit` returns CUDA_ERROR_NO_DEVICE (100).
    NoDevice,
    /// A driver reporting CUDA 13.0 and this many GPUs, named "Stub GPU i".
    Gpus(u32),
}

const DRIVER_C: &str = r#"
#include <stdio.h>
int cuInit(unsigned flags) { (void)flags; return INIT_RESULT; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuDeviceGetCount(int *n) { *n = COUNT; return 0; }
int cuDeviceGet(int *d, int i) { if (i < 0 || i >= COUNT) return 101; *d = i; return 0; }
int cuDeviceGetName(char *buf, int len, int d) { snprintf(buf, len, "Stub GPU %d", d); return 0; }
"#;

const EMPTY_C: &str = "void gradkit_stub_exports_nothing(void) {}\n";

fn cc(dir: &Path, out: &str, src: &str, defines: &[String]) {
    let c = dir.join(format!("{out}.c"));
    std::fs::write(&c, src).unwrap();
    let o = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join(out))
        .arg(&c)
        .args(defines)
        .output()
        .expect("`cc` runs (build-essential; `make deps` installs it)");
    assert!(
        o.status.success(),
        "cc {out}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A fresh folder holding the stand-ins asked for: `libcuda.so` when `driver` is given, an
/// empty `libnvrtc.so` and `libnccl.so` when asked (gradkit only checks that they load). The
/// folder is removed when the returned guard drops.
pub fn libs(name: &str, driver: Option<Driver>, nvrtc: bool, nccl: bool) -> tempfile::TempDir {
    let guard = tempfile::Builder::new()
        .prefix(&format!("gradkit-cuda-stub-{name}-"))
        .tempdir()
        .expect("a directory under the system's temporary directory");
    let dir = guard.path();
    match driver {
        None => {}
        Some(Driver::Empty) => cc(dir, "libcuda.so", EMPTY_C, &[]),
        Some(Driver::NoDevice) => cc(
            dir,
            "libcuda.so",
            DRIVER_C,
            &["-DINIT_RESULT=100".into(), "-DCOUNT=0".into()],
        ),
        Some(Driver::Gpus(n)) => cc(
            dir,
            "libcuda.so",
            DRIVER_C,
            &["-DINIT_RESULT=0".into(), format!("-DCOUNT={n}")],
        ),
    }
    if nvrtc {
        cc(dir, "libnvrtc.so", EMPTY_C, &[]);
    }
    if nccl {
        cc(dir, "libnccl.so", EMPTY_C, &[]);
    }
    guard
}

/// Whether the dynamic loader can find a library whose file name starts with `prefix`
/// (`libcuda.so`) without help: in `ldconfig -p` or a folder of this process's
/// `LD_LIBRARY_PATH`. The oracle that says what the probe must answer here.
pub fn system_has(prefix: &str) -> bool {
    let in_env = std::env::var_os("LD_LIBRARY_PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            std::fs::read_dir(d).is_ok_and(|mut it| {
                it.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with(prefix)))
            })
        })
    });
    let cache = ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .find_map(|l| Command::new(l).arg("-p").output().ok())
        .expect("ldconfig runs");
    in_env
        || String::from_utf8_lossy(&cache.stdout)
            .lines()
            .any(|l| l.trim_start().starts_with(prefix))
}
