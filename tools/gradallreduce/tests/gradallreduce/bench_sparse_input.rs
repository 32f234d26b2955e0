//! docs/MEMORY.md: `gradallreduce bench` runs the sparse algorithms on a gradient each rank makes
//! for itself, given either dense (the algorithm selects) or as its exact top-k (selected
//! before the clock starts). Checked here against Ok-Topk Table 1's TopkA volume, exactly
//! 2k(P−1) words per rank whichever input (both are an exact top-k of k entries), with
//! k = ⌊density·n⌋ worked out here; the rows each algorithm gets (DEFT selects for itself:
//! dense only); that the same --seed gives the same traffic in-process and under mpirun (each
//! rank's gradient does not depend on how ranks are launched); and the flag errors.

use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

/// The CSV table: (algo, input, bytes_sent, select_us) per row.
fn rows(out: &str) -> Vec<(String, String, u64, String)> {
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (a, i, b, s) = (
        col("algo"),
        col("input"),
        col("bytes_sent"),
        col("select_us"),
    );
    lines
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            (c[a].into(), c[i].into(), c[b].parse().unwrap(), c[s].into())
        })
        .collect()
}

const ARGS: &[&str] = &[
    "bench",
    "--algo",
    "topka,oktopk,deft",
    "--sizes",
    "256K:256K",
    "--iters",
    "2",
    "--warmup",
    "1",
    "--seed",
    "3",
    "--format",
    "csv",
    "-q",
];

#[test]
fn sparse_rows_follow_table_1_and_the_input_flag() {
    let o = Command::new(BIN)
        .args(ARGS)
        .args(["--ranks", "4"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let r = rows(&String::from_utf8(o.stdout).unwrap());
    let which: Vec<(&str, &str)> = r.iter().map(|x| (x.0.as_str(), x.1.as_str())).collect();
    assert_eq!(
        which,
        [
            ("topka", "dense"),
            ("topka", "top-k"),
            ("oktopk", "dense"),
            ("oktopk", "top-k"),
            ("deft", "dense")
        ]
    );
    // n = 256 KiB / 4 = 65,536 elements, k = ⌊0.01 · 65,536⌋ = 655, P = 4: TopkA sends
    // 2k(P−1) = 3,930 words (index and value) = 15,720 bytes.
    assert_eq!(r[0].2, 15_720, "{r:?}");
    assert_eq!(r[1].2, 15_720, "{r:?}");
    // Ok-Topk sends between 2k(P−1)/P and 6k(P−1)/P words (Table 1; ×4 bytes).
    for x in &r[2..4] {
        assert!((3_930..=11_790).contains(&x.2), "{x:?}");
    }
    // The algorithm's own selection is timed on dense input only.
    for x in &r {
        assert_eq!(x.3 == "-", x.1 == "top-k", "{x:?}");
    }
    // --input topk alone: TopkA and Ok-Topk only.
    let o = Command::new(BIN)
        .args([
            "bench",
            "--ranks",
            "2",
            "--algo",
            "topka,oktopk",
            "--input",
            "topk",
        ])
        .args([
            "--sizes", "64K:64K", "--iters", "1", "--format", "csv", "-q",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = rows(&String::from_utf8(o.stdout).unwrap());
    assert!(r.len() == 2 && r.iter().all(|x| x.1 == "top-k"), "{r:?}");
}

#[test]
fn flag_errors_name_the_flag() {
    for (args, needle) in [
        (
            &["--algo", "deft", "--input", "topk"][..],
            "error: deft selects for itself and runs on dense input only: give --input dense (flag --input)",
        ),
        (&["--algo", "oktopk", "--density", "0"], "error: --density must lie in (0, 1], got 0 (flag --density)"),
        (&["--algo", "alltoall"], "error: bench supports"),
        (&["--algo", "oktopk", "--input", "sparse"], "error: invalid value 'sparse' for '--input"),
    ] {
        let o = Command::new(BIN)
            .args(["bench", "--ranks", "2", "--sizes", "4K:4K", "--iters", "1"])
            .args(args)
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.starts_with(needle), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{args:?}: {e}");
    }
}

#[test]
fn each_rank_makes_the_same_gradient_under_mpirun() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let local = Command::new(BIN)
        .args(ARGS)
        .args(["--ranks", "4"])
        .output()
        .unwrap();
    assert!(
        local.status.success(),
        "{}",
        String::from_utf8_lossy(&local.stderr)
    );
    let mut cmd = gradkit_testkit::mpi::command(4);
    cmd.arg(BIN).args(ARGS).stdin(Stdio::null());
    let child = cmd.spawn().expect("start mpirun");
    let (status, out, err) =
        gradkit_testkit::mpi::wait_bounded(child, Duration::from_secs(300), "mpirun bench");
    assert!(status.success(), "{err}");
    let bytes = |r: Vec<(String, String, u64, String)>| -> Vec<(String, String, u64)> {
        r.into_iter().map(|x| (x.0, x.1, x.2)).collect()
    };
    assert_eq!(
        bytes(rows(&out)),
        bytes(rows(&String::from_utf8(local.stdout).unwrap()))
    );
}
