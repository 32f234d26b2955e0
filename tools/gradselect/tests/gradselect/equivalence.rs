//! docs/ALGORITHMS.md at the tool level: `gradselect` then `gradallreduce` on its sparse output, and
//! `gradallreduce` on the dense trace itself (the algorithm's own selection with error
//! feedback, what gradtrain's sparse exchange runs), give the same reduced tensor, row by row
//! and bit for bit. The trace is written here: heavy-tailed, mostly-zero values over three
//! layers (one of a single element), P = 3 ranks, with two ranks' values cancelling exactly
//! to 0 at a selected index. TopkA's and Gaussiank's results are also checked against the f64
//! sum of what gradselect selected (the union of the selections).
//!
//! gradallreduce is another package's binary: it is run from the directory this test's
//! gradselect binary was built in (`target/release/` after `cargo build --release -p
//! gradallreduce`, or after `make test`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gradkit_core::io::{Input, Meta, Output, ReadOptions};
use gradkit_core::{read_tensor, write_table, TensorRow};

const GRADSELECT: &str = env!("CARGO_BIN_EXE_gradselect");
const P: u32 = 3;
const STEPS: u32 = 4;
const LAYERS: [(&str, u64); 3] = [("w", 600), ("b", 1), ("v", 1399)];
const DENSITY: &str = "0.02";

fn gradallreduce() -> PathBuf {
    let bin = Path::new(GRADSELECT)
        .parent()
        .expect("the binary has a directory")
        .join(format!("gradallreduce{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: build it first (cargo build --release -p gradallreduce, as `make test` does)",
        bin.display()
    );
    bin
}

/// xorshift64*: uniform in [0, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Rows of a dense trace; rank 0 and rank 1 cancel at flat index 700 on step 0.
fn trace() -> Vec<TensorRow> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut rows = Vec::new();
    for step in 0..STEPS {
        for rank in 0..P {
            let mut off = 0u64;
            for (id, &(name, n)) in LAYERS.iter().enumerate() {
                let values: Vec<f32> = (0..n)
                    .map(|i| {
                        if step == 0 && off + i == 700 && rank < 2 {
                            return if rank == 0 { 1024.0 } else { -1024.0 };
                        }
                        if rng.unit() < 0.55 {
                            return 0.0;
                        }
                        let mag = 1e-3 * (1.0 - rng.unit()).powf(-1.0 / 1.5);
                        (if rng.next() & 1 == 0 { mag } else { -mag }) as f32
                    })
                    .collect();
                off += n;
                rows.push(TensorRow {
                    step,
                    rank,
                    layer_id: id as u32,
                    layer: name.into(),
                    numel: n,
                    shape: Some(vec![n as u32]),
                    indices: None,
                    values,
                });
            }
        }
    }
    rows
}

fn write(path: &Path, rows: &[TensorRow]) {
    write_table::<TensorRow>(&Output::Path(path.into()), &Meta::default(), rows).unwrap();
}

fn read(path: &Path) -> Vec<TensorRow> {
    read_tensor(&Input::Path(path.into()), ReadOptions::default())
        .unwrap()
        .rows
}

fn run(bin: &Path, args: &[&str], paths: &[&Path]) {
    let out = Command::new(bin)
        .args(args)
        .args(paths)
        .arg("-q")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} {args:?} failed: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `(step, rank, layer_id) → (indices, value bits)`, sparse rows only.
type Rows = BTreeMap<(u32, u32, u32), (Vec<u32>, Vec<u32>)>;

fn by_key(rows: &[TensorRow]) -> Rows {
    rows.iter()
        .map(|r| {
            let idx = r.indices.clone().expect("a sparse row");
            let bits = r.values.iter().map(|v| v.to_bits()).collect();
            ((r.step, r.rank, r.layer_id), (idx, bits))
        })
        .collect()
}

/// Runs both pipelines for one algorithm; returns (dense-path rows, select-path rows, the
/// selection rows).
fn both(
    dir: &Path,
    algo: &str,
    method: &[&str],
    shared: &[&str],
    residual: bool,
) -> (Vec<TensorRow>, Vec<TensorRow>, Vec<TensorRow>) {
    let inp = dir.join("trace.parquet");
    let sel = dir.join(format!("{algo}-sel.parquet"));
    let via_sel = dir.join(format!("{algo}-via-select.parquet"));
    let direct = dir.join(format!("{algo}-dense.parquet"));
    let ranks = P.to_string();
    let gar = gradallreduce();
    let mut a = vec!["--method"];
    a.extend_from_slice(method);
    a.extend_from_slice(&["--density", DENSITY]);
    if !residual {
        a.push("--no-residual");
    }
    run(Path::new(GRADSELECT), &a, &[&inp, Path::new("-o"), &sel]);
    let mut a = vec!["--algo", algo, "--ranks", &ranks, "--density", DENSITY];
    a.extend_from_slice(shared);
    if !residual {
        a.push("--no-residual");
    }
    run(&gar, &a, &[&sel, Path::new("-o"), &via_sel]);
    run(&gar, &a, &[&inp, Path::new("-o"), &direct]);
    (read(&direct), read(&via_sel), read(&sel))
}

/// Every row of the steps `< steps` equal (all steps: `STEPS`).
fn assert_same(algo: &str, direct: &[TensorRow], via_sel: &[TensorRow], steps: u32) {
    let keep = |rows: &[TensorRow]| {
        let mut m = by_key(rows);
        m.retain(|k, _| k.0 < steps);
        m
    };
    let (d, s) = (keep(direct), keep(via_sel));
    assert_eq!(
        d.keys().collect::<Vec<_>>(),
        s.keys().collect::<Vec<_>>(),
        "{algo}: row keys"
    );
    assert_eq!(d.len(), (steps as usize) * LAYERS.len(), "{algo}: rows");
    for (key, got) in &d {
        assert_eq!(got, &s[key], "{algo}: row (step, rank, layer_id) = {key:?}");
    }
}

/// The result of each step against the f64 sum of every rank's selected values (the union of
/// the selections, a cancelled sum kept as an explicit 0).
fn assert_union_sum(algo: &str, result: &[TensorRow], sel: &[TensorRow]) {
    let mut sums: BTreeMap<(u32, u32, u32), (f64, f64)> = BTreeMap::new();
    for r in sel {
        for (&i, &v) in r.indices.as_ref().expect("sparse").iter().zip(&r.values) {
            let e = sums.entry((r.step, r.layer_id, i)).or_default();
            e.0 += v as f64;
            e.1 += (v as f64).abs();
        }
    }
    let mut got: BTreeMap<(u32, u32, u32), f32> = BTreeMap::new();
    for r in result {
        for (&i, &v) in r.indices.as_ref().expect("sparse").iter().zip(&r.values) {
            got.insert((r.step, r.layer_id, i), v);
        }
    }
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        sums.keys().collect::<Vec<_>>(),
        "{algo}: support is the union of the selections"
    );
    for (key, &(s, mag)) in &sums {
        let v = got[key] as f64;
        assert!(
            (v - s).abs() <= 1e-6 * mag,
            "{algo}: {key:?}: {v:e} vs {s:e}"
        );
    }
    // The cancelling entry (layer v, local index 700 − 601 = 99) reached the result as 0.
    assert_eq!(got.get(&(0, 2, 99)), Some(&0.0), "{algo}: cancelled sum");
}

/// TopkA, TopkDSA, Gaussiank: the exchange sums every sent entry, so the residual rule is
/// gradselect's own (the sent entries leave) and the two pipelines agree on every step.
#[test]
fn gradselect_then_gradallreduce_equals_gradallreduce_on_dense_input() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("trace.parquet"), &trace());
    for (algo, method) in [
        ("topka", "topk"),
        ("topkdsa", "topk"),
        ("gaussiank", "gaussiank"),
    ] {
        for residual in [true, false] {
            let (direct, via_sel, sel) = both(dir.path(), algo, &[method], &[], residual);
            let what = format!("{algo} residual={residual}");
            assert_same(&what, &direct, &via_sel, STEPS);
            if matches!(algo, "topka" | "gaussiank") {
                assert_union_sum(&what, &direct, &sel);
            }
        }
    }
}

/// gTop-k and Ok-Topk drop sent entries on the way (Algorithm 2 keeps those in the residual,
/// `Leaves::SentInResult`), which gradselect, knowing only its selection, cannot do: the
/// pipelines agree on every step without error feedback, and with it on step 0 (before any
/// residual is used).
#[test]
fn gtopk_and_oktopk_through_gradselect_equal_them_on_dense_input() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("trace.parquet"), &trace());
    for residual in [false, true] {
        let steps = if residual { 1 } else { STEPS };
        let (direct, via_sel, _) = both(dir.path(), "gtopk", &["topk"], &[], residual);
        assert_same(
            &format!("gtopk residual={residual}"),
            &direct,
            &via_sel,
            steps,
        );
        for adjust in ["ladder", "paper", "reference"] {
            let (direct, via_sel, _) = both(
                dir.path(),
                "oktopk",
                &["oktopk", "--reeval", "2", "--adjust", adjust],
                &["--reeval", "2", "--period", "3", "--adjust", adjust],
                residual,
            );
            let what = format!("oktopk --adjust {adjust} residual={residual}");
            assert_same(&what, &direct, &via_sel, steps);
        }
    }
}

/// DEFT's exchange needs dense input, so its pipeline is compared by what it selects:
/// `gradallreduce --algo deft`'s result support is the union of the ranks' DEFT selections,
/// which must be what `gradselect --method deft` selects (same in-process plan); its values are
/// the f64 sums of every rank's accumulator there. Checked on every step without error
/// feedback (the accumulator is the trace's gradient) and on step 0 with it.
fn deft_case(residual: bool) {
    let dir = tempfile::tempdir().unwrap();
    let rows = trace();
    let inp = dir.path().join("trace.parquet");
    write(&inp, &rows);
    let (sel_p, red_p) = (
        dir.path().join("sel.parquet"),
        dir.path().join("red.parquet"),
    );
    let ranks = P.to_string();
    let mut a = vec!["--method", "deft", "--density", DENSITY];
    let mut b = vec!["--algo", "deft", "--ranks", &ranks, "--density", DENSITY];
    if !residual {
        a.push("--no-residual");
        b.push("--no-residual");
    }
    run(Path::new(GRADSELECT), &a, &[&inp, Path::new("-o"), &sel_p]);
    run(&gradallreduce(), &b, &[&inp, Path::new("-o"), &red_p]);
    let steps = if residual { 1 } else { STEPS };
    let mut union: BTreeMap<(u32, u32), Vec<u32>> = BTreeMap::new();
    for r in read(&sel_p).iter().filter(|r| r.step < steps) {
        let v = union.entry((r.step, r.layer_id)).or_default();
        v.extend(r.indices.as_ref().expect("sparse"));
    }
    union.values_mut().for_each(|v| v.sort_unstable());
    let red: Vec<TensorRow> = read(&red_p)
        .into_iter()
        .filter(|r| r.step < steps)
        .collect();
    assert_eq!(red.len(), steps as usize * LAYERS.len(), "deft: rows");
    for r in &red {
        let idx = r.indices.as_ref().expect("sparse");
        let what = format!("deft residual={residual} step {} layer {}", r.step, r.layer);
        assert_eq!(idx, &union[&(r.step, r.layer_id)], "{what}: support");
        for (&i, &v) in idx.iter().zip(&r.values) {
            let g = rows
                .iter()
                .filter(|d| d.step == r.step && d.layer_id == r.layer_id)
                .map(|d| d.values[i as usize] as f64);
            let (s, mag) = g.fold((0.0, 0.0), |(s, m), x| (s + x, m + x.abs()));
            assert!(
                (v as f64 - s).abs() <= 1e-6 * mag,
                "{what}: at {i}: {v:e} vs {s:e}"
            );
        }
    }
}

#[test]
fn deft_through_gradselect_selects_what_gradallreduce_deft_sums() {
    deft_case(false);
    deft_case(true);
}
