//! gradpartition end to end: plans read back and checked by scanning, metrics, bad input.

use std::path::{Path, PathBuf};
use std::process::Command;

use gradkit_core::io::{Input, Meta, Output, ReadOptions};
use gradkit_core::{read_table, write_table, MetricRow, PlanRow, TensorRow};
// xorshift64* from the raw seed: the stream these traces were made with.
use gradkit_testkit::rng::Rng;

const SIZES: [u64; 5] = [12_000, 300, 6_000, 100, 2_500];

/// Dense trace: per-layer scale × (√o·shared + √(1−o)·own noise).
fn dense_trace(ranks: u32, steps: u32, overlap: f64) -> Vec<TensorRow> {
    let mut rng = Rng::xorshift64star(42);
    let scale: Vec<f64> = SIZES
        .iter()
        .map(|_| 10f64.powf(rng.unit_f64() * 2.0 - 1.0))
        .collect();
    let mut rows = vec![];
    for step in 0..steps {
        let shared: Vec<Vec<f64>> = SIZES
            .iter()
            .map(|&n| (0..n).map(|_| rng.normal_f64()).collect())
            .collect();
        for rank in 0..ranks {
            for (l, &n) in SIZES.iter().enumerate() {
                let values = (0..n as usize)
                    .map(|i| {
                        let z = overlap.sqrt() * shared[l][i]
                            + (1.0 - overlap).sqrt() * rng.normal_f64();
                        (scale[l] * z) as f32
                    })
                    .collect();
                rows.push(TensorRow {
                    step,
                    rank,
                    layer_id: l as u32,
                    layer: format!("layer{l}"),
                    numel: n,
                    shape: None,
                    indices: None,
                    values,
                });
            }
        }
    }
    rows
}

/// Sparse rows from per-(step, rank) flat selections.
fn sparse_trace(sel: &dyn Fn(u32, u32) -> Vec<u64>, ranks: u32, steps: u32) -> Vec<TensorRow> {
    let mut rows = vec![];
    for step in 0..steps {
        for rank in 0..ranks {
            let s = sel(step, rank);
            let mut off = 0;
            for (l, &n) in SIZES.iter().enumerate() {
                let idx: Vec<u32> = s
                    .iter()
                    .filter(|&&i| i >= off && i < off + n)
                    .map(|&i| (i - off) as u32)
                    .collect();
                rows.push(TensorRow {
                    step,
                    rank,
                    layer_id: l as u32,
                    layer: format!("layer{l}"),
                    numel: n,
                    shape: None,
                    values: vec![1.0; idx.len()],
                    indices: Some(idx),
                });
                off += n;
            }
        }
    }
    rows
}

fn write(dir: &Path, name: &str, rows: &[TensorRow]) -> PathBuf {
    let p = dir.join(name);
    let mut m = Meta::default();
    m.set("world_size", 1);
    write_table(&Output::Path(p.clone()), &m, rows).unwrap();
    p
}

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gradpartition"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn plan(p: &Path) -> (Vec<PlanRow>, Meta) {
    let t = read_table::<PlanRow>(&Input::Path(p.into()), ReadOptions::default()).unwrap();
    (t.rows, t.meta)
}

fn metrics(p: &Path) -> Vec<MetricRow> {
    read_table::<MetricRow>(&Input::Path(p.into()), ReadOptions::default())
        .unwrap()
        .rows
}

/// Rows of one step tile every layer exactly once.
fn assert_tiles(rows: &[&PlanRow]) {
    for (l, &n) in SIZES.iter().enumerate() {
        let mut r: Vec<(u64, u64)> = rows
            .iter()
            .filter(|r| r.layer_id == l as u32)
            .map(|r| (r.start, r.end))
            .collect();
        r.sort();
        let mut pos = 0;
        for (a, b) in r {
            assert_eq!(a, pos, "layer {l}: gap or overlap");
            assert!(b > a);
            pos = b;
        }
        assert_eq!(pos, n, "layer {l} covered");
    }
}

#[test]
fn deft_plans_tile_layers_and_avoid_build_up() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "g.parquet", &dense_trace(8, 3, 0.2));
    let out = dir.path().join("plan.parquet");
    let m = dir.path().join("m.parquet");
    let (code, err) = run(&[
        "--method",
        "deft",
        "--density",
        "0.01",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--metrics",
        m.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("build-up"), "summary on stderr: {err}");
    let (rows, meta) = plan(&out);
    assert_eq!(meta.get("method"), Some("deft"));
    let n: u64 = SIZES.iter().sum();
    let k = (0.01 * n as f64).floor() as u64;
    for step in 0..3 {
        let s: Vec<&PlanRow> = rows.iter().filter(|r| r.step == step).collect();
        assert_tiles(&s);
        assert!(s.iter().all(|r| r.worker < 8));
        for r in &s {
            let kx = r.k.expect("DEFT rows carry k");
            assert!(kx >= 1 && kx <= r.end - r.start);
        }
        let sum: u64 = s.iter().map(|r| r.k.unwrap()).sum();
        assert!(
            sum + 20 >= k && sum < k + s.len() as u64,
            "Σk_x = {sum}, k = {k}"
        );
    }
    let ms = metrics(&m);
    let get = |name: &str, step: u32| {
        ms.iter()
            .find(|r| r.metric == name && r.step == step)
            .unwrap_or_else(|| panic!("metric {name}"))
            .value
    };
    for step in 0..3 {
        assert!(get("buildup_topk", step) > 3.0, "plain top-k builds up");
        assert!(get("buildup_deft", step) <= 1.05);
        assert!(get("cost_imbalance", step) >= 1.0);
        // per-worker loads: 8 rows per step
        assert_eq!(
            ms.iter()
                .filter(|r| r.metric == "cost_load" && r.step == step)
                .count(),
            8
        );
    }
    // --topup: exactly k per step
    let (code, err) = run(&[
        "--method",
        "deft",
        "--density",
        "0.01",
        "--topup",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.is_empty(), "-q is quiet: {err}");
    let (rows, _) = plan(&out);
    for step in 0..3 {
        let sum: u64 = rows
            .iter()
            .filter(|r| r.step == step)
            .map(|r| r.k.unwrap())
            .sum();
        assert_eq!(sum, k);
    }
}

#[test]
fn same_input_gives_identical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "g.parquet", &dense_trace(2, 2, 0.5));
    let out = dir.path().join("plan.parquet");
    let args = [
        "--method",
        "deft",
        "--density",
        "0.05",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "-q",
    ];
    assert_eq!(run(&args).0, 0);
    let a = std::fs::read(&out).unwrap();
    assert_eq!(run(&args).0, 0);
    assert_eq!(a, std::fs::read(&out).unwrap());
}

#[test]
fn oktopk_regions_change_only_on_period_steps() {
    let dir = tempfile::tempdir().unwrap();
    let n: u64 = SIZES.iter().sum();
    // every rank selects the same m = 400 indices, different at every step
    let sel = |step: u32, _rank: u32| -> Vec<u64> {
        let mut v: Vec<u64> = (0..400u64)
            .map(|i| (i * i * 7 + step as u64 * 1009) % n)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let input = write(dir.path(), "s.parquet", &sparse_trace(&sel, 4, 10));
    let out = dir.path().join("plan.parquet");
    let m = dir.path().join("m.parquet");
    let (code, err) = run(&[
        "--method",
        "oktopk",
        "--period",
        "4",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--metrics",
        m.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let (rows, meta) = plan(&out);
    assert_eq!(meta.get("method"), Some("oktopk"));
    let mut steps: Vec<u32> = rows.iter().map(|r| r.step).collect();
    steps.dedup();
    assert_eq!(steps, vec![0, 4, 8]);
    for &step in &steps {
        let s: Vec<&PlanRow> = rows.iter().filter(|r| r.step == step).collect();
        assert_tiles(&s);
        assert!(s.iter().all(|r| r.k.is_none()));
        // identical selections: regions 0..P−2 hold exactly floor(m/P) of them
        let chosen = sel(step, 0);
        let c = chosen.len() as u64 / 4;
        let offs: Vec<u64> = SIZES
            .iter()
            .scan(0, |o, &x| {
                let a = *o;
                *o += x;
                Some(a)
            })
            .collect();
        for w in 0..3u32 {
            let count: u64 = s
                .iter()
                .filter(|r| r.worker == w)
                .map(|r| {
                    let off = offs[r.layer_id as usize];
                    chosen
                        .iter()
                        .filter(|&&i| i >= off + r.start && i < off + r.end)
                        .count() as u64
                })
                .sum();
            assert_eq!(count, c, "step {step} worker {w}");
        }
    }
    let ms = metrics(&m);
    // per step: 4 region counts, balanced and naive; entries sum to ranks × m
    for step in 0..10 {
        let total: f64 = ms
            .iter()
            .filter(|r| r.metric == "region_entries" && r.step == step)
            .map(|r| r.value)
            .sum();
        assert_eq!(total, 4.0 * sel(step, 0).len() as f64);
        assert!(ms
            .iter()
            .any(|r| r.metric == "region_imbalance_naive" && r.step == step));
        assert!(ms
            .iter()
            .any(|r| r.metric == "recv_words" && r.step == step));
    }
}

#[test]
fn oktopk_one_worker_and_empty_selections() {
    let dir = tempfile::tempdir().unwrap();
    let empty = write(dir.path(), "e.parquet", &sparse_trace(&|_, _| vec![], 3, 2));
    let out = dir.path().join("plan.parquet");
    for p in ["1", "3"] {
        let (code, err) = run(&[
            "--method",
            "oktopk",
            "--workers",
            p,
            empty.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "P = {p}: {err}");
        let (rows, _) = plan(&out);
        let s: Vec<&PlanRow> = rows.iter().filter(|r| r.step == 0).collect();
        assert_tiles(&s);
    }
}

fn assert_fails(args: &[&str], what: &str, out: &Path) {
    let (code, err) = run(args);
    assert_eq!(code, 1, "{what}: exit 1, got {code}: {err}");
    assert!(
        err.starts_with("error: ") && err.contains(what),
        "{what}: {err}"
    );
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(!out.exists(), "{what}: no output left");
    let leftovers = gradkit_testkit::cli::temp_files(out.parent().unwrap());
    assert!(leftovers.is_empty(), "{what}: temp file left");
}

#[test]
fn bad_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dense = write(dir.path(), "d.parquet", &dense_trace(2, 1, 0.5));
    let sparse = write(
        dir.path(),
        "s.parquet",
        &sparse_trace(&|_, _| vec![1, 2], 2, 1),
    );
    let out = dir.path().join("out.parquet");
    let o = out.to_str().unwrap();
    let (d, s) = (dense.to_str().unwrap(), sparse.to_str().unwrap());
    assert_fails(&["--method", "oktopk", d, "-o", o], "sparse", &out);
    assert_fails(
        &["--method", "deft", "--density", "0.1", s, "-o", o],
        "dense",
        &out,
    );
    assert_fails(
        &[
            "--method",
            "deft",
            "--density",
            "0.1",
            "--workers",
            "100000",
            d,
            "-o",
            o,
        ],
        "--workers",
        &out,
    );
    assert_fails(
        &["--method", "oktopk", "--workers", "100000", s, "-o", o],
        "--workers",
        &out,
    );
    // A flag wrong on its own is a usage error (exit 2; tests/validation.rs has the others).
    let usage = |args: &[&str], what: &str| {
        let (code, err) = run(args);
        assert_eq!(code, 2, "{what}: {err}");
        assert!(err.starts_with(&format!("error: {what}")), "{err}");
        assert!(!out.exists(), "{what}: no output left");
    };
    for bad in ["0", "1.5", "-0.1", "NaN"] {
        let flag = format!("--density={bad}");
        usage(&["--method", "deft", &flag, d, "-o", o], "--density");
    }
    // Without --density DEFT keeps 1 %, the other tools' default: the same plan as
    // `--density 0.01`.
    let o2 = out.with_extension("d001.parquet");
    let o2s = o2.to_str().unwrap();
    for (args, path) in [
        (vec!["--method", "deft", d, "-o", o], &out),
        (
            vec!["--method", "deft", "--density", "0.01", d, "-o", o2s],
            &o2,
        ),
    ] {
        let (code, err) = run(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(path.exists());
    }
    assert_eq!(plan(&out).0, plan(&o2).0);
    std::fs::remove_file(&out).unwrap();
    usage(
        &["--method", "oktopk", "--period", "0", s, "-o", o],
        "--period",
    );
    // a usage error is clap's: exit 2
    assert_eq!(run(&["--method", "nope", d, "-o", o]).0, 2);
}

/// The build-up check on `gradtrace synthetic --overlap 0.2` data (gradkit-core's
/// generator), P = 8: plain top-k's union grows well above k, DEFT's stays ≤ 1.05 k.
#[test]
fn build_up_on_a_synthetic_trace_with_overlap_0_2() {
    use gradkit_core::synth::{self, SynthSpec};
    let mut spec = SynthSpec::new(synth::shape("mlp", 0.1).unwrap(), 8, 3, 1);
    spec.overlap = 0.2;
    let rows = synth::generate(&spec).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "g.parquet", &rows);
    let out = dir.path().join("plan.parquet");
    let m = dir.path().join("m.parquet");
    let (code, err) = run(&[
        "--method",
        "deft",
        "--density",
        "0.01",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--metrics",
        m.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    let ms = metrics(&m);
    for step in 0..3 {
        let v = |name: &str| {
            ms.iter()
                .find(|r| r.metric == name && r.step == step)
                .unwrap()
                .value
        };
        assert!(
            v("buildup_topk") > 3.0,
            "step {step}: {}",
            v("buildup_topk")
        );
        assert!(
            v("buildup_deft") <= 1.05,
            "step {step}: {}",
            v("buildup_deft")
        );
    }
}
