//! Ok-Topk's local selection (Li & Hoefler, PPoPP'22, §3.1.3 and Algorithm 1 lines 2–3):
//! the exact k-th largest |acc| is computed every τ' steps (`th_re_evaluate`) and reused as a
//! threshold (`|acc| > th`) in the steps between.
//!
//! With [`Bands`], the reused threshold is adjusted as the authors' reference code does
//! (oktopk.md §1, anchors.md §4; not in the paper): on a reuse step, while more than
//! `pre_upper·k` entries pass, th is multiplied by `pre_factor` (at most `pre_loops` times);
//! after every selection, a count below `lower·k` divides th by `factor` and a count above
//! `upper·k` multiplies it by `factor`, for the next step.

use crate::{threshold, topk};

/// The reference code's count bands for the local threshold (oktopk.md §1 [artifact]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bands {
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
}

impl Bands {
    /// VGG-16's bands: pre-loop ×1.03 (≤5) above 4k/3; after selection [2k/3, 5k/4], 1.012.
    pub const VGG: Bands = Bands {
        pre_upper: 4.0 / 3.0,
        pre_factor: 1.03,
        pre_loops: 5,
        lower: 2.0 / 3.0,
        upper: 5.0 / 4.0,
        factor: 1.012,
    };
    /// LSTM's bands: as VGG with the lower band at 3k/4.
    pub const LSTM: Bands = Bands {
        lower: 3.0 / 4.0,
        ..Bands::VGG
    };
    /// BERT's bands: lower band 4k/5, factor 1.025.
    pub const BERT: Bands = Bands {
        lower: 4.0 / 5.0,
        factor: 1.025,
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
}

/// Ok-Topk's local threshold state of one rank (one per layer with `--scope layer`).
#[derive(Clone, Debug)]
pub struct OkTopk {
    /// τ': re-evaluate every this many calls (1 = exact top-k every step).
    pub reeval: u32,
    pub adjust: Option<Bands>,
    calls: u64,
    th: Option<f32>,
}

/// What one Ok-Topk selection did.
#[derive(Clone, Debug, PartialEq)]
pub struct OkStep {
    pub indices: Vec<u32>,
    /// The threshold of this step: the exact k-th largest |acc| on a re-evaluation step, the
    /// reused (possibly adjusted) threshold otherwise.
    pub threshold: Option<f32>,
    /// True on a re-evaluation step: the selection is the exact top-k (ties to the lower
    /// index); on other steps it is exactly `{i : |acc_i| > threshold}`.
    pub reevaluated: bool,
}

impl OkTopk {
    pub fn new(reeval: u32, adjust: Option<Bands>) -> Self {
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
        let k = k.min(acc.len());
        let reeval = self.calls.is_multiple_of(self.reeval as u64) || self.th.is_none();
        self.calls += 1;
        let (step, values) = if reeval || k == 0 {
            let (indices, values, th) = topk::topk_with_values(acc, k);
            self.th = th;
            (
                OkStep {
                    indices,
                    threshold: th,
                    reevaluated: true,
                },
                values,
            )
        } else {
            let mut th = self.th.expect("threshold set");
            let (mut indices, mut values) = threshold::above_with_values(acc, th);
            if let Some(b) = self.adjust {
                let mut loops = 0;
                while (indices.len() as f64) > b.pre_upper * k as f64 && loops < b.pre_loops {
                    th *= b.pre_factor;
                    threshold::refine_values(&mut indices, &mut values, th);
                    loops += 1;
                }
            }
            (
                OkStep {
                    indices,
                    threshold: Some(th),
                    reevaluated: false,
                },
                values,
            )
        };
        if let (Some(b), Some(th)) = (self.adjust, step.threshold) {
            let c = step.indices.len() as f64;
            let next = if c < b.lower * k as f64 {
                th / b.factor
            } else if c > b.upper * k as f64 {
                th * b.factor
            } else {
                th
            };
            self.th = Some(next);
        } else {
            self.th = step.threshold;
        }
        (step, values)
    }
}
