//! Training metrics that survive an interrupted run.
//!
//! Every rank pushes its `metrics/1` rows into its own [`MetricSink`]; at a flush point all
//! ranks hand the rows pushed since the last one to rank 0 (a collective, so every rank
//! flushes at the same steps). Rank 0 keeps them ordered by (step, rank) and
//! - every `--metrics-every` steps rewrites the `--metrics` file atomically, so a killed run
//!   keeps the metrics of its finished steps;
//! - at each checkpoint saves them as `metrics.parquet` inside the checkpoint directory, and a
//!   resumed run starts from those rows, so its `--metrics` covers the whole run.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use gradkit_comm::{dist, Comm};
use gradkit_core::io::{read_table, write_table, Input, Meta, Output, ReadOptions};
use gradkit_core::trace::MetricSink;
use gradkit_core::MetricRow;

use crate::data::Dataset;
use crate::train::TrainConfig;

/// The metrics file inside a checkpoint directory.
pub const CHECKPOINT_METRICS: &str = "metrics.parquet";

pub(crate) struct MetricsLog {
    /// Rank 0: every rank's rows gathered so far, in (step, rank) order, including the rows a
    /// resumed run took over from its checkpoint. Empty on the other ranks.
    rows: Vec<MetricRow>,
    /// The `--metrics` file rewritten at each flush: a regular file (or one to be created),
    /// never stdout or a device, which only the final write reaches.
    path: Option<PathBuf>,
    meta: Meta,
    every: u32,
}

impl MetricsLog {
    /// The metadata gets `world_size` = `p` and the data's best achievable loss, as the
    /// caller's final write has them.
    pub fn new(cfg: &TrainConfig, p: usize, data: &Dataset) -> Self {
        let mut meta = cfg.metrics_meta.clone();
        meta.set("world_size", p);
        if let Dataset::Lm(l) = data {
            if let Some(b) = l.entropy_rate {
                meta.set("best_loss", b);
            }
        }
        let path = cfg
            .metrics_path
            .as_ref()
            .filter(|p| p.as_os_str() != "-")
            .filter(|p| !std::fs::metadata(p).is_ok_and(|m| !m.is_file()))
            .cloned();
        MetricsLog {
            rows: Vec::new(),
            path,
            meta,
            every: cfg.metrics_every,
        }
    }

    /// Rank 0 of a resumed run: takes over the rows of the steps before the resumed step
    /// ([`resumed_rows`]).
    pub fn take_over(&mut self, rows: Vec<MetricRow>) {
        self.rows = rows;
    }

    /// Collective: every rank's rows not yet gathered go to rank 0.
    pub fn gather(&mut self, comm: &dyn Comm, sink: &mut MetricSink) -> Result<()> {
        let mine = std::mem::take(&mut sink.rows);
        if let Some(mut new) = dist::gather(comm, mine)? {
            // Every new row is of a later step than the rows already held.
            new.sort_by_key(|r| (r.step, r.rank));
            self.rows.extend(new);
        }
        Ok(())
    }

    /// Collective, after `done` steps: every `every` steps (and when `force`, at a checkpoint)
    /// gathers the rows and rank 0 rewrites the `--metrics` file. Returns whether it gathered.
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
        self.gather(comm, sink)?;
        if comm.rank() == 0 {
            if let Some(p) = &self.path {
                write_table(&Output::Path(p.clone()), &self.meta, &self.rows)
                    .with_context(|| format!("writing the metrics after step {done}"))?;
            }
        }
        Ok(true)
    }

    /// Rank 0: saves the rows so far into checkpoint directory `dir` (atomically).
    pub fn save_to(&self, dir: &Path) -> Result<()> {
        write_table(
            &Output::Path(dir.join(CHECKPOINT_METRICS)),
            &self.meta,
            &self.rows,
        )
    }

    /// Collective: the last rows; rank 0 gets every row of the run, the others `None`.
    pub fn finish(
        mut self,
        comm: &dyn Comm,
        sink: &mut MetricSink,
    ) -> Result<Option<Vec<MetricRow>>> {
        self.gather(comm, sink)?;
        Ok((comm.rank() == 0).then_some(self.rows))
    }
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
