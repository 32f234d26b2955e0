//! gradallreduce — run any allreduce of the four papers on a gradient trace, benchmark the
//! collectives nccl-tests style, or project their cost with the α-β model.

/// Large blocks mapped on huge pages and handed back when freed (docs/MEMORY.md).
#[global_allocator]
static ALLOC: gradkit_core::alloc::BigAlloc = gradkit_core::alloc::BigAlloc;

mod bench;
mod model;
mod reduce;
mod state;

use clap::{Parser, Subcommand};

const ABOUT: &str =
    "Reduce gradient traces across ranks with dense, sparse, 1-bit and AlltoAll allreduces";

const AFTER_HELP: &str = "\
Reads a tensor/1 trace (one row per step × rank × layer), gives each rank its rows, and runs
the chosen allreduce step by step, exactly as a data-parallel job would. The reduced tensor
(identical on every rank) is written once; --metrics records bytes and messages per rank and
per phase, and time per phase, as metrics/1 rows.

Ranks: `--ranks N` runs N in-process ranks (threads). Under `mpirun -np N` the rank count
comes from MPI, rank 0 reads and scatters the trace and gathers and writes the results.
Either way the output rows are identical bit for bit for every algorithm but `native`
(MPI_Allreduce adds in its own order: equal to rounding), and so are the byte and message
counters; the files differ only in the metadata `gradkit.backend` and `gradkit.producer`
(the argv).

Algorithms (--algo, each with its line above): the flags that only some of them read, and
which (any other algorithm refuses them):
{knobs}
Sparse algorithms sum (Ok-Topk's u); dense input to them is first selected with --density
and error feedback across steps, as Ok-Topk's Algorithm 1 does. --op mean divides any sum
by P; the 1-bit allreduces always average, so --op does not apply to them. Each name is
gradtrain --exchange's name of the same algorithm and the metrics' `algo` value.

Examples:
  gradtrace synthetic --shape mlp --ranks 4 --steps 3 --seed 1 \\
    | gradallreduce --algo ring --ranks 4 -o reduced.parquet
  mpirun -np 4 gradallreduce --algo ring trace.parquet -o reduced.parquet --metrics m.parquet
  gradselect --method topk --density 0.01 trace.parquet \\
    | gradallreduce --algo oktopk --ranks 4 --metrics m.parquet -o out.parquet
  gradallreduce --algo topka --ranks 4 trace.parquet -o sum.parquet --metrics - \\
    | gradreport volume --n 669706 --density 0.01
  gradallreduce bench --algo ring,rabenseifner,native --ranks 4 --sizes 1K:64M
  gradallreduce bench --algo oktopk,gtopk --input dense,topk --ranks 4 --sizes 16M:16M
  gradallreduce model --ranks 256 --n 110M --density 0.01";

#[derive(Parser)]
#[command(name = "gradallreduce", version = gradkit_core::tool_version!(), about = ABOUT.split("\n\n").next(), long_about = ABOUT)]
#[command(after_help = "The other options, the algorithms and the examples: gradallreduce --help", after_long_help = after_long_help())]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    reduce: reduce::ReduceArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Size sweep with the nccl-tests columns, exact bytes per rank and the model's prediction
    Bench(bench::BenchArgs),
    /// The α-β model's prediction table for every algorithm at any P
    #[command(after_help = model::after_help())]
    Model(model::ModelArgs),
}

/// `--help`'s text after the options: [`AFTER_HELP`] with the table of the flags that only
/// some algorithms read, from their descriptors, and the old spellings.
fn after_long_help() -> String {
    use gradkit_collectives::{Algo, Knob};
    let mut knobs = String::new();
    let all: Vec<&str> = Algo::names().collect();
    for knob in [Knob::Op, Knob::Wire].iter().chain(Knob::REFUSED) {
        let readers = knob.readers();
        // `--op`: every algorithm but a few, said the short way.
        let who = if readers.len() > all.len() / 2 {
            let but: Vec<&str> = all
                .iter()
                .copied()
                .filter(|a| !readers.contains(a))
                .collect();
            format!("every algorithm but {}", but.join(", "))
        } else {
            readers.join(", ")
        };
        knobs += &format!("  {:<17} {who}\n", knob.flag());
    }
    let old: Vec<String> = Algo::aliases().map(|(o, a)| format!("{o} = {a}")).collect();
    knobs += &format!(
        "Old spellings, still taken with a note: {}.\n",
        old.join(", ")
    );
    AFTER_HELP.replace("{knobs}\n", &knobs)
}

fn main() -> std::process::ExitCode {
    gradkit_core::paths::install_signal_cleanup();
    // Under mpirun a usage error is printed once, by rank 0.
    let (cli, matches) = gradkit_comm::launch::parse_matches::<Cli>();
    // A command line that is wrong on its own is a usage error (exit 2), before any rank starts.
    // Each with its own usage line: a subcommand's flags are wrong in the subcommand.
    let flags = match (&cli.cmd, matches.subcommand()) {
        (Some(Cmd::Bench(a)), Some((_, m))) => a.check_flags(m).map_err(|e| (Some("bench"), e)),
        (Some(Cmd::Model(a)), _) => a.check_flags().map_err(|e| (Some("model"), e)),
        _ => cli.reduce.check_flags(&matches).map_err(|e| (None, e)),
    };
    match flags {
        Ok(()) => {}
        Err((Some(sub), e)) => gradkit_comm::launch::subcommand_usage_error::<Cli>(
            sub,
            gradkit_core::cli::chain_text(&e),
        ),
        Err((None, e)) => {
            gradkit_comm::launch::usage_error::<Cli>(gradkit_core::cli::chain_text(&e))
        }
    }
    gradkit_core::cli::run(|| match cli.cmd {
        Some(Cmd::Bench(a)) => bench::run(a),
        Some(Cmd::Model(a)) => model::run(a),
        None => {
            let mut r = cli.reduce;
            r.resolve_wire();
            reduce::run(r)
        }
    })
}

/// Parses sizes like `4096`, `64K`, `16M`, `1G` (powers of 1024) or `110M`; exact for
/// integers, an error (never a wrapped value) past 2^64 − 1.
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    gradkit_core::budget::parse_size(s)
}

#[cfg(test)]
mod tests {
    /// The table of flags names every flag that only some algorithms read, each with the
    /// algorithms that read it, and the old spellings.
    #[test]
    fn after_help_names_every_algorithm_specific_flag() {
        use gradkit_collectives::Knob;
        let text = super::after_long_help();
        assert!(!text.contains("{knobs}"));
        for knob in Knob::REFUSED {
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{} ", knob.flag())))
                .unwrap_or_else(|| panic!("{} has no line", knob.flag()));
            assert!(!knob.readers().is_empty(), "{}", knob.flag());
            for a in knob.readers() {
                assert!(line.contains(a), "{line}: {a}");
            }
        }
        assert!(text.contains("alltoall = embrace"), "{text}");
    }
}
