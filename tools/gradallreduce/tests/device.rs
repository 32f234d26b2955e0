//! `--device cpu|cuda[:N]` (docs/GPU.md): cpu is the default and gives the same result;
//! a typo is a usage error listing the values; `cuda` on a build or a machine that cannot run
//! it stops with exit 1 and one `error:` line, no panic, no file written. With the `cuda`
//! feature the GPU outcomes are staged with stand-in driver libraries (lib/cuda/tests/support).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gradkit_core::{read_tensor, write_table, Input, Meta, Output};

/// The binary of this test's variant (with or without `cuda`), whatever was built last.
fn bin() -> &'static str {
    static B: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    B.get_or_init(|| {
        gradkit_testkit::variant_bin(env!("CARGO_BIN_EXE_gradallreduce"), cfg!(feature = "cuda"))
    })
}

/// A fresh directory for one test, removed when the guard drops.
fn tmpdir(name: &str) -> gradkit_testkit::TempDir {
    gradkit_testkit::tempdir(&format!("gradallreduce-device-{name}-"))
}

/// A dense 2-rank, 2-step trace in `dir/trace.parquet`.
fn trace(dir: &Path) -> PathBuf {
    let rows = gradkit_testkit::traces::dense(2, 2, &[("w", 300), ("b", 7)]);
    let p = dir.join("trace.parquet");
    write_table(&Output::Path(p.clone()), &Meta::default(), &rows).unwrap();
    p
}

/// Runs gradallreduce in `dir` with `envs`: exit code and stderr.
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

/// `--device DEV` on a real reduction must stop with exit 1 and one `error:` line holding
/// `needle`, and leave `dir` as it was.
fn refused(dir: &Path, dev: &str, envs: &[(&str, &Path)], needle: &str) {
    let args = [
        "--algo",
        "onebit",
        "--ranks",
        "2",
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
fn cpu_is_the_default_and_gives_the_same_rows() {
    let d_dir = tmpdir("cpu");
    let d = d_dir.path().to_path_buf();
    trace(&d);
    for algo in ["ring", "onebit", "topka"] {
        let mut rows = Vec::new();
        for dev in [None, Some("cpu")] {
            let out = format!("{algo}-{}.parquet", dev.unwrap_or("default"));
            let mut args = vec![
                "--algo",
                algo,
                "--ranks",
                "2",
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
        assert_eq!(rows[0], rows[1], "{algo}");
    }
}

#[test]
fn a_device_typo_is_a_usage_error_listing_the_values() {
    typo_is_a_usage_error(
        "typo",
        "--device",
        &["gpu", "cuda:x", "CUDA", "cuda:-1"],
        "cpu, cuda, cuda:N",
    );
}

/// Each of `bads` given to `flag` is a usage error (exit 2) that lists the values
/// (`listing`), and nothing is written.
fn typo_is_a_usage_error(name: &str, flag: &str, bads: &[&str], listing: &str) {
    let d_dir = tmpdir(name);
    let d = d_dir.path().to_path_buf();
    trace(&d);
    for bad in bads {
        let before = gradkit_testkit::cli::snapshot(&d);
        let (code, err) = run(&d, &[flag, bad, "trace.parquet", "-o", "out.parquet"], &[]);
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(err.starts_with("error: "), "{err}");
        assert!(err.contains(flag) && err.contains(listing), "{err}");
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

/// On this machine's own libraries: where the loader finds no libcuda, the driver is named.
#[cfg(feature = "cuda")]
#[test]
fn with_the_feature_and_no_driver_cuda_names_the_driver() {
    let d_dir = tmpdir("nodriver");
    let d = d_dir.path().to_path_buf();
    trace(&d);
    if stub::system_has("libcuda.so") {
        // A GPU node: the real outcome is covered by the stand-in tests below.
        let (code, err) = run(
            &d,
            &["--device", "cuda", "trace.parquet", "-o", "o.parquet"],
            &[],
        );
        assert_eq!(code, Some(1), "{err}");
        assert!(!err.contains("no CUDA driver found"), "{err}");
        return;
    }
    refused(
        &d,
        "cuda",
        &[],
        "no CUDA driver found (libcuda.so): is this a GPU node?",
    );
}

/// Stand-in drivers: one exporting nothing (cudarc would panic: gradkit reports it), one with
/// a GPU (opening it for the kernels fails: the stand-in has no context functions), an ordinal past the GPUs.
#[cfg(feature = "cuda")]
#[test]
fn with_the_feature_every_driver_outcome_is_one_line() {
    let d_dir = tmpdir("stubs");
    let d = d_dir.path().to_path_buf();
    trace(&d);
    let empty_dir = stub::libs("gar-empty", Some(stub::Driver::Empty), true, false);
    let empty = empty_dir.path().to_path_buf();
    refused(
        &d,
        "cuda",
        &[("LD_LIBRARY_PATH", &empty)],
        "the CUDA driver could not be used: Missing symbol cuInit",
    );
    let one_dir = stub::libs("gar-one", Some(stub::Driver::Gpus(1)), true, false);
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

/// `bench --device`: a typo is a usage error listing the values; `cpu` runs; `cuda` on a
/// build or machine without CUDA stops with one `error:` line (exit 1) and no table.
#[test]
fn bench_takes_the_device_too() {
    let d_dir = tmpdir("bench");
    let d = d_dir.path().to_path_buf();
    let base = [
        "bench",
        "--algo",
        "onebit,topka",
        "--ranks",
        "2",
        "--sizes",
        "1K:4K",
        "--iters",
        "1",
        "--warmup",
        "0",
        "-q",
    ];
    let with = |dev: &str| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend(["--device", dev]);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let run_bench = |args: &[String]| {
        let o = Command::new(bin())
            .current_dir(&d)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, _, err) = run_bench(&with("gpu"));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--device") && err.contains("cpu, cuda, cuda:N"),
        "{err}"
    );
    let (code, out, err) = run_bench(&with("cpu"));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("onebit") && out.contains("topka"), "{out}");
    if !cfg!(feature = "cuda") {
        let (code, out, err) = run_bench(&with("cuda"));
        assert_eq!(code, Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("error: gradkit was built without the `cuda` feature"),
            "{err}"
        );
        assert!(out.is_empty(), "{out}");
    }
}

/// `--backend BACKEND` on a real reduction must stop with exit 1 and one `error:` line
/// holding `needle`, and leave `dir` as it was.
fn refused_backend(dir: &Path, backend: &str, envs: &[(&str, &Path)], needle: &str) {
    let args = [
        "--algo",
        "topka",
        "--ranks",
        "2",
        "--backend",
        backend,
        "trace.parquet",
        "-o",
        "out.parquet",
        "--metrics",
        "m.parquet",
    ];
    gradkit_testkit::cli::refused_with_env(bin(), dir, &args, envs, &[needle]);
}

#[test]
fn a_backend_typo_is_a_usage_error_listing_the_values() {
    typo_is_a_usage_error(
        "backend-typo",
        "--backend",
        &["NCCL", "gloo", ""],
        "mpi, nccl",
    );
}

#[cfg(not(feature = "cuda"))]
#[test]
fn without_the_feature_the_nccl_backend_says_to_rebuild() {
    let d_dir = tmpdir("backend-nofeature");
    let d = d_dir.path().to_path_buf();
    trace(&d);
    refused_backend(
        &d,
        "nccl",
        &[],
        "gradkit was built without the `cuda` feature: rebuild with `cargo build --release --features cuda`",
    );
}

/// With the feature: no driver names the driver; a driver with a GPU but no libnccl names
/// NCCL and the symlink to make.
#[cfg(feature = "cuda")]
#[test]
fn with_the_feature_the_nccl_backend_names_what_is_missing() {
    let d_dir = tmpdir("backend-stubs");
    let d = d_dir.path().to_path_buf();
    trace(&d);
    if !stub::system_has("libcuda.so") {
        refused_backend(&d, "nccl", &[], "no CUDA driver found (libcuda.so)");
    }
    let one_dir = stub::libs("gar-nonccl", Some(stub::Driver::Gpus(1)), true, false);
    let one = one_dir.path().to_path_buf();
    if !stub::system_has("libnccl.so") {
        refused_backend(
            &d,
            "nccl",
            &[("LD_LIBRARY_PATH", &one)],
            "no NCCL library found (libnccl.so)",
        );
    }
}

/// `--device counting` (the device seam's test device: host memory, counted copies) reduces
/// exactly as the CPU does, and the sparse reducers' gradients go up once per rank and step.
#[test]
fn the_counting_device_reduces_as_the_cpu_and_uploads_each_gradient_once() {
    let d_dir = tmpdir("counting");
    let d = d_dir.path().to_path_buf();
    let rows = gradkit_testkit::traces::dense(2, 3, &[("w", 2000), ("b", 9)]);
    write_table(&Output::Path(d.join("t.parquet")), &Meta::default(), &rows).unwrap();
    for algo in ["topka", "gaussiank", "oktopk", "deft"] {
        let (n, line) = cpu_and_counting(&d, algo, &["--density", "0.05"]);
        // Both ranks share the process's device, 2 ranks × 3 steps: up, each gradient (2009
        // floats) and the index list the residual rule zeroes (DEFT: and the gathered union
        // to read its values at); down, the selection's indices and values (DEFT: each
        // range's indices, then the values at the union).
        let (ups, downs) = if algo == "deft" {
            (18, None)
        } else {
            (12, Some(12))
        };
        assert_eq!(n[0], ups, "{algo}: {line}");
        assert!(n[1] >= 6 * 4 * 2009, "{algo}: {line}");
        if let Some(d) = downs {
            assert_eq!(n[2], d, "{algo}: {line}");
        }
        assert!(n[3] < 6 * 4 * 2009, "{algo}: model-sized downloads: {line}");
    }
}

/// `--device counting` runs the 1-bit reducers with their errors resident: the same rows as
/// the CPU, and per rank and step the gradient up and the result down once, otherwise
/// packed signs only (onebit: this rank's signs and its server chunk down, the received and
/// the gathered chunks up; onebit-naive: its signs down, every rank's up).
#[test]
fn the_counting_device_runs_the_onebit_reducers_as_the_cpu_moving_packed_signs() {
    let d_dir = tmpdir("counting-onebit");
    let d = d_dir.path().to_path_buf();
    let rows = gradkit_testkit::traces::dense(2, 3, &[("w", 2000), ("b", 9)]);
    write_table(&Output::Path(d.join("t.parquet")), &Meta::default(), &rows).unwrap();
    // 2009 values on 2 ranks, padded to a multiple of P·lcm(P, 8) = 16 (onebit) or of 8
    // (onebit-naive): 2016 either way, 252 bytes of signs, 126 per server chunk.
    let (n, nbits, cb, calls) = (2009u64, 252u64, 126u64, 6u64);
    for (algo, want) in [
        ("onebit", [3, 4 * n + 4 * cb, 3, nbits + cb + 4 * n]),
        ("onebit-naive", [2, 4 * n + 2 * nbits, 2, nbits + 4 * n]),
    ] {
        let (nums, line) = cpu_and_counting(&d, algo, &[]);
        let want: Vec<u64> = want.iter().map(|w| w * calls).collect();
        assert_eq!(nums, want, "{algo}: {line}");
    }
}

/// `gradallreduce bench ARGS` in `dir` (`--algo ring` unless given), one timed call of 1 KiB
/// on 2 ranks, no warm-up: exit code, stdout and stderr.
fn bench(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let algo: &[&str] = if args.contains(&"--algo") {
        &[]
    } else {
        &["--algo", "ring"]
    };
    let o = std::process::Command::new(bin())
        .current_dir(dir)
        .arg("bench")
        .args(args)
        .args(algo)
        .args(["--ranks", "2", "--sizes", "1K:1K"])
        .args(["--iters", "1", "--warmup", "0", "--metrics", "m.parquet"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `gradallreduce bench --backend`: mpi (the default, given) prints nccl-tests' columns; a
/// typo is a usage error listing the values and writes nothing.
#[test]
fn bench_takes_the_backend_and_a_typo_is_a_usage_error() {
    let d_dir = tmpdir("bench-backend");
    let d = d_dir.path().to_path_buf();
    let (code, out, err) = bench(&d, &["--backend", "mpi"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("algbw") && out.contains("busbw"), "{out}");
    std::fs::remove_file(d.join("m.parquet")).unwrap();
    for bad in ["NCCL", "gloo", ""] {
        let (code, _, err) = bench(&d, &["--backend", bad]);
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(err.starts_with("error: "), "{err}");
        assert!(
            err.contains("--backend") && err.contains("mpi, nccl"),
            "{err}"
        );
        assert!(!d.join("m.parquet").exists());
    }
}

/// `bench --backend nccl` on 2 in-process ranks, a metrics file asked for (none may appear).
const BENCH_NCCL: [&str; 9] = [
    "bench",
    "--backend",
    "nccl",
    "--ranks",
    "2",
    "--sizes",
    "1K:1K",
    "--metrics",
    "m.parquet",
];

/// `bench --backend nccl` in a build without the feature stops as the reduction does: exit
/// 1, the same one `error:` line, nothing written.
#[cfg(not(feature = "cuda"))]
#[test]
fn without_the_feature_bench_on_nccl_says_to_rebuild() {
    let d_dir = tmpdir("bench-nofeature");
    let d = d_dir.path().to_path_buf();
    trace(&d);
    let args = BENCH_NCCL;
    let msg = "gradkit was built without the `cuda` feature: rebuild with `cargo build --release --features cuda`";
    gradkit_testkit::cli::refused_with_env(bin(), &d, &args, &[], &[msg]);
    refused_backend(&d, "nccl", &[], msg);
}

/// With the feature and no GPU: `bench --backend nccl` names what is missing, as the
/// reduction does.
#[cfg(feature = "cuda")]
#[test]
fn with_the_feature_bench_on_nccl_names_what_is_missing() {
    let d_dir = tmpdir("bench-stubs");
    let d = d_dir.path().to_path_buf();
    let args = BENCH_NCCL;
    if !stub::system_has("libcuda.so") {
        let needle = "no CUDA driver found (libcuda.so)";
        gradkit_testkit::cli::refused_with_env(bin(), &d, &args, &[], &[needle]);
    }
    let one_dir = stub::libs("gar-bench-nonccl", Some(stub::Driver::Gpus(1)), true, false);
    if !stub::system_has("libnccl.so") {
        let needle = "no NCCL library found (libnccl.so)";
        let envs = [("LD_LIBRARY_PATH", one_dir.path())];
        gradkit_testkit::cli::refused_with_env(bin(), &d, &args, &envs, &[needle]);
    }
}

/// `bench --device counting`: the 1-bit reducers keep their errors on the device there too;
/// the summary counts the copies (2 ranks × 1 call × 3 each way: the gradient, the received
/// and the gathered chunks up; the signs, the server chunk and the result down).
#[test]
fn bench_on_the_counting_device_keeps_the_onebit_errors_resident() {
    let d_dir = tmpdir("bench-counting");
    let d = d_dir.path().to_path_buf();
    let (code, _, err) = bench(&d, &["--algo", "onebit", "--device", "counting"]);
    assert_eq!(code, Some(0), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("gradallreduce bench: device counting:"))
        .unwrap_or_else(|| panic!("no transfer note: {err}"));
    // 1 KiB = 256 values on 2 ranks: padded to 256, 32 bytes of signs, 16 per server chunk.
    let (n, nbits, cb) = (256u64, 32u64, 16u64);
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let want = [3, 4 * n + 4 * cb, 3, nbits + cb + 4 * n].map(|w| 2 * w);
    assert_eq!(nums, want, "{line}");
}

/// `gradallreduce --algo ALGO EXTRA… --ranks 2` on t.parquet in `d`, with `--device cpu` and
/// `--device counting`: asserts both wrote the same rows and returns the numbers of the
/// counting device's transfer note (uploads, bytes up, downloads, bytes down) and the note.
fn cpu_and_counting(d: &Path, algo: &str, extra: &[&str]) -> (Vec<u64>, String) {
    let mut got = Vec::new();
    for dev in ["cpu", "counting"] {
        let out = format!("{algo}-{dev}.parquet");
        let mut args = vec!["--algo", algo, "--ranks", "2"];
        args.extend_from_slice(extra);
        args.extend(["--device", dev, "t.parquet", "-o", &out]);
        let (code, err) = run(d, &args, &[]);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        let rows = read_tensor(&Input::Path(d.join(&out)), Default::default())
            .unwrap()
            .rows;
        got.push((rows, err));
    }
    assert_eq!(got[1].0, got[0].0, "{algo}");
    let line = got[1]
        .1
        .lines()
        .find(|l| l.contains("gradallreduce: device counting:"))
        .unwrap_or_else(|| panic!("{algo}: no transfer note: {}", got[1].1))
        .to_string();
    let nums = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    (nums, line)
}
