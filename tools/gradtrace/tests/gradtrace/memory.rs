//! Bounded memory (docs/RELIABILITY.md): `gradtrace synthetic` checks the model its flags
//! describe against the memory budget before generating anything.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_gradtrace");

fn synthetic(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let dir = std::env::temp_dir().join(format!("gradtrace-mem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("o.parquet");
    let mut c = Command::new(BIN);
    c.arg("synthetic")
        .args(args)
        .args(["--steps", "1", "-q", "-o", out.to_str().unwrap()])
        .env_remove("GRADKIT_MAX_MEMORY");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    if !o.status.success() {
        assert!(!out.exists(), "no output file after an error");
    }
    let _ = std::fs::remove_dir_all(&dir);
    o
}

fn fails_with(o: &std::process::Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("error: ") && err.lines().count() == 1,
        "{err}"
    );
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from: {err}");
    }
}

#[test]
fn huge_synthetic_models_are_refused_before_allocating() {
    // 2^32 − 1 elements on 2 ranks: 80 GiB of generator state (used to abort, exit 134).
    let o = synthetic(
        &["--layers", "w=4294967295", "--ranks", "2"],
        &[("GRADKIT_MAX_MEMORY", "64G")],
    );
    fails_with(
        &o,
        &[
            "4294967295 elements",
            "--ranks 2",
            "80.0 GiB",
            "GRADKIT_MAX_MEMORY",
        ],
    );
    // A billion ranks of a small layer.
    let o = synthetic(
        &[
            "--layers",
            "w=1000",
            "--ranks",
            "1000000000",
            "--max-memory",
            "64G",
        ],
        &[],
    );
    fails_with(&o, &["--ranks 1000000000", "--max-memory"]);
    // A shape whose product overflows u64 is refused, not wrapped to a small size.
    let o = synthetic(&["--layers", "w=4294967295x4294967295x4294967295"], &[]);
    fails_with(&o, &["18446744073709551615 elements"]);
    // The mlp (669,706 elements, 2 ranks: (2 + 3) × 4 bytes each = 12.8 MiB) fits 16 MiB.
    let o = synthetic(
        &["--shape", "mlp", "--ranks", "2", "--max-memory", "16M"],
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = synthetic(
        &["--shape", "mlp", "--ranks", "2", "--max-memory", "8M"],
        &[],
    );
    fails_with(&o, &["669706 elements", "8.0 MiB"]);
}
