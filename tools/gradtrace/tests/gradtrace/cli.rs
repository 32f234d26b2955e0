//! gradtrace run as a user runs it: pipes, files, byte-identical seeds, every validation error
//! (exit 1, one `error:` line naming the problem, no output and no `.tmp-` file), and import
//! of hand-built safetensors files.

use crate::common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use gradkit_core::io::{read_tensor, Input, ReadOptions};
use gradkit_core::synth::{self, SynthSpec};
use gradkit_core::TensorRow;

const BIN: &str = env!("CARGO_BIN_EXE_gradtrace");

struct Out {
    code: i32,
    stdout: Vec<u8>,
    stderr: String,
}

fn gradtrace(args: &[&str], dir: &Path) -> Out {
    let o = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: o.stdout,
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Parses CSV without quoted fields (inspect's numbers and names have none here).
fn csv(out: &[u8]) -> Vec<std::collections::HashMap<String, String>> {
    let text = String::from_utf8(out.to_vec()).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    lines
        .map(|l| {
            header
                .iter()
                .map(|h| h.to_string())
                .zip(l.split(',').map(str::to_string))
                .collect()
        })
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-3 * b.abs().max(1e-12)
}

#[test]
fn synthetic_piped_into_inspect_reports_what_the_rows_hold() {
    let mut gen = Command::new(BIN)
        .args([
            "synthetic",
            "--shape",
            "mlp",
            "--scale",
            "0.05",
            "--ranks",
            "2",
            "--steps",
            "3",
            "--seed",
            "4",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let inspect = Command::new(BIN)
        .args(["inspect", "-", "--format", "csv"])
        .stdin(gen.stdout.take().unwrap())
        .output()
        .unwrap();
    assert!(gen.wait().unwrap().success());
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    // The reference: the same trace from the library, summarised here.
    let spec = SynthSpec::new(synth::shape("mlp", 0.05).unwrap(), 2, 3, 4);
    let rows = synth::generate(&spec).unwrap();
    let table = csv(&inspect.stdout);
    assert_eq!(table.len(), 6);
    for (id, rec) in table.iter().enumerate() {
        let mine: Vec<&TensorRow> = rows.iter().filter(|r| r.layer_id == id as u32).collect();
        assert_eq!(rec["layer"], mine[0].layer);
        assert_eq!(rec["numel"], mine[0].numel.to_string());
        assert_eq!(
            (
                rec["rows"].as_str(),
                rec["steps"].as_str(),
                rec["ranks"].as_str()
            ),
            ("6", "3", "2")
        );
        let nnz: usize = mine
            .iter()
            .map(|r| r.values.iter().filter(|v| **v != 0.0).count())
            .sum();
        assert_eq!(rec["nnz"], nnz.to_string());
        let l2 = mine
            .iter()
            .map(|r| {
                r.values
                    .iter()
                    .map(|&v| (v as f64).powi(2))
                    .sum::<f64>()
                    .sqrt()
            })
            .sum::<f64>()
            / 6.0;
        assert!(
            close(rec["l2_norm"].parse().unwrap(), l2),
            "{} vs {l2}",
            rec["l2_norm"]
        );
        let min = mine
            .iter()
            .flat_map(|r| &r.values)
            .cloned()
            .fold(f32::INFINITY, f32::min);
        let max = mine
            .iter()
            .flat_map(|r| &r.values)
            .cloned()
            .fold(f32::NEG_INFINITY, f32::max);
        assert!(close(rec["min"].parse().unwrap(), min as f64));
        assert!(close(rec["max"].parse().unwrap(), max as f64));
    }
}

#[test]
fn inspect_counts_sparse_rows_and_their_implicit_zeros() {
    let dir = tempfile::tempdir().unwrap();
    common::write_rows(&dir.path().join("t.parquet"), &common::good_rows());
    let o = gradtrace(&["inspect", "t.parquet", "--format", "csv"], dir.path());
    assert_eq!(o.code, 0, "{}", o.stderr);
    let t = csv(&o.stdout);
    // Layer `b`: 4 sparse rows of numel 6 with 3 stored values each, all non-zero.
    assert_eq!(t[1]["layer"], "b");
    assert_eq!(t[1]["nnz"], "12");
    assert!(close(t[1]["density"].parse().unwrap(), 12.0 / 24.0));
    assert_eq!(t[1]["min"], "-2.000"); // stored minimum
    assert!(close(t[1]["max"].parse().unwrap(), 11.5));
    // Layer `w`: dense, one zero per row plus the first value of step 0 rank 0.
    assert_eq!(t[0]["nnz"], "11");
    assert!(close(t[0]["density"].parse().unwrap(), 11.0 / 16.0));
    let md = gradtrace(&["inspect", "t.parquet"], dir.path());
    let text = String::from_utf8(md.stdout).unwrap();
    assert!(
        text.contains("8 rows (dense and sparse), 2 steps (0..1), 2 ranks (0..1), 2 layers"),
        "{text}"
    );
    let json = gradtrace(&["inspect", "t.parquet", "--format", "json"], dir.path());
    assert!(String::from_utf8(json.stdout)
        .unwrap()
        .contains("\"layer\": \"b\""));
}

#[test]
fn synthetic_to_a_file_holds_the_generated_rows_and_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let o = gradtrace(
        &[
            "synthetic",
            "--layers",
            "fc1.weight=64x32,fc1.bias=64",
            "--ranks",
            "3",
            "--steps",
            "2",
            "--seed",
            "11",
            "--overlap",
            "0.3",
            "--drift",
            "0.8",
            "-o",
            "g.parquet",
        ],
        dir.path(),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.is_empty());
    assert_eq!(files(dir.path()), ["g.parquet"]);
    let t = read_tensor(
        &Input::Path(dir.path().join("g.parquet")),
        ReadOptions::default(),
    )
    .unwrap();
    let mut spec = SynthSpec::new(
        synth::parse_layers("fc1.weight=64x32,fc1.bias=64").unwrap(),
        3,
        2,
        11,
    );
    spec.overlap = 0.3;
    spec.drift = 0.8;
    assert_eq!(t.rows, synth::generate(&spec).unwrap());
    assert_eq!(t.rows[0].shape, Some(vec![64, 32]));
    for (k, v) in [
        ("method", "synthetic"),
        ("world_size", "3"),
        ("seed", "11"),
        ("overlap", "0.3"),
        ("drift", "0.8"),
    ] {
        assert_eq!(t.meta.get(k), Some(v), "{k}");
    }
    let producer = t.meta.get("gradkit.producer").unwrap();
    assert!(
        producer.starts_with("gradtrace 0.") && producer.contains("--seed 11"),
        "{producer}"
    );
}

#[test]
fn same_seed_gives_identical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let run = |seed: &str| {
        let o = gradtrace(
            &[
                "synthetic",
                "--shape",
                "lstm",
                "--scale",
                "0.002",
                "--ranks",
                "2",
                "--steps",
                "2",
                "--seed",
                seed,
            ],
            dir.path(),
        );
        assert_eq!(o.code, 0, "{}", o.stderr);
        o.stdout
    };
    let a = run("7");
    assert!(a.starts_with(b"PAR1") && a.len() > 10_000);
    assert_eq!(a, run("7"));
    assert_ne!(a, run("8"));
}

#[test]
fn every_validation_error_exits_1_with_one_line_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    for case in common::cases() {
        let name = format!("{}.parquet", case.name);
        (case.make)(&dir.path().join(&name));
        for args in [
            vec!["cat", name.as_str(), "-o", "out.parquet"],
            vec!["inspect", name.as_str()],
        ] {
            let o = gradtrace(&args, dir.path());
            assert_eq!(
                o.code, 1,
                "{}: {:?} exited {} ({})",
                case.name, args, o.code, o.stderr
            );
            assert!(o.stdout.is_empty(), "{}: output on stdout", case.name);
            let line = o.stderr.trim_end();
            assert!(
                line.starts_with("error: ") && !line.contains('\n'),
                "{}: `{line}`",
                case.name
            );
            assert!(
                line.contains(&name),
                "{}: file not named: {line}",
                case.name
            );
            for want in case.expect {
                assert!(
                    line.contains(want),
                    "{}: `{want}` not in `{line}`",
                    case.name
                );
            }
            let left: Vec<String> = files(dir.path())
                .into_iter()
                .filter(|f| f.starts_with("out.parquet"))
                .collect();
            assert!(left.is_empty(), "{}: left {left:?}", case.name);
        }
        if common::NONFINITE.contains(&case.name) {
            let o = gradtrace(
                &["cat", &name, "--allow-nonfinite", "-o", "ok.parquet"],
                dir.path(),
            );
            assert_eq!(o.code, 0, "{}", o.stderr);
            let o = gradtrace(
                &[
                    "inspect",
                    "ok.parquet",
                    "--allow-nonfinite",
                    "--format",
                    "csv",
                ],
                dir.path(),
            );
            assert_eq!(o.code, 0, "{}", o.stderr);
            std::fs::remove_file(dir.path().join("ok.parquet")).unwrap();
        }
    }
}

#[test]
fn cat_merges_traces_and_checks_layers_across_them() {
    let dir = tempfile::tempdir().unwrap();
    let rows = common::good_rows();
    let (a, b): (Vec<TensorRow>, Vec<TensorRow>) = rows.iter().cloned().partition(|r| r.rank == 0);
    common::write_rows(&dir.path().join("a.parquet"), &a);
    common::write_rows(&dir.path().join("b.parquet"), &b);
    let o = gradtrace(
        &["cat", "a.parquet", "b.parquet", "-o", "ab.parquet"],
        dir.path(),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let t = read_tensor(
        &Input::Path(dir.path().join("ab.parquet")),
        ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(t.rows, [a.clone(), b].concat());
    assert_eq!(t.meta.get("world_size"), Some("2"));
    // A layer whose numel differs between two files is refused.
    let mut c = a.clone();
    for r in &mut c {
        if r.layer == "w" {
            r.numel = 5;
            r.values.push(0.0);
            r.shape = None;
        }
    }
    common::write_rows(&dir.path().join("c.parquet"), &c);
    let o = gradtrace(
        &["cat", "a.parquet", "c.parquet", "-o", "ac.parquet"],
        dir.path(),
    );
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("c.parquet") && o.stderr.contains("column `numel`"),
        "{}",
        o.stderr
    );
    assert!(!dir.path().join("ac.parquet").exists());
}

#[test]
fn usage_errors_exit_2_and_help_shows_a_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        gradtrace(&["synthetic", "--ranks", "2"], dir.path()).code,
        2
    );
    assert_eq!(gradtrace(&["frobnicate"], dir.path()).code, 2);
    let o = gradtrace(
        &[
            "synthetic",
            "--shape",
            "mlp",
            "--overlap",
            "2",
            "-o",
            "x.parquet",
        ],
        dir.path(),
    );
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.starts_with("error: --overlap must lie in [0, 1]"),
        "{}",
        o.stderr
    );
    assert!(files(dir.path()).is_empty());
    let help = String::from_utf8(gradtrace(&["--help"], dir.path()).stdout).unwrap();
    assert!(help.contains("gradtrace synthetic") && help.contains("| gradtrace inspect"));
    for sub in ["synthetic", "import", "inspect", "cat"] {
        let h = gradtrace(&[sub, "--help"], dir.path());
        assert_eq!(h.code, 0);
        assert!(
            String::from_utf8(h.stdout).unwrap().contains("Examples:"),
            "{sub}"
        );
    }
}

/// A safetensors file built by hand: 8-byte little-endian header length, JSON header, data.
fn safetensors(path: &Path, tensors: &[(&str, &str, &[usize], Vec<u8>)]) {
    let mut header = String::from("{\"__metadata__\":{\"format\":\"pt\"}");
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        header.push_str(&format!(
            ",\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            dims.join(","),
            data.len(),
            data.len() + bytes.len()
        ));
        data.extend_from_slice(bytes);
    }
    header.push('}');
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    f.write_all(&data).unwrap();
}

fn le<T: Copy, const N: usize>(v: &[T], to: fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| to(x)).collect()
}

#[test]
fn import_hand_built_safetensors_converts_every_float_type_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("dumps");
    std::fs::create_dir(&d).unwrap();
    let w: Vec<f32> = vec![1.5, -2.25, 3.0e-3, 7.0, -0.0, 1e30];
    let b64: Vec<f64> = vec![0.1, -1e-5];
    let h16: Vec<u16> = vec![0x3C00, 0xC000, 0x0001, 0x7BFF]; // 1, -2, smallest subnormal, 65504
    let bf: Vec<u16> = vec![0x3F80, 0xC2F7]; // 1, -123.5
    for step in 0..2u32 {
        for rank in 0..2u32 {
            let wv: Vec<f32> = w.iter().map(|v| v * (1 + step + 2 * rank) as f32).collect();
            safetensors(
                &d.join(format!("step{step}_rank{rank}.safetensors")),
                &[
                    ("layer2.weight", "F32", &[2, 3], le(&wv, f32::to_le_bytes)),
                    ("bias64", "F64", &[2], le(&b64, f64::to_le_bytes)),
                    ("half", "F16", &[4], le(&h16, u16::to_le_bytes)),
                    ("brain", "BF16", &[1, 2], le(&bf, u16::to_le_bytes)),
                ],
            );
        }
    }
    let o = gradtrace(&["import", "dumps", "-o", "t.parquet"], dir.path());
    assert_eq!(o.code, 0, "{}", o.stderr);
    let t = read_tensor(
        &Input::Path(dir.path().join("t.parquet")),
        ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(t.rows.len(), 16);
    // File (data) order gives the layer ids.
    let names: Vec<&str> = t.rows[..4].iter().map(|r| r.layer.as_str()).collect();
    assert_eq!(names, ["layer2.weight", "bias64", "half", "brain"]);
    let r = |s: u32, k: u32, l: u32| {
        t.rows
            .iter()
            .find(|r| r.step == s && r.rank == k && r.layer_id == l)
            .unwrap()
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let w11: Vec<f32> = w.iter().map(|v| v * 4.0).collect();
    assert_eq!(bits(&r(1, 1, 0).values), bits(&w11));
    assert_eq!(r(1, 1, 0).shape, Some(vec![2, 3]));
    assert_eq!(
        bits(&r(0, 0, 1).values),
        bits(&[0.1f64 as f32, -1e-5f64 as f32])
    );
    assert_eq!(r(0, 0, 2).values, [1.0, -2.0, 2f32.powi(-24), 65504.0]);
    assert_eq!(r(0, 1, 3).values, [1.0, -123.5]);
    assert_eq!(r(0, 1, 3).shape, Some(vec![1, 2]));
    assert_eq!(t.meta.get("method"), Some("import"));
    // --order name numbers layers alphabetically.
    let o = gradtrace(
        &["import", "dumps", "--order", "name", "-o", "n.parquet"],
        dir.path(),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let t = read_tensor(
        &Input::Path(dir.path().join("n.parquet")),
        ReadOptions::default(),
    )
    .unwrap();
    let names: Vec<&str> = t.rows[..4].iter().map(|r| r.layer.as_str()).collect();
    assert_eq!(names, ["bias64", "brain", "half", "layer2.weight"]);
    // --step/--rank name a file's place when its name does not.
    std::fs::copy(
        d.join("step0_rank0.safetensors"),
        dir.path().join("grads.safetensors"),
    )
    .unwrap();
    let o = gradtrace(
        &[
            "import",
            "grads.safetensors",
            "--step",
            "9",
            "--rank",
            "3",
            "-o",
            "g.parquet",
        ],
        dir.path(),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let t = read_tensor(
        &Input::Path(dir.path().join("g.parquet")),
        ReadOptions::default(),
    )
    .unwrap();
    assert!(t.rows.iter().all(|r| r.step == 9 && r.rank == 3));
}

fn import_fails(setup: impl Fn(&Path), expect: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("dumps");
    std::fs::create_dir(&d).unwrap();
    setup(&d);
    let o = gradtrace(&["import", "dumps", "-o", "out.parquet"], dir.path());
    assert_eq!(o.code, 1, "{}", o.stderr);
    let line = o.stderr.trim_end();
    assert!(
        line.starts_with("error: ") && !line.contains('\n'),
        "{line}"
    );
    for want in expect {
        assert!(line.contains(want), "`{want}` not in `{line}`");
    }
    assert!(o.stdout.is_empty());
    assert_eq!(
        files(dir.path()),
        ["dumps"],
        "an output or .tmp- file was left behind"
    );
}

#[test]
fn import_errors_name_the_file_and_leave_nothing_behind() {
    let f32s = |v: &[f32]| le(v, f32::to_le_bytes);
    let ok =
        |d: &Path, name: &str| safetensors(&d.join(name), &[("w", "F32", &[2], f32s(&[1.0, 2.0]))]);
    // NaN in the second step, after the first was written out.
    import_fails(
        |d| {
            ok(d, "step0_rank0.safetensors");
            safetensors(
                &d.join("step1_rank0.safetensors"),
                &[("w", "F32", &[2], f32s(&[1.0, f32::NAN]))],
            );
        },
        &[
            "step1_rank0.safetensors",
            "non-finite value NaN",
            "--allow-nonfinite",
        ],
    );
    import_fails(
        |d| {
            safetensors(
                &d.join("step0_rank0.safetensors"),
                &[("ids", "I64", &[1], vec![0; 8])],
            )
        },
        &[
            "step0_rank0.safetensors",
            "tensor `ids`",
            "I64",
            "accepts float32",
        ],
    );
    import_fails(
        |d| {
            ok(d, "step0_rank0.safetensors");
            safetensors(
                &d.join("step1_rank0.safetensors"),
                &[("v", "F32", &[2], f32s(&[1.0, 2.0]))],
            );
        },
        &["step1_rank0.safetensors", "step 1 rank 0 has no tensor `w`"],
    );
    import_fails(
        |d| {
            ok(d, "step0_rank0.safetensors");
            safetensors(
                &d.join("step0_rank1.safetensors"),
                &[("w", "F32", &[3], f32s(&[1.0, 2.0, 3.0]))],
            );
        },
        &["step0_rank1.safetensors", "column `numel`", "layer `w`"],
    );
    import_fails(
        |d| ok(d, "gradients.safetensors"),
        &["gradients.safetensors", "step<S>_rank<R>", "--step"],
    );
    import_fails(
        |d| std::fs::write(d.join("step0_rank0.safetensors"), b"garbage").unwrap(),
        &["step0_rank0.safetensors", "not a .safetensors file"],
    );
    import_fails(|_| {}, &["no .safetensors, .npy or .npz files"]);
}

/// The environment variables gradkit reads are checked like flags, here too (where
/// `GRADKIT_COMM_TIMEOUT` has no effect, and `GRADKIT_MAX_MEMORY` may have none): a usage
/// error naming the variable and its values.
#[test]
fn a_bad_environment_variable_is_a_usage_error() {
    let d = tempfile::tempdir().unwrap();
    let args = [
        "synthetic",
        "--shape",
        "mlp",
        "--scale",
        "0.02",
        "--ranks",
        "2",
        "--steps",
        "1",
        "-o",
        "t.parquet",
        "-q",
    ];
    for (var, v, accepts) in gradkit_testkit::cli::BAD_ENV {
        gradkit_testkit::cli::env_refused(BIN, d.path(), &args, var, v, accepts);
    }
}

/// A layer with no values (`numel` 0, or only NaN under --allow-nonfinite) has no range:
/// its `min` and `max` are `-`, not the infinities an empty min/max starts from.
#[test]
fn inspect_prints_no_range_for_a_layer_without_values() {
    let dir = tempfile::tempdir().unwrap();
    let row = |layer_id: u32, layer: &str, values: Vec<f32>| TensorRow {
        step: 0,
        rank: 0,
        layer_id,
        layer: layer.into(),
        numel: values.len() as u64,
        shape: Some(vec![values.len() as u32]),
        indices: None,
        values,
    };
    let rows = vec![
        row(0, "w", vec![1.5, -2.0]),
        row(1, "empty", vec![]),
        row(2, "nan", vec![f32::NAN, f32::NAN]),
    ];
    common::write_rows(&dir.path().join("t.parquet"), &rows);
    let o = gradtrace(
        &[
            "inspect",
            "t.parquet",
            "--format",
            "csv",
            "--allow-nonfinite",
        ],
        dir.path(),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let t = csv(&o.stdout);
    assert_eq!(
        (t[0]["min"].as_str(), t[0]["max"].as_str()),
        ("-2.000", "1.500")
    );
    for r in &t[1..] {
        assert_eq!((r["min"].as_str(), r["max"].as_str()), ("-", "-"), "{r:?}");
    }
    let md = gradtrace(&["inspect", "t.parquet", "--allow-nonfinite"], dir.path());
    let text = String::from_utf8(md.stdout).unwrap();
    assert!(!text.contains("inf"), "{text}");
}

/// A damaged page is a runtime error (exit 1) in every subcommand that reads it, with one
/// line naming the file and its row group, whichever column it is in.
#[test]
fn a_damaged_page_is_exit_1_with_its_row_group() {
    use parquet::file::reader::FileReader;
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("t.parquet");
    common::write_rows(&good, &common::good_rows());
    for column in ["step", "values"] {
        let reader = parquet::file::serialized_reader::SerializedFileReader::new(
            std::fs::File::open(&good).unwrap(),
        )
        .unwrap();
        let g = reader.metadata().row_group(0);
        let col = (0..g.num_columns())
            .map(|c| g.column(c))
            .find(|c| c.column_path().string().split('.').next() == Some(column))
            .unwrap();
        let mut bytes = std::fs::read(&good).unwrap();
        let at = col.data_page_offset() as usize;
        for b in &mut bytes[at..at + 12] {
            *b ^= 0xff;
        }
        std::fs::write(dir.path().join("d.parquet"), &bytes).unwrap();
        for args in [
            &["inspect", "d.parquet"][..],
            &["cat", "d.parquet", "-o", "o.parquet"],
        ] {
            let o = gradtrace(args, dir.path());
            assert_eq!(o.code, 1, "{column} {args:?}: {}", o.stderr);
            assert_eq!(
                o.stderr.lines().count(),
                1,
                "{column} {args:?}: {}",
                o.stderr
            );
            assert!(
                o.stderr.starts_with(
                    "error: in d.parquet: row group 0 of 1 (file rows from 0): Parquet error: "
                ),
                "{column} {args:?}: {}",
                o.stderr
            );
            assert!(!dir.path().join("o.parquet").exists());
        }
    }
}
