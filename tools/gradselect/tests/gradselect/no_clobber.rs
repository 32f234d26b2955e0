//! Never destroy data: an output that names an input (or another output), by any path, is
//! refused before anything is read or written (docs/RELIABILITY.md).

use std::path::Path;
use std::process::Command;

use gradkit_core::io::{Meta, Output};
use gradkit_core::{write_table, TensorRow};

const BIN: &str = env!("CARGO_BIN_EXE_gradselect");

fn trace(path: &Path) {
    let mut rows = Vec::new();
    for step in 0..2u32 {
        for rank in 0..2u32 {
            rows.push(TensorRow {
                step,
                rank,
                layer_id: 0,
                layer: "w".into(),
                numel: 64,
                shape: None,
                indices: None,
                values: (0..64)
                    .map(|i| ((i * 7 + step + rank) % 13) as f32 - 6.0)
                    .collect(),
            });
        }
    }
    write_table(&Output::Path(path.into()), &Meta::default(), &rows).unwrap();
}

/// Runs the tool in `dir`: exit 1, one `error:` line naming `flags`, nothing changed.
fn refused(dir: &Path, args: &[&str], flags: &[&str]) {
    gradkit_testkit::cli::refused(BIN, dir, args, flags);
}

const SEL: [&str; 4] = ["--method", "topk", "--density", "0.1"];

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    SEL.iter().copied().chain(extra.iter().copied()).collect()
}

#[test]
fn an_output_naming_the_input_is_refused() {
    let d = tempfile::tempdir().unwrap();
    trace(&d.path().join("in.parquet"));
    refused(
        d.path(),
        &args(&["in.parquet", "-o", "in.parquet"]),
        &["-o", "IN", "in.parquet"],
    );
    refused(
        d.path(),
        &args(&["in.parquet", "-o", "./in.parquet"]),
        &["-o", "IN"],
    );
    refused(
        d.path(),
        &args(&["in.parquet", "-o", "out.parquet", "--metrics", "in.parquet"]),
        &["--metrics", "IN"],
    );
    refused(
        d.path(),
        &args(&[
            "in.parquet",
            "-o",
            "out.parquet",
            "--residual-out",
            "in.parquet",
        ]),
        &["--residual-out", "IN"],
    );
    // Through a symlink and a hard link: the same inode.
    std::os::unix::fs::symlink("in.parquet", d.path().join("link.parquet")).unwrap();
    refused(
        d.path(),
        &args(&["link.parquet", "-o", "in.parquet"]),
        &["-o", "IN"],
    );
    std::fs::hard_link(d.path().join("in.parquet"), d.path().join("hard.parquet")).unwrap();
    refused(
        d.path(),
        &args(&["in.parquet", "-o", "hard.parquet"]),
        &["-o", "IN"],
    );
}

#[test]
fn a_plan_input_is_not_overwritten() {
    let d = tempfile::tempdir().unwrap();
    trace(&d.path().join("in.parquet"));
    std::fs::write(d.path().join("plan.parquet"), b"not read").unwrap();
    refused(
        d.path(),
        &[
            "--method",
            "deft",
            "--density",
            "0.1",
            "--plan",
            "plan.parquet",
            "in.parquet",
            "-o",
            "plan.parquet",
        ],
        &["-o", "--plan"],
    );
}

#[test]
fn two_outputs_naming_one_file_are_refused() {
    let d = tempfile::tempdir().unwrap();
    trace(&d.path().join("in.parquet"));
    std::fs::create_dir(d.path().join("sub")).unwrap();
    // Neither exists yet: compared by directory and name.
    refused(
        d.path(),
        &args(&["in.parquet", "-o", "a.parquet", "--metrics", "./a.parquet"]),
        &["-o", "--metrics", "a.parquet"],
    );
    refused(
        d.path(),
        &args(&[
            "in.parquet",
            "-o",
            "sub/../a.parquet",
            "--residual-out",
            "a.parquet",
        ]),
        &["-o", "--residual-out"],
    )
}

#[test]
fn distinct_paths_and_devices_still_work() {
    let d = tempfile::tempdir().unwrap();
    trace(&d.path().join("in.parquet"));
    let out = Command::new(BIN)
        .current_dir(d.path())
        .args(args(&[
            "in.parquet",
            "-o",
            "out.parquet",
            "--metrics",
            "m.parquet",
            "-q",
        ]))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(d.path().join("out.parquet").is_file() && d.path().join("m.parquet").is_file());
    // /dev/null may be named by several outputs: nothing is replaced.
    let out = Command::new(BIN)
        .current_dir(d.path())
        .args(args(&[
            "in.parquet",
            "-o",
            "/dev/null",
            "--metrics",
            "/dev/null",
            "-q",
        ]))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every pair of gradselect's file flags given one file, by any path: refused, naming both.
#[test]
fn every_pair_of_file_flags_naming_one_file_is_refused() {
    use gradkit_testkit::cli::FileFlag;
    let d = tempfile::tempdir().unwrap();
    trace(&d.path().join("in.parquet"));
    trace(&d.path().join("x.parquet"));
    let f = |flag, reads, writes| FileFlag {
        flag,
        reads,
        writes,
    };
    let flags = [
        f("IN", true, false),
        f("--plan", true, false),
        f("-o", false, true),
        f("--residual-out", false, true),
        f("--metrics", false, true),
    ];
    let args = |pair: &[(&str, &str)]| {
        let plan = pair.iter().any(|(f, _)| *f == "--plan");
        let mut v: Vec<String> = ["--method", if plan { "deft" } else { "topk" }]
            .iter()
            .chain(&["--density", "0.1"])
            .map(|s| s.to_string())
            .collect();
        let input = pair.iter().find(|(f, _)| *f == "IN");
        v.push(input.map_or("in.parquet", |(_, p)| p).to_string());
        for (flag, path) in pair.iter().filter(|(f, _)| *f != "IN") {
            v.extend([flag.to_string(), path.to_string()]);
        }
        Some(v)
    };
    let runs =
        gradkit_testkit::cli::refuses_every_shared_file(BIN, d.path(), &flags, "x.parquet", &args);
    assert!(runs >= 40, "{runs}");
}
