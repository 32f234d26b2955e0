//! Throughput of tensor/1 Parquet I/O: writes and reads a dense trace of 1 GiB of f32 (by
//! default) with gradkit-core, then runs pipelines/bench/bench_io.py so pyarrow reads and
//! writes the same data in the same run. Prints a Markdown table for docs/results/io.md.
//!
//!   cargo run --release -p gradtrace --example bench_io -- [GIB] [REPS] [DIR]

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use gradkit_core::io::{read_tensor, Input, Meta, Output, ReadOptions, TableWriter};
use gradkit_core::synth::{self, LayerSpec, SynthSpec};
use gradkit_core::TensorRow;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let gib: f64 = args.first().map_or(Ok(1.0), |s| s.parse())?;
    let reps: usize = args.get(1).map_or(Ok(2), |s| s.parse())?;
    let dir = PathBuf::from(args.get(2).map_or("data/out", |s| s.as_str()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("bench_io.parquet");

    // 16 layers × 4 ranks × 1 step of 4 Mi f32 each = 1 GiB; realistic values (heavy tails).
    let per_layer = ((gib * (1u64 << 30) as f64) / 4.0 / 64.0) as u32;
    let layers = (0..16)
        .map(|i| LayerSpec::new(&format!("layer{i}.weight"), &[per_layer]))
        .collect();
    let spec = SynthSpec::new(layers, 4, 1, 1);
    let t = Instant::now();
    let rows: Vec<TensorRow> = synth::generate(&spec)?;
    let raw = rows.iter().map(|r| r.values.len() * 4).sum::<usize>() as f64;
    eprintln!(
        "generated {:.0} MB in {:.1} s",
        raw / 1e6,
        t.elapsed().as_secs_f64()
    );

    let mut write_s = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        let mut w = TableWriter::<TensorRow>::create(
            &Output::Path(path.clone()),
            &Meta::producer("bench_io"),
        )?;
        // One (step, rank) at a time, as gradtrace synthetic streams it.
        for chunk in rows.chunks(16) {
            w.write(chunk)?;
        }
        w.finish()?;
        write_s = write_s.min(t.elapsed().as_secs_f64());
    }
    let disk = std::fs::metadata(&path)?.len();
    let mut read_s = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        let back = read_tensor(&Input::Path(path.clone()), ReadOptions::default())?;
        read_s = read_s.min(t.elapsed().as_secs_f64());
        assert_eq!(back.rows.len(), rows.len());
    }

    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../pipelines/bench/bench_io.py");
    let out = Command::new(&py)
        .arg(&script)
        .arg(&path)
        .arg(reps.to_string())
        .output()
        .with_context(|| format!("running {} (make deps creates the venv)", py.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "bench_io.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut py_rows = Vec::new();
    let mut version = String::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f[0] == "pyarrow_version" {
            version = f[1].to_string();
        } else {
            py_rows.push((f[0].to_string(), f[1].parse::<f64>()?, f[2].parse::<u64>()?));
        }
    }
    let get = |n: &str| {
        py_rows
            .iter()
            .find(|r| r.0 == n)
            .map(|r| r.1)
            .unwrap_or(f64::NAN)
    };

    println!(
        "Dense trace: {} rows × {} f32 = {:.3} GB of values ({:.2} GiB); best of {reps}.",
        rows.len(),
        per_layer,
        raw / 1e9,
        raw / (1u64 << 30) as f64
    );
    println!();
    println!("| what | seconds | MB/s (f32 payload) | file MB |");
    println!("|---|---:|---:|---:|");
    let line = |what: &str, s: f64, size: u64| {
        println!(
            "| {what} | {s:.2} | {:.0} | {:.0} |",
            raw / 1e6 / s,
            size as f64 / 1e6
        )
    };
    line(
        "gradkit-core write (TableWriter, zstd 1, BYTE_STREAM_SPLIT)",
        write_s,
        disk,
    );
    line(
        "gradkit-core read (read_tensor, validated rows)",
        read_s,
        disk,
    );
    for (n, s, size) in &py_rows {
        line(&format!("pyarrow {version} {n}"), *s, *size);
    }
    println!();
    println!(
        "read: gradkit {:.2}x pyarrow's read_table of the same file; write: gradkit takes {:.2}x pyarrow's write_table time (same settings), {:.2}x (pyarrow defaults)",
        get("pyarrow_read") / read_s,
        write_s / get("pyarrow_write_zstd1_bss"),
        write_s / get("pyarrow_write_defaults"),
    );
    std::fs::remove_file(&path)?;
    Ok(())
}
