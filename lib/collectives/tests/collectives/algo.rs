//! The algorithm list (the descriptors of `registry::ALL`) against an independent
//! reference: the names, families, the options each reads and the model coverage typed in
//! from docs/gradallreduce.md and Ok-Topk's Table 1, not derived from the code under test.

use gradkit_collectives::plan::PlanKind;
use gradkit_collectives::{Algo, Family, Knob};

/// (`--algo` name, family) as docs/gradallreduce.md's table and `--help` list them: the
/// algorithms of the papers, in their order. A new algorithm joins the list with its
/// descriptor's family at its place; its own test checks it.
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
    // EXPECTED, in its order, with any algorithm added since in between.
    let mut rest = got.iter();
    for e in EXPECTED {
        assert!(
            rest.any(|g| g == e),
            "{e:?} missing or out of order in {got:?}"
        );
    }
    let mut names: Vec<&str> = got.iter().map(|g| g.0).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), got.len(), "a name twice: {got:?}");
    // The families come in Family::ALL's order (each family's list in turn).
    let families: Vec<Family> = Algo::ALL.iter().map(|a| a.family()).collect();
    assert!(families.is_sorted(), "{families:?}");
    for a in Algo::ALL {
        assert!(!a.description().is_empty(), "{a}: no description");
        assert!(!a.description().contains('\n'), "{a}: not one line");
    }
}

#[test]
fn parse_display_round_trip_and_unknown_names() {
    for name in EXPECTED.iter().map(|e| e.0).chain(Algo::names()) {
        let a: Algo = name.parse().unwrap();
        assert_eq!(a.to_string(), name);
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
        let want: Vec<&str> = Algo::names().collect();
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
fn each_descriptor_names_its_formula() {
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
        let got = a.cost(p, n, k).map(|c| (c.latency, c.words));
        assert_eq!(got, *w, "{name}");
        let by_name = Algo::cost_by_name(name, p, n, k).map(|c| (c.latency, c.words));
        assert_eq!(by_name, *w);
    }
    assert_eq!(Algo::cost_by_name("nope", p, n, k), None);
}

/// Ok-Topk Table 1, typed in from oktopk.md §2 for P = 16, n = 2^24, k = n/100, through the
/// descriptors: each row's formula, and both ends where the table gives an interval (TopkDSA,
/// Ok-Topk); its other rows have none.
#[test]
fn descriptors_reproduce_table1() {
    let (p, n, k) = (16usize, (1u64 << 24) as f64, ((1u64 << 24) / 100) as f64);
    let (pp, lg) = (p as f64, 4.0);
    let cost = |name: &str| {
        let c = name.parse::<Algo>().unwrap().cost(p, n, k).unwrap();
        (c.latency, c.words)
    };
    assert_eq!(cost("rabenseifner"), (2.0 * lg, 2.0 * n * (pp - 1.0) / pp));
    assert_eq!(cost("topka"), (lg, 2.0 * k * (pp - 1.0)));
    assert_eq!(cost("topkdsa"), (pp + 2.0 * lg, 4.0 * k * (pp - 1.0) / pp));
    assert_eq!(cost("gtopk"), (2.0 * lg, 4.0 * k * lg));
    assert_eq!(cost("gaussiank"), (2.0 * lg, 2.0 * k * (pp - 1.0)));
    assert_eq!(
        cost("oktopk"),
        (2.0 * pp + 2.0 * lg, 6.0 * k * (pp - 1.0) / pp)
    );
    let bounds = |a: Algo| {
        a.bounds(p, n, k)
            .map(|(b, w)| ((b.latency, b.words), (w.latency, w.words)))
    };
    for name in [
        "rabenseifner",
        "topka",
        "topkdsa",
        "gtopk",
        "gaussiank",
        "oktopk",
    ] {
        let a: Algo = name.parse().unwrap();
        let want = match name {
            "topkdsa" => Some((
                (pp + 2.0 * lg, 4.0 * k * (pp - 1.0) / pp),
                (pp + 2.0 * lg, (2.0 * k + n) * (pp - 1.0) / pp),
            )),
            "oktopk" => Some((
                (2.0 * pp + 2.0 * lg, 2.0 * k * (pp - 1.0) / pp),
                (2.0 * pp + 2.0 * lg, 6.0 * k * (pp - 1.0) / pp),
            )),
            _ => None,
        };
        assert_eq!(bounds(a), want, "{a}");
    }
    // Ok-Topk's worst case beats TopkA's volume for every P > 3.
    assert!(cost("oktopk").1 < cost("topka").1);
}

/// DeepSpeed's 1-bit volume: 32× below the ring's for large n; the padding to a multiple of
/// P·lcm(P, 8) typed in; and where P·lcm(P, 8) or the padded length passes 2^64 the padding
/// is still the definition's, never a wrapped 0 (a divide by zero) or a wrapped small length
/// (an absurd speedup).
#[test]
fn onebit_formula_pads_as_deepspeed_and_never_wraps() {
    use gradkit_collectives::onebit::padded;
    let onebit = |p: usize, n: usize| {
        "onebit"
            .parse::<Algo>()
            .unwrap()
            .cost(p, n as f64, 0.0)
            .unwrap()
    };
    let ring = |p: usize, n: f64| "ring".parse::<Algo>().unwrap().cost(p, n, 0.0).unwrap();
    let n = 16usize << 20;
    let ratio = ring(4, n as f64).bytes() / onebit(4, n).bytes();
    assert!(ratio > 31.9 && ratio <= 32.0, "{ratio}");
    assert_eq!(padded(3, 1), 72);
    assert_eq!(padded(8, 65), 128);
    // lcm(2^32, 8) = 2^32, so the multiple is 2^64.
    let p = 1usize << 32;
    assert_eq!(padded(p, 1), 1u128 << 64);
    assert_eq!(padded(p, usize::MAX), 1u128 << 64);
    // n = 2^64 − 1 on 256 ranks: the multiple is 256·256 = 2^16, padded to 2^64.
    assert_eq!(padded(256, usize::MAX), 1u128 << 64);
    let c = onebit(256, usize::MAX);
    // At least its sign bytes: 2(P−1)/P · n/8.
    assert!(
        c.bytes() >= 2.0 * 255.0 / 256.0 * (usize::MAX as f64) / 8.0,
        "{c:?}"
    );
    let ratio = ring(256, usize::MAX as f64).bytes() / c.bytes();
    assert!(ratio > 31.9 && ratio <= 32.0, "{ratio}");
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

/// Which algorithm reads which option, typed in from docs/gradallreduce.md's flag table:
/// the refusals of a flag given to another algorithm are derived from the descriptors.
#[test]
fn each_option_is_read_by_the_algorithms_the_docs_name() {
    let want: &[(Knob, &[&str])] = &[
        (Knob::State, &["onebit", "onebit-naive"]),
        (Knob::Plan, &["deft", "oktopk"]),
        (Knob::Period, &["oktopk"]),
        (Knob::Reeval, &["oktopk"]),
        (Knob::Adjust, &["oktopk"]),
        (Knob::Balance, &["oktopk"]),
        (Knob::ReevalStepD, &["oktopk"]),
        (Knob::Split, &["embrace"]),
        (Knob::Wire, &["ring", "ring-fp16"]),
    ];
    for (knob, names) in want {
        assert_eq!(knob.readers(), *names, "{}", knob.flag());
    }
    // --op: every algorithm but the 1-bit ones, which always average.
    let no_op: Vec<&str> = Algo::ALL
        .iter()
        .filter(|a| !a.reads(Knob::Op))
        .map(|a| a.name())
        .collect();
    assert_eq!(no_op, ["onebit", "onebit-naive"]);
    assert_eq!(
        "deft".parse::<Algo>().unwrap().plan_kind(),
        Some(PlanKind::Deft)
    );
    assert_eq!(
        "oktopk".parse::<Algo>().unwrap().plan_kind(),
        Some(PlanKind::Oktopk)
    );
    for a in Algo::ALL {
        assert_eq!(a.plan_kind().is_some(), a.reads(Knob::Plan), "{a}");
    }
}

/// The sparse algorithms that see every rank's dense values and so cannot take a
/// selection (DEFT §3, CLT-k, Top-k (union)), as docs/gradallreduce.md says.
#[test]
fn the_dense_input_only_algorithms_are_the_three_of_the_docs() {
    let got: Vec<&str> = Algo::ALL
        .iter()
        .filter(|a| a.descriptor().dense_input_only)
        .map(|a| a.name())
        .collect();
    assert_eq!(got, ["deft", "cltk", "topk-union"]);
}

/// Every descriptor says which paper section it implements, and its constructor builds a
/// reducer of its own name.
#[test]
fn every_descriptor_cites_its_paper_and_builds_its_reducer() {
    let params = gradkit_collectives::Params::default();
    for a in Algo::ALL {
        assert!(!a.descriptor().paper.is_empty(), "{a}: no paper");
        let r = gradkit_collectives::reducer_for(*a, &params).unwrap();
        assert_eq!(r.name(), a.name());
    }
}
