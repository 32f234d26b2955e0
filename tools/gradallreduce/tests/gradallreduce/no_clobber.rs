//! Never destroy data: gradallreduce refuses an output that names an input or another
//! output, before reading anything (docs/RELIABILITY.md). `--state` is read and written back.

use std::path::Path;
use std::process::Command;

use gradkit_core::io::{Meta, Output};
use gradkit_core::write_table;
use gradkit_core::TensorRow;

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

/// Runs the tool in `dir`: exit 1, one `error:` line naming `flags`, nothing changed.
fn refused(dir: &Path, args: &[&str], flags: &[&str]) {
    gradkit_testkit::cli::refused(BIN, dir, args, flags);
}

/// A fresh directory holding `in.parquet`, removed when the guard drops.
fn dir(tag: &str) -> gradkit_testkit::TempDir {
    let guard = gradkit_testkit::tempdir(&format!("gradallreduce-noclobber-{tag}-"));
    let d = guard.path();
    let rows: Vec<TensorRow> = (0..2u32)
        .map(|rank| TensorRow {
            step: 0,
            rank,
            layer_id: 0,
            layer: "w".into(),
            numel: 32,
            shape: None,
            indices: None,
            values: (0..32)
                .map(|i| (i as f32 - 16.0) * (rank + 1) as f32)
                .collect(),
        })
        .collect();
    write_table(&Output::Path(d.join("in.parquet")), &Meta::default(), &rows).unwrap();
    guard
}

#[test]
fn outputs_never_overwrite_inputs_or_each_other() {
    let d_dir = dir("refuse");
    let d = d_dir.path().to_path_buf();
    let r = ["--ranks", "2", "--algo", "ring", "in.parquet"];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        r.iter().copied().chain(extra.iter().copied()).collect()
    };
    refused(
        &d,
        &with(&["-o", "in.parquet"]),
        &["-o", "IN", "in.parquet"],
    );
    refused(
        &d,
        &with(&["-o", "o.parquet", "--metrics", "in.parquet"]),
        &["--metrics", "IN"],
    );
    refused(
        &d,
        &with(&["-o", "x.parquet", "--metrics", "./x.parquet"]),
        &["-o", "--metrics"],
    );
    std::fs::write(d.join("plan.parquet"), b"not read").unwrap();
    refused(
        &d,
        &[
            "--ranks",
            "2",
            "--algo",
            "oktopk",
            "in.parquet",
            "--plan",
            "plan.parquet",
            "-o",
            "plan.parquet",
        ],
        &["-o", "--plan"],
    );
    let ob = ["--ranks", "2", "--algo", "onebit", "in.parquet"];
    let onebit = |extra: &[&'static str]| -> Vec<&str> {
        ob.iter().copied().chain(extra.iter().copied()).collect()
    };
    refused(
        &d,
        &onebit(&["--state", "st.bin", "-o", "st.bin"]),
        &["-o", "--state"],
    );
    refused(
        &d,
        &onebit(&["--state", "in.parquet", "-o", "o.parquet"]),
        &["--state", "IN"],
    );
    // The state file may name itself: read, then written back.
    for _ in 0..2 {
        let out = Command::new(BIN)
            .current_dir(&d)
            .args(onebit(&["--state", "st.bin", "-o", "o.parquet", "-q"]))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// Every pair of gradallreduce's file flags given one file, by any path: refused, naming
/// both (`--plan` goes with oktopk, `--state` with onebit; the two never meet).
#[test]
fn every_pair_of_file_flags_naming_one_file_is_refused() {
    use gradkit_testkit::cli::FileFlag;
    let d_dir = dir("pairs");
    let d = d_dir.path();
    std::fs::copy(d.join("in.parquet"), d.join("x.parquet")).unwrap();
    let f = |flag, reads, writes| FileFlag {
        flag,
        reads,
        writes,
    };
    let flags = [
        f("IN", true, false),
        f("--plan", true, false),
        f("--state", true, true),
        f("-o", false, true),
        f("--metrics", false, true),
        f("--comm-trace", false, true),
    ];
    let args = |pair: &[(&str, &str)]| {
        let has = |flag: &str| pair.iter().any(|(f, _)| *f == flag);
        let algo = match (has("--plan"), has("--state")) {
            (true, true) => return None,
            (true, false) => "oktopk",
            (false, true) => "onebit",
            (false, false) => "ring",
        };
        let mut v: Vec<String> = vec!["--ranks".into(), "2".into(), "--algo".into(), algo.into()];
        let input = pair.iter().find(|(f, _)| *f == "IN");
        v.push(input.map_or("in.parquet", |(_, p)| p).to_string());
        for (flag, path) in pair.iter().filter(|(f, _)| *f != "IN") {
            v.extend([flag.to_string(), path.to_string()]);
        }
        Some(v)
    };
    let runs = gradkit_testkit::cli::refuses_every_shared_file(BIN, d, &flags, "x.parquet", &args);
    assert!(runs >= 50, "{runs}");
    // bench's two outputs.
    let bench = [f("--metrics", false, true), f("--comm-trace", false, true)];
    let args = |pair: &[(&str, &str)]| {
        let mut v: Vec<String> = [
            "bench", "--ranks", "2", "--algo", "ring", "--sizes", "1K:1K",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for (flag, path) in pair {
            v.extend([flag.to_string(), path.to_string()]);
        }
        Some(v)
    };
    let runs = gradkit_testkit::cli::refuses_every_shared_file(BIN, d, &bench, "x.parquet", &args);
    assert_eq!(runs, 6);
}
