//! The memory budget: every size that comes from an input file or a flag and drives an
//! allocation (a layer's `numel`, a benchmark size, a model width, a label or token id) is
//! checked here before anything is allocated, so a tiny input can never ask for terabytes
//! and abort the process.
//!
//! The limit is `--max-memory SIZE` (tools that allocate from sizes take it), else the
//! environment variable `GRADKIT_MAX_MEMORY`, else the machine's physical memory
//! (`MemTotal` in /proc/meminfo; 16 GiB where that cannot be read). Sizes are products of
//! untrusted numbers: compute them with [`product`] (u128, saturating), never with `*` on
//! `usize`.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Result};

/// The environment variable that sets the limit when `--max-memory` is not given.
pub const ENV: &str = "GRADKIT_MAX_MEMORY";

/// The limit when neither the flag, the environment nor /proc/meminfo gives one.
pub const FALLBACK: u64 = 16 << 30;

/// `--max-memory` as set by the tool (0 = not given).
static FLAG: AtomicU64 = AtomicU64::new(0);

/// The `--max-memory` flag, for tools to `#[command(flatten)]`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct MemoryArgs {
    /// Most memory a run may plan to use (e.g. 512M, 8G, 1T); default: $GRADKIT_MAX_MEMORY,
    /// else the machine's physical memory. Sizes from the input or flags that would need more
    /// stop with an error before anything is allocated
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    pub max_memory: Option<u64>,
}

impl MemoryArgs {
    /// Makes the flag the process's limit (call once, before any check).
    pub fn apply(&self) {
        set_limit(self.max_memory);
    }
}

/// Sets (or with `None`, clears) the `--max-memory` limit of this process.
pub fn set_limit(bytes: Option<u64>) {
    FLAG.store(bytes.unwrap_or(0), Ordering::Relaxed);
}

/// The limit in bytes and where it came from (for the message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    pub bytes: u64,
    pub source: String,
}

/// The limit in force: `--max-memory`, else `GRADKIT_MAX_MEMORY`, else physical memory.
pub fn limit() -> Result<Limit> {
    let flag = FLAG.load(Ordering::Relaxed);
    if flag > 0 {
        return Ok(Limit {
            bytes: flag,
            source: "--max-memory".into(),
        });
    }
    if let Some(bytes) = env_limit()? {
        return Ok(Limit {
            bytes,
            source: ENV.into(),
        });
    }
    Ok(match physical_memory() {
        Some(b) => Limit {
            bytes: b,
            source: "the machine's physical memory".into(),
        },
        None => Limit {
            bytes: FALLBACK,
            source: "the default; /proc/meminfo was not readable".into(),
        },
    })
}

/// `GRADKIT_MAX_MEMORY` in bytes when it is set; an error naming it for anything but a size
/// above 0 (every tool checks it at its start, [`crate::env::check`]).
pub fn env_limit() -> Result<Option<u64>> {
    let Some(v) = std::env::var_os(ENV) else {
        return Ok(None);
    };
    let s = v.to_string_lossy();
    match parse_size(&s) {
        Ok(b) if b > 0 => Ok(Some(b)),
        Ok(_) => {
            bail!("{ENV}={s}: the memory limit must be more than 0 (environment variable {ENV})")
        }
        Err(e) => bail!("{ENV}={s}: {e} (environment variable {ENV})"),
    }
}

/// `MemTotal` of /proc/meminfo, in bytes.
pub fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Stops with one clear message when `bytes` (what `what` would allocate) exceeds the limit.
/// `what` names the thing and the flag or column it comes from, e.g.
/// "dense buffers for the trace's layers (column `numel`)".
pub fn check(what: &str, bytes: u128) -> Result<()> {
    let lim = limit()?;
    if bytes > lim.bytes as u128 {
        bail!(
            "{what} would need {} of memory, more than the limit of {} ({}); if that is intended, raise the limit with --max-memory SIZE or {ENV}=SIZE",
            human(bytes),
            human(lim.bytes as u128),
            lim.source
        );
    }
    Ok(())
}

/// The product of `factors` in u128, saturating at `u128::MAX` (which no limit admits).
pub fn product(factors: &[u128]) -> u128 {
    factors
        .iter()
        .try_fold(1u128, |acc, f| acc.checked_mul(*f))
        .unwrap_or(u128::MAX)
}

/// `2.0 TiB (2199023255552 bytes)`; "more than 2^128 bytes" when saturated.
pub fn human(bytes: u128) -> String {
    if bytes == u128::MAX {
        return "more than 2^128 bytes".into();
    }
    const UNITS: [&str; 7] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut v = bytes as f64;
    let mut unit = "bytes";
    for u in UNITS {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit} ({bytes} bytes)")
}

/// Parses sizes like `4096`, `64K`, `16M`, `1.5G`, `2T` (powers of 1024; an optional
/// trailing `B` or `iB` is accepted). Integers are exact up to `u64::MAX`; anything larger,
/// negative or not a number is an error, never a wrapped or saturated value.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let bad = || anyhow::anyhow!("`{s}` is not a size (e.g. 4096, 64K, 16M, 8G, 1T)");
    // `64K`, `64KB`, `64KiB` and `64Ki` are all 64 × 1024 bytes: byte sizes are binary, as
    // nccl-tests' `-b 8 -e 128M` and memory limits are (counts are SI: [`parse_count`]).
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .or_else(|| t.strip_suffix('i'))
        .unwrap_or(t);
    let (num, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        Some('T' | 't') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let num = num.trim();
    if num.is_empty() || num.starts_with(['-', '+']) {
        return Err(bad());
    }
    let mult = 1u64 << shift;
    if let Ok(v) = num.parse::<u64>() {
        return v
            .checked_mul(mult)
            .ok_or_else(|| anyhow::anyhow!("`{s}` is more than 2^64 − 1 bytes"));
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let bytes = v * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 {
        return Err(bad());
    }
    if bytes >= 18_446_744_073_709_551_616.0 {
        bail!("`{s}` is more than 2^64 − 1 bytes");
    }
    Ok(bytes.round() as u64)
}

/// Parses element counts with SI's decimal multiples, as model sizes are quoted (`110M` is
/// BERT-base's 110,000,000): `K`, `M`, `G`, `T` are 10^3 … 10^12, and the binary `Ki`, `Mi`,
/// `Gi`, `Ti` are 2^10 … 2^40 (`16Mi` = 2^24). Fractions are rounded (`1.5M`); a count that is
/// not a number, negative or above 2^64 − 1 is an error.
pub fn parse_count(s: &str) -> Result<u64> {
    let t = s.trim();
    let bad =
        || anyhow::anyhow!("`{s}` is not a count (e.g. 4096, 110M = 110,000,000, 16Mi = 2^24)");
    let units: [(&str, f64); 8] = [
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("K", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    let (num, mult) = units
        .iter()
        .find_map(|(u, m)| t.strip_suffix(u).map(|n| (n, *m)))
        .unwrap_or((t, 1.0));
    let num = num.trim();
    if num.is_empty() || num.starts_with(['-', '+']) {
        return Err(bad());
    }
    if let (Ok(v), true) = (num.parse::<u64>(), mult.fract() == 0.0) {
        return v
            .checked_mul(mult as u64)
            .ok_or_else(|| anyhow::anyhow!("`{s}` is more than 2^64 − 1"));
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let n = v * mult;
    if !n.is_finite() || n < 0.0 {
        return Err(bad());
    }
    if n >= 18_446_744_073_709_551_616.0 {
        bail!("`{s}` is more than 2^64 − 1");
    }
    Ok(n.round() as u64)
}

/// [`parse_size`] for clap's `value_parser` (a bad value is a usage error, exit 2).
pub fn parse_size_arg(s: &str) -> std::result::Result<u64, String> {
    match parse_size(s) {
        Ok(0) => Err("must be more than 0".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte sizes are binary with or without the `i`: `64K` = `64Ki` = `64KiB` = 65,536.
    #[test]
    fn sizes_are_binary_with_or_without_i() {
        for s in ["64K", "64Ki", "64KiB", "64KB", "65536"] {
            assert_eq!(parse_size(s).unwrap(), 65_536, "{s}");
        }
        assert_eq!(parse_size("16Mi").unwrap(), 1 << 24);
        assert!(parse_size("64Kx").is_err());
    }

    /// Counts are decimal unless binary is said (`Mi`), as model sizes are quoted.
    #[test]
    fn counts_are_si_decimal_and_binary_with_i() {
        assert_eq!(parse_count("110M").unwrap(), 110_000_000);
        assert_eq!(parse_count("16Mi").unwrap(), 1 << 24);
        assert_eq!(parse_count("1.5K").unwrap(), 1500);
        assert_eq!(parse_count("2Gi").unwrap(), 2 << 30);
        assert_eq!(parse_count("340M").unwrap(), 340_000_000);
        assert_eq!(parse_count("4096").unwrap(), 4096);
        assert_eq!(parse_count("3T").unwrap(), 3_000_000_000_000);
        for bad in ["", "M", "-1M", "x", "1Q", "1e400"] {
            assert!(parse_count(bad).is_err(), "{bad}");
        }
        assert!(parse_count("20000000T").is_err());
    }

    #[test]
    fn sizes_parse_exactly_or_fail() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 65_536);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("2TiB").unwrap(), 2 << 40);
        assert_eq!(parse_size("512MB").unwrap(), 512 << 20);
        assert_eq!(
            parse_size("18446744073709551615").unwrap(),
            u64::MAX,
            "exact, not rounded through f64"
        );
        for bad in [
            "",
            "-1",
            "-1G",
            "x",
            "1Q",
            "nanG",
            "infG",
            "16777216T",
            "1e30",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn product_saturates() {
        assert_eq!(product(&[3, 4, 5]), 60);
        assert_eq!(product(&[u64::MAX as u128, u64::MAX as u128, 2]), u128::MAX);
    }

    #[test]
    fn human_names_unit_and_bytes() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(3 << 29), "1.5 GiB (1610612736 bytes)");
    }
}
