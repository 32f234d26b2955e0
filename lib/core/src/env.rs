//! The environment variables that change how a tool runs (`GRADKIT_COMM_TIMEOUT`,
//! `GRADKIT_MAX_MEMORY`, [`crate::budget`]), checked like flags: every tool
//! calls [`check`] once, right after its command line is parsed and before any work, so a
//! mistake in one is a usage error (exit 2) naming the variable and the values it accepts —
//! even in a tool, or a run, where the variable has no effect (`GRADKIT_COMM_TIMEOUT` on
//! in-process ranks): a variable set wrong in a job script is found by the first tool it
//! reaches, not by the one run under mpirun hours later.

use std::time::Duration;

use anyhow::{bail, Result};

/// The receive watchdog's limit (docs/RELIABILITY.md).
pub const COMM_TIMEOUT: &str = "GRADKIT_COMM_TIMEOUT";
/// The watchdog's limit when [`COMM_TIMEOUT`] is not set, in seconds.
pub const DEFAULT_COMM_TIMEOUT_S: u64 = 1800;
/// The largest [`COMM_TIMEOUT`] accepted, in seconds (about 31 years): well past any job,
/// far from where a `Duration` or the watchdog's arithmetic could overflow.
pub const MAX_COMM_TIMEOUT_S: f64 = 1e9;

/// `GRADKIT_COMM_TIMEOUT`: how long a rank may wait for a message before the job is ended;
/// `None` waits forever (`0`). Unset: [`DEFAULT_COMM_TIMEOUT_S`]. An error for anything but
/// a number of seconds from 0 to [`MAX_COMM_TIMEOUT_S`].
pub fn comm_timeout() -> Result<Option<Duration>> {
    let Some(v) = std::env::var_os(COMM_TIMEOUT) else {
        return Ok(Some(Duration::from_secs(DEFAULT_COMM_TIMEOUT_S)));
    };
    let s = v.to_string_lossy();
    let secs = s.trim().parse::<f64>().ok();
    match secs {
        Some(0.0) => Ok(None),
        Some(x) if x > 0.0 && x <= MAX_COMM_TIMEOUT_S => Ok(Some(Duration::from_secs_f64(x))),
        _ => bail!(
            "{COMM_TIMEOUT}={s}: must be a number of seconds from 0 to {MAX_COMM_TIMEOUT_S:e} (0: wait forever; unset: {DEFAULT_COMM_TIMEOUT_S}) (environment variable {COMM_TIMEOUT})"
        ),
    }
}

/// Checks every variable of this module; the first mistake, as one line.
pub fn check() -> Result<()> {
    comm_timeout()?;
    crate::budget::env_limit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parse of one value, as [`comm_timeout`] makes it (the environment is the
    /// process's, shared by the tests: one test sets and reads it).
    #[test]
    fn comm_timeout_accepts_seconds_and_refuses_the_rest() {
        let at = |v: Option<&str>| {
            match v {
                Some(v) => std::env::set_var(COMM_TIMEOUT, v),
                None => std::env::remove_var(COMM_TIMEOUT),
            }
            comm_timeout()
        };
        assert_eq!(at(None).unwrap(), Some(Duration::from_secs(1800)));
        assert_eq!(at(Some("0")).unwrap(), None);
        assert_eq!(at(Some(" 5 ")).unwrap(), Some(Duration::from_secs(5)));
        assert_eq!(at(Some("0.5")).unwrap(), Some(Duration::from_millis(500)));
        assert_eq!(
            at(Some("1e9")).unwrap(),
            Some(Duration::from_secs(1_000_000_000))
        );
        for bad in [
            "abc",
            "30s",
            "-1",
            "-0.5",
            "NaN",
            "inf",
            "",
            "1e10",
            "99999999999999999999",
        ] {
            let e = at(Some(bad)).expect_err(bad).to_string();
            assert!(e.contains("GRADKIT_COMM_TIMEOUT"), "{bad}: {e}");
            assert!(e.contains("number of seconds from 0"), "{bad}: {e}");
        }
        std::env::remove_var(COMM_TIMEOUT);
    }
}
