//! gradselect end to end: small dense traces built here, the tool run as a user runs it, and
//! the output checked against references written in this file.

use std::path::{Path, PathBuf};
use std::process::Command;

use gradkit_core::io::{Input, Meta, Output, ReadOptions};
use gradkit_core::{read_table, read_tensor, write_table, MetricRow, PlanRow, TensorRow};

const BIN: &str = env!("CARGO_BIN_EXE_gradselect");

/// Layer sizes with the awkward cases: empty, single element, small, larger.
const LAYERS: [(&str, u64); 5] = [("a", 0), ("b", 1), ("c", 37), ("d", 400), ("e", 5)];

fn lcg(state: &mut u64) -> f32 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let u = ((*state >> 40) as f32 + 0.5) / (1u64 << 24) as f32;
    let s = if (*state >> 20) & 1 == 1 { 1.0 } else { -1.0 };
    s * (u.powf(-1.3) - 1.0) * 0.01
}

fn trace(steps: u32, ranks: u32, ties: bool) -> Vec<TensorRow> {
    let mut st = 12345u64;
    let mut rows = Vec::new();
    for step in 0..steps {
        for rank in 0..ranks {
            for (id, (name, n)) in LAYERS.iter().enumerate() {
                let values = (0..*n)
                    .map(|i| {
                        if ties {
                            ((i % 4) as f32 - 1.5).round()
                        } else {
                            lcg(&mut st)
                        }
                    })
                    .collect();
                rows.push(TensorRow {
                    step,
                    rank,
                    layer_id: id as u32,
                    layer: name.to_string(),
                    numel: *n,
                    shape: None,
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

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn read(path: &Path) -> Vec<TensorRow> {
    read_tensor(&Input::Path(path.into()), ReadOptions::default())
        .unwrap()
        .rows
}

fn metrics(path: &Path) -> Vec<MetricRow> {
    read_table::<MetricRow>(&Input::Path(path.into()), ReadOptions::default())
        .unwrap()
        .rows
}

fn metric(m: &[MetricRow], step: u32, rank: u32, name: &str) -> Option<f64> {
    m.iter()
        .find(|r| r.step == step && r.rank == rank && r.metric == name)
        .map(|r| r.value)
}

/// Flat dense vector of one (step, rank).
fn flat(rows: &[TensorRow], step: u32, rank: u32) -> Vec<f32> {
    let mut rs: Vec<&TensorRow> = rows
        .iter()
        .filter(|r| r.step == step && r.rank == rank)
        .collect();
    rs.sort_by_key(|r| r.layer_id);
    rs.iter().flat_map(|r| r.to_dense()).collect()
}

/// Flat (index, value) pairs of one (step, rank) of a sparse output.
fn flat_sel(rows: &[TensorRow], step: u32, rank: u32) -> Vec<(u32, f32)> {
    let mut rs: Vec<&TensorRow> = rows
        .iter()
        .filter(|r| r.step == step && r.rank == rank)
        .collect();
    rs.sort_by_key(|r| r.layer_id);
    let mut off = 0u32;
    let mut v = Vec::new();
    for r in rs {
        let idx = r.indices.as_ref().expect("sparse output");
        assert!(idx.windows(2).all(|w| w[0] < w[1]), "strictly ascending");
        v.extend(idx.iter().zip(&r.values).map(|(i, x)| (i + off, *x)));
        off += r.numel as u32;
    }
    v
}

fn ref_topk(x: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..x.len() as u32).collect();
    idx.sort_by(|&a, &b| x[b as usize].abs().total_cmp(&x[a as usize].abs()));
    let mut t = idx[..k].to_vec();
    t.sort_unstable();
    t
}

struct Dir {
    _t: tempfile::TempDir,
    p: PathBuf,
}
fn dir() -> Dir {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().to_path_buf();
    Dir { _t: t, p }
}
impl Dir {
    fn f(&self, name: &str) -> String {
        self.p.join(name).display().to_string()
    }
}

#[test]
fn topk_global_and_layer_scope_without_residual() {
    for ties in [false, true] {
        let d = dir();
        let rows = trace(3, 2, ties);
        write(Path::new(&d.f("t.parquet")), &rows);
        let (c, e) = run(&[
            "--method",
            "topk",
            "--density",
            "0.05",
            "--no-residual",
            &d.f("t.parquet"),
            "-o",
            &d.f("s.parquet"),
            "-q",
        ]);
        assert_eq!(c, 0, "{e}");
        let out = read(Path::new(&d.f("s.parquet")));
        assert_eq!(
            out.len(),
            rows.len(),
            "one row per layer, empty ones included"
        );
        let n = 443;
        let k = (0.05f64 * n as f64).floor() as usize;
        for s in 0..3 {
            for r in 0..2 {
                let x = flat(&rows, s, r);
                let got: Vec<u32> = flat_sel(&out, s, r).iter().map(|p| p.0).collect();
                assert_eq!(got, ref_topk(&x, k));
            }
        }
        // per layer: k = max(1, floor(0.05·numel)) in each non-empty layer
        let (c, e) = run(&[
            "--method",
            "topk",
            "--density",
            "0.05",
            "--scope",
            "layer",
            "--no-residual",
            &d.f("t.parquet"),
            "-o",
            &d.f("l.parquet"),
            "-q",
        ]);
        assert_eq!(c, 0, "{e}");
        let out = read(Path::new(&d.f("l.parquet")));
        for r in &out {
            let src = rows
                .iter()
                .find(|x| x.step == r.step && x.rank == r.rank && x.layer_id == r.layer_id)
                .unwrap();
            let n = src.numel as usize;
            let k = if n == 0 {
                0
            } else {
                ((0.05 * n as f64).floor() as usize).max(1)
            };
            assert_eq!(r.indices.as_ref().unwrap(), &ref_topk(&src.values, k));
        }
    }
}

#[test]
fn error_feedback_conserves_and_residual_out() {
    let d = dir();
    let rows = trace(4, 2, false);
    write(Path::new(&d.f("t.parquet")), &rows);
    for method in [
        &["topk"][..],
        &["oktopk", "--reeval", "2", "--adjust=lstm"],
        &["dgc"],
        &["gaussiank"],
    ] {
        let mut args: Vec<&str> = vec!["--method"];
        args.extend_from_slice(method);
        let (s, r) = (d.f("s.parquet"), d.f("r.parquet"));
        let tp = d.f("t.parquet");
        args.extend_from_slice(&[
            "--density",
            "0.03",
            &tp,
            "-o",
            &s,
            "--residual-out",
            &r,
            "-q",
        ]);
        let (c, e) = run(&args);
        assert_eq!(c, 0, "{e}");
        let out = read(Path::new(&s));
        let res = read(Path::new(&r));
        for rank in 0..2 {
            let mut sum_g = vec![0f64; 443];
            let mut sum_s = vec![0f64; 443];
            for step in 0..4 {
                for (a, v) in sum_g.iter_mut().zip(flat(&rows, step, rank)) {
                    *a += v as f64;
                }
                for (i, v) in flat_sel(&out, step, rank) {
                    sum_s[i as usize] += v as f64;
                }
            }
            let rv = flat(&res, 3, rank);
            for i in 0..443 {
                let diff = (sum_g[i] - sum_s[i] - rv[i] as f64).abs();
                assert!(
                    diff < 1e-5 * (1.0 + sum_g[i].abs()),
                    "{method:?} rank {rank} i {i}"
                );
            }
        }
    }
}

#[test]
fn oktopk_reeval_from_recorded_thresholds() {
    let d = dir();
    let rows = trace(9, 1, false);
    write(Path::new(&d.f("t.parquet")), &rows);
    let (c, e) = run(&[
        "--method",
        "oktopk",
        "--k",
        "20",
        "--reeval",
        "4",
        // The paper's plain reuse (the default is the ladder since --adjust got policies).
        "--adjust",
        "paper",
        "--no-residual",
        &d.f("t.parquet"),
        "-o",
        &d.f("s.parquet"),
        "--metrics",
        &d.f("m.parquet"),
        "-q",
    ]);
    assert_eq!(c, 0, "{e}");
    let out = read(Path::new(&d.f("s.parquet")));
    let m = metrics(Path::new(&d.f("m.parquet")));
    let mut last = f64::NAN;
    for step in 0..9 {
        let x = flat(&rows, step, 0);
        let got: Vec<u32> = flat_sel(&out, step, 0).iter().map(|p| p.0).collect();
        let th = metric(&m, step, 0, "threshold").unwrap();
        assert_eq!(metric(&m, step, 0, "k_target"), Some(20.0));
        assert_eq!(metric(&m, step, 0, "nnz"), Some(got.len() as f64));
        assert!(metric(&m, step, 0, "time_select_s").unwrap() >= 0.0);
        if step % 4 == 0 {
            assert_eq!(got, ref_topk(&x, 20), "step {step}");
            last = th;
        } else {
            assert_eq!(
                th,
                last,
                "step {step} reuses step {}'s threshold",
                step / 4 * 4
            );
            let want: Vec<u32> = (0..x.len() as u32)
                .filter(|&i| x[i as usize].abs() as f64 > th)
                .collect();
            assert_eq!(got, want);
        }
    }
    // --reeval 1 is topk
    let (c, e) = run(&[
        "--method",
        "oktopk",
        "--k",
        "20",
        "--reeval",
        "1",
        &d.f("t.parquet"),
        "-o",
        &d.f("o1.parquet"),
        "-q",
    ]);
    assert_eq!(c, 0, "{e}");
    let (c, e) = run(&[
        "--method",
        "topk",
        "--k",
        "20",
        &d.f("t.parquet"),
        "-o",
        &d.f("tk.parquet"),
        "-q",
    ]);
    assert_eq!(c, 0, "{e}");
    assert_eq!(
        read(Path::new(&d.f("o1.parquet"))),
        read(Path::new(&d.f("tk.parquet")))
    );
}

#[test]
fn randomk_shared_across_ranks() {
    let d = dir();
    let rows = trace(3, 3, false);
    write(Path::new(&d.f("t.parquet")), &rows);
    let (c, e) = run(&[
        "--method",
        "randomk",
        "--density",
        "0.1",
        "--seed",
        "9",
        &d.f("t.parquet"),
        "-o",
        &d.f("s.parquet"),
        "-q",
    ]);
    assert_eq!(c, 0, "{e}");
    let out = read(Path::new(&d.f("s.parquet")));
    let idx = |s, r| -> Vec<u32> { flat_sel(&out, s, r).iter().map(|p| p.0).collect() };
    for s in 0..3 {
        assert_eq!(idx(s, 0).len(), 44);
        assert_eq!(idx(s, 0), idx(s, 1));
        assert_eq!(idx(s, 0), idx(s, 2));
    }
    assert_ne!(idx(0, 0), idx(1, 0));
    assert_ne!(idx(1, 0), idx(2, 0));
}

/// Each rank's selected set is disjoint from the others' and inside the ranges it owns.
fn check_deft(out: &[TensorRow], plan: &[PlanRow], steps: u32, p: u32) {
    for s in 0..steps {
        let ps = plan
            .iter()
            .map(|r| r.step)
            .filter(|&x| x <= s)
            .max()
            .unwrap();
        let mut seen = std::collections::HashSet::new();
        for r in 0..p {
            for row in out.iter().filter(|x| x.step == s && x.rank == r) {
                for &i in row.indices.as_ref().unwrap() {
                    assert!(seen.insert((row.layer_id, i)), "disjoint");
                    let own = plan.iter().any(|q| {
                        q.step == ps
                            && q.worker == r
                            && q.layer_id == row.layer_id
                            && q.start <= i as u64
                            && (i as u64) < q.end
                    });
                    assert!(
                        own,
                        "step {s} rank {r} layer {} index {i} not in own range",
                        row.layer_id
                    );
                }
            }
        }
        assert!(!seen.is_empty());
    }
}

#[test]
fn deft_with_and_without_plan() {
    use gradkit_core::trace::{flatten_dense, group_step_rank, Layout};
    use gradkit_partition::deft as pd;
    let d = dir();
    let rows = trace(3, 3, false);
    write(Path::new(&d.f("t.parquet")), &rows);
    // A plan made here with the partition library, one per step, from rank 0's gradient.
    let layout = Layout::of_rows(&rows);
    let pieces = pd::pieces(&layout, 3);
    let mut plan = Vec::new();
    for g in group_step_rank(&rows)
        .iter()
        .filter(|g| g.rank == 0 && g.step < 2)
    {
        let flat = flatten_dense(&g.rows);
        plan.extend(pd::plan_step(&layout, &pieces, &flat, 13, 3, g.step, false));
    }
    let mut pm = Meta::default();
    pm.set("method", "deft");
    write_table::<PlanRow>(&Output::Path(d.p.join("plan.parquet")), &pm, &plan).unwrap();
    let (c, e) = run(&[
        "--method",
        "deft",
        "--density",
        "0.03",
        "--plan",
        &d.f("plan.parquet"),
        &d.f("t.parquet"),
        "-o",
        &d.f("s.parquet"),
        "-q",
    ]);
    assert_eq!(c, 0, "{e}");
    check_deft(&read(Path::new(&d.f("s.parquet"))), &plan, 3, 3);

    // In-process plan: recompute the plan the same way (leader = step mod P, its acc) to check.
    let (c, e) = run(&[
        "--method",
        "deft",
        "--density",
        "0.03",
        "--no-residual",
        &d.f("t.parquet"),
        "-o",
        &d.f("s2.parquet"),
        "-q",
    ]);
    assert_eq!(c, 0, "{e}");
    let mut plan2 = Vec::new();
    for g in group_step_rank(&rows) {
        if g.rank == g.step % 3 {
            let flat = flatten_dense(&g.rows);
            plan2.extend(pd::plan_step(&layout, &pieces, &flat, 13, 3, g.step, false));
        }
    }
    check_deft(&read(Path::new(&d.f("s2.parquet"))), &plan2, 3, 3);

    // A plan for 2 workers does not match a 3-rank trace.
    let bad: Vec<PlanRow> = pd::plan_step(
        &layout,
        &pd::pieces(&layout, 2),
        &flat(&rows, 0, 0),
        13,
        2,
        0,
        false,
    );
    write_table::<PlanRow>(&Output::Path(d.p.join("bad.parquet")), &pm, &bad).unwrap();
    let (c, e) = run(&[
        "--method",
        "deft",
        "--density",
        "0.03",
        "--plan",
        &d.f("bad.parquet"),
        &d.f("t.parquet"),
        "-o",
        &d.f("x.parquet"),
        "-q",
    ]);
    assert_eq!(c, 1);
    assert!(
        e.starts_with("error: --plan") && e.contains("workers"),
        "{e}"
    );
    assert!(!Path::new(&d.f("x.parquet")).exists());
    // A plan whose layer is renamed does not match.
    let mut renamed = plan.clone();
    renamed[0].layer = "zzz".into();
    write_table::<PlanRow>(&Output::Path(d.p.join("bad2.parquet")), &pm, &renamed).unwrap();
    let (c, e) = run(&[
        "--method",
        "deft",
        "--density",
        "0.03",
        "--plan",
        &d.f("bad2.parquet"),
        &d.f("t.parquet"),
        "-o",
        &d.f("x.parquet"),
        "-q",
    ]);
    assert_eq!(c, 1, "{e}");
    assert!(e.contains("zzz"), "{e}");
    assert!(!Path::new(&d.f("x.parquet")).exists());
}

#[test]
fn bad_input_is_a_clear_error_with_no_output() {
    let d = dir();
    let rows = trace(2, 2, false);
    write(Path::new(&d.f("t.parquet")), &rows);
    let x = d.f("x.parquet");
    for dens in ["0", "1.5", "-0.1", "nan"] {
        let flag = format!("--density={dens}");
        let (c, e) = run(&["--method", "topk", &flag, &d.f("t.parquet"), "-o", &x]);
        // A flag wrong on its own is a usage error (tests/validation.rs has the others).
        assert_eq!(c, 2, "{dens}: {e}");
        assert!(e.starts_with("error: --density"), "{e}");
        assert!(!Path::new(&x).exists());
    }
    // a sparse trace as input
    let (c, e) = run(&[
        "--method",
        "topk",
        "--density",
        "0.1",
        &d.f("t.parquet"),
        "-o",
        &d.f("s.parquet"),
        "-q",
    ]);
    assert_eq!(c, 0, "{e}");
    let (c, e) = run(&[
        "--method",
        "topk",
        "--density",
        "0.1",
        &d.f("s.parquet"),
        "-o",
        &x,
    ]);
    assert_eq!(c, 1);
    assert!(e.starts_with("error:") && e.contains("dense"), "{e}");
    assert!(!Path::new(&x).exists());
    // a density out of range, unknown bands: usage errors
    let (c, _) = run(&[
        "--method",
        "topk",
        "--density",
        "0",
        &d.f("t.parquet"),
        "-o",
        &x,
    ]);
    assert_eq!(c, 2);
    let (c, e) = run(&[
        "--method",
        "oktopk",
        "--k",
        "3",
        "--adjust=foo",
        &d.f("t.parquet"),
        "-o",
        &x,
    ]);
    assert_eq!(c, 2, "{e}");
    let (c, _) = run(&["--method", "nope", &d.f("t.parquet"), "-o", &x]);
    assert_eq!(c, 2);
    assert!(!Path::new(&x).exists());
}

#[test]
fn same_input_same_bytes() {
    let d = dir();
    let rows = trace(3, 2, false);
    write(Path::new(&d.f("t.parquet")), &rows);
    for m in ["randomk", "dgc", "gaussiank"] {
        // The same path both times: the producer metadata records the argv.
        let a = d.f("a.parquet");
        let mut bytes = Vec::new();
        for _ in 0..2 {
            let (c, e) = run(&[
                "--method",
                m,
                "--density",
                "0.05",
                "--seed",
                "4",
                &d.f("t.parquet"),
                "-o",
                &a,
                "-q",
            ]);
            assert_eq!(c, 0, "{e}");
            bytes.push(std::fs::read(&a).unwrap());
        }
        assert!(bytes[0] == bytes[1], "{m}: outputs differ");
    }
}

/// Without `--density` or `--k`, a method that needs k keeps 1 % (gradallreduce's and
/// gradtrain's default): k = floor(0.01·n) = 4 of n = 443 per (step, rank), the brute-force
/// top-4 of each accumulator; the threshold method still needs no k.
#[test]
fn density_defaults_to_one_percent() {
    let d = dir();
    let rows = trace(2, 2, false);
    write(Path::new(&d.f("t.parquet")), &rows);
    let (c, e) = run(&[
        "--method",
        "topk",
        "--no-residual",
        &d.f("t.parquet"),
        "-o",
        &d.f("s.parquet"),
        "-q",
    ]);
    assert_eq!(c, 0, "{e}");
    let out = read(Path::new(&d.f("s.parquet")));
    for step in 0..2 {
        for rank in 0..2 {
            let want = ref_topk(&flat(&rows, step, rank), 4);
            let got: Vec<u32> = flat_sel(&out, step, rank).iter().map(|x| x.0).collect();
            assert_eq!(got, want, "step {step} rank {rank}");
        }
    }
    let (c, e) = run(&[
        "--method",
        "threshold",
        "--threshold",
        "0.5",
        &d.f("t.parquet"),
        "-o",
        &d.f("th.parquet"),
        "-q",
    ]);
    assert_eq!(c, 0, "{e}");
}
