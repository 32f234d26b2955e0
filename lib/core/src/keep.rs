//! What a selection keeps of n entries: a fraction (`--density D`) or an exact count
//! (`--k K`), with `--density`'s range check and the one rule that turns either into k.
//! Every tool and library that selects takes its k from here: gradselect, gradpartition,
//! gradallreduce (`Params::k_for`, `model`), gradtrain's exchanges (through
//! `gradkit_sparsify::k_for`).

use std::fmt;

/// What a run keeps of each gradient: a density or an exact k.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Keep {
    /// A fraction in (0, 1]: k = floor(D·n), at least 1 (0 only for n = 0).
    Density(f64),
    /// An exact count, clamped to n.
    K(u64),
}

/// `--density` when neither it nor `--k` is given: every tool's default.
pub const DEFAULT_DENSITY: f64 = 0.01;

/// Whether `d` is a density `--density` takes: in (0, 1] (NaN is not).
pub fn density_in_range(d: f64) -> bool {
    d > 0.0 && d <= 1.0
}

/// Why a `--density` or `--k` was refused; its message names the flag (the tools that name the
/// flag again append ` (flag --density)`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KeepError {
    /// `--density` outside (0, 1].
    Density(f64),
    /// `--k 0`.
    ZeroK,
}

impl fmt::Display for KeepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeepError::Density(d) => write!(f, "--density must lie in (0, 1], got {d}"),
            KeepError::ZeroK => f.write_str("--k must be at least 1"),
        }
    }
}

impl std::error::Error for KeepError {}

impl Keep {
    /// `--density D`, checked: D in (0, 1].
    pub fn density(d: f64) -> Result<Keep, KeepError> {
        match density_in_range(d) {
            true => Ok(Keep::Density(d)),
            false => Err(KeepError::Density(d)),
        }
    }

    /// `--k K`, checked: K ≥ 1.
    pub fn count(k: u64) -> Result<Keep, KeepError> {
        match k {
            0 => Err(KeepError::ZeroK),
            k => Ok(Keep::K(k)),
        }
    }

    /// k for n entries: `K` clamped to n; else floor(D·n), at least 1 when n > 0 (the papers'
    /// rule, Ok-Topk's `int(n·density)`).
    pub fn k(self, n: u64) -> u64 {
        match self {
            Keep::K(k) => k.min(n),
            Keep::Density(d) => ((d * n as f64).floor() as u64).clamp(u64::from(n > 0), n),
        }
    }

    /// The density, where that is what is kept.
    pub fn density_of(self) -> Option<f64> {
        match self {
            Keep::Density(d) => Some(d),
            Keep::K(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn density_range_is_open_at_zero_and_closed_at_one() {
        for d in [1e-9, 0.01, 0.5, 1.0] {
            assert_eq!(Keep::density(d), Ok(Keep::Density(d)), "{d}");
        }
        for d in [0.0, -0.0, -0.5, 1.0 + 1e-12, 2.0, f64::NAN, f64::INFINITY] {
            assert!(Keep::density(d).is_err(), "{d}");
            assert!(!density_in_range(d), "{d}");
        }
        assert_eq!(
            Keep::density(1.5).unwrap_err().to_string(),
            "--density must lie in (0, 1], got 1.5"
        );
        assert_eq!(
            Keep::density(0.0).unwrap_err().to_string(),
            "--density must lie in (0, 1], got 0"
        );
    }

    #[test]
    fn k_must_be_at_least_one() {
        assert_eq!(Keep::count(1), Ok(Keep::K(1)));
        assert_eq!(
            Keep::count(0).unwrap_err().to_string(),
            "--k must be at least 1"
        );
    }

    #[test]
    fn k_rule_matches_hand_computed_values() {
        // floor(D·n), at least 1 when n > 0, never above n.
        let cases: [(f64, u64, u64); 9] = [
            (0.01, 1000, 10),
            (0.01, 1999, 19), // 19.99 floors to 19
            (0.25, 10, 2),    // 2.5 floors to 2
            (0.001, 10, 1),   // 0.01 floors to 0, raised to 1
            (1.0, 10, 10),
            (1.0, 1, 1),
            (0.5, 0, 0), // nothing to keep of nothing
            (0.3, 7, 2), // 2.1 floors to 2
            (0.5, 3, 1), // 1.5 floors to 1
        ];
        for (d, n, k) in cases {
            assert_eq!(Keep::Density(d).k(n), k, "density {d}, n {n}");
        }
        // An exact k is clamped to n.
        assert_eq!(Keep::K(5).k(100), 5);
        assert_eq!(Keep::K(500).k(100), 100);
        assert_eq!(Keep::K(3).k(0), 0);
    }

    #[test]
    fn density_of_is_the_density_only() {
        assert_eq!(Keep::Density(0.2).density_of(), Some(0.2));
        assert_eq!(Keep::K(4).density_of(), None);
    }
}
