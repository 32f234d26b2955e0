//! gradreport's command-line vocabulary that is not the subcommands themselves: the
//! `simulate` flags ([`SimulateArgs`], checked into the library's
//! [`gradkit_report::simulate::SimulateOpts`]). The library's option enums (`plot::Kind`,
//! `export::FigFormat`, `figdata::XAxis`, `metrics::Stat`) carry their names and help lines
//! themselves; clap lists them through `gradkit_core::cli::named`.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use gradkit_core::cli::Format;
use gradkit_report::simgrid::{self, Compute, Platform, Topology};
use gradkit_report::simulate::{
    check_piecewise, check_smpi_cfg, parse_rate, parse_time, SimulateOpts, MAX_NODES,
};

/// `gradreport simulate`'s flags (docs/SIMULATE.md).
#[derive(Args, Clone, Debug)]
pub struct SimulateArgs {
    /// A commtrace/1 recording (gradallreduce, bench or gradtrain `--comm-trace`)
    #[arg(value_name = "RECORDING")]
    pub recording: PathBuf,
    /// The network: flat (one switch), fat-tree or dragonfly
    #[arg(long, value_name = "flat|fat-tree|dragonfly", default_value = "flat")]
    pub topology: String,
    /// Host link rate: e.g. 1Gbps, 100Mbps, 100Gbps, 12.5MBps (bits with `bps`, bytes with
    /// `Bps`; `mbit`/`gbit` as the shaped cluster's RATE)
    #[arg(long, value_name = "RATE", default_value = "10Gbps")]
    pub link_rate: String,
    /// Host link latency: e.g. 5us, 50us, 1ms
    #[arg(long, value_name = "TIME", default_value = "5us")]
    pub latency: String,
    /// Ranks per node (GPUs per node): ranks of one node talk over its loopback
    /// (--intra-rate, --intra-latency)
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub hosts_per_node: usize,
    /// Within a node: rate and latency
    #[arg(long, value_name = "RATE", default_value = "100GBps")]
    pub intra_rate: String,
    #[arg(long, value_name = "TIME", default_value = "1us")]
    pub intra_latency: String,
    /// Nodes of the platform (default: as many as the ranks need; a fat tree or dragonfly
    /// rounds up to its shape)
    #[arg(long, value_name = "N")]
    pub nodes: Option<usize>,
    /// SimGrid FAT_TREE parameters LEVELS;DOWN,…;UP,…;COUNT,… (default: 2 levels, 16 nodes
    /// per leaf, full bisection)
    #[arg(long, value_name = "PARAMS")]
    pub fat_tree: Option<String>,
    /// SimGrid DRAGONFLY parameters G,L;C,L;R,L;N (default: after Cray Aries, 4 nodes per
    /// router, 16 routers per chassis, 6 chassis per group)
    #[arg(long, value_name = "PARAMS")]
    pub dragonfly: Option<String>,
    /// SMPI's piecewise bandwidth factors (`smpi/bw-factor`, e.g. `65472:0.94;0:0.8`); the
    /// default 0:1 is the bare link (calibrate: docs/SIMULATE.md)
    #[arg(long, value_name = "FACTORS", default_value = "0:1")]
    pub bw_factor: String,
    /// SMPI's piecewise latency factors (`smpi/lat-factor`)
    #[arg(long, value_name = "FACTORS", default_value = "0:1")]
    pub lat_factor: String,
    /// More SimGrid configuration, KEY:VALUE (repeatable), e.g. network/crosstraffic:1 (the
    /// reverse traffic of TCP acknowledgements, off by default here)
    #[arg(long = "smpi-cfg", value_name = "KEY:VALUE")]
    pub smpi_cfg: Vec<String>,
    /// Multiply every message's size by this (a target model size: sizes proportional to the
    /// gradient, as dense and density-proportional sparse ones are, scale linearly)
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    pub scale_bytes: f64,
    /// Compute between the calls: recorded, none, or SECONDS per step on every rank
    #[arg(long, value_name = "recorded|none|SECONDS", default_value = "recorded")]
    pub compute: String,
    /// Replay only these steps (comma-separated; default: every step)
    #[arg(long, value_name = "STEPS", value_delimiter = ',')]
    pub steps: Option<Vec<u32>>,
    /// The step's total only, no per-phase replays
    #[arg(long)]
    pub no_phases: bool,
    /// Keep the TI traces and platform files here (default: a temporary directory)
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,
    /// Also write the rows here: metrics/1 Parquet, or CSV when the name ends in .csv
    #[arg(short = 'o', long, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// How the table is printed on stdout
    #[arg(long, value_enum, default_value_t = Format::Md)]
    pub format: Format,
    /// Another recording (dense, say) replayed on the same platform: prints the speedup
    /// over it, step by step
    #[arg(long, value_name = "RECORDING")]
    pub baseline: Option<PathBuf>,
    /// A step's compute (CSV `name,numel,ms`: rows forward, optimizer, and each layer in the
    /// order its gradient is ready): prints the whole step around the exchange and its
    /// speedup over Dense and DenseOvlp (DDP's 25 MiB buckets overlapped with the backward
    /// pass) on the same links
    #[arg(long, value_name = "CSV")]
    pub step_profile: Option<PathBuf>,
    /// The model's size n in elements (after any --scale-bytes; SI's decimal multiples, 110M,
    /// or binary ones, 16Mi): adds the papers' idealised formula per step and phase
    /// (`gradallreduce model`'s, on these links and ranks) beside the replay, and says why a
    /// line is more than 1.5× from it (latency terms, bytes, imbalance, control, network)
    #[arg(long, value_name = "N")]
    pub model_n: Option<String>,
    /// Density k/n of the formula's model (with --model-n)
    #[arg(long, value_name = "D", requires = "model_n", default_value_t = gradkit_core::keep::DEFAULT_DENSITY)]
    pub density: f64,
}

impl SimulateArgs {
    /// Checks made on the command line alone (usage errors).
    fn check(&self) -> Result<(Platform, Compute)> {
        let link = parse_rate(&self.link_rate, "--link-rate")?;
        let lat = parse_time(&self.latency, "--latency")?;
        let intra = parse_rate(&self.intra_rate, "--intra-rate")?;
        let ilat = parse_time(&self.intra_latency, "--intra-latency")?;
        if self.hosts_per_node == 0 {
            bail!("--hosts-per-node must be at least 1 (flag --hosts-per-node)");
        }
        if self.hosts_per_node > MAX_NODES {
            bail!(
                "--hosts-per-node {} is more than the {MAX_NODES} ranks a node may have (flag --hosts-per-node)",
                self.hosts_per_node
            );
        }
        match self.nodes {
            Some(0) => bail!("--nodes must be at least 1 (flag --nodes)"),
            Some(n) if n > MAX_NODES => bail!(
                "--nodes {n} is more than the {MAX_NODES} nodes a replay may have (SimGrid builds every host and route of the platform: 10^6 nodes took 97 s and 4 GB before the first event) (flag --nodes)"
            ),
            _ => {}
        }
        if !(self.scale_bytes.is_finite() && self.scale_bytes > 0.0) {
            bail!(
                "--scale-bytes must be a number > 0, got {} (flag --scale-bytes)",
                self.scale_bytes
            );
        }
        check_piecewise(&self.bw_factor, "--bw-factor", false)?;
        check_piecewise(&self.lat_factor, "--lat-factor", false)?;
        for c in &self.smpi_cfg {
            check_smpi_cfg(c)?;
        }
        let compute = match self.compute.as_str() {
            "recorded" => Compute::Recorded,
            "none" => Compute::None,
            s => match s.parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => Compute::PerStep(v),
                _ => bail!("--compute takes recorded, none or a number of seconds ≥ 0, got `{s}` (flag --compute)"),
            },
        };
        let topology = match self.topology.as_str() {
            "flat" => Topology::Flat,
            "fat-tree" => Topology::FatTree(String::new()),
            "dragonfly" => Topology::Dragonfly(String::new()),
            t => bail!(
                "unknown --topology `{t}` (known: flat, fat-tree, dragonfly) (flag --topology)"
            ),
        };
        if self.fat_tree.is_some() && !matches!(topology, Topology::FatTree(_)) {
            bail!("--fat-tree applies to --topology fat-tree only (flag --fat-tree)");
        }
        if self.dragonfly.is_some() && !matches!(topology, Topology::Dragonfly(_)) {
            bail!("--dragonfly applies to --topology dragonfly only (flag --dragonfly)");
        }
        let given = [
            self.fat_tree.clone().map(Topology::FatTree),
            self.dragonfly.clone().map(Topology::Dragonfly),
        ];
        for t in given.into_iter().flatten() {
            let flag = format!("--{}", t.name());
            match simgrid::topology_hosts(&t)? {
                Some(h) if h > MAX_NODES => bail!(
                    "{flag} describes {h} nodes, more than the {MAX_NODES} nodes a replay may have (flag {flag})"
                ),
                _ => {}
            }
        }
        Ok((
            Platform {
                topology,
                hosts: 0,
                ranks_per_host: self.hosts_per_node,
                link_bps: link,
                latency_s: lat,
                intra_bps: intra,
                intra_latency_s: ilat,
            },
            compute,
        ))
    }

    /// The library's options, every usage check made ([`SimulateArgs::check`]).
    pub fn options(&self) -> Result<SimulateOpts> {
        let (platform, compute) = self.check()?;
        if let Err(e) = gradkit_core::keep::Keep::density(self.density) {
            bail!("{e} (flag --density)");
        }
        Ok(SimulateOpts {
            recording: self.recording.clone(),
            platform,
            compute,
            nodes: self.nodes,
            fat_tree: self.fat_tree.clone(),
            dragonfly: self.dragonfly.clone(),
            bw_factor: self.bw_factor.clone(),
            lat_factor: self.lat_factor.clone(),
            smpi_cfg: self.smpi_cfg.clone(),
            scale_bytes: self.scale_bytes,
            steps: self.steps.clone(),
            no_phases: self.no_phases,
            keep: self.keep.clone(),
            output: self.output.clone(),
            format: self.format,
            baseline: self.baseline.clone(),
            step_profile: self.step_profile.clone(),
            ideal: match &self.model_n {
                Some(n) => match gradkit_core::budget::parse_count(n) {
                    Ok(0) => bail!("--model-n must be at least 1 element (flag --model-n)"),
                    Ok(v) => Some((v, self.density)),
                    Err(e) => bail!("--model-n: {e} (flag --model-n)"),
                },
                None => None,
            },
        })
    }
}
