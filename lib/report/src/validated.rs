//! What the SimGrid replay was validated against, and how well it did (docs/RESULTS.md §
//! "SimGrid replay: calibration and validation", `make repro-sim`): recordings replayed with
//! calibrated factors on a flat platform at the shaped cluster's link rates, unscaled, each
//! row's error as a factor, max(sim/meas, meas/sim), so an under-estimate counts as much as an
//! over-estimate (issue 44). `gradreport simulate` prints the error bar of the validated rate
//! and family nearest its platform and warns where the platform lies outside what was
//! validated. pipelines/docs_check.py checks [`VALIDATED`] against the validation table.

use crate::simgrid::{Platform, Topology};

/// The calibrated replay's error at one validated link rate, for one family of algorithms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ErrorBar {
    /// The shaped cluster's rate as `make repro-sim` names it.
    pub rate: &'static str,
    /// Bytes per second.
    pub rate_bps: f64,
    /// `dense` (ring, Rabenseifner) or `sparse, 1-bit, AlltoAll` (every other algorithm).
    pub family: &'static str,
    /// Rows of the validation table in this group.
    pub rows: u32,
    /// Median and largest factor over the rows.
    pub median: f64,
    pub worst: f64,
}

/// The validation of 2026-11-29 (8 shaped hosts, 3 interleaved repeats, P = 2, 4, 8; 13
/// algorithms and exchanges: [`VALIDATED_ALGOS`]).
pub const VALIDATED: &[ErrorBar] = &[
    ErrorBar {
        rate: "100mbit",
        rate_bps: 12.5e6,
        family: "dense",
        rows: 6,
        median: 1.20,
        worst: 1.92,
    },
    ErrorBar {
        rate: "100mbit",
        rate_bps: 12.5e6,
        family: "sparse, 1-bit, AlltoAll",
        rows: 33,
        median: 1.15,
        worst: 1.79,
    },
    ErrorBar {
        rate: "1gbit",
        rate_bps: 125e6,
        family: "dense",
        rows: 6,
        median: 1.37,
        worst: 1.92,
    },
    ErrorBar {
        rate: "1gbit",
        rate_bps: 125e6,
        family: "sparse, 1-bit, AlltoAll",
        rows: 33,
        median: 1.39,
        worst: 5.26,
    },
];

/// The most ranks a validation row had.
pub const VALIDATED_RANKS: usize = 8;

/// The algorithms the validation table has rows for (the first word of its rows' labels;
/// `embrace` and `allgather` are gradtrain's exchanges of the embedding): a replay of another
/// is warned of. pipelines/docs_check.py checks the list against the table.
pub const VALIDATED_ALGOS: &[&str] = &[
    "ring",
    "rabenseifner",
    "onebit",
    "topka",
    "topkdsa",
    "gtopk",
    "gaussiank",
    "oktopk",
    "deft",
    "cltk",
    "topk-union",
    "embrace",
    "allgather",
];

/// The family of the validation table an `--algo` name falls in.
pub fn family_of(algo: &str) -> &'static str {
    match algo {
        "ring" | "rabenseifner" | "ring-fp16" | "native" | "tree" => "dense",
        _ => "sparse, 1-bit, AlltoAll",
    }
}

/// The error bar of the validated rate nearest `link_bps` (in ratio) for `algo`'s family.
pub fn nearest(link_bps: f64, algo: &str) -> ErrorBar {
    let fam = family_of(algo);
    let dist = |e: &ErrorBar| (link_bps / e.rate_bps).ln().abs();
    *VALIDATED
        .iter()
        .filter(|e| e.family == fam)
        .min_by(|a, b| dist(a).total_cmp(&dist(b)))
        .expect("a validated row per family")
}

/// Where a replay lies outside what was validated: the link rate beyond the validated rates
/// (by more than 2×), another topology, scaled messages, more ranks, an algorithm (of
/// `algos`, comma-separated as a recording's `algo` is) without validation rows.
pub fn outside(platform: &Platform, algos: &str, scale_bytes: f64, ranks: usize) -> Vec<String> {
    let mut out = Vec::new();
    let unvalidated: Vec<&str> = algos
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty() && !VALIDATED_ALGOS.contains(a))
        .collect();
    if !unvalidated.is_empty() {
        out.push(format!(
            "no validation rows for {} (validated: {})",
            unvalidated.join(", "),
            VALIDATED_ALGOS.join(", ")
        ));
    }
    let (lo, hi) = VALIDATED.iter().fold((f64::MAX, 0.0f64), |(l, h), e| {
        (l.min(e.rate_bps), h.max(e.rate_bps))
    });
    let rate = platform.link_bps;
    if rate > 2.0 * hi || rate < lo / 2.0 {
        out.push(format!(
            "links of {:.3} Gbit/s, {} the validated 0.1–1 Gbit/s",
            rate * 8.0 / 1e9,
            if rate > hi {
                "faster than"
            } else {
                "slower than"
            }
        ));
    }
    if !matches!(platform.topology, Topology::Flat) {
        out.push(format!(
            "a {} topology (validated: flat)",
            platform.topology.name()
        ));
    }
    if scale_bytes != 1.0 {
        out.push(format!(
            "messages scaled ×{scale_bytes} (validated: as recorded; control messages and padding kept as recorded, imbalance between ranks as recorded: docs/RESULTS.md § sim-scale-sizes)"
        ));
    }
    if ranks > VALIDATED_RANKS {
        out.push(format!(
            "{ranks} ranks (validated: up to {VALIDATED_RANKS})"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(link_bps: f64) -> Platform {
        Platform {
            topology: Topology::Flat,
            hosts: 4,
            ranks_per_host: 1,
            link_bps,
            latency_s: 5e-6,
            intra_bps: 1e11,
            intra_latency_s: 1e-6,
        }
    }

    #[test]
    fn the_nearest_rate_and_family_are_picked() {
        assert_eq!(nearest(20e6, "oktopk").rate, "100mbit");
        assert_eq!(nearest(100e6, "ring").rate, "1gbit");
        assert_eq!(nearest(12.5e9, "topka").family, "sparse, 1-bit, AlltoAll");
        assert_eq!(nearest(12.5e9, "ring").family, "dense");
    }

    #[test]
    fn only_what_was_not_validated_is_named() {
        assert!(outside(&flat(12.5e6), "oktopk", 1.0, 8).is_empty());
        assert!(outside(&flat(12.5e6), "ring,topk-union,cltk", 1.0, 8).is_empty());
        let w = outside(&flat(12.5e9), "oktopk", 509.4, 256);
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("100.000 Gbit/s") && w[0].contains("faster"));
        assert!(w[1].contains("509.4") && w[2].contains("256 ranks"));
        let mut fat = flat(125e6);
        fat.topology = Topology::FatTree("2;4,4;1,4;1,1".into());
        assert_eq!(outside(&fat, "ring", 1.0, 4).len(), 1);
        let w = outside(&flat(12.5e6), "ring,tree", 1.0, 4);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("no validation rows for tree (validated: ring,"),
            "{w:?}"
        );
    }
}
