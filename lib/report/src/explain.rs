//! Why a replay differs from a model (docs/SIMULATE.md § Output), for `gradreport simulate`'s
//! notes after its table: against the α-β model on the recorded messages ([`why`]) and, with
//! `--model-n`, against the papers' idealised formula ([`Ideal`], [`why_formula`]). Both read
//! the same statistics of a step's or phase's sends ([`Sends`]); simulate prints them.

use gradkit_collectives::cost::Cost;
use gradkit_collectives::Algo;
use gradkit_core::{CommRow, EventKind};

use crate::simgrid;

/// Whether `a` and `b` (both > 0) are more than `factor` apart, either way.
pub(crate) fn apart(a: f64, b: f64, factor: f64) -> bool {
    a > 0.0 && b > 0.0 && (a / b).ln().abs() > factor.ln()
}

/// Whether a replay of `simulated_s` is more than 1.5× from a model's `model_s`, either way.
pub(crate) fn far(simulated_s: Option<f64>, model_s: f64) -> bool {
    simulated_s.is_some_and(|s| apart(s, model_s, 1.5))
}

/// A step's or phase's sends, per rank, with sizes as the replay scales them.
struct Sends {
    /// The most messages one rank sends, and the most posted in one call.
    most_msgs: usize,
    most_together: usize,
    /// The most a rank receives in one call.
    most_fan_in: usize,
    /// The busiest rank's bytes, the mean rank's, and all ranks' (of which `fixed` do not
    /// grow with the model).
    most_bytes: f64,
    mean_bytes: f64,
    total: f64,
    fixed: f64,
}

impl Sends {
    fn of(per_rank: &[Vec<&CommRow>], scale: f64) -> Sends {
        let per_call = |evs: &[&CommRow], k: EventKind| {
            let mut calls: std::collections::BTreeMap<u64, usize> = Default::default();
            for e in evs.iter().filter(|e| e.kind == k) {
                *calls.entry(e.call).or_default() += 1;
            }
            calls.values().copied().max().unwrap_or(0)
        };
        let mut s = Sends {
            most_msgs: 0,
            most_together: 0,
            most_fan_in: 0,
            most_bytes: 0.0,
            mean_bytes: 0.0,
            total: 0.0,
            fixed: 0.0,
        };
        for evs in per_rank {
            let sent: Vec<&&CommRow> = evs.iter().filter(|e| e.kind == EventKind::Send).collect();
            let bytes: f64 = sent
                .iter()
                .map(|e| simgrid::scaled(e, scale).unwrap_or(u64::MAX) as f64)
                .sum();
            s.most_msgs = s.most_msgs.max(sent.len());
            s.most_together = s.most_together.max(per_call(evs, EventKind::Send));
            s.most_fan_in = s.most_fan_in.max(per_call(evs, EventKind::Recv));
            s.most_bytes = s.most_bytes.max(bytes);
            s.total += bytes;
            s.fixed += sent.iter().map(|e| e.fixed_bytes as f64).sum::<f64>();
        }
        s.mean_bytes = s.total / per_rank.len().max(1) as f64;
        s
    }

    /// The share of the bytes that is control (`fixed_bytes`).
    fn control(&self) -> f64 {
        if self.total > 0.0 {
            self.fixed / self.total
        } else {
            0.0
        }
    }
}

/// What in `per_rank`'s messages (one step or phase, sizes × `scale`) the α-β model leaves out
/// or adds, for a replay more than 1.5× from it (docs/SIMULATE.md § Output): messages posted
/// together (the model adds them one after another; the replay overlaps them), receives from
/// many ranks at once (they share the receiver's link), imbalance between the ranks, the share
/// of the per-message latency, and control bytes.
pub fn why(per_rank: &[Vec<&CommRow>], scale: f64, alpha: f64, model_s: f64) -> Vec<String> {
    let s = Sends::of(per_rank, scale);
    let mut out = Vec::new();
    if s.most_together > 1 {
        out.push(format!("up to {} messages posted together by a rank (the model adds them one after another, the replay overlaps them)", s.most_together));
    }
    if s.most_fan_in > 2 {
        out.push(format!(
            "a rank receives up to {} messages at once (they share its link)",
            s.most_fan_in
        ));
    }
    if apart(s.most_bytes, s.mean_bytes, 1.25) {
        out.push(format!(
            "imbalance: the busiest rank sends {:.2}× the mean bytes",
            s.most_bytes / s.mean_bytes
        ));
    }
    let latency = s.most_msgs as f64 * alpha;
    if model_s > 0.0 && latency / model_s > 0.25 {
        out.push(format!(
            "latency: {} messages, α is {:.0} % of the model's time",
            s.most_msgs,
            100.0 * latency / model_s
        ));
    }
    if s.control() > 0.05 {
        out.push(format!(
            "control: {:.0} % of the bytes do not grow with the model (fixed_bytes)",
            100.0 * s.control()
        ));
    }
    out
}

/// The papers' formula for one step or phase: its cost, or outside it (a phase the formula
/// does not count: Ok-Topk's threshold control, its repartition).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Formula {
    Of(Cost),
    Outside,
}

/// The papers' idealised α-β formula (Ok-Topk Table 1's rows, DeepSpeed's, the descriptors'
/// [`gradkit_collectives::algo::Descriptor::cost`] and `phases`) for the model of n elements
/// at density k/n: what `gradallreduce model` prints, on the replay's links and ranks.
#[derive(Clone, Copy, Debug)]
pub struct Ideal {
    pub n: f64,
    pub k: f64,
    pub ranks: usize,
    /// Seconds per message start-up, and per byte.
    pub alpha: f64,
    pub beta: f64,
}

impl Ideal {
    /// `algo`'s formula for the whole step (`phase` None) or one phase; `None` where it has
    /// none (no formula, or none by phase).
    pub fn formula(&self, algo: Option<Algo>, phase: Option<&str>) -> Option<Formula> {
        let a = algo?;
        match phase {
            None => a.cost(self.ranks, self.n, self.k).map(Formula::Of),
            Some(ph) => {
                let phases = a.phase_costs(self.ranks, self.n, self.k)?;
                Some(
                    phases
                        .into_iter()
                        .find(|(name, _)| *name == ph)
                        .map_or(Formula::Outside, |(_, c)| Formula::Of(c)),
                )
            }
        }
    }

    /// A formula's seconds on these links (0 outside it).
    pub fn seconds(&self, f: Formula) -> f64 {
        match f {
            Formula::Of(c) => c.time(self.alpha, self.beta * 4.0),
            Formula::Outside => 0.0,
        }
    }
}

/// The algorithm a recorded label names: its first word (`gradallreduce bench` labels are
/// `oktopk 4194304B top-k`), else the recording's `algo` metadata.
pub(crate) fn algo_of(label: &str, meta_algo: Option<&str>) -> Option<Algo> {
    label
        .split_whitespace()
        .next()
        .and_then(|w| w.parse::<Algo>().ok())
        .or_else(|| meta_algo.and_then(|a| a.parse::<Algo>().ok()))
}

/// What in `per_rank`'s messages (one step or phase, sizes × `scale`) the papers' formula
/// leaves out, for a replay (`simulated_s`) more than 1.5× from it: a phase the formula does
/// not count, more or fewer messages than its start-ups (latency terms), more or fewer bytes
/// on the busiest rank than the formula's, split into the mean rank's payload, imbalance
/// between the ranks and control bytes, and what the network does to the recorded messages
/// (the replay against their α-β sum, `model_s`).
pub fn why_formula(
    per_rank: &[Vec<&CommRow>],
    scale: f64,
    formula: Formula,
    simulated_s: f64,
    model_s: f64,
) -> Vec<String> {
    let Formula::Of(c) = formula else {
        return vec![
            "the formula does not count this phase (control traffic Table 1 leaves out)".into(),
        ];
    };
    let (starts, fbytes) = (c.latency, c.bytes());
    let s = Sends::of(per_rank, scale);
    let mut out = Vec::new();
    if apart(s.most_msgs as f64, starts, 1.5) {
        out.push(format!(
            "latency terms: the busiest rank sends {} messages, the formula counts {starts:.0} start-ups",
            s.most_msgs
        ));
    }
    if apart(s.most_bytes, fbytes, 1.25) {
        let mut parts = vec![format!("the mean rank {:.2}×", s.mean_bytes / fbytes)];
        if apart(s.most_bytes, s.mean_bytes, 1.05) {
            parts.push(format!(
                "imbalance {:.2}× the mean",
                s.most_bytes / s.mean_bytes
            ));
        }
        if s.control() > 0.01 {
            parts.push(format!("{:.0} % control bytes", 100.0 * s.control()));
        }
        out.push(format!(
            "bytes: the busiest rank sends {:.2}× the formula's ({})",
            s.most_bytes / fbytes,
            parts.join(", ")
        ));
    }
    if apart(simulated_s, model_s, 1.5) {
        out.push(format!(
            "network: the replay is {:.2}× the α-β sum of these messages (why sim/α-β)",
            simulated_s / model_s
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(rank: u32, call: u64, bytes: u64, fixed: u64) -> CommRow {
        CommRow {
            step: 0,
            rank,
            event: call,
            call,
            kind: EventKind::Send,
            peer: 1 - rank,
            tag: 0,
            seq: call,
            bytes,
            fixed_bytes: fixed,
            phase: "p".into(),
            label: "x".into(),
            start_s: 0.0,
            end_s: 0.0,
        }
    }

    /// A formula of `starts` start-ups and `bytes` bytes.
    fn of(starts: f64, bytes: f64) -> Formula {
        Formula::Of(Cost {
            latency: starts,
            words: bytes / 4.0,
        })
    }

    #[test]
    fn why_formula_names_latency_terms_imbalance_control_and_the_network() {
        // Rank 0 sends three messages of 1000 B (100 of them control), rank 1 one: the
        // formula's one start-up of 1000 B. Busiest 3000 B = 3× the formula, the mean rank
        // 2000 B = 2×, imbalance 1.5×, control 300 of 4000 B = 8 %.
        let rows = [
            send(0, 0, 1000, 100),
            send(0, 1, 1000, 100),
            send(0, 2, 1000, 100),
            send(1, 0, 1000, 0),
        ];
        let per_rank = vec![rows[..3].iter().collect::<Vec<_>>(), vec![&rows[3]]];
        let why = why_formula(&per_rank, 1.0, of(1.0, 1000.0), 4.0, 1.0);
        assert_eq!(why.len(), 3, "{why:?}");
        assert_eq!(
            why[0],
            "latency terms: the busiest rank sends 3 messages, the formula counts 1 start-ups"
        );
        assert_eq!(
            why[1],
            "bytes: the busiest rank sends 3.00× the formula's (the mean rank 2.00×, imbalance 1.50× the mean, 8 % control bytes)"
        );
        assert!(
            why[2].starts_with("network: the replay is 4.00× the α-β sum"),
            "{why:?}"
        );
        // Scaled ×10, the control bytes stay: 3 × (900·10 + 100) = 27 300 B on rank 0.
        let why = why_formula(&per_rank, 10.0, of(3.0, 27_300.0), 1.0, 1.0);
        assert!(why.is_empty(), "{why:?}");
        // A phase the formula does not count says so, whatever its messages.
        let why = why_formula(&per_rank, 1.0, Formula::Outside, 1.0, 1.0);
        assert_eq!(
            why,
            ["the formula does not count this phase (control traffic Table 1 leaves out)"]
        );
    }

    #[test]
    fn the_formula_is_the_descriptors_by_phase_and_whole() {
        let ideal = Ideal {
            n: 1e6,
            k: 1e4,
            ranks: 8,
            alpha: 1e-5,
            beta: 1e-9,
        };
        let secs = |a: Option<Algo>, ph: Option<&str>| ideal.seconds(ideal.formula(a, ph).unwrap());
        let ring: Algo = "ring".parse().unwrap();
        // The ring: 2(P−1)(α + n/P·4β), half in each phase.
        let whole = 14.0 * (1e-5 + 1e6 / 8.0 * 4e-9);
        assert!((secs(Some(ring), None) - whole).abs() < 1e-12);
        assert!((secs(Some(ring), Some("allgather")) - whole / 2.0).abs() < 1e-12);
        // Ok-Topk: Eq. 1 for split_and_reduce; th_adjust is not in the formula.
        let ok: Algo = "oktopk".parse().unwrap();
        let eq1 = 7.0 * 1e-5 + 2.0 * 1e4 * 7.0 / 8.0 * 4e-9;
        assert!((secs(Some(ok), Some("split_and_reduce")) - eq1).abs() < 1e-12);
        assert_eq!(
            ideal.formula(Some(ok), Some("th_adjust")),
            Some(Formula::Outside)
        );
        assert_eq!(secs(Some(ok), Some("th_adjust")), 0.0);
        // DEFT has no formula: no column.
        assert_eq!(ideal.formula(Some("deft".parse().unwrap()), None), None);
        assert_eq!(algo_of("oktopk 4194304B top-k", None), Some(ok));
        assert_eq!(algo_of("run-1", Some("ring")), Some(ring));
    }
}
