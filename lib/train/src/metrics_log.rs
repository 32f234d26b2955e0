//! Training metrics that survive an interrupted run, in memory that does not grow with it.
//!
//! Every rank pushes its `metrics/1` rows into its own [`MetricSink`]; at a flush point all
//! ranks hand the rows pushed since the last one to rank 0 (a collective, so every rank
//! flushes at the same steps). Rank 0 takes them in (step, rank) order and
//! - appends them to the `--metrics` file ([`LiveTable`]: a row group and a new footer written
//!   in place, not the file rewritten), every `--metrics-every` steps and at each checkpoint, so
//!   a killed run keeps the metrics of its finished steps;
//! - at each checkpoint copies that table as `metrics.parquet` into the checkpoint directory
//!   (without `--metrics`, the table lives in an unnamed temporary file for this), and a
//!   resumed run starts from those rows, so its `--metrics` covers the whole run;
//! - folds them into the run's summary ([`Summary`]); the rows themselves are kept only where
//!   the caller asked for them ([`crate::config::TrainConfig::keep_metrics`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use gradkit_comm::{dist, Comm};
use gradkit_core::io::{read_table, Input, ReadOptions};
use gradkit_core::live::LiveTable;
use gradkit_core::trace::MetricSink;
use gradkit_core::MetricRow;

use crate::config::TrainConfig;
use crate::data::Dataset;

/// The metrics file inside a checkpoint directory.
pub const CHECKPOINT_METRICS: &str = "metrics.parquet";

/// The means the closing summary reports, accumulated as the rows arrive (in the order a
/// table of every row would list them, so the sums are the same).
#[derive(Clone, Debug, Default)]
pub(crate) struct Summary {
    /// The first step of this run (a resumed run's earlier rows are not its own) and the
    /// first of the last ten, whose losses give the final loss.
    first: u32,
    tail: u32,
    /// (sum, count) per metric.
    sums: std::collections::BTreeMap<&'static str, (f64, u64)>,
}

/// The metrics [`Summary`] averages (over the run's own steps; `loss` over its last ten).
const SUMMARY_METRICS: [&str; 7] = [
    "loss",
    "bytes_sent",
    "time_compute_s",
    "time_select_s",
    "time_comm_s",
    "time_update_s",
    "nnz",
];

impl Summary {
    pub fn new(first: u32, last: u32) -> Self {
        Summary {
            first,
            tail: last.saturating_sub(10).max(first),
            sums: Default::default(),
        }
    }

    fn take(&mut self, r: &MetricRow) {
        let Some(&name) = SUMMARY_METRICS.iter().find(|m| **m == r.metric) else {
            return;
        };
        let from = if name == "loss" {
            self.tail
        } else {
            self.first
        };
        if r.step >= from {
            let e = self.sums.entry(name).or_default();
            e.0 += r.value;
            e.1 += 1;
        }
    }

    /// The mean of `metric` (0 when no row had it).
    pub fn mean(&self, metric: &str) -> f64 {
        match self.sums.get(metric) {
            Some(&(s, n)) if n > 0 => s / n as f64,
            _ => 0.0,
        }
    }
}

pub(crate) struct MetricsLog {
    /// Rank 0: the table the gathered rows are appended to — the `--metrics` file when it is a
    /// regular file (or one to be created), else, with checkpoints, an unnamed temporary file;
    /// `None` on the other ranks and when neither is asked for.
    live: Option<LiveTable<MetricRow>>,
    /// Rank 0, when the caller keeps them: every row of the run, in (step, rank) order.
    rows: Option<Vec<MetricRow>>,
    summary: Summary,
    every: u32,
}

impl MetricsLog {
    /// Rank 0 (`io`) opens the table: the metadata gets `world_size` = `p` and the data's best
    /// achievable loss, as the caller's final write has them. A `--metrics` path that cannot be
    /// created fails here, before the first step.
    pub fn new(
        cfg: &TrainConfig,
        p: usize,
        data: &Dataset,
        io: bool,
        summary: Summary,
    ) -> Result<Self> {
        let mut meta = cfg.metrics_meta.clone();
        meta.set("world_size", p);
        if let Dataset::Lm(l) = data {
            if let Some(b) = l.entropy_rate {
                meta.set("best_loss", b);
            }
        }
        let live = match (io, live_path(cfg)) {
            (false, _) => None,
            (true, Some(path)) => Some(LiveTable::create(&path, &meta)?),
            (true, None) if cfg.checkpoint.is_some() => Some(LiveTable::unnamed(&meta)?),
            (true, None) => None,
        };
        // Rows the live table cannot give the caller (stdout, a device) are kept for its
        // final write.
        let keep =
            io && (cfg.keep_metrics || (cfg.metrics_path.is_some() && live_path(cfg).is_none()));
        Ok(MetricsLog {
            live,
            rows: keep.then(Vec::new),
            summary,
            every: cfg.metrics_every,
        })
    }

    /// Rank 0 of a resumed run: takes over the rows of the steps before the resumed step
    /// ([`resumed_rows`]).
    pub fn take_over(&mut self, rows: Vec<MetricRow>) -> Result<()> {
        self.take(rows)
    }

    /// Rank 0: rows in (step, rank) order, later than every row taken before.
    fn take(&mut self, rows: Vec<MetricRow>) -> Result<()> {
        for r in &rows {
            self.summary.take(r);
        }
        if let Some(live) = &mut self.live {
            live.append(&rows)?;
        }
        if let Some(kept) = &mut self.rows {
            kept.extend(rows);
        }
        Ok(())
    }

    /// Collective: every rank's rows not yet gathered go to rank 0, which takes them in.
    pub fn gather(&mut self, comm: &dyn Comm, sink: &mut MetricSink) -> Result<()> {
        let mine = std::mem::take(&mut sink.rows);
        if let Some(mut new) = dist::gather(comm, mine)? {
            // Every new row is of a later step than the rows already held.
            new.sort_by_key(|r| (r.step, r.rank));
            self.take(new)?;
        }
        Ok(())
    }

    /// Collective, after `done` steps: every `every` steps (and when `force`, at a checkpoint)
    /// gathers the rows, which rank 0 appends to the `--metrics` file. Returns whether it
    /// gathered.
    pub fn after_step(
        &mut self,
        comm: &dyn Comm,
        sink: &mut MetricSink,
        done: u32,
        force: bool,
    ) -> Result<bool> {
        if !(force || (self.every > 0 && done.is_multiple_of(self.every))) {
            return Ok(false);
        }
        self.gather(comm, sink)
            .with_context(|| format!("writing the metrics after step {done}"))?;
        Ok(true)
    }

    /// Rank 0: saves the rows so far into checkpoint directory `dir` (atomically).
    pub fn save_to(&mut self, dir: &Path) -> Result<()> {
        let live = self
            .live
            .as_mut()
            .context("internal: checkpoints without a metrics table")?;
        live.copy_to(&dir.join(CHECKPOINT_METRICS))
    }

    /// Collective: the last rows. Rank 0 completes the `--metrics` file and gets the summary
    /// and the rows it kept; the others `None`.
    pub fn finish(
        mut self,
        comm: &dyn Comm,
        sink: &mut MetricSink,
    ) -> Result<Option<(Summary, Vec<MetricRow>)>> {
        self.gather(comm, sink)?;
        if comm.rank() != 0 {
            return Ok(None);
        }
        if let Some(live) = self.live.take() {
            live.finish()?;
        }
        Ok(Some((self.summary, self.rows.unwrap_or_default())))
    }
}

/// The `--metrics` file the run appends to and completes itself: a regular file (or one to be
/// created), never stdout or a device, which only the caller's final write reaches.
pub fn live_path(cfg: &TrainConfig) -> Option<PathBuf> {
    cfg.metrics_path
        .as_ref()
        .filter(|p| p.as_os_str() != "-")
        .filter(|p| !std::fs::metadata(p).is_ok_and(|m| !m.is_file()))
        .cloned()
}

/// The rows of the steps before `first` saved in the checkpoint `dir`, which a resumed run
/// takes over (a checkpoint written before they were saved has none: a note says the
/// metrics start at `first`).
pub(crate) fn resumed_rows(dir: &Path, first: u32, quiet: bool) -> Result<Vec<MetricRow>> {
    let path = dir.join(CHECKPOINT_METRICS);
    if !path.exists() {
        if !quiet {
            gradkit_core::noteln!(
                "note: {} has no {CHECKPOINT_METRICS}: the metrics of this run start at step {first}",
                dir.display()
            );
        }
        return Ok(Vec::new());
    }
    let t = read_table::<MetricRow>(&Input::Path(path.clone()), ReadOptions::default())
        .with_context(|| format!("reading the metrics saved in checkpoint {}", dir.display()))?;
    Ok(t.rows.into_iter().filter(|r| r.step < first).collect())
}
