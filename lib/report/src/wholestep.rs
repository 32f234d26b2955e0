//! Whole training steps around a replayed exchange (issue 44 point 3; docs/SIMULATE.md §
//! Whole steps): `gradreport simulate --step-profile PROFILE.csv` puts the replayed exchange
//! beside a step's compute and beside the papers' baselines on the same links.
//!
//! - **The method**: forward + backward + the replayed exchange + optimizer: the sparse,
//!   1-bit and AlltoAll exchanges start when the whole gradient is there (a global top-k, a
//!   threshold, a fused buffer), so nothing overlaps.
//! - **Dense**: the same with the ring allreduce of the whole model (α-β on these links).
//! - **DenseOvlp** (the papers' baseline; PyTorch DDP's default): the gradients in buckets of
//!   25 MiB (the first 1 MiB), filled in the order the backward pass makes them; each
//!   bucket's ring allreduce starts when its last gradient is ready and the one before has
//!   finished; the step ends when the backward pass and the last allreduce have.
//!
//! The profile (CSV, header `name,numel,ms`): a row `forward` and a row `optimizer` (their
//! ms; numel ignored), and one row per layer in the order its gradient becomes ready (the
//! backward pass's: usually the model's layers reversed) with its numel and its backward ms.
//! Gradients are float32 (4 bytes). The ring on a flat cluster replays exactly at its α-β
//! time (RESULTS.md § sim-scale: sim/α-β 1.000), which is why the baselines use the formula.

use std::path::Path;

use anyhow::{bail, Context, Result};

/// DDP's bucket caps: the first bucket (`dist._DEFAULT_FIRST_BUCKET_BYTES`) and the others
/// (`bucket_cap_mb = 25`).
pub const FIRST_BUCKET_BYTES: u64 = 1 << 20;
pub const BUCKET_BYTES: u64 = 25 << 20;

/// A step's compute: seconds, layers in the order their gradients become ready.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub forward_s: f64,
    pub optimizer_s: f64,
    /// (layer, numel, backward seconds), in backward order.
    pub layers: Vec<(String, u64, f64)>,
}

impl Profile {
    pub fn backward_s(&self) -> f64 {
        self.layers.iter().map(|l| l.2).sum()
    }
    pub fn numel(&self) -> u64 {
        self.layers.iter().map(|l| l.1).sum()
    }
}

/// Reads a profile CSV (`name,numel,ms`); a mistake names the file and the line.
pub fn read_profile(path: &Path) -> Result<Profile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--step-profile {}", path.display()))?;
    parse_profile(&text).with_context(|| format!("--step-profile {}", path.display()))
}

pub fn parse_profile(text: &str) -> Result<Profile> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    match lines.next() {
        Some((_, h)) if h.trim().replace(' ', "") == "name,numel,ms" => {}
        Some((_, h)) => bail!("line 1 is `{h}`; the header must be `name,numel,ms`"),
        None => bail!("empty: give a header `name,numel,ms`, a row `forward`, a row `optimizer` and one row per layer"),
    }
    let (mut forward, mut optimizer, mut layers) = (None, None, Vec::new());
    for (i, line) in lines {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let [name, numel, ms] = f[..] else {
            bail!("line {}: `{line}` is not `name,numel,ms`", i + 1);
        };
        let ms: f64 = ms
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .with_context(|| format!("line {}: ms `{ms}` is not a time ≥ 0", i + 1))?;
        match name {
            "forward" => forward = Some(ms / 1e3),
            "optimizer" => optimizer = Some(ms / 1e3),
            _ => {
                let n: u64 = numel.parse().with_context(|| {
                    format!(
                        "line {}: numel `{numel}` of layer `{name}` is not a count",
                        i + 1
                    )
                })?;
                layers.push((name.to_string(), n, ms / 1e3));
            }
        }
    }
    let (Some(forward_s), Some(optimizer_s)) = (forward, optimizer) else {
        bail!("a row `forward` and a row `optimizer` are needed (their ms)");
    };
    if layers.is_empty() {
        bail!("no layer rows: one per layer, in the order its gradient becomes ready");
    }
    Ok(Profile {
        forward_s,
        optimizer_s,
        layers,
    })
}

/// The ring allreduce of `bytes` on `p` ranks at α (seconds per message) and β (seconds per
/// byte): the cost model's ring ([`gradkit_cost::ring`], 2(P−1) messages of bytes/P).
pub fn ring_s(p: usize, bytes: f64, alpha: f64, beta: f64) -> f64 {
    gradkit_cost::ring(p, bytes / 4.0).time(alpha, 4.0 * beta)
}

/// DDP's buckets over the profile's layers in backward order: (the time the last gradient of
/// the bucket is ready, its bytes). A bucket closes once it holds its cap or more.
pub fn buckets(profile: &Profile) -> Vec<(f64, u64)> {
    let (mut out, mut t, mut fill, mut cap) = (Vec::new(), 0.0, 0u64, FIRST_BUCKET_BYTES);
    for (_, numel, s) in &profile.layers {
        t += s;
        fill += numel * 4;
        if fill >= cap {
            out.push((t, fill));
            (fill, cap) = (0, BUCKET_BYTES);
        }
    }
    if fill > 0 {
        out.push((t, fill));
    }
    out
}

/// DenseOvlp's step: each bucket's ring once it is ready and the link is free.
pub fn dense_ovlp_s(profile: &Profile, p: usize, alpha: f64, beta: f64) -> f64 {
    let mut free = 0.0f64;
    for (ready, bytes) in buckets(profile) {
        free = free.max(ready) + ring_s(p, bytes as f64, alpha, beta);
    }
    profile.forward_s + profile.backward_s().max(free) + profile.optimizer_s
}

/// Dense's step: the whole model's ring after the backward pass.
pub fn dense_s(profile: &Profile, p: usize, alpha: f64, beta: f64) -> f64 {
    whole_s(
        profile,
        ring_s(p, (profile.numel() * 4) as f64, alpha, beta),
    )
}

/// A step whose exchange (seconds) starts after the backward pass.
pub fn whole_s(profile: &Profile, exchange_s: f64) -> f64 {
    profile.forward_s + profile.backward_s() + exchange_s + profile.optimizer_s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_two_bucket_timeline_written_by_hand() {
        // Forward 10 ms, optimizer 5 ms; backward: a (1,000,000 values, 20 ms) then b (same).
        let p = parse_profile(
            "name,numel,ms\nforward,0,10\na,1000000,20\nb,1000000,20\noptimizer,0,5\n",
        )
        .unwrap();
        // a's 4 MB fill the first bucket (1 MiB cap) at 20 ms; b's its own at 40 ms.
        assert_eq!(buckets(&p), vec![(0.020, 4_000_000), (0.040, 4_000_000)]);
        // P = 2, α = 0, β = 1 ns/B: a 4 MB ring is 2·1·(2 MB · 1 ns) = 4 ms.
        // a: 20 → 24 ms; b: 40 → 44 ms; step = 10 + max(40, 44) + 5 = 59 ms.
        assert!((dense_ovlp_s(&p, 2, 0.0, 1e-9) - 0.059).abs() < 1e-12);
        // Dense: 10 + 40 + ring(8 MB) = 8 ms + 5 = 63 ms.
        assert!((dense_s(&p, 2, 0.0, 1e-9) - 0.063).abs() < 1e-12);
        assert!((whole_s(&p, 0.001) - 0.056).abs() < 1e-12);
        // A long ring queues: β = 10 ns/B, 40 ms per bucket: a 20 → 60, b 60 → 100 ms.
        assert!((dense_ovlp_s(&p, 2, 0.0, 1e-8) - 0.115).abs() < 1e-12);
    }

    #[test]
    fn mistakes_name_the_line() {
        for (text, want) in [
            ("", "empty"),
            ("a,b\n", "header"),
            (
                "name,numel,ms\nforward,0,1\nw,10,x\noptimizer,0,1\n",
                "line 3",
            ),
            (
                "name,numel,ms\nforward,0,1\nw,ten,1\noptimizer,0,1\n",
                "numel `ten`",
            ),
            ("name,numel,ms\nw,10,1\n", "`forward`"),
            (
                "name,numel,ms\nforward,0,1\noptimizer,0,1\n",
                "no layer rows",
            ),
        ] {
            let e = parse_profile(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
