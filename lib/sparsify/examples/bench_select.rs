//! Selection speed on 2^24 heavy-tailed f32 at k = 1%: exact top-k, Ok-Topk's reuse step,
//! Gaussiank, DGC, against one streaming pass (sum of |x|, the memory-speed limit) and numpy's
//! argpartition on the same array in the same run.
//!
//! cargo run --release -p gradkit-sparsify --example bench_select [-- LOG2N [PYTHON]]

use std::io::Write;
use std::process::Command;
use std::time::Instant;

use gradkit_sparsify::{dgc, gaussiank, threshold, topk, Bands, Method, Selector};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

fn heavy_tailed(n: usize) -> Vec<f32> {
    // Student-t-like tails: sign · (u^(−1/2) − 1) · 1e-3, a power law with exponent 2.
    (0..n)
        .into_par_iter()
        .chunks(1 << 16)
        .flat_map_iter(|c| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(c[0] as u64);
            c.into_iter()
                .map(|_| {
                    let u: f32 = rng.gen::<f32>().max(1e-12);
                    let s = if rng.gen::<bool>() { 1.0 } else { -1.0 };
                    s * (u.powf(-0.5) - 1.0) * 1e-3
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn one_pass(x: &[f32]) -> f64 {
    x.par_chunks(1 << 16)
        .map(|c| {
            let mut a = [0f32; 16];
            let mut it = c.chunks_exact(16);
            for q in &mut it {
                for j in 0..16 {
                    a[j] += q[j].abs();
                }
            }
            a.iter().map(|v| *v as f64).sum::<f64>()
                + it.remainder().iter().map(|v| v.abs() as f64).sum::<f64>()
        })
        .sum()
}

/// Fastest of `reps` runs after one warm-up (the machine is shared: the minimum is the
/// least disturbed run).
fn time<T>(reps: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut out = f();
    let mut ts = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        out = f();
        ts.push(t.elapsed().as_secs_f64());
    }
    ts.sort_by(|a, b| a.total_cmp(b));
    (ts[0], out)
}

fn numpy(x: &[f32], k: usize, python: &str) -> Option<f64> {
    let path = std::env::temp_dir().join(format!("bench_select_{}.f32", std::process::id()));
    let mut f = std::fs::File::create(&path).ok()?;
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    f.write_all(&bytes).ok()?;
    drop(f);
    let script = format!(
        "import numpy as np, time\n\
         x = np.fromfile('{}', dtype=np.float32)\n\
         k = {k}\n\
         ts = []\n\
         for _ in range(6):\n\
         \x20   t = time.perf_counter(); i = np.argpartition(np.abs(x), x.size - k)[x.size - k:]; ts.append(time.perf_counter() - t)\n\
         ts = sorted(ts[1:])\n\
         print(ts[len(ts)//2])\n",
        path.display()
    );
    let out = Command::new(python).arg("-c").arg(script).output().ok();
    let _ = std::fs::remove_file(&path);
    let out = out?;
    if !out.status.success() {
        eprintln!("numpy failed: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let log2n: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(24);
    let python = args
        .get(2)
        .cloned()
        .unwrap_or_else(|| "/work/main/.venv/bin/python".into());
    let n = 1usize << log2n;
    let k = n / 100;
    let x = heavy_tailed(n);
    let reps = 9;
    println!(
        "n = 2^{log2n} = {n} f32 ({:.0} MiB), k = {k} (1%), {} rayon threads, fastest of {reps}",
        n as f64 * 4.0 / (1 << 20) as f64,
        rayon::current_num_threads()
    );

    let (t_pass, s) = time(reps, || one_pass(&x));
    std::hint::black_box(s);
    let (t_topk, idx) = time(reps, || topk::topk_indices(&x, k));
    assert_eq!(idx.len(), k);
    let (t_kth, _) = time(reps, || topk::kth_largest_abs(&x, k));
    // Ok-Topk reuse step: the threshold of a re-evaluation step, then a pure threshold pass.
    let mut ok = Selector::new(
        Method::OkTopk {
            reeval: 1_000_000,
            adjust: None,
        },
        0,
    );
    let _ = ok.select(0, &x, k);
    let (t_ok, s_ok) = time(reps, || ok.select(1, &x, k));
    let mut oka = Selector::new(
        Method::OkTopk {
            reeval: 1_000_000,
            adjust: Some(Bands::VGG),
        },
        0,
    );
    let _ = oka.select(0, &x, k);
    let th = topk::kth_largest_abs(&x, k);
    let (t_above, _) = time(reps, || threshold::above(&x, th));
    let (t_count, _) = time(reps, || threshold::count_above(&x, th));
    let (t_gauss, (g_idx, _)) = time(reps, || gaussiank::select(&x, k));
    let (t_dgc, d) = time(reps, || dgc::select(&x, k, 0.01));
    let t_np = numpy(&x, k, &python);

    let rate = |t: f64| n as f64 / t / 1e9;
    println!();
    println!("| what | time (ms) | Gelem/s | × one pass | numpy argpartition / this | selected |");
    println!("|---|---:|---:|---:|---:|---:|");
    let row = |name: &str, t: f64, sel: String| {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {} | {sel} |",
            t * 1e3,
            rate(t),
            t / t_pass,
            t_np.map_or("-".into(), |np| format!("{:.1}", np / t))
        );
    };
    row("one streaming pass (sum of abs)", t_pass, "-".into());
    row("topk_indices (exact)", t_topk, format!("{k}"));
    row("kth_largest_abs (exact threshold)", t_kth, "-".into());
    row("oktopk reuse step", t_ok, format!("{}", s_ok.indices.len()));
    row("threshold::above", t_above, "-".into());
    row("threshold::count_above", t_count, "-".into());
    row("gaussiank", t_gauss, format!("{}", g_idx.len()));
    row(
        "dgc (sample 1%)",
        t_dgc,
        format!(
            "{}{}",
            d.indices.len(),
            if d.exact_topk { " (exact)" } else { "" }
        ),
    );
    if let Some(np) = t_np {
        row("numpy argpartition(abs(x))", np, format!("{k}"));
    } else {
        println!("numpy: not available ({python})");
    }
}
