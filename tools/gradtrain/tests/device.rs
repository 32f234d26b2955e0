//! `--device cpu|cuda[:N]` (docs/GPU.md): cpu is the default; a typo is a usage error
//! listing the values; `cuda` on a build or a machine that cannot run it stops with exit 1 and
//! one `error:` line, no panic, no metrics written. With the `cuda` feature the GPU outcomes
//! are staged with stand-in driver libraries (lib/cuda/tests/support).

use std::path::Path;
use std::process::{Command, Stdio};

/// The binary of this test's variant (with or without `cuda`), whatever was built last.
fn bin() -> &'static str {
    static B: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    B.get_or_init(|| {
        gradkit_testkit::variant_bin(env!("CARGO_BIN_EXE_gradtrain"), cfg!(feature = "cuda"))
    })
}

/// A short training run's flags, with --metrics in the current folder.
const RUN: &[&str] = &[
    "--ranks",
    "2",
    "--steps",
    "2",
    "--batch",
    "8",
    "--hidden",
    "8",
    "-q",
    "--metrics",
    "m.parquet",
];

fn run(dir: &Path, args: &[&str], envs: &[(&str, &Path)]) -> (Option<i32>, String) {
    let mut c = Command::new(bin());
    c.current_dir(dir).args(args).args(RUN).stdin(Stdio::null());
    for (k, v) in envs {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `--device DEV` must stop with exit 1 and one `error:` line holding `needle`, leaving
/// `dir` as it was.
fn refused(dir: &Path, dev: &str, envs: &[(&str, &Path)], needle: &str) {
    let args: Vec<&str> = ["--device", dev]
        .into_iter()
        .chain(RUN.iter().copied())
        .collect();
    gradkit_testkit::cli::refused_with_env(bin(), dir, &args, envs, &[needle]);
}

#[test]
fn cpu_trains_and_a_typo_is_a_usage_error() {
    let d = tempfile::tempdir().unwrap();
    let (code, err) = run(d.path(), &["--device", "cpu"], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(d.path().join("m.parquet").exists());
    std::fs::remove_file(d.path().join("m.parquet")).unwrap();
    for bad in ["gpu", "cuda:x", "cuda:"] {
        let (code, err) = run(d.path(), &["--device", bad], &[]);
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(err.starts_with("error: "), "{err}");
        assert!(
            err.contains("--device") && err.contains("cpu, cuda, cuda:N"),
            "{err}"
        );
        assert!(!d.path().join("m.parquet").exists());
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn without_the_feature_cuda_says_to_rebuild() {
    let d = tempfile::tempdir().unwrap();
    refused(
        d.path(),
        "cuda",
        &[],
        "gradkit was built without the `cuda` feature: rebuild with `cargo build --release --features cuda`",
    );
}

#[cfg(feature = "cuda")]
#[path = "../../../lib/cuda/tests/support/stub.rs"]
mod stub;

#[cfg(feature = "cuda")]
#[test]
fn with_the_feature_each_outcome_is_one_line() {
    let d = tempfile::tempdir().unwrap();
    if !stub::system_has("libcuda.so") {
        refused(
            d.path(),
            "cuda",
            &[],
            "no CUDA driver found (libcuda.so): is this a GPU node?",
        );
    }
    let empty_dir = stub::libs("gt-empty", Some(stub::Driver::Empty), true, false);
    let empty = empty_dir.path().to_path_buf();
    refused(
        d.path(),
        "cuda",
        &[("LD_LIBRARY_PATH", &empty)],
        "the CUDA driver could not be used: Missing symbol cuInit",
    );
    let one_dir = stub::libs("gt-one", Some(stub::Driver::Gpus(1)), true, false);
    let one = one_dir.path().to_path_buf();
    refused(
        d.path(),
        "cuda:0",
        &[("LD_LIBRARY_PATH", &one)],
        "the CUDA kernels could not be loaded on cuda:0 (Stub GPU 0): Missing symbol cuDevicePrimaryCtxRetain",
    );
}

/// `--backend mpi|nccl`: mpi (the default, given) trains; a typo is a usage error listing
/// the values.
#[test]
fn the_backend_flag_takes_mpi_and_a_typo_is_a_usage_error() {
    let d = tempfile::tempdir().unwrap();
    let (code, err) = run(d.path(), &["--backend", "mpi"], &[]);
    assert_eq!(code, Some(0), "{err}");
    std::fs::remove_file(d.path().join("m.parquet")).unwrap();
    for bad in ["NCCL", "gloo", ""] {
        let (code, err) = run(d.path(), &["--backend", bad], &[]);
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(err.starts_with("error: "), "{err}");
        assert!(
            err.contains("--backend") && err.contains("mpi, nccl"),
            "{err}"
        );
        assert!(!d.path().join("m.parquet").exists());
    }
}

/// `--backend nccl` in a build without the feature: exit 1 and gradallreduce's one line.
#[cfg(not(feature = "cuda"))]
#[test]
fn without_the_feature_the_nccl_backend_says_to_rebuild() {
    let d = tempfile::tempdir().unwrap();
    let args: Vec<&str> = ["--backend", "nccl"]
        .into_iter()
        .chain(RUN.iter().copied())
        .collect();
    gradkit_testkit::cli::refused_with_env(
        bin(),
        d.path(),
        &args,
        &[],
        &["gradkit was built without the `cuda` feature: rebuild with `cargo build --release --features cuda`"],
    );
}

/// With the feature and no GPU: `--backend nccl` names what is missing, as gradallreduce
/// does (no driver; a driver with a GPU but no libnccl).
#[cfg(feature = "cuda")]
#[test]
fn with_the_feature_the_nccl_backend_names_what_is_missing() {
    let d = tempfile::tempdir().unwrap();
    let refused = |envs: &[(&str, &Path)], needle: &str| {
        let args: Vec<&str> = ["--backend", "nccl"]
            .into_iter()
            .chain(RUN.iter().copied())
            .collect();
        gradkit_testkit::cli::refused_with_env(bin(), d.path(), &args, envs, &[needle]);
    };
    if !stub::system_has("libcuda.so") {
        refused(&[], "no CUDA driver found (libcuda.so)");
    }
    let one_dir = stub::libs("gt-nonccl", Some(stub::Driver::Gpus(1)), true, false);
    if !stub::system_has("libnccl.so") {
        refused(
            &[("LD_LIBRARY_PATH", one_dir.path())],
            "no NCCL library found (libnccl.so)",
        );
    }
}
