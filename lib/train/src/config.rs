//! The names gradtrain's configuration is made of, typed: `--exchange`, `--schedule`,
//! `--lookup`, each parsed once at the edge (the tool's flags) into an enum with its name, the
//! reducer it runs and its `--help` line, so the training loop branches on variants, not on
//! strings; and [`TrainConfig`], everything a run needs. The loop, the exchanges and EmbRace's
//! module all read it; it reads only the model's, data's and optimiser's specs.

use std::fmt;
use std::path::PathBuf;
use std::sync::LazyLock;

use gradkit_collectives::{Algo, AsExchange, Family, Knob};

/// Ok-Topk's threshold-reuse policy (`gradtrain --adjust`).
pub use gradkit_collectives::registry::Adjust;
/// Ok-Topk's Step D on re-evaluation steps (`gradtrain --reeval-step-d`).
pub use gradkit_collectives::registry::ReevalStepD;

use crate::data::DataSpec;
use crate::model::ModelSpec;
use crate::optim::{Decay, Method, OptConfig};

/// How a run exchanges its gradients (`--exchange`): an algorithm of gradkit-collectives
/// that gradtrain runs (its descriptor's [`AsExchange`]: the help line, old spellings), or
/// one of EmbRace's AllGather baselines, which only gradtrain has (the token embedding outside
/// the model's replica, [`crate::embrace`]). The loop tells them apart by family (dense,
/// sparse, compressed, embedding) and by the options an algorithm reads, never by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exchange {
    /// A reducer of gradkit-collectives.
    Algo(Algo),
    /// EmbRace's sparse baseline: row-sparse embedding gradients allgathered onto full
    /// replicas, duplicate rows coalesced first (`allgather`), or one row per token
    /// (`allgather-raw`, as Horovod and PyTorch DDP send them); a ring for the rest.
    AllGather { raw: bool },
}

/// The exchanges, in the order `--help` lists them: the registry's, then the baselines.
static ALL: LazyLock<Vec<Exchange>> = LazyLock::new(|| {
    Algo::ALL
        .iter()
        .filter(|a| a.descriptor().exchange.is_some())
        .map(|a| Exchange::Algo(*a))
        .chain([
            Exchange::AllGather { raw: false },
            Exchange::AllGather { raw: true },
        ])
        .collect()
});

/// gradtrain's old spellings of the exchanges (their descriptors' [`AsExchange::aliases`]).
static ALIASES: LazyLock<Vec<(&'static str, Exchange)>> = LazyLock::new(|| {
    Exchange::all()
        .iter()
        .filter_map(|e| Some((e.as_exchange()?.aliases, *e)))
        .flat_map(|(old, e)| old.iter().map(move |o| (*o, e)))
        .collect()
});

impl Exchange {
    /// Every exchange, in the order `--help` lists them.
    pub fn all() -> &'static [Exchange] {
        &ALL
    }

    /// Old spellings `--exchange` still takes: the same algorithm has one name in every tool
    /// (`gradallreduce --algo`) and in the metrics' `algo` column.
    pub fn aliases() -> &'static [(&'static str, Exchange)] {
        &ALIASES
    }

    fn as_exchange(self) -> Option<&'static AsExchange> {
        match self {
            Exchange::Algo(a) => a.descriptor().exchange.as_ref(),
            Exchange::AllGather { .. } => None,
        }
    }

    /// The `--exchange` name: `gradallreduce --algo`'s name of the same algorithm.
    pub fn name(self) -> &'static str {
        match self {
            Exchange::Algo(a) => a.name(),
            Exchange::AllGather { raw: false } => "allgather",
            Exchange::AllGather { raw: true } => "allgather-raw",
        }
    }

    /// The gradkit-collectives algorithm it runs (the baselines: EmbRace's module, whose
    /// dense part is the ring).
    pub fn algo(self) -> Algo {
        match self {
            Exchange::Algo(a) => a,
            Exchange::AllGather { .. } => Algo(&gradkit_collectives::alltoall::DESCRIPTOR),
        }
    }

    /// One line for `--help`.
    pub fn description(self) -> &'static str {
        match self {
            Exchange::Algo(a) => self.as_exchange().map_or(a.description(), |x| x.help),
            Exchange::AllGather { raw: false } => "sparse baseline: row-sparse embedding gradients (duplicate rows coalesced first) allgathered onto full replicas, ring for the rest",
            Exchange::AllGather { raw: true } => "Horovod/DDP sparse baseline: one embedding-gradient row per token (uncoalesced) allgathered onto full replicas, ring for the rest",
        }
    }

    /// What kind of data it moves (the baselines: embedding rows).
    pub fn family(self) -> Family {
        self.algo().family()
    }

    /// Whether the algorithm reads `knob` (the baselines read none).
    pub fn reads(self, knob: Knob) -> bool {
        matches!(self, Exchange::Algo(a) if a.reads(knob))
    }

    /// The dense exchange (the ring, mean).
    pub fn is_dense(self) -> bool {
        self.family() == Family::Dense
    }

    /// The 1-bit exchange of the momentum (with a 1-bit optimiser).
    pub fn is_compressed(self) -> bool {
        self.family() == Family::Compressed
    }

    /// The exchanges of EmbRace's module (the token embedding outside the model's replica).
    pub fn is_embedding(self) -> bool {
        self.family() == Family::Embedding
    }

    /// EmbRace itself (the embedding sharded by columns, AlltoAll), not its baselines.
    pub fn is_embrace(self) -> bool {
        matches!(self, Exchange::Algo(a) if a.family() == Family::Embedding)
    }

    /// The sparse exchanges (error feedback, `--density`, `--dense-warmup`).
    pub fn is_sparse(self) -> bool {
        self.family() == Family::Sparse
    }

    /// The names of the sparse exchanges, for messages.
    pub fn sparse_names() -> String {
        let names: Vec<&str> = Exchange::all()
            .iter()
            .filter(|e| e.is_sparse())
            .map(|e| e.name())
            .collect();
        names.join(", ")
    }
}

/// The dense ring (gradtrain's default `--exchange`).
impl Default for Exchange {
    fn default() -> Self {
        Exchange::Algo(Algo(&gradkit_collectives::dense::RING))
    }
}

impl std::str::FromStr for Exchange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let all = Exchange::all();
        gradkit_core::named::parse(
            "--exchange",
            s,
            all,
            Exchange::name,
            Exchange::aliases(),
            "",
        )
    }
}

impl fmt::Display for Exchange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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

gradkit_core::named!(Schedule, "--schedule", suffix = " (flag --schedule)");

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

gradkit_core::named!(Lookup, "--lookup", suffix = " (flag --lookup)");

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
            e if e.is_compressed() => {}
            e if e.is_dense() && self.fp16_wire => parts.push(
                gradkit_collectives::dense::with_fp16_wire(e.algo())
                    .name()
                    .into(),
            ),
            e => parts.push(default_run_name(e.name(), keep)),
        }
        if self.opt.method != Method::Sgd || parts.is_empty() {
            parts.push(self.opt.method.name().into());
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
            optimizer: Some(self.opt.method.name().into()),
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
            exchange: Exchange::default(),
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
