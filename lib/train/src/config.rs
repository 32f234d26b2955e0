//! The names gradtrain's configuration is made of, typed: `--exchange`, `--schedule`,
//! `--lookup`, each parsed once at the edge (the tool's flags) into an enum with its name, the
//! reducer it runs and its `--help` line, so the training loop branches on variants, not on
//! strings; and [`TrainConfig`], everything a run needs. The loop, the exchanges and EmbRace's
//! module all read it; it reads only the model's, data's and optimiser's specs.

use std::fmt;
use std::path::PathBuf;

/// Ok-Topk's threshold-reuse policy (`gradtrain --adjust`).
pub use gradkit_collectives::registry::Adjust;
/// Ok-Topk's Step D on re-evaluation steps (`gradtrain --reeval-step-d`).
pub use gradkit_collectives::registry::ReevalStepD;

use crate::data::DataSpec;
use crate::model::ModelSpec;
use crate::optim::{Decay, OptConfig};

/// `FromStr` (exact name, or an old spelling in `ALIASES`; the error lists the known names and
/// the flag) and `Display` (the name) for an enum with `ALL`, `ALIASES` and `name()`.
macro_rules! named {
    ($t:ty, $flag:literal, $suffix:literal) => {
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                <$t>::ALL
                    .iter()
                    .copied()
                    .find(|v| v.name() == s)
                    .or_else(|| {
                        <$t>::ALIASES
                            .iter()
                            .find(|(old, _)| *old == s)
                            .map(|(_, v)| *v)
                    })
                    .ok_or_else(|| {
                        let known: Vec<&str> = <$t>::ALL.iter().map(|v| v.name()).collect();
                        format!(
                            "unknown {} `{s}` (known: {}){}",
                            $flag,
                            known.join(", "),
                            $suffix
                        )
                    })
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

/// How a run exchanges its gradients (`--exchange`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exchange {
    Ring,
    TopkA,
    GaussianK,
    TopkDsa,
    GTopk,
    OkTopk,
    Deft,
    Cltk,
    TopkUnion,
    OneBit,
    Embrace,
    AllGather,
    AllGatherRaw,
}

impl Exchange {
    /// Every exchange, in the order `--help` lists them.
    pub const ALL: &'static [Exchange] = &[
        Exchange::Ring,
        Exchange::TopkA,
        Exchange::GaussianK,
        Exchange::TopkDsa,
        Exchange::GTopk,
        Exchange::OkTopk,
        Exchange::Deft,
        Exchange::Cltk,
        Exchange::TopkUnion,
        Exchange::OneBit,
        Exchange::Embrace,
        Exchange::AllGather,
        Exchange::AllGatherRaw,
    ];

    /// Old spellings `--exchange` still takes: the same algorithm has one name in every tool
    /// (`gradallreduce --algo`) and in the metrics' `algo` column.
    pub const ALIASES: &'static [(&'static str, Exchange)] =
        &[("dense", Exchange::Ring), ("topk", Exchange::TopkA)];

    /// The `--exchange` name: `gradallreduce --algo`'s name of the same algorithm.
    pub const fn name(self) -> &'static str {
        self.entry().0
    }

    /// The gradkit-collectives reducer it runs (`make_reducer`'s name).
    pub const fn algo(self) -> &'static str {
        self.entry().1
    }

    /// One line for `--help`.
    pub const fn description(self) -> &'static str {
        self.entry().2
    }

    const fn entry(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Exchange::Ring => ("ring", "ring", "ring allreduce of the gradients, mean"),
            Exchange::TopkA => (
                "topka",
                "topka",
                "local top-k of residual+gradient, allgatherv (TopkA)",
            ),
            Exchange::GaussianK => (
                "gaussiank",
                "gaussiank",
                "Gaussian-threshold selection, TopkA communication",
            ),
            Exchange::TopkDsa => (
                "topkdsa",
                "topkdsa",
                "SparCML's static regions, sparse/dense allgatherv (TopkDSA)",
            ),
            Exchange::GTopk => (
                "gtopk",
                "gtopk",
                "gTop-k reduction tree keeping top-k per level",
            ),
            Exchange::OkTopk => (
                "oktopk",
                "oktopk",
                "Ok-Topk: split_and_reduce + balance_and_allgatherv (Algorithm 2)",
            ),
            Exchange::Deft => (
                "deft",
                "deft",
                "DEFT: disjoint per-worker partitions, no build-up",
            ),
            Exchange::Cltk => (
                "cltk",
                "cltk",
                "CLT-k: cyclic leader's top-k indices, every rank's values there allreduced",
            ),
            Exchange::TopkUnion => (
                "topk-union",
                "topk-union",
                "Top-k (union): every rank's top-k indices allgathered, all ranks' values at the union allreduced, the union zeroed in every residual",
            ),
            Exchange::OneBit => (
                "onebit",
                "onebit",
                "1-bit compressed allreduce of the momentum (with --optimizer onebit-lamb/onebit-adam)",
            ),
            Exchange::Embrace => (
                "embrace",
                "embrace",
                "EmbRace: token embedding sharded by columns, AlltoAll lookups and row gradients, ring for the rest (--schedule)",
            ),
            Exchange::AllGather => (
                "allgather",
                "embrace",
                "sparse baseline: row-sparse embedding gradients (duplicate rows coalesced first) allgathered onto full replicas, ring for the rest",
            ),
            Exchange::AllGatherRaw => (
                "allgather-raw",
                "embrace",
                "Horovod/DDP sparse baseline: one embedding-gradient row per token (uncoalesced) allgathered onto full replicas, ring for the rest",
            ),
        }
    }

    /// The exchanges of EmbRace's module (the token embedding outside the model's replica).
    pub const fn is_embedding(self) -> bool {
        matches!(
            self,
            Exchange::Embrace | Exchange::AllGather | Exchange::AllGatherRaw
        )
    }

    /// The sparse exchanges (error feedback, `--density`, `--dense-warmup`): every exchange
    /// but dense, onebit and EmbRace's.
    pub const fn is_sparse(self) -> bool {
        !matches!(self, Exchange::Ring | Exchange::OneBit) && !self.is_embedding()
    }

    /// The names of the sparse exchanges, for messages.
    pub fn sparse_names() -> String {
        let names: Vec<&str> = Exchange::ALL
            .iter()
            .filter(|e| e.is_sparse())
            .map(|e| e.name())
            .collect();
        names.join(", ")
    }
}

named!(Exchange, "--exchange", "");

/// The order EmbRace's exchanges run in (`--schedule`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Schedule {
    /// Gradient-generation order; the next forward waits for every exchange.
    #[default]
    Fifo,
    /// Vertical split only (embrace.md Algorithm 1).
    Embrace,
    /// Vertical + horizontal (embrace.md §2.1).
    TwoD,
}

impl Schedule {
    /// Every schedule, in the order `--help` lists them.
    pub const ALL: &'static [Schedule] = &[Schedule::Fifo, Schedule::Embrace, Schedule::TwoD];
    /// No old spellings.
    pub const ALIASES: &'static [(&'static str, Schedule)] = &[];

    /// The `--schedule` name.
    pub const fn name(self) -> &'static str {
        match self {
            Schedule::Fifo => "fifo",
            Schedule::Embrace => "embrace",
            Schedule::TwoD => "2d",
        }
    }

    /// One line for `--help`.
    pub const fn description(self) -> &'static str {
        match self {
            Schedule::Fifo => "gradient-generation order; the next forward waits for every exchange",
            Schedule::Embrace => "vertical split only (embrace.md Algorithm 1): prior embedding rows first, dense next, delayed rows overlapped with the next step's compute",
            Schedule::TwoD => "vertical + horizontal (embrace.md §2.1): `embrace`'s rows, and each dense block allreduced and updated while the next forward runs, which waits per block",
        }
    }
}

named!(Schedule, "--schedule", " (flag --schedule)");

/// How EmbRace's forward lookup sends rows (`--lookup`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Lookup {
    /// The paper's forward AlltoAll: one row slice per token.
    #[default]
    PerToken,
    /// One row slice per distinct token of the receiving rank, expanded by the receiver.
    Unique,
}

impl Lookup {
    /// Every lookup, in the order `--help` lists them.
    pub const ALL: &'static [Lookup] = &[Lookup::PerToken, Lookup::Unique];
    /// No old spellings.
    pub const ALIASES: &'static [(&'static str, Lookup)] = &[];

    /// The `--lookup` name.
    pub const fn name(self) -> &'static str {
        match self {
            Lookup::PerToken => "per-token",
            Lookup::Unique => "unique",
        }
    }

    /// One line for `--help`.
    pub const fn description(self) -> &'static str {
        match self {
            Lookup::PerToken => "the paper's forward AlltoAll: one row slice per token",
            Lookup::Unique => {
                "one row slice per distinct token of the receiving rank, expanded by the receiver"
            }
        }
    }
}

named!(Lookup, "--lookup", " (flag --lookup)");

/// Everything a run needs.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub model: ModelSpec,
    pub data: DataSpec,
    pub exchange: Exchange,
    pub density: f64,
    /// Sparse exchanges: the first `dense_warmup` steps exchange densely (ring allreduce,
    /// mean, the optimiser on it exactly as `--exchange dense`), then the sparse exchange
    /// starts with zero residuals. The Ok-Topk reference code uses 512 (VGG), 128 (LSTM).
    pub dense_warmup: u32,
    /// Ok-Topk τ and τ'.
    pub period: u32,
    pub reeval: u32,
    /// Ok-Topk: the threshold-reuse policy (`--adjust`; default ladder).
    pub adjust: Adjust,
    /// Ok-Topk: Step D on re-evaluation steps (`--reeval-step-d`; default skip).
    pub reeval_step_d: ReevalStepD,
    pub opt: OptConfig,
    pub lr: f32,
    pub warmup: u32,
    pub decay: Decay,
    pub steps: u32,
    /// Examples (sequences) per rank per step.
    pub batch: usize,
    pub seed: u64,
    /// 0: evaluate only at the end.
    pub eval_every: u32,
    /// 0: check parameters only at the end.
    pub check_every: u32,
    pub checkpoint: Option<PathBuf>,
    pub checkpoint_every: u32,
    pub resume: bool,
    /// A fresh run may use a `checkpoint` directory that holds another run's checkpoints:
    /// they are removed at this run's first checkpoint (until then they stay, so a run that
    /// fails early loses nothing). Without it such a directory is refused.
    pub overwrite_checkpoint: bool,
    /// Stop (as if interrupted) after this many steps; for tests of `--resume`.
    pub stop_after: Option<u32>,
    pub quiet: bool,
    pub run_name: String,
    /// Keep every rank's local gradient of every step ([`dump_gradients`]).
    pub record_gradients: bool,
    /// Test hook: perturb rank 1's parameters after this step (checks the checksum).
    pub corrupt_at: Option<u32>,
    /// `--exchange embrace`: communication schedule, `fifo`, `embrace` (vertical) or `2d`
    /// (vertical + horizontal) (crate::embrace, crate::schedule).
    pub schedule: Schedule,
    /// `--exchange embrace`: the forward lookup, `per-token` (the paper's) or `unique`
    /// (deduplicated, [`Lookup::Unique`]).
    pub lookup: Lookup,
    /// Record `peak_rss_bytes` (this process's peak RSS so far) per step and rank (`--rss`;
    /// off by default: it differs from run to run).
    pub record_rss: bool,
    /// Dense allreduces (`--exchange dense`, warm-ups, EmbRace's dense part) send fp16 values
    /// (`--wire fp16`, [`gradkit_collectives::dense::ring_fp16`]) instead of f32.
    pub fp16_wire: bool,
    /// The `--metrics` file: rank 0 appends the rows gathered every `metrics_every` steps (0:
    /// never) and at each checkpoint, so a killed run keeps its finished steps, and completes
    /// it at the end. Stdout or a device is not written by the run: the caller writes the
    /// final table from [`TrainReport::metrics`].
    pub metrics_path: Option<PathBuf>,
    pub metrics_every: u32,
    /// Whether [`TrainReport::metrics`] holds every row of the run (memory that grows with
    /// the run: a library caller's choice; `gradtrain` keeps them only for a `--metrics` that
    /// goes to stdout or a device). The summary's means never need them.
    pub keep_metrics: bool,
    /// Key-value metadata of the `--metrics` file and of a checkpoint's `metrics.parquet`.
    pub metrics_meta: gradkit_core::Meta,
    /// Record every message of every step (commtrace/1) to this file (`--comm-trace`).
    pub comm_trace: Option<PathBuf>,
    /// The exchange's selection and compression kernels (`--device`; the CPU reference by
    /// default): the reducers' `Params::kernels`.
    pub kernels: &'static dyn gradkit_sparsify::kernels::Kernels,
    /// A device that keeps the sparse exchanges' tensors resident (`Params::resident`,
    /// docs/GPU.md §7); `None`: host memory.
    pub resident: Option<&'static dyn gradkit_sparsify::resident::DeviceKernels>,
    /// Sparse exchanges: measure ξ of Ok-Topk's Assumption 1 every step (`--xi`, [`crate::xi`]).
    pub xi: bool,
    /// Opens the `Comm` each rank's loop runs over, given the world's (`gradtrain --backend
    /// nccl`: gradkit-cuda's NCCL backend); `None`: the world's own.
    pub open_comm: Option<OpenComm>,
}

/// A rank's `Comm` opened over the world's, or `None` to use the world's own.
pub type OpenComm =
    fn(&dyn gradkit_comm::Comm) -> anyhow::Result<Option<Box<dyn gradkit_comm::Comm>>>;

impl TrainConfig {
    /// The run's name when `--run` is not given: the exchange as the metrics' `algo` column
    /// names it (`ring-fp16` with `--wire fp16`), the density where it selects, the
    /// optimiser unless it is plain SGD, and EmbRace's schedule unless it is FIFO:
    /// `oktopk-d0.01`, `ring-adam`, `onebit-lamb`, `embrace-2d`.
    pub fn default_run_name(&self) -> String {
        use gradkit_core::cli::{default_run_name, Keep};
        let mut parts: Vec<String> = Vec::new();
        let keep = self
            .exchange
            .is_sparse()
            .then_some(Keep::Density(self.density));
        match self.exchange {
            // The 1-bit optimisers name the exchange already.
            Exchange::OneBit => {}
            Exchange::Ring if self.fp16_wire => parts.push("ring-fp16".into()),
            e => parts.push(default_run_name(e.name(), keep)),
        }
        if self.opt.name != "sgd" || parts.is_empty() {
            parts.push(self.opt.name.clone());
        }
        if self.exchange.is_embedding() && self.schedule != Schedule::Fifo {
            parts.push(self.schedule.name().into());
        }
        parts.join("-")
    }
}

impl TrainConfig {
    /// The settings every metrics row carries as columns.
    pub fn run_settings(&self) -> gradkit_core::RunSettings {
        gradkit_core::RunSettings {
            density: self.exchange.is_sparse().then_some(self.density),
            optimizer: Some(self.opt.name.clone()),
            model: Some(self.model.name.clone()),
            seed: Some(self.seed),
        }
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: ModelSpec::default(),
            data: DataSpec::default(),
            exchange: Exchange::Ring,
            density: 0.01,
            dense_warmup: 0,
            period: 64,
            reeval: 32,
            adjust: Default::default(),
            reeval_step_d: Default::default(),
            opt: OptConfig::default(),
            lr: 0.1,
            warmup: 0,
            decay: Decay::None,
            steps: 100,
            batch: 32,
            seed: 0,
            eval_every: 0,
            check_every: 50,
            checkpoint: None,
            checkpoint_every: 0,
            resume: false,
            overwrite_checkpoint: false,
            stop_after: None,
            quiet: true,
            run_name: "run".into(),
            record_gradients: false,
            corrupt_at: None,
            schedule: Schedule::Embrace,
            lookup: Lookup::PerToken,
            record_rss: false,
            fp16_wire: false,
            metrics_path: None,
            metrics_every: 0,
            keep_metrics: true,
            metrics_meta: gradkit_core::Meta::default(),
            comm_trace: None,
            kernels: gradkit_sparsify::kernels::cpu(),
            resident: None,
            xi: false,
            open_comm: None,
        }
    }
}
