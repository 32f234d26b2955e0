//! `--device cpu|cuda[:N]`: cpu is the default and gives the same selection; a typo is a
//! usage error listing the values; `cuda` on a build or a machine that cannot run it stops
//! with exit 1 and one `error:` line, no panic, no file written. With the `cuda` feature the
//! GPU outcomes are staged with stand-in driver libraries (lib/cuda/tests/support). That the
//! CUDA kernels select exactly what the CPU ones do is lib/cuda-emu's and, on a GPU node,
//! lib/cuda/tests/gpu.rs's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gradkit_core::{read_tensor, write_table, Input, Meta, Output};

/// The binary of this test's variant (with or without `cuda`), whatever was built last.
fn bin() -> &'static str {
    static B: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    B.get_or_init(|| {
        gradkit_testkit::variant_bin(env!("CARGO_BIN_EXE_gradselect"), cfg!(feature = "cuda"))
    })
}

fn tmpdir(name: &str) -> gradkit_testkit::TempDir {
    gradkit_testkit::tempdir(&format!("gradselect-device-{name}-"))
}

/// A dense 2-rank, 2-step trace in `dir/trace.parquet`.
fn trace(dir: &Path) -> PathBuf {
    let rows = gradkit_testkit::traces::dense(2, 2, &[("w", 300), ("b", 7)]);
    let p = dir.join("trace.parquet");
    write_table(&Output::Path(p.clone()), &Meta::default(), &rows).unwrap();
    p
}

fn run(dir: &Path, args: &[&str], envs: &[(&str, &Path)]) -> (Option<i32>, String) {
    let mut c = Command::new(bin());
    c.current_dir(dir).args(args).stdin(Stdio::null());
    for (k, v) in envs {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `--device DEV` must stop with exit 1 and one `error:` line holding `needle`, and leave
/// `dir` as it was.
fn refused(dir: &Path, dev: &str, envs: &[(&str, &Path)], needle: &str) {
    let args = [
        "--method",
        "topk",
        "--density",
        "0.1",
        "--device",
        dev,
        "trace.parquet",
        "-o",
        "out.parquet",
        "--metrics",
        "m.parquet",
    ];
    gradkit_testkit::cli::refused_with_env(bin(), dir, &args, envs, &[needle]);
}

#[test]
fn cpu_is_the_default_and_gives_the_same_selection() {
    let d_dir = tmpdir("cpu");
    let d = d_dir.path().to_path_buf();
    trace(&d);
    for method in [["topk", "--density"], ["threshold", "--threshold"]] {
        let mut rows = Vec::new();
        for dev in [None, Some("cpu")] {
            let out = format!("{}-{}.parquet", method[0], dev.unwrap_or("default"));
            let value = if method[0] == "topk" { "0.1" } else { "0.5" };
            let mut args = vec![
                "--method",
                method[0],
                method[1],
                value,
                "-q",
                "trace.parquet",
                "-o",
                &out,
            ];
            if let Some(dev) = dev {
                args.extend(["--device", dev]);
            }
            let (code, err) = run(&d, &args, &[]);
            assert_eq!(code, Some(0), "{args:?}: {err}");
            rows.push(
                read_tensor(&Input::Path(d.join(&out)), Default::default())
                    .unwrap()
                    .rows,
            );
        }
        assert!(!rows[0].is_empty());
        assert_eq!(rows[0], rows[1], "{}", method[0]);
    }
}

#[test]
fn a_device_typo_is_a_usage_error_listing_the_values() {
    let d_dir = tmpdir("typo");
    let d = d_dir.path().to_path_buf();
    trace(&d);
    for bad in ["gpu", "cuda:x", "CUDA", "cuda:-1"] {
        let before = gradkit_testkit::cli::snapshot(&d);
        let (code, err) = run(
            &d,
            &[
                "--method",
                "topk",
                "--density",
                "0.1",
                "--device",
                bad,
                "trace.parquet",
                "-o",
                "out.parquet",
            ],
            &[],
        );
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(err.starts_with("error: "), "{err}");
        assert!(
            err.contains("--device") && err.contains("cpu, cuda, cuda:N"),
            "{err}"
        );
        assert_eq!(gradkit_testkit::cli::snapshot(&d), before);
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn without_the_feature_cuda_says_to_rebuild() {
    let d_dir = tmpdir("nofeature");
    let d = d_dir.path().to_path_buf();
    trace(&d);
    for dev in ["cuda", "cuda:1"] {
        refused(
            &d,
            dev,
            &[],
            "gradkit was built without the `cuda` feature: rebuild with `cargo build --release --features cuda`",
        );
    }
}

#[cfg(feature = "cuda")]
#[path = "../../../lib/cuda/tests/support/stub.rs"]
mod stub;

/// Stand-in drivers: none on the loader path, one exporting nothing, one with a GPU (opening
/// it for the kernels fails: the stand-in has no context functions), an ordinal past the GPUs.
#[cfg(feature = "cuda")]
#[test]
fn with_the_feature_every_driver_outcome_is_one_line() {
    let d_dir = tmpdir("stubs");
    let d = d_dir.path().to_path_buf();
    trace(&d);
    if !stub::system_has("libcuda.so") {
        refused(
            &d,
            "cuda",
            &[],
            "no CUDA driver found (libcuda.so): is this a GPU node?",
        );
    }
    let empty_dir = stub::libs("gsel-empty", Some(stub::Driver::Empty), true, false);
    let empty = empty_dir.path().to_path_buf();
    refused(
        &d,
        "cuda",
        &[("LD_LIBRARY_PATH", &empty)],
        "the CUDA driver could not be used: Missing symbol cuInit",
    );
    let one_dir = stub::libs("gsel-one", Some(stub::Driver::Gpus(1)), true, false);
    let one = one_dir.path().to_path_buf();
    let lib = [("LD_LIBRARY_PATH", one.as_path())];
    refused(
        &d,
        "cuda",
        &lib,
        "the CUDA kernels could not be loaded on cuda:0 (Stub GPU 0): Missing symbol cuDevicePrimaryCtxRetain",
    );
    refused(
        &d,
        "cuda:3",
        &lib,
        "no GPU cuda:3: the CUDA driver sees 1 GPU (cuda:0); check CUDA_VISIBLE_DEVICES",
    );
}

/// The note `--device counting` prints: (uploads, upload bytes, downloads, download bytes).
fn transfers(err: &str) -> (u64, u64, u64, u64) {
    let line = err
        .lines()
        .find(|l| l.contains("gradselect: device counting:"))
        .unwrap_or_else(|| panic!("no transfer note in {err}"));
    let n: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[0], n[1], n[2], n[3])
}

/// `--device counting` (the device seam's test device: host memory, counted copies) selects
/// exactly what the CPU selects, residuals and metrics included, and copies each rank's
/// gradient up once per step; only the selection comes down (and the residuals, once, for
/// `--residual-out`).
#[test]
fn the_counting_device_selects_as_the_cpu_and_uploads_each_gradient_once() {
    let d_dir = tmpdir("counting");
    let d = d_dir.path().to_path_buf();
    let rows = gradkit_testkit::traces::dense(2, 4, &[("w", 3000), ("b", 7)]);
    write_table(
        &Output::Path(d.join("trace.parquet")),
        &Meta::default(),
        &rows,
    )
    .unwrap();
    let (ranks, steps, n) = (2u64, 4u64, 3007u64);
    let methods: [&[&str]; 4] = [
        &["--method", "topk"],
        &["--method", "threshold", "--threshold", "0.5"],
        &["--method", "oktopk", "--reeval", "2"],
        &["--method", "gaussiank"],
    ];
    for m in methods {
        let mut outs = Vec::new();
        for dev in ["cpu", "counting"] {
            let mut args: Vec<&str> = m.to_vec();
            let (o, r, me) = (
                format!("o-{dev}.parquet"),
                format!("r-{dev}.parquet"),
                format!("m-{dev}.parquet"),
            );
            args.extend(["--density", "0.05", "--device", dev, "trace.parquet"]);
            args.extend(["-o", &o, "--residual-out", &r, "--metrics", &me]);
            let (code, err) = run(&d, &args, &[]);
            assert_eq!(code, Some(0), "{args:?}: {err}");
            let read = |p: &str| {
                read_tensor(&Input::Path(d.join(p)), Default::default())
                    .unwrap()
                    .rows
            };
            outs.push((read(&o), read(&r), err));
        }
        let (cpu, dev) = (&outs[0], &outs[1]);
        assert_eq!(dev.0, cpu.0, "{m:?}: selection");
        assert_eq!(dev.1, cpu.1, "{m:?}: residual");
        let (up, up_b, down, down_b) = transfers(&dev.2);
        let selected: u64 = dev.0.iter().map(|r| r.values.len() as u64).sum();
        // Up: each gradient, then the indices that leave the residual; down: the selection
        // (indices, values), then each rank's residual once at the end.
        assert_eq!(up, 2 * ranks * steps, "{m:?}: {}", dev.2);
        assert_eq!(up_b, 4 * n * ranks * steps + 4 * selected, "{m:?}");
        assert_eq!(down, 2 * ranks * steps + ranks, "{m:?}");
        assert_eq!(down_b, 8 * selected + 4 * n * ranks, "{m:?}");
    }
}
