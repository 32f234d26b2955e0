//! gradtrace: make, import and inspect gradient traces (`tensor/1` Parquet tables).

/// Large blocks mapped on huge pages and handed back when freed (docs/MEMORY.md).
#[global_allocator]
static ALLOC: gradkit_core::alloc::BigAlloc = gradkit_core::alloc::BigAlloc;

mod import;
mod inspect;
mod model;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use gradkit_core::cli::{self, Format};
use gradkit_core::io::{Meta, Output, ReadOptions, TableWriter, TensorStream};
use gradkit_core::synth::{self, SynthSpec};
use gradkit_core::TensorRow;

const ABOUT: &str = "Make, import and inspect gradient traces (tensor/1 Parquet tables).

A trace holds one row per step × rank × layer: the gradient a worker computed for one
parameter tensor at one training step. Every other gradkit tool reads and writes this table
(docs/FORMAT.md), so a trace made here can be selected, partitioned and all-reduced.";

const AFTER: &str = "Examples:
  # 4 workers, 10 steps of VGG-16 gradients at 1/10 size, summarised
  gradtrace synthetic --shape vgg16 --scale 0.1 --ranks 4 --steps 10 --seed 1 | gradtrace inspect

  # a custom model, written to a file
  gradtrace synthetic --layers 'fc1.weight=512x784,fc1.bias=512' --ranks 2 --steps 3 -o g.parquet

  # gradients dumped from PyTorch (step<S>_rank<R>.safetensors, see docs/gradtrace.md)
  gradtrace import dumps/ -o real.parquet && gradtrace inspect real.parquet --format csv";

#[derive(Parser, Debug)]
#[command(name = "gradtrace", version, about = ABOUT, long_about = ABOUT, after_help = AFTER)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    Synthetic(SyntheticArgs),
    Import(import::ImportArgs),
    Inspect(InspectArgs),
    Cat(CatArgs),
    Expand(ExpandArgs),
    /// Dump the real per-rank gradients of a few training steps of a gradtrain model
    Model(model::ModelArgs),
}

const SYNTH_ABOUT: &str = "Generate gradients that behave like real ones.

Per-layer scales differ by orders of magnitude, values are heavy-tailed (Tukey h, --tail),
each coordinate drifts slowly across steps as an AR(1) process (--drift: the correlation
between consecutive steps), and every rank sees a shared component plus its own noise
(--overlap: the correlation between two ranks at one step). So top-k coordinates persist
across steps and workers' top-k sets overlap partially, as the algorithms downstream assume.
The same arguments and --seed give byte-identical output. Rows are dense; they are written
one (step, rank) at a time, so the trace does not need to fit in memory.";

const SYNTH_AFTER: &str = "Shapes (PyTorch parameter names and shapes):
  mlp        784-512-512-10 MLP (fc1..fc3), 669,706 parameters
  vgg16      VGG-16 with batch norm for CIFAR-10 (Ok-Topk), 14,728,266 parameters
  lstm       3-layer 650-unit LSTM on WikiText-2 (PowerSGD, DEFT), 28,949,319 parameters
  bert-base  BERT-base uncased encoder (Hugging Face names), 109,482,240 parameters

Examples:
  gradtrace synthetic --shape lstm --scale 0.01 --ranks 8 --steps 20 --seed 7 -o lstm.parquet
  gradtrace synthetic --layers 'w=1000000' --ranks 4 --steps 2 --overlap 0.9 --drift 0.99 | gradtrace inspect";

#[derive(Args, Debug)]
#[command(about = "Generate realistic synthetic gradients", long_about = SYNTH_ABOUT, after_help = SYNTH_AFTER)]
struct SyntheticArgs {
    /// A known model: mlp, vgg16, lstm, bert-base
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with = "layers",
        required_unless_present = "layers"
    )]
    shape: Option<String>,
    /// A custom model: NAME=SIZE or NAME=D0xD1x… items, comma-separated
    #[arg(long, value_name = "SPEC")]
    layers: Option<String>,
    /// Ranks P in the trace (rows for ranks 0..P; nothing is run)
    #[arg(long, value_name = "P", default_value_t = 4)]
    ranks: u32,
    /// Number of training steps
    #[arg(long, value_name = "S", default_value_t = 10)]
    steps: u32,
    /// Random seed
    #[arg(long, value_name = "N", default_value_t = 0)]
    seed: u64,
    /// Shrink every layer of --shape: its first dimension is multiplied by F
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    scale: f64,
    /// Correlation between ranks at one step, in [0, 1]
    #[arg(long, value_name = "O", default_value_t = synth::DEFAULT_OVERLAP)]
    overlap: f64,
    /// AR(1) correlation between consecutive steps, in [0, 1]
    #[arg(long, value_name = "RHO", default_value_t = synth::DEFAULT_DRIFT)]
    drift: f64,
    /// Heavy-tail parameter h of the Tukey h-transform, in [0, 0.5] (0 = Gaussian)
    #[arg(long, value_name = "H", default_value_t = synth::DEFAULT_TAIL)]
    tail: f64,
    /// Output table (Parquet); absent writes stdout when it is not a terminal
    #[arg(short = 'o', long = "output", value_name = "PATH")]
    output: Option<PathBuf>,
    /// No progress bar
    #[arg(short = 'q', long)]
    quiet: bool,
    #[command(flatten)]
    memory: gradkit_core::budget::MemoryArgs,
}

#[derive(Args, Debug)]
#[command(
    about = "Summarise a trace: steps, ranks, and per layer numel, nnz, density, L2 norm, range",
    after_help = "Columns: layer_id, layer, shape, numel, rows (step × rank pairs holding the layer),\n\
                  steps, ranks, nnz (non-zeros over all rows), density (nnz / (numel × rows)),\n\
                  l2_norm (mean over rows of the row's L2 norm), min, max.\n\n\
                  Examples:\n  gradtrace inspect trace.parquet\n  \
                  gradtrace synthetic --shape mlp --ranks 2 --steps 2 | gradtrace inspect - --format json"
)]
struct InspectArgs {
    /// Input table (Parquet); `-` or absent reads stdin
    #[arg(value_name = "FILE")]
    input: Option<PathBuf>,
    /// How to print the table
    #[arg(long, value_enum, default_value_t = Format::Md)]
    format: Format,
    /// Accept NaN/Inf gradient values instead of stopping with an error
    #[arg(long)]
    allow_nonfinite: bool,
}

#[derive(Args, Debug)]
#[command(
    about = "Validate and concatenate traces into one, rewritten with gradkit's encodings",
    long_about = "Validate and concatenate traces into one, rewritten with gradkit's encodings.\n\n\
                  Every input is checked as every gradkit tool checks it (docs/FORMAT.md), and a layer\n\
                  must keep its layer_id and numel across inputs. Use it to merge per-rank files, or to\n\
                  turn a table written by pyarrow or pandas into a canonical gradkit file.",
    after_help = "Examples:\n  gradtrace cat rank0.parquet rank1.parquet -o all.parquet\n  \
                  python make_table.py | gradtrace cat - -o trace.parquet"
)]
struct CatArgs {
    /// Input tables (Parquet); `-` reads stdin
    #[arg(value_name = "FILE", required = true)]
    inputs: Vec<PathBuf>,
    /// Output table (Parquet); absent writes stdout when it is not a terminal
    #[arg(short = 'o', long = "output", value_name = "PATH")]
    output: Option<PathBuf>,
    /// Accept NaN/Inf gradient values instead of stopping with an error
    #[arg(long)]
    allow_nonfinite: bool,
}

#[derive(Args, Debug)]
#[command(
    about = "Make a trace of P ranks from a recording of fewer (for a replay at scale)",
    long_about = "Make a trace of P ranks from a recording of fewer (for a replay at scale).\n\n\
                  Per step and layer: the recorded ranks stay as they are; each new rank is the recorded\n\
                  ranks' mean plus one recorded rank's deviation from it, magnitudes kept and signs drawn\n\
                  afresh (antithetic in pairs of new ranks). Each rank's norm and k-th magnitude stay the\n\
                  recorded ranks'; ranks agree a little more than real ones (docs/SIMULATE.md § From P\n\
                  recorded ranks to any P, measured). Needs dense rows of every recorded rank; reads the\n\
                  whole recording into memory.",
    after_help = "Examples:\n  gradtrace synthetic --layers 'w=20000' --ranks 2 --steps 2 -o two.parquet\n  \
                  gradtrace expand two.parquet --ranks 16 --seed 1 -o p16.parquet\n  \
                  gradallreduce --algo oktopk --density 0.01 --comm-trace rec.parquet p16.parquet -o /dev/null"
)]
struct ExpandArgs {
    /// Input trace (Parquet, dense rows of ranks 0..R); `-` or absent reads stdin
    #[arg(value_name = "FILE")]
    input: Option<PathBuf>,
    /// Ranks P of the output (at least the recording's)
    #[arg(long, value_name = "P")]
    ranks: u32,
    /// Seed of the new ranks' signs
    #[arg(long, value_name = "N", default_value_t = 0)]
    seed: u64,
    /// Output table (Parquet); absent writes stdout when it is not a terminal
    #[arg(short = 'o', long = "output", value_name = "PATH")]
    output: Option<PathBuf>,
    /// No progress bar
    #[arg(short = 'q', long)]
    quiet: bool,
}

fn main() -> std::process::ExitCode {
    gradkit_core::paths::install_signal_cleanup();
    let cli = gradkit_comm::launch::parse_args::<Cli>();
    match &cli.cmd {
        Cmd::Model(a) => {
            if let Err(e) = model::check_flags(a) {
                gradkit_comm::launch::usage_error::<Cli>(gradkit_core::cli::chain_text(&e));
            }
        }
        _ => cli::one_process_under_mpirun("gradtrace"),
    }
    cli::run(|| match cli.cmd {
        Cmd::Synthetic(a) => synthetic(&a),
        Cmd::Import(a) => import::run(&a),
        Cmd::Inspect(a) => {
            let input = gradkit_core::Input::from_arg(a.input.as_deref())?;
            let opts = ReadOptions {
                allow_nonfinite: a.allow_nonfinite,
            };
            inspect::run(&input, opts, a.format)
        }
        Cmd::Cat(a) => cat(&a),
        Cmd::Expand(a) => expand(&a),
        Cmd::Model(a) => model::run(&a),
    })
}

fn synthetic(a: &SyntheticArgs) -> Result<()> {
    a.memory.apply();
    let layers = match (&a.shape, &a.layers) {
        (Some(s), None) => synth::shape(s, a.scale)?,
        (None, Some(l)) => {
            if a.scale != 1.0 {
                bail!("--scale applies to --shape only; give the sizes you want in --layers");
            }
            synth::parse_layers(l)?
        }
        _ => bail!("give --shape NAME or --layers SPEC"),
    };
    let spec = SynthSpec {
        layers,
        ranks: a.ranks,
        steps: a.steps,
        seed: a.seed,
        overlap: a.overlap,
        drift: a.drift,
        tail: a.tail,
    };
    let gen = synth::Generator::new(&spec)?;
    let out = Output::from_arg(a.output.as_deref())?;
    let mut meta = Meta::producer("gradtrace");
    meta.set("method", "synthetic")
        .set("world_size", spec.ranks)
        .set("steps", spec.steps)
        .set("seed", spec.seed)
        .set("overlap", spec.overlap)
        .set("drift", spec.drift)
        .set("tail", spec.tail);
    match &a.shape {
        Some(s) => meta.set("shape", s).set("scale", a.scale),
        None => meta.set("layers", a.layers.as_deref().unwrap_or_default()),
    };
    write_stream(&out, &meta, gen, a.quiet)
}

fn cat(a: &CatArgs) -> Result<()> {
    let opts = ReadOptions {
        allow_nonfinite: a.allow_nonfinite,
    };
    let inputs: Vec<_> = a
        .inputs
        .iter()
        .map(|p| ("FILE", Some(p.as_path())))
        .collect();
    gradkit_core::paths::check_distinct(&inputs, &[("-o", a.output.as_deref())])?;
    let out = Output::from_arg(a.output.as_deref())?;
    // Every input is opened and its keys scanned first (the output's world size counts the
    // ranks of all of them); then the rows stream through, input by input in file order, a
    // record batch at a time (docs/MEMORY.md).
    let mut streams = Vec::with_capacity(a.inputs.len());
    let mut ranks = std::collections::BTreeSet::new();
    for p in &a.inputs {
        let input = gradkit_core::Input::from_arg(Some(p))?;
        let s = TensorStream::open(&input, opts)?;
        ranks.extend(s.scan()?.ranks);
        streams.push(s);
    }
    let mut meta = match &streams[..] {
        // One input: keep its parameters (method, seed, …) next to the new producer.
        [only] => inherited(&only.meta),
        _ => {
            let mut m = Meta::producer("gradtrace");
            m.set("method", "cat");
            m
        }
    };
    meta.set("world_size", ranks.len());
    let sources: Vec<String> = streams.iter().map(|s| s.source.clone()).collect();
    let mut w = TableWriter::<TensorRow>::create(&out, &meta)?;
    let mut reg = gradkit_core::tables::LayerRegistry::default();
    // (step, rank, layer_id) → the input that holds it: a key may appear once in the output,
    // as every consumer requires.
    let mut seen: std::collections::HashMap<(u32, u32, u32), usize> = Default::default();
    for (i, s) in streams.into_iter().enumerate() {
        let mut chunks = s.chunks();
        while let Some(rows) = chunks.next_chunk()? {
            for r in &rows {
                reg.check(r).with_context(|| format!("in {}", sources[i]))?;
                if let Some(&first) = seen.get(&(r.step, r.rank, r.layer_id)) {
                    bail!(
                        "duplicate row: step {}, rank {}, layer `{}` is in {} and again in {} (key step, rank, layer); give each (step, rank, layer) once",
                        r.step,
                        r.rank,
                        r.layer,
                        sources[first],
                        sources[i]
                    );
                }
                seen.insert((r.step, r.rank, r.layer_id), i);
            }
            w.write_owned(rows)?;
        }
    }
    w.finish()
}

fn expand(a: &ExpandArgs) -> Result<()> {
    if a.ranks == 0 {
        bail!("--ranks must be at least 1");
    }
    gradkit_core::paths::check_distinct(
        &[("FILE", a.input.as_deref())],
        &[("-o", a.output.as_deref())],
    )?;
    let input = gradkit_core::Input::from_arg(a.input.as_deref())?;
    // One step in memory at a time (docs/MEMORY.md): its recorded ranks and the new ones.
    let steps = gradkit_core::io::read_tensor_steps(&input, ReadOptions::default())?;
    let out = Output::from_arg(a.output.as_deref())?;
    let recorded = steps.ranks.last().map_or(0, |r| r + 1);
    let mut meta = inherited(&steps.meta);
    meta.set("method", "expand")
        .set("world_size", a.ranks)
        .set("expanded_from", recorded)
        .set("seed", a.seed);
    let pb = cli::progress("expand", steps.steps.len() as u64, a.quiet);
    let mut w = TableWriter::<TensorRow>::create(&out, &meta)?;
    let source = steps.source.clone();
    for next in steps {
        let (step, rows) = next?;
        let rows = gradkit_core::expand::expand_step(rows, a.ranks, a.seed)
            .with_context(|| format!("in {source}"))?;
        w.write_owned(rows)
            .with_context(|| format!("step {step}"))?;
        pb.inc(1);
    }
    w.finish()?;
    pb.finish_and_clear();
    Ok(())
}

/// gradtrace's metadata for a table made from one input: the input's parameters
/// (`gradkit.*` but its producer) beside the new producer.
fn inherited(input: &Meta) -> Meta {
    let mut meta = Meta::producer("gradtrace");
    for (k, v) in &input.0 {
        if k != "gradkit.producer" && k.starts_with("gradkit.") {
            meta.set(k, v);
        }
    }
    meta
}

/// Writes each (step, rank) group of rows as it is generated, with a progress bar.
fn write_stream(out: &Output, meta: &Meta, gen: synth::Generator, quiet: bool) -> Result<()> {
    let pb = cli::progress("synthetic", gen.len(), quiet);
    let mut w = TableWriter::<TensorRow>::create(out, meta)?;
    for rows in gen {
        w.write(&rows)?;
        pb.inc(1);
    }
    w.finish()?;
    pb.finish_and_clear();
    Ok(())
}
