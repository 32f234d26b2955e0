//! Every selection method of the papers as `gradselect --method` names it, DEFT included: one
//! table ([`Selection`]) with each method's name, its `--help` text, the flags only it reads
//! and what it needs besides the accumulator. gradselect's value list, its help, its flag
//! checks and its run are derived from it; [`Method`] (what a [`crate::Selector`] runs) and
//! [`Configured`] (a method with its parameters, DEFT's included) name their method through it.

use crate::Method;

/// What a method needs besides the rank's error-compensated accumulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// k (from `--density` or `--k`), and nothing else.
    K,
    /// A threshold (`--threshold T`), and no k.
    Threshold,
    /// k and a plan (DEFT): the plan's ranges for each rank (`--plan`, or planned in-process
    /// from the step leader's accumulator, so every rank's accumulator of the step is held),
    /// and the norms of the rank's own accumulator over the plan's pieces, which divide k.
    PlanAndNorms,
}

/// A selection method: the values of `gradselect --method`, in the order `--help` lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Selection {
    Topk,
    Threshold,
    Oktopk,
    Gaussiank,
    Dgc,
    Randomk,
    Deft,
}

impl Selection {
    /// Every method, in the order `--help` lists them.
    pub const ALL: &'static [Selection] = &[
        Selection::Topk,
        Selection::Threshold,
        Selection::Oktopk,
        Selection::Gaussiank,
        Selection::Dgc,
        Selection::Randomk,
        Selection::Deft,
    ];

    /// The `--method` name (also the metrics' `algo` and the output's `method`).
    pub const fn name(self) -> &'static str {
        match self {
            Selection::Topk => "topk",
            Selection::Threshold => "threshold",
            Selection::Oktopk => "oktopk",
            Selection::Gaussiank => "gaussiank",
            Selection::Dgc => "dgc",
            Selection::Randomk => "randomk",
            Selection::Deft => "deft",
        }
    }

    /// What the method does, for `--help`: lines as printed, the tool indents them.
    pub const fn help(self) -> &'static str {
        match self {
            Selection::Topk => "exact k largest |acc|, ties to the lower index",
            Selection::Threshold => "every entry with |acc| > --threshold T",
            Selection::Oktopk => {
                "Ok-Topk (PPoPP'22 §3.1.3): exact k-th largest |acc| every --reeval steps (an exact
top-k step), reused as the threshold |acc| > th in the steps between, adjusted by
--adjust: ladder (default; the ×1.06 rung whose count is closest to k with at
most 4k/3 passing), paper (Algorithm 1: unchanged), reference (the authors' ×1.03
loop and count bands; vgg = reference, lstm, bert) (docs/gradselect.md)"
            }
            Selection::Gaussiank => {
                "threshold |mean| + z(1-density/2)·std of a Gaussian fit, halved until ≥ 3k/4 pass"
            }
            Selection::Dgc => {
                "DGC: threshold from a strided sample (--sample), ×0.8 while < 0.8k pass, exact
top-k among the passing entries when more than 1.3k pass"
            }
            Selection::Randomk => {
                "k uniform indices from (--seed, step, layer): the same on every rank"
            }
            Selection::Deft => {
                "DEFT (ICPP'23): each rank selects only in its own ranges of the plan (--plan from
`gradpartition --method deft`, or computed here with the same library code),
with its own per-range k from the norms of its own accumulator"
            }
        }
    }

    /// The flags only this method reads: given with another method they are refused, not
    /// ignored. (`--seed`, which only randomk reads, has always been accepted with every
    /// method, and still is.)
    pub const fn own_flags(self) -> &'static [&'static str] {
        match self {
            Selection::Threshold => &["--threshold"],
            Selection::Oktopk => &["--reeval", "--adjust"],
            Selection::Dgc => &["--sample"],
            Selection::Deft => &["--plan", "--topup"],
            Selection::Topk | Selection::Gaussiank | Selection::Randomk => &[],
        }
    }

    /// The method that owns `flag` (one of [`Selection::own_flags`]), if any.
    pub fn owner_of(flag: &str) -> Option<Selection> {
        Selection::ALL
            .iter()
            .copied()
            .find(|s| s.own_flags().contains(&flag))
    }

    /// What the method needs besides the accumulator.
    pub const fn needs(self) -> Needs {
        match self {
            Selection::Threshold => Needs::Threshold,
            Selection::Deft => Needs::PlanAndNorms,
            Selection::Topk
            | Selection::Oktopk
            | Selection::Gaussiank
            | Selection::Dgc
            | Selection::Randomk => Needs::K,
        }
    }
}

impl std::str::FromStr for Selection {
    type Err = String;

    /// The exact name; the error lists the known names.
    fn from_str(s: &str) -> Result<Self, String> {
        Selection::ALL
            .iter()
            .copied()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = Selection::ALL.iter().map(|m| m.name()).collect();
                format!("unknown method `{s}` (known: {})", known.join(", "))
            })
    }
}

impl std::fmt::Display for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A method with its parameters, DEFT's included: what a selection run matches on.
#[derive(Clone, Debug, PartialEq)]
pub enum Configured {
    /// Each rank's [`crate::Selector`] selects from its own accumulator, step by step.
    Local(Method),
    /// DEFT: each rank's top-k in the plan's ranges given to it, with per-range k from its own
    /// norms ([`crate::deft`]); `topup` hands leftover k to the highest-norm pieces (an
    /// in-process plan).
    Deft { topup: bool },
}

impl Configured {
    /// The method, as `--method` names it.
    pub fn selection(&self) -> Selection {
        match self {
            Configured::Local(m) => m.selection(),
            Configured::Deft { .. } => Selection::Deft,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_are_unique() {
        for s in Selection::ALL {
            assert_eq!(s.name().parse::<Selection>(), Ok(*s));
            assert_eq!(s.to_string(), s.name());
        }
        let mut names: Vec<&str> = Selection::ALL.iter().map(|s| s.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Selection::ALL.len());
        assert_eq!(
            "bogus".parse::<Selection>().unwrap_err(),
            "unknown method `bogus` (known: topk, threshold, oktopk, gaussiank, dgc, randomk, deft)"
        );
    }

    #[test]
    fn every_own_flag_has_one_owner() {
        for s in Selection::ALL {
            for f in s.own_flags() {
                assert_eq!(Selection::owner_of(f), Some(*s), "{f}");
            }
        }
        assert_eq!(Selection::owner_of("--seed"), None);
        assert_eq!(Selection::owner_of("--topup"), Some(Selection::Deft));
    }

    #[test]
    fn local_methods_name_their_selection() {
        let cases = [
            (Method::Topk, Selection::Topk),
            (Method::Threshold(1.0), Selection::Threshold),
            (
                Method::OkTopk {
                    reeval: 2,
                    adjust: crate::Adjust::Ladder,
                },
                Selection::Oktopk,
            ),
            (Method::GaussianK, Selection::Gaussiank),
            (Method::Dgc { sample: 0.1 }, Selection::Dgc),
            (Method::RandomK { seed: 3 }, Selection::Randomk),
        ];
        for (m, s) in cases {
            assert_eq!(m.selection(), s);
            assert_eq!(m.name(), s.name());
            assert_eq!(Configured::Local(m).selection(), s);
        }
        assert_eq!(
            Configured::Deft { topup: true }.selection(),
            Selection::Deft
        );
        // Only DEFT needs a plan; only threshold needs no k.
        let plan: Vec<_> = Selection::ALL
            .iter()
            .filter(|s| s.needs() == Needs::PlanAndNorms)
            .collect();
        assert_eq!(plan, [&Selection::Deft]);
        assert_eq!(Selection::Threshold.needs(), Needs::Threshold);
    }
}
