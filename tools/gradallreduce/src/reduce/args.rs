//! `gradallreduce`'s flags (`ReduceArgs`), their value parsers, and the checks made on the
//! command line alone, before any rank starts.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValue, TypedValueParser};
use clap::Args;
use gradkit_collectives::registry::{Adjust, Balance, ReevalStepD, Split};
use gradkit_collectives::{Algo, Knob, Op, Params};
use gradkit_core::cli::IoArgs;
use gradkit_core::keep::{Keep, DEFAULT_DENSITY};
use gradkit_core::{read_table, Input, PlanRow};

#[derive(Args, Clone, Debug)]
pub struct ReduceArgs {
    #[command(flatten)]
    pub io: IoArgs,
    /// Allreduce algorithm (see the list below)
    #[arg(long, default_value_t = Algo::ALL[0], value_parser = AlgoParser)]
    pub algo: Algo,
    /// Wire format of the dense ring: fp16 halves the bytes (`--algo ring --wire fp16` is
    /// `ring-fp16`, gradtrain's spelling of it)
    #[arg(hide_short_help = true, long, value_name = "f32|fp16", default_value = "f32", value_parser = ["f32", "fp16"])]
    pub wire: String,
    /// sum or mean (the sum divided by P); not for the 1-bit algorithms, which always average
    #[arg(hide_short_help = true, long, default_value_t = Op::Sum, value_parser = gradkit_core::cli::named(Op::ALL, Op::name, Op::help))]
    pub op: Op,
    /// Ranks P to run: in-process ranks (threads) when not started by mpirun, where MPI
    /// gives the count; must equal the trace's ranks [default: the trace's ranks; 1 for stdin]
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Write per-rank, per-step traffic and timing (metrics/1) here (`-`: stdout)
    #[arg(long, value_name = "PATH")]
    pub metrics: Option<PathBuf>,
    /// Run name recorded in the metrics [default: the algorithm, and what a sparse one keeps:
    /// `topka-d0.01`, `oktopk-k1000`, `ring`]
    #[arg(long)]
    pub run: Option<String>,
    /// Record every message of every step (commtrace/1) here, for `gradreport simulate`
    #[arg(long, value_name = "PATH")]
    pub comm_trace: Option<PathBuf>,
    /// Density for algorithms that select from dense input (0 < d ≤ 1)
    #[arg(long, default_value_t = DEFAULT_DENSITY)]
    pub density: f64,
    /// Select exactly K entries instead of --density
    #[arg(long)]
    pub k: Option<u64>,
    /// Ok-Topk: space repartition period τ, in steps
    #[arg(hide_short_help = true, long, default_value_t = 64)]
    pub period: u32,
    /// Ok-Topk: global threshold re-evaluation period τ', in steps
    #[arg(hide_short_help = true, long, default_value_t = 32)]
    pub reeval: u32,
    /// Ok-Topk: threshold reuse between re-evaluations: ladder (default: count ladder, global
    /// count closest to k with ≤ 4k/3 passing, one integer allreduce per reuse step), paper
    /// (Algorithm 1: reused unchanged), reference (the authors' ×1.03 loop and count bands;
    /// vgg = reference, lstm, bert pick the bands)
    #[arg(hide_short_help = true, long, value_name = "POLICY", default_value = "ladder", value_parser = clap::builder::PossibleValuesParser::new(Adjust::NAMES))]
    pub adjust: String,
    /// Ok-Topk: data balancing in balance_and_allgatherv
    #[arg(hide_short_help = true, long, default_value_t = Balance::Auto, value_parser = gradkit_core::cli::named(Balance::ALL, Balance::name, Balance::help))]
    pub balance: Balance,
    /// Ok-Topk: Step D on the re-evaluation steps (every --reeval steps): skip (the authors'
    /// code: the exact top-k of the gathered values is the result) or run (Algorithm 1 line 13
    /// on every step)
    #[arg(hide_short_help = true, long, default_value_t = ReevalStepD::Skip, value_parser = gradkit_core::cli::named(ReevalStepD::ALL, ReevalStepD::name, ReevalStepD::help))]
    pub reeval_step_d: ReevalStepD,
    /// A plan/1 file (gradpartition) for oktopk regions or DEFT ranges
    #[arg(long, value_name = "PLAN")]
    pub plan: Option<PathBuf>,
    /// No error feedback in the algorithms' own selection of dense input
    #[arg(hide_short_help = true, long)]
    pub no_residual: bool,
    /// 1-bit: load and save worker/server error buffers here
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// AlltoAll: split embedding tables by columns (the paper) or rows
    #[arg(hide_short_help = true, long, default_value_t = Split::Columns, value_parser = gradkit_core::cli::named(Split::ALL, Split::name, Split::help))]
    pub split: Split,
    /// Seed for algorithms with randomness
    #[arg(hide_short_help = true, long, default_value_t = 0)]
    pub seed: u64,
    /// Where selection and compression run: cpu, or cuda / cuda:N (a build with
    /// `--features cuda` on a GPU node: gradkit's CUDA kernels, compiled at start by NVRTC;
    /// without a usable GPU it stops with one line saying why — docs/GPU.md)
    #[arg(long, value_name = "cpu|cuda[:N]", default_value = "cpu", value_parser = gradkit_cuda::Device::parse_flag)]
    pub device: gradkit_cuda::Device,
    /// Which backend carries the reducer's messages: mpi (MPI under mpirun, in-process
    /// threads otherwise) or nccl (a `--features cuda` build on a GPU node with NCCL, one
    /// GPU per rank by local rank; the trace's feed stays on MPI — docs/GPU.md)
    #[arg(long, value_name = "mpi|nccl", default_value = "mpi", value_parser = gradkit_cuda::backend::parse)]
    pub backend: gradkit_cuda::backend::CommBackend,
    #[command(flatten)]
    pub memory: gradkit_core::budget::MemoryArgs,
}

/// `--algo`'s values, from [`Algo::ALL`]: `--help` lists every name with its family and
/// description; a typo is a usage error (exit 2) that lists the known names.
#[derive(Clone)]
pub(super) struct AlgoParser;

impl TypedValueParser for AlgoParser {
    type Value = Algo;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> std::result::Result<Algo, clap::Error> {
        let given = value.to_string_lossy();
        let algo = given.parse::<Algo>().map_err(|e| {
            clap::Error::raw(clap::error::ErrorKind::InvalidValue, format!("{e}\n")).with_cmd(cmd)
        })?;
        gradkit_core::cli::note_old_spelling("--algo", &given, algo.name());
        Ok(algo)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(Algo::ALL.iter().map(|a| {
            PossibleValue::new(a.name()).help(format!("{}: {}", a.family(), a.description()))
        })))
    }
}

impl ReduceArgs {
    /// Checks made on the command line alone, before any rank starts: ranges, and flags given
    /// for an algorithm that does not read them (refused rather than silently ignored).
    pub fn check_flags(&self, m: &clap::ArgMatches) -> Result<()> {
        gradkit_comm::launch::check_ranks_flag(self.ranks)?;
        if let Err(e) = Keep::density(self.density) {
            bail!("{e} (flag --density)");
        }
        if let Some(Err(e)) = self.k.map(Keep::count) {
            bail!("{e} (flag --k)");
        }
        if self.state.as_deref().is_some_and(|p| p.as_os_str() == "-") {
            bail!("--state names a file that is read and written back, which stdin/stdout cannot be: give --state FILE (flag --state)");
        }
        if self.period == 0 || self.reeval == 0 {
            bail!("--period and --reeval must be at least 1");
        }
        let algo = self.algo;
        // A flag the algorithm does not read would be ignored: refused, from its descriptor.
        for knob in Knob::REFUSED {
            if gradkit_core::cli::given(m, knob.id()) && !algo.reads(*knob) {
                bail!(
                    "{} applies to --algo {} only, not --algo {algo} (it would be ignored)",
                    knob.flag(),
                    knob.readers().join(" or ")
                );
            }
        }
        if self.wire == "fp16" && !algo.reads(Knob::Wire) {
            bail!("--wire fp16 applies to --algo ring only, not --algo {algo} (flag --wire)");
        }
        if gradkit_core::cli::given(m, "op") && !algo.reads(Knob::Op) {
            bail!("--op does not apply to --algo {algo}: the 1-bit allreduce always averages (its result is the mean)");
        }
        Ok(())
    }

    /// What a sparse algorithm keeps of dense input (`--k`, else `--density`); nothing for the
    /// others.
    pub fn keep(&self) -> Option<Keep> {
        (self.algo.family() == gradkit_collectives::Family::Sparse).then_some(match self.k {
            Some(k) => Keep::K(k),
            None => Keep::Density(self.density),
        })
    }

    /// The algorithm `--algo` and `--wire` name together (`ring` + `fp16` is `ring-fp16`).
    pub fn resolve_wire(&mut self) {
        if self.wire == "fp16" {
            self.algo = gradkit_collectives::dense::with_fp16_wire(self.algo);
        }
    }

    pub(super) fn params(&self) -> Result<Params> {
        let plan = match &self.plan {
            None => None,
            Some(p) => {
                Some(read_table::<PlanRow>(&Input::Path(p.clone()), Default::default())?.rows)
            }
        };
        Ok(Params {
            op: self.op,
            keep: self.k.map_or(Keep::Density(self.density), Keep::K),
            period: self.period,
            reeval: self.reeval,
            adjust: Adjust::parse(&self.adjust).context("--adjust")?,
            balance: self.balance,
            reeval_step_d: self.reeval_step_d,
            plan,
            residual: !self.no_residual,
            split: self.split,
            seed: self.seed,
            ..Params::default()
        })
    }
}
