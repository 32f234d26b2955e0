//! commtrace/1's `fixed_bytes` (what a replay at another model size keeps as recorded,
//! docs/SIMULATE.md § Scaling): one bench call of every algorithm recorded at n and at 10·n
//! elements per rank (in-process, P = 8, dense input):
//! - the control messages (counts, thresholds, boundaries, DEFT's plan) are fixed whole, and
//!   the same in both recordings; the dense ring's messages have no fixed part;
//! - 1-bit's fixed part is its f32 scale per message and the padding's share of its sign
//!   bits, the padding by DeepSpeed's rule written here (n rounded up to a multiple of
//!   P · lcm(P, 8));
//! - the small recording scaled ×10 the replay's way (fixed as is, the rest ×10) carries the
//!   large recording's bytes: exactly for the algorithms whose volume follows k, within the
//!   data dependence of the others.

use std::collections::BTreeMap;
use std::path::Path;

use gradkit_core::{read_table, CommRow, EventKind, Input, ReadOptions};

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");
const ALGOS: &str = "ring,topka,topkdsa,gtopk,gaussiank,oktopk,deft,onebit";
const P: u64 = 8;

fn record(dir: &Path, elems: u64) -> Vec<CommRow> {
    let rec = dir.join(format!("rec-{elems}.parquet"));
    let size = format!("{}:{}", elems * 4, elems * 4);
    let (code, err) = gradkit_testkit::cli::run(
        BIN,
        &[
            "bench",
            "--algo",
            ALGOS,
            "--input",
            "dense",
            "--sizes",
            &size,
            "--warmup",
            "1",
            "--iters",
            "2",
            "--density",
            "0.02",
            "--ranks",
            &P.to_string(),
            "-q",
            "--comm-trace",
            rec.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    read_table::<CommRow>(&Input::Path(rec), ReadOptions::default())
        .unwrap()
        .rows
        .into_iter()
        .filter(|r| r.kind == EventKind::Send)
        .collect()
}

fn algo(r: &CommRow) -> &str {
    r.label.split(' ').next().unwrap_or("")
}

/// (algorithm, phase) → (bytes, fixed bytes, messages) over the recording's sends.
fn by_phase(rows: &[CommRow]) -> BTreeMap<(String, String), (u64, u64, u64)> {
    let mut m = BTreeMap::new();
    for r in rows {
        let e = m
            .entry((algo(r).to_string(), r.phase.clone()))
            .or_insert((0, 0, 0));
        e.0 += r.bytes;
        e.1 += r.fixed_bytes;
        e.2 += 1;
    }
    m
}

/// DeepSpeed's padded length, written here: n up to a multiple of P · lcm(P, 8).
fn padded(p: u64, n: u64) -> u64 {
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let unit = p * (p * 8 / gcd(p, 8));
    n.div_ceil(unit) * unit
}

#[test]
fn control_is_fixed_payload_scales_and_onebit_padding_is_fixed() {
    let d = gradkit_testkit::tempdir("gradallreduce-fixed-bytes");
    let (n_small, n_large) = (20_000u64, 200_000u64);
    let small = record(d.path(), n_small);
    let large = record(d.path(), n_large);
    let (s, l) = (by_phase(&small), by_phase(&large));
    assert_eq!(
        s.keys().collect::<Vec<_>>(),
        l.keys().collect::<Vec<_>>(),
        "the same phases at both sizes"
    );

    let control = [
        ("oktopk", "th_adjust"),
        ("deft", "allgather_counts"),
        ("deft", "plan"),
        ("topkdsa", "allgather_sizes"),
    ];
    for (a, ph) in control {
        let key = (a.to_string(), ph.to_string());
        let (b, f, _) = s[&key];
        assert!(
            b > 0 && f == b,
            "{a} {ph}: control, fixed whole: {f} of {b} bytes"
        );
        assert_eq!(
            s[&key].0, l[&key].0,
            "{a} {ph}: control bytes do not grow with n"
        );
    }
    for ph in ["reduce_scatter", "allgather"] {
        assert_eq!(
            s[&("ring".to_string(), ph.to_string())].1,
            0,
            "ring {ph}: all payload"
        );
    }
    // 1-bit: 4 bytes of scale per message, and of the rest the padding's share.
    for (rows, n) in [(&small, n_small), (&large, n_large)] {
        let share = (padded(P, n) - n) as f64 / padded(P, n) as f64;
        for r in rows.iter().filter(|r| algo(r) == "onebit") {
            let want = 4 + ((r.bytes - 4) as f64 * share).round() as u64;
            assert_eq!(
                r.fixed_bytes, want,
                "onebit {} at n = {n}: {} bytes",
                r.phase, r.bytes
            );
        }
    }
    // The small recording scaled the replay's way carries the large one's bytes.
    let scale = (n_large / n_small) as f64;
    let mut totals: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for r in &small {
        let e = totals.entry(algo(r)).or_default();
        e.0 += r.fixed_bytes as f64 + (r.bytes - r.fixed_bytes) as f64 * scale;
    }
    for r in &large {
        totals.entry(algo(r)).or_default().1 += r.bytes as f64;
    }
    for (a, (scaled, recorded)) in totals {
        // Ring, TopkA and gTop-k send what k and n fix; the others' volumes depend on the
        // data (overlaps between ranks, thresholds, regions).
        let tol = if ["ring", "topka", "gtopk"].contains(&a) {
            0.005
        } else {
            0.05
        };
        let err = (scaled / recorded - 1.0).abs();
        assert!(
            err <= tol,
            "{a}: scaled ×{scale} {scaled:.0} B vs recorded {recorded:.0} B ({:.1} %)",
            err * 100.0
        );
    }
}
