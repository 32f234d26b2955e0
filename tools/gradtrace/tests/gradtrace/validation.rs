//! Validation that agrees across tools (docs/RELIABILITY.md), as gradtrace sees it:
//! `cat` refuses a (step, rank, layer) that two inputs both hold, naming the key and both
//! files, and `inspect`'s Markdown table stays one row per layer whatever the layer's name.

use std::path::Path;
use std::process::Command;

use gradkit_core::io::{Meta, Output};
use gradkit_core::{write_table, TensorRow};

const BIN: &str = env!("CARGO_BIN_EXE_gradtrace");

/// A dense trace of the given layer names (3 elements each), ranks 0..2, steps `steps`.
fn trace(names: &[&str], steps: std::ops::Range<u32>) -> Vec<TensorRow> {
    let mut rows = Vec::new();
    for step in steps {
        for rank in 0..2u32 {
            for (id, name) in names.iter().enumerate() {
                rows.push(TensorRow {
                    step,
                    rank,
                    layer_id: id as u32,
                    layer: name.to_string(),
                    numel: 3,
                    shape: None,
                    indices: None,
                    values: vec![1.0 + id as f32, -2.0, 0.5 * rank as f32],
                });
            }
        }
    }
    rows
}

fn write(path: &Path, rows: &[TensorRow]) {
    write_table::<TensorRow>(&Output::Path(path.into()), &Meta::default(), rows).unwrap();
}

fn run(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(BIN).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn cat_refuses_a_key_held_twice() {
    let d = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        d.path().join("a.parquet"),
        d.path().join("b.parquet"),
        d.path().join("c.parquet"),
    );
    write(&a, &trace(&["w", "v"], 0..2));
    std::fs::copy(&a, &b).unwrap();
    // c overlaps a at step 1 only.
    write(&c, &trace(&["w", "v"], 1..3));
    let out = d.path().join("dup.parquet");
    let (a_s, b_s, c_s, o_s) = (
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        c.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    for (inputs, first, second, step) in [
        ([a_s, a_s], a_s, a_s, 0),
        ([a_s, b_s], a_s, b_s, 0),
        ([a_s, c_s], a_s, c_s, 1),
    ] {
        let (code, _, e) = run(&["cat", inputs[0], inputs[1], "-o", o_s]);
        assert_eq!(code, 1, "{inputs:?}: {e}");
        assert!(
            e.starts_with(&format!(
                "error: duplicate row: step {step}, rank 0, layer `w` is in {first} and again in {second} (key step, rank, layer)"
            )),
            "{inputs:?}: {e}"
        );
        assert!(!out.exists(), "{inputs:?}: output left behind");
    }
    // Disjoint inputs are concatenated.
    let e2 = d.path().join("e.parquet");
    write(&e2, &trace(&["w", "v"], 2..4));
    let (code, _, e) = run(&["cat", a_s, e2.to_str().unwrap(), "-o", o_s]);
    assert_eq!(code, 0, "{e}");
    assert!(out.exists());
}

/// The `|` that separate cells: those not escaped by a backslash.
fn separators(line: &str) -> usize {
    let mut n = 0;
    let mut escaped = false;
    for ch in line.chars() {
        match ch {
            '\\' if !escaped => escaped = true,
            '|' if !escaped => n += 1,
            _ => escaped = false,
        }
    }
    n
}

#[test]
fn inspect_markdown_escapes_layer_names() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().join("t.parquet");
    let names = [
        "pipe|name",
        "two\nlines",
        "nul\0byte",
        "back\\slash",
        "tab\tcr\r",
    ];
    write(&t, &trace(&names, 0..1));
    let (code, stdout, e) = run(&["inspect", "--format", "md", t.to_str().unwrap()]);
    assert_eq!(code, 0, "{e}");
    let table: Vec<&str> = stdout.lines().filter(|l| l.starts_with('|')).collect();
    // header, separator, one row per layer, each with the header's number of cells
    assert_eq!(table.len(), 2 + names.len(), "{stdout}");
    let cells = separators(table[0]);
    for l in &table {
        assert_eq!(separators(l), cells, "{l:?} in\n{stdout}");
    }
    assert!(!stdout.contains('\0'), "{stdout:?}");
    for want in [
        "pipe\\|name",
        "two\\nlines",
        "nul\\u{0}byte",
        "back\\\\slash",
        "tab\\tcr\\r",
    ] {
        assert!(
            table.iter().any(|l| l.contains(want)),
            "{want} not in\n{stdout}"
        );
    }
}
