//! Bounded memory on any input (docs/RELIABILITY.md): a tiny trace or flag that names a huge
//! size stops with one `error:` line naming the column or flag, the bytes and the override,
//! before anything is allocated, instead of aborting (exit 134) or growing without bound.

use std::path::Path;
use std::process::{Command, Output as ProcOutput};

use gradkit_core::{write_table, Meta, Output, TensorRow};

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

/// A fresh directory for one test, removed when the guard drops.
fn tmpdir(name: &str) -> gradkit_testkit::TempDir {
    gradkit_testkit::tempdir(&format!("gradallreduce-mem-{name}-"))
}

/// A 2-rank, 1-step sparse trace of one layer of `numel` elements with 3 nonzeros per rank.
fn sparse_trace(path: &Path, numel: u64) {
    let rows: Vec<TensorRow> = (0..2)
        .map(|rank| TensorRow {
            step: 0,
            rank,
            layer_id: 0,
            layer: "huge.weight".into(),
            numel,
            shape: None,
            indices: Some(vec![1, 5, 9]),
            values: vec![1.0, -2.0, 0.5],
        })
        .collect();
    write_table(&Output::Path(path.to_path_buf()), &Meta::default(), &rows).unwrap();
}

fn run(args: &[&str], env: &[(&str, &str)]) -> ProcOutput {
    let mut c = Command::new(BIN);
    c.args(args).env_remove("GRADKIT_MAX_MEMORY");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// One `error:` line, exit 1, no panic or abort, the message names `needle` and the
/// override.
fn assert_refused(o: &ProcOutput, needle: &str) {
    assert_one_error(o, needle);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--max-memory"), "no override named: {err}");
}

/// One `error:` line, exit 1, no panic or abort, and the message names `needle`.
fn assert_one_error(o: &ProcOutput, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(err.starts_with("error: "), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line, got: {err}");
    assert!(err.contains(needle), "`{needle}` missing from: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn huge_numel_is_refused_before_allocating() {
    let d_dir = tmpdir("numel");
    let d = d_dir.path().to_path_buf();
    let t = d.join("t.parquet");
    let out = d.join("out.parquet");
    // 2^40 elements (4 TiB per dense buffer; sparse input, so past what UInt32 indices
    // address): refused whatever the limit. 2^32 − 1 (valid under the schema): 16 GiB per
    // buffer (×2 ranks ×4 buffers + a result), refused under 100 GiB and under an
    // explicit 1 GiB limit (flag and environment variable).
    for (numel, algo) in [
        (1u64 << 40, "ring"),
        (1 << 40, "onebit"),
        (1 << 40, "topka"),
    ] {
        sparse_trace(&t, numel);
        let o = run(
            &[
                "--algo",
                algo,
                "--ranks",
                "2",
                t.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ],
            &[],
        );
        assert_one_error(&o, "numel");
        assert!(!out.exists(), "no output file after an error");
    }
    for algo in ["ring", "onebit"] {
        sparse_trace(&t, u32::MAX as u64);
        let o = run(
            &[
                "--algo",
                algo,
                "--ranks",
                "2",
                "--max-memory",
                "100G",
                t.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ],
            &[],
        );
        assert_refused(&o, "numel");
        assert!(!out.exists(), "no output file after an error");
    }
    sparse_trace(&t, u32::MAX as u64);
    let args = [
        "--algo",
        "ring",
        "--ranks",
        "2",
        t.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    let o = run(&[&args[..], &["--max-memory", "1G"]].concat(), &[]);
    assert_refused(&o, "numel");
    assert!(String::from_utf8_lossy(&o.stderr).contains("1.0 GiB"));
    let o = run(&args, &[("GRADKIT_MAX_MEMORY", "1G")]);
    assert_refused(&o, "GRADKIT_MAX_MEMORY");
    // A small model under the same limit runs and sums exactly.
    sparse_trace(&t, 16);
    let o = run(&args, &[("GRADKIT_MAX_MEMORY", "1G")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got =
        gradkit_core::read_tensor(&gradkit_core::Input::Path(out.clone()), Default::default())
            .unwrap();
    let mut want = vec![0f32; 16];
    (want[1], want[5], want[9]) = (2.0, -4.0, 1.0);
    assert_eq!(got.rows.len(), 1);
    assert_eq!(got.rows[0].to_dense(), want);
}

#[test]
fn sparse_index_space_past_u32_is_refused() {
    let d_dir = tmpdir("u32");
    let d = d_dir.path().to_path_buf();
    let t = d.join("t.parquet");
    sparse_trace(&t, (1u64 << 32) + 8);
    let out = d.join("o.parquet");
    let o = run(
        &[
            "--algo",
            "topka",
            "--ranks",
            "2",
            "--max-memory",
            "1000T",
            t.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("2^32") && err.contains("numel"), "{err}");
}

#[test]
fn bench_sizes_are_bounded_and_do_not_wrap() {
    // 64 GiB per buffer on 4 ranks: refused under a 512 GiB limit too.
    let o = run(
        &[
            "bench",
            "--ranks",
            "4",
            "--sizes",
            "64G:64G",
            "--max-memory",
            "512G",
        ],
        &[],
    );
    assert_refused(&o, "--sizes 64G:64G");
    // u64::MAX:u64::MAX used to wrap (s *= 4 < MAX again) and grow a list without bound;
    // now the list is one size, which the budget refuses.
    let max = u64::MAX.to_string();
    let spec = format!("{max}:{max}");
    let o = run(&["bench", "--ranks", "2", "--sizes", &spec], &[]);
    assert_refused(&o, "--sizes");
    // Past 2^64 − 1 is a parse error, not a saturated or wrapped size: a usage error.
    let o = run(&["bench", "--ranks", "2", "--sizes", "1:16777216T"], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("2^64") && err.contains("(flag --sizes)"),
        "{err}"
    );
    // A bad --max-memory is a usage error naming the flag.
    let o = run(&["bench", "--max-memory", "lots"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--max-memory"));
}

#[test]
fn bench_small_sizes_still_run_under_a_limit() {
    let o = run(
        &[
            "bench", "--algo", "ring", "--ranks", "2", "--sizes", "1K:4K", "--iters", "1",
            "--warmup", "0", "-q", "--format", "csv",
        ],
        &[("GRADKIT_MAX_MEMORY", "64M")],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // 1K and 4K (factor 4), the sizes an independent count gives: header + 2 rows.
    assert_eq!(out.lines().count(), 3, "{out}");
}
