//! `pipelines/bench/goals.py` (the verdicts `make bench` prints for docs/MEMORY.md's goals) on
//! tables written here in the formats the benches print, with every ratio worked out by hand
//! below: each goal's value and verdict, tables that follow each other without a blank line,
//! a missing file ("not measured"), and the P = 2 and cluster rows shown for comparison only.

use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../pipelines/bench/goals.py")
}

const DENSE_HEADER: &str = "|   size_B |    count | algo   | time_us | max/min | minflt | majflt | algbw_GBps | busbw_GBps | bytes_sent | msgs | model_us | wrong |\n|---------:|---------:|--------|--------:|--------:|-------:|-------:|-----------:|-----------:|-----------:|-----:|---------:|-------|\n";
const MPI4PY_HEADER: &str = "| size_B | count | algo | time_us | max/min | minflt | majflt | wrong |\n|---:|---:|---|---:|---:|---:|---:|---:|\n";

/// Three interleaved repetitions: ring 40/42/44 ms (max/min 1.10, 1.50, 1.20), native
/// 60/66/70, onebit 30/31/35, mpi4py 60/62/64 ms.
fn dense_vs_mpi4py() -> String {
    let mut s = String::new();
    for (ring, spread, native, onebit, mpi) in [
        (40000, "1.10", 60000, 30000, 60000),
        (42000, "1.50", 66000, 31000, 62000),
        (44000, "1.20", 70000, 35000, 64000),
    ] {
        s += "load average: 0.5 0.5 0.5 1/80 1\n";
        s += DENSE_HEADER;
        s += &format!("| 67108864 | 16777216 | ring   | {ring} | {spread} | 0 | 0 | 1 | 1 | 1 | 6 | 1 | 0 |\n");
        s += &format!(
            "| 67108864 | 16777216 | native | {native} | 1.20 | 0 | 0 | 1 | 1 | 1 | 0 | 1 | 0 |\n"
        );
        s += &format!("| 67108864 | 16777216 | onebit | {onebit} | 1.20 | 0 | 0 | 1 | 1 | 1 | 6 | 1 | n/a |\n");
        s += MPI4PY_HEADER; // right after the previous table, no blank line
        s += &format!("| 67108864 | 16777216 | mpi4py | {mpi} | 1.250 | 8194 | 0 | 0 |\n");
    }
    s
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

/// `gradallreduce bench`'s table for Ok-Topk and gTop-k on dense and pre-selected input:
/// Ok-Topk's times as given (µs), gTop-k's 1 ms whatever the input.
fn bench_input_table(dense: u64, select: u64, topk: u64) -> String {
    let mut s = String::from("|   size_B |    count | algo   | input | time_us | select_us | max/min | minflt | majflt | algbw_GBps | busbw_GBps | bytes_sent | msgs | model_us | wrong |\n|---------:|---------:|--------|-------|--------:|----------:|--------:|-------:|-------:|-----------:|-----------:|-----------:|-----:|---------:|-------|\n");
    for (algo, input, t, sel) in [
        ("oktopk", "dense", dense, select.to_string()),
        ("oktopk", "top-k", topk, "-".into()),
        ("gtopk", "dense", 1000, "500".into()),
        ("gtopk", "top-k", 1000, "-".into()),
    ] {
        s += &format!("| 67108864 | 16777216 | {algo} | {input} | {t} | {sel} | 1.2 | 0 | 0 | 1 | 1 | 1 | 17 | 1 | n/a |\n");
    }
    s
}

/// The verdict table's rows: goal → (measured, verdict).
fn verdicts(dir: &Path) -> Vec<(String, String, String)> {
    verdicts_with(dir, None)
}

fn verdicts_with(dir: &Path, cluster: Option<&Path>) -> Vec<(String, String, String)> {
    let out = Command::new(python())
        .arg(script())
        .arg(dir)
        .args(cluster)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| goal"))
        .map(|l| {
            let c: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            (c[0].to_string(), c[1].to_string(), c[3].to_string())
        })
        .collect()
}

fn row<'a>(v: &'a [(String, String, String)], goal_starts: &str) -> &'a (String, String, String) {
    v.iter()
        .find(|r| r.0.starts_with(goal_starts))
        .unwrap_or_else(|| panic!("no row `{goal_starts}` in {v:?}"))
}

/// The row of the goal starting `goal` says `measured` (unless `None`) and `verdict`.
fn check(v: &[(String, String, String)], goal: &str, measured: Option<&str>, verdict: &str) {
    let r = row(v, goal);
    if let Some(m) = measured {
        assert_eq!(r.1, m, "{goal}: measured");
    }
    assert_eq!(r.2, verdict, "{goal}: verdict");
}

#[test]
fn every_goal_is_judged_from_its_table() {
    let guard = gradkit_testkit::tempdir("gradkit-goals-");
    let dir = guard.path().to_path_buf();
    write(
        &dir,
        "io.md",
        "| what | median s |\n|---|---:|\n| x | 1 |\n\nread: gradkit 1.90x pyarrow's read_table speed (same file); write: gradkit takes 0.60x pyarrow's write_table time (same settings; write_owned 0.85x)\n",
    );
    // topk_indices ns/elem 0.10 … 0.20: max/min 2.00 (one run).
    let sweep = |vals: &[&str]| {
        let mut s = String::from(
            "| n | one pass ns/elem | topk_indices ns/elem | × at 2^20 |\n|---|---:|---:|---:|\n",
        );
        for (i, v) in vals.iter().enumerate() {
            s += &format!("| 2^{} | 0.05 | {v} | 1 |\n", 20 + i);
        }
        s
    };
    write(
        &dir,
        "select-sweep.md",
        &sweep(&["0.100", "0.150", "0.200", "0.120"]),
    );
    write(&dir, "dense-vs-mpi4py.md", &dense_vs_mpi4py());
    write(
        &dir,
        "onebit.md",
        "| kernel | ms | GB/s (f32 bytes of x) | stream/kernel | streams | memory GB/s |\n|---|---|---|---|---|---|\n| streaming pass dst = a·src (reference) | 7.50 | 8.95 | 1.00 | 2.00 | 17.90 |\n| worker compress: 1 pass, deferred (OneBitState) | 9.00 | 8.46 | 0.83 | 3.03 | 25.64 |\n",
    );
    // Ok-Topk, three runs (dense ms, its selection ms, pre-selected ms): 60/30/40 (1.50 ×),
    // 66/33/40 (1.65 ×), 80/40/50 (1.60 ×): median ratio 1.60, median times 66, 33 and 40 ms.
    // gTop-k's rows, here the fastest, must be ignored.
    let mut ok = String::new();
    for (d, sel, t) in [
        (60000, 30000, 40000),
        (66000, 33000, 40000),
        (80000, 40000, 50000),
    ] {
        ok += "load average: 0.5 0.5 0.5 1/80 1\n";
        ok += &bench_input_table(d, sel, t);
    }
    write(&dir, "oktopk-input.md", &ok);
    // The same bench across 4 hosts at 100 Mbit/s (shown for comparison), one table per repeat
    // (rR/): ratios 260/220 = 1.18…, 300/200 = 1.5, 210/200 = 1.05 → median 1.18; the times'
    // medians 260 and 200 ms.
    let cluster = dir.join("cluster");
    for (r, (d, t)) in [(260000, 220000), (300000, 200000), (210000, 200000)]
        .iter()
        .enumerate()
    {
        let rep = cluster.join(format!("r{}", r + 1));
        std::fs::create_dir_all(&rep).unwrap();
        write(
            &rep,
            "okinput-100mbit.md",
            &bench_input_table(*d, 40000, *t),
        );
    }
    let v = verdicts(&dir);
    // An io.md without per-repetition ratios: the ratio of medians it prints.
    check(&v, "Parquet write", Some("0.60 ×"), "met");
    check(&v, "Parquet read", Some("1.90 ×"), "met");
    check(&v, "select", Some("max/min 2.00"), "NOT met");
    // Per run 40/60, 42/62, 44/64 = 0.667, 0.677, 0.6875; the times' medians 42 and 62 ms.
    let ring4 = "ring ≤ 1.0 × mpi4py's Allreduce, 64 MiB, P = 4";
    check(
        &v,
        ring4,
        Some("0.68 × (0.67–0.69 ×); 42.0 vs 62.0 ms"),
        "met",
    );
    let stable = "ring 2 of 3 runs (1.10, 1.50, 1.20); mpi4py 3 of 3";
    check(
        &v,
        "ring stable: max/min of 10 calls ≤ 1.3, P = 4",
        Some(stable),
        "NOT met",
    );
    // Per run: native 60/60, 66/62, 70/64 = 1.0, 1.065, 1.094; 1-bit 30/40, 31/42, 35/44 =
    // 0.75, 0.738, 0.795 (the median of the ratios, not 31/42, the ratio of the medians).
    check(&v, "native", Some("1.06 × (1.00–1.09 ×)"), "met");
    check(
        &v,
        "1-bit allreduce",
        Some("0.75 × (0.74–0.80 ×) the ring's time"),
        "met",
    );
    check(&v, "1-bit compress", Some("0.83 ×"), "met");
    let ok = "1.60 × (1.50–1.65 ×); 66.0 ms, of which selection 33.0 ms, vs 40.0 ms";
    check(&v, "Ok-Topk", Some(ok), "NOT met");
    // No cluster directory given: no cluster rows.
    assert!(!v.iter().any(|r| r.0.contains("hosts")), "{v:?}");
    // Not written: "not measured", never a verdict.
    check(&v, "ring: time per element", None, "not measured");
    let ring2 = "ring ≤ 1.0 × mpi4py's Allreduce, 64 MiB, P = 2";
    check(&v, ring2, None, "not measured");

    // The P = 2 pair is shown for comparison, not counted as a goal.
    write(&dir, "dense-vs-mpi4py-p2.md", &dense_vs_mpi4py());
    // bench_io's per-repetition line: read 1.90, 2.10, 1.80; write 0.60, 0.55, 0.70.
    write(
        &dir,
        "io.md",
        "read: gradkit 1.95x pyarrow's read_table speed (same file); write: gradkit takes 0.61x pyarrow's write_table time (same settings)\nper repetition: read speed 1.90, 2.10, 1.80; write time 0.60, 0.55, 0.70\n",
    );
    // Three sweeps: max/min 2.00, 1.20, 1.40 → median 1.40, met.
    let mut sweeps = sweep(&["0.100", "0.150", "0.200", "0.120"]);
    sweeps += "\nsome text between runs\n";
    sweeps += &sweep(&["0.100", "0.120", "0.110"]);
    sweeps += &sweep(&["0.140", "0.100"]);
    write(&dir, "select-sweep.md", &sweeps);
    // The ring's time per element in three runs: 1 and 1.5 ns (1.5), 1 and 1.2 (1.2), 1 and
    // 1.3 (1.3) → median 1.3, met.
    let mut scaling = String::new();
    for t2 in [3000, 2400, 2600] {
        scaling += "| size_B | count | algo | time_us |\n|---:|---:|---|---:|\n";
        scaling += "| 4000000 | 1000000 | ring | 1000 |\n";
        scaling += &format!("| 8000000 | 2000000 | ring | {t2} |\n");
    }
    write(&dir, "dense-scaling.md", &scaling);
    let v = verdicts(&dir);
    check(&v, "Parquet write", Some("0.60 × (0.55–0.70 ×)"), "met");
    check(&v, "Parquet read", Some("1.90 × (1.80–2.10 ×)"), "met");
    check(&v, "select", Some("max/min 1.40 (1.20–2.00)"), "met");
    check(
        &v,
        "ring: time per element",
        Some("max/min 1.30 (1.20–1.50)"),
        "met",
    );
    check(&v, ring2, None, "(for comparison) within");
    let stable2 = "ring stable: max/min of 10 calls ≤ 1.3, P = 2";
    check(&v, stable2, None, "(for comparison) over");
    assert!(!v
        .iter()
        .any(|r| r.0.contains("native") && r.0.contains("P = 2")));

    // With the cluster's directory: its 100 Mbit/s row for comparison, none for 1 Gbit/s
    // (no file).
    let v = verdicts_with(&dir, Some(&cluster));
    let c = "Ok-Topk on dense input ≤ 1.3 × its time on pre-selected input, 4 hosts at 100mbit";
    let cm = "1.18 × (1.05–1.50 ×); 260.0 ms, of which selection 40.0 ms, vs 200.0 ms";
    check(&v, c, Some(cm), "(for comparison) within");
    assert!(!v.iter().any(|r| r.0.contains("1gbit")), "{v:?}");
    check(&v, "Ok-Topk", Some(ok), "NOT met");
}
