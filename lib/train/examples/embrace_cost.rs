//! EmbRace Table 2 (embrace.md §3) for one embedding table: predicted bytes per rank and
//! α-β time of AlltoAll, sparse AllGather and dense ring AllReduce at P = 2…8, and the
//! gradient density above which AlltoAll is faster than AllGather.
//!
//! cargo run --release -p gradkit-train --example embrace_cost -- V D DENSITY [ALPHA_US GBPS]
//! (DENSITY = αM/M, e.g. tokens per rank / V). Prints a Markdown table.

use gradkit_collectives::cost::{ring, sparse_allgather, sparse_alltoall};

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: f64| a.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(d);
    let (v, d, dens) = (num(0, 50_000.0), num(1, 64.0), num(2, 0.0026));
    let (alpha, gbps) = (num(3, 5.0) * 1e-6, num(4, 10.0));
    let beta = 4.0 / (gbps * 1e9); // seconds per 4-byte word
    let m = v * d; // words
    println!(
        "M = {v} × {d} words = {:.1} MB, density α = {dens}, α-β: {} µs, {gbps} GB/s",
        4.0 * m / 1e6,
        alpha * 1e6
    );
    println!();
    println!("| P | AlltoAll bytes | AllGather bytes | ring (dense) bytes | AlltoAll µs | AllGather µs | ring µs | AlltoAll faster than AllGather above density |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in 2..=8usize {
        let (x, g, r) = (
            sparse_alltoall(p, m, dens),
            sparse_allgather(p, m, dens),
            ring(p, m),
        );
        // Both times are linear in the density: t = lat·α + dens·w1·β.
        let (x1, g1) = (sparse_alltoall(p, m, 1.0), sparse_allgather(p, m, 1.0));
        let slope = (g1.words - x1.words) * beta;
        let cross = if slope > 0.0 {
            format!("{:.2e}", (x.latency - g.latency) * alpha / slope)
        } else {
            "never".into()
        };
        println!(
            "| {p} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {cross} |",
            x.bytes(),
            g.bytes(),
            r.bytes(),
            x.time(alpha, beta) * 1e6,
            g.time(alpha, beta) * 1e6,
            r.time(alpha, beta) * 1e6
        );
    }
}
