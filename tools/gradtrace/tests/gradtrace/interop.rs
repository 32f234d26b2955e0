//! Interoperability with the Python ecosystem through the project's venv (`make deps`):
//! pyarrow reads gradtrace files and sees the docs/FORMAT.md schema; gradtrace reads what pyarrow
//! writes; `gradtrace import` of numpy/hand-built dumps equals numpy's float32 bit for bit.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gradkit_core::io::{read_tensor, Input, ReadOptions};
use gradkit_core::TensorRow;

const BIN: &str = env!("CARGO_BIN_EXE_gradtrace");

fn python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let py = root.join(".venv/bin/python");
    if !py.exists() {
        panic!(
            "{} is missing: run `make deps` (it creates the venv with numpy and pyarrow)",
            py.display()
        );
    }
    py
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(name)
}

fn run_py(args: &[&Path]) -> String {
    let o = Command::new(python()).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "python {:?} failed:\n{}",
        args,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn gradtrace(args: &[&str], dir: &Path) -> String {
    let o = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "gradtrace {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// The canonical text form read_gradtrace.py prints.
fn canonical(r: &TensorRow) -> String {
    let join = |v: &[u32], sep: &str| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(sep)
    };
    format!(
        "{}|{}|{}|{}|{}|{}|{}|{}",
        r.step,
        r.rank,
        r.layer_id,
        r.layer,
        r.numel,
        r.shape.as_deref().map_or("-".into(), |s| join(s, "x")),
        r.indices.as_deref().map_or("-".into(), |i| join(i, " ")),
        r.values
            .iter()
            .map(|v| format!("{:08x}", v.to_bits()))
            .collect::<Vec<_>>()
            .join(" ")
    )
}

#[test]
fn pyarrow_reads_a_gradtrace_file_with_the_design_schema() {
    let dir = tempfile::tempdir().unwrap();
    let rows = common::good_rows();
    common::write_rows(&dir.path().join("in.parquet"), &rows);
    // Written by the tool: dense and sparse rows, null and present shapes.
    gradtrace(&["cat", "in.parquet", "-o", "t.parquet"], dir.path());
    let out = run_py(&[
        &script("read_gradtrace.py"),
        &dir.path().join("t.parquet"),
        Path::new("gradtrace"),
    ]);
    let want: Vec<String> = rows.iter().map(canonical).collect();
    assert_eq!(out.lines().collect::<Vec<_>>(), want);
    // And a synthetic trace.
    gradtrace(
        &[
            "synthetic",
            "--shape",
            "mlp",
            "--scale",
            "0.02",
            "--ranks",
            "2",
            "--steps",
            "2",
            "-o",
            "s.parquet",
        ],
        dir.path(),
    );
    let out = run_py(&[
        &script("read_gradtrace.py"),
        &dir.path().join("s.parquet"),
        Path::new("gradtrace"),
    ]);
    let t = read_tensor(
        &Input::Path(dir.path().join("s.parquet")),
        ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        t.rows.iter().map(canonical).collect::<Vec<_>>()
    );
}

/// The rows write_pyarrow.py writes, built independently here.
fn pyarrow_rows() -> Vec<TensorRow> {
    let mut rows = Vec::new();
    for step in 0..2u32 {
        for rank in 0..2u32 {
            let mut d = common::dense(
                step,
                rank,
                0,
                "enc.weight",
                (0..6)
                    .map(|i| (i * (step + 1)) as f32 - rank as f32)
                    .collect(),
            );
            d.shape = Some(vec![2, 3]);
            rows.push(d);
            rows.push(common::sparse(
                step,
                rank,
                1,
                "enc.bias",
                5,
                vec![1, 4],
                vec![step as f32 + 0.5, -(rank as f32) - 1.0],
            ));
        }
    }
    rows
}

#[test]
fn gradtrace_reads_a_table_pyarrow_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pa.parquet");
    run_py(&[&script("write_pyarrow.py"), &file]);
    let t = read_tensor(&Input::Path(file), ReadOptions::default()).unwrap();
    assert_eq!(t.rows, pyarrow_rows());
    assert_eq!(t.meta.get("gradkit.producer"), Some("pyarrow test"));
    let csv = gradtrace(&["inspect", "pa.parquet", "--format", "csv"], dir.path());
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[1],
        "0,enc.weight,2x3,6,4,2,2,21,0.8750,10.18,-1.000,10.00"
    );
    assert_eq!(lines[2], "1,enc.bias,-,5,4,2,2,8,0.4000,1.871,-2.000,1.500");
    // Through a pipe: pyarrow writes to stdout, gradtrace reads stdin.
    let mut py = Command::new(python())
        .args([script("write_pyarrow.py").as_os_str(), "-".as_ref()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let o = Command::new(BIN)
        .args(["inspect", "-", "--format", "csv"])
        .stdin(py.stdout.take().unwrap())
        .output()
        .unwrap();
    assert!(py.wait().unwrap().success());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8(o.stdout).unwrap(), csv);
}

#[test]
fn import_of_numpy_and_hand_built_dumps_is_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_py(&[&script("make_dumps.py"), &d.join("dumps")]);
    let expected = d.join("dumps/expected.npz");
    // npz: archive order = the order given to numpy.savez (parameter order).
    // npy: one file per layer, sorted by layer name.
    // safetensors: data order (the hand-built file keeps parameter order).
    for (kind, order) in [
        ("npz", "fc2.weight,fc1.bias,emb.weight,ln.weight"),
        ("npy", "emb.weight,fc1.bias,fc2.weight,ln.weight"),
        ("st", "fc2.weight,fc1.bias,emb.weight,ln.weight,attn.bf16"),
    ] {
        let out = format!("{kind}.parquet");
        gradtrace(&["import", &format!("dumps/{kind}"), "-o", &out], d);
        let ok = run_py(&[
            &script("check_import.py"),
            &d.join(&out),
            &expected,
            Path::new(kind),
            Path::new(order),
        ]);
        assert!(ok.starts_with("ok"), "{ok}");
    }
    // --order name sorts layer ids by name whatever the files say.
    gradtrace(
        &[
            "import",
            "dumps/npz",
            "--order",
            "name",
            "-o",
            "sorted.parquet",
        ],
        d,
    );
    run_py(&[
        &script("check_import.py"),
        &d.join("sorted.parquet"),
        &expected,
        Path::new("npz"),
        Path::new("emb.weight,fc1.bias,fc2.weight,ln.weight"),
    ]);
}

#[test]
fn import_refuses_integer_numpy_arrays_naming_the_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("step0_rank0.npy");
    let code = format!(
        "import numpy as np; np.save({:?}, np.arange(4, dtype=np.int32))",
        f.display().to_string()
    );
    let o = Command::new(python()).args(["-c", &code]).output().unwrap();
    assert!(o.status.success());
    let o = Command::new(BIN)
        .args(["import", "step0_rank0.npy", "-o", "o.parquet"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("step0_rank0.npy") && err.contains("<i4") && err.contains("accepts float32"),
        "{err}"
    );
    assert!(!dir.path().join("o.parquet").exists());
}
