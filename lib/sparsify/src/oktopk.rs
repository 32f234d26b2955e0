//! Ok-Topk's local selection (Li & Hoefler, PPoPP'22, §3.1.3 and Algorithm 1 lines 2–3):
//! the exact k-th largest |acc| is computed every τ' steps (`th_re_evaluate`) and reused as a
//! threshold (`|acc| > th`) in the steps between. This is the one implementation of the
//! local threshold reuse: `gradselect --method oktopk` uses it through [`crate::Selector`],
//! the Ok-Topk collective (`gradallreduce --algo oktopk`, `gradtrain --exchange oktopk`)
//! through [`OkTopk::select_values_at`].
//!
//! What happens to the reused threshold is the [`Adjust`] policy:
//! - [`Adjust::Paper`] (Algorithm 1 lines 9–13 as written): the threshold is reused unchanged
//!   for τ'−1 steps and re-evaluated exactly every τ' steps.
//! - [`Adjust::Reference`] with [`Bands`] (the authors' code, oktopk.md §1, anchors.md §4; not
//!   in the paper): on a reuse step, while more than `pre_upper·k` entries pass, th is
//!   multiplied by `pre_factor` (at most `pre_loops` times); after every selection, a count
//!   below `lower·k` divides th by `factor` and a count above `upper·k` multiplies it by
//!   `factor`, for the next step.
//! - [`Adjust::Ladder`] (gradkit's, the default; not in the paper nor the authors' code): on a
//!   reuse step the threshold moves along a ladder of rungs th·1.06^j (j = −12 … 24) to the
//!   rung whose count is closest to k among those that let at most 4k/3 through
//!   ([`pick_rung`]); the ladder re-centres at most [`TH_ADJUST_ROUNDS`] times. Locally the
//!   counts are this rank's own (no message); the collective applies the same rule to the
//!   global threshold with the counts summed by one integer allreduce.

use crate::{threshold, topk};

/// The reference code's count bands for the local threshold, and the global threshold's
/// bands the Ok-Topk collective applies with [`Adjust::Reference`] (oktopk.md §1 [artifact],
/// anchors.md §4).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bands {
    /// The preset's name (`vgg`, `lstm`, `bert`).
    pub name: &'static str,
    /// Pre-selection loop: raise th while count > pre_upper·k …
    pub pre_upper: f64,
    /// … by this factor …
    pub pre_factor: f32,
    /// … at most this many times.
    pub pre_loops: u32,
    /// After selection: count < lower·k → th /= factor.
    pub lower: f64,
    /// After selection: count > upper·k → th *= factor.
    pub upper: f64,
    pub factor: f32,
    /// Global threshold after a step: global count < global_lower·k → th /= global_down …
    pub global_lower: f64,
    /// … global count > global_upper·k → th *= global_up.
    pub global_upper: f64,
    pub global_down: f32,
    pub global_up: f32,
}

impl Bands {
    /// VGG-16's bands: pre-loop ×1.03 (≤5) above 4k/3; after selection [2k/3, 5k/4], 1.012;
    /// global [2k/3, 4k/3], ÷1.01 / ×1.008 (anchors.md §4, `VGG/allreducer.py`).
    pub const VGG: Bands = Bands {
        name: "vgg",
        pre_upper: 4.0 / 3.0,
        pre_factor: 1.03,
        pre_loops: 5,
        lower: 2.0 / 3.0,
        upper: 5.0 / 4.0,
        factor: 1.012,
        global_lower: 2.0 / 3.0,
        global_upper: 4.0 / 3.0,
        global_down: 1.01,
        global_up: 1.008,
    };
    /// LSTM's bands: as VGG with the lower bands at 3k/4 and the global upper band at 5k/4.
    pub const LSTM: Bands = Bands {
        name: "lstm",
        lower: 3.0 / 4.0,
        global_lower: 3.0 / 4.0,
        global_upper: 5.0 / 4.0,
        ..Bands::VGG
    };
    /// BERT's bands: lower bands 4k/5, factor 1.025; global [4k/5, 5k/4], ÷1.036 / ×1.025.
    pub const BERT: Bands = Bands {
        name: "bert",
        lower: 4.0 / 5.0,
        factor: 1.025,
        global_lower: 4.0 / 5.0,
        global_upper: 5.0 / 4.0,
        global_down: 1.036,
        global_up: 1.025,
        ..Bands::VGG
    };
    /// The preset named `vgg`, `lstm` or `bert`.
    pub fn preset(name: &str) -> Option<Bands> {
        match name {
            "vgg" => Some(Bands::VGG),
            "lstm" => Some(Bands::LSTM),
            "bert" => Some(Bands::BERT),
            _ => None,
        }
    }

    /// The global threshold for the next step after a step whose global count was `c`.
    pub fn nudge_global(&self, th: f32, c: usize, k: usize) -> f32 {
        let (c, k) = (c as f64, k as f64);
        if c < self.global_lower * k {
            th / self.global_down
        } else if c > self.global_upper * k {
            th * self.global_up
        } else {
            th
        }
    }
}

/// How a reused Ok-Topk threshold is adjusted between re-evaluations (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Adjust {
    /// Algorithm 1 as written: reuse unchanged, re-evaluate exactly every τ' steps.
    Paper,
    /// The authors' code: ×1.03 pre-loop and count bands.
    Reference(Bands),
    /// The count ladder, closest to k with at most 4k/3 passing (the default).
    #[default]
    Ladder,
}

impl Adjust {
    /// The values `--adjust` accepts: `vgg`, `lstm`, `bert` are `reference` with those bands
    /// (`reference` = `vgg`), kept from the earlier `--adjust=BANDS` flag.
    pub const NAMES: &'static [&'static str] =
        &["ladder", "paper", "reference", "vgg", "lstm", "bert"];

    /// The policy named `name` (one of [`Adjust::NAMES`]).
    pub fn parse(name: &str) -> Option<Adjust> {
        match name {
            "paper" => Some(Adjust::Paper),
            "ladder" => Some(Adjust::Ladder),
            "reference" => Some(Adjust::Reference(Bands::VGG)),
            other => Bands::preset(other).map(Adjust::Reference),
        }
    }

    /// `paper`, `ladder`, or `reference-vgg|lstm|bert` (metadata and metrics labels).
    pub fn label(&self) -> String {
        match self {
            Adjust::Paper => "paper".into(),
            Adjust::Ladder => "ladder".into(),
            Adjust::Reference(b) => format!("reference-{}", b.name),
        }
    }
}

/// Ratio between neighbouring rungs of the threshold ladder.
pub const TH_LADDER_STEP: f64 = 1.06;
/// Rungs above the reused threshold (1.06^24 ≈ 4.05×).
pub const TH_LADDER_UP: i32 = 24;
/// Rungs below it (1.06^−12 ≈ 0.50×).
pub const TH_LADDER_DOWN: i32 = 12;
/// At most this many ladder rounds per step (a round re-centres the ladder on its top or
/// bottom rung when the band was not reached: up to 4.05^4 ≈ 270× per step).
pub const TH_ADJUST_ROUNDS: u32 = 4;
/// Counts per round in the collective: one per rung plus the count of all non-zeros.
pub const TH_ADJUST_COUNTS: usize = (TH_LADDER_DOWN + TH_LADDER_UP + 2) as usize;

/// The ladder around `th`: rung i (i = 0 … D+U) is `th·1.06^(i−D)`, computed in f64 and
/// rounded to f32 (the same bits on every rank); rung D is `th` itself.
pub fn th_ladder(th: f32) -> Vec<f32> {
    (-TH_LADDER_DOWN..=TH_LADDER_UP)
        .map(|j| (th as f64 * TH_LADDER_STEP.powi(j)) as f32)
        .collect()
}

/// What one ladder round decided from the counts `counts[i]` = #{|v| > rung i}
/// (non-increasing in i) and `all` = # non-zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rung {
    /// Use rung i.
    Take(usize),
    /// Re-centre the ladder on rung i and count again (band not reached inside the ladder).
    Recentre(usize),
}

/// The ladder's rule for one round, band [2k/3, 4k/3] (the reference code's VGG global band,
/// anchors.md §4): among the rungs whose count is ≤ 4k/3, the one whose count is closest to
/// k (ties to the higher threshold). When no rung is ≤ 4k/3 the ladder re-centres on its top
/// rung; when the pick is the bottom rung, its count is < 2k/3 and lowering could still add
/// entries (`all` > that count), it re-centres on the bottom rung. Re-centring only happens
/// while `last` is false (the final round takes the best rung it has).
pub fn pick_rung(counts: &[u64], all: u64, k: u64, last: bool) -> Rung {
    let top = counts.len() - 1;
    let pick = (0..counts.len())
        .filter(|&i| 3 * counts[i] <= 4 * k)
        .min_by_key(|&i| (counts[i].abs_diff(k), std::cmp::Reverse(i)));
    match pick {
        None if last => Rung::Take(top),
        None => Rung::Recentre(top),
        Some(0) if !last && 3 * counts[0] < 2 * k && all > counts[0] => Rung::Recentre(0),
        Some(i) => Rung::Take(i),
    }
}

/// The ladder applied to one rank's accumulator (no message): returns `{|acc| > th'}` with
/// values, the threshold th' picked by [`pick_rung`] from this rank's own counts, and the
/// rounds run. A threshold ≤ 0 (or not finite) is kept as it is.
pub fn ladder_local(acc: &[f32], th: f32, k: usize) -> (Vec<u32>, Vec<f32>, f32, u32) {
    if th <= 0.0 || !th.is_finite() {
        let (i, v) = threshold::above_with_values(acc, th);
        return (i, v, th, 0);
    }
    let mut th = th;
    for round in 1..=TH_ADJUST_ROUNDS {
        let last = round == TH_ADJUST_ROUNDS;
        let rungs = th_ladder(th);
        let (mut idx, mut val) = threshold::above_with_values(acc, rungs[0]);
        let mut mag: Vec<f32> = val.iter().map(|v| v.abs()).collect();
        mag.sort_unstable_by(|a, b| a.total_cmp(b));
        let counts: Vec<u64> = rungs
            .iter()
            .map(|&t| (mag.len() - mag.partition_point(|&m| m <= t)) as u64)
            .collect();
        // The number of non-zeros only matters for a bottom-rung pick: counted then only.
        let mut rung = pick_rung(&counts, u64::MAX, k as u64, last);
        if rung == Rung::Recentre(0) {
            let all = threshold::count_above(acc, 0.0) as u64;
            rung = pick_rung(&counts, all, k as u64, last);
        }
        match rung {
            Rung::Take(i) => {
                threshold::refine_values(&mut idx, &mut val, rungs[i]);
                return (idx, val, rungs[i], round);
            }
            Rung::Recentre(i) => th = rungs[i],
        }
    }
    unreachable!("the last round takes a rung")
}

/// Ok-Topk's local threshold state of one rank (one per layer with `--scope layer`).
#[derive(Clone, Debug)]
pub struct OkTopk {
    /// τ': re-evaluate every this many calls (1 = exact top-k every step).
    pub reeval: u32,
    pub adjust: Adjust,
    calls: u64,
    th: Option<f32>,
}

/// What one Ok-Topk selection did.
#[derive(Clone, Debug, PartialEq)]
pub struct OkStep {
    pub indices: Vec<u32>,
    /// The threshold of this step: the exact k-th largest |acc| on a re-evaluation step (0
    /// when at most k entries are non-zero), the reused (possibly adjusted) threshold
    /// otherwise.
    pub threshold: Option<f32>,
    /// True on a re-evaluation step: the selection is the exact top-k (ties to the lower
    /// index, exact zeros left out); on other steps it is exactly `{i : |acc_i| > threshold}`.
    pub reevaluated: bool,
}

impl OkTopk {
    pub fn new(reeval: u32, adjust: Adjust) -> Self {
        OkTopk {
            reeval: reeval.max(1),
            adjust,
            calls: 0,
            th: None,
        }
    }

    /// `th_re_evaluate` (Alg. 1 line 2): the exact k-th largest |acc|.
    pub fn th_re_evaluate(acc: &[f32], k: usize) -> Option<f32> {
        (k >= 1 && k <= acc.len()).then(|| topk::kth_largest_abs(acc, k))
    }

    /// Selects from `acc`: calls 0, τ', 2τ', … re-evaluate; the calls between reuse th.
    pub fn select(&mut self, acc: &[f32], k: usize) -> OkStep {
        self.select_values(acc, k).0
    }

    /// As [`OkTopk::select`], with the selected values `acc[i]` (from the selection pass).
    pub fn select_values(&mut self, acc: &[f32], k: usize) -> (OkStep, Vec<f32>) {
        let reeval = self.calls.is_multiple_of(self.reeval as u64);
        self.select_values_at(reeval, acc, k)
    }

    /// One selection with the re-evaluation decided by the caller (the collective's call
    /// counter); a call without a threshold yet re-evaluates.
    pub fn select_values_at(&mut self, reeval: bool, acc: &[f32], k: usize) -> (OkStep, Vec<f32>) {
        let k = k.min(acc.len());
        self.calls += 1;
        let reeval = reeval || self.th.is_none() || k == 0;
        let (step, values) = if reeval {
            let (mut indices, mut values, mut th) = topk::topk_with_values(acc, k);
            // At most k non-zeros (e.g. density 1): all of them, and th = 0 lets every
            // non-zero through on the reuse steps (one counting pass, every τ' steps only).
            if th == Some(0.0) || (th.is_some() && threshold::count_above(acc, 0.0) <= k) {
                threshold::refine_values(&mut indices, &mut values, 0.0);
                th = Some(0.0);
            }
            self.th = th;
            let step = OkStep {
                indices,
                threshold: th,
                reevaluated: true,
            };
            (step, values)
        } else {
            let th = self.th.expect("threshold set");
            let (indices, values, th) = match self.adjust {
                Adjust::Paper => {
                    let (i, v) = threshold::above_with_values(acc, th);
                    (i, v, th)
                }
                Adjust::Reference(b) => {
                    let mut th = th;
                    let (mut i, mut v) = threshold::above_with_values(acc, th);
                    let mut loops = 0;
                    while (i.len() as f64) > b.pre_upper * k as f64 && loops < b.pre_loops {
                        th *= b.pre_factor;
                        threshold::refine_values(&mut i, &mut v, th);
                        loops += 1;
                    }
                    (i, v, th)
                }
                Adjust::Ladder => {
                    let (i, v, th, _) = ladder_local(acc, th, k);
                    (i, v, th)
                }
            };
            let step = OkStep {
                indices,
                threshold: Some(th),
                reevaluated: false,
            };
            (step, values)
        };
        self.th = match (self.adjust, step.threshold) {
            (Adjust::Reference(b), Some(th)) => {
                let c = step.indices.len() as f64;
                Some(if c < b.lower * k as f64 {
                    th / b.factor
                } else if c > b.upper * k as f64 {
                    th * b.factor
                } else {
                    th
                })
            }
            (_, th) => th,
        };
        (step, values)
    }
}
