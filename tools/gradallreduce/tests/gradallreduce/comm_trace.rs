//! `--comm-trace`: the recording's bytes and messages equal the traffic counters (the
//! `--metrics` rows, counted by a separate path through the same calls) exactly, per step,
//! rank and phase, for algorithms of every family, in-process and under mpirun; and every
//! recorded send has exactly one matching receive.

use std::collections::BTreeMap;
use std::path::Path;

use gradkit_core::{
    read_table, write_table, CommRow, EventKind, Input, Meta, MetricRow, Output, ReadOptions,
};

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

fn trace(path: &Path, p: u32) {
    let rows = gradkit_testkit::traces::dense(p, 3, &[("w", 3000), ("b", 37)]);
    write_table(&Output::Path(path.to_path_buf()), &Meta::default(), &rows).unwrap();
}

/// (step, rank, phase) → (bytes sent, bytes received, messages sent).
type Totals = BTreeMap<(u32, u32, String), (u64, u64, u64)>;

fn from_metrics(rows: &[MetricRow]) -> Totals {
    let mut t = Totals::new();
    for r in rows {
        let Some((what, phase)) = r.metric.split_once(':') else {
            continue;
        };
        let e = t.entry((r.step, r.rank, phase.to_string())).or_default();
        match what {
            "bytes_sent" => e.0 = r.value as u64,
            "bytes_recv" => e.1 = r.value as u64,
            "messages" => e.2 = r.value as u64,
            _ => {}
        }
    }
    t.retain(|_, v| *v != (0, 0, 0));
    t
}

fn from_recording(rows: &[CommRow]) -> Totals {
    let mut t = Totals::new();
    for r in rows {
        let e = t.entry((r.step, r.rank, r.phase.clone())).or_default();
        match r.kind {
            EventKind::Send => {
                e.0 += r.bytes;
                e.2 += 1;
            }
            EventKind::Recv => e.1 += r.bytes,
            // The counters charge an opaque allreduce's bytes both ways, and no message.
            EventKind::Allreduce => {
                e.0 += r.bytes;
                e.1 += r.bytes;
            }
            EventKind::Compute => {}
        }
    }
    t.retain(|_, v| *v != (0, 0, 0));
    t
}

/// Every send (r → q, tag, seq) has exactly one receive (q ← r, tag, seq) of the same size.
fn check_matched(algo: &str, rows: &[CommRow]) {
    let mut sends = BTreeMap::new();
    let mut recvs = BTreeMap::new();
    for r in rows {
        match r.kind {
            EventKind::Send => {
                assert!(sends
                    .insert((r.rank, r.peer, r.tag, r.seq), r.bytes)
                    .is_none())
            }
            EventKind::Recv => {
                assert!(recvs
                    .insert((r.peer, r.rank, r.tag, r.seq), r.bytes)
                    .is_none())
            }
            _ => {}
        }
    }
    // The backend's own allreduce (native) is one opaque call, not messages.
    assert!(
        algo == "native" || !sends.is_empty(),
        "{algo}: no messages recorded"
    );
    assert_eq!(sends, recvs, "{algo}: sends and receives do not match");
}

fn check(algo: &str, rec: &Path, metrics: &Path, p: u32) {
    let rec = read_table::<CommRow>(&Input::Path(rec.into()), ReadOptions::default()).unwrap();
    assert_eq!(rec.meta.get("world_size"), Some(p.to_string().as_str()));
    assert_eq!(rec.meta.get("schema"), Some("commtrace/1"));
    let m = read_table::<MetricRow>(&Input::Path(metrics.into()), ReadOptions::default())
        .unwrap()
        .rows;
    let (want, got) = (from_metrics(&m), from_recording(&rec.rows));
    assert!(!want.is_empty(), "{algo}: no per-phase counters");
    assert_eq!(got, want, "{algo}: recording vs counters");
    check_matched(algo, &rec.rows);
    // Compute intervals lie between the calls: each rank's events of a step are in time order.
    let mut last: BTreeMap<(u32, u32), f64> = BTreeMap::new();
    for r in &rec.rows {
        assert!(r.end_s >= r.start_s, "{algo}: {r:?}");
        let l = last.entry((r.step, r.rank)).or_insert(0.0);
        assert!(
            r.start_s >= *l - 1e-9 || r.kind != EventKind::Compute,
            "{algo}: {r:?}"
        );
        *l = l.max(r.end_s);
    }
}

#[test]
fn recording_equals_the_counters_in_process() {
    let d = gradkit_testkit::tempdir("gradallreduce-commtrace");
    let input = d.path().join("in.parquet");
    trace(&input, 4);
    for algo in [
        "ring",
        "rabenseifner",
        "tree",
        "native",
        "topka",
        "topkdsa",
        "gtopk",
        "gaussiank",
        "oktopk",
        "onebit",
    ] {
        let (rec, m, o) = (
            d.path().join(format!("{algo}.rec.parquet")),
            d.path().join(format!("{algo}.m.parquet")),
            d.path().join("o.parquet"),
        );
        let (code, err) = gradkit_testkit::cli::run(
            BIN,
            &[
                "--algo",
                algo,
                "--ranks",
                "4",
                "-q",
                "--density",
                "0.05",
                input.to_str().unwrap(),
                "-o",
                o.to_str().unwrap(),
                "--metrics",
                m.to_str().unwrap(),
                "--comm-trace",
                rec.to_str().unwrap(),
            ],
        );
        assert_eq!(code, 0, "{algo}: {err}");
        check(algo, &rec, &m, 4);
    }
}

#[test]
fn recording_equals_the_counters_under_mpirun() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let d = gradkit_testkit::tempdir("gradallreduce-commtrace-mpi");
    let input = d.path().join("in.parquet");
    trace(&input, 3);
    for algo in ["rabenseifner", "oktopk"] {
        let (rec, m, o) = (
            d.path().join(format!("{algo}.rec.parquet")),
            d.path().join(format!("{algo}.m.parquet")),
            d.path().join("o.parquet"),
        );
        let (code, err) = gradkit_testkit::mpi::run_quiet(
            3,
            BIN,
            &[
                "--algo",
                algo,
                "-q",
                input.to_str().unwrap(),
                "-o",
                o.to_str().unwrap(),
                "--metrics",
                m.to_str().unwrap(),
                "--comm-trace",
                rec.to_str().unwrap(),
            ],
        );
        assert_eq!(code, Some(0), "{algo}: {err}");
        check(algo, &rec, &m, 3);
    }
}

#[test]
fn bench_records_every_timed_call() {
    let d = gradkit_testkit::tempdir("gradallreduce-commtrace-bench");
    let rec = d.path().join("rec.parquet");
    let (code, err) = gradkit_testkit::cli::run(
        BIN,
        &[
            "bench",
            "--algo",
            "ring",
            "--sizes",
            "4K:4K",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--ranks",
            "3",
            "-q",
            "--comm-trace",
            rec.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let rows = read_table::<CommRow>(&Input::Path(rec), ReadOptions::default())
        .unwrap()
        .rows;
    // A ring allreduce of 4 KiB on 3 ranks: each rank sends 2(P−1) blocks of 4096/3 bytes
    // (rounded to whole f32s), 3 timed calls, no warm-up.
    let sent: u64 = rows
        .iter()
        .filter(|r| r.kind == EventKind::Send)
        .map(|r| r.bytes)
        .sum();
    let per_call = gradkit_collectives::cost::ring_bytes_sent(3, 1024, 0)
        + gradkit_collectives::cost::ring_bytes_sent(3, 1024, 1)
        + gradkit_collectives::cost::ring_bytes_sent(3, 1024, 2);
    assert_eq!(sent, 3 * per_call);
    let steps: std::collections::BTreeSet<u32> = rows.iter().map(|r| r.step).collect();
    assert_eq!(steps.into_iter().collect::<Vec<_>>(), vec![0, 1, 2]);
    check_matched("bench ring", &rows);
}
