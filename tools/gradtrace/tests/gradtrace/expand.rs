//! `gradtrace expand` run as a user runs it: a 2-rank synthetic recording made into 6 ranks
//! keeps the recorded ranks' rows, makes each new rank's every layer, says its world size,
//! gives the same rows for a seed; and each mistake stops with one line naming it.

use gradkit_core::io::{read_tensor, Input, ReadOptions};

const BIN: &str = env!("CARGO_BIN_EXE_gradtrace");

#[test]
fn two_ranks_become_six_and_mistakes_are_named() {
    let d = gradkit_testkit::tempdir("gradtrace-expand");
    let path = |name: &str| d.path().join(name).to_str().unwrap().to_string();
    let (rec, a, b, x) = (
        path("rec.parquet"),
        path("a.parquet"),
        path("b.parquet"),
        path("x.parquet"),
    );
    let gradtrace = |args: &[&str]| gradkit_testkit::cli::run(BIN, args);
    let synth = [
        "synthetic",
        "--layers",
        "w=300,b=7",
        "--ranks",
        "2",
        "--steps",
        "3",
        "--seed",
        "4",
    ];
    let (code, err) = gradtrace(&[&synth[..], &["-q", "-o", &rec]].concat());
    assert_eq!(code, 0, "{err}");
    for out in [&a, &b] {
        let (code, err) = gradtrace(&[
            "expand", &rec, "--ranks", "6", "--seed", "1", "-q", "-o", out,
        ]);
        assert_eq!(code, 0, "{err}");
    }
    let read = |p: &str| read_tensor(&Input::Path(p.into()), ReadOptions::default()).unwrap();
    let (recorded, exp, again) = (read(&rec), read(&a), read(&b));
    assert_eq!(exp.meta.get("world_size"), Some("6"));
    assert_eq!(exp.meta.get("expanded_from"), Some("2"));
    assert_eq!(exp.rows.len(), 3 * 6 * 2, "every step, rank and layer");
    assert_eq!(again.rows, exp.rows, "same seed, same rows");
    for r in &recorded.rows {
        let e = exp
            .rows
            .iter()
            .find(|x| (x.step, x.rank, x.layer_id) == (r.step, r.rank, r.layer_id))
            .unwrap();
        assert_eq!(e.values, r.values, "recorded rank {} stays", r.rank);
    }
    // Mistakes (a selection's sparse rows: the unit test): fewer ranks than recorded; the
    // input as the output.
    let (code, err) = gradtrace(&["expand", &rec, "--ranks", "1", "-o", &x]);
    assert!(
        code != 0 && err.contains("fewer than the recording's 2 ranks"),
        "{err}"
    );
    assert!(!std::path::Path::new(&x).exists());
    let (code, err) = gradtrace(&["expand", &rec, "--ranks", "4", "-o", &rec]);
    assert!(code != 0 && err.lines().count() == 1, "{err}");
}
