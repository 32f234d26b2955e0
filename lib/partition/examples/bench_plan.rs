//! Plan time of DEFT and Ok-Topk for BERT-base shapes (109,482,240 parameters) at P = 8, 64,
//! 256. Run: `cargo run --release -p gradkit-partition --example bench_plan [REPS]`.
//!
//! Prints one Markdown row per (method, P): the median over REPS runs of each stage.

use std::time::Instant;

use gradkit_core::trace::Layout;
use gradkit_partition::{deft, oktopk};

/// BERT-base (uncased) parameter sizes in Hugging Face `BertModel` order.
fn bert_base() -> Vec<(String, u64)> {
    const H: u64 = 768;
    const FF: u64 = 3072;
    let mut v = vec![
        ("embeddings.word_embeddings.weight".to_string(), 30522 * H),
        ("embeddings.position_embeddings.weight".into(), 512 * H),
        ("embeddings.token_type_embeddings.weight".into(), 2 * H),
        ("embeddings.LayerNorm.weight".into(), H),
        ("embeddings.LayerNorm.bias".into(), H),
    ];
    for i in 0..12 {
        let p = format!("encoder.layer.{i}");
        for m in ["query", "key", "value"] {
            v.push((format!("{p}.attention.self.{m}.weight"), H * H));
            v.push((format!("{p}.attention.self.{m}.bias"), H));
        }
        v.push((format!("{p}.attention.output.dense.weight"), H * H));
        v.push((format!("{p}.attention.output.dense.bias"), H));
        v.push((format!("{p}.attention.output.LayerNorm.weight"), H));
        v.push((format!("{p}.attention.output.LayerNorm.bias"), H));
        v.push((format!("{p}.intermediate.dense.weight"), FF * H));
        v.push((format!("{p}.intermediate.dense.bias"), FF));
        v.push((format!("{p}.output.dense.weight"), H * FF));
        v.push((format!("{p}.output.dense.bias"), H));
        v.push((format!("{p}.output.LayerNorm.weight"), H));
        v.push((format!("{p}.output.LayerNorm.bias"), H));
    }
    v.push(("pooler.dense.weight".into(), H * H));
    v.push(("pooler.dense.bias".into(), H));
    v
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// BERT-base's layout (109,482,240 parameters), one layer per parameter tensor.
fn bert_layout() -> Layout {
    let layout = Layout::new(
        bert_base()
            .into_iter()
            .enumerate()
            .map(|(i, (name, n))| (i as u32, name, n, None))
            .collect(),
    );
    assert_eq!(layout.total(), 109_482_240);
    layout
}

/// A deterministic, layer-dependent "gradient" (xorshift values, per-layer scale).
fn gradient(layout: &Layout) -> Vec<f32> {
    let mut flat = Vec::with_capacity(layout.total() as usize);
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    for (li, l) in layout.layers.iter().enumerate() {
        let scale = 1.0 + (li % 7) as f32;
        for _ in 0..l.numel {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            flat.push(((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale);
        }
    }
    flat
}

/// Ok-Topk input: 8 ranks' sorted selections of k indices each (every 100th + jitter).
fn oktopk_selections(k: u64) -> Vec<Vec<u32>> {
    (0..8u64)
        .map(|r| {
            (0..k)
                .map(|i| (i * 100 + (i * 31 + r * 7) % 100) as u32)
                .collect()
        })
        .collect()
}

/// The DEFT rows: median time of each planning stage over `reps` runs, per P.
fn deft_rows(layout: &Layout, flat: &[f32], k: u64, reps: usize) {
    for p in [8usize, 64, 256] {
        // computed once per run (deft.md §1.1), not per step
        let pieces = deft::pieces(layout, p);
        let (mut tn, mut ta, mut tb, mut tr, mut tt) = (vec![], vec![], vec![], vec![], vec![]);
        let mut nrows = 0;
        for rep in 0..reps {
            let t0 = Instant::now();
            let norms = deft::piece_norms(layout, &pieces, flat);
            tn.push(ms(t0));
            let t = Instant::now();
            let ks = deft::allocate_k(&pieces, &norms, k, false);
            ta.push(ms(t));
            let t = Instant::now();
            let bins = deft::bin_pack(&pieces, &ks, p);
            tb.push(ms(t));
            let t = Instant::now();
            let rows = deft::plan_rows(layout, &pieces, &ks, &bins, p, rep as u32);
            tr.push(ms(t));
            tt.push(ms(t0));
            nrows = rows.len();
        }
        println!(
            "| deft | {p} | {} | {:.1} | {:.3} | {:.3} | {:.3} | {:.1} | {nrows} |",
            pieces.len(),
            median(tn),
            median(ta),
            median(tb),
            median(tr),
            median(tt)
        );
    }
}

/// The Ok-Topk rows: median time of boundaries + region rows over `reps` runs, per P.
fn oktopk_rows(layout: &Layout, refs: &[&[u32]], n: u64, reps: usize) {
    for p in [8usize, 64, 256] {
        let mut tt = vec![];
        let mut nrows = 0;
        for _ in 0..reps {
            let t = Instant::now();
            let b = oktopk::balanced_boundaries(refs, p, n);
            let rows = oktopk::region_rows(layout, &b, 0);
            tt.push(ms(t));
            nrows = rows.len();
        }
        println!(
            "| oktopk (8 ranks × k selected) | {p} | - | - | - | - | - | {:.3} | {nrows} |",
            median(tt)
        );
    }
}

/// For scale: the time of one plain top-k threshold over the whole model (what selection costs).
fn reference_topk(flat: &[f32], n: u64, k: u64) {
    let t = Instant::now();
    let mut keys: Vec<u32> = flat.iter().map(|v| v.to_bits() & 0x7fff_ffff).collect();
    let pos = keys.len() - k as usize;
    keys.select_nth_unstable(pos);
    println!();
    println!(
        "reference: one exact top-k threshold over all {n} values (select_nth_unstable): {:.1} ms",
        ms(t)
    );
}

/// Plans BERT-base with DEFT and Ok-Topk at P = 8, 64, 256 and prints the stage times.
fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let layout = bert_layout();
    let n = layout.total();
    let flat = gradient(&layout);
    let k = n / 100;
    let sels = oktopk_selections(k);
    let refs: Vec<&[u32]> = sels.iter().map(|s| s.as_slice()).collect();
    println!("BERT-base, n = {n}, k = {k} (density 0.01), median of {reps} runs, ms");
    println!();
    println!(
        "| method | P | pieces | norms | allocate_k | bin_pack | rows | total plan | plan rows |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    deft_rows(&layout, &flat, k, reps);
    oktopk_rows(&layout, &refs, n, reps);
    reference_topk(&flat, n, k);
}
