//! `--state FILE` read one piece at a time (docs/MEMORY.md): the I/O rank checks the saved file
//! before any rank starts and hands each rank its buffers in pieces of at most 2 MiB in the
//! feed's first round. A worker error larger than one piece (here 600,048 values, two pieces)
//! must reach its rank whole and in order: a run cut in two and resumed under mpirun gives the
//! uninterrupted Local run's results and the same state file, byte for byte. A file cut short
//! is refused with one line, before any rank starts, in-process and under mpirun.

use std::path::Path;

use gradkit_core::{read_tensor, write_table, Input, Meta, Output, TensorRow};

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

/// 600,037 elements: on 3 ranks padded to a multiple of P·lcm(P, 8) = 72, i.e. 600,048
/// values of worker error (more than the 524,288 values of one piece) and 200,016 of server
/// error per rank.
const LAYERS: &[(&str, u64)] = &[("fc.weight", 600_000), ("fc.bias", 37)];
const P: usize = 3;

/// A fresh directory for one test, removed when the guard drops.
fn tmpdir(name: &str) -> gradkit_testkit::TempDir {
    gradkit_testkit::tempdir(&format!("gradallreduce-o-{name}-"))
}

fn write_trace(path: &Path, rows: &[TensorRow]) {
    write_table(&Output::Path(path.to_path_buf()), &Meta::default(), rows).unwrap();
}

fn rows_of(path: &Path) -> Vec<TensorRow> {
    read_tensor(&Input::Path(path.to_path_buf()), Default::default())
        .unwrap()
        .rows
}

/// `gradallreduce --algo ALGO -q IN -o OUT --state STATE` on P ranks, Local or under mpirun
/// (with a hang guard): exit code and stderr.
fn reduce(mpi: bool, algo: &str, inp: &Path, out: &Path, state: &Path) -> (Option<i32>, String) {
    let (inp, out, state) = (
        inp.to_str().unwrap(),
        out.to_str().unwrap(),
        state.to_str().unwrap(),
    );
    let args = ["--algo", algo, "-q", inp, "-o", out, "--state", state];
    if mpi {
        gradkit_testkit::mpi::run_quiet(P, BIN, &args)
    } else {
        let ranks = P.to_string();
        let mut all = vec!["--ranks", ranks.as_str()];
        all.extend(args);
        let (code, err) = gradkit_testkit::cli::run(BIN, &all);
        (Some(code), err)
    }
}

fn ok((code, err): (Option<i32>, String)) {
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_resumed_state_in_pieces_equals_the_uninterrupted_run() {
    let d_dir = tmpdir("resume");
    let d = d_dir.path().to_path_buf();
    let all = gradkit_testkit::traces::dense(P as u32, 4, LAYERS);
    let (whole, part1, part2) = (
        d.join("whole.parquet"),
        d.join("a.parquet"),
        d.join("b.parquet"),
    );
    write_trace(&whole, &all);
    let (first, second): (Vec<TensorRow>, Vec<TensorRow>) =
        all.into_iter().partition(|r| r.step < 2);
    write_trace(&part1, &first);
    write_trace(&part2, &second);
    let mpi_too = gradkit_testkit::mpi::available();
    for algo in ["onebit", "onebit-naive"] {
        // The reference: one uninterrupted Local run (no state read).
        let (s_whole, o_whole) = (
            d.join(format!("{algo}-whole.st")),
            d.join("o-whole.parquet"),
        );
        ok(reduce(false, algo, &whole, &o_whole, &s_whole));
        let whole_rows = rows_of(&o_whole);
        let late: Vec<&TensorRow> = whole_rows.iter().filter(|r| r.step >= 2).collect();
        let saved_whole = std::fs::read(&s_whole).unwrap();
        for mpi in [false, true] {
            if mpi && !mpi_too {
                continue;
            }
            let tag = format!("{algo}-{}", if mpi { "mpi" } else { "local" });
            let (s_cut, o_a, o_b) = (
                d.join(format!("{tag}-cut.st")),
                d.join(format!("{tag}-a.parquet")),
                d.join(format!("{tag}-b.parquet")),
            );
            ok(reduce(mpi, algo, &part1, &o_a, &s_cut));
            let after_first = std::fs::read(&s_cut).unwrap();
            ok(reduce(mpi, algo, &part2, &o_b, &s_cut));
            let resumed = rows_of(&o_b);
            assert_eq!(late.len(), resumed.len(), "{tag}");
            for (w, r) in late.iter().zip(&resumed) {
                assert_eq!((w.step, w.layer_id), (r.step, r.layer_id), "{tag}");
                assert!(
                    w.values == r.values,
                    "{tag}: step {} layer {} differs from the uninterrupted run",
                    r.step,
                    r.layer
                );
            }
            let saved = std::fs::read(&s_cut).unwrap();
            assert!(saved == saved_whole, "{tag}: the state file differs");
            assert!(
                saved != after_first,
                "{tag}: the resumed run saved nothing new"
            );
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_state_file_cut_short_is_refused_in_one_line_and_kept() {
    let d_dir = tmpdir("short");
    let d = d_dir.path().to_path_buf();
    let trace = d.join("t.parquet");
    write_trace(&trace, &gradkit_testkit::traces::dense(P as u32, 1, LAYERS));
    let st = d.join("s.st");
    ok(reduce(false, "onebit", &trace, &d.join("o.parquet"), &st));
    let full = std::fs::read(&st).unwrap();
    // 44 header bytes, then per rank 4 × (600,048 + 200,016) bytes; cut in rank 2's worker
    // error and one byte short of the end.
    let per_rank = 4 * (600_048 + 200_016);
    assert_eq!(full.len(), 44 + P * per_rank);
    let out = d.join("o2.parquet");
    for cut in [44 + 2 * per_rank + 1000, full.len() - 1] {
        std::fs::write(&st, &full[..cut]).unwrap();
        for mpi in [false, true] {
            if mpi && !gradkit_testkit::mpi::available() {
                continue;
            }
            let (code, err) = reduce(mpi, "onebit", &trace, &out, &st);
            assert_eq!(code, Some(1), "{err}");
            let want = format!(
                "error: reading 1-bit state (--state {}): file truncated: failed to fill whole buffer",
                st.display()
            );
            assert!(err.contains(&want), "{err}");
            assert_eq!(err.matches("error:").count(), 1, "one message: {err}");
            assert!(!out.exists(), "no output after a refused state");
            assert_eq!(
                std::fs::read(&st).unwrap().len(),
                cut,
                "the state file was changed"
            );
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}
