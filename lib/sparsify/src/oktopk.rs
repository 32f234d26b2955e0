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
//!
//! A reuse step reads the accumulator once in the common case (docs/MEMORY.md): one streaming pass
//! ([`Scratch::scan_above`]) keeps the entries above the lowest threshold the policy could
//! take, in buffers kept across steps, and counts every candidate threshold on them (a
//! histogram over the sorted rungs); the selection is then filtered from those candidates.
//! The ladder's extra passes (a sampled floor that was too high, a re-centring on the bottom
//! rung and its count of non-zeros) are counted in [`OkStep::rescans`]. There is no exact
//! top-k on reuse steps: the exact selection runs on the re-evaluation steps only.

use rayon::prelude::*;

use gradkit_core::trace::Sparse;

use crate::resident::{self, DVec, DeviceKernels};
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
    /// The band lies between rungs i and i+1 (rung i lets more than 4k/3 through, rung i+1
    /// fewer than 2k/3): count again on [`fine_ladder`] between them.
    Refine(usize),
}

/// The rungs of a refining round: as many as [`th_ladder`] has, geometric from `lo` to `hi`
/// (both included; computed in f64, rounded to f32, the same bits on every rank).
pub fn fine_ladder(lo: f32, hi: f32) -> Vec<f32> {
    let n = (TH_LADDER_DOWN + TH_LADDER_UP) as f64;
    let ratio = hi as f64 / lo as f64;
    (0..=(TH_LADDER_DOWN + TH_LADDER_UP))
        .map(|j| (lo as f64 * ratio.powf(j as f64 / n)) as f32)
        .collect()
}

/// The ladder of the next round after `rung` was decided on `rungs`.
pub fn next_ladder(rungs: &[f32], rung: Rung) -> Vec<f32> {
    match rung {
        Rung::Recentre(i) => th_ladder(rungs[i]),
        Rung::Refine(i) => fine_ladder(rungs[i], rungs[i + 1]),
        Rung::Take(i) => vec![rungs[i]],
    }
}

/// The ladder's rule for one round, band [2k/3, 4k/3] (the reference code's VGG global band,
/// anchors.md §4): among the rungs whose count is ≤ 4k/3, the one whose count is closest to
/// k (between a count d below k and one d above, the one below). Rungs with the same count
/// select the same entries but set different thresholds for the next step: at or above k the
/// highest is kept, below k the lowest (the k-th magnitude lies below it), unless every
/// non-zero already passes (`count == all`, nothing to gain by lowering: the highest). When no
/// rung is ≤ 4k/3 the ladder re-centres on its top rung; when the pick is the bottom rung, its
/// count is < 2k/3 and lowering could still add entries (`all` > that count), it re-centres on
/// the bottom rung; when it is another rung, the rung below it lets more than 4k/3 through and
/// the band lies between the two: the next round refines between them ([`Rung::Refine`]: the
/// k-th magnitude moved by less than one rung, as when error feedback drains the residual a
/// little each step). Re-centring and refining only happen while `last` is false (the final
/// round takes the best rung it has). `all = u64::MAX` stands for "not counted yet": the rule
/// then never assumes that every non-zero passes.
///
/// Before 2026-11-28 ties went to the highest rung whatever the count, so when nothing passed
/// (gradients fading, every count 0) the top rung (×4.05) was taken step after step and the
/// threshold ran away (issue 41).
pub fn pick_rung(counts: &[u64], all: u64, k: u64, last: bool) -> Rung {
    let top = counts.len() - 1;
    let pick = (0..counts.len())
        .filter(|&i| 3 * counts[i] <= 4 * k)
        .min_by_key(|&i| (counts[i].abs_diff(k), std::cmp::Reverse(i)));
    let Some(best) = pick else {
        return if last {
            Rung::Take(top)
        } else {
            Rung::Recentre(top)
        };
    };
    let c = counts[best];
    // counts are non-increasing: the rungs with count c are one run around `best`.
    let lo = (0..=best)
        .rev()
        .take_while(|&i| counts[i] == c)
        .last()
        .unwrap_or(best);
    let hi = (best..=top)
        .take_while(|&i| counts[i] == c)
        .last()
        .unwrap_or(best);
    if c >= k || c >= all {
        return Rung::Take(hi);
    }
    if !last && 3 * c < 2 * k && all > c {
        // lo > 0: rung lo−1 counts more than c, and more than 4k/3 (else it would be closer).
        return if lo == 0 {
            Rung::Recentre(0)
        } else {
            Rung::Refine(lo - 1)
        };
    }
    Rung::Take(lo)
}

/// Whether a reuse step that selected `count` entries out of `all` non-zeros is outside the
/// ladder's band [2k/3, 4k/3] where the band was reachable: more than 4k/3, or fewer than 2k/3
/// while more non-zeros were there to take. [`Adjust::Ladder`] then re-evaluates exactly
/// (the exact top-k and its k-th magnitude), locally ([`OkTopk`]) and globally (the Ok-Topk
/// collective's `th_adjust`), so the count stays in the band whatever the gradients do.
pub fn outside_band(count: u64, all: u64, k: u64) -> bool {
    3 * count > 4 * k || (3 * count < 2 * k && all > count)
}

/// Reusable buffers of the one-pass local selection, kept across steps (no gradient-sized
/// allocation per step): one part per [`threshold::CHUNK`] of the accumulator (one part below
/// two chunks) holding the candidates `|acc| > rungs[0]` of that chunk, ascending, with their
/// values and the histogram of their rung positions.
#[derive(Clone, Debug, Default)]
pub struct Scratch {
    parts: Vec<Part>,
    /// The rungs of the last scan or recount, padded ([`rung_table`]).
    table: Vec<f32>,
    /// The last scan kept the entries with |x| above this.
    floor: f32,
}

#[derive(Clone, Debug, Default)]
struct Part {
    idx: Vec<u32>,
    val: Vec<f32>,
    /// `hist[p]` = candidates with exactly p rungs strictly below their |value|.
    hist: Vec<u64>,
}

/// Rung tables are padded to this length with +inf (at most `RUNG_TABLE - 1` rungs).
const RUNG_TABLE: usize = 64;

/// `rungs` (non-decreasing, fewer than [`RUNG_TABLE`]) padded with +inf.
fn rung_table(rungs: &[f32]) -> [f32; RUNG_TABLE] {
    assert!(
        !rungs.is_empty() && rungs.len() < RUNG_TABLE,
        "1 to 63 rungs"
    );
    let mut t = [f32::INFINITY; RUNG_TABLE];
    t[..rungs.len()].copy_from_slice(rungs);
    t
}

/// `hist[p]` += 1 for every value, p = #{j : |v| > table[j]} (a branch-free binary search:
/// the predicate is true on a prefix of the non-decreasing table, never on the +inf padding).
fn histogram(val: &[f32], table: &[f32; RUNG_TABLE], hist: &mut Vec<u64>) {
    hist.clear();
    hist.resize(RUNG_TABLE, 0);
    for v in val {
        let m = v.abs();
        let mut pos = 0usize;
        for step in [32, 16, 8, 4, 2, 1] {
            pos += usize::from(m > table[pos + step - 1]) * step;
        }
        hist[pos] += 1;
    }
}

impl Scratch {
    /// One streaming pass over `x` (Ok-Topk §3.1.3's reuse step, `|acc| > th`, for a list of
    /// candidate thresholds at once): keeps the entries with `|x| > rungs[0]` as candidates
    /// and returns `counts[i] = #{j : |x_j| > rungs[i]}` for every rung (non-decreasing, at
    /// most 63), counted on the candidates while they are in cache.
    pub fn scan(&mut self, x: &[f32], rungs: &[f32]) -> Vec<u64> {
        self.scan_above(x, rungs, 0)
    }

    /// As [`Scratch::scan`], keeping only the entries above rung `lo`: `counts[i]` is exact
    /// for i ≥ lo, and for i < lo it is `counts[lo]` (a lower bound).
    pub fn scan_above(&mut self, x: &[f32], rungs: &[f32], lo: usize) -> Vec<u64> {
        let table = rung_table(rungs);
        self.table.clear();
        self.table.extend_from_slice(&table);
        self.floor = rungs[lo];
        let p = threshold::AbsGt(rungs[lo]);
        let fill = |base: usize, c: &[f32], part: &mut Part| {
            part.idx.clear();
            part.val.clear();
            threshold::scan_into::<_, true>(c, base as u32, &p, &mut part.idx, &mut part.val);
            histogram(&part.val, &table, &mut part.hist);
        };
        if x.len() < 2 * threshold::CHUNK {
            self.parts.resize_with(1, Part::default);
            fill(0, x, &mut self.parts[0]);
        } else {
            self.parts
                .resize_with(x.len().div_ceil(threshold::CHUNK), Part::default);
            self.parts
                .par_iter_mut()
                .zip(x.par_chunks(threshold::CHUNK))
                .enumerate()
                .for_each(|(ci, (part, c))| fill(ci * threshold::CHUNK, c, part));
        }
        self.counts(rungs.len())
    }

    /// As [`Scratch::scan`] for new rungs, from the candidates only (no pass over x): exact for
    /// the rungs at or above [`Scratch::floor`], lower bounds below it.
    pub fn recount(&mut self, rungs: &[f32]) -> Vec<u64> {
        let table = rung_table(rungs);
        self.table.clear();
        self.table.extend_from_slice(&table);
        self.parts
            .par_iter_mut()
            .for_each(|part| histogram(&part.val, &table, &mut part.hist));
        self.counts(rungs.len())
    }

    /// The magnitude above which the last scan kept the entries.
    pub fn floor(&self) -> f32 {
        self.floor
    }

    /// `counts[i]` = candidates with more than i rungs below them.
    fn counts(&self, rungs: usize) -> Vec<u64> {
        let mut hist = [0u64; RUNG_TABLE];
        for part in &self.parts {
            for (h, c) in hist.iter_mut().zip(&part.hist) {
                *h += c;
            }
        }
        let mut counts = vec![0u64; rungs];
        let mut above = 0;
        for i in (0..rungs).rev() {
            above += hist[i + 1];
            counts[i] = above;
        }
        counts
    }

    /// The entries above rung `rung` of the last scan or recount (`|x| > rungs[rung]`),
    /// ascending, with their values, from the candidates: each part writes its own slice of
    /// the output, sized by its histogram.
    ///
    /// # Panics
    /// Before any scan.
    pub fn take(&self, rung: usize) -> (Vec<u32>, Vec<f32>) {
        let th = self.table[rung];
        let sizes: Vec<usize> = self
            .parts
            .iter()
            .map(|p| p.hist[rung + 1..].iter().sum::<u64>() as usize)
            .collect();
        let total = sizes.iter().sum();
        let (mut idx, mut val) = (vec![0u32; total], vec![0f32; total]);
        let (mut ri, mut rv) = (&mut idx[..], &mut val[..]);
        let mut slices = Vec::with_capacity(sizes.len());
        for &s in &sizes {
            let (a, b) = std::mem::take(&mut ri).split_at_mut(s);
            let (c, d) = std::mem::take(&mut rv).split_at_mut(s);
            slices.push((a, c));
            (ri, rv) = (b, d);
        }
        self.parts
            .par_iter()
            .zip(slices)
            .for_each(|(part, (oi, ov))| {
                let mut w = 0;
                for (&i, &v) in part.idx.iter().zip(&part.val) {
                    if v.abs() > th {
                        oi[w] = i;
                        ov[w] = v;
                        w += 1;
                    }
                }
                assert_eq!(w, oi.len(), "histogram and filter agree");
            });
        (idx, val)
    }
}

/// What [`ladder_local`] selected.
#[derive(Clone, Debug, PartialEq)]
pub struct LadderPick {
    pub indices: Vec<u32>,
    pub values: Vec<f32>,
    /// The rung taken.
    pub threshold: f32,
    /// Ladder rounds run (0 when th ≤ 0 or not finite was kept).
    pub rounds: u32,
    /// Passes over `acc` after the first: a re-centring on the bottom rung rescans, and the
    /// count of non-zeros it needs is a pass of its own.
    pub rescans: u32,
}

/// A count no rule accepts (> 4k/3 for every k), for rungs known to let more than 4k/3 through.
const EXCLUDED: u64 = u64::MAX / 4;

/// The highest rung that lets more than 4k/3 entries through by a strided sample's estimate
/// ([`topk::estimate_lower_key`] of the ⌊4k/3⌋+1-th largest, lowered by its safety margin);
/// 0 for small inputs or when the sample says nearly everything passes.
fn ladder_floor(acc: &[f32], rungs: &[f32], k: usize) -> usize {
    let need = (4 * k / 3 + 1).min(acc.len());
    if acc.len() < topk::SMALL || need == 0 {
        return 0;
    }
    match topk::estimate_lower_key(acc, need) {
        Some(key) => {
            let v = f32::from_bits(key);
            rungs.iter().filter(|&&r| r < v).count().saturating_sub(1)
        }
        None => 0,
    }
}

/// The ladder applied to one rank's accumulator (no message): returns `{|acc| > th'}` with
/// values, the threshold th' picked by [`pick_rung`] from this rank's own counts, the rounds
/// run and the extra passes. One streaming pass ([`Scratch::scan_above`]) collects the entries
/// above a floor rung and counts every rung above it. The floor is the highest rung that a
/// strided sample says lets more than 4k/3 through; when its exact count confirms that, the
/// rungs below it cannot be picked (the rule only takes rungs with ≤ 4k/3) and are left out;
/// otherwise the pass is repeated from the bottom rung (a rescan). A round re-centred upwards
/// recounts the candidates ([`Scratch::recount`]); only a re-centring on the bottom rung (the
/// counts fell below 2k/3 at half the threshold) reads `acc` again. A threshold ≤ 0 (or not
/// finite) is kept as it is.
pub fn ladder_local(acc: &[f32], th: f32, k: usize, scratch: &mut Scratch) -> LadderPick {
    if th <= 0.0 || !th.is_finite() {
        scratch.scan(acc, &[th]);
        let (indices, values) = scratch.take(0);
        return LadderPick {
            indices,
            values,
            threshold: th,
            rounds: 0,
            rescans: 0,
        };
    }
    let mut rescans = 0;
    let mut rungs = th_ladder(th);
    let lo = ladder_floor(acc, &rungs, k);
    let mut counts = scratch.scan_above(acc, &rungs, lo);
    if lo > 0 && 3 * counts[lo] <= 4 * k as u64 {
        rescans += 1;
        counts = scratch.scan(acc, &rungs);
    }
    for round in 1..=TH_ADJUST_ROUNDS {
        let last = round == TH_ADJUST_ROUNDS;
        // Below the floor (which lets more than 4k/3 through) the counts are lower bounds.
        for (c, &r) in counts.iter_mut().zip(&rungs) {
            if r < scratch.floor() {
                *c = EXCLUDED;
            }
        }
        // The number of non-zeros only matters for a bottom-rung pick: counted then only.
        let mut rung = pick_rung(&counts, u64::MAX, k as u64, last);
        if rung == Rung::Recentre(0) {
            let all = threshold::count_above(acc, 0.0) as u64;
            rescans += 1;
            rung = pick_rung(&counts, all, k as u64, last);
        }
        match rung {
            Rung::Take(i) => {
                let (indices, values) = scratch.take(i);
                return LadderPick {
                    indices,
                    values,
                    threshold: rungs[i],
                    rounds: round,
                    rescans,
                };
            }
            Rung::Recentre(0) => {
                rungs = next_ladder(&rungs, rung);
                rescans += 1;
                counts = scratch.scan(acc, &rungs);
            }
            Rung::Recentre(_) | Rung::Refine(_) => {
                rungs = next_ladder(&rungs, rung);
                counts = scratch.recount(&rungs);
            }
        }
    }
    unreachable!("the last round takes a rung")
}

/// The reference code's pre-selection loop (×`pre_factor` while more than `pre_upper·k` pass,
/// at most `pre_loops` times) from one pass: the thresholds th·f, th·f², … it would try are
/// counted at once. Returns the selection and the threshold the loop stops at.
fn reference_local(
    acc: &[f32],
    th: f32,
    k: usize,
    b: &Bands,
    scratch: &mut Scratch,
) -> (Vec<u32>, Vec<f32>, f32) {
    let over = |c: u64| (c as f64) > b.pre_upper * k as f64;
    if th >= 0.0 && b.pre_factor >= 1.0 && (b.pre_loops as usize) < RUNG_TABLE - 1 {
        let mut rungs = vec![th];
        for _ in 0..b.pre_loops {
            rungs.push(rungs[rungs.len() - 1] * b.pre_factor);
        }
        let counts = scratch.scan(acc, &rungs);
        let stop = (0..rungs.len())
            .find(|&j| !over(counts[j]))
            .unwrap_or(rungs.len() - 1);
        let (i, v) = scratch.take(stop);
        return (i, v, rungs[stop]);
    }
    // Bands outside the presets' range (a factor below 1, many loops): the loop as written.
    let mut th = th;
    scratch.scan(acc, &[th]);
    let (mut i, mut v) = scratch.take(0);
    let mut loops = 0;
    while over(i.len() as u64) && loops < b.pre_loops {
        th *= b.pre_factor;
        threshold::refine_values(&mut i, &mut v, th);
        loops += 1;
    }
    (i, v, th)
}

/// `{|acc| > th'}` on the device, downloaded, for th' as the policy adjusts the reused th:
/// `paper` th itself; `reference` the pre-selection loop ([`reference_local`]); `ladder`
/// [`ladder_local`]'s rule on exact counts.
fn reuse_resident(
    dev: &dyn DeviceKernels,
    acc: &DVec,
    th: f32,
    k: usize,
    adjust: Adjust,
) -> (Sparse, f32) {
    let take = |t: f32| {
        let (i, v) = dev.select_above(acc, t);
        (resident::download_sparse(dev, &i, &v, 0), t)
    };
    let counts =
        |rungs: &[f32]| -> Vec<u64> { rungs.iter().map(|&r| dev.count_above(acc, r)).collect() };
    match adjust {
        Adjust::Paper => take(th),
        Adjust::Reference(b) => {
            let over = |c: u64| (c as f64) > b.pre_upper * k as f64;
            if th >= 0.0 && b.pre_factor >= 1.0 && (b.pre_loops as usize) < RUNG_TABLE - 1 {
                let mut rungs = vec![th];
                for _ in 0..b.pre_loops {
                    rungs.push(rungs[rungs.len() - 1] * b.pre_factor);
                }
                let c = counts(&rungs);
                let stop = (0..rungs.len())
                    .find(|&j| !over(c[j]))
                    .unwrap_or(rungs.len() - 1);
                return take(rungs[stop]);
            }
            let (mut s, mut th) = take(th);
            let mut loops = 0;
            while over(s.indices.len() as u64) && loops < b.pre_loops {
                th *= b.pre_factor;
                threshold::refine_values(&mut s.indices, &mut s.values, th);
                loops += 1;
            }
            (s, th)
        }
        Adjust::Ladder => {
            if th <= 0.0 || !th.is_finite() {
                return take(th);
            }
            let mut rungs = th_ladder(th);
            let mut c = counts(&rungs);
            for round in 1..=TH_ADJUST_ROUNDS {
                let last = round == TH_ADJUST_ROUNDS;
                let mut rung = pick_rung(&c, u64::MAX, k as u64, last);
                if rung == Rung::Recentre(0) {
                    rung = pick_rung(&c, dev.count_above(acc, 0.0), k as u64, last);
                }
                match rung {
                    Rung::Take(i) => return take(rungs[i]),
                    Rung::Recentre(_) | Rung::Refine(_) => {
                        rungs = next_ladder(&rungs, rung);
                        c = counts(&rungs);
                    }
                }
            }
            unreachable!("the last round takes a rung")
        }
    }
}

/// Ok-Topk's local threshold state of one rank (one per layer with `--scope layer`).
#[derive(Clone, Debug)]
pub struct OkTopk {
    /// τ': re-evaluate every this many calls (1 = exact top-k every step).
    pub reeval: u32,
    pub adjust: Adjust,
    calls: u64,
    th: Option<f32>,
    scratch: Scratch,
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
    /// True when this was a reuse step whose adjusted threshold still selected outside the
    /// ladder's band ([`outside_band`]), so it re-evaluated exactly instead (`reevaluated` is
    /// true too). Only [`Adjust::Ladder`] falls back.
    pub fell_back: bool,
    /// Passes over `acc` after the first on a reuse step ([`LadderPick::rescans`]; 0 for the
    /// other policies and on re-evaluation steps): 0 in the common case.
    pub rescans: u32,
}

impl OkTopk {
    pub fn new(reeval: u32, adjust: Adjust) -> Self {
        OkTopk {
            reeval: reeval.max(1),
            adjust,
            calls: 0,
            th: None,
            scratch: Scratch::default(),
        }
    }

    /// What the selection keeps across calls: the calls made and the reused threshold (for a
    /// checkpoint; [`OkTopk::restore`] puts it back).
    pub fn progress(&self) -> (u64, Option<f32>) {
        (self.calls, self.th)
    }

    /// Restores [`OkTopk::progress`].
    pub fn restore(&mut self, calls: u64, th: Option<f32>) {
        self.calls = calls;
        self.th = th;
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

    /// Whether the next [`OkTopk::select_values`] call re-evaluates (every τ' calls).
    pub fn reevaluates_next(&self) -> bool {
        self.calls.is_multiple_of(self.reeval as u64)
    }

    /// One selection with the re-evaluation decided by the caller (the collective's call
    /// counter); a call without a threshold yet re-evaluates.
    pub fn select_values_at(&mut self, reeval: bool, acc: &[f32], k: usize) -> (OkStep, Vec<f32>) {
        let k = k.min(acc.len());
        self.calls += 1;
        let reeval = reeval || self.th.is_none() || k == 0;
        let exact = |me: &mut Self| {
            let (indices, values, th) = topk::topk_with_values(acc, k);
            me.reevaluated(indices, values, th, k, || threshold::count_above(acc, 0.0))
        };
        let (step, values) = if reeval {
            exact(self)
        } else {
            let (step, values) = self.reuse(acc, k);
            if self.ladder_missed(&step, k, || threshold::count_above(acc, 0.0) as u64) {
                let (st, v) = exact(self);
                (
                    OkStep {
                        fell_back: true,
                        ..st
                    },
                    v,
                )
            } else {
                (step, values)
            }
        };
        self.after(&step, k);
        (step, values)
    }

    /// A re-evaluation step's selection from the exact top-k and its k-th largest |acc|.
    fn reevaluated(
        &mut self,
        mut indices: Vec<u32>,
        mut values: Vec<f32>,
        mut th: Option<f32>,
        k: usize,
        nonzeros: impl FnOnce() -> usize,
    ) -> (OkStep, Vec<f32>) {
        // At most k non-zeros (e.g. density 1): all of them, and th = 0 lets every
        // non-zero through on the reuse steps (one counting pass, every τ' steps only).
        if th == Some(0.0) || (th.is_some() && nonzeros() <= k) {
            threshold::refine_values(&mut indices, &mut values, 0.0);
            th = Some(0.0);
        }
        self.th = th;
        let step = OkStep {
            indices,
            threshold: th,
            reevaluated: true,
            fell_back: false,
            rescans: 0,
        };
        (step, values)
    }

    /// Whether a ladder reuse step selected outside its band where the band was reachable
    /// ([`outside_band`]; the non-zeros are counted only when too few passed).
    fn ladder_missed(&self, step: &OkStep, k: usize, all: impl FnOnce() -> u64) -> bool {
        let (n, k) = (step.indices.len() as u64, k as u64);
        self.adjust == Adjust::Ladder
            && (3 * n > 4 * k || (3 * n < 2 * k && outside_band(n, all(), k)))
    }

    /// The threshold the next call reuses (the reference policy's nudge from this count).
    fn after(&mut self, step: &OkStep, k: usize) {
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
    }

    /// [`OkTopk::select_values_at`] on an accumulator resident on `dev` (docs/GPU.md §7):
    /// the same decisions from the device's exact counts, the selection downloaded. The
    /// ladder's counts are exact here where the host's one-pass scan keeps lower bounds
    /// below its floor; the rule takes only rungs letting at most 4k/3 through, which both
    /// exclude, so the rung picked is the same. `rescans` is 0 (no streaming pass).
    pub fn select_values_resident(
        &mut self,
        dev: &dyn DeviceKernels,
        reeval: bool,
        acc: &DVec,
        k: usize,
    ) -> (OkStep, Vec<f32>) {
        let k = k.min(acc.len());
        self.calls += 1;
        let reeval = reeval || self.th.is_none() || k == 0;
        let (step, values) = if reeval {
            let (i, v, th) = dev.topk(acc, 0..acc.len(), k);
            let s = resident::download_sparse(dev, &i, &v, 0);
            self.reevaluated(s.indices, s.values, th, k, || {
                dev.count_above(acc, 0.0) as usize
            })
        } else {
            let th = self.th.expect("threshold set");
            let (s, th) = reuse_resident(dev, acc, th, k, self.adjust);
            let step = OkStep {
                indices: s.indices,
                threshold: Some(th),
                reevaluated: false,
                fell_back: false,
                rescans: 0,
            };
            let count_all = || dev.count_above(acc, 0.0);
            if self.ladder_missed(&step, k, count_all) {
                let (i, v, th) = dev.topk(acc, 0..acc.len(), k);
                let s = resident::download_sparse(dev, &i, &v, 0);
                let nonzeros = || dev.count_above(acc, 0.0) as usize;
                let (st, v) = self.reevaluated(s.indices, s.values, th, k, nonzeros);
                (
                    OkStep {
                        fell_back: true,
                        ..st
                    },
                    v,
                )
            } else {
                (step, s.values)
            }
        };
        self.after(&step, k);
        (step, values)
    }

    /// A reuse step (Alg. 1 line 3): `{|acc| > th}` for the reused threshold as the policy
    /// adjusts it, from one streaming pass over `acc` in the common case.
    fn reuse(&mut self, acc: &[f32], k: usize) -> (OkStep, Vec<f32>) {
        let th = self.th.expect("threshold set");
        let scratch = &mut self.scratch;
        let (indices, values, th, rescans) = match self.adjust {
            Adjust::Paper => {
                scratch.scan(acc, &[th]);
                let (i, v) = scratch.take(0);
                (i, v, th, 0)
            }
            Adjust::Reference(b) => {
                let (i, v, th) = reference_local(acc, th, k, &b, scratch);
                (i, v, th, 0)
            }
            Adjust::Ladder => {
                let p = ladder_local(acc, th, k, scratch);
                (p.indices, p.values, p.threshold, p.rescans)
            }
        };
        let step = OkStep {
            indices,
            threshold: Some(th),
            reevaluated: false,
            fell_back: false,
            rescans,
        };
        (step, values)
    }
}
