//! `gradtrace model`: the real per-rank gradients of a few training steps of one of
//! gradtrain's models (candle autodiff), written as a dense tensor/1 trace.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use gradkit_comm::World;
use gradkit_core::{write_table, Meta, Output, TensorRow};
use gradkit_train::data::DataSpec;
use gradkit_train::model::ModelSpec;
use gradkit_train::TrainConfig;

pub const ABOUT: &str = "Dump the real gradients of a few training steps of a gradtrain model.

Each of P ranks (threads, or MPI processes under mpirun) trains the model on its own shard
of the data, exactly as `gradtrain` does with the same flags, and records the local gradient
it computed at every step before the exchange. The trace has one dense row per step × rank ×
parameter tensor, with the parameter's name and shape, so every other tool can read it.";

pub const AFTER: &str = "Examples:
  gradtrace model --model mlp --data digits --ranks 4 --steps 8 -o mlp-grads.parquet
  gradtrace model --model transformer-lm --data synthetic-lm --ranks 2 --steps 4 \\
    | gradselect --method topk --density 0.01 | gradallreduce --algo oktopk --ranks 2 -o out.parquet";

#[derive(Args, Debug)]
#[command(about = ABOUT, long_about = ABOUT, after_help = AFTER)]
pub struct ModelArgs {
    /// mlp, cnn, transformer-lm, lstm-lm
    #[arg(long, default_value = "mlp")]
    model: String,
    /// digits, synthetic-lm, or a Parquet file (see gradtrain --help)
    #[arg(long, default_value = "digits")]
    data: String,
    /// Ranks P to run: in-process ranks (threads) when not started by mpirun, where MPI
    /// gives the count
    #[arg(long, value_name = "P")]
    ranks: Option<usize>,
    /// Training steps to record
    #[arg(long, default_value_t = 4)]
    steps: u32,
    /// Examples per rank per step
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Learning rate of the (SGD) training between the recorded steps
    #[arg(long, default_value_t = 0.1)]
    lr: f32,
    /// How the training between the recorded steps exchanges gradients (gradtrain
    /// --exchange: dense, topk, oktopk, deft, …): the gradients of a run trained that way,
    /// e.g. for Ok-Topk's Fig. 5 on an Ok-Topk-trained model
    #[arg(long, default_value = "dense")]
    exchange: String,
    /// Density of a sparse --exchange
    #[arg(long, default_value_t = 0.01)]
    density: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output trace; absent writes stdout when it is not a terminal
    #[arg(short = 'o', long, value_name = "PATH")]
    output: Option<PathBuf>,
    #[arg(short = 'q', long)]
    quiet: bool,
}

/// The flags' combination, checked before any rank starts (a usage error, exit 2).
pub fn check_flags(a: &ModelArgs) -> Result<()> {
    gradkit_train::train::check_config(&config(a)?)
}

/// The run's configuration (--exchange parsed here).
fn config(a: &ModelArgs) -> Result<TrainConfig> {
    Ok(TrainConfig {
        model: ModelSpec {
            name: a.model.clone(),
            ..ModelSpec::default()
        },
        data: DataSpec {
            name: a.data.clone(),
            ..DataSpec::default()
        },
        steps: a.steps,
        batch: a.batch,
        lr: a.lr,
        seed: a.seed,
        exchange: a.exchange.parse().map_err(anyhow::Error::msg)?,
        density: a.density,
        quiet: true,
        run_name: "gradtrace-model".into(),
        ..TrainConfig::default()
    })
}

pub fn run(a: &ModelArgs) -> Result<()> {
    let world = World::init(a.ranks)?;
    // An agreement point: a bad output is reported once under mpirun, before any work.
    let out = world.agree(if world.is_io_rank() {
        let data = (!matches!(a.data.as_str(), "digits" | "synthetic-lm"))
            .then(|| std::path::Path::new(&a.data));
        gradkit_core::paths::check_distinct(&[("--data", data)], &[("-o", a.output.as_deref())])
            .and_then(|_| Output::from_arg(a.output.as_deref()))
            .map(Some)
    } else {
        Ok(None)
    })?;
    let cfg = config(a)?;
    let rows = gradkit_train::dump_gradients(&world, &cfg)?;
    // The last agreement point: the other ranks wait while rank 0 writes.
    world.agree(write_rows(a, &world, out, &rows))
}

fn write_rows(a: &ModelArgs, world: &World, out: Option<Output>, rows: &[TensorRow]) -> Result<()> {
    if let Some(out) = out {
        let mut meta = Meta::producer("gradtrace");
        meta.set("method", "model")
            .set("model", &a.model)
            .set("data", &a.data)
            .set("world_size", world.size())
            .set("exchange", &a.exchange)
            .set("seed", a.seed);
        write_table(&out, &meta, rows)?;
        if !a.quiet {
            gradkit_core::noteln!(
                "gradtrace model: {} on {}, {} ranks × {} steps, {} rows",
                a.model,
                a.data,
                world.size(),
                a.steps,
                rows.len()
            );
        }
    }
    Ok(())
}
