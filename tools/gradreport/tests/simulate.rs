//! `gradreport simulate`: a real recording (gradkit's ring allreduce, in-process) replayed on
//! SimGrid matches the ring's α-β formula on a flat cluster, its phases add up to the step,
//! and bad input stops with one line: a recording of another version, a platform too small
//! for the ranks, no smpirun.

use std::path::{Path, PathBuf};

use gradkit_collectives::{reducer_for, Algo, Flat, Params};
use gradkit_comm::World;
use gradkit_core::trace::Layout;
use gradkit_core::{read_table, Input, Meta, MetricRow, ReadOptions};

const BIN: &str = env!("CARGO_BIN_EXE_gradreport");

/// Records one step of `algo` on `p` in-process ranks, each with `n` f32, to `path`.
fn record(path: &Path, algo: Algo, p: usize, n: usize) {
    let world = World::local(p);
    world
        .run(|comm| {
            comm.traffic().start_recording(comm.rank());
            let mut reducer = reducer_for(algo, &Params::default())?;
            let layout = Layout::new(vec![(0, "w".into(), n as u64, None)]);
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7 + comm.rank()) % 13) as f32)
                .collect();
            comm.traffic().begin_step(0, algo.name());
            reducer.reduce(comm, 0, &layout, Flat::Dense(x))?;
            comm.traffic().end_step();
            if let Some(rows) = gradkit_comm::record::gather_recording(comm)? {
                gradkit_core::write_comm_trace(path, Meta::default(), p, &rows)?;
            }
            Ok(())
        })
        .unwrap();
}

fn smpirun_here() -> bool {
    let ok = std::process::Command::new("smpirun")
        .arg("-version")
        .output()
        .is_ok();
    assert!(
        ok,
        "smpirun is not installed: apt-get install libsimgrid-dev (make deps installs it)"
    );
    ok
}

fn simulate(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(BIN)
        .arg("simulate")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// The metrics/1 rows simulate wrote: metric → value, of step 0.
fn values(path: PathBuf) -> std::collections::BTreeMap<String, f64> {
    read_table::<MetricRow>(&Input::Path(path), ReadOptions::default())
        .unwrap()
        .rows
        .into_iter()
        .map(|r| (r.metric, r.value))
        .collect()
}

#[test]
fn ring_replays_at_the_ring_formula_on_a_flat_cluster() {
    smpirun_here();
    let d = gradkit_testkit::tempdir("gradreport-simulate-ring");
    let (rec, out) = (d.path().join("ring.parquet"), d.path().join("sim.parquet"));
    let (p, n) = (4usize, 1usize << 20);
    record(&rec, Algo::Ring, p, n);
    let (code, _, err) = simulate(&[
        rec.to_str().unwrap(),
        "--link-rate",
        "1Gbps",
        "--latency",
        "5us",
        "--compute",
        "none",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v = values(out);
    // 2(P−1) steps of M/P bytes; a message crosses two 5 µs host links at 125 MB/s.
    let m = (4 * n) as f64;
    let formula = 2.0 * (p as f64 - 1.0) * (2.0 * 5e-6 + m / p as f64 / 125e6);
    let sim = v["sim_time_s"];
    assert!(
        (sim / formula - 1.0).abs() < 0.05,
        "simulated {sim} s vs formula {formula} s"
    );
    // The phases' shares of the critical path add up to the step.
    let phases: f64 = v
        .iter()
        .filter(|(k, _)| k.starts_with("sim_time_s:"))
        .map(|(_, x)| x)
        .sum();
    assert!(
        (phases - sim).abs() <= 1e-9 + 1e-6 * sim,
        "{phases} vs {sim}"
    );
    assert!(v.contains_key("sim_time_s:reduce_scatter") && v.contains_key("sim_time_s:allgather"));
    // Ten times the link rate: about a tenth of the bandwidth term.
    let (code, table, err) = simulate(&[
        rec.to_str().unwrap(),
        "--link-rate",
        "10Gbps",
        "--latency",
        "5us",
        "--compute",
        "none",
        "--no-phases",
        "--format",
        "csv",
    ]);
    assert_eq!(code, 0, "{err}");
    let fast: f64 = table
        .lines()
        .nth(1)
        .unwrap()
        .split(',')
        .nth(3)
        .unwrap()
        .parse()
        .unwrap();
    let formula10 = 2.0 * (p as f64 - 1.0) * (2.0 * 5e-6 + m / p as f64 / 1250e6);
    assert!(
        (fast * 1e-3 / formula10 - 1.0).abs() < 0.05,
        "{fast} ms vs {formula10} s"
    );
}

#[test]
fn topologies_and_nodes_replay() {
    smpirun_here();
    let d = gradkit_testkit::tempdir("gradreport-simulate-topo");
    let rec = d.path().join("rec.parquet");
    record(&rec, Algo::Rabenseifner, 8, 1 << 14);
    for extra in [
        &["--topology", "fat-tree"][..],
        &["--topology", "dragonfly"],
        &["--hosts-per-node", "4"],
        &["--topology", "fat-tree", "--fat-tree", "2;4,2;1,4;1,1"],
    ] {
        let mut args = vec![rec.to_str().unwrap(), "--no-phases", "--format", "csv"];
        args.extend_from_slice(extra);
        let (code, out, err) = simulate(&args);
        assert_eq!(code, 0, "{extra:?}: {err}");
        let ms: f64 = out
            .lines()
            .nth(1)
            .unwrap()
            .split(',')
            .nth(3)
            .unwrap()
            .parse()
            .unwrap();
        assert!(ms > 0.0, "{extra:?}: {out}");
    }
}

fn one_error_line(code: i32, err: &str, want_code: i32, needle: &str) {
    assert_eq!(code, want_code, "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines[0].starts_with("error: "), "{err}");
    if want_code == 1 {
        assert_eq!(lines.len(), 1, "{err}");
    }
    assert!(err.contains(needle), "wanted `{needle}` in: {err}");
}

#[test]
fn bad_input_stops_with_one_line() {
    let d = gradkit_testkit::tempdir("gradreport-simulate-errors");
    let rec = d.path().join("rec.parquet");
    record(&rec, Algo::Ring, 4, 64);
    let r = rec.to_str().unwrap();
    // A recording of another version of the format.
    let mut bytes = std::fs::read(&rec).unwrap();
    let (old, new) = (b"commtrace/1", b"commtrace/2");
    let mut patched = 0;
    for i in 0..bytes.len() - old.len() {
        if &bytes[i..i + old.len()] == old {
            bytes[i..i + old.len()].copy_from_slice(new);
            patched += 1;
        }
    }
    assert!(patched > 0);
    let v2 = d.path().join("v2.parquet");
    std::fs::write(&v2, bytes).unwrap();
    let (code, _, err) = simulate(&[v2.to_str().unwrap()]);
    one_error_line(code, &err, 1, "commtrace/2");
    assert!(err.contains("another format version"), "{err}");
    // A platform with fewer hosts than ranks.
    let (code, _, err) = simulate(&[r, "--nodes", "1", "--hosts-per-node", "2"]);
    one_error_line(code, &err, 1, "fewer than the recording's 4 ranks");
    let (code, _, err) = simulate(&[r, "--topology", "fat-tree", "--fat-tree", "2;2,1;1,2;1,1"]);
    one_error_line(code, &err, 1, "fewer than the recording's 4 ranks");
    // No smpirun.
    let out = std::process::Command::new(BIN)
        .args(["simulate", r])
        .env("PATH", d.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    one_error_line(
        out.status.code().unwrap(),
        &err,
        1,
        "apt-get install libsimgrid-dev",
    );
    // Flags wrong on their own: usage errors.
    for (flag, value) in [
        ("--link-rate", "fast"),
        ("--latency", "5 parsecs"),
        ("--topology", "torus"),
        ("--scale-bytes", "0"),
        ("--compute", "-1"),
    ] {
        let (code, _, err) = simulate(&[r, &format!("{flag}={value}")]);
        one_error_line(code, &err, 2, flag);
    }
}
