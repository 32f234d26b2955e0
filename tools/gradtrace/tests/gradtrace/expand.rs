//! `gradtrace expand` run as a user runs it: a 2-rank synthetic recording made into 6 ranks
//! keeps the recorded ranks' rows, makes each new rank's every layer, says its world size, is
//! byte-identical for a seed; and each mistake stops with one line naming it.

use std::path::Path;
use std::process::{Command, Stdio};

use gradkit_core::io::{read_tensor, Input, ReadOptions};

const BIN: &str = env!("CARGO_BIN_EXE_gradtrace");

fn gradtrace(args: &[&str], dir: &Path) -> (i32, String) {
    let o = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn two_ranks_become_six_and_mistakes_are_named() {
    let d = gradkit_testkit::tempdir("gradtrace-expand");
    let dir = d.path();
    let (code, err) = gradtrace(
        &[
            "synthetic",
            "--layers",
            "w=300,b=7",
            "--ranks",
            "2",
            "--steps",
            "3",
            "--seed",
            "4",
            "-q",
            "-o",
            "rec.parquet",
        ],
        dir,
    );
    assert_eq!(code, 0, "{err}");
    for out in ["a.parquet", "b.parquet"] {
        let (code, err) = gradtrace(
            &[
                "expand",
                "rec.parquet",
                "--ranks",
                "6",
                "--seed",
                "1",
                "-q",
                "-o",
                out,
            ],
            dir,
        );
        assert_eq!(code, 0, "{err}");
    }
    let rec = read_tensor(
        &Input::Path(dir.join("rec.parquet")),
        ReadOptions::default(),
    )
    .unwrap();
    let exp = read_tensor(&Input::Path(dir.join("a.parquet")), ReadOptions::default()).unwrap();
    assert_eq!(exp.meta.get("world_size"), Some("6"));
    assert_eq!(exp.meta.get("expanded_from"), Some("2"));
    assert_eq!(exp.rows.len(), 3 * 6 * 2, "every step, rank and layer");
    let again = read_tensor(&Input::Path(dir.join("b.parquet")), ReadOptions::default()).unwrap();
    assert_eq!(again.rows, exp.rows, "same seed, same rows");
    for r in &rec.rows {
        let e = exp
            .rows
            .iter()
            .find(|x| (x.step, x.rank, x.layer_id) == (r.step, r.rank, r.layer_id))
            .unwrap();
        assert_eq!(e.values, r.values, "recorded rank {} stays", r.rank);
    }
    // Mistakes (a selection's sparse rows: the unit test): fewer ranks than recorded; the
    // input as the output.
    let (code, err) = gradtrace(
        &["expand", "rec.parquet", "--ranks", "1", "-o", "x.parquet"],
        dir,
    );
    assert!(
        code != 0 && err.contains("fewer than the recording's 2 ranks"),
        "{err}"
    );
    assert!(!dir.join("x.parquet").exists());
    let (code, err) = gradtrace(
        &["expand", "rec.parquet", "--ranks", "4", "-o", "rec.parquet"],
        dir,
    );
    assert!(code != 0 && err.lines().count() == 1, "{err}");
}
