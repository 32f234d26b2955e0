//! gradkit-report: the tables and figures people read, from gradkit's `metrics/1` files
//! (bytes, time, loss), plus ad hoc statistics of `tensor/1` files; the library behind the
//! `gradreport` tool, which parses the command line and calls one function per subcommand.
//!
//! [`table`] pivots long metric rows into one row per group and one column per metric;
//! [`volume`] sets measured bytes beside the cost model's formula; [`plot`] draws SVG figures
//! (loss curves, time breakdowns, log-log volume and scaling), [`export`] turns them into PDF
//! and PNG, [`figdata`] holds the values behind them (`--csv`); [`tensor`] summarises traces.
//! [`metrics`] holds the shared pieces: metric selection (`name`, `name:phase`, `name:*`),
//! grouping and statistics.
//!
//! The cost model's predictions are read from `model_<metric>` rows that the producing tools
//! write next to their measurements; [`model`] computes them with the algorithms' formulas
//! when the input lacks them and the gradient size is given. [`simulate`] replays a
//! `commtrace/1` recording on SimGrid ([`simgrid`]: TI traces, platforms, smpirun). Not here:
//! running algorithms, command lines (no clap: the tool maps its value lists onto
//! [`plot::Kind`], [`export::FigFormat`], [`figdata::XAxis`], [`metrics::Stat`], and its
//! `simulate` flags onto [`simulate::SimulateOpts`]).

pub mod explain;
pub mod export;
pub mod figdata;
pub mod metrics;
pub mod model;
pub mod plot;
pub mod simgrid;
pub mod simulate;
pub mod table;
pub mod tensor;
pub mod validated;
pub mod volume;
pub mod wholestep;
