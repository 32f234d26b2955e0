//! The cost model's units as a user gives them: element counts in SI's decimal multiples
//! (`--n 110M` is 110,000,000, `16Mi` is 2^24), and on the shaped cluster
//! (`pipelines/cluster.sh run` exports `GRADKIT_CLUSTER_INFO`) `--bandwidth-gbps` defaulting
//! to its links' rate. Checked against the ring's formula, 2(P−1)/P·4n bytes at β, computed
//! here.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

/// `gradallreduce model … --format csv`: (algo, n, time_ms) of every row.
fn model(args: &[&str], env: Option<&str>) -> Vec<(String, f64, f64)> {
    let mut c = Command::new(BIN);
    c.arg("model").args(args).args(["--format", "csv"]);
    c.env_remove("GRADKIT_CLUSTER_INFO");
    if let Some(info) = env {
        c.env("GRADKIT_CLUSTER_INFO", info);
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8(o.stdout).unwrap();
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| head.iter().position(|h| *h == name).unwrap();
    let (a, n, t) = (col("algo"), col("n"), col("time_ms"));
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                f[a].to_string(),
                f[n].parse().unwrap(),
                f[t].parse().unwrap(),
            )
        })
        .collect()
}

fn ring_ms(rows: &[(String, f64, f64)]) -> (f64, f64) {
    let r = rows.iter().find(|r| r.0 == "ring").expect("a ring row");
    (r.1, r.2)
}

#[test]
fn counts_are_decimal_unless_binary_is_said() {
    let base = ["--ranks", "4", "--density", "0.01", "--alpha-us", "0"];
    let dec = model(&[&base[..], &["--n", "110M"]].concat(), None);
    let bin = model(&[&base[..], &["--n", "16Mi"]].concat(), None);
    assert_eq!(ring_ms(&dec).0, 110_000_000.0);
    assert_eq!(ring_ms(&bin).0, (1u64 << 24) as f64);
    // α = 0: the ring is 2(P−1)/P·4n bytes at the default 10 GB/s.
    let want = 2.0 * 3.0 / 4.0 * 4.0 * 110e6 / 10e9 * 1e3;
    assert!((ring_ms(&dec).1 - want).abs() <= 1e-3 * want, "{dec:?}");
}

#[test]
fn on_the_shaped_cluster_the_bandwidth_is_its_links_rate() {
    let args = [
        "--ranks",
        "4",
        "--n",
        "1M",
        "--density",
        "0.01",
        "--alpha-us",
        "0",
    ];
    let info = "backend=mpi-tcp hosts=4 ranks=4 rate=1gbit id=t";
    let on = ring_ms(&model(&args, Some(info))).1;
    let given = ring_ms(&model(
        &[&args[..], &["--bandwidth-gbps", "0.125"]].concat(),
        None,
    ))
    .1;
    assert_eq!(on, given);
    let want = 2.0 * 3.0 / 4.0 * 4.0 * 1e6 / 0.125e9 * 1e3;
    assert!((on - want).abs() <= 1e-3 * want, "{on} vs {want}");
    // A flag on the command line still wins over the cluster's rate.
    let flag = ring_ms(&model(
        &[&args[..], &["--bandwidth-gbps", "10"]].concat(),
        Some(info),
    ))
    .1;
    let default = ring_ms(&model(&args, None)).1;
    assert_eq!(flag, default);
}
