//! Throughput of tensor/1 Parquet I/O: writes and reads a dense trace of 1 GiB of f32 (by
//! default) with gradkit-core, and runs pipelines/bench/bench_io.py so pyarrow reads and
//! writes the same data in the same run. Each repetition runs every measurement once, in turn
//! (gradkit write, gradkit read, then pyarrow's), so both sides see the same machine load;
//! the table reports medians (and the minimum). Prints a Markdown table for docs/results/io.md.
//!
//!   cargo run --release -p gradtrace --example bench_io -- [GIB] [REPS] [DIR]
//!
//! `BENCH_IO_NO_PYTHON=1` skips pyarrow (for profiling the Rust side alone);
//! `BENCH_IO_WRITE_ONLY=1` runs only gradkit's `write` (for `perf record`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use gradkit_core::io::{read_tensor, Input, Meta, Output, ReadOptions, TableWriter};
use gradkit_core::synth::{self, LayerSpec, SynthSpec};
use gradkit_core::TensorRow;

// The global allocator every tool installs (lib/core/src/alloc.rs).
#[global_allocator]
static ALLOC: gradkit_core::alloc::BigAlloc = gradkit_core::alloc::BigAlloc;

/// Seconds of each repetition and the file size, per measurement name.
#[derive(Default)]
struct Samples(BTreeMap<String, (Vec<f64>, u64)>);

impl Samples {
    fn add(&mut self, name: &str, secs: f64, size: u64) {
        let e = self.0.entry(name.to_string()).or_default();
        e.0.push(secs);
        e.1 = size;
    }
    fn median(&self, name: &str) -> f64 {
        self.0.get(name).map_or(f64::NAN, |(v, _)| median(v))
    }
}

/// CPU seconds (user + system, all threads) this process has used, from /proc/self/stat.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses): utime, stime are 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(f64::NAN))
        .collect();
    // Clock ticks of 1/100 s (USER_HZ on Linux).
    f.get(11)
        .zip(f.get(12))
        .map_or(f64::NAN, |(u, s)| (u + s) / 100.0)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One run of bench_io.py on `path`; returns pyarrow's version.
fn run_python(path: &Path, samples: &mut Samples) -> Result<String> {
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../pipelines/bench/bench_io.py");
    let out = Command::new(&py)
        .arg(&script)
        .arg(path)
        .arg("1")
        .output()
        .with_context(|| format!("running {} (make deps creates the venv)", py.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "bench_io.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut version = String::new();
    for l in String::from_utf8(out.stdout)?.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f[0] == "pyarrow_version" {
            version = f[1].to_string();
        } else {
            samples.add(f[0], f[1].parse()?, f[3].parse()?);
            samples.add(&format!("{} cpu", f[0]), f[2].parse()?, f[3].parse()?);
        }
    }
    Ok(version)
}

const WRITE: &str = "gradkit-core write (TableWriter, 16 rows per write)";
const WRITE_OWNED: &str = "gradkit-core write_owned (TableWriter, 16 rows per write)";
const READ: &str = "gradkit-core read (read_tensor, validated rows)";

/// The dense trace of `gib` GiB: (rows, elements per layer, bytes of f32 values).
fn dense_rows(gib: f64) -> Result<(Vec<TensorRow>, u32, f64)> {
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
    Ok((rows, per_layer, raw))
}

/// Times gradkit's `write` of `rows` to `path` (wall and CPU seconds); returns the file size.
fn time_write(path: &Path, rows: &[TensorRow], s: &mut Samples) -> Result<u64> {
    // Every write starts without a file at its path, as pyarrow's does (replacing a 1 GB
    // file frees its page cache inside the timed rename).
    let _ = std::fs::remove_file(path);
    let (t, c) = (Instant::now(), cpu_seconds());
    let mut w = TableWriter::<TensorRow>::create(
        &Output::Path(path.to_path_buf()),
        &Meta::producer("bench_io"),
    )?;
    // One (step, rank) at a time, as gradtrace synthetic streams it.
    for chunk in rows.chunks(16) {
        w.write(chunk)?;
    }
    w.finish()?;
    let disk = std::fs::metadata(path)?.len();
    s.add(WRITE, t.elapsed().as_secs_f64(), disk);
    s.add(&format!("{WRITE} cpu"), cpu_seconds() - c, disk);
    Ok(disk)
}

/// Times gradkit's `write_owned` of `rows` to `path`, then its `read_tensor` of the file.
fn time_write_owned_read(
    path: &Path,
    rows: &[TensorRow],
    disk: u64,
    s: &mut Samples,
) -> Result<()> {
    // The consuming path (rows handed over, big `values` moved, not copied); the copy of
    // the rows is made before the clock starts.
    let owned: Vec<Vec<TensorRow>> = rows.chunks(16).map(|c| c.to_vec()).collect();
    let moved = path.with_extension("prev");
    std::fs::rename(path, &moved)?;
    let (t, c) = (Instant::now(), cpu_seconds());
    let mut w = TableWriter::<TensorRow>::create(
        &Output::Path(path.to_path_buf()),
        &Meta::producer("bench_io"),
    )?;
    for chunk in owned {
        w.write_owned(chunk)?;
    }
    w.finish()?;
    s.add(WRITE_OWNED, t.elapsed().as_secs_f64(), disk);
    s.add(&format!("{WRITE_OWNED} cpu"), cpu_seconds() - c, disk);
    std::fs::remove_file(&moved)?;

    let (t, c) = (Instant::now(), cpu_seconds());
    let back = read_tensor(&Input::Path(path.to_path_buf()), ReadOptions::default())?;
    s.add(READ, t.elapsed().as_secs_f64(), disk);
    s.add(&format!("{READ} cpu"), cpu_seconds() - c, disk);
    assert_eq!(back.rows.len(), rows.len());
    drop(back);
    Ok(())
}

/// The stderr line of repetition `rep` (0-based): the seconds of each measurement.
fn report_rep(rep: usize, s: &Samples) {
    eprintln!(
        "rep {}: write {:.2} s, write_owned {:.2} s, read {:.2} s, pyarrow write {:.2} s, read {:.2} s",
        rep + 1,
        s.0[WRITE].0[rep],
        s.0[WRITE_OWNED].0[rep],
        s.0[READ].0[rep],
        s.0.get("pyarrow_write_zstd1_bss")
            .map_or(f64::NAN, |v| v.0[rep]),
        s.0.get("pyarrow_read").map_or(f64::NAN, |v| v.0[rep]),
    );
}

/// The Markdown table: median, minimum, MB/s, CPU seconds and file size per measurement.
fn print_table(s: &Samples, version: &str, nrows: usize, per_layer: u32, raw: f64, reps: usize) {
    println!(
        "Dense trace: {} rows × {} f32 = {:.3} GB of values ({:.2} GiB); median (min) of {reps} interleaved repetitions.",
        nrows,
        per_layer,
        raw / 1e9,
        raw / (1u64 << 30) as f64
    );
    println!();
    println!(
        "| what | median s | min s | MB/s at median (f32 payload) | CPU s (median) | file MB |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let order = [
        WRITE,
        WRITE_OWNED,
        READ,
        "pyarrow_read",
        "pyarrow_write_zstd1_bss",
        "pyarrow_read_own_zstd1_bss",
        "pyarrow_write_defaults",
    ];
    for n in order {
        let Some((v, size)) = s.0.get(n) else {
            continue;
        };
        let m = median(v);
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let what = if n.starts_with("pyarrow") {
            format!("pyarrow {version} {n}")
        } else {
            n.to_string()
        };
        println!(
            "| {what} | {m:.2} | {min:.2} | {:.0} | {:.2} | {:.0} |",
            raw / 1e6 / m,
            s.median(&format!("{n} cpu")),
            *size as f64 / 1e6
        );
    }
}

/// The ratios of gradkit's medians to pyarrow's (read speed, write time, CPU time).
fn print_ratios(s: &Samples) {
    println!();
    println!(
        "read: gradkit {:.2}x pyarrow's read_table speed (same file); write: gradkit takes {:.2}x pyarrow's write_table time (same settings; write_owned {:.2}x), {:.2}x (pyarrow defaults); CPU time: write {:.2}x pyarrow's, read {:.2}x",
        s.median("pyarrow_read") / s.median(READ),
        s.median(WRITE) / s.median("pyarrow_write_zstd1_bss"),
        s.median(WRITE_OWNED) / s.median("pyarrow_write_zstd1_bss"),
        s.median(WRITE) / s.median("pyarrow_write_defaults"),
        s.median(&format!("{WRITE} cpu")) / s.median("pyarrow_write_zstd1_bss cpu"),
        s.median(&format!("{READ} cpu")) / s.median("pyarrow_read cpu"),
    );
    // The same ratios within each repetition (its measurements ran back to back), whose
    // min–max make bench's goals print beside the ratio of medians.
    let per_rep = |num: &str, den: &str| -> String {
        let (a, b) = (&s.0[num].0, &s.0[den].0);
        let v: Vec<String> = a
            .iter()
            .zip(b)
            .map(|(x, y)| format!("{:.2}", x / y))
            .collect();
        v.join(", ")
    };
    println!(
        "per repetition: read speed {}; write time {}",
        per_rep("pyarrow_read", READ),
        per_rep(WRITE, "pyarrow_write_zstd1_bss"),
    );
}

/// Runs REPS interleaved repetitions of every measurement and prints the table.
fn main() -> Result<()> {
    // The allocator setting every tool runs with (`cli::run`); MALLOC_ARENA_MAX=8 compares.
    gradkit_core::cli::tune_allocator();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let gib: f64 = args.first().map_or(Ok(1.0), |s| s.parse())?;
    let reps: usize = args.get(1).map_or(Ok(3), |s| s.parse())?;
    let dir = PathBuf::from(args.get(2).map_or("data/out", |s| s.as_str()));
    let write_only = std::env::var_os("BENCH_IO_WRITE_ONLY").is_some();
    let python = std::env::var_os("BENCH_IO_NO_PYTHON").is_none() && !write_only;
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("bench_io.parquet");
    let (rows, per_layer, raw) = dense_rows(gib)?;

    let mut s = Samples::default();
    let mut version = String::new();
    for rep in 0..reps {
        let disk = time_write(&path, &rows, &mut s)?;
        if write_only {
            eprintln!("rep {}: write {:.2} s", rep + 1, s.0[WRITE].0[rep]);
            continue;
        }
        time_write_owned_read(&path, &rows, disk, &mut s)?;
        if python {
            version = run_python(&path, &mut s)?;
        }
        report_rep(rep, &s);
    }

    print_table(&s, &version, rows.len(), per_layer, raw, reps);
    if python {
        print_ratios(&s);
    }
    std::fs::remove_file(&path)?;
    Ok(())
}
