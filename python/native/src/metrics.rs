//! `Metrics(path, comm, run)`: the metrics/1 rows of a training run, every rank's gathered to
//! rank 0 and written there as one file (atomically, as every gradkit output), with the rows
//! the reducers add each step (as `gradallreduce --metrics` writes them) and the loop's own
//! (`add("loss", value, step)`), so `gradreport plot loss` draws the run.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use gradkit_core::{Meta, MetricRow, Output, RunSettings};
use pyo3::prelude::*;

use crate::comm::{with_comm, PyComm, Shared};
use crate::run_error;

/// See the module docs.
#[pyclass(frozen, name = "Metrics", module = "gradkit._native")]
pub struct PyMetrics {
    shared: Shared,
    rank: u32,
    world_size: u32,
    #[pyo3(get)]
    path: PathBuf,
    #[pyo3(get)]
    run: String,
    /// The `algo` of the loop's own rows (the reducers' rows carry their own).
    #[pyo3(get)]
    algo: String,
    /// This rank's rows not written yet.
    rows: Mutex<Vec<MetricRow>>,
    /// Rank 0: every rank's rows written so far (the file holds them all).
    written: Mutex<Vec<MetricRow>>,
    settings: Arc<RunSettings>,
}

impl PyMetrics {
    /// A reducer's rows of one step.
    pub(crate) fn add_rows(&self, rows: Vec<MetricRow>) {
        self.rows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(rows);
    }
}

#[pymethods]
impl PyMetrics {
    #[new]
    #[pyo3(signature = (path, comm, run, algo = String::new(), model = None, optimizer = None, seed = None))]
    fn new(
        path: PathBuf,
        comm: &PyComm,
        run: String,
        algo: String,
        model: Option<String>,
        optimizer: Option<String>,
        seed: Option<u64>,
    ) -> PyMetrics {
        PyMetrics {
            shared: comm.shared.clone(),
            rank: comm.rank as u32,
            world_size: comm.size as u32,
            path,
            run,
            algo,
            rows: Mutex::new(Vec::new()),
            written: Mutex::new(Vec::new()),
            settings: Arc::new(RunSettings {
                model,
                optimizer,
                seed,
                ..Default::default()
            }),
        }
    }

    /// One row of the loop's own (`loss`, `eval_accuracy`, `lr`, …) for `step`, from this
    /// rank (`algo`: the run's unless given).
    #[pyo3(signature = (metric, value, step, algo = None))]
    fn add(&self, metric: String, value: f64, step: u32, algo: Option<String>) {
        self.add_rows(vec![MetricRow {
            run: self.run.clone(),
            tool: "gradkit.torch".into(),
            algo: algo.unwrap_or_else(|| self.algo.clone()),
            world_size: self.world_size,
            step,
            rank: self.rank,
            metric,
            value,
            settings: self.settings.clone(),
        }]);
    }

    /// Rows this rank holds that no `write()` has sent yet.
    fn __len__(&self) -> usize {
        self.rows.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Every rank's rows to rank 0, which writes the file (a collective: every rank calls it;
    /// the file holds every row written so far, replaced atomically).
    fn write(&self, py: Python<'_>) -> PyResult<()> {
        // Each write sends the rows added since the last one; rank 0 keeps every row written.
        let mine = std::mem::take(&mut *self.rows.lock().unwrap_or_else(|e| e.into_inner()));
        let gathered = with_comm(py, &self.shared, |c| gradkit_comm::dist::gather(c, mine))
            .map_err(run_error)?;
        if let Some(new) = gathered {
            let mut rows = self.written.lock().unwrap_or_else(|e| e.into_inner());
            rows.extend(new);
            rows.sort_by_key(|r| (r.step, r.rank));
            let mut meta = Meta::producer("gradkit.torch");
            meta.set("world_size", self.world_size);
            let out = Output::Path(self.path.clone());
            py.detach(|| gradkit_core::write_table(&out, &meta, &rows[..]))
                .map_err(run_error)?;
        }
        Ok(())
    }
}
