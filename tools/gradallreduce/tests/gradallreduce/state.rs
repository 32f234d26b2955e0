//! `--state FILE` as a user runs it: a 1-bit run cut in two (saving the errors after the
//! first part, loading them before the second) gives the uninterrupted run's results and the
//! same state file, byte for byte, with Local ranks and under mpirun; the file has the
//! documented layout; a file saved for another run is refused and left alone.

use std::path::Path;
use std::process::{Command, Output as ProcOutput, Stdio};

use gradkit_core::{read_tensor, write_table, Input, Meta, Output, TensorRow};

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

/// A fresh directory for one test, removed when the guard drops.
fn tmpdir(name: &str) -> gradkit_testkit::TempDir {
    gradkit_testkit::tempdir(&format!("gradallreduce-state-{name}-"))
}

fn write_trace(path: &Path, rows: &[TensorRow]) {
    write_table(&Output::Path(path.to_path_buf()), &Meta::default(), rows).unwrap();
}

fn run(cmd: &mut Command) -> ProcOutput {
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run")
}

/// `gradallreduce --algo ALGO -q IN -o OUT --state STATE`, Local (`--ranks p`) or mpirun.
fn reduce(mpi: bool, p: usize, algo: &str, inp: &Path, out: &Path, state: &Path) -> ProcOutput {
    let mut c = if mpi {
        let mut c = Command::new("mpirun");
        gradkit_testkit::mpi::isolate(&mut c);
        c.args(["-np", &p.to_string(), "--oversubscribe", BIN]);
        c
    } else {
        let mut c = Command::new(BIN);
        c.args(["--ranks", &p.to_string()]);
        c
    };
    run(c
        .args(["--algo", algo, "-q"])
        .arg(inp)
        .arg("-o")
        .arg(out)
        .arg("--state")
        .arg(state))
}

fn ok(o: &ProcOutput) {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn rows_of(path: &Path) -> Vec<TensorRow> {
    read_tensor(&Input::Path(path.to_path_buf()), Default::default())
        .unwrap()
        .rows
}

/// Layers of 1000 + 37 = 1037 elements. On 3 ranks the 1-bit buffer is padded to a multiple
/// of P·lcm(P, 8) = 72: 1080, server chunks 360; onebit-naive pads to a multiple of 8: 1040.
const LAYERS: &[(&str, u64)] = &[("fc1.weight", 1000), ("fc1.bias", 37)];

#[test]
fn a_run_cut_in_two_equals_the_whole_run() {
    let d_dir = tmpdir("cut");
    let d = d_dir.path().to_path_buf();
    let p = 3u32;
    let all = gradkit_testkit::traces::dense(p, 5, LAYERS);
    let (whole, part1, part2) = (
        d.join("whole.parquet"),
        d.join("a.parquet"),
        d.join("b.parquet"),
    );
    write_trace(&whole, &all);
    let (first, second): (Vec<TensorRow>, Vec<TensorRow>) =
        all.iter().cloned().partition(|r| r.step < 3);
    write_trace(&part1, &first);
    write_trace(&part2, &second);
    for (algo, padded, server) in [("onebit", 1080usize, 360usize), ("onebit-naive", 1040, 0)] {
        for mpi in [false, true] {
            let tag = format!("{algo}-{}", if mpi { "mpi" } else { "local" });
            let (s_whole, s_cut) = (
                d.join(format!("{tag}-whole.st")),
                d.join(format!("{tag}-cut.st")),
            );
            let (o_whole, o_a, o_b) = (
                d.join(format!("{tag}-whole.parquet")),
                d.join(format!("{tag}-a.parquet")),
                d.join(format!("{tag}-b.parquet")),
            );
            ok(&reduce(mpi, 3, algo, &whole, &o_whole, &s_whole));
            ok(&reduce(mpi, 3, algo, &part1, &o_a, &s_cut));
            let after_first = std::fs::read(&s_cut).unwrap();
            ok(&reduce(mpi, 3, algo, &part2, &o_b, &s_cut));
            // The resumed second part reduces exactly as steps 3-4 of the whole run.
            let whole_rows = rows_of(&o_whole);
            let late: Vec<&TensorRow> = whole_rows.iter().filter(|r| r.step >= 3).collect();
            let resumed = rows_of(&o_b);
            assert_eq!(late.len(), resumed.len(), "{tag}");
            for (w, r) in late.iter().zip(&resumed) {
                assert_eq!((w.step, w.layer_id), (r.step, r.layer_id), "{tag}");
                assert_eq!(
                    w.values, r.values,
                    "{tag} step {} layer {}",
                    r.step, r.layer
                );
            }
            // The state after the cut run is the whole run's, byte for byte.
            let bytes = std::fs::read(&s_cut).unwrap();
            assert_eq!(
                bytes,
                std::fs::read(&s_whole).unwrap(),
                "{tag}: state differs"
            );
            assert_ne!(
                bytes, after_first,
                "{tag}: the second part saved nothing new"
            );
            // The documented layout, read by hand.
            assert_eq!(&bytes[..8], b"GKONEBIT");
            let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
            let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
            let variant = if algo == "onebit" { 0 } else { 1 };
            assert_eq!(
                (u32_at(8), u32_at(12), u32_at(16)),
                (1, variant, 3),
                "{tag}"
            );
            assert_eq!(
                (u64_at(20), u64_at(28), u64_at(36)),
                (1037, padded as u64, server as u64)
            );
            assert_eq!(bytes.len(), 44 + 3 * 4 * (padded + server), "{tag}");
            // Error feedback left something in every rank's worker error.
            for r in 0..3 {
                let off = 44 + r * 4 * (padded + server);
                let w = &bytes[off..off + 4 * padded];
                assert!(
                    w.iter().any(|b| *b != 0),
                    "{tag}: rank {r} worker error all zero"
                );
            }
        }
    }
    // Local and MPI runs save the same file.
    for algo in ["onebit", "onebit-naive"] {
        assert_eq!(
            std::fs::read(d.join(format!("{algo}-local-cut.st"))).unwrap(),
            std::fs::read(d.join(format!("{algo}-mpi-cut.st"))).unwrap(),
            "{algo}"
        );
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_state_saved_for_another_run_is_refused_and_kept() {
    let d_dir = tmpdir("other");
    let d = d_dir.path().to_path_buf();
    let t3 = d.join("t3.parquet");
    write_trace(&t3, &gradkit_testkit::traces::dense(3, 1, LAYERS));
    let t2 = d.join("t2.parquet");
    write_trace(&t2, &gradkit_testkit::traces::dense(2, 1, LAYERS));
    let st = d.join("s.st");
    ok(&reduce(false, 3, "onebit", &t3, &d.join("o3.parquet"), &st));
    let saved = std::fs::read(&st).unwrap();
    let out = d.join("o2.parquet");
    for (p, algo, inp, want) in [
        (2, "onebit", &t2, "saved for Server on 3 ranks with 1037 elements, but this run is Server on 2 ranks with 1037 elements"),
        (3, "onebit-naive", &t3, "saved for Server on 3 ranks with 1037 elements, but this run is Naive on 3 ranks"),
    ] {
        for mpi in [false, true] {
            let o = reduce(mpi, p, algo, inp, &out, &st);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{err}");
            assert!(err.contains(&format!("reading 1-bit state (--state {})", st.display())), "{err}");
            assert!(err.contains(want), "{err}");
            assert_eq!(err.matches("error:").count(), 1, "one message: {err}");
            assert!(!out.exists(), "no output after a refused state");
            assert_eq!(std::fs::read(&st).unwrap(), saved, "the state file was changed");
        }
    }
    // Not a state file at all.
    std::fs::write(&st, b"hello, this is not a state file at all: 44 bytes..").unwrap();
    let o = reduce(false, 3, "onebit", &t3, &out, &st);
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a gradkit 1-bit state file"));
    std::fs::remove_dir_all(&d).unwrap();
}
