//! The algorithm list against an independent reference: the names, families and model
//! coverage typed in from docs/gradallreduce.md and Ok-Topk's Table 1, not derived from the
//! code under test.

use gradkit_cost::{by_algo, by_name, Algo, Family};

/// (`--algo` name, family) as docs/gradallreduce.md's table and `--help` list them.
const EXPECTED: &[(&str, &str)] = &[
    ("ring", "dense"),
    ("ring-fp16", "dense"),
    ("rabenseifner", "dense"),
    ("tree", "dense"),
    ("native", "dense"),
    ("topka", "sparse"),
    ("topkdsa", "sparse"),
    ("gtopk", "sparse"),
    ("gaussiank", "sparse"),
    ("oktopk", "sparse"),
    ("deft", "sparse"),
    ("cltk", "sparse"),
    ("topk-union", "sparse"),
    ("onebit", "compressed"),
    ("onebit-naive", "compressed"),
    ("embrace", "embedding"),
];

#[test]
fn all_lists_every_algorithm_once_in_help_order() {
    let got: Vec<(&str, &str)> = Algo::ALL
        .iter()
        .map(|a| (a.name(), a.family().name()))
        .collect();
    assert_eq!(got, EXPECTED);
    for a in Algo::ALL {
        assert!(!a.description().is_empty(), "{a}: no description");
        assert!(!a.description().contains('\n'), "{a}: not one line");
    }
}

#[test]
fn parse_display_round_trip_and_unknown_names() {
    for (name, _) in EXPECTED {
        let a: Algo = name.parse().unwrap();
        assert_eq!(a.to_string(), *name);
    }
    // The old spelling is read as the algorithm and displayed by its name.
    let old: Algo = "alltoall".parse().unwrap();
    assert_eq!(old.to_string(), "embrace");
    // Exact, case-sensitive names only.
    for bad in ["nope", "Ring", "onebit_naive", "", " ring"] {
        let e = bad.parse::<Algo>().unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("unknown --algo `{bad}` (known: ")),
            "{e}"
        );
        let listed = e.split("(known: ").nth(1).unwrap().trim_end_matches(')');
        let listed: Vec<&str> = listed.split(", ").collect();
        let want: Vec<&str> = EXPECTED.iter().map(|e| e.0).collect();
        assert_eq!(listed, want);
    }
}

#[test]
fn families_display_their_names() {
    let names: Vec<String> = Family::ALL.iter().map(|f| f.to_string()).collect();
    assert_eq!(names, ["dense", "sparse", "compressed", "embedding"]);
}

/// The dispatch against Table 1's formulas typed in for P = 8 (log P = 3), n = 8000,
/// k = 80: dense 2n(P−1)/P = 14000 words; TopkA 2k(P−1) = 1120; TopkDSA best
/// 4k(P−1)/P = 280; gTopk 4k log P = 960; Gaussiank 2k(P−1) = 1120; Ok-Topk worst
/// 6k(P−1)/P = 420; CLT-k log P + 2(P−1) = 17 α, k log P + 2k(P−1)/P = 240 + 140 = 380;
/// Top-k (union) best case (union of k) 3(P−1) = 21 α, k(P−1) + 2k(P−1)/P = 560 + 140 = 700;
/// tree n log P = 24000; 1-bit: n padded to 8·lcm(8,8) = 64 → 8000,
/// 2(P−1)/P·8000/8 + 2(P−1)·4 = 1806 bytes.
#[test]
fn by_algo_picks_each_algorithms_formula() {
    let (p, n, k) = (8usize, 8000.0, 80.0);
    let want: &[(&str, Option<(f64, f64)>)] = &[
        ("ring", Some((14.0, 14000.0))),
        ("rabenseifner", Some((6.0, 14000.0))),
        ("tree", Some((6.0, 24000.0))),
        ("native", Some((6.0, 14000.0))),
        ("topka", Some((3.0, 1120.0))),
        ("topkdsa", Some((14.0, 280.0))),
        ("gtopk", Some((6.0, 960.0))),
        ("gaussiank", Some((6.0, 1120.0))),
        ("oktopk", Some((22.0, 420.0))),
        ("deft", None),
        ("cltk", Some((17.0, 380.0))),
        ("topk-union", Some((21.0, 700.0))),
        ("onebit", Some((28.0, 1806.0 / 4.0))),
        ("onebit-naive", None),
        ("embrace", None),
    ];
    for (name, w) in want {
        let a: Algo = name.parse().unwrap();
        let got = by_algo(a, p, n, k).map(|c| (c.latency, c.words));
        assert_eq!(got, *w, "{name}");
        assert_eq!(by_name(name, p, n, k).map(|c| (c.latency, c.words)), *w);
    }
    assert_eq!(by_name("nope", p, n, k), None);
}

/// Every algorithm appears in the `--algo` table of docs/gradallreduce.md, and the table
/// names no algorithm that does not exist.
#[test]
fn docs_table_lists_every_algorithm() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/gradallreduce.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let start = doc
        .find("| `--algo` | what | module |")
        .expect("the --algo table");
    let mut named = Vec::new();
    for line in doc[start..].lines().skip(2) {
        if !line.starts_with('|') {
            break;
        }
        let first = line.split('|').nth(1).unwrap();
        named.extend(first.split('`').skip(1).step_by(2).map(|s| s.to_string()));
    }
    let mut want: Vec<String> = Algo::names().map(String::from).collect();
    want.sort();
    named.sort();
    assert_eq!(named, want);
}

/// Ring bytes by hand for P = 3, n = 10: chunks ⌊i·10/3⌋ → [0,3) [3,6) [6,10), sizes 3, 3, 4.
/// Rank r sends 2n − |c_{r+1}| − |c_{r+2}| elements: r0 20−3−4, r1 20−4−3, r2 20−3−3.
#[test]
fn ring_bytes_sent_by_hand() {
    let got: Vec<u64> = (0..3)
        .map(|r| gradkit_cost::ring_bytes_sent(3, 10, r))
        .collect();
    assert_eq!(got, [4 * 13, 4 * 13, 4 * 14]);
    assert_eq!(gradkit_cost::ring_bytes_sent(1, 10, 0), 0);
}
