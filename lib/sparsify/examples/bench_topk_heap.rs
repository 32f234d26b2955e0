//! DEFT's Eq. 6 on this CPU: does a top-k over m elements cost m·log2 k? gradkit's exact
//! top-k (`topk::topk_indices`, about two streaming passes) against the textbook size-k
//! min-heap (`heap_topk::topk_heap`, n·log k in the worst case), one thread each, on an
//! LSTM-sized gradient (n = 28,949,319, DEFT's LSTM on WikiText-2).
//!
//! For each density d and P, the whole model's top-k (n, k = d·n) against one worker's ideal
//! DEFT share (n/P elements, k/P): measured speedup = time(n, k) / time(n/P, k/P) per
//! algorithm, beside Eq. 6's prediction n·log2 k / ((n/P)·log2(k/P)). Heavy-tailed values in
//! random order (the heap's typical case) and the same values in ascending magnitude (its
//! worst case). Every time is the median of REPS interleaved repeats, with min–max.
//!
//! RAYON_NUM_THREADS=1 cargo run --release -p gradkit-sparsify --example bench_topk_heap
//!     [-- N [REPS]]   (N defaults to 28949319, REPS to 3; prints a markdown table)

use std::time::Instant;

use gradkit_sparsify::{heap_topk::topk_heap, topk::topk_indices};
use rand::{Rng, SeedableRng};

fn heavy_tailed(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let u: f32 = rng.gen::<f32>().max(1e-12);
            let s = if rng.gen::<bool>() { 1.0 } else { -1.0 };
            s * (u.powf(-0.5) - 1.0) * 1e-3
        })
        .collect()
}

fn time<F: FnMut() -> usize>(mut f: F) -> f64 {
    let t = Instant::now();
    let got = f();
    let s = t.elapsed().as_secs_f64();
    assert!(got > 0);
    s
}

/// Median and (min, max) of xs.
fn stats(xs: &mut [f64]) -> (f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    (xs[xs.len() / 2], xs[0], xs[xs.len() - 1])
}

/// Milliseconds to 3 significant digits.
fn ms(s: f64) -> String {
    let v = s * 1e3;
    let dec = (2 - v.abs().max(1e-9).log10().floor() as i32).clamp(0, 4) as usize;
    format!("{v:.dec$}")
}

fn cell((m, lo, hi): (f64, f64, f64)) -> String {
    format!("{} ({}–{})", ms(m), ms(lo), ms(hi))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parse = |i: usize, d: usize| -> usize {
        args.get(i).map_or(d, |s| {
            s.parse().unwrap_or_else(|_| {
                eprintln!("error: argument {}: '{s}' is not a count", i + 1);
                std::process::exit(2)
            })
        })
    };
    let n = parse(0, 28_949_319);
    let reps = parse(1, 3).max(1);
    let random = heavy_tailed(n, 7);
    let mut ascending = random.clone();
    ascending.sort_by(|a, b| a.abs().total_cmp(&b.abs()));
    println!(
        "n = {n}, {reps} interleaved repeats, ms as median (min–max), threads: {}",
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "all".into())
    );
    println!();
    println!(
        "| order | d | P | m = n/P | k_m | two-pass ms | heap ms | heap / two-pass | \
         two-pass speedup n→n/P | heap speedup n→n/P | Eq. 6 predicted |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (order, x) in [("random", &random), ("ascending", &ascending)] {
        for d in [0.001f64, 0.01] {
            let k = ((d * n as f64).round() as usize).max(1);
            let mut cases: Vec<(usize, usize, usize)> = vec![(1, n, k)];
            for p in [2usize, 4, 8] {
                cases.push((p, n / p, (k / p).max(1)));
            }
            // times[case][algo] over repeats, the cases interleaved within each repeat.
            let mut times = vec![[Vec::new(), Vec::new()]; cases.len()];
            for _ in 0..reps {
                for (c, &(_, m, km)) in cases.iter().enumerate() {
                    let s = &x[..m];
                    times[c][0].push(time(|| topk_indices(s, km).len()));
                    times[c][1].push(time(|| topk_heap(s, km).len()));
                }
            }
            let med: Vec<[(f64, f64, f64); 2]> = times
                .iter_mut()
                .map(|[a, b]| [stats(a), stats(b)])
                .collect();
            for (c, &(p, m, km)) in cases.iter().enumerate() {
                let (two, heap) = (med[c][0], med[c][1]);
                let (sp2, sph, pred) = if p == 1 {
                    ("".to_string(), "".to_string(), "".to_string())
                } else {
                    let pred =
                        (n as f64 * (k as f64).log2()) / (m as f64 * (km as f64).log2().max(1.0));
                    (
                        format!("{:.2}", med[0][0].0 / two.0),
                        format!("{:.2}", med[0][1].0 / heap.0),
                        format!("{pred:.2}"),
                    )
                };
                println!(
                    "| {order} | {d} | {p} | {m} | {km} | {} | {} | {:.2} | {sp2} | {sph} | {pred} |",
                    cell(two),
                    cell(heap),
                    heap.0 / two.0
                );
            }
        }
    }
}
