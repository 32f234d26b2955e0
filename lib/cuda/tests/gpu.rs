//! On a GPU node (pipelines/gpu-check.sh runs these with `--ignored`): the CUDA kernels on
//! cuda:0 against the CPU `Kernels` — the emulation matrix, then one call per method at
//! 2^10 … 2^26 elements — and the kernels' throughput on device-resident data beside the
//! device's own copy bandwidth. Ignored by default: there is no GPU where `make test` runs,
//! and an ignored test is reported as ignored, never as passed.
//!
//! Environment: `GRADKIT_GPU_OUT` (a folder: the tables are written there as each size or
//! bench finishes), `GRADKIT_GPU_MAX_LOG2` (the largest size, 26 by default).

#![cfg(feature = "cuda")]

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use gradkit_cuda::check;
use gradkit_cuda::exec::Select;

fn out(name: &str) -> Option<std::fs::File> {
    let dir = PathBuf::from(std::env::var_os("GRADKIT_GPU_OUT")?);
    std::fs::create_dir_all(&dir).ok()?;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .ok()
}

fn max_log2() -> u32 {
    std::env::var("GRADKIT_GPU_MAX_LOG2")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(26)
}

fn gpu() -> &'static gradkit_cuda::exec::Gpu<gradkit_cuda::nv::Nv> {
    gradkit_cuda::gpu(0).unwrap_or_else(|e| panic!("error: {e}"))
}

#[test]
#[ignore = "needs a GPU: pipelines/gpu-check.sh runs it"]
fn kernels_equal_the_cpu_on_the_gpu() {
    let g = gpu();
    let mut table = out("equivalence.md");
    if let Some(f) = table.as_mut() {
        let _ = writeln!(
            f,
            "| n | method | equal to the CPU | detail |\n|---|---|---|---|"
        );
    }
    let t = check::check_all(g, &check::small_lengths(), 1);
    let small = match &t {
        Ok(t) => format!("{} calls", t.cases),
        Err(e) => e.clone(),
    };
    if let Some(f) = table.as_mut() {
        let _ = writeln!(
            f,
            "| 0 … 6139 | the emulation matrix | {} | {small} |",
            t.is_ok()
        );
    }
    f16(g, table.as_mut());
    // The device seam's primitives on the GPU against the counting host device.
    let dev = gradkit_cuda::resident_for(gradkit_cuda::Device::Cuda(0))
        .unwrap_or_else(|e| panic!("error: {e}"))
        .expect("a GPU device");
    let r = check::check_resident(dev, &check::small_lengths());
    if let Some(f) = table.as_mut() {
        let detail = match &r {
            Ok(c) => format!("{c} inputs"),
            Err(e) => e.clone(),
        };
        let _ = writeln!(
            f,
            "| 0 … 6139 | the device seam (resident) | {} | {detail} |",
            r.is_ok()
        );
    }
    let mut failed = usize::from(t.is_err()) + usize::from(r.is_err());
    for log2 in (10..=max_log2()).step_by(2) {
        let n = 1usize << log2;
        for (m, ok, detail) in check::check_large(g, n, 3) {
            failed += usize::from(!ok);
            if let Some(f) = table.as_mut() {
                let _ = writeln!(f, "| 2^{log2} | {m} | {ok} | {detail} |");
                let _ = f.flush();
            }
            eprintln!("2^{log2} {m}: {ok} {detail}");
        }
    }
    assert_eq!(
        failed, 0,
        "{failed} GPU-vs-CPU checks differ (equivalence.md)"
    );
}

fn f16(g: &gradkit_cuda::exec::Gpu<gradkit_cuda::nv::Nv>, table: Option<&mut std::fs::File>) {
    let r = check::check_f16_exhaustive(g);
    if let Some(f) = table {
        let _ = writeln!(
            f,
            "| 65536 + | fp16 wire, every pattern | {} | {} |",
            r.is_ok(),
            r.clone().err().unwrap_or_default()
        );
    }
    r.unwrap_or_else(|e| panic!("{e}"));
}

/// Seconds per call of `f`, the best of `reps` after one warm-up (the device synchronised
/// around each).
fn time(
    g: &gradkit_cuda::exec::Gpu<gradkit_cuda::nv::Nv>,
    reps: usize,
    mut f: impl FnMut(),
) -> f64 {
    f();
    g.sync();
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        g.sync();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

#[test]
#[ignore = "needs a GPU: pipelines/gpu-check.sh runs it"]
fn bench_kernels_against_the_copy_bandwidth() {
    let g = gpu();
    let mut table = out("bench.md");
    if let Some(f) = table.as_mut() {
        let _ = writeln!(
            f,
            "{}\n\n| n | kernel | ms | GB/s (bytes read + written) | × copy bandwidth |\n|---|---|---|---|---|",
            g.backend_name()
        );
    }
    for log2 in [24u32, 26] {
        if log2 > max_log2() {
            continue;
        }
        let n = 1usize << log2;
        let x = check::inputs(n, 7).swap_remove(0).1;
        let xd = g.upload(&x);
        let yd = g.alloc(4 * n);
        let copy = time(g, 5, || g.copy(&yd, &xd, 4 * n));
        let copy_bw = 2.0 * 4.0 * n as f64 / copy / 1e9;
        let k = (n / 100) as u32;
        let th = gradkit_sparsify::kernels::cpu().kth_largest_magnitude(&x, k as usize);
        let ed = g.alloc(4 * n);
        let bd = g.alloc(n / 8);
        let rows: Vec<(&str, f64, f64)> = vec![
            ("device-to-device copy", copy, 8.0 * n as f64),
            (
                "threshold selection, 1 % (count, scan, compact with values)",
                time(g, 5, || {
                    g.select(&xd, n as u32, Select::Above(th), true);
                }),
                // read x twice, write 1 % indices and values
                8.0 * n as f64 + 0.08 * n as f64,
            ),
            (
                "exact top-k, k = 1 % (radix select, compact with values)",
                time(g, 5, || {
                    g.select(&xd, n as u32, Select::Top(k), true);
                }),
                // four histogram passes, then count and compact
                24.0 * n as f64 + 0.08 * n as f64,
            ),
            (
                "1-bit compress with error feedback",
                time(g, 5, || {
                    g.onebit_compress(&xd, n as u32, &ed, n as u32, &bd);
                }),
                // read x and e twice, write e and the bits
                20.0 * n as f64 + n as f64 / 8.0,
            ),
        ];
        for (name, secs, bytes) in rows {
            let bw = bytes / secs / 1e9;
            let line = format!(
                "| 2^{log2} | {name} | {:.3} | {bw:.1} | {:.2} |",
                secs * 1e3,
                bw / copy_bw
            );
            eprintln!("{line}");
            if let Some(f) = table.as_mut() {
                let _ = writeln!(f, "{line}");
                let _ = f.flush();
            }
        }
    }
}
