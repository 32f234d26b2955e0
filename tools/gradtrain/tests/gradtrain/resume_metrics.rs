//! Training metrics survive an interruption (docs/RELIABILITY.md): each checkpoint carries the
//! metric rows so far, so a resumed run's `--metrics` covers the whole run; without
//! checkpoints `--metrics` is appended to every `--metrics-every` steps, so a killed run keeps
//! its finished steps. The reference is always an uninterrupted run of the same flags.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gradkit_core::io::{read_table, Input, ReadOptions};
use gradkit_core::MetricRow;

const BIN: &str = env!("CARGO_BIN_EXE_gradtrain");

/// Flags of every run here: a small, deterministic dense MLP run on 2 ranks.
const BASE: [&str; 8] = [
    "--model", "mlp", "--ranks", "2", "--lr", "0.1", "--batch", "16",
];

fn run(dir: &Path, extra: &[&str]) {
    let out = Command::new(BIN)
        .current_dir(dir)
        .args(BASE)
        .args(["-q"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// (step, rank, metric, value bits) of every row but the timings, which differ run to run.
type Key = (u32, u32, String, u64);

fn data_rows(p: &Path) -> Vec<Key> {
    let t = read_table::<MetricRow>(&Input::Path(p.into()), ReadOptions::default()).unwrap();
    let mut v: Vec<Key> = t
        .rows
        .into_iter()
        .filter(|r| !r.metric.starts_with("time_"))
        .map(|r| (r.step, r.rank, r.metric, r.value.to_bits()))
        .collect();
    v.sort();
    v
}

/// Starts gradtrain, waits until `ready` exists in `dir` (or the run ends), then SIGTERMs it;
/// returns whether it was killed (rather than already finished).
fn run_and_kill(dir: &Path, extra: &[&str], ready: &str) -> bool {
    let mut child = Command::new(BIN)
        .current_dir(dir)
        .args(BASE)
        .args(["-q"])
        .args(extra)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !dir.join(ready).exists() {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("gradtrain ended ({st}) before {ready} appeared");
        }
        assert!(start.elapsed() < Duration::from_secs(900), "hang guard");
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let st = child.wait().unwrap();
    // Killed (143) or, on a fast machine, already finished (0).
    assert!(matches!(st.code(), Some(143) | Some(0)), "{st}");
    st.code() == Some(143)
}

#[test]
fn a_run_resumed_from_a_checkpoint_has_the_metrics_of_the_whole_run() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let full = ["--steps", "10", "--eval-every", "5"];
    run(p, &[&full[..], &["--metrics", "whole.parquet"]].concat());
    // The first half ends at a checkpoint; the second half resumes from it.
    run(
        p,
        &[
            "--steps",
            "5",
            "--eval-every",
            "5",
            "--checkpoint",
            "ck",
            "--metrics",
            "first.parquet",
        ],
    );
    run(
        p,
        &[
            &full[..],
            &[
                "--checkpoint",
                "ck",
                "--resume",
                "--metrics",
                "resumed.parquet",
            ],
        ]
        .concat(),
    );
    let whole = data_rows(&p.join("whole.parquet"));
    assert_eq!(whole.iter().filter(|r| r.2 == "loss").count(), 20);
    assert_eq!(data_rows(&p.join("resumed.parquet")), whole);
    // The checkpoint carries the rows of its steps, and only those.
    let saved = data_rows(&p.join("ck/step-5/metrics.parquet"));
    let first_half: Vec<Key> = whole.iter().filter(|r| r.0 < 5).cloned().collect();
    assert_eq!(saved, first_half);
}

#[test]
fn a_killed_run_resumes_with_the_metrics_of_every_step() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    // A constant learning rate (no --decay), so a run's --steps does not change its steps.
    let whole = ["--steps", "100", "--eval-every", "50"];
    run(p, &[&whole[..], &["--metrics", "whole.parquet"]].concat());
    // Killed right after its first checkpoint, far from its end.
    let long = ["--steps", "20000", "--eval-every", "50"];
    let ck = ["--checkpoint", "ck", "--checkpoint-every", "10"];
    assert!(run_and_kill(p, &[&long[..], &ck[..]].concat(), "ck/latest"));
    let latest = std::fs::read_to_string(p.join("ck/latest")).unwrap();
    let at: u32 = latest.trim().trim_start_matches("step-").parse().unwrap();
    assert!(at < 100, "checkpoint at {at}");
    let resume = [
        "--checkpoint",
        "ck",
        "--resume",
        "--metrics",
        "resumed.parquet",
    ];
    run(p, &[&whole[..], &resume[..]].concat());
    assert_eq!(
        data_rows(&p.join("resumed.parquet")),
        data_rows(&p.join("whole.parquet"))
    );
}

#[test]
fn a_killed_run_keeps_the_metrics_of_its_finished_steps() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    // The file appears after 4 of 20000 steps, long before the end.
    assert!(run_and_kill(
        p,
        &[
            "--steps",
            "20000",
            "--metrics-every",
            "4",
            "--metrics",
            "m.parquet"
        ],
        "m.parquet",
    ));
    let kept = data_rows(&p.join("m.parquet"));
    let k = kept.iter().map(|r| r.0).max().unwrap() + 1;
    assert!(k % 4 == 0, "a rewrite after step {k}");
    // The reference: an uninterrupted run over the same steps (its final evaluation aside).
    let k_s = k.to_string();
    run(p, &["--steps", &k_s, "--metrics", "ref.parquet"]);
    let reference: Vec<Key> = data_rows(&p.join("ref.parquet"))
        .into_iter()
        .filter(|r| !r.2.starts_with("eval_"))
        .collect();
    assert_eq!(kept, reference);
    // No temporary file is left behind.
    let left = gradkit_testkit::cli::temp_files(p);
    assert!(left.is_empty(), "{left:?}");
}

/// `--metrics-every 1` appends the rows of every step to the file (thousands of rows, so the
/// file's open row group is closed and a new one opened several times): the same rows as one
/// table written at the end (`--metrics-every 0`), and as the default.
#[test]
fn appending_every_step_gives_the_rows_of_one_final_write() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    run(
        p,
        &[
            "--steps",
            "1200",
            "--metrics-every",
            "1",
            "--metrics",
            "each.parquet",
        ],
    );
    run(
        p,
        &[
            "--steps",
            "1200",
            "--metrics-every",
            "0",
            "--metrics",
            "end.parquet",
        ],
    );
    run(p, &["--steps", "1200", "--metrics", "default.parquet"]);
    let each = data_rows(&p.join("each.parquet"));
    assert!(each.len() > 3 * 4096, "{} rows", each.len());
    assert_eq!(each, data_rows(&p.join("end.parquet")));
    assert_eq!(each, data_rows(&p.join("default.parquet")));
    assert!(gradkit_testkit::cli::temp_files(p).is_empty());
}

/// A `--metrics` path that cannot be created stops the run before its first step (the
/// message of the check made first), not after the last.
#[test]
fn a_metrics_path_that_cannot_be_created_stops_the_run_first() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let bad = p.join("missing").join("m.parquet");
    let o = Command::new(BIN)
        .current_dir(p)
        .args(BASE)
        .args(["-q", "--steps", "3000", "--metrics-every", "0", "--metrics"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(
        err.trim_end(),
        format!(
            "error: --metrics {}: the directory {} does not exist",
            bad.display(),
            p.join("missing").display()
        )
    );
}

/// gradtrain in `dir` under a file-size limit of `blocks` (`ulimit -f`: 512-byte or 1 KiB
/// blocks, as the shell counts them) with SIGXFSZ at its default action, as a user's shell
/// leaves it: a write past the limit must be an error the tool reports (it ignores the
/// signal), not the signal's kill.
fn under_file_size_limit(dir: &Path, blocks: u32, extra: &[&str]) -> std::process::Output {
    Command::new("sh")
        .args([
            "-c",
            &format!("ulimit -f {blocks} && exec \"$0\" \"$@\""),
            BIN,
        ])
        .current_dir(dir)
        .args(BASE)
        .args(["-q"])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A run stopped by a failed append (`o`) printed one line and left `metrics` (under `dir`)
/// as its last complete append made it: a valid table holding exactly the rows of an
/// uninterrupted run over those steps (a multiple of `every`).
fn assert_kept_the_last_append(dir: &Path, o: &std::process::Output, every: u32, metrics: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "killed, or not stopped: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains(&format!("appending to {metrics}")),
        "{err}"
    );
    let kept = data_rows(&dir.join(metrics));
    let k = kept.iter().map(|r| r.0).max().unwrap() + 1;
    assert!(k % every == 0 && k < 20000, "{k} steps kept");
    let k_s = k.to_string();
    run(dir, &["--steps", &k_s, "--metrics", "ref.parquet"]);
    let reference: Vec<Key> = data_rows(&dir.join("ref.parquet"))
        .into_iter()
        .filter(|r| !r.2.starts_with("eval_"))
        .collect();
    assert_eq!(kept, reference, "--metrics-every {every}");
    let left = gradkit_testkit::cli::temp_files(dir.join(metrics).parent().unwrap());
    assert!(left.is_empty(), "{left:?}");
}

/// An append that fails part-way (the file-size limit, EFBIG, as a full disk's ENOSPC) stops
/// the run with one line, and the `--metrics` file is left as the last complete append made
/// it.
#[test]
fn a_failed_append_leaves_the_metrics_of_the_last_complete_one() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    for (every, blocks) in [(4u32, 100u32), (50, 400)] {
        let every_s = every.to_string();
        let o = under_file_size_limit(
            p,
            blocks,
            &[
                "--steps",
                "20000",
                "--metrics-every",
                &every_s,
                "--metrics",
                "m.parquet",
            ],
        );
        assert_kept_the_last_append(p, &o, every, "m.parquet");
    }
}

/// A tmpfs mounted for a test, unmounted when dropped.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The same on a full disk (ENOSPC): a small tmpfs, where mounting one is allowed (root);
/// skipped elsewhere.
#[test]
fn a_full_disk_leaves_the_metrics_of_the_last_complete_append() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    std::fs::create_dir(p.join("full")).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=128k", "tmpfs"])
        .arg(p.join("full"))
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs here (not root?)");
        return;
    }
    let _guard = Mounted(p.join("full"));
    let o = Command::new(BIN)
        .current_dir(p)
        .args(BASE)
        .args(["-q", "--steps", "20000", "--metrics", "full/m.parquet"])
        .output()
        .unwrap();
    assert_kept_the_last_append(p, &o, 50, "full/m.parquet");
}
