//! gradallreduce as a user runs it: Local ranks and mpirun give the f64 reference sum, the
//! same data bit for bit (every algorithm but `native`) and the same traffic counters; bad
//! input fails cleanly.

use std::path::Path;
use std::process::{Command, Output as ProcOutput, Stdio};

use gradkit_core::{
    read_table, read_tensor, write_table, Input, Meta, MetricRow, Output, TensorRow,
};

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

/// A fresh directory for one test, removed when the guard drops.
fn tmpdir(name: &str) -> gradkit_testkit::TempDir {
    gradkit_testkit::tempdir(&format!("gradallreduce-test-{name}-"))
}

/// A dense trace: `steps` × `p` ranks × two layers of sizes 1000 and 37.
fn trace(p: u32, steps: u32) -> Vec<TensorRow> {
    gradkit_testkit::traces::dense(p, steps, &[("fc1.weight", 1000), ("fc1.bias", 37)])
}

fn write_trace(path: &Path, rows: &[TensorRow]) {
    let mut meta = Meta::default();
    meta.set("world_size", 4);
    write_table(&Output::Path(path.to_path_buf()), &meta, rows).unwrap();
}

fn run(cmd: &mut Command) -> ProcOutput {
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run")
}

fn mpirun(np: usize) -> Command {
    let mut c = Command::new("mpirun");
    gradkit_testkit::mpi::isolate(&mut c);
    c.args(["-np", &np.to_string(), "--oversubscribe", BIN]);
    c
}

#[test]
fn ring_local_and_mpi_match_the_reference_sum() {
    let d_dir = tmpdir("ring");
    let d = d_dir.path().to_path_buf();
    let (inp, local_out, mpi_out) = (
        d.join("t.parquet"),
        d.join("local.parquet"),
        d.join("mpi.parquet"),
    );
    let rows = trace(4, 3);
    write_trace(&inp, &rows);
    for algo in ["ring", "rabenseifner", "tree", "native"] {
        let (lm, mm) = (
            d.join(format!("lm-{algo}.parquet")),
            d.join(format!("mm-{algo}.parquet")),
        );
        let o = run(Command::new(BIN)
            .args(["--algo", algo, "--ranks", "4", "-q", "--metrics"])
            .arg(&lm)
            .arg(&inp)
            .arg("-o")
            .arg(&local_out));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = run(mpirun(4)
            .args(["--algo", algo, "-q", "--metrics"])
            .arg(&mm)
            .arg(&inp)
            .arg("-o")
            .arg(&mpi_out));
        assert!(
            o.status.success(),
            "mpirun: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let local = read_tensor(&Input::Path(local_out.clone()), Default::default())
            .unwrap()
            .rows;
        let mpi = read_tensor(&Input::Path(mpi_out.clone()), Default::default())
            .unwrap()
            .rows;
        if algo != "native" {
            // Our algorithms fix the summation order, so the bytes agree; MPI_Allreduce's own
            // order is its business, so `native` is only held to the reference below.
            assert_eq!(local, mpi, "{algo}: Local and MPI outputs differ");
        }
        // Independent reference: f64 sum over ranks of each (step, layer).
        assert_eq!(local.len(), 3 * 2);
        for r in local.iter().chain(&mpi) {
            let want: Vec<f64> = (0..r.numel as usize)
                .map(|i| {
                    rows.iter()
                        .filter(|x| x.step == r.step && x.layer == r.layer)
                        .map(|x| x.values[i] as f64)
                        .sum()
                })
                .collect();
            for (g, w) in r.values.iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()),
                    "{algo}: {g} vs {w}"
                );
            }
        }
        // Same counters on both backends (times differ, bytes and messages may not).
        let key = |m: &MetricRow| (m.step, m.rank, m.metric.clone());
        let counts = |p: &Path| {
            let mut v: Vec<(u32, u32, String, f64)> =
                read_table::<MetricRow>(&Input::Path(p.into()), Default::default())
                    .unwrap()
                    .rows
                    .into_iter()
                    .filter(|m| m.metric.starts_with("bytes") || m.metric.starts_with("messages"))
                    .map(|m| (key(&m).0, key(&m).1, key(&m).2, m.value))
                    .collect();
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v
        };
        assert_eq!(
            counts(&lm),
            counts(&mm),
            "{algo}: counters differ between Local and MPI"
        );
        if algo == "ring" {
            // 1037 elements over 4 ranks: exact ring formula per rank.
            let c = |i: usize| ((i + 1) * 1037 / 4 - i * 1037 / 4) as f64;
            for (step, rank, metric, v) in counts(&lm) {
                if metric == "bytes_sent" {
                    let r = rank as usize;
                    assert_eq!(
                        v,
                        4.0 * (2.0 * 1037.0 - c((r + 1) % 4) - c((r + 2) % 4)),
                        "step {step} rank {rank}"
                    );
                }
            }
        }
    }
}

fn assert_clean_failure(o: &ProcOutput, needle: &str, out: &Path) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(
        err.contains("error:") && err.contains(needle),
        "expected `{needle}` in: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.exists(), "output left behind");
    let leftovers = gradkit_testkit::cli::temp_files(out.parent().unwrap());
    assert!(leftovers.is_empty(), "tmp file left behind");
}

/// Runs the binary on Local ranks with `args IN -o OUT` and expects a clean failure.
fn local_fails(args: &[&str], inp: &Path, out: &Path, needle: &str) {
    let o = run(Command::new(BIN).args(args).arg(inp).arg("-o").arg(out));
    assert_clean_failure(&o, needle, out);
}

#[test]
fn bad_input_fails_cleanly() {
    let d_dir = tmpdir("bad");
    let d = d_dir.path().to_path_buf();
    let out = d.join("out.parquet");
    let inp = d.join("t.parquet");
    write_trace(&inp, &trace(4, 2));
    // Rank count mismatch.
    local_fails(
        &["--ranks", "3"],
        &inp,
        &out,
        "holds 4 ranks but this run has 3",
    );
    // Under mpirun too: one clean error line, exit 1.
    let o = run(mpirun(2).arg(&inp).arg("-o").arg(&out));
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("holds 4 ranks but this run has 2"));
    assert!(!out.exists());
    // Layers differing between ranks.
    let mut rows = trace(4, 2);
    rows.retain(|r| !(r.rank == 2 && r.step == 1 && r.layer_id == 1));
    write_trace(&inp, &rows);
    local_fails(
        &["--ranks", "4"],
        &inp,
        &out,
        "differ from the trace's layers",
    );
    // A missing step for one rank.
    let mut rows = trace(4, 2);
    rows.retain(|r| !(r.rank == 3 && r.step == 1));
    write_trace(&inp, &rows);
    local_fails(&["--ranks", "4"], &inp, &out, "step 1: only 3 of 4 ranks");
    // An unknown algorithm and a flag out of range are usage errors (exit 2;
    // tests/validation.rs has the others).
    let o = run(Command::new(BIN)
        .args(["--ranks", "4", "--algo", "nope"])
        .arg(&inp)
        .arg("-o")
        .arg(&out));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("error: unknown --algo `nope`"));
    assert!(!out.exists());
    let o = run(Command::new(BIN)
        .args(["--ranks", "4", "--density", "1.5"])
        .arg(&inp)
        .arg("-o")
        .arg(&out));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("error: --density"));
    assert!(!out.exists());
}

#[test]
fn a_killed_rank_ends_the_mpi_job() {
    // A long benchmark; kill one rank after a moment; mpirun must end non-zero quickly.
    let mut child = mpirun(4)
        .args(["bench", "--sizes", "16M:16M", "--iters", "400", "-q"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let killed = Command::new("pkill")
        .args(["-KILL", "-n", "-P", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "no rank process found to kill");
    let start = std::time::Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(!st.success(), "job exited 0 after a rank was killed");
            break;
        }
        assert!(
            start.elapsed().as_secs() < 30,
            "job hangs after a rank died"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// An EmbRace-style trace: a sparse embedding table [50, 8] (whole rows) + a dense layer.
fn embedding_trace(
    p: u32,
    steps: u32,
    shape: Option<Vec<u32>>,
    partial_rows: bool,
) -> Vec<TensorRow> {
    let (v, d) = (50u32, 8u32);
    let mut rows = Vec::new();
    for step in 0..steps {
        for rank in 0..p {
            let ids: Vec<u32> = (0..v)
                .filter(|i| (i * 7 + rank * 3 + step) % 5 == 0)
                .collect();
            let mut indices = Vec::new();
            for id in &ids {
                let width = if partial_rows { d - 1 } else { d };
                indices.extend((0..width).map(|c| id * d + c));
            }
            let values = indices
                .iter()
                .map(|&i| ((i + rank) % 17) as f32 - 8.0)
                .collect();
            rows.push(TensorRow {
                step,
                rank,
                layer_id: 0,
                layer: "embedding.weight".into(),
                numel: (v * d) as u64,
                shape: shape.clone(),
                indices: Some(indices),
                values,
            });
            rows.push(TensorRow {
                step,
                rank,
                layer_id: 1,
                layer: "fc.weight".into(),
                numel: 37,
                shape: Some(vec![37]),
                indices: None,
                values: (0..37).map(|i| (i * (rank + 1)) as f32 / 7.0).collect(),
            });
        }
    }
    rows
}

/// (step, rank, metric, value) of one counter row.
type Count = (u32, u32, String, f64);

#[test]
fn every_algorithm_but_native_gives_the_same_data_on_local_and_mpi() {
    let d_dir = tmpdir("all");
    let d = d_dir.path().to_path_buf();
    let inp = d.join("t.parquet");
    write_trace(&inp, &trace(4, 3));
    let emb = d.join("emb.parquet");
    let emb_rows = embedding_trace(4, 2, Some(vec![50, 8]), false);
    write_trace(&emb, &emb_rows);
    use gradkit_collectives::{dense, Algo, Family, Knob};
    // Every algorithm of the registry but `native` (MPI_Allreduce adds in its own order).
    for a in Algo::ALL.iter().filter(|a| **a != Algo(&dense::NATIVE)) {
        let algo = a.name();
        let input = if a.family() == Family::Embedding {
            &emb
        } else {
            &inp
        };
        let outs: Vec<(Vec<TensorRow>, Vec<Count>)> = ["local", "mpi"]
            .iter()
            .map(|how| {
                let (o, m) = (
                    d.join(format!("{algo}-{how}.parquet")),
                    d.join(format!("{algo}-{how}-m.parquet")),
                );
                let mut cmd = if *how == "local" {
                    let mut c = Command::new(BIN);
                    c.args(["--ranks", "4"]);
                    c
                } else {
                    mpirun(4)
                };
                if a.reads(Knob::Period) {
                    // Flags of Ok-Topk only (refused with the other algorithms).
                    cmd.args(["--reeval", "2", "--period", "2"]);
                }
                let r = run(cmd
                    .args(["--algo", algo, "--density", "0.05", "-q"])
                    .arg(input)
                    .arg("-o")
                    .arg(&o)
                    .arg("--metrics")
                    .arg(&m));
                assert!(
                    r.status.success(),
                    "{algo} {how}: {}",
                    String::from_utf8_lossy(&r.stderr)
                );
                let rows = read_tensor(&Input::Path(o), Default::default())
                    .unwrap()
                    .rows;
                let mut counts: Vec<_> =
                    read_table::<MetricRow>(&Input::Path(m), Default::default())
                        .unwrap()
                        .rows
                        .into_iter()
                        .filter(|x| {
                            x.metric.starts_with("bytes") || x.metric.starts_with("messages")
                        })
                        .map(|x| (x.step, x.rank, x.metric, x.value))
                        .collect();
                counts.sort_by(|a, b| a.partial_cmp(b).unwrap());
                (rows, counts)
            })
            .collect();
        // What README and --help promise: the data, bit for bit (f32 `==` would let -0.0
        // equal 0.0), and the metadata except the keys that record how the run was launched.
        fn bits(rows: &[TensorRow]) -> Vec<(TensorRow, Vec<u32>)> {
            rows.iter()
                .map(|r| {
                    let v = r.values.iter().map(|x| x.to_bits()).collect();
                    let rest = TensorRow {
                        values: vec![],
                        ..r.clone()
                    };
                    (rest, v)
                })
                .collect()
        }
        assert_eq!(
            bits(&outs[0].0),
            bits(&outs[1].0),
            "{algo}: rows differ between Local and MPI"
        );
        // `gradkit.backend` (local/mpi), `gradkit.producer` (the argv) and `ARROW:schema`
        // (the stored Arrow schema, which carries a copy of those two) legitimately differ.
        let meta = |how: &str| {
            let p = d.join(format!("{algo}-{how}.parquet"));
            let mut m = read_tensor(&Input::Path(p), Default::default())
                .unwrap()
                .meta
                .0;
            for k in ["gradkit.backend", "gradkit.producer", "ARROW:schema"] {
                assert!(m.remove(k).is_some(), "{algo} {how}: no `{k}`");
            }
            m
        };
        assert_eq!(meta("local"), meta("mpi"), "{algo}: metadata differs");
        assert_eq!(
            outs[0].1, outs[1].1,
            "{algo}: counters differ between Local and MPI"
        );
        assert!(!outs[0].1.is_empty());
    }
    // embrace: the written result is the plain sum of the inputs (dense reference).
    let out = read_tensor(
        &Input::Path(d.join("embrace-local.parquet")),
        Default::default(),
    )
    .unwrap()
    .rows;
    for r in &out {
        let want: Vec<f32> = (0..r.numel as usize)
            .map(|i| {
                emb_rows
                    .iter()
                    .filter(|x| x.step == r.step && x.layer == r.layer)
                    .map(|x| x.to_dense()[i])
                    .sum()
            })
            .collect();
        let got = r.to_dense();
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "alltoall {}: {g} vs {w}",
                r.layer
            );
        }
    }
}

#[test]
fn alltoall_rejects_embeddings_without_shape_or_whole_rows() {
    let d_dir = tmpdir("emb-bad");
    let d = d_dir.path().to_path_buf();
    let (inp, out) = (d.join("e.parquet"), d.join("out.parquet"));
    write_trace(&inp, &embedding_trace(4, 1, None, false));
    local_fails(
        &["--ranks", "4", "--algo", "alltoall"],
        &inp,
        &out,
        "needs a 2-D shape",
    );
    write_trace(&inp, &embedding_trace(4, 1, Some(vec![50, 8]), true));
    local_fails(&["--ranks", "4", "--algo", "alltoall"], &inp, &out, "row");
}

/// Without `--ranks`, a trace file runs as many in-process ranks as it holds: the same
/// output, bit for bit, as `--ranks P`; from stdin (which cannot be read twice) it is still 1
/// rank, refused with the flag to give.
#[test]
fn ranks_default_to_the_traces() {
    let d_dir = tmpdir("ranks-default");
    let d = d_dir.path().to_path_buf();
    let inp = d.join("t.parquet");
    write_trace(&inp, &trace(3, 2));
    let (given, default) = (d.join("given.parquet"), d.join("default.parquet"));
    let o = run(Command::new(BIN)
        .arg(&inp)
        .args(["--ranks", "3", "-q", "-o"])
        .arg(&given));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(Command::new(BIN).arg(&inp).args(["-q", "-o"]).arg(&default));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = |p: &Path| {
        read_tensor(&Input::Path(p.to_path_buf()), Default::default())
            .unwrap()
            .rows
    };
    assert_eq!(rows(&given), rows(&default));
    let o = Command::new(BIN)
        .args(["-", "-o"])
        .arg(d.join("stdin.parquet"))
        .stdin(std::fs::File::open(&inp).unwrap())
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("holds 3 ranks but this run has 1 (flag --ranks"),
        "{e}"
    );
}
