//! Bounded memory on any input (docs/RELIABILITY.md): a model size from the flags or a label or
//! token id from a data file that would need more memory than the run may use stops with one
//! `error:` line (naming the flag, or the column, row and id) instead of aborting (exit 134).
//! Data files are written with pyarrow from the project's venv (`make deps`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_gradtrain");

fn python() -> PathBuf {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run `make deps` (it creates the venv with numpy and pyarrow)",
        py.display()
    );
    py
}

/// Runs a pyarrow snippet with `path` bound to the file to write.
fn write_with_pyarrow(path: &Path, body: &str) {
    let code = format!(
        "import pyarrow as pa, pyarrow.parquet as pq\npath = {:?}\n{body}",
        path.to_str().unwrap()
    );
    let o = Command::new(python()).args(["-c", &code]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn gradtrain(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args)
        .args(["-q", "--steps", "1", "--batch", "4"])
        .env_remove("GRADKIT_MAX_MEMORY");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// One `error:` line, exit 1, no panic or abort, mentioning every needle.
fn fails_with(o: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from: {err}");
    }
}

/// 40 examples of 4 features; labels 0/1 except `label_9` at row 9.
fn class_file(path: &Path, label_9: u64, metadata: &str) {
    write_with_pyarrow(
        path,
        &format!(
            "labels = [i % 2 for i in range(40)]; labels[9] = {label_9}\n\
             t = pa.table({{'features': pa.array([[float(i), 1.0, 0.5, float(i % 3)] for i in range(40)], pa.list_(pa.float32())),\n\
                           'label': pa.array(labels, pa.uint64())}})\n\
             t = t.replace_schema_metadata({{{metadata}}})\n\
             pq.write_table(t, path)"
        ),
    );
}

/// 20 documents of 20 tokens in 0..50, with `stray` at row 7, position 3.
fn token_file(path: &Path, stray: u64, metadata: &str) {
    write_with_pyarrow(
        path,
        &format!(
            "docs = [[(d * 7 + j) % 50 for j in range(20)] for d in range(20)]; docs[7][3] = {stray}\n\
             t = pa.table({{'tokens': pa.array(docs, pa.list_(pa.uint64()))}})\n\
             t = t.replace_schema_metadata({{{metadata}}})\n\
             pq.write_table(t, path)"
        ),
    );
}

#[test]
fn a_huge_label_is_refused_with_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.parquet");
    // One label 2^31 used to size the output layer for 2^31 + 1 classes (1 TB).
    class_file(&f, 1 << 31, "");
    let o = gradtrain(&["--model", "mlp", "--data", f.to_str().unwrap()], &[]);
    fails_with(
        &o,
        &[
            "row 9",
            "label 2147483648",
            "column `label`",
            "gradkit.classes",
        ],
    );
    // A declared class count bounds the labels, and it sizes the model.
    class_file(&f, 3, "b'gradkit.classes': b'3'");
    let o = gradtrain(&["--model", "mlp", "--data", f.to_str().unwrap()], &[]);
    fails_with(
        &o,
        &["row 9", "label 3", "column `label`", "gradkit.classes"],
    );
    class_file(&f, 2, "b'gradkit.classes': b'3'");
    let o = gradtrain(&["--model", "mlp", "--data", f.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_stray_token_id_is_refused_with_its_row_and_position() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("t.parquet");
    let lm = [
        "--model",
        "lstm-lm",
        "--seq-len",
        "8",
        "--hidden",
        "8",
        "--d-model",
        "8",
    ];
    for stray in [5_000_000u64, 4_000_000_000] {
        token_file(&f, stray, "");
        let o = gradtrain(&[&lm[..], &["--data", f.to_str().unwrap()]].concat(), &[]);
        fails_with(
            &o,
            &[
                "row 7, position 3",
                &format!("token id {stray}"),
                "column `tokens`",
                "--vocab",
            ],
        );
    }
    // --vocab declares the vocabulary: ids at or past it are refused, ids below train.
    token_file(&f, 60, "");
    let args = [&lm[..], &["--data", f.to_str().unwrap(), "--vocab", "55"]].concat();
    fails_with(
        &gradtrain(&args, &[]),
        &["row 7, position 3", "token id 60", "--vocab"],
    );
    let args = [&lm[..], &["--data", f.to_str().unwrap(), "--vocab", "64"]].concat();
    let o = gradtrain(&args, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // So does the file's metadata.
    token_file(&f, 60, "b'gradkit.vocab': b'55'");
    let args = [&lm[..], &["--data", f.to_str().unwrap()]].concat();
    fails_with(&gradtrain(&args, &[]), &["token id 60", "gradkit.vocab"]);
}

#[test]
fn model_sizes_from_flags_are_checked_before_allocating() {
    // --d-model 100000: 2.4·10^11 parameters (≈ 1 TB of f32 before gradients).
    let o = gradtrain(
        &[
            "--model",
            "transformer-lm",
            "--data",
            "synthetic-lm",
            "--d-model",
            "100000",
        ],
        &[("GRADKIT_MAX_MEMORY", "512G")],
    );
    fails_with(&o, &["--d-model 100000", "parameters", "--max-memory"]);
    // --hidden 100000 on the mlp: 10^10 parameters (≈ 373 GiB); refused under 100 GiB.
    let o = gradtrain(
        &[
            "--model",
            "mlp",
            "--hidden",
            "100000",
            "--max-memory",
            "100G",
        ],
        &[],
    );
    fails_with(
        &o,
        &["--hidden 100000", "10007600010 parameters", "100.0 GiB"],
    );
    // The synthetic source's V×V matrix (--vocab 65536: 32 GiB) and its --tokens.
    let o = gradtrain(
        &[
            "--model",
            "lstm-lm",
            "--data",
            "synthetic-lm",
            "--vocab",
            "65536",
        ],
        &[("GRADKIT_MAX_MEMORY", "8G")],
    );
    fails_with(&o, &["--vocab 65536", "32.0 GiB", "GRADKIT_MAX_MEMORY"]);
    let o = gradtrain(
        &[
            "--model",
            "lstm-lm",
            "--data",
            "synthetic-lm",
            "--tokens",
            "100000000000",
        ],
        &[("GRADKIT_MAX_MEMORY", "64G")],
    );
    fails_with(&o, &["--tokens 100000000000"]);
    // The default digits MLP fits a small budget and trains.
    let o = gradtrain(
        &["--model", "mlp", "--ranks", "2"],
        &[("GRADKIT_MAX_MEMORY", "256M")],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn embrace_counts_only_its_shard_of_the_embedding() {
    // lstm-lm with V = 2000, d = 8192 and hidden 8: the 16.4 M-float token embedding is nearly
    // the whole model. Replicated on 8 ranks (10 copies each, docs/RELIABILITY.md's estimate) it needs
    // about 5 GiB; under embrace each rank holds 1/8 of it (table + 2 moments), well below 1 GiB.
    let args = |ex: &'static str| {
        vec![
            "--model",
            "lstm-lm",
            "--data",
            "synthetic-lm",
            "--vocab",
            "2000",
            "--d-model",
            "8192",
            "--hidden",
            "8",
            "--seq-len",
            "8",
            "--ranks",
            "8",
            "--exchange",
            ex,
            "--max-memory",
            "1G",
        ]
    };
    fails_with(&gradtrain(&args("ring"), &[]), &["lstm-lm", "--max-memory"]);
    let o = gradtrain(&args("embrace"), &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
