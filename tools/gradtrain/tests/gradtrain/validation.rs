//! Validation that agrees across tools (docs/RELIABILITY.md), as gradtrain sees it:
//! every numeric flag out of its range, and a flag that cannot apply, is a usage error
//! (exit 2, one `error:` naming the flag, before any rank starts, no file written); resuming
//! a finished run says so and leaves --metrics alone; a damaged checkpoint reads as corrupt,
//! naming the file; an Ok-Topk resume off its schedule warns, and on it is exact.

use std::path::Path;
use std::process::{Command, Output};

use gradkit_core::io::{Input, ReadOptions};
use gradkit_core::{read_table, MetricRow};

fn gradtrain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gradtrain"))
        .args(args)
        .output()
        .expect("runs")
}

fn ok(args: &[&str]) -> String {
    let o = gradtrain(args);
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{args:?}: {e}");
    e
}

fn losses(p: &Path) -> Vec<(u32, u32, f64)> {
    let mut v: Vec<(u32, u32, f64)> =
        read_table::<MetricRow>(&Input::Path(p.to_path_buf()), ReadOptions::default())
            .unwrap()
            .rows
            .into_iter()
            .filter(|r| r.metric == "loss")
            .map(|r| (r.step, r.rank, r.value))
            .collect();
    v.sort_by_key(|r| (r.0, r.1));
    v
}

#[test]
fn out_of_range_and_inapplicable_flags_are_usage_errors() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.parquet");
    let ms = m.to_str().unwrap();
    for (args, needle) in [
        (&["--beta1", "1.5"][..], "--beta1 must be in [0, 1)"),
        (&["--beta2", "1"], "--beta2 must be in [0, 1)"),
        (&["--momentum", "1.5"], "--momentum must be in [0, 1)"),
        (&["--momentum=-0.1"], "--momentum must be in [0, 1)"),
        (&["--eps", "0"], "--eps must be a positive number"),
        (&["--eps", "nan"], "--eps must be a positive number"),
        (
            &["--optimizer", "lamb", "--lamb-min", "5", "--lamb-max", "1"],
            "--lamb-min 5 is larger than --lamb-max 1",
        ),
        (
            &["--lamb-max", "0"],
            "--lamb-max must be a finite number > 0",
        ),
        (
            &["--weight-decay=-1"],
            "--weight-decay must be a finite number ≥ 0",
        ),
        (
            &["--checkpoint-every", "5"],
            "--checkpoint-every needs --checkpoint",
        ),
        (&["--lr", "0"], "--lr must be a positive number"),
        (&["--lr", "inf"], "--lr must be a positive number"),
        (&["--density", "0"], "--density must be in (0, 1]"),
        (&["--steps", "0"], "--steps must be at least 1"),
        (&["--batch", "0"], "--batch must be at least 1"),
        (&["--hidden", "0"], "--hidden must be at least 1"),
        (&["--d-model", "0"], "--d-model must be at least 1"),
        (&["--layers", "0"], "--layers must be at least 1"),
        (&["--heads", "0"], "--heads must be at least 1"),
        (&["--seq-len", "0"], "--seq-len must be at least 1"),
        (&["--period", "0"], "--period must be at least 1"),
        (&["--reeval", "0"], "--reeval must be at least 1"),
        (&["--nesterov"], "--nesterov needs --momentum > 0"),
        (
            &["--optimizer", "adam", "--momentum", "0.9"],
            "--momentum and --nesterov apply to --optimizer sgd only",
        ),
        (&["--optimizer", "nope"], "unknown --optimizer `nope`"),
    ] {
        let mut a = args.to_vec();
        a.extend(["--ranks", "3", "--metrics", ms]);
        if !args.contains(&"--steps") {
            a.extend(["--steps", "2"]);
        }
        let o = gradtrain(&a);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.starts_with(&format!("error: {needle}")), "{args:?}: {e}");
        assert!(!e.contains("panicked") && !e.contains("thread"), "{e}");
        assert!(!m.exists(), "{args:?}: metrics written");
    }
}

#[test]
fn resuming_a_finished_run_has_nothing_to_do() {
    let d = tempfile::tempdir().unwrap();
    let (ck, m) = (d.path().join("ck"), d.path().join("m.parquet"));
    let (cks, ms) = (ck.to_str().unwrap(), m.to_str().unwrap());
    let common = ["--ranks", "2", "--checkpoint", cks, "--metrics", ms];
    ok(&[
        &common[..],
        &["--steps", "3", "--checkpoint-every", "3", "-q"],
    ]
    .concat());
    let before = std::fs::read(&m).unwrap();
    let e = ok(&[&common[..], &["--steps", "3", "--resume"]].concat());
    assert!(
        e.contains("nothing to do: the checkpoint in")
            && e.contains("is at step 3 and --steps is 3"),
        "{e}"
    );
    assert!(!e.contains("accuracy"), "{e}");
    assert_eq!(
        std::fs::read(&m).unwrap(),
        before,
        "--metrics was rewritten"
    );
}

#[test]
fn a_corrupt_checkpoint_is_named_as_such() {
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    let cks = ck.to_str().unwrap();
    ok(&[
        "--ranks",
        "2",
        "--steps",
        "2",
        "--checkpoint",
        cks,
        "--checkpoint-every",
        "2",
        "-q",
    ]);
    let f = ck.join("step-2").join("rank-1.safetensors");
    let good = std::fs::read(&f).unwrap();
    // Finite-looking garbage in the middle of the parameters.
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid..mid + 64].fill(0x3f);
    // A truncated file.
    let cut = good[..good.len() - 100].to_vec();
    for (what, bytes) in [("overwritten", bad), ("truncated", cut)] {
        std::fs::write(&f, bytes).unwrap();
        let o = gradtrain(&[
            "--ranks",
            "2",
            "--steps",
            "4",
            "--checkpoint",
            cks,
            "--resume",
            "-q",
        ]);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{what}: {e}");
        assert!(
            e.contains(&format!("checkpoint file {} is corrupt", f.display())),
            "{what}: {e}"
        );
        assert!(!e.contains("diverged"), "{what}: {e}");
    }
    // The original bytes resume.
    std::fs::write(&f, good).unwrap();
    ok(&[
        "--ranks",
        "2",
        "--steps",
        "4",
        "--checkpoint",
        cks,
        "--resume",
        "-q",
    ]);
}

#[test]
fn an_oktopk_resume_warns_off_its_schedule_and_is_exact_on_it() {
    let d = tempfile::tempdir().unwrap();
    let flags = [
        "--ranks",
        "2",
        "--exchange",
        "oktopk",
        "--period",
        "4",
        "--reeval",
        "2",
        "-q",
    ];
    let full = d.path().join("full.parquet");
    ok(&[
        &flags[..],
        &["--steps", "8", "--metrics", full.to_str().unwrap()],
    ]
    .concat());
    let full = losses(&full);
    for (stop, on_schedule) in [(4, true), (3, false)] {
        let ck = d.path().join(format!("ck{stop}"));
        let m = d.path().join(format!("m{stop}.parquet"));
        let (cks, ms, st) = (ck.to_str().unwrap(), m.to_str().unwrap(), stop.to_string());
        let every = ["--checkpoint", cks, "--checkpoint-every", st.as_str()];
        ok(&[&flags[..], &every, &["--steps", st.as_str()]].concat());
        let e = ok(&[
            &flags[..],
            &[
                "--checkpoint",
                cks,
                "--resume",
                "--steps",
                "8",
                "--metrics",
                ms,
            ],
        ]
        .concat());
        let resumed: Vec<_> = losses(&m).into_iter().filter(|r| r.0 >= stop).collect();
        let reference: Vec<_> = full.iter().copied().filter(|r| r.0 >= stop).collect();
        assert_eq!(resumed.len(), reference.len());
        if on_schedule {
            assert!(!e.contains("warning"), "{e}");
            assert_eq!(resumed, reference, "an on-schedule resume is exact");
        } else {
            assert!(
                e.contains(&format!("warning: resuming Ok-Topk at step {stop}"))
                    && e.contains("--period 4"),
                "{e}"
            );
            assert_ne!(resumed, reference, "the warning is warranted");
        }
    }
}

/// A language-model run small enough for a flag test (EmbRace's exchanges need one).
const LM: [&str; 12] = [
    "--model",
    "transformer-lm",
    "--data",
    "synthetic-lm",
    "--vocab",
    "64",
    "--tokens",
    "4000",
    "--d-model",
    "8",
    "--seq-len",
    "8",
];

#[test]
fn a_flag_that_would_be_ignored_is_a_usage_error() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.parquet");
    let ms = m.to_str().unwrap();
    let onebit = ["--optimizer", "onebit-lamb", "--exchange", "onebit"];
    // (flags, the flag named, what it was given with)
    let cases: Vec<(Vec<&str>, &str, &str)> = vec![
        (vec!["--schedule", "2d"], "--schedule", "`ring`"),
        (vec!["--schedule", "embrace"], "--schedule", "`ring`"),
        (
            [&LM[..], &["--exchange", "allgather", "--schedule", "2d"]].concat(),
            "--schedule",
            "`allgather`",
        ),
        (
            [
                &LM[..],
                &["--exchange", "allgather-raw", "--schedule", "fifo"],
            ]
            .concat(),
            "--schedule",
            "`allgather-raw`",
        ),
        (vec!["--density", "0.05"], "--density", "`ring`"),
        (
            [&onebit[..], &["--density", "0.05"]].concat(),
            "--density",
            "`onebit`",
        ),
        (
            [&LM[..], &["--exchange", "embrace", "--density", "0.05"]].concat(),
            "--density",
            "`embrace`",
        ),
        (vec!["--dense-warmup", "5"], "--dense-warmup", "`ring`"),
        (vec!["--dense-warmup", "0"], "--dense-warmup", "`ring`"),
        (vec!["--xi"], "--xi", "`ring`"),
        ([&onebit[..], &["--xi"]].concat(), "--xi", "`onebit`"),
        (
            vec!["--exchange", "cltk", "--period", "8"],
            "--period",
            "`cltk`",
        ),
        (
            vec!["--exchange", "topka", "--period", "8"],
            "--period",
            "`topka`",
        ),
        (vec!["--period", "8"], "--period", "`ring`"),
        (
            vec!["--exchange", "cltk", "--reeval", "4"],
            "--reeval",
            "`cltk`",
        ),
        (
            vec!["--exchange", "deft", "--reeval", "4"],
            "--reeval",
            "`deft`",
        ),
        (vec!["--freeze-step", "10"], "--freeze-step", "`sgd`"),
        (
            vec!["--optimizer", "lamb", "--freeze-step", "10"],
            "--freeze-step",
            "`lamb`",
        ),
        (vec!["--lookup", "per-token"], "--lookup", "`ring`"),
        (
            vec!["--exchange", "topka", "--wire", "f32"],
            "--wire",
            "`topka`",
        ),
        (vec!["--beta1", "0.8"], "--beta1", "`sgd`"),
        (vec!["--beta2", "0.99"], "--beta2", "`sgd`"),
        (vec!["--eps", "1e-6"], "--eps", "`sgd`"),
        (
            vec!["--optimizer", "adam", "--lamb-min", "0.1"],
            "--lamb-min",
            "`adam`",
        ),
        (
            vec![
                "--optimizer",
                "onebit-adam",
                "--exchange",
                "onebit",
                "--lamb-max",
                "5",
            ],
            "--lamb-max",
            "`onebit-adam`",
        ),
        (
            vec!["--model", "cnn", "--hidden", "32"],
            "--hidden",
            "`cnn`",
        ),
        (
            [&LM[..], &["--hidden", "32"]].concat(),
            "--hidden",
            "`transformer-lm`",
        ),
        (vec!["--d-model", "16"], "--d-model", "`mlp`"),
        (vec!["--layers", "1"], "--layers", "`mlp`"),
        (vec!["--heads", "2"], "--heads", "`mlp`"),
        (
            vec![
                "--model",
                "lstm-lm",
                "--data",
                "synthetic-lm",
                "--tokens",
                "4000",
                "--vocab",
                "64",
                "--layers",
                "3",
            ],
            "--layers",
            "`lstm-lm`",
        ),
        (vec!["--seq-len", "16"], "--seq-len", "`mlp`"),
        (vec!["--tokens", "5000"], "--tokens", "`digits`"),
        (vec!["--corpus-seed", "3"], "--corpus-seed", "`digits`"),
        (vec!["--vocab", "100"], "--vocab", "`digits`"),
    ];
    for (args, flag, with) in cases {
        let mut a = args.clone();
        a.extend(["--ranks", "2", "--steps", "1", "-q", "--metrics", ms]);
        let o = gradtrain(&a);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        let first = e.lines().next().unwrap_or("");
        assert!(
            first.starts_with(&format!("error: {flag} applies to ")) && first.contains(with),
            "{args:?}: {e}"
        );
        assert!(first.contains(&format!("(flag {flag})")), "{args:?}: {e}");
        assert_eq!(e.matches("error:").count(), 1, "{e}");
        assert!(!m.exists(), "{args:?}: metrics written");
    }
}

#[test]
fn each_flag_is_accepted_where_it_has_an_effect() {
    let d = tempfile::tempdir().unwrap();
    let onebit = ["--optimizer", "onebit-lamb", "--exchange", "onebit"];
    let mut cases: Vec<Vec<&str>> = vec![
        [&LM[..], &["--exchange", "embrace", "--schedule", "2d"]].concat(),
        [&LM[..], &["--exchange", "embrace", "--schedule", "fifo"]].concat(),
        [&onebit[..], &["--freeze-step", "1"]].concat(),
        vec![
            "--optimizer",
            "onebit-adam",
            "--exchange",
            "onebit",
            "--freeze-step",
            "1",
        ],
        vec!["--exchange", "oktopk", "--period", "8", "--reeval", "4"],
        [&LM[..], &["--exchange", "embrace", "--lookup", "unique"]].concat(),
        vec!["--wire", "fp16"],
        vec![
            "--exchange",
            "topka",
            "--dense-warmup",
            "1",
            "--wire",
            "fp16",
        ],
        vec![
            "--optimizer",
            "adam",
            "--beta1",
            "0.8",
            "--beta2",
            "0.99",
            "--eps",
            "1e-6",
        ],
        vec![
            "--optimizer",
            "lamb",
            "--lamb-min",
            "0.1",
            "--lamb-max",
            "5",
        ],
        vec!["--hidden", "16"],
        [
            &LM[..],
            &["--layers", "1", "--heads", "2", "--corpus-seed", "3"],
        ]
        .concat(),
        vec![
            "--model",
            "lstm-lm",
            "--data",
            "synthetic-lm",
            "--vocab",
            "64",
            "--tokens",
            "4000",
            "--hidden",
            "8",
            "--d-model",
            "8",
            "--seq-len",
            "8",
        ],
    ];
    for ex in [
        "topka",
        "gaussiank",
        "topkdsa",
        "gtopk",
        "oktopk",
        "deft",
        "cltk",
        "topk-union",
    ] {
        cases.push(vec![
            "--exchange",
            ex,
            "--density",
            "0.05",
            "--dense-warmup",
            "1",
            "--xi",
        ]);
    }
    for args in cases {
        let m = d.path().join("m.parquet");
        let mut a = args.clone();
        a.extend(["--ranks", "2", "--steps", "2", "-q"]);
        a.extend(["--metrics", m.to_str().unwrap()]);
        ok(&a);
        assert!(m.exists(), "{args:?}: no metrics");
        std::fs::remove_file(&m).unwrap();
    }
}

/// The environment variables gradkit reads are checked like flags, with in-process ranks too
/// (where `GRADKIT_COMM_TIMEOUT` has no effect): a usage error naming the variable and its
/// values.
#[test]
fn a_bad_environment_variable_is_a_usage_error() {
    let d = tempfile::tempdir().unwrap();
    let args = [
        "--model",
        "mlp",
        "--ranks",
        "2",
        "--steps",
        "1",
        "--metrics",
        "m.parquet",
        "-q",
    ];
    for (var, v, accepts) in gradkit_testkit::cli::BAD_ENV {
        gradkit_testkit::cli::env_refused(
            env!("CARGO_BIN_EXE_gradtrain"),
            d.path(),
            &args,
            var,
            v,
            accepts,
        );
    }
}

/// `--ranks 0` is a usage error like every other out-of-range flag (exit 2), not a runtime
/// error.
#[test]
fn ranks_zero_is_a_usage_error() {
    let o = gradtrain(&["--model", "mlp", "--ranks", "0", "--steps", "1", "-q"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("error: --ranks must be at least 1 (flag --ranks)"),
        "{err}"
    );
}
