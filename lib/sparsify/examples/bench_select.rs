//! Selection speed on 2^24 heavy-tailed f32 at k = 1%: exact top-k, Ok-Topk's reuse step,
//! Gaussiank, DGC, against one streaming pass (sum of |x|, the memory-speed limit) and numpy's
//! argpartition on the same array in the same run.
//!
//! cargo run --release -p gradkit-sparsify --example bench_select [-- LOG2N [PYTHON]]
//!
//! `-- sweep [FROM [TO]]` instead: time per element and page faults per call of the exact
//! top-k (the kernel of gradselect --method topk) and one streaming pass from 2^FROM to 2^TO
//! elements (default 20 to 26), docs/MEMORY.md's "time per element flat from 2^20 to 2^26"
//! (docs/results/select.md).

use std::io::Write;
use std::process::Command;
use std::time::Instant;

use gradkit_sparsify::{threshold, topk, Adjust, Bands, Method, Selector};
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

/// A named timed closure that returns the number of selected entries.
type Case<'a> = (&'a str, Box<dyn FnMut() -> usize + 'a>);

/// Runs every case once per round, `reps` rounds after one warm-up round, and returns each
/// case's median time (the machine is shared: interleaving gives every case the same load, and
/// the median is robust to the disturbed rounds).
fn time_all(reps: usize, cases: &mut [Case<'_>]) -> Vec<(f64, usize)> {
    let mut ts = vec![Vec::new(); cases.len()];
    let mut sel = vec![0; cases.len()];
    for round in 0..=reps {
        for (j, (_, f)) in cases.iter_mut().enumerate() {
            let t = Instant::now();
            sel[j] = std::hint::black_box(f());
            if round > 0 {
                ts[j].push(t.elapsed().as_secs_f64());
            }
        }
    }
    ts.into_iter()
        .zip(sel)
        .map(|(mut t, s)| {
            t.sort_by(|a, b| a.total_cmp(b));
            (t[t.len() / 2], s)
        })
        .collect()
}

fn normal(n: usize) -> Vec<f32> {
    (0..n)
        .into_par_iter()
        .chunks(1 << 16)
        .flat_map_iter(|c| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(c[0] as u64 ^ 0x5eed);
            c.into_iter()
                .map(|_| {
                    let u: f64 = rng.gen::<f64>().max(1e-300);
                    let v: f64 = rng.gen();
                    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos() * 1e-3) as f32
                })
                .collect::<Vec<_>>()
        })
        .collect()
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

/// Minor page faults of this process so far (/proc/self/stat, field 10).
fn minor_faults() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 2..];
            rest.split(' ').nth(7)?.parse().ok()
        })
        .unwrap_or(0)
}

/// One case of the sweep: median seconds and mean minor faults per call over `reps` calls
/// after one warm-up call.
fn sweep_case(reps: usize, mut f: impl FnMut() -> usize) -> (f64, f64) {
    std::hint::black_box(f());
    let mut ts = Vec::with_capacity(reps);
    let f0 = minor_faults();
    for _ in 0..reps {
        let t = Instant::now();
        std::hint::black_box(f());
        ts.push(t.elapsed().as_secs_f64());
    }
    let faults = (minor_faults() - f0) as f64 / reps as f64;
    ts.sort_by(|a, b| a.total_cmp(b));
    (ts[ts.len() / 2], faults)
}

fn sweep(from: u32, to: u32) {
    println!(
        "heavy-tailed f32, k = 1%, {} rayon threads; median of 9 calls after a warm-up; \
         faults: minor page faults per call",
        rayon::current_num_threads()
    );
    println!();
    println!(
        "| n | one pass ns/elem | topk_indices ns/elem | × at 2^{from} | × one pass | \
         faults/call | topk_with_values ns/elem | × at 2^{from} | × one pass | faults/call |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut base: Option<(f64, f64)> = None;
    for log2n in from..=to {
        let n = 1usize << log2n;
        let k = n / 100;
        let x = heavy_tailed(n);
        let (tp, _) = sweep_case(9, || one_pass(&x) as usize);
        let (ti, fi) = sweep_case(9, || topk::topk_indices(&x, k).len());
        let (tv, fv) = sweep_case(9, || topk::topk_with_values(&x, k).0.len());
        let per = |t: f64| t * 1e9 / n as f64;
        let (bi, bv) = *base.get_or_insert((per(ti), per(tv)));
        println!(
            "| 2^{log2n} | {:.3} | {:.3} | {:.2} | {:.2} | {fi:.0} | {:.3} | {:.2} | {:.2} | {fv:.0} |",
            per(tp),
            per(ti),
            per(ti) / bi,
            ti / tp,
            per(tv),
            per(tv) / bv,
            tv / tp
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("sweep") {
        let from = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20);
        let to = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(26);
        sweep(from, to);
        return;
    }
    let log2n: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(24);
    let python = args
        .get(2)
        .cloned()
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/bin/python").into());
    let n = 1usize << log2n;
    let k = n / 100;
    let reps = 15;
    println!(
        "n = 2^{log2n} = {n} f32 ({:.0} MiB), k = {k} (1%), {} rayon threads, median of {reps} \
         interleaved rounds",
        n as f64 * 4.0 / (1 << 20) as f64,
        rayon::current_num_threads()
    );
    for (name, x) in [("heavy-tailed", heavy_tailed(n)), ("normal", normal(n))] {
        table(
            name,
            &x,
            k,
            reps,
            (name == "heavy-tailed").then_some(python.as_str()),
        );
    }
}

/// The timed cases on `x`: the reference pass, exact top-k, thresholds and the selectors.
fn select_cases(x: &[f32], k: usize) -> Vec<Case<'_>> {
    let th = topk::kth_largest_abs(x, k);
    // Ok-Topk reuse steps: the threshold of a re-evaluation step, then pure threshold passes.
    let ok_sel = |adjust| {
        let mut s = Selector::new(
            Method::OkTopk {
                reeval: 1_000_000,
                adjust,
            },
            0,
        );
        let _ = s.select(0, x, k);
        s
    };
    let (mut ok, mut oka) = (ok_sel(Adjust::Paper), ok_sel(Adjust::Reference(Bands::VGG)));
    let mut gk = Selector::new(Method::GaussianK, 0);
    let mut dg = Selector::new(Method::Dgc { sample: 0.01 }, 0);
    vec![
        (
            "one streaming pass (sum of abs)",
            Box::new(move || one_pass(x) as usize),
        ),
        (
            "topk_indices (exact)",
            Box::new(move || topk::topk_indices(x, k).len()),
        ),
        (
            "kth_largest_abs (exact threshold)",
            Box::new(move || topk::kth_largest_abs(x, k) as usize),
        ),
        (
            "oktopk reuse step (Selector, with values)",
            Box::new(move || ok.select(1, x, k).indices.len()),
        ),
        (
            "oktopk reuse step, --adjust vgg (Selector)",
            Box::new(move || oka.select(1, x, k).indices.len()),
        ),
        (
            "threshold::above (indices)",
            Box::new(move || threshold::above(x, th).len()),
        ),
        (
            "threshold::above_with_values",
            Box::new(move || threshold::above_with_values(x, th).0.len()),
        ),
        (
            "threshold::count_above",
            Box::new(move || threshold::count_above(x, th)),
        ),
        (
            "gaussiank (Selector)",
            Box::new(move || gk.select(0, x, k).indices.len()),
        ),
        (
            "dgc, sample 1% (Selector)",
            Box::new(move || dg.select(0, x, k).indices.len()),
        ),
    ]
}

/// Times every case of [`select_cases`] (and numpy's argpartition) on `x` and prints the table.
fn table(name: &str, x: &[f32], k: usize, reps: usize, python: Option<&str>) {
    let n = x.len();
    let mut cases = select_cases(x, k);
    let res = time_all(reps, &mut cases);
    let t_np = python.and_then(|p| numpy(x, k, p));
    let t_pass = res[0].0;
    let rate = |t: f64| n as f64 / t / 1e9;
    println!();
    println!("{name} input:");
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
    for (j, (name, _)) in cases.iter().enumerate() {
        let sel = if j == 0 || j == 2 {
            "-".into()
        } else {
            res[j].1.to_string()
        };
        row(name, res[j].0, sel);
    }
    if let Some(np) = t_np {
        row("numpy argpartition(abs(x))", np, format!("{k}"));
    } else if python.is_some() {
        println!("numpy: not available");
    }
}
