//! Ok-Topk Table 1, measured: words sent per rank and time per allreduce of every sparse
//! algorithm (and the dense ones) on a bert-base-shaped synthetic trace.
//!
//! ```text
//! cargo run --release -p gradkit-collectives --example bench_sparse -- [SCALE] [P,P,...] [DENSITY] [SHAPE]
//! ```
//! SCALE (default 0.15324, about 2^24 elements) shrinks the SHAPE's layers (default bert-base;
//! any `gradtrace synthetic --shape`); P list default 4,8; density default 0.01. Two steps
//! run; step 1 is reported (for Ok-Topk a reuse step with τ' = 32, regions from step 0). Every sparse algorithm gets the same input: each rank's exact
//! local top-k of its gradient (`Flat::Sparse`), except Gaussiank (its Gaussian-threshold
//! selection, made here) and DEFT (dense input, its own disjoint selection; its selection
//! time is subtracted and shown apart). Ranks are threads of one process (Local backend).
//! Error feedback is on, as `gradselect` does it: the selections of step t are taken from
//! acc_t = g_t + residual_{t−1} and the residual keeps acc_t with the selected entries zeroed;
//! algorithms fed dense input (DEFT, and Ok-Topk's second row: its own local selection, the
//! one-pass threshold reuse (docs/MEMORY.md), timed apart in the select column) keep their own
//! residual (`residual: true`). The time of the exact top-k that makes the top-k input is
//! printed on stderr (per rank and step), to set beside the dense-input row.

use std::time::Instant;

use gradkit_collectives::registry::Params;
use gradkit_collectives::{cost, make_reducer, Flat};
use gradkit_comm::run_local;
use gradkit_core::synth::{shape, Generator, SynthSpec};
use gradkit_core::trace::{flatten_dense, Layout, Sparse};
use gradkit_sparsify::topk;

fn gather(x: &[f32], idx: Vec<u32>) -> Sparse {
    let values = idx.iter().map(|&i| x[i as usize]).collect();
    Sparse {
        indices: idx,
        values,
    }
}

/// Selections `select(acc_t)` per step and rank with gradselect's error feedback:
/// acc_t = g_t + residual_{t−1}, residual_t = acc_t with the selected entries zeroed.
fn with_feedback(dense: &[Vec<Vec<f32>>], select: impl Fn(&[f32]) -> Vec<u32>) -> Vec<Vec<Flat>> {
    let ranks = dense[0].len();
    let mut res: Vec<Vec<f32>> = vec![vec![0.0; dense[0][0].len()]; ranks];
    dense
        .iter()
        .map(|st| {
            st.iter()
                .zip(res.iter_mut())
                .map(|(g, r)| {
                    let acc: Vec<f32> = g.iter().zip(r.iter()).map(|(a, b)| a + b).collect();
                    let idx = select(&acc);
                    let sel = gather(&acc, idx.clone());
                    *r = acc;
                    for i in idx {
                        r[i as usize] = 0.0;
                    }
                    Flat::Sparse(sel)
                })
                .collect()
        })
        .collect()
}

/// The words a rank sends per allreduce by Ok-Topk Table 1 (a range for topkdsa and oktopk).
fn table1_words(algo: &str, p: usize, nf: f64, kf: f64) -> String {
    match algo {
        "topkdsa" => format!(
            "{:.0} … {:.0}",
            gradkit_collectives::sparse::topkdsa::cost_best(p, kf).words,
            gradkit_collectives::sparse::topkdsa::cost_worst(p, nf, kf).words
        ),
        "oktopk" => format!(
            "{:.0} … {:.0}",
            gradkit_collectives::sparse::oktopk::cost_best(p, kf).words,
            gradkit_collectives::sparse::oktopk::cost_worst(p, kf).words
        ),
        a => gradkit_collectives::Algo::cost_by_name(a, p, nf, kf)
            .map_or("–".into(), |c| format!("{:.0}", c.words)),
    }
}

/// The dense gradients `dense[step][rank]` of the synthetic trace and their layout.
fn synth_dense(model: &str, scale: f64, p: usize) -> anyhow::Result<(Layout, Vec<Vec<Vec<f32>>>)> {
    let spec = SynthSpec::new(shape(model, scale)?, p as u32, 2, 1);
    let gen = Generator::new(&spec)?;
    let mut layout = Layout::default();
    // dense[step][rank]
    let mut dense: Vec<Vec<Vec<f32>>> = vec![Vec::new(), Vec::new()];
    for rows in gen {
        if layout.layers.is_empty() {
            layout = Layout::of_rows(&rows);
        }
        let refs: Vec<_> = rows.iter().collect();
        dense[rows[0].step as usize].push(flatten_dense(&refs));
    }
    Ok((layout, dense))
}

/// What rank's last step measured: (bytes sent, seconds, selection seconds, nnz out, phases).
type StepResult = (u64, f64, f64, usize, String);

/// Runs `algo` on P Local ranks over every step of `ins`; returns each rank's last step.
fn run_algo(
    p: usize,
    algo: &str,
    ins: &[Vec<Flat>],
    layout: &Layout,
    params: &Params,
) -> anyhow::Result<Vec<StepResult>> {
    run_local(p, |comm| {
        let mut red = make_reducer(algo, params)?;
        let mut last = (0u64, 0f64, 0f64, 0usize, String::new());
        for (t, st) in ins.iter().enumerate() {
            let x = st[comm.rank()].clone();
            comm.barrier()?;
            comm.traffic().reset();
            let t0 = Instant::now();
            let o = red.reduce(comm, t as u32, layout, x)?;
            let secs = t0.elapsed().as_secs_f64();
            let sel = o
                .metrics
                .iter()
                .find(|m| m.0 == "time_select_s")
                .map_or(0.0, |m| m.1);
            let nnz = match &o.result {
                Flat::Sparse(s) => s.len(),
                Flat::Dense(d) => d.len(),
            };
            let phases: Vec<String> = comm
                .traffic()
                .snapshot()
                .iter()
                .filter(|(_, c)| c.seconds > 0.0 || c.bytes_sent > 0)
                .map(|(k, c)| format!("{k} {:.1} / {}", c.seconds * 1e3, c.bytes_sent / 4))
                .collect();
            last = (
                comm.traffic().total().bytes_sent,
                secs,
                sel,
                nnz,
                phases.join(", "),
            );
        }
        Ok(last)
    })
}

/// One table row: words per rank (mean, max), Table 1's words, time and selection time.
fn print_row(p: usize, algo: &str, input: &str, outs: &[StepResult], n: u64, k: usize) {
    let words: Vec<f64> = outs.iter().map(|o| o.0 as f64 / 4.0).collect();
    let mean = words.iter().sum::<f64>() / p as f64;
    let max = words.iter().copied().fold(0.0, f64::max);
    let time = outs.iter().map(|o| o.1 - o.2).fold(0.0, f64::max);
    let sel = outs.iter().map(|o| o.2).fold(0.0, f64::max);
    let f = if algo == "deft" {
        "–".to_string()
    } else {
        table1_words(algo, p, n as f64, k as f64)
    };
    println!(
        "| {p} | {algo} | {input} | {mean:.0} | {max:.0} | {f} | {:.1} | {:.1} | {} | {} |",
        time * 1e3,
        sel * 1e3,
        outs[0].3,
        outs[0].4
    );
}

/// The rows of one P: the inputs (top-k, Gaussiank, dense) made, then every algorithm run.
fn bench_p(p: usize, model: &str, scale: f64, density: f64) -> anyhow::Result<()> {
    let (layout, dense) = synth_dense(model, scale, p)?;
    let n = layout.total();
    let params = Params {
        keep: gradkit_core::keep::Keep::Density(density),
        residual: true,
        ..Params::default()
    };
    let k = params.k_for(n) as usize;
    eprintln!("P={p}: n={n}, k={k}; selecting…");
    let t0 = Instant::now();
    let topk_in = with_feedback(&dense, |acc| topk::topk_indices(acc, k));
    eprintln!(
        "P={p}: exact top-k of the input: {:.1} ms per rank and step (one thread at a time)",
        t0.elapsed().as_secs_f64() * 1e3 / (2 * p) as f64
    );
    let gauss_in = with_feedback(&dense, |acc| gradkit_sparsify::gaussiank::select(acc, k).0);
    let dense_in: Vec<Vec<Flat>> = dense
        .iter()
        .map(|st| st.iter().cloned().map(Flat::Dense).collect())
        .collect();
    drop(dense);
    let runs: Vec<(&str, &str, &Vec<Vec<Flat>>)> = vec![
        ("ring", "dense", &dense_in),
        ("rabenseifner", "dense", &dense_in),
        ("topka", "top-k", &topk_in),
        ("topkdsa", "top-k", &topk_in),
        ("gtopk", "top-k", &topk_in),
        ("gaussiank", "gaussian", &gauss_in),
        ("oktopk", "top-k", &topk_in),
        ("oktopk", "dense", &dense_in),
        ("deft", "dense", &dense_in),
    ];
    for (algo, input, ins) in runs {
        let outs = run_algo(p, algo, ins, &layout, &params)?;
        print_row(p, algo, input, &outs, n, k);
    }
    eprintln!(
        "P={p}: n={n}, k={k}, 2n(P−1)/P = {:.0} words",
        cost::dense(p, n as f64).words
    );
    Ok(())
}

/// Parses SCALE, P list, DENSITY and SHAPE and prints the table, one P at a time.
fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let scale: f64 = args.get(1).map_or(Ok(0.15324), |s| s.parse())?;
    let ps: Vec<usize> = args
        .get(2)
        .map_or("4,8", |s| s.as_str())
        .split(',')
        .map(|x| x.parse())
        .collect::<Result<_, _>>()?;
    let density: f64 = args.get(3).map_or(Ok(0.01), |s| s.parse())?;
    let model = args.get(4).map_or("bert-base", |s| s.as_str());
    println!("| P | algo | input | words/rank (mean) | words/rank (max) | Table 1 words | time/allreduce (ms) | select (ms) | nnz out | phases, rank 0 (ms / words sent) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &p in &ps {
        bench_p(p, model, scale, density)?;
    }
    Ok(())
}
