//! `gradreport simulate`: a real recording (gradkit's ring allreduce, in-process) replayed on
//! SimGrid matches the ring's α-β formula on a flat cluster, its phases add up to the step,
//! and bad input stops with one line: a recording of another version, a platform too small
//! for the ranks, no smpirun, a row the replay cannot run. Messages of 2^31 bytes and more
//! (beyond SimGrid's TI actions) replay at the α-β formula's time; a signal ends smpirun and
//! removes the replay's files.

use std::path::{Path, PathBuf};

use gradkit_collectives::{reducer_for, Algo, Flat, Params};
use gradkit_comm::World;
use gradkit_core::trace::Layout;
use gradkit_core::{read_table, Input, Meta, MetricRow, ReadOptions};

const BIN: &str = env!("CARGO_BIN_EXE_gradreport");

/// Records one step of `algo` on `p` in-process ranks, each with `n` f32, to `path`.
/// The algorithm `--algo name` names.
fn algo(name: &str) -> Algo {
    name.parse().expect("an --algo name")
}

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
    record(&rec, algo("ring"), p, n);
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
    record(&rec, algo("rabenseifner"), 8, 1 << 14);
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
    record(&rec, algo("ring"), 4, 64);
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
        ("--bw-factor", "fast"),
        ("--bw-factor", "0:1;65536"),
        ("--lat-factor", "0:-1"),
        ("--smpi-cfg", "network/crosstraffic"),
        ("--smpi-cfg", "smpi/os:0:x:0"),
        ("--nodes", "1000000000"),
        ("--fat-tree", "2;100000,100000;1,1;1,1"),
    ] {
        let (code, _, err) = simulate(&[r, &format!("{flag}={value}")]);
        one_error_line(code, &err, 2, flag);
    }
}

/// `rec` with `edit` applied to its rows, written to `out`.
fn edited(rec: &Path, out: &Path, edit: impl Fn(&mut Vec<gradkit_core::CommRow>)) {
    let mut t =
        read_table::<gradkit_core::CommRow>(&Input::Path(rec.into()), ReadOptions::default())
            .unwrap();
    edit(&mut t.rows);
    let world = t.meta.get("world_size").unwrap().parse().unwrap();
    gradkit_core::write_comm_trace(out, Meta::default(), world, &t.rows).unwrap();
}

#[test]
fn rows_the_replay_cannot_run_are_named_with_their_column() {
    use gradkit_core::EventKind;
    let d = gradkit_testkit::tempdir("gradreport-simulate-rows");
    let rec = d.path().join("rec.parquet");
    record(&rec, algo("ring"), 2, 64);
    let bad = d.path().join("bad.parquet");
    let first = |rows: &[gradkit_core::CommRow], k: EventKind| {
        rows.iter().position(|r| r.kind == k).unwrap()
    };
    type Edit = Box<dyn Fn(&mut Vec<gradkit_core::CommRow>)>;
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|r| r[0].start_s = f64::NAN), "`start_s`, row 0"),
        (
            Box::new(|r| r[0].end_s = r[0].start_s - 1.0),
            "`end_s`, row 0",
        ),
        (
            Box::new(move |r| {
                let i = first(r, EventKind::Recv);
                r.remove(i);
            }),
            "no row receives",
        ),
        (
            Box::new(move |r| {
                let i = first(r, EventKind::Send);
                r.remove(i);
            }),
            "no row sends",
        ),
        (
            Box::new(move |r| {
                let i = first(r, EventKind::Send);
                r[i].bytes = 1 << 63;
            }),
            "column `bytes`",
        ),
        (
            Box::new(move |r| {
                let i = first(r, EventKind::Send);
                r[i].fixed_bytes = r[i].bytes + 1;
            }),
            "column `fixed_bytes`",
        ),
    ];
    for (edit, needle) in cases {
        edited(&rec, &bad, edit);
        let (code, _, err) = simulate(&[bad.to_str().unwrap(), "--compute", "none"]);
        one_error_line(code, &err, 1, needle);
        assert!(err.contains("bad.parquet"), "{err}");
    }
}

#[test]
fn messages_of_2_31_bytes_and_more_replay_at_the_alpha_beta_time() {
    smpirun_here();
    let d = gradkit_testkit::tempdir("gradreport-simulate-big");
    let rec = d.path().join("ring.parquet");
    // The ring on 2 ranks: two messages of 2n bytes one after the other.
    let n = 1024usize;
    record(&rec, algo("ring"), 2, n);
    // Below 2^31 bytes, just above, and 2^31 · 9.5 (ten pieces).
    for scale in [1_048_000.0, 1_049_000.0, 10_000_000.0] {
        let m = (2 * n) as f64 * scale;
        let ms = replay_ms(&rec, "10Gbps", "5us", scale);
        let formula = 2.0 * (2.0 * 5e-6 + m / 1.25e9);
        assert!(
            (ms * 1e-3 / formula - 1.0).abs() < 0.05,
            "--scale-bytes {scale}: simulated {ms} ms vs the formula's {formula} s"
        );
    }
}

#[test]
fn a_signal_ends_smpirun_and_removes_the_replay_files() {
    use std::os::unix::fs::PermissionsExt;
    let d = gradkit_testkit::tempdir("gradreport-simulate-signal");
    let rec = d.path().join("rec.parquet");
    record(&rec, algo("ring"), 2, 64);
    let (tmp, pidfile) = (d.path().join("tmp"), d.path().join("child.pid"));
    std::fs::create_dir(&tmp).unwrap();
    // A stand-in smpirun that starts a child of its own and waits for it.
    let fake = d.path().join("smpirun");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nsleep 1000 &\necho $! > {}\nwait\n",
            pidfile.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (name, sig) in [("TERM", 15), ("INT", 2), ("HUP", 1)] {
        let _ = std::fs::remove_file(&pidfile);
        let mut child = std::process::Command::new(BIN)
            .args(["simulate", rec.to_str().unwrap(), "--compute", "none"])
            .env("TMPDIR", &tmp)
            .env("GRADKIT_SMPIRUN", &fake)
            .env("GRADKIT_SMPIREPLAYMAIN", &fake)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Wait until the stand-in's child runs (or the tool has stopped on its own).
        let pid = loop {
            if let Some(p) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            {
                break p;
            }
            assert!(
                child.try_wait().unwrap().is_none(),
                "gradreport ended first"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 1);
        let kill = std::process::Command::new("kill")
            .args([format!("-{name}"), child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(128 + sig));
        assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0, "signal {sig}");
        // The grandchild was sent the signal before the tool exited: it is gone, or a zombie
        // waiting for init to reap it, once the signal is delivered (polled, not timed).
        let alive = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| !s.rsplit(')').next().unwrap().trim_start().starts_with('Z'))
        };
        let mut polls = 0;
        while alive() && polls < 3000 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            polls += 1;
        }
        assert!(!alive(), "SIG{name}: smpirun's child {pid} still runs");
    }
}

/// The first step's simulated milliseconds of `rec` replayed on a flat cluster of `rate` and
/// `latency`, communication only, sizes × `scale`.
fn replay_ms(rec: &Path, rate: &str, latency: &str, scale: f64) -> f64 {
    let (code, out, err) = simulate(&[
        rec.to_str().unwrap(),
        "--link-rate",
        rate,
        "--latency",
        latency,
        "--compute",
        "none",
        "--no-phases",
        "--format",
        "csv",
        "--scale-bytes",
        &scale.to_string(),
    ]);
    assert_eq!(code, 0, "{err}");
    step_ms(&out)
}

/// The step's simulated milliseconds of a `--format csv` table (its first row).
fn step_ms(csv: &str) -> f64 {
    csv.lines()
        .nth(1)
        .and_then(|l| l.split(',').nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no simulated_ms in {csv}"))
}

#[test]
fn the_error_bar_the_warnings_and_the_speedup_follow_the_table() {
    smpirun_here();
    let d = gradkit_testkit::tempdir("gradreport-simulate-errbar");
    let (ok, ring) = (d.path().join("ok.parquet"), d.path().join("ring.parquet"));
    record(&ok, algo("oktopk"), 4, 1 << 14);
    record(&ring, algo("ring"), 4, 1 << 14);
    let base = [
        "--no-phases",
        "--format",
        "csv",
        "--compute",
        "none",
        "--link-rate",
        "100mbit",
    ];
    // Alone, on a validated platform: the error bar of 100 Mbit/s for the sparse family, no
    // warning.
    let mut args = vec![ok.to_str().unwrap()];
    args.extend_from_slice(&base);
    let (code, out_ok, err) = simulate(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("error bar:") && err.contains("at 100mbit") && err.contains("sparse"),
        "{err}"
    );
    assert!(!err.contains("warning:"), "{err}");
    // The ring alone, then Ok-Topk with the ring as its baseline: the speedup is the ratio of
    // the two tables' steps.
    let mut args = vec![ring.to_str().unwrap()];
    args.extend_from_slice(&base);
    let (_, out_ring, _) = simulate(&args);
    let want = step_ms(&out_ring) / step_ms(&out_ok);
    let mut args = vec![ok.to_str().unwrap(), "--baseline", ring.to_str().unwrap()];
    args.extend_from_slice(&base);
    let (code, out, err) = simulate(&args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, out_ok, "the table is the recording's alone");
    let got: f64 = err
        .split("(--baseline, the same platform): ")
        .nth(1)
        .and_then(|s| s.split('×').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no speedup line in {err}"));
    assert!((got - want).abs() <= 0.006 * want, "{got} vs {want}");
    // Outside what was validated: each departure named.
    let mut args = vec![ok.to_str().unwrap(), "--scale-bytes", "10"];
    args.extend_from_slice(&["--no-phases", "--compute", "none", "--topology", "fat-tree"]);
    let (code, _, err) = simulate(&args);
    assert_eq!(code, 0, "{err}");
    let warn = err
        .lines()
        .find(|l| l.starts_with("warning:"))
        .unwrap_or("");
    for needle in ["Gbit/s, faster", "fat-tree", "×10"] {
        assert!(warn.contains(needle), "{needle}: {err}");
    }
}

#[test]
fn scale_bytes_keeps_the_fixed_part_of_each_message() {
    smpirun_here();
    use gradkit_core::EventKind;
    let d = gradkit_testkit::tempdir("gradreport-simulate-fixed");
    let rec = d.path().join("ring.parquet");
    let half = d.path().join("half-fixed.parquet");
    // The ring on 2 ranks: two messages of 2n bytes one after the other; in the edited copy
    // half of each message is fixed (as a control message's or a header's bytes would be).
    let n = 1024usize;
    record(&rec, algo("ring"), 2, n);
    edited(&rec, &half, |rows| {
        for r in rows.iter_mut() {
            if matches!(r.kind, EventKind::Send | EventKind::Recv) {
                r.fixed_bytes = r.bytes / 2;
            }
        }
    });
    let scale = 100_000.0;
    // Written here: each message is fixed + (bytes − fixed) · scale bytes.
    let m = |fixed: f64| fixed + ((2 * n) as f64 - fixed) * scale;
    for (path, fixed) in [(&rec, 0.0), (&half, n as f64)] {
        let formula = 2.0 * (2.0 * 5e-6 + m(fixed) / 1.25e9);
        let ms = replay_ms(path, "10Gbps", "5us", scale);
        assert!(
            (ms * 1e-3 / formula - 1.0).abs() < 0.05,
            "{}: simulated {ms} ms vs the formula's {formula} s",
            path.display()
        );
    }
}

#[test]
fn step_profile_gives_the_whole_step_beside_dense_and_dense_ovlp() {
    smpirun_here();
    let d = gradkit_testkit::tempdir("gradreport-simulate-profile");
    let rec = d.path().join("ring.parquet");
    // The ring on 2 ranks, n = 1024: two messages of 2048 bytes one after the other.
    record(&rec, algo("ring"), 2, 1024);
    let prof = d.path().join("profile.csv");
    // Backward order: b (3,000,000 values, 30 ms) then a (1,000, 10 ms).
    std::fs::write(
        &prof,
        "name,numel,ms\nforward,0,20\nb,3000000,30\na,1000,10\noptimizer,0,5\n",
    )
    .unwrap();
    let (code, _, err) = simulate(&[
        rec.to_str().unwrap(),
        "--link-rate",
        "1Gbps",
        "--latency",
        "50us",
        "--compute",
        "none",
        "--no-phases",
        "--step-profile",
        prof.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("whole step"))
        .unwrap_or_else(|| panic!("{err}"));
    let after = |key: &str| -> f64 {
        let i = line
            .find(key)
            .unwrap_or_else(|| panic!("no `{key}` in {line}"))
            + key.len();
        line[i..]
            .trim_start()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    // Written here: α = 2 · 50 µs, β = 8 ns/B; the exchange = 2 messages of 2048 B.
    let (alpha, beta) = (100e-6, 8e-9);
    let exchange = 2.0 * (alpha + 2048.0 * beta);
    let ring = |bytes: f64| 2.0 * (alpha + bytes / 2.0 * beta);
    let whole = 0.020 + 0.040 + exchange + 0.005;
    // DDP's buckets: b's 12 MB close the first (1 MiB) bucket at 30 ms; a's 4 kB the last at 40 ms.
    let b_end = 0.030 + ring(12e6);
    let a_end = b_end.max(0.040) + ring(4000.0);
    let ovlp = 0.020 + a_end.max(0.040) + 0.005;
    let dense = 0.020 + 0.040 + ring(12_004_000.0) + 0.005;
    for (key, want) in [("):", whole), ("DenseOvlp ", ovlp), ("; Dense ", dense)] {
        let got = after(key) * 1e-3;
        assert!(
            (got / want - 1.0).abs() < 0.01,
            "{key}: {got} s vs {want} s written here ({line})"
        );
    }
    // A profile without its optimizer row stops before the replay, naming the flag.
    std::fs::write(&prof, "name,numel,ms\nforward,0,20\nb,3000000,30\n").unwrap();
    let (code, _, err) = simulate(&[
        rec.to_str().unwrap(),
        "--step-profile",
        prof.to_str().unwrap(),
    ]);
    one_error_line(code, &err, 1, "--step-profile");
}

#[test]
fn a_replay_far_from_the_alpha_beta_model_says_why() {
    smpirun_here();
    let d = gradkit_testkit::tempdir("gradreport-simulate-why");
    let (ring, onebit) = (
        d.path().join("ring.parquet"),
        d.path().join("onebit.parquet"),
    );
    // The ring on 2 ranks sends one message per call: the replay is the model.
    record(&ring, algo("ring"), 2, 4096);
    // 1-bit on 4 ranks posts its alltoall's 3 messages together: on links where latency
    // dominates, the model adds the three latencies, the replay overlaps them (≈ 1/3).
    record(&onebit, algo("onebit"), 4, 1 << 16);
    let args = |rec: &Path| -> (i32, String) {
        let (code, _, err) = simulate(&[
            rec.to_str().unwrap(),
            "--link-rate",
            "100Gbps",
            "--latency",
            "50us",
            "--compute",
            "none",
        ]);
        (code, err)
    };
    let (code, err) = args(&ring);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("why sim/α-β"), "{err}");
    let (code, err) = args(&onebit);
    assert_eq!(code, 0, "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("why sim/α-β") && l.contains("alltoall"));
    let line = line.unwrap_or_else(|| panic!("no why line for the alltoall: {err}"));
    assert!(line.contains("up to 3 messages posted together"), "{line}");
}

/// `--model-n`: the formula column is the papers' formula on the replay's links (α = 2 ×
/// the link latency host to host, β per byte), written here; a line far from it says why.
#[test]
fn the_formula_column_is_the_papers_and_far_lines_say_why() {
    smpirun_here();
    let d = gradkit_testkit::tempdir("gradreport-simulate-formula");
    let (p, n) = (4usize, 1usize << 16);
    let k = (0.01 * n as f64).floor();
    let (alpha, beta) = (20e-6, 8e-9); // 2 × 10 µs; 1 Gbit/s in bytes
    let cols = |rec: &Path| -> (Vec<Vec<String>>, String) {
        let (code, out, err) = simulate(&[
            rec.to_str().unwrap(),
            "--link-rate",
            "1Gbps",
            "--latency",
            "10us",
            "--compute",
            "none",
            "--format",
            "csv",
            "--model-n",
            &n.to_string(),
            "--density",
            "0.01",
        ]);
        assert_eq!(code, 0, "{err}");
        let mut lines = out.lines();
        let head = lines.next().unwrap();
        assert!(head.ends_with(",formula_ms,sim/formula"), "{head}");
        (
            lines
                .map(|l| l.split(',').map(str::to_string).collect())
                .collect(),
            err,
        )
    };
    let formula = |rows: &[Vec<String>], phase: &str| -> f64 {
        let r = rows.iter().find(|r| r[0] == "0" && r[2] == phase);
        r.unwrap_or_else(|| panic!("no {phase} row in {rows:?}"))[7]
            .parse()
            .unwrap()
    };
    let near = |got: f64, want_s: f64, what: &str| {
        assert!(
            (got - want_s * 1e3).abs() <= 1e-3 * want_s * 1e3,
            "{what}: {got} ms, the formula {} ms",
            want_s * 1e3
        );
    };
    // The ring: 2(P−1)(α + 4n/P·β), each phase half.
    let ring = d.path().join("ring.parquet");
    record(&ring, algo("ring"), p, n);
    let (rows, err) = cols(&ring);
    let whole = 2.0 * (p as f64 - 1.0) * (alpha + 4.0 * n as f64 / p as f64 * beta);
    near(formula(&rows, "(step)"), whole, "ring");
    near(
        formula(&rows, "reduce_scatter"),
        whole / 2.0,
        "reduce_scatter",
    );
    assert!(
        !err.contains("why sim/formula"),
        "the ring replays at its formula: {err}"
    );
    // Ok-Topk: Table 1's worst case, (2P + 2 log P)α + 6k(P−1)/P words; split_and_reduce
    // Eq. 1, (P−1)α + 2k(P−1)/P words; its threshold phases are not in the formula.
    let ok = d.path().join("oktopk.parquet");
    record(&ok, algo("oktopk"), p, n);
    let (rows, err) = cols(&ok);
    let share = k * (p as f64 - 1.0) / p as f64;
    near(
        formula(&rows, "(step)"),
        (2.0 * p as f64 + 4.0) * alpha + 6.0 * share * 4.0 * beta,
        "oktopk",
    );
    near(
        formula(&rows, "split_and_reduce"),
        (p as f64 - 1.0) * alpha + 2.0 * share * 4.0 * beta,
        "Eq. 1",
    );
    let outside: Vec<&Vec<String>> = rows
        .iter()
        .filter(|r| {
            r[2] != "(step)" && r[2] != "split_and_reduce" && r[2] != "balance_and_allgatherv"
        })
        .collect();
    assert!(
        outside.iter().any(|r| r[2] == "th_re_evaluate"),
        "Ok-Topk's first step re-evaluates its thresholds: {rows:?}"
    );
    for r in outside {
        assert_eq!(r[7], "0", "{r:?}");
        // Named where it takes time (a step's `default` phase may hold no message).
        let why = format!(
            "not in the formula at step 0 (oktopk), {}: the formula does not count this phase",
            r[2]
        );
        let timed = r[3].parse::<f64>().unwrap() > 0.0;
        assert_eq!(err.contains(&why), timed, "'{why}' in {err}");
    }
    // Usage: --density needs --model-n; a size of 0 is refused in one line.
    let (code, _, err) = simulate(&[ok.to_str().unwrap(), "--density", "0.1"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = simulate(&[ok.to_str().unwrap(), "--model-n", "0"]);
    assert_eq!(
        (code, err.trim()),
        (
            2,
            "error: --model-n must be at least 1 element (flag --model-n)"
        )
    );
}
