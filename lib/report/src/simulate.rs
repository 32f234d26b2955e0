//! `gradreport simulate`: replays a `commtrace/1` recording (`--comm-trace`) on SimGrid and
//! sets, per step and phase, the simulated time beside the recorded wall time and the α-β
//! model's (docs/SIMULATE.md).
//!
//! Each step is replayed on its own, from all ranks starting together. A step's phases are
//! timed by replaying its prefixes: the step cut, on every rank, before its first event of a
//! later phase; a phase's time is the prefix's minus the one before (its share of the
//! critical path). A cut that would leave a message without its receive (a phase whose
//! messages are received in another) gives the step's total alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use gradkit_core::cli::{fmt_num, Format, TextTable};
use gradkit_core::{read_table, CommRow, EventKind, Input, Meta, MetricRow, Output, ReadOptions};

use crate::explain::{algo_of, far, why, why_formula, Ideal};
use crate::simgrid::{self, Compute, Platform, Smpi, Topology};

/// The most nodes (and ranks per node) a replay's platform may have: SimGrid builds every
/// host and route before the first event (10^6 flat nodes: 97 s and 4 GB for an empty
/// platform), and a recording has at most this many ranks to place.
pub const MAX_NODES: usize = 1 << 16;

/// What a replay is asked for, typed: `gradreport simulate` builds it from its command line
/// (the tool's `SimulateOpts::options`, where every usage check is made).
#[derive(Clone, Debug)]
pub struct SimulateOpts {
    /// A commtrace/1 recording (gradallreduce, bench or gradtrain `--comm-trace`).
    pub recording: PathBuf,
    /// The links and ranks per node; the topology's parameters and the host count are filled
    /// in for the recording's ranks ([`SimulateOpts::platform`]).
    pub platform: Platform,
    /// Compute between the calls.
    pub compute: Compute,
    /// Nodes of the platform (None: as many as the ranks need; a fat tree or dragonfly
    /// rounds up to its shape).
    pub nodes: Option<usize>,
    /// SimGrid FAT_TREE parameters (None: [`simgrid::default_fat_tree`]).
    pub fat_tree: Option<String>,
    /// SimGrid DRAGONFLY parameters (None: [`simgrid::default_dragonfly`]).
    pub dragonfly: Option<String>,
    /// SMPI's piecewise bandwidth factors (`smpi/bw-factor`), checked ([`check_piecewise`]).
    pub bw_factor: String,
    /// SMPI's piecewise latency factors (`smpi/lat-factor`), checked.
    pub lat_factor: String,
    /// More SimGrid configuration, KEY:VALUE, each checked ([`check_smpi_cfg`]).
    pub smpi_cfg: Vec<String>,
    /// Every message's size is multiplied by this (> 0).
    pub scale_bytes: f64,
    /// Replay only these steps (None: every step).
    pub steps: Option<Vec<u32>>,
    /// The step's total only, no per-phase replays.
    pub no_phases: bool,
    /// Keep the TI traces and platform files here (None: a temporary directory).
    pub keep: Option<PathBuf>,
    /// Also write the rows here: metrics/1 Parquet, or CSV when the name ends in .csv.
    pub output: Option<PathBuf>,
    /// How the table is printed on stdout.
    pub format: Format,
    /// Another recording replayed on the same platform: the speedup over it is printed.
    pub baseline: Option<PathBuf>,
    /// A step's compute ([`crate::wholestep`]): the whole step around the replayed exchange,
    /// beside Dense and DenseOvlp on the same links.
    pub step_profile: Option<PathBuf>,
    /// The model the formula column is of: n elements (after any `--scale-bytes`) and the
    /// density k/n, for the papers' idealised α-β formula per step and phase ([`Ideal`]);
    /// `None`: no such column.
    pub ideal: Option<(u64, f64)>,
}

/// `s` (trimmed) cut where its leading number (digits, `.`, an exponent's `e`) ends.
fn number_and_unit(s: &str) -> (&str, &str) {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == 'E'))
        .unwrap_or(t.len());
    t.split_at(split)
}

/// A rate: `<number><unit>` with unit bps, Kbps, Mbps, Gbps (bits) or Bps, KBps, MBps, GBps
/// (bytes), or kbit, mbit, gbit (tc's spelling); bytes per second.
pub fn parse_rate(s: &str, flag: &str) -> Result<f64> {
    let (num, unit) = number_and_unit(s);
    let v: f64 = num
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v > 0.0)
        .with_context(|| {
            format!("`{s}` is not a rate > 0 such as 10Gbps, 100Mbps or 12.5MBps (flag {flag})")
        })?;
    let mult = match unit {
        "bps" | "bit" => 1.0 / 8.0,
        "Kbps" | "kbps" | "kbit" => 1e3 / 8.0,
        "Mbps" | "mbps" | "mbit" => 1e6 / 8.0,
        "Gbps" | "gbps" | "gbit" => 1e9 / 8.0,
        "Bps" => 1.0,
        "KBps" | "kBps" => 1e3,
        "MBps" => 1e6,
        "GBps" => 1e9,
        _ => bail!("`{s}`: unknown rate unit `{unit}` (bps, Kbps, Mbps, Gbps, Bps, KBps, MBps, GBps, mbit, gbit) (flag {flag})"),
    };
    Ok(v * mult)
}

/// SMPI's piecewise values: `SIZE:V;SIZE:V…` (`smpi/bw-factor`, `smpi/lat-factor`: one
/// factor > 0 per piece) or `SIZE:BASE:PER_BYTE;…` (`smpi/os`, `smpi/or`, `smpi/ois`: two
/// values ≥ 0). SIZE is a whole number of bytes. Checked here, since SimGrid aborts on a
/// malformed one with a backtrace of its own.
pub fn check_piecewise(value: &str, flag: &str, overheads: bool) -> Result<()> {
    let (n, want) = if overheads {
        (3, "SIZE:BASE:PER_BYTE;… with BASE and PER_BYTE numbers ≥ 0")
    } else {
        (2, "SIZE:FACTOR;… with each FACTOR a number > 0")
    };
    let bad = || {
        anyhow::anyhow!(
            "`{value}` is not {want}, e.g. {} (flag {flag})",
            if overheads {
                "0:1e-6:0"
            } else {
                "65472:0.94;0:0.8"
            }
        )
    };
    for piece in value.split(';') {
        let parts: Vec<&str> = piece.split(':').map(str::trim).collect();
        if parts.len() != n || parts[0].parse::<u64>().is_err() {
            return Err(bad());
        }
        for v in &parts[1..] {
            match v.parse::<f64>() {
                Ok(x) if x.is_finite() && (x > 0.0 || (overheads && x == 0.0)) => {}
                _ => return Err(bad()),
            }
        }
    }
    Ok(())
}

/// A `--smpi-cfg KEY:VALUE`: a key of letters, digits, `/`, `-`, `_` and `.`, a value, and
/// SMPI's piecewise keys' values in their form ([`check_piecewise`]).
pub fn check_smpi_cfg(c: &str) -> Result<()> {
    let key_ok = |k: &str| {
        !k.is_empty()
            && k.chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "/-_.".contains(ch))
    };
    match c.split_once(':') {
        Some((k, v)) if key_ok(k) && !v.trim().is_empty() => match k {
            "smpi/bw-factor" | "smpi/lat-factor" => check_piecewise(v, "--smpi-cfg", false),
            "smpi/os" | "smpi/or" | "smpi/ois" => check_piecewise(v, "--smpi-cfg", true),
            _ => Ok(()),
        },
        _ => bail!("`{c}` is not KEY:VALUE, e.g. network/crosstraffic:1 (flag --smpi-cfg)"),
    }
}

/// A time: `<number><unit>` with unit s, ms, us, ns; seconds.
pub fn parse_time(s: &str, flag: &str) -> Result<f64> {
    let (num, unit) = number_and_unit(s);
    let v: f64 = num
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .with_context(|| format!("`{s}` is not a time ≥ 0 such as 5us or 1ms (flag {flag})"))?;
    let mult = match unit {
        "s" => 1.0,
        "ms" => 1e-3,
        "us" => 1e-6,
        "ns" => 1e-9,
        _ => bail!("`{s}`: unknown time unit `{unit}` (s, ms, us, ns) (flag {flag})"),
    };
    Ok(v * mult)
}

impl SimulateOpts {
    /// The platform for `ranks` ranks: its topology's parameters and host count, checked to
    /// hold every rank.
    pub fn platform(&self, ranks: usize) -> Result<Platform> {
        let mut p = self.platform.clone();
        let need = ranks.div_ceil(p.ranks_per_host);
        let want = self.nodes.unwrap_or(need);
        p.topology = match p.topology {
            Topology::Flat => Topology::Flat,
            Topology::FatTree(_) => Topology::FatTree(
                self.fat_tree
                    .clone()
                    .unwrap_or_else(|| simgrid::default_fat_tree(want).0),
            ),
            Topology::Dragonfly(_) => Topology::Dragonfly(
                self.dragonfly
                    .clone()
                    .unwrap_or_else(|| simgrid::default_dragonfly(want).0),
            ),
        };
        p.hosts = simgrid::topology_hosts(&p.topology)?.unwrap_or(want);
        if p.hosts * p.ranks_per_host < ranks {
            bail!(
                "the platform has {} nodes × {} ranks per node = {} ranks' room, fewer than the recording's {ranks} ranks (flags --nodes, --hosts-per-node, --fat-tree, --dragonfly)",
                p.hosts,
                p.ranks_per_host,
                p.hosts * p.ranks_per_host
            );
        }
        Ok(p)
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    pub step: u32,
    pub label: String,
    /// None: the whole step.
    pub phase: Option<String>,
    pub simulated_s: Option<f64>,
    pub recorded_s: f64,
    pub model_s: f64,
    /// For a replay more than 1.5× from the α-β model, what in the recorded messages sets it
    /// apart (the model adds the busiest rank's messages one after another):
    /// [`crate::explain::why`]; `None` for the others.
    pub why: Option<Vec<String>>,
    /// The paper's idealised formula for this step or phase (`--model-n`: [`Ideal`]); `None`
    /// where the algorithm has no formula, or none by phase. `Some(0)`: a phase the formula
    /// does not count.
    pub ideal_s: Option<f64>,
    /// For a replay more than 1.5× from the formula, what in the recorded messages the
    /// formula leaves out ([`crate::explain::why_formula`]).
    pub why_ideal: Option<Vec<String>>,
}

/// The recorded wall time of `events` on one rank: the span of each call (and compute
/// interval) counted once.
fn recorded(evs: &[&CommRow]) -> f64 {
    let mut seen = std::collections::BTreeSet::new();
    evs.iter()
        .filter(|e| seen.insert(e.call))
        .map(|e| (e.end_s - e.start_s).max(0.0))
        .sum()
}

/// The α-β model on the recorded messages of one rank: every message it sends costs
/// α + bytes·β, one after another (no waiting for peers, no contention); an opaque
/// allreduce costs the ring's 2(P−1)·(α + bytes/P·β). Sizes scaled as the replay scales them.
fn alpha_beta(evs: &[&CommRow], p: usize, alpha: f64, beta: f64, scale: f64) -> f64 {
    let bytes = |e: &CommRow| simgrid::scaled(e, scale).unwrap_or(u64::MAX) as f64;
    evs.iter()
        .map(|e| match e.kind {
            EventKind::Send => alpha + bytes(e) * beta,
            EventKind::Allreduce => crate::wholestep::ring_s(p, bytes(e), alpha, beta),
            _ => 0.0,
        })
        .sum()
}

/// The phases of a step in the order they first appear (rank order, then time).
fn phase_order(ranks: &[Vec<&CommRow>]) -> Vec<String> {
    let mut order: Vec<String> = Vec::new();
    for evs in ranks {
        let mut last: Option<usize> = None;
        for e in evs {
            match order.iter().position(|p| *p == e.phase) {
                Some(i) => last = Some(last.map_or(i, |l| l.max(i))),
                None => {
                    // A phase unseen so far goes after the last one this rank has been in.
                    let at = last.map_or(order.len(), |l| l + 1).min(order.len());
                    order.insert(at, e.phase.clone());
                    last = Some(at);
                }
            }
        }
    }
    order
}

/// Runs the simulation: the report's lines.
pub fn simulate(opts: &SimulateOpts) -> Result<(Vec<Line>, Meta, usize)> {
    let (rows, meta, ranks) = load_recording(opts)?;
    let platform = opts.platform(ranks)?;
    let smpi = Smpi::find(&opts.bw_factor, &opts.lat_factor, &opts.smpi_cfg)?;
    let tmp;
    let dir = match &opts.keep {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile_dir()?;
            tmp.0.clone()
        }
    };
    let steps = by_step(opts, &rows)?;
    let sim = Sim {
        opts,
        smpi: &smpi,
        platform: &platform,
        compute: opts.compute,
        dir: &dir,
        ranks,
        ideal: opts.ideal.map(|(n, density)| Ideal {
            n: n as f64,
            k: gradkit_core::keep::Keep::Density(density).k(n) as f64,
            ranks,
            alpha: platform.alpha_s(),
            beta: platform.beta_s_per_byte(),
        }),
        meta_algo: meta.get("algo").map(str::to_string),
    };
    let mut lines = Vec::new();
    for (step, events) in steps {
        sim.step(step, &per_rank(&events, ranks), &mut lines)?;
    }
    Ok((lines, meta, ranks))
}

/// The most ranks a recording's world may have (metadata `gradkit.world_size`): what the
/// largest platform holds, [`MAX_NODES`] nodes of [`MAX_NODES`] ranks, is far beyond any
/// replay's time; this bounds what the metadata alone can make the replay allocate.
pub const MAX_RANKS: usize = 1 << 20;

/// The recording's rows, metadata and world size, checked: events there, ranks and peers in
/// the world, the format version this gradkit replays, and every row one the replay can run
/// ([`check_rows`]).
fn load_recording(opts: &SimulateOpts) -> Result<(Vec<CommRow>, Meta, usize)> {
    let input = Input::Path(opts.recording.clone());
    let loaded = read_table::<CommRow>(&input, ReadOptions::default()).map_err(|e| {
        // The reader names the file and the version it holds.
        if format!("{e:#}").contains("file holds `commtrace/") {
            e.context("a recording of another format version (this gradkit replays commtrace/1: record it again)")
        } else {
            e
        }
    })?;
    let rows = loaded.rows;
    let name = opts.recording.display();
    let seen = rows
        .iter()
        .map(|r| r.rank.max(r.peer) as usize + 1)
        .max()
        .unwrap_or(0);
    let ranks = match loaded.meta.get("world_size") {
        None => seen,
        Some(v) => match v.parse::<usize>() {
            Ok(p) if (1..=MAX_RANKS).contains(&p) => p,
            _ => bail!(
                "recording {name}: metadata gradkit.world_size = `{v}` is not a world of 1 to {MAX_RANKS} ranks"
            ),
        },
    };
    if rows.is_empty() || ranks == 0 {
        bail!("recording {name} holds no events");
    }
    if let Some((i, r)) = rows
        .iter()
        .enumerate()
        .find(|(_, r)| r.rank as usize >= ranks || r.peer as usize >= ranks)
    {
        bail!(
            "recording {name}: row {i}: rank {} / peer {} outside its world of {ranks} ranks (metadata gradkit.world_size)",
            r.rank,
            r.peer
        );
    }
    check_rows(&rows, opts.scale_bytes).with_context(|| format!("recording {name}"))?;
    Ok((rows, loaded.meta, ranks))
}

/// Every row one the replay can run: times finite, no call ending before it starts, message
/// sizes (× `scale`) within what [`simgrid::pieces`] carries, and every send received once,
/// in its step, with its size (and every receive sent). The error names the row (file order,
/// from 0) and the column.
pub fn check_rows(rows: &[CommRow], scale: f64) -> Result<()> {
    for (i, r) in rows.iter().enumerate() {
        for (col, v) in [("start_s", r.start_s), ("end_s", r.end_s)] {
            if !v.is_finite() {
                bail!("column `{col}`, row {i}: {v} is not a time");
            }
        }
        if r.end_s < r.start_s {
            bail!(
                "column `end_s`, row {i}: the call ends at {} s, before it starts ({} s, column `start_s`)",
                r.end_s,
                r.start_s
            );
        }
        if simgrid::scaled(r, scale).is_none() {
            bail!(
                "column `bytes`, row {i}: a message of {} bytes × --scale-bytes {scale} is more than the replay can send (at most {} bytes: SimGrid's TI actions carry less than 2^31 bytes, and a message is cut into at most {} pieces)",
                r.bytes,
                simgrid::PIECE_BYTES * simgrid::MAX_PIECES,
                simgrid::MAX_PIECES
            );
        }
    }
    // (step, from, to, tag, seq) → (row, bytes) of the send, taken off by its receive.
    let mut sends = std::collections::HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        if r.kind == EventKind::Send {
            if let Some((j, _)) = sends.insert((r.step, r.rank, r.peer, r.tag, r.seq), (i, r.bytes))
            {
                bail!(
                    "column `seq`, row {i}: rank {} sends to rank {} with tag {} and sequence number {} twice (also row {j})",
                    r.rank, r.peer, r.tag, r.seq
                );
            }
        }
    }
    for (i, r) in rows.iter().enumerate() {
        if r.kind != EventKind::Recv {
            continue;
        }
        match sends.remove(&(r.step, r.peer, r.rank, r.tag, r.seq)) {
            None => bail!(
                "column `seq`, row {i}: rank {} receives from rank {} (tag {}, sequence number {}, step {}) a message that no row sends",
                r.rank, r.peer, r.tag, r.seq, r.step
            ),
            Some((j, b)) if b != r.bytes => bail!(
                "column `bytes`, row {i}: rank {} receives {} bytes from rank {}, which sends {b} (row {j})",
                r.rank, r.bytes, r.peer
            ),
            Some(_) => {}
        }
    }
    if let Some((i, r)) = sends
        .values()
        .map(|&(i, _)| (i, &rows[i]))
        .min_by_key(|(i, _)| *i)
    {
        bail!(
            "column `seq`, row {i}: rank {} sends to rank {} (tag {}, sequence number {}, step {}) a message that no row receives",
            r.rank, r.peer, r.tag, r.seq, r.step
        );
    }
    Ok(())
}

/// Step → its events (the steps `--steps` asks for), in file order; a step is spread over its
/// ranks only when it is replayed ([`per_rank`]), so memory is the rows plus one step.
fn by_step<'a>(
    opts: &SimulateOpts,
    rows: &'a [CommRow],
) -> Result<BTreeMap<u32, Vec<&'a CommRow>>> {
    let mut steps: BTreeMap<u32, Vec<&CommRow>> = BTreeMap::new();
    for r in rows {
        if opts.steps.as_ref().is_some_and(|s| !s.contains(&r.step)) {
            continue;
        }
        steps.entry(r.step).or_default().push(r);
    }
    if steps.is_empty() {
        bail!(
            "no step of --steps is in the recording {} (flag --steps)",
            opts.recording.display()
        );
    }
    Ok(steps)
}

/// One step's events per rank (0..ranks), each rank's in event order.
fn per_rank<'a>(events: &[&'a CommRow], ranks: usize) -> Vec<Vec<&'a CommRow>> {
    let mut out = vec![Vec::new(); ranks];
    for e in events {
        out[e.rank as usize].push(*e);
    }
    for evs in &mut out {
        evs.sort_by_key(|e| e.event);
    }
    out
}

/// What replaying a step needs.
struct Sim<'a> {
    opts: &'a SimulateOpts,
    smpi: &'a Smpi,
    platform: &'a Platform,
    compute: Compute,
    dir: &'a Path,
    ranks: usize,
    /// The formula column's model (`--model-n`), and the recording's `algo`.
    ideal: Option<Ideal>,
    meta_algo: Option<String>,
}

impl Sim<'_> {
    /// Replays the events `cut` of step `step` (per rank), in a folder of its own.
    fn replay(&self, step: u32, cut: &[Vec<&CommRow>], name: &str) -> Result<f64> {
        let traces: Vec<String> = cut
            .iter()
            .enumerate()
            .map(|(r, evs)| simgrid::ti_trace(r, evs, self.compute, self.opts.scale_bytes))
            .collect();
        let dir = self.dir.join(format!("step-{step}")).join(name);
        self.smpi.replay(&dir, self.platform, &traces)
    }

    /// The step's line (simulated beside recorded and the α-β model), then one per phase.
    /// One line of the table: `per_rank`'s events (a step, or a phase of it) replayed in
    /// `simulated_s`, beside the recorded time and the α-β model, the slowest rank's each,
    /// and why the replay is far from the model where it is.
    fn line(
        &self,
        step: u32,
        label: &str,
        phase: Option<&String>,
        simulated_s: Option<f64>,
        per_rank: &[Vec<&CommRow>],
    ) -> Line {
        let (alpha, beta) = (self.platform.alpha_s(), self.platform.beta_s_per_byte());
        let (ranks, scale) = (self.ranks, self.opts.scale_bytes);
        let max_over = |f: &dyn Fn(&[&CommRow]) -> f64| -> f64 {
            per_rank.iter().map(|e| f(e)).fold(0.0, f64::max)
        };
        let model_s = max_over(&|e| alpha_beta(e, ranks, alpha, beta, scale));
        let algo = algo_of(label, self.meta_algo.as_deref());
        let ph = phase.map(String::as_str);
        let formula = self.ideal.and_then(|i| Some((i, i.formula(algo, ph)?)));
        let ideal_s = formula.map(|(i, f)| i.seconds(f));
        let why_ideal = match (formula, simulated_s, ideal_s) {
            // A phase outside the formula is named where it takes time.
            (Some((_, f)), Some(s), Some(t)) if (t == 0.0 && s > 0.0) || far(Some(s), t) => {
                Some(why_formula(per_rank, scale, f, s, model_s))
            }
            _ => None,
        };
        Line {
            step,
            label: label.to_string(),
            phase: phase.cloned(),
            simulated_s,
            recorded_s: max_over(&|e| recorded(e)),
            model_s,
            why: far(simulated_s, model_s).then(|| why(per_rank, scale, alpha, model_s)),
            ideal_s,
            why_ideal,
        }
    }

    fn step(&self, step: u32, per_rank: &[Vec<&CommRow>], lines: &mut Vec<Line>) -> Result<()> {
        let label = per_rank
            .iter()
            .flatten()
            .next()
            .map(|e| e.label.clone())
            .unwrap_or_default();
        let total = self.replay(step, per_rank, "all")?;
        lines.push(self.line(step, &label, None, Some(total), per_rank));
        let order = phase_order(per_rank);
        if self.opts.no_phases || order.len() < 2 {
            return Ok(());
        }
        self.phases(step, per_rank, &order, total, &label, lines)
    }

    /// One line per phase: prefix k is, on every rank, the events before its first one of a
    /// phase after the k-th; a phase's simulated time is its prefix's minus the one before.
    fn phases(
        &self,
        step: u32,
        per_rank: &[Vec<&CommRow>],
        order: &[String],
        total: f64,
        label: &str,
        lines: &mut Vec<Line>,
    ) -> Result<()> {
        let idx = |e: &CommRow| order.iter().position(|p| *p == e.phase).unwrap_or(0);
        let mut prev = Some(0.0);
        for (k, phase) in order.iter().enumerate() {
            let cut: Vec<Vec<&CommRow>> = per_rank
                .iter()
                .map(|evs| evs.iter().take_while(|e| idx(e) <= k).copied().collect())
                .collect();
            let t = if k + 1 == order.len() {
                Some(total)
            } else if simgrid::consistent(&cut) {
                Some(self.replay(step, &cut, &format!("upto-{k}"))?)
            } else {
                None
            };
            let only: Vec<Vec<&CommRow>> = per_rank
                .iter()
                .map(|evs| evs.iter().filter(|e| e.phase == *phase).copied().collect())
                .collect();
            let simulated = match (t, prev) {
                (Some(t), Some(p)) => Some((t - p).max(0.0)),
                _ => None,
            };
            lines.push(self.line(step, label, Some(phase), simulated, &only));
            prev = t;
        }
        Ok(())
    }
}

/// A temporary directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        gradkit_core::paths::unregister_temp_dir(&self.0);
    }
}

fn tempfile_dir() -> Result<TempDir> {
    let base = std::env::temp_dir();
    for i in 0..1000u32 {
        let d = base.join(format!("gradreport-simulate-{}-{i}", std::process::id()));
        // Registered first: a signal from here on removes it (and ends the smpirun run in it).
        gradkit_core::paths::register_temp_dir(&d);
        if std::fs::create_dir(&d).is_ok() {
            return Ok(TempDir(d));
        }
        gradkit_core::paths::unregister_temp_dir(&d);
    }
    bail!("cannot create a temporary directory in {}", base.display())
}

/// The report as a table; with `--model-n` ([`Ideal`]), two more columns: the formula and
/// the replay over it.
pub fn render(lines: &[Line], with_ideal: bool) -> TextTable {
    let mut head = vec![
        "step",
        "label",
        "phase",
        "simulated_ms",
        "recorded_ms",
        "alpha_beta_ms",
        "sim/alpha_beta",
    ];
    if with_ideal {
        head.extend(["formula_ms", "sim/formula"]);
    }
    let mut t = TextTable::new(head);
    let ms = |s: f64| fmt_num(s * 1e3, 4);
    let ratio = |s: Option<f64>, m: f64| match s {
        Some(s) if m > 0.0 => fmt_num(s / m, 3),
        _ => "-".into(),
    };
    for l in lines {
        let mut row = vec![
            l.step.to_string(),
            l.label.clone(),
            l.phase.clone().unwrap_or_else(|| "(step)".into()),
            l.simulated_s.map_or("-".into(), ms),
            ms(l.recorded_s),
            ms(l.model_s),
            ratio(l.simulated_s, l.model_s),
        ];
        if with_ideal {
            row.push(l.ideal_s.map_or("-".into(), ms));
            row.push(l.ideal_s.map_or("-".into(), |f| ratio(l.simulated_s, f)));
        }
        t.push(row);
    }
    t
}

/// The report as metrics/1 rows: `sim_time_s`, `recorded_time_s`, `model_time_s`, per phase
/// as `name:<phase>`.
pub fn metric_rows(lines: &[Line], algo: &str, ranks: usize) -> Vec<MetricRow> {
    let mut out = Vec::new();
    for l in lines {
        let name = |m: &str| match &l.phase {
            Some(p) => format!("{m}:{p}"),
            None => m.to_string(),
        };
        let mut push = |m: &str, v: f64| {
            out.push(MetricRow {
                run: l.label.clone(),
                tool: "gradreport simulate".into(),
                algo: algo.to_string(),
                world_size: ranks as u32,
                step: l.step,
                rank: 0,
                metric: name(m),
                value: v,
                settings: Default::default(),
            })
        };
        if let Some(s) = l.simulated_s {
            push("sim_time_s", s);
        }
        push("recorded_time_s", l.recorded_s);
        push("model_time_s", l.model_s);
        if let Some(f) = l.ideal_s {
            push("formula_time_s", f);
        }
    }
    out
}

/// `gradreport simulate`.
pub fn run(opts: &SimulateOpts) -> Result<()> {
    // Before anything is read: -o must not replace the recording (through any name).
    gradkit_core::paths::check_distinct(
        &[
            ("RECORDING", Some(opts.recording.as_path())),
            ("--baseline", opts.baseline.as_deref()),
        ],
        &[("-o", opts.output.as_deref())],
    )?;
    let output = match &opts.output {
        Some(p) if p.as_os_str() == "-" => {
            bail!("-o takes a file (the table is on stdout already) (flag -o)")
        }
        Some(p) => Some(Output::for_flag("-o", Some(p))?),
        None => None,
    };
    // A bad profile stops before the replay, not after it.
    let profile = opts
        .step_profile
        .as_deref()
        .map(crate::wholestep::read_profile)
        .transpose()?;
    let (lines, meta, ranks) = simulate(opts)?;
    let baseline = match &opts.baseline {
        Some(b) => Some(simulate(&SimulateOpts {
            recording: b.clone(),
            baseline: None,
            ..opts.clone()
        })?),
        None => None,
    };
    let table = render(&lines, opts.ideal.is_some());
    if let Some(out) = output {
        let Output::Path(path) = &out else {
            bail!("-o takes a file (flag -o)")
        };
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
        {
            gradkit_core::io::write_file_atomic(path, table.render(Format::Csv).as_bytes())?;
        } else {
            let algo = meta.get("algo").unwrap_or("").to_string();
            let mut m = Meta::producer("gradreport");
            m.set("method", "simulate");
            gradkit_core::io::write_table(&out, &m, &metric_rows(&lines, &algo, ranks))?;
        }
    }
    table.print(opts.format)?;
    // The notes follow the table on a terminal, where both streams meet.
    std::io::Write::flush(&mut std::io::stdout())?;
    let algo = meta.get("algo").unwrap_or("").to_string();
    let platform = opts.platform(ranks)?;
    if let Some((base, bmeta, _)) = &baseline {
        let file = opts.baseline.as_deref().map(|p| p.display().to_string());
        let name = bmeta
            .get("algo")
            .map(str::to_string)
            .or(file)
            .unwrap_or_default();
        speedup_note(&lines, base, &name, opts);
    }
    why_note(&lines);
    why_formula_note(&lines);
    if let (Some(prof), Some(path)) = (&profile, &opts.step_profile) {
        whole_step_note(&lines, prof, path, &platform, ranks);
    }
    error_bar_note(&platform, &algo, opts.scale_bytes, ranks);
    Ok(())
}

/// `--step-profile`: the whole step around the replayed exchange (the median step), and the
/// speedup over Dense and DenseOvlp on the same links ([`crate::wholestep`]).
fn whole_step_note(
    lines: &[Line],
    prof: &crate::wholestep::Profile,
    profile: &std::path::Path,
    platform: &crate::simgrid::Platform,
    ranks: usize,
) {
    use crate::wholestep as ws;
    let mut ex: Vec<f64> = step_totals(lines).into_values().collect();
    if ex.is_empty() {
        return;
    }
    ex.sort_by(f64::total_cmp);
    let exchange = ex[ex.len() / 2];
    let (a, b) = (platform.alpha_s(), platform.beta_s_per_byte());
    let (me, ovlp, dense) = (
        ws::whole_s(prof, exchange),
        ws::dense_ovlp_s(prof, ranks, a, b),
        ws::dense_s(prof, ranks, a, b),
    );
    let ms = |s: f64| format!("{:.4} ms", s * 1e3);
    gradkit_core::noteln!(
        "whole step (--step-profile {}, {} parameters): {} = forward {} + backward {} + the exchange {} (replayed, median step; after the backward pass) + optimizer {}; DenseOvlp {} (DDP's buckets of 25 MiB, the first 1 MiB, each ring allreduced when ready, overlapped with the backward pass); Dense {}; speedup over DenseOvlp {:.2}×, over Dense {:.2}×",
        profile.display(),
        prof.numel(),
        ms(me),
        ms(prof.forward_s),
        ms(prof.backward_s()),
        ms(exchange),
        ms(prof.optimizer_s),
        ms(ovlp),
        ms(dense),
        ovlp / me,
        dense / me
    );
}

/// Prints a `why` line for each of `items` (a line, what it is far from and by how much, its
/// reasons; `empty` where it has none), the first ten, then a count of the others (`what`:
/// what they are far from).
fn print_whys(items: &[(&Line, String, &[String])], empty: &str, what: &str) {
    const SHOWN: usize = 10;
    for (l, head, why) in items.iter().take(SHOWN) {
        let reasons = if why.is_empty() {
            empty.to_string()
        } else {
            why.join("; ")
        };
        gradkit_core::noteln!(
            "why {head} at step {} ({}), {}: {reasons}",
            l.step,
            l.label,
            l.phase.as_deref().unwrap_or("the whole step")
        );
    }
    if items.len() > SHOWN {
        gradkit_core::noteln!(
            "why: {} more lines are more than 1.5× from {what}",
            items.len() - SHOWN
        );
    }
}

/// A `why` line for each step or phase whose replay is more than 1.5× from the α-β model.
fn why_note(lines: &[Line]) {
    let items: Vec<(&Line, String, &[String])> = lines
        .iter()
        .filter_map(|l| {
            let ratio = l.simulated_s.unwrap_or(0.0) / l.model_s;
            l.why
                .as_deref()
                .map(|w| (l, format!("sim/α-β = {ratio:.2}"), w))
        })
        .collect();
    let empty = "no message pattern explains it (waiting on other ranks' chains)";
    print_whys(&items, empty, "the α-β model");
}

/// `--model-n`: a `why` line for each step or phase whose replay is more than 1.5× from the
/// papers' formula (or that the formula does not count), saying what the recorded messages add.
fn why_formula_note(lines: &[Line]) {
    let items: Vec<(&Line, String, &[String])> = lines
        .iter()
        .filter_map(|l| {
            let (sim, f) = (l.simulated_s.unwrap_or(0.0), l.ideal_s.unwrap_or(0.0));
            let head = if f > 0.0 {
                format!("sim/formula = {:.2}", sim / f)
            } else {
                format!("{:.4} ms, not in the formula", sim * 1e3)
            };
            l.why_ideal.as_deref().map(|w| (l, head, w))
        })
        .collect();
    let empty =
        "the recorded messages match the formula's terms; the replay's timing of them differs";
    print_whys(&items, empty, "the formula");
}

/// The simulated time of each step (its whole-step line), by step.
fn step_totals(lines: &[Line]) -> std::collections::BTreeMap<u32, f64> {
    lines
        .iter()
        .filter(|l| l.phase.is_none())
        .filter_map(|l| l.simulated_s.map(|s| (l.step, s)))
        .collect()
}

/// `--baseline`: the baseline's simulated step over this recording's, per step both have; the
/// median (min–max).
fn speedup_note(lines: &[Line], base: &[Line], name: &str, opts: &SimulateOpts) {
    let (mine, theirs) = (step_totals(lines), step_totals(base));
    let mut r: Vec<f64> = mine
        .iter()
        .filter_map(|(s, t)| theirs.get(s).filter(|_| *t > 0.0).map(|b| b / t))
        .collect();
    if r.is_empty() {
        gradkit_core::noteln!(
            "note: --baseline {}: no step of it has the same number as a step here; no speedup",
            opts.baseline
                .as_deref()
                .unwrap_or(std::path::Path::new(""))
                .display()
        );
        return;
    }
    r.sort_by(f64::total_cmp);
    gradkit_core::noteln!(
        "speedup over {name} (--baseline, the same platform): {:.2}× (median over {} steps; {:.2}–{:.2}×), the exchange alone",
        r[r.len() / 2],
        r.len(),
        r[0],
        r[r.len() - 1]
    );
}

/// The validated error bar nearest this replay, and where the replay lies outside what was
/// validated ([`crate::validated`]).
fn error_bar_note(platform: &crate::simgrid::Platform, algo: &str, scale: f64, ranks: usize) {
    let e = crate::validated::nearest(platform.link_bps, algo);
    gradkit_core::noteln!(
        "error bar: the calibrated replay of the {} family at {} (the validated rate nearest these links) was within a factor {:.2} of the measured time (median; worst {:.2}, {} rows: docs/RESULTS.md § SimGrid replay)",
        e.family,
        e.rate,
        e.median,
        e.worst,
        e.rows
    );
    let out = crate::validated::outside(platform, algo, scale, ranks);
    if !out.is_empty() {
        gradkit_core::noteln!(
            "warning: this replay lies outside what was validated ({}): the error bar above was not measured here",
            out.join("; ")
        );
    }
}
