//! Benchmarks of the 1-bit compressed allreduce and EmbRace's AlltoAll exchange
//! (docs/results/onebit-embrace.md). Run:
//!
//! ```text
//! cargo run --release -p gradkit-collectives --example bench_onebit [-- MiB [iters]]
//! ```
//!
//! 1. 1-bit vs fp32 ring vs native allreduce on a 64 MiB buffer, P = 4 Local ranks: bytes
//!    sent per rank and time per call (median over `iters`, after one warm-up call).
//! 2. Pack / unpack throughput, one thread, GB/s of f32 data; every kernel against one
//!    streaming pass `dst[i] = a·src[i]` over the same buffer (read n floats, write n
//!    floats: the memory-bandwidth reference (docs/MEMORY.md)), as `streaming time / kernel time` and as the memory
//!    bandwidth it reaches (the buffer-sized streams it must move × 4n bytes / time); the
//!    worker compressor and the server stage against the pre-issue-19 kernels kept here as
//!    `legacy_compress` / `legacy_server` (checked bit-identical first); medians of
//!    interleaved rounds.
//! 3. EmbRace on a Zipf token batch (vocab 100k, d 512, P = 4 and 8): bytes per rank of
//!    AlltoAll-columns vs AlltoAll-rows vs AllGather vs dense allreduce, and the per-rank load
//!    imbalance (max/mean of bytes received by the owners) of the row vs the column split.

use std::time::Instant;

use gradkit_collectives::alltoall::{embedding_forward, exchange, slice, sparse_allgather, Rows};
use gradkit_collectives::onebit::{
    compress_into, compress_with_feedback, pack_and_feedback, pack_signs, rms, unpack_accumulate,
    unpack_scaled, OneBitState, Variant,
};
use gradkit_collectives::registry::Split;
use gradkit_comm::{run_local, Comm, World};
use gradkit_sparsify::onebit::{
    compress_deferred, portable, server_sum_deferred, server_sum_sq, settle_errors, settled_sum_sq,
};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn gb(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// One allreduce per iteration on every rank; returns (bytes sent per rank per call,
/// median seconds per call measured on rank 0 between barriers, rank 0's median seconds per
/// phase, minor page faults per timed call of rank 0's whole process — all Local ranks
/// together, one rank under mpirun).
fn time_allreduce(
    world: &World,
    n: usize,
    iters: usize,
    algo: &str,
) -> (u64, f64, Vec<(String, f64)>, f64) {
    let p = world.size();
    let res = world
        .run(|comm| {
            let mut g = Rng(comm.rank() as u64 + 1);
            let mut data: Vec<f32> = (0..n).map(|_| (g.unit() - 0.5) as f32).collect();
            let mut st = OneBitState::new(Variant::Server, p, n);
            let mut times = Vec::new();
            let mut phases: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
            let mut sent = 0;
            let mut faults = 0;
            // The ring's message buffer, kept across calls as `DenseReducer` keeps it.
            let mut ring_scratch = Vec::new();
            for it in 0..=iters {
                comm.traffic().reset();
                comm.barrier()?;
                let f0 = minor_faults();
                let t = Instant::now();
                match algo {
                    "onebit" => st.allreduce(comm, &mut data)?,
                    "ring" => gradkit_collectives::dense::ring_with_scratch(
                        comm,
                        &mut data,
                        &mut ring_scratch,
                    )?,
                    "native" => gradkit_collectives::dense::native(comm, &mut data)?,
                    _ => unreachable!(),
                }
                comm.barrier()?;
                if it > 0 {
                    times.push(t.elapsed().as_secs_f64());
                    faults += minor_faults() - f0;
                    for (k, c) in comm.traffic().snapshot() {
                        phases.entry(k).or_default().push(c.seconds);
                    }
                }
                sent = comm.traffic().total().bytes_sent;
                // Keep magnitudes bounded across iterations (ring sums grow by P each call).
                if algo != "onebit" {
                    let inv = 1.0 / p as f32;
                    data.iter_mut().for_each(|v| *v *= inv);
                }
            }
            let phases = phases.into_iter().map(|(k, v)| (k, median(v))).collect();
            Ok((sent, median(times), phases, faults as f64 / iters as f64))
        })
        .expect("bench run");
    res.into_iter().next().expect("rank 0")
}

/// Minor page faults of this process so far (`/proc/self/stat` field 10; 0 elsewhere).
fn minor_faults() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace().nth(7)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Σ|x| with eight f32 lanes: one streaming read of the buffer (the reference pass).
fn sum_abs(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut it = x.chunks_exact(8);
    for c in &mut it {
        for j in 0..8 {
            lanes[j] += c[j].abs();
        }
    }
    lanes.iter().sum::<f32>() + it.remainder().iter().map(|v| v.abs()).sum::<f32>()
}

/// The streaming pass (docs/MEMORY.md): `dst[i] = a·src[i]` (one read and one write stream).
fn scale_copy(src: &[f32], dst: &mut [f32], a: f32) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = a * *s;
    }
}

/// The server stage (`server_sum_sq` + pack) as it was before buffer reuse (docs/MEMORY.md): eight lanes per
/// byte, the bit of lane j taken with a shift by `7 − j`, each packed bit and error one
/// scalar loop. Returns the server scale.
#[allow(clippy::needless_range_loop)] // the old code, as it was
fn legacy_server(msgs: &[(Vec<u8>, f32)], err: &mut [f32], out: &mut [u8]) -> f32 {
    let mut lanes = [0f64; 8];
    for (k, ec) in err.chunks_exact_mut(8).enumerate() {
        let mut z = [0f32; 8];
        for (b, s) in msgs {
            for j in 0..8 {
                let neg = (((b[k] >> (7 - j)) & 1) ^ 1) as u32;
                z[j] += f32::from_bits(s.to_bits() ^ (neg << 31));
            }
        }
        for j in 0..8 {
            ec[j] += z[j];
            lanes[j] += ec[j] as f64 * ec[j] as f64;
        }
    }
    let ss: f64 = lanes.iter().sum();
    let s = (ss / err.len() as f64).sqrt() as f32;
    for (c, byte) in err.chunks_exact_mut(8).zip(out.iter_mut()) {
        let mut b = 0u8;
        for (j, v) in c.iter_mut().enumerate() {
            let pos = *v >= 0.0;
            b |= (pos as u8) << (7 - j);
            *v -= if pos { s } else { -s };
        }
        *byte = b;
    }
    s
}

/// The server stage with settled errors: the library's sum pass (`server_sum_sq`) and its
/// pack + feedback pass.
fn new_server(msgs: &[(Vec<u8>, f32)], err: &mut [f32], out: &mut [u8]) -> f32 {
    let ss = server_sum_sq(msgs, err);
    let s = (ss / err.len() as f64).sqrt() as f32;
    pack_and_feedback(err, out, s);
    s
}

/// The server stage as `OneBitState` runs it: one pass with the error unsettled
/// (`server_sum_deferred`; `due` is the last call's scale, returned updated).
fn deferred_server(msgs: &[(Vec<u8>, f32)], err: &mut [f32], out: &mut [u8], due: f32) -> f32 {
    let ss = server_sum_deferred(msgs, err, due, out);
    (ss / err.len() as f64).sqrt() as f32
}

/// The worker compressor as it was before buffer reuse (docs/MEMORY.md) (`OneBitState::worker_compress`): pass 1
/// `e += x` with the f64 sum of squares, pass 2 a scalar pack + feedback over `e`.
fn legacy_compress(data: &[f32], e: &mut [f32], bits: &mut [u8]) -> f32 {
    let mut lanes = [0f64; 8];
    let (head, tail) = e.split_at_mut(data.len() / 8 * 8);
    for (c, x) in head.chunks_exact_mut(8).zip(data.chunks_exact(8)) {
        for j in 0..8 {
            c[j] += x[j];
            lanes[j] += c[j] as f64 * c[j] as f64;
        }
    }
    let mut ss: f64 = lanes.iter().sum();
    for (k, v) in tail.iter_mut().enumerate() {
        *v += data.get(head.len() + k).copied().unwrap_or(0.0);
        ss += *v as f64 * *v as f64;
    }
    let s = (ss / e.len() as f64).sqrt() as f32;
    for (c, byte) in e.chunks_exact_mut(8).zip(bits.iter_mut()) {
        let mut b = 0u8;
        for (j, v) in c.iter_mut().enumerate() {
            let pos = *v >= 0.0;
            b |= (pos as u8) << (7 - j);
            *v -= if pos { s } else { -s };
        }
        *byte = b;
    }
    s
}

/// The new worker compressor against [`legacy_compress`], bit for bit, over a few steps
/// (with padding, −0 and zero inputs mixed in).
fn check_compress_identical() {
    let mut g = Rng(77);
    for &(n, npad) in &[
        (8usize, 8usize),
        (13, 64),
        (1003, 1200),
        (4099, 4160),
        (1 << 16, 1 << 16),
    ] {
        let mut ea = vec![0f32; npad];
        let mut eb = vec![0f32; npad];
        let mut ed = vec![0f32; npad];
        let (mut ba, mut bb) = (vec![0u8; npad / 8], vec![0u8; npad / 8]);
        let mut bd = vec![0u8; npad / 8];
        let mut due = 0.0f32;
        for step in 0..4 {
            let x: Vec<f32> = (0..n)
                .map(|i| match (i + step) % 17 {
                    0 => -0.0,
                    1 => 0.0,
                    _ => (g.unit() - 0.5) as f32,
                })
                .collect();
            let sa = legacy_compress(&x, &mut ea, &mut ba);
            let sb = compress_with_feedback(&x, &mut eb, &mut bb);
            due = compress_deferred(&x, &mut ed, &mut bd, due);
            let mut settled = ed.clone();
            settle_errors(&mut settled, due);
            assert_eq!(sa.to_bits(), sb.to_bits(), "scale n={n} step {step}");
            assert_eq!(
                sa.to_bits(),
                due.to_bits(),
                "deferred scale n={n} step {step}"
            );
            assert_eq!(ba, bb, "bits n={n} step {step}");
            assert_eq!(ba, bd, "deferred bits n={n} step {step}");
            for e in [&eb, &settled] {
                assert!(
                    ea.iter().zip(e).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "error n={n} step {step}"
                );
            }
        }
    }
}

/// P = 4 messages of `len/8` random sign bytes with scales.
fn server_msgs(len: usize, g: &mut Rng) -> Vec<(Vec<u8>, f32)> {
    (0..4)
        .map(|m| {
            let b = (0..len / 8).map(|_| g.next() as u8).collect();
            (b, 0.05 + m as f32 / 64.0)
        })
        .collect()
}

/// The new server stage against [`legacy_server`], bit for bit, over a few steps.
fn check_server_identical() {
    let mut g = Rng(78);
    for len in [8usize, 40, 1000, 4096] {
        let (mut ea, mut eb, mut ed) = (vec![0f32; len], vec![0f32; len], vec![0f32; len]);
        let (mut ba, mut bb) = (vec![0u8; len / 8], vec![0u8; len / 8]);
        let mut bd = vec![0u8; len / 8];
        let mut due = 0.0f32;
        for step in 0..4 {
            let msgs = server_msgs(len, &mut g);
            let sa = legacy_server(&msgs, &mut ea, &mut ba);
            let sb = new_server(&msgs, &mut eb, &mut bb);
            due = deferred_server(&msgs, &mut ed, &mut bd, due);
            let mut settled = ed.clone();
            settle_errors(&mut settled, due);
            assert_eq!(sa.to_bits(), due.to_bits(), "deferred server scale");
            assert_eq!(ba, bd, "deferred server bits");
            assert!(
                ea.iter()
                    .zip(&settled)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "deferred server error len={len} step {step}"
            );
            assert_eq!(
                sa.to_bits(),
                sb.to_bits(),
                "server scale len={len} step {step}"
            );
            assert_eq!(ba, bb, "server bits len={len} step {step}");
            assert!(
                ea.iter().zip(&eb).all(|(a, b)| a.to_bits() == b.to_bits()),
                "server error len={len} step {step}"
            );
        }
    }
}

/// Seconds of one call of `f`.
fn time(f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// The pack / unpack rows, in the order [`PackBench::round`] times them.
// (name, buffer-sized streams the kernel must move (bits count 1/32), elements)
fn pack_rows(n: usize) -> [(&'static str, f64, usize); 18] {
    [
        ("streaming pass dst = a·src (reference)", 2.0, n),
        ("read-only pass Σ abs(x)", 1.0, n),
        ("memcpy", 2.0, n),
        ("rms (f64 sum of squares)", 1.0, n),
        (
            "worker compress: before (legacy, 2 passes)",
            5.0 + 1.0 / 32.0,
            n,
        ),
        (
            "worker compress: 2 passes (compress_with_feedback)",
            5.0 + 1.0 / 32.0,
            n,
        ),
        (
            "worker compress: 1 pass, deferred (OneBitState)",
            3.0 + 1.0 / 32.0,
            n,
        ),
        ("compress_into (in place on x+e)", 3.0 + 1.0 / 32.0, n),
        ("pack signs only", 1.0 + 1.0 / 32.0, n),
        ("unpack to ±scale", 1.0 + 1.0 / 32.0, n),
        ("unpack-accumulate", 2.0 + 1.0 / 32.0, n),
        (
            "server stage, n/4, P = 4: before (legacy)",
            4.0 + 5.0 / 32.0,
            n / 4,
        ),
        (
            "server stage: 2 passes (sum + pack)",
            4.0 + 5.0 / 32.0,
            n / 4,
        ),
        (
            "server stage: 1 pass, deferred (OneBitState)",
            2.0 + 5.0 / 32.0,
            n / 4,
        ),
        ("settled error norm (settled_sum_sq)", 1.0, n),
        ("streaming pass, n/4 (server rows' reference)", 2.0, n / 4),
        (
            "worker compress: 1 pass, baseline SSE2 build (no AVX2)",
            3.0 + 1.0 / 32.0,
            n,
        ),
        (
            "server stage: 1 pass, baseline SSE2 build (no AVX2)",
            2.0 + 5.0 / 32.0,
            n / 4,
        ),
    ]
}

/// The buffers and carried scales of the pack / unpack kernels.
// The worker's on n elements, the server stage's on one rank's chunk (n/4 of P = 4 messages).
struct PackBench {
    x: Vec<f32>,
    bits: Vec<u8>,
    out: Vec<f32>,
    work: Vec<f32>,
    e_old: Vec<f32>,
    e_new: Vec<f32>,
    e_def: Vec<f32>,
    due: f32,
    e_port: Vec<f32>,
    due_p: f32,
    msgs: Vec<(Vec<u8>, f32)>,
    es_old: Vec<f32>,
    es_new: Vec<f32>,
    es_def: Vec<f32>,
    due_s: f32,
    es_port: Vec<f32>,
    due_sp: f32,
    sbits: Vec<u8>,
}

impl PackBench {
    /// Random input and zeroed errors for `n` elements.
    fn new(n: usize) -> PackBench {
        let mut g = Rng(9);
        let x: Vec<f32> = (0..n).map(|_| (g.unit() - 0.5) as f32).collect();
        let work = x.clone();
        // The server stage on one rank's chunk (n/4 of P = 4 messages).
        let msgs = server_msgs(n / 4, &mut g);
        PackBench {
            x,
            bits: vec![0u8; n / 8],
            out: vec![0f32; n],
            work,
            e_old: vec![0f32; n],
            e_new: vec![0f32; n],
            e_def: vec![0f32; n],
            due: 0f32,
            e_port: vec![0f32; n],
            due_p: 0f32,
            msgs,
            es_old: vec![0f32; n / 4],
            es_new: vec![0f32; n / 4],
            es_def: vec![0f32; n / 4],
            due_s: 0f32,
            es_port: vec![0f32; n / 4],
            due_sp: 0f32,
            sbits: vec![0u8; n / 32],
        }
    }

    /// One interleaved round: the seconds of each kernel of [`pack_rows`], pushed onto `t`.
    fn round(&mut self, t: &mut [Vec<f64>]) {
        let n = self.x.len();
        let b = self;
        t[0].push(time(&mut || scale_copy(&b.x, &mut b.out, 0.5)));
        t[1].push(time(&mut || {
            std::hint::black_box(sum_abs(std::hint::black_box(&b.x)));
        }));
        t[2].push(time(&mut || b.work.copy_from_slice(&b.x)));
        t[3].push(time(&mut || {
            std::hint::black_box(rms(&b.x));
        }));
        t[4].push(time(&mut || {
            std::hint::black_box(legacy_compress(&b.x, &mut b.e_old, &mut b.bits));
        }));
        t[5].push(time(&mut || {
            std::hint::black_box(compress_with_feedback(&b.x, &mut b.e_new, &mut b.bits));
        }));
        t[6].push(time(&mut || {
            b.due = compress_deferred(&b.x, &mut b.e_def, &mut b.bits, b.due);
        }));
        t[7].push(time(&mut || {
            std::hint::black_box(compress_into(&mut b.work, &mut b.bits));
        }));
        t[8].push(time(&mut || pack_signs(&b.x, &mut b.bits)));
        t[9].push(time(&mut || unpack_scaled(&b.bits, 0.5, &mut b.out)));
        t[10].push(time(&mut || unpack_accumulate(&b.bits, 0.5, &mut b.out)));
        t[11].push(time(&mut || {
            std::hint::black_box(legacy_server(&b.msgs, &mut b.es_old, &mut b.sbits));
        }));
        t[12].push(time(&mut || {
            std::hint::black_box(new_server(&b.msgs, &mut b.es_new, &mut b.sbits));
        }));
        t[13].push(time(&mut || {
            b.due_s = deferred_server(&b.msgs, &mut b.es_def, &mut b.sbits, b.due_s);
        }));
        t[14].push(time(&mut || {
            std::hint::black_box(settled_sum_sq(&b.e_def, b.due));
        }));
        t[15].push(time(&mut || {
            scale_copy(&b.x[..n / 4], &mut b.out[..n / 4], 0.5)
        }));
        t[16].push(time(&mut || {
            b.due_p = portable::compress_deferred(&b.x, &mut b.e_port, &mut b.bits, b.due_p);
        }));
        t[17].push(time(&mut || {
            let ss = portable::server_sum_deferred(&b.msgs, &mut b.es_port, b.due_sp, &mut b.sbits);
            b.due_sp = (ss / b.es_port.len() as f64).sqrt() as f32;
        }));
    }
}

/// Pack / unpack throughput of every kernel against the streaming pass, as a table.
// The new kernels are checked bit-identical to the legacy ones first.
fn bench_pack(n: usize) {
    check_compress_identical();
    check_server_identical();
    let mut bench = PackBench::new(n);
    // Interleaved rounds: each kernel once per round, medians over rounds.
    let rounds = 11;
    let rows = pack_rows(n);
    let mut t: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    for _ in 0..rounds {
        bench.round(&mut t);
    }
    let m: Vec<f64> = t.into_iter().map(median).collect();
    print_pack_table(n, rounds, &rows, &m);
}

/// The pack / unpack table from the median seconds `m` of each row.
fn print_pack_table(n: usize, rounds: usize, rows: &[(&str, f64, usize)], m: &[f64]) {
    println!(
        "\n## pack / unpack, one thread, {} MiB of f32, medians of {rounds} interleaved rounds\n",
        (n * 4) >> 20
    );
    println!(
        "Reference: the streaming pass dst[i] = a·src[i] (read n floats, write n floats). \
         \"stream/kernel\" = streaming time / kernel time (docs/MEMORY.md's ratio; the server rows \
         against the n/4 streaming pass); \"memory GB/s\" = the buffer-sized streams the \
         kernel must move × 4·elements / time (the streaming pass moves 2).\n"
    );
    println!("| kernel | ms | GB/s (f32 bytes of x) | stream/kernel | streams | memory GB/s |");
    println!("|---|---|---|---|---|---|");
    for (i, (name, streams, elems)) in rows.iter().enumerate() {
        let reference = if *elems == n { m[0] } else { m[15] };
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            m[i] * 1e3,
            gb(elems * 4, m[i]),
            reference / m[i],
            streams,
            gb((streams * (elems * 4) as f64) as usize, m[i])
        );
    }
}

/// Zipf(s) over 0..v by inverse CDF (rank 0 the most frequent id).
struct Zipf {
    cdf: Vec<f64>,
}
impl Zipf {
    fn new(v: usize, s: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(v);
        let mut acc = 0.0;
        for k in 1..=v {
            acc += 1.0 / (k as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }
    fn sample(&self, g: &mut Rng) -> u32 {
        let u = g.unit();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) as u32
    }
}

fn phase_bytes(comm: &dyn Comm, name: &str) -> (u64, u64) {
    let s = comm.traffic().snapshot();
    s.get(name)
        .map(|c| (c.bytes_sent, c.bytes_recv))
        .unwrap_or((0, 0))
}

/// Each of the `p` ranks' `tokens` token ids, drawn from `zipf`.
fn zipf_ids(p: usize, tokens: usize, zipf: &Zipf) -> Vec<Vec<u32>> {
    (0..p)
        .map(|r| {
            let mut g = Rng(1000 + r as u64);
            (0..tokens).map(|_| zipf.sample(&mut g)).collect()
        })
        .collect()
}

/// One rank's EmbRace measurements (distinct rows, bytes and seconds of each exchange).
// Distinct rows; (bytes sent, received) of the column AlltoAll, the row AlltoAll, the sparse
// AllGather and the column lookup; seconds of the first three.
type EmbraceRank = (
    usize,
    (u64, u64),
    (u64, u64),
    (u64, u64),
    (u64, u64),
    f64,
    f64,
    f64,
);

/// Runs the three gradient exchanges and the forward lookup on `p` Local ranks.
fn embrace_run(p: usize, v: usize, d: usize, ids: &[Vec<u32>]) -> Vec<EmbraceRank> {
    run_local(p, |comm| {
        let r = comm.rank();
        let tokens = ids[r].len();
        let rows = Rows::new(ids[r].clone(), d, vec![1.0; tokens * d])?;
        let uniq = rows.coalesce().len();
        let t = Instant::now();
        exchange(comm, Split::Columns, v, &rows)?;
        let t_col = t.elapsed().as_secs_f64();
        let col = phase_bytes(comm, "alltoall");
        comm.traffic().reset();
        let t = Instant::now();
        exchange(comm, Split::Rows, v, &rows)?;
        let t_row = t.elapsed().as_secs_f64();
        let row = phase_bytes(comm, "alltoall");
        comm.traffic().reset();
        let t = Instant::now();
        sparse_allgather(comm, &rows)?;
        let t_ag = t.elapsed().as_secs_f64();
        let ag = phase_bytes(comm, "allgather_sparse");
        comm.traffic().reset();
        let w = slice(d, p, r).len();
        let shard = vec![0f32; v * w];
        embedding_forward(comm, &shard, v, d, ids)?;
        let fwd = phase_bytes(comm, "alltoall_forward");
        Ok((uniq, col, row, ag, fwd, t_col, t_row, t_ag))
    })
    .expect("embrace bench")
}

/// Row-split forward volume per owner (owners send full rows of the ids in their row range).
fn row_forward_bytes(p: usize, v: usize, d: usize, ids: &[Vec<u32>]) -> Vec<u64> {
    (0..p)
        .map(|k| {
            let rr = slice(v, p, k);
            (0..p)
                .filter(|&j| j != k)
                .map(|j| {
                    ids[j]
                        .iter()
                        .filter(|&&i| rr.contains(&(i as usize)))
                        .count()
                })
                .sum::<usize>() as u64
                * d as u64
                * 4
        })
        .collect()
}

/// Mean of `f(r)` over the ranks `0..p`.
fn mean_over(p: usize, f: &dyn Fn(usize) -> f64) -> f64 {
    (0..p).map(f).sum::<f64>() / p as f64
}

/// Maximum of `f(r)` over the ranks `0..p` (at least 0).
fn max_over(p: usize, f: &dyn Fn(usize) -> f64) -> f64 {
    (0..p).map(f).fold(0.0, f64::max)
}

/// Bytes in MiB.
fn mib(b: f64) -> f64 {
    b / (1 << 20) as f64
}

/// One scheme's row: MiB sent and received per rank, owner load max/mean, mean time.
// Owner load: what the shard owners handle — bytes received (gradient) or sent (lookup).
fn embrace_line(
    p: usize,
    name: &str,
    sent: &dyn Fn(usize) -> f64,
    recv: &dyn Fn(usize) -> f64,
    owner_sends: bool,
    t: Option<&dyn Fn(usize) -> f64>,
) {
    let load = if owner_sends { sent } else { recv };
    println!(
        "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}× | {} |",
        mib(mean_over(p, sent)),
        mib(max_over(p, sent)),
        mib(mean_over(p, recv)),
        mib(max_over(p, recv)),
        max_over(p, load) / mean_over(p, load),
        t.map(|f| format!("{:.1}", mean_over(p, f) * 1e3))
            .unwrap_or("–".into())
    );
}

/// The EmbRace table of one P: bytes per rank and owner load of every scheme and dense.
fn embrace_table(p: usize, v: usize, d: usize, ids: &[Vec<u32>], res: &[EmbraceRank]) {
    let m = (v * d * 4) as f64;
    let dense = 2.0 * (p as f64 - 1.0) / p as f64 * m;
    let row_fwd = row_forward_bytes(p, v, d, ids);
    println!("| scheme | MiB sent per rank: mean | max | MiB received per rank: mean | max | owner load max/mean | time (rank mean, ms) |");
    println!("|---|---|---|---|---|---|---|");
    embrace_line(
        p,
        "AlltoAll-columns, gradient (backward)",
        &|r| res[r].1 .0 as f64,
        &|r| res[r].1 .1 as f64,
        false,
        Some(&|r| res[r].5),
    );
    embrace_line(
        p,
        "AlltoAll-columns, lookup (forward)",
        &|r| res[r].4 .0 as f64,
        &|r| res[r].4 .1 as f64,
        true,
        None,
    );
    embrace_line(
        p,
        "AlltoAll-rows, gradient (backward)",
        &|r| res[r].2 .0 as f64,
        &|r| res[r].2 .1 as f64,
        false,
        Some(&|r| res[r].6),
    );
    embrace_line(
        p,
        "AlltoAll-rows, lookup (forward, counted)",
        &|r| row_fwd[r] as f64,
        &|r| {
            // rank r receives from every owner k≠r the rows of its ids in k's range
            let own = slice(v, p, r);
            ids[r]
                .iter()
                .filter(|&&i| !own.contains(&(i as usize)))
                .count() as f64
                * d as f64
                * 4.0
        },
        true,
        None,
    );
    embrace_line(
        p,
        "AllGather (sparse, coalesced, with ids)",
        &|r| res[r].3 .0 as f64,
        &|r| res[r].3 .1 as f64,
        false,
        Some(&|r| res[r].7),
    );
    println!(
        "| dense ring allreduce (2(P−1)/P·M, M = {:.1} MiB) | {:.2} | {:.2} | {:.2} | {:.2} | 1.00× | – |",
        mib(m),
        mib(dense),
        mib(dense),
        mib(dense),
        mib(dense)
    );
}

/// EmbRace on `p` ranks of `tokens` Zipf ids each: the table and the formula check.
// Vocab `v`, dimension `d`; the column AlltoAll's volume against embrace.md's formula.
fn bench_embrace(p: usize, v: usize, d: usize, tokens: usize, zipf: &Zipf) {
    let ids = zipf_ids(p, tokens, zipf);
    let res = embrace_run(p, v, d, &ids);
    let m = (v * d * 4) as f64;
    let mean = |f: &dyn Fn(usize) -> f64| mean_over(p, f);
    let alpha = mean(&|r| res[r].0 as f64) * d as f64 * 4.0 / m;
    println!(
        "\n### P = {p}: {tokens} tokens per rank, {:.0} distinct rows per rank on average (α = {:.4})\n",
        mean(&|r| res[r].0 as f64),
        alpha
    );
    embrace_table(p, v, d, &ids, &res);
    let col_total = mean(&|r| (res[r].1 .0 + res[r].4 .0) as f64);
    let q = (p as f64 - 1.0) / p as f64;
    let alpha_tok = (tokens * d * 4) as f64 / m;
    println!(
        "\nAlltoAll-columns forward + backward = {:.2} MiB per rank. embrace.md §1.3: (P−1)/P·α·M per AlltoAll = {:.2} MiB forward (α = {:.4}, all {tokens} tokens: the lookup is not deduplicated) + {:.2} MiB backward (α = {:.4}, coalesced rows) + {:.2} MiB of row ids = {:.2} MiB; the paper's 2(P−1)/P·αM with the coalesced α = {:.2} MiB.",
        mib(col_total),
        mib(q * alpha_tok * m),
        alpha_tok,
        mib(q * alpha * m),
        alpha,
        mib(mean(&|r| (res[r].0 * (p - 1) * 4) as f64)),
        mib(q * alpha_tok * m + q * alpha * m + mean(&|r| (res[r].0 * (p - 1) * 4) as f64)),
        mib(2.0 * q * alpha * m),
    );
}

/// `bench_onebit bytes`: bytes sent per rank by onebit (1 MiB) and alltoall (the P = 4 Zipf
/// batch) on whatever world starts — run it plain (4 Local ranks) and under
/// `mpirun -np 4`; the lines must agree.
fn bytes_check() {
    let world = gradkit_comm::World::init(Some(4)).expect("world");
    let zipf = Zipf::new(100_000, 1.0);
    let out = world
        .run(|comm| {
            let r = comm.rank();
            let n = 1 << 18;
            let mut g = Rng(r as u64 + 1);
            let mut data: Vec<f32> = (0..n).map(|_| (g.unit() - 0.5) as f32).collect();
            let mut st = OneBitState::new(Variant::Server, comm.size(), n);
            comm.traffic().reset();
            st.allreduce(comm, &mut data)?;
            let ob = comm.traffic().total();
            let checksum: f64 = data.iter().map(|&v| v as f64).sum();
            let mut g = Rng(1000 + r as u64);
            let ids: Vec<u32> = (0..4096).map(|_| zipf.sample(&mut g)).collect();
            let rows = Rows::new(ids, 512, vec![1.0; 4096 * 512])?;
            comm.traffic().reset();
            exchange(comm, Split::Columns, 100_000, &rows)?;
            let a2a = comm.traffic().total();
            Ok(format!(
                "{} rank {r}: onebit sent {} recv {} msgs {} checksum {checksum:.6}; alltoall sent {} recv {} msgs {}",
                comm.backend(),
                ob.bytes_sent,
                ob.bytes_recv,
                ob.msgs_sent,
                a2a.bytes_sent,
                a2a.bytes_recv,
                a2a.msgs_sent
            ))
        })
        .expect("bytes check");
    for line in out {
        println!("{line}");
    }
}

fn main() -> std::process::ExitCode {
    // Through `cli::run`, so that every rank calls MPI_Finalize under mpirun.
    gradkit_core::cli::run(|| {
        bench_main();
        Ok(())
    })
}

fn bench_main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("bytes") {
        return bytes_check();
    }
    let mib: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(64);
    let iters: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5);
    let n = mib << 18; // f32 elements
                       // Under mpirun: the allreduce table only, on the MPI ranks (native = MPI_Allreduce).
    let world = World::init(Some(4)).expect("world");
    let p = world.size();
    let io = world.is_io_rank();
    if io {
        println!(
            "## allreduce of {mib} MiB of f32, P = {p} {} ranks, median of {iters} calls\n",
            world.backend()
        );
        println!(
            "| algorithm | bytes sent per rank | vs ring | time per call (ms) | algbw (GB/s) | page faults per call |"
        );
        println!("|---|---|---|---|---|---|");
    }
    let ring = time_allreduce(&world, n, iters, "ring");
    let mut onebit_phases = Vec::new();
    for algo in ["ring", "native", "onebit"] {
        let (b, t, ph, faults) = if algo == "ring" {
            ring.clone()
        } else {
            time_allreduce(&world, n, iters, algo)
        };
        if algo == "onebit" {
            onebit_phases = ph;
        }
        if io {
            println!(
                "| {algo} | {b} | {:.1}× fewer | {:.1} | {:.2} | {faults:.0} |",
                ring.0 as f64 / b.max(1) as f64,
                t * 1e3,
                gb(n * 4, t)
            );
        }
    }
    if io {
        let ph: Vec<String> = onebit_phases
            .iter()
            .map(|(k, v)| format!("{k} {:.1}", v * 1e3))
            .collect();
        println!("\nonebit phases on rank 0 (median ms): {}", ph.join(", "));
    }
    if !world.backend().in_process() {
        return;
    }
    bench_pack(n);
    println!("\n## EmbRace: Zipf(1.0) token batch, vocab 100k, d 512");
    let zipf = Zipf::new(100_000, 1.0);
    for p in [4usize, 8] {
        bench_embrace(p, 100_000, 512, 4096, &zipf);
    }
}
