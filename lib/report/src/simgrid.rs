//! SimGrid's side of `gradreport simulate`: a recording's steps as time-independent (TI)
//! traces, the platform file (flat cluster, fat tree, dragonfly) and the `smpirun …
//! smpireplaymain` run that replays them. Facts about SimGrid 3.32 this relies on (checked
//! on Debian 12's libsimgrid-dev): TI sizes are bytes (point-to-point and collectives);
//! `wait SRC DST TAG` names the request it completes (a bare `wait` is refused); the replay
//! prints `Simulation time T` at the `smpi_replay` log's info level.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use gradkit_core::{CommRow, EventKind};

/// The speed of every simulated host: compute intervals become `compute` actions of
/// `seconds × HOST_FLOPS` flops.
pub const HOST_FLOPS: f64 = 1e9;

/// MPI tags must stay below `MPI_TAG_UB` (at least 2^15 − 1 by the standard; SMPI's is
/// larger): the TI tag of a message is its sequence number modulo this.
const TAG_SPACE: u64 = 1 << 30;

/// The network the replay runs on.
#[derive(Clone, Debug, PartialEq)]
pub enum Topology {
    /// Every host on its own link to one backbone (`<cluster>` without a topology).
    Flat,
    /// SimGrid's `FAT_TREE`, with its `topo_parameters` (levels;down;up;link counts).
    FatTree(String),
    /// SimGrid's `DRAGONFLY`, with its `topo_parameters` (groups;chassis;routers;nodes).
    Dragonfly(String),
}

impl Topology {
    pub fn name(&self) -> &'static str {
        match self {
            Topology::Flat => "flat",
            Topology::FatTree(_) => "fat-tree",
            Topology::Dragonfly(_) => "dragonfly",
        }
    }
}

/// A platform: `hosts` hosts (nodes) of `cores` ranks each on `topology`.
#[derive(Clone, Debug)]
pub struct Platform {
    pub topology: Topology,
    pub hosts: usize,
    /// Ranks per host (`--hosts-per-node`: GPUs per node); they talk over the loopback.
    pub ranks_per_host: usize,
    /// Host link rate, bytes per second.
    pub link_bps: f64,
    /// Host link latency, seconds.
    pub latency_s: f64,
    /// Within a node (loopback), bytes per second and seconds.
    pub intra_bps: f64,
    pub intra_latency_s: f64,
}

/// The default fat tree for `hosts` hosts: two levels, up to 16 hosts per leaf switch and as
/// many spines as a leaf has hosts (full bisection). Returns the parameters and the number of
/// hosts they describe (a multiple of the leaf size).
pub fn default_fat_tree(hosts: usize) -> (String, usize) {
    let k = hosts.clamp(1, 16);
    let leaves = hosts.div_ceil(k);
    (format!("2;{k},{leaves};1,{k};1,1"), k * leaves)
}

/// The default dragonfly for `hosts` hosts, after Cray Aries (Piz Daint): 4 nodes per router,
/// 16 routers per chassis, 6 chassis per group, groups as needed; smaller for fewer hosts.
/// Returns the parameters and the number of hosts they describe.
pub fn default_dragonfly(hosts: usize) -> (String, usize) {
    let n = hosts.clamp(1, 4);
    let r = hosts.div_ceil(n).clamp(1, 16);
    let c = hosts.div_ceil(n * r).clamp(1, 6);
    let g = hosts.div_ceil(n * r * c).max(1);
    (format!("{g},1;{c},1;{r},1;{n}"), g * c * r * n)
}

/// The hosts a fat tree's or dragonfly's parameters describe.
pub fn topology_hosts(t: &Topology) -> Result<Option<usize>> {
    let nums = |s: &str| -> Result<Vec<usize>> {
        s.split(',')
            .map(|x| {
                x.trim()
                    .parse::<usize>()
                    .with_context(|| format!("`{x}` is not a whole number"))
            })
            .collect()
    };
    match t {
        Topology::Flat => Ok(None),
        Topology::FatTree(p) => {
            let parts: Vec<&str> = p.split(';').collect();
            if parts.len() != 4 {
                bail!("fat tree parameters `{p}`: expected LEVELS;DOWN,…;UP,…;COUNT,… (flag --fat-tree)");
            }
            let down = nums(parts[1])
                .with_context(|| format!("fat tree parameters `{p}` (flag --fat-tree)"))?;
            Ok(Some(down.iter().fold(1usize, |a, &d| a.saturating_mul(d))))
        }
        Topology::Dragonfly(p) => {
            let parts: Vec<&str> = p.split(';').collect();
            if parts.len() != 4 {
                bail!("dragonfly parameters `{p}`: expected GROUPS,LINKS;CHASSIS,LINKS;ROUTERS,LINKS;NODES (flag --dragonfly)");
            }
            let mut h = 1;
            for part in &parts {
                let v = nums(part)
                    .with_context(|| format!("dragonfly parameters `{p}` (flag --dragonfly)"))?;
                h = v.first().map_or(h, |&x| x.saturating_mul(h));
            }
            Ok(Some(h))
        }
    }
}

fn rate(bps: f64) -> String {
    format!("{}Bps", bps)
}
fn secs(s: f64) -> String {
    format!("{}s", s)
}

impl Platform {
    /// The platform file's text.
    pub fn xml(&self) -> String {
        let topo = match &self.topology {
            Topology::Flat => {
                // A backbone that carries every host link at once: no contention but at the
                // hosts' own links.
                format!(
                    r#" bb_bw="{}" bb_lat="0s" bb_sharing_policy="SHARED""#,
                    rate(self.link_bps * self.hosts as f64)
                )
            }
            Topology::FatTree(p) => format!(r#" topology="FAT_TREE" topo_parameters="{p}""#),
            Topology::Dragonfly(p) => format!(r#" topology="DRAGONFLY" topo_parameters="{p}""#),
        };
        format!(
            r#"<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
  <cluster id="c" prefix="node-" suffix="" radical="0-{last}" speed="1Gf" core="{cores}" bw="{bw}" lat="{lat}" sharing_policy="SPLITDUPLEX" loopback_bw="{lbw}" loopback_lat="{llat}"{topo}/>
</platform>
"#,
            last = self.hosts - 1,
            cores = self.ranks_per_host,
            bw = rate(self.link_bps),
            lat = secs(self.latency_s),
            lbw = rate(self.intra_bps),
            llat = secs(self.intra_latency_s),
        )
    }
    /// The hostfile: rank r runs on host ⌊r / ranks_per_host⌋.
    pub fn hostfile(&self, ranks: usize) -> String {
        (0..ranks)
            .map(|r| format!("node-{}\n", r / self.ranks_per_host))
            .collect()
    }
    /// The α of the α-β model on this platform: the latency between two hosts on the flat
    /// cluster (two host links; the backbone adds none), and a rank's message time start-up.
    pub fn alpha_s(&self) -> f64 {
        2.0 * self.latency_s
    }
    pub fn beta_s_per_byte(&self) -> f64 {
        1.0 / self.link_bps
    }
}

/// How each rank's compute intervals are replayed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Compute {
    /// As recorded.
    Recorded,
    /// None: communication alone.
    None,
    /// This many seconds per step on every rank, before its first call.
    PerStep(f64),
}

/// One step's events, per rank, in the order they were recorded.
pub struct StepEvents<'a> {
    pub ranks: Vec<Vec<&'a CommRow>>,
}

/// The largest message one TI action may carry: SMPI's replayer parses a size as a double
/// but posts it as an MPI count, an `int`, so 2^31 bytes and more wrap (every such message
/// replayed as the same 2.9e10 s, a 2^63-byte one as nothing). Larger messages are sent as
/// pieces of at most this many bytes, all posted at once: they share the links as the one
/// message would, so the replay keeps latency + bytes / rate.
pub const PIECE_BYTES: u64 = 1 << 30;

/// The most pieces one message may be cut into: a message over `PIECE_BYTES × MAX_PIECES`
/// bytes (1 TiB) is refused rather than written as millions of TI lines.
pub const MAX_PIECES: u64 = 1 << 10;

/// The TI tag of piece 0 of a message: its sequence number (unique between a pair of ranks),
/// folded with the recorded tag, so every request a rank has in flight has its own (src, dst,
/// tag). Piece j adds j · 2^20 (a call's messages between two ranks have nearby sequence
/// numbers, so the pieces' tags stay apart from theirs).
fn ti_tag(r: &CommRow, piece: u64) -> u64 {
    (r.seq + (r.tag as u64) * 7_919 + piece * (1 << 20)) % TAG_SPACE
}

/// A message of `bytes` (already scaled) as TI pieces: their sizes, each at most
/// [`PIECE_BYTES`]; a message of 0 bytes stays one piece of 0.
pub fn pieces(bytes: u64) -> impl Iterator<Item = u64> {
    let n = bytes.div_ceil(PIECE_BYTES).max(1);
    (0..n).map(move |j| (bytes - j * PIECE_BYTES).min(PIECE_BYTES))
}

/// A recorded message's size at `scale` times the recorded model, as the replay sends it:
/// its `fixed` bytes as they are (control messages, headers, padding: commtrace/1's
/// `fixed_bytes`) and the rest times `scale`; 0 stays 0, anything else at least 1 byte; None
/// beyond what [`pieces`] can carry (`PIECE_BYTES × MAX_PIECES`).
pub fn scaled_bytes(bytes: u64, fixed: u64, scale: f64) -> Option<u64> {
    if bytes == 0 {
        return Some(0);
    }
    let fixed = fixed.min(bytes);
    let b = (fixed as f64 + (bytes - fixed) as f64 * scale)
        .round()
        .max(1.0);
    (b <= (PIECE_BYTES * MAX_PIECES) as f64).then_some(b as u64)
}

/// [`scaled_bytes`] of a recorded message.
pub fn scaled(e: &CommRow, scale: f64) -> Option<u64> {
    scaled_bytes(e.bytes, e.fixed_bytes, scale)
}

/// Writes rank `rank`'s TI trace of `events` (already cut to what is replayed). Every size
/// must have passed [`scaled_bytes`] (the caller checks the recording first).
pub fn ti_trace(rank: usize, events: &[&CommRow], compute: Compute, scale: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{rank} init");
    if let Compute::PerStep(sec) = compute {
        let _ = writeln!(s, "{rank} compute {}", (sec * HOST_FLOPS).round());
    }
    let size = |e: &CommRow| scaled(e, scale).unwrap_or(PIECE_BYTES * MAX_PIECES);
    let mut i = 0;
    while i < events.len() {
        let call = events[i].call;
        let mut j = i;
        while j < events.len() && events[j].call == call {
            j += 1;
        }
        ti_call(&mut s, rank, &events[i..j], compute, &size);
        i = j;
    }
    let _ = writeln!(s, "{rank} finalize");
    s
}

/// One call: the sends posted, the receives posted, the receives completed in order, then the
/// sends; each message as its pieces.
fn ti_call(
    s: &mut String,
    rank: usize,
    group: &[&CommRow],
    compute: Compute,
    size: &dyn Fn(&CommRow) -> u64,
) {
    for e in group {
        match e.kind {
            EventKind::Compute => {
                if compute == Compute::Recorded {
                    let flops = ((e.end_s - e.start_s).max(0.0) * HOST_FLOPS).round();
                    if flops >= 1.0 {
                        let _ = writeln!(s, "{rank} compute {flops}");
                    }
                }
            }
            EventKind::Allreduce => {
                // Pieces one after another: each is a whole allreduce of its part.
                for b in pieces(size(e)) {
                    let _ = writeln!(s, "{rank} allreduce {b} 0");
                }
            }
            EventKind::Send => {
                for (k, b) in pieces(size(e)).enumerate() {
                    let _ = writeln!(s, "{rank} isend {} {} {b}", e.peer, ti_tag(e, k as u64));
                }
            }
            EventKind::Recv => {}
        }
    }
    let recvs = || group.iter().filter(|e| e.kind == EventKind::Recv);
    for e in recvs() {
        for (k, b) in pieces(size(e)).enumerate() {
            let _ = writeln!(s, "{rank} irecv {} {} {b}", e.peer, ti_tag(e, k as u64));
        }
    }
    for e in recvs() {
        for k in 0..pieces(size(e)).count() as u64 {
            let _ = writeln!(s, "{rank} wait {} {rank} {}", e.peer, ti_tag(e, k));
        }
    }
    for e in group.iter().filter(|e| e.kind == EventKind::Send) {
        for k in 0..pieces(size(e)).count() as u64 {
            let _ = writeln!(s, "{rank} wait {rank} {} {}", e.peer, ti_tag(e, k));
        }
    }
}

/// Whether every send among `ranks`' events has its receive among them and the other way
/// round, and every rank has as many opaque allreduces: a cut the replay can finish.
pub fn consistent(ranks: &[Vec<&CommRow>]) -> bool {
    let mut sends = std::collections::BTreeSet::new();
    let mut recvs = std::collections::BTreeSet::new();
    let mut allreduces = std::collections::BTreeSet::new();
    for evs in ranks {
        let mut n = 0;
        for e in evs {
            match e.kind {
                EventKind::Send => {
                    sends.insert((e.rank, e.peer, e.tag, e.seq));
                }
                EventKind::Recv => {
                    recvs.insert((e.peer, e.rank, e.tag, e.seq));
                }
                EventKind::Allreduce => n += 1,
                EventKind::Compute => {}
            }
        }
        allreduces.insert(n);
    }
    sends == recvs && allreduces.len() <= 1
}

/// The replayer: `smpirun` and SimGrid's `smpireplaymain`.
pub struct Smpi {
    smpirun: PathBuf,
    replaymain: PathBuf,
    /// `--cfg=…` options (calibration factors).
    cfg: Vec<String>,
}

const APT_HINT: &str = "install SimGrid: apt-get install libsimgrid-dev (or `make deps`)";

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl Smpi {
    /// Finds `smpirun` (`$GRADKIT_SMPIRUN`, else on PATH) and `smpireplaymain`
    /// (`$GRADKIT_SMPIREPLAYMAIN`, else SimGrid's library directory next to it).
    pub fn find(bw_factor: &str, lat_factor: &str, extra: &[String]) -> Result<Smpi> {
        let smpirun = match std::env::var_os("GRADKIT_SMPIRUN").filter(|s| !s.is_empty()) {
            Some(p) => {
                let p = PathBuf::from(p);
                if !p.is_file() {
                    bail!(
                        "smpirun not found at {} (environment variable GRADKIT_SMPIRUN); {APT_HINT}",
                        p.display()
                    );
                }
                p
            }
            None => on_path("smpirun")
                .with_context(|| format!("smpirun not found on PATH; {APT_HINT}"))?,
        };
        let replaymain = match std::env::var_os("GRADKIT_SMPIREPLAYMAIN").filter(|s| !s.is_empty())
        {
            Some(p) => PathBuf::from(p),
            None => {
                let prefix = smpirun
                    .parent()
                    .and_then(Path::parent)
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("/usr"));
                let mut found = None;
                for lib in [
                    "lib/x86_64-linux-gnu",
                    "lib/aarch64-linux-gnu",
                    "lib64",
                    "lib",
                ] {
                    let p = prefix.join(lib).join("simgrid/smpireplaymain");
                    if p.is_file() {
                        found = Some(p);
                        break;
                    }
                }
                found.with_context(|| {
                    format!(
                        "SimGrid's smpireplaymain not found under {} (environment variable GRADKIT_SMPIREPLAYMAIN names it); {APT_HINT}",
                        prefix.display()
                    )
                })?
            }
        };
        if !replaymain.is_file() {
            bail!(
                "smpireplaymain not found at {} (environment variable GRADKIT_SMPIREPLAYMAIN); {APT_HINT}",
                replaymain.display()
            );
        }
        // TCP acknowledgements' reverse traffic off: a link's rate is the payload's (as the
        // α-β model and the shaped cluster's rate limit count it); --smpi-cfg turns it on.
        let mut cfg = vec![
            format!("--cfg=smpi/bw-factor:{bw_factor}"),
            format!("--cfg=smpi/lat-factor:{lat_factor}"),
            "--cfg=network/crosstraffic:0".to_string(),
        ];
        cfg.extend(extra.iter().map(|c| format!("--cfg={c}")));
        Ok(Smpi {
            smpirun,
            replaymain,
            cfg,
        })
    }

    /// Replays `traces` (one TI text per rank) on `platform` in `dir`: the simulated time.
    pub fn replay(&self, dir: &Path, platform: &Platform, traces: &[String]) -> Result<f64> {
        let p = traces.len();
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let write = |name: &str, text: &str| -> Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(path)
        };
        let mut list = String::new();
        for (r, t) in traces.iter().enumerate() {
            let path = write(&format!("rank-{r}.ti"), t)?;
            let abs = std::fs::canonicalize(&path)?;
            let _ = writeln!(list, "{}", abs.display());
        }
        let plat = write("platform.xml", &platform.xml())?;
        let hosts = write("hostfile", &platform.hostfile(p))?;
        let ti = write("traces.txt", &list)?;
        let mut cmd = Command::new(&self.smpirun);
        cmd.arg("-np")
            .arg(p.to_string())
            .arg("-platform")
            .arg(&plat)
            .arg("-hostfile")
            .arg(&hosts)
            .arg("-replay")
            .arg(&ti)
            .args(&self.cfg)
            .args([
                "--cfg=smpi/host-speed:1Gf",
                "--log=root.thres:critical",
                "--log=smpi_replay.thres:info",
            ])
            .arg(&self.replaymain)
            .current_dir(dir);
        // In a process group of its own, ended with the replay's files on a signal.
        let out = gradkit_core::paths::output_in_group(&mut cmd)
            .with_context(|| format!("cannot run {}", self.smpirun.display()))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let time = text
            .lines()
            .filter_map(|l| l.split("Simulation time ").nth(1))
            .filter_map(|t| t.trim().parse::<f64>().ok())
            .next_back();
        match (out.status.success(), time) {
            (true, Some(t)) => Ok(t),
            _ => {
                let last: Vec<&str> = text.lines().rev().take(3).collect();
                bail!(
                    "smpirun failed ({}) in {}: {}",
                    out.status,
                    dir.display(),
                    last.into_iter().rev().collect::<Vec<_>>().join(" | ")
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_topologies_hold_the_hosts() {
        for h in [1, 2, 3, 4, 7, 16, 17, 64, 256, 1000] {
            let (ft, n) = default_fat_tree(h);
            assert!(n >= h, "{ft}");
            assert_eq!(topology_hosts(&Topology::FatTree(ft)).unwrap(), Some(n));
            let (df, n) = default_dragonfly(h);
            assert!(n >= h, "{df}");
            assert_eq!(topology_hosts(&Topology::Dragonfly(df)).unwrap(), Some(n));
        }
    }
}
