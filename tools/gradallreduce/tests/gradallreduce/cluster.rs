//! gradallreduce across a cluster on one machine (pipelines/cluster.sh): 2 hosts as network
//! namespaces with shaped links, 4 ranks under mpirun over TCP, give the same rows and counters
//! as 4 in-process ranks; and `down` leaves no namespace, link or bridge behind.
//!
//! Skipped, with the reason printed, where mpirun is absent or network namespaces are not
//! permitted (no root / CAP_NET_ADMIN, no iproute2).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output as ProcOutput, Stdio};

use gradkit_core::{
    read_table, read_tensor, write_table, Input, Meta, MetricRow, Output, TensorRow,
};

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

fn cluster_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../pipelines/cluster.sh")
}

/// A fresh directory for one test, removed when the guard drops.
fn tmpdir(name: &str) -> gradkit_testkit::TempDir {
    gradkit_testkit::tempdir(&format!("gradallreduce-cluster-{name}-"))
}

/// A run id unique to this process and test: names and the subnet derive from it.
fn run_id(tag: char) -> String {
    format!("{tag}{:05x}", std::process::id() % 0x10_0000)
}

/// A brought-up cluster; dropping it (also when the test panics) runs `cluster.sh down`.
struct Cluster {
    state: PathBuf,
    id: String,
}

impl Cluster {
    /// `cluster.sh up`, or `None` (with the reason printed) where this machine cannot.
    fn up(dir: &Path, id: &str, hosts: u32, rate: &str) -> Option<Cluster> {
        let state = dir.join("cluster.env");
        let o = cluster_cmd(&state)
            .args([
                "up",
                "--hosts",
                &hosts.to_string(),
                "--rate",
                rate,
                "--id",
                id,
            ])
            .output()
            .expect("run pipelines/cluster.sh");
        let err = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() {
            if err.contains("not permitted") || err.contains("needs ip and tc") {
                eprintln!("skipped: {}", err.trim());
                return None;
            }
            panic!("cluster.sh up failed: {err}");
        }
        Some(Cluster {
            state,
            id: id.to_string(),
        })
    }

    /// `cluster.sh run -np N -- CMD…` (a hang guard of 10 minutes, never reached on success).
    fn run(&self, np: usize, args: &[OsString]) -> ProcOutput {
        cluster_cmd(&self.state)
            .args(["run", "-np", &np.to_string(), "--"])
            .args(args)
            .output()
            .expect("run pipelines/cluster.sh run")
    }

    fn down(&self) -> ProcOutput {
        cluster_cmd(&self.state)
            .arg("down")
            .output()
            .expect("run pipelines/cluster.sh down")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.down();
    }
}

fn cluster_cmd(state: &Path) -> Command {
    let mut c = Command::new("timeout");
    c.args(["600", "bash"])
        .arg(cluster_sh())
        .env("GRADKIT_CLUSTER", state)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null());
    c
}

fn have_mpirun() -> bool {
    Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The namespaces and links whose names belong to run `id` (`gk<id>`, `gk<id>-…`).
fn names_of_run(id: &str) -> Vec<String> {
    let prefix = format!("gk{id}");
    let mut names = Vec::new();
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let links = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .unwrap();
    for line in String::from_utf8_lossy(&ns.stdout).lines() {
        names.push(line.split_whitespace().next().unwrap_or("").to_string());
    }
    for line in String::from_utf8_lossy(&links.stdout).lines() {
        // "7: gkab-b1@if6: <…>": the second field, without the peer suffix.
        if let Some(name) = line.split(": ").nth(1) {
            names.push(name.split('@').next().unwrap().to_string());
        }
    }
    names
        .into_iter()
        .filter(|n| n == &prefix || n.starts_with(&format!("{prefix}-")))
        .collect()
}

/// A dense trace: `steps` × `p` ranks × two layers of sizes 3000 and 37.
fn trace(p: u32, steps: u32) -> Vec<TensorRow> {
    gradkit_testkit::traces::dense(p, steps, &[("fc1.weight", 3000), ("fc1.bias", 37)])
}

/// (step, rank, metric, value) of the byte and message counters, sorted.
fn counters(path: &Path) -> Vec<(u32, u32, String, f64)> {
    let mut v: Vec<_> = read_table::<MetricRow>(&Input::Path(path.into()), Default::default())
        .unwrap()
        .rows
        .into_iter()
        .filter(|m| m.metric.starts_with("bytes") || m.metric.starts_with("messages"))
        .map(|m| (m.step, m.rank, m.metric, m.value))
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v
}

#[test]
fn dense_and_sparse_allreduce_across_two_hosts_match_in_process_ranks() {
    if !have_mpirun() {
        eprintln!("skipped: mpirun is not installed (make deps)");
        return;
    }
    let d_dir = tmpdir("match");
    let d = d_dir.path().to_path_buf();
    let Some(cluster) = Cluster::up(&d, &run_id('m'), 2, "1gbit") else {
        return;
    };
    let inp = d.join("t.parquet");
    let mut meta = Meta::default();
    meta.set("world_size", 4);
    write_table(&Output::Path(inp.clone()), &meta, &trace(4, 3)).unwrap();

    for algo in ["ring", "topka", "oktopk"] {
        let mut common = vec!["--algo", algo, "--density", "0.05", "-q"];
        if algo == "oktopk" {
            // Re-evaluate thresholds and regions every 2 steps, so both paths run in 3 steps.
            common.extend(["--reeval", "2", "--period", "2"]);
        }
        let (lo, lm) = (
            d.join(format!("{algo}-local.parquet")),
            d.join(format!("{algo}-local-m.parquet")),
        );
        let (co, cm) = (
            d.join(format!("{algo}-cluster.parquet")),
            d.join(format!("{algo}-cluster-m.parquet")),
        );
        let o = Command::new(BIN)
            .env_remove("GRADKIT_CLUSTER_INFO")
            .args(["--ranks", "4"])
            .args(&common)
            .arg(&inp)
            .arg("-o")
            .arg(&lo)
            .arg("--metrics")
            .arg(&lm)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{algo} local: {}",
            String::from_utf8_lossy(&o.stderr)
        );

        // 2 hosts × 2 slots: ranks 0, 1 on host 1 and 2, 3 on host 2, so every step has
        // traffic inside a host and across the shaped bridge.
        let mut args: Vec<OsString> = vec![BIN.into()];
        args.extend(common.iter().map(OsString::from));
        args.extend([inp.clone().into(), "-o".into(), co.clone().into()]);
        args.extend(["--metrics".into(), cm.clone().into()]);
        let o = cluster.run(4, &args);
        assert!(
            o.status.success(),
            "{algo} across hosts: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );

        let local = read_tensor(&Input::Path(lo), Default::default()).unwrap();
        let across = read_tensor(&Input::Path(co), Default::default()).unwrap();
        assert_eq!(local.rows.len(), 3 * 2, "{algo}: rows");
        // Bit for bit: the algorithms fix their summation order, whatever the transport.
        assert_eq!(
            local.rows, across.rows,
            "{algo}: rows differ between in-process and cluster"
        );
        assert_eq!(counters(&lm), counters(&cm), "{algo}: counters differ");
        let info = across.meta.get("gradkit.cluster").unwrap_or("");
        assert!(
            info.contains("backend=mpi-tcp")
                && info.contains("hosts=2")
                && info.contains("rate=1gbit"),
            "{algo}: gradkit.cluster metadata is `{info}`"
        );
        assert_eq!(local.meta.get("gradkit.cluster"), None);
    }
    let o = cluster.down();
    assert!(
        o.status.success(),
        "down: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(names_of_run(&cluster.id).is_empty());
}

#[test]
fn down_leaves_no_namespace_link_or_bridge() {
    let d_dir = tmpdir("down");
    let d = d_dir.path().to_path_buf();
    let id = run_id('d');
    let Some(cluster) = Cluster::up(&d, &id, 2, "100mbit") else {
        return;
    };
    let made = names_of_run(&id);
    for want in [
        format!("gk{id}"),
        format!("gk{id}-h1"),
        format!("gk{id}-h2"),
        format!("gk{id}-b1"),
        format!("gk{id}-b2"),
    ] {
        assert!(made.contains(&want), "{want} missing after up: {made:?}");
    }
    let status = cluster_cmd(&cluster.state).arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "status: {text}");
    assert!(
        text.contains("rate 100mbit") && text.matches(" yes").count() == 2,
        "{text}"
    );

    let o = cluster.down();
    assert!(
        o.status.success(),
        "down: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // down waits until the kernel has let go of every name, so this holds at once.
    assert_eq!(names_of_run(&id), Vec::<String>::new(), "left after down");
    assert!(!cluster.state.exists(), "state file left after down");
    let tmp = PathBuf::from(format!("/tmp/gk{id}"));
    assert!(!tmp.exists(), "{} left after down", tmp.display());
    // A second down (the guard's) finds nothing to do and succeeds.
    assert!(cluster.down().status.success());
}

/// The CPUs the calling process may run on (`Cpus_allowed_list` of /proc/self/status).
fn cpus_allowed(status: &str) -> Option<String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
}

#[test]
fn ranks_may_use_every_core_and_the_burst_is_the_one_asked_for() {
    if !have_mpirun() {
        eprintln!("skipped: mpirun is not installed (make deps)");
        return;
    }
    let mine = cpus_allowed(&std::fs::read_to_string("/proc/self/status").unwrap()).unwrap();
    let d_dir = tmpdir("bind");
    let d = d_dir.path().to_path_buf();
    let id = run_id('b');
    let state = d.join("cluster.env");
    let o = cluster_cmd(&state)
        .args([
            "up", "--hosts", "2", "--rate", "100mbit", "--burst", "16384", "--id", &id,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() && (err.contains("not permitted") || err.contains("needs ip and tc")) {
        eprintln!("skipped: {}", err.trim());
        return;
    }
    assert!(o.status.success(), "up: {err}");
    let cluster = Cluster { state, id };
    let status = cluster_cmd(&cluster.state).arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("tbf burst 16384 B"), "{text}");
    // Every host's daemon would bind its first rank to core 0: the hosts' ranks must not
    // share one core while the machine's others idle.
    let args: Vec<OsString> = ["bash", "-c", "cat /proc/self/status"]
        .iter()
        .map(OsString::from)
        .collect();
    let o = cluster.run(2, &args);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "run: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let ranks: Vec<_> = out
        .lines()
        .filter_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
        .collect();
    assert_eq!(ranks, vec![mine.clone(), mine], "{out}");
}

#[test]
fn a_bad_burst_is_refused_in_one_line_before_anything_is_built() {
    let d_dir = tmpdir("burst");
    let state = d_dir.path().join("cluster.env");
    for bad in ["16x", "100", "0ms"] {
        let o = cluster_cmd(&state)
            .args(["up", "--hosts", "2", "--burst", bad])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "--burst {bad} accepted");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.starts_with("error: --burst"), "{err}");
        assert!(!state.exists());
    }
}
