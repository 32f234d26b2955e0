//! `Reducer(algo, comm, layers, options)`: one algorithm of gradkit-collectives by its
//! `--algo` name, reducing a dense flat buffer (the layers concatenated, as a trace's step of
//! one rank) once per step with the state it keeps across steps.
//!
//! Options are `gradallreduce`'s flags by their Python names (`density`, `k`, `op`, `wire`,
//! `period`, `reeval`, `adjust`, `balance`, `reeval_step_d`, `plan`, `residual`, `split`,
//! `seed`), with its defaults; an option the algorithm does not read is refused, from its
//! descriptor ([`gradkit_collectives::Knob::readers`]), as the tools refuse the flag.

use std::collections::BTreeMap;
use std::sync::Mutex;

use anyhow::{anyhow, bail, Context, Result};
use gradkit_collectives::registry::{Adjust, Balance, ReevalStepD, Split};
use gradkit_collectives::{reducer_for, Algo, Family, Knob, Op, Params, Reducer};
use gradkit_core::keep::Keep;
use gradkit_core::trace::{Layout, MetricSink};
use gradkit_core::{read_table, Input, PlanRow};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::comm::{with_comm, PyComm, Shared};
use crate::metrics::PyMetrics;
use crate::{run_error, value_error};

/// The options every algorithm of a family takes (the others are [`Knob`]s, read by some).
const COMMON: &[&str] = &["seed"];
/// What the algorithms that select from dense input take.
const SELECTING: &[&str] = &["density", "k", "residual"];

/// The Python names of the options `algo` reads, in the order of the module docs.
pub(crate) fn options_read(algo: Algo) -> Vec<&'static str> {
    let mut names: Vec<&str> = Vec::new();
    if algo.family() == Family::Sparse {
        names.extend(SELECTING);
    }
    names.extend(
        algo.descriptor()
            .reads
            .iter()
            .filter(|k| **k != Knob::State)
            .map(|k| k.id()),
    );
    names.extend(COMMON);
    names
}

/// Whether the module runs `algo` on a dense bucket: every family but EmbRace's, whose
/// exchange takes sparse embedding rows beside the dense layers.
pub(crate) fn runs_on_buckets(algo: Algo) -> Result<()> {
    if algo.family() == Family::Embedding {
        bail!(
            "{algo} exchanges sparse embedding rows beside dense layers, and a reducer here takes one dense buffer: run it with gradallreduce on a recorded trace"
        );
    }
    Ok(())
}

/// The step's input, its state and its metric rows, behind the reducer's lock.
struct Running {
    reducer: Box<dyn Reducer>,
    sink: MetricSink,
    /// The step the next call reduces unless the caller names one.
    next_step: u32,
}

/// See the module docs.
#[pyclass(frozen, name = "Reducer", module = "gradkit._native")]
pub struct PyReducer {
    shared: Shared,
    algo: Algo,
    layout: Layout,
    /// The k the cost model takes for dense input.
    k_in: u64,
    running: Mutex<Running>,
    metrics: Option<Py<PyMetrics>>,
    #[pyo3(get)]
    run: String,
    #[pyo3(get)]
    world_size: usize,
}

#[pymethods]
impl PyReducer {
    /// `layers`: (name, shape) of each layer, in the order of the flat buffer.
    #[new]
    #[pyo3(signature = (algo, comm, layers, options, run = None, metrics = None))]
    fn new(
        algo: &str,
        comm: &PyComm,
        layers: Vec<(String, Vec<u32>)>,
        options: BTreeMap<String, Bound<'_, PyAny>>,
        run: Option<String>,
        metrics: Option<Py<PyMetrics>>,
    ) -> PyResult<PyReducer> {
        let mut algo: Algo = algo.parse().map_err(|e| value_error(anyhow!("{e}")))?;
        runs_on_buckets(algo).map_err(value_error)?;
        let layout = layout_of(layers).map_err(value_error)?;
        let params = params_of(&mut algo, &options, &layout, comm.size).map_err(value_error)?;
        let reducer = reducer_for(algo, &params).map_err(value_error)?;
        let keep = (algo.family() == Family::Sparse).then_some(params.keep);
        let run = run.unwrap_or_else(|| gradkit_core::cli::default_run_name(algo.name(), keep));
        let density = match keep {
            Some(Keep::Density(d)) => Some(d),
            _ => None,
        };
        let sink = MetricSink::new(&run, "gradkit.torch", algo.name(), comm.size as u32)
            .with_settings(gradkit_core::RunSettings {
                density,
                ..Default::default()
            });
        Ok(PyReducer {
            shared: comm.shared.clone(),
            algo,
            k_in: params.k_for(layout.total()),
            layout,
            running: Mutex::new(Running {
                reducer,
                sink,
                next_step: 0,
            }),
            metrics,
            run,
            world_size: comm.size,
        })
    }

    /// The `--algo` name (`ring` with `wire="fp16"` is `ring-fp16`).
    #[getter]
    fn algo(&self) -> &'static str {
        self.algo.name()
    }

    /// Elements of the flat buffer.
    #[getter]
    fn numel(&self) -> u64 {
        self.layout.total()
    }

    /// Reduces `grad` (float32, contiguous, `numel` elements) with the other ranks and writes
    /// the result into `out` (the same; may be `grad` itself). `step`: the step's number
    /// (default: one more than the last). Returns this rank's metrics of the step.
    #[pyo3(signature = (grad, out, step = None))]
    fn reduce(
        &self,
        py: Python<'_>,
        grad: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        step: Option<u32>,
    ) -> PyResult<Vec<(String, f64)>> {
        let n = self.layout.total() as usize;
        let source = buffer_f32(grad, "grad", n)?;
        let target = writable_f32(out, "out", n)?;
        let (from, to) = (source.buf_ptr() as *const f32, target.buf_ptr() as *mut f32);
        let bytes = n * std::mem::size_of::<f32>();
        let same = std::ptr::eq(from, to);
        if !same && (from as usize) < to as usize + bytes && (to as usize) < from as usize + bytes {
            return Err(value_error(anyhow!(
                "`out` overlaps `grad` without being the same array: pass out=grad (in place) or a separate array"
            )));
        }
        // SAFETY: both buffers are exported (held by `source`/`target` until the end of this
        // call), contiguous float32 of `n` elements (checked), `target` writable, and the two
        // are the same memory or do not overlap (checked above). As numpy's own GIL-free
        // loops, this relies on no other thread writing the arrays while the step runs.
        let data = unsafe {
            if !same {
                std::ptr::copy_nonoverlapping(from, to, n);
            }
            std::slice::from_raw_parts_mut(to, n)
        };
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let running = &mut *running;
        let step = step.unwrap_or(running.next_step);
        let (algo, layout, k_in) = (self.algo, &self.layout, self.k_in);
        // The result is written where `out` lies: no copy for the dense reducers, one copy
        // in for the others (`reduce_step_in_place`).
        with_comm(py, &self.shared, |c| {
            gradkit_collectives::step::reduce_step_in_place(
                c,
                running.reducer.as_mut(),
                algo,
                layout,
                step,
                data,
                k_in,
                &mut running.sink,
            )
        })
        .map_err(run_error)?;
        running.next_step = step.wrapping_add(1);
        // The step's rows: handed to the metrics (when given), their values returned.
        let taken = std::mem::take(&mut running.sink.rows);
        let rows = taken.iter().map(|r| (r.metric.clone(), r.value)).collect();
        if let Some(m) = &self.metrics {
            m.get().add_rows(taken);
        }
        Ok(rows)
    }

    /// The state kept across steps (error-feedback residual, 1-bit error buffers, reused
    /// thresholds) as (name, float32 bytes) pairs, for a checkpoint.
    fn state<'py>(&self, py: Python<'py>) -> Vec<(String, Bound<'py, PyBytes>)> {
        let state = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .reducer
            .state();
        crate::state::to_py(py, state)
    }

    /// Restores what `state()` returned (same algorithm, world size and layers), and the
    /// step the next call reduces.
    fn load_state(
        &self,
        py: Python<'_>,
        state: Vec<(String, Bound<'_, PyAny>)>,
        next_step: u32,
    ) -> PyResult<()> {
        let values = crate::state::from_py(py, &state)?;
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running
            .reducer
            .load_state_owned(values)
            .map_err(value_error)?;
        running.next_step = next_step;
        Ok(())
    }

    /// The step the next call reduces.
    #[getter]
    fn next_step(&self) -> u32 {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next_step
    }

    /// The reducer's last messages, once after the last step (a collective).
    fn finish(&self, py: Python<'_>) -> PyResult<()> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let reducer = &mut running.reducer;
        with_comm(py, &self.shared, |c| reducer.finish(c)).map_err(run_error)
    }
}

/// The layout of (name, shape) pairs, in order.
fn layout_of(layers: Vec<(String, Vec<u32>)>) -> Result<Layout> {
    if layers.is_empty() {
        bail!("layers: give at least one (name, shape) pair");
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(layers.len());
    for (i, (name, shape)) in layers.into_iter().enumerate() {
        if !seen.insert(name.clone()) {
            bail!("layers: `{name}` is given twice");
        }
        let numel: u64 = shape.iter().map(|d| *d as u64).product();
        out.push((i as u32, name, numel, Some(shape)));
    }
    let layout = Layout::new(out);
    if layout.total() > u32::MAX as u64 {
        bail!(
            "layers: {} elements are more than the flat index space's u32 indices address",
            layout.total()
        );
    }
    Ok(layout)
}

/// `Params` from the options, each checked as the tools check their flag; `algo` becomes
/// `ring-fp16` for `wire="fp16"`.
fn params_of(
    algo: &mut Algo,
    options: &BTreeMap<String, Bound<'_, PyAny>>,
    layout: &Layout,
    world: usize,
) -> Result<Params> {
    let reads = options_read(*algo);
    let mut p = Params::default();
    let mut keep: Option<Keep> = None;
    for (name, v) in options {
        if !reads.contains(&name.as_str()) {
            bail!("{}", refusal(*algo, name));
        }
        let ctx = || format!("option `{name}`");
        match name.as_str() {
            "density" => {
                let d: f64 = v.extract().with_context(ctx)?;
                keep.get_or_insert(
                    Keep::density(d)
                        .map_err(|e| anyhow!("{e}"))
                        .with_context(ctx)?,
                );
            }
            "k" => {
                let k: u64 = v.extract().with_context(ctx)?;
                keep = Some(
                    Keep::count(k)
                        .map_err(|e| anyhow!("{e}"))
                        .with_context(ctx)?,
                );
            }
            "residual" => p.residual = v.extract().with_context(ctx)?,
            "seed" => p.seed = v.extract().with_context(ctx)?,
            "op" => p.op = named::<Op>(v).with_context(ctx)?,
            "wire" => match v.extract::<String>().with_context(ctx)?.as_str() {
                "f32" => {}
                "fp16" => *algo = gradkit_collectives::dense::with_fp16_wire(*algo),
                other => bail!("option `wire`: `{other}` is neither f32 nor fp16"),
            },
            "period" | "reeval" => {
                let t: u32 = v.extract().with_context(ctx)?;
                if t == 0 {
                    bail!("option `{name}` must be at least 1");
                }
                *(if name == "period" {
                    &mut p.period
                } else {
                    &mut p.reeval
                }) = t;
            }
            "adjust" => {
                let s: String = v.extract().with_context(ctx)?;
                p.adjust = Adjust::parse(&s).ok_or_else(|| {
                    anyhow!(
                        "option `adjust`: `{s}` is not one of {}",
                        Adjust::NAMES.join(", ")
                    )
                })?;
            }
            "balance" => p.balance = named::<Balance>(v).with_context(ctx)?,
            "reeval_step_d" => p.reeval_step_d = named::<ReevalStepD>(v).with_context(ctx)?,
            "split" => p.split = named::<Split>(v).with_context(ctx)?,
            "plan" => p.plan = Some(plan_of(*algo, v, layout, world)?),
            _ => bail!("internal: option `{name}` is read but not parsed"),
        }
    }
    if let Some(k) = keep {
        p.keep = k;
    }
    Ok(p)
}

/// Why `algo` does not take option `name`: the algorithms that read it, or the options it
/// reads.
fn refusal(algo: Algo, name: &str) -> String {
    let readers: Vec<&str> = Algo::ALL
        .iter()
        .filter(|a| runs_on_buckets(**a).is_ok() && options_read(**a).contains(&name))
        .map(|a| a.name())
        .collect();
    let mine = options_read(algo).join(", ");
    match readers.is_empty() {
        true => format!("`{name}` is no option of a gradkit reducer; {algo} takes: {mine}"),
        false => format!(
            "option `{name}` applies to {} only, not {algo} (it would be ignored); {algo} takes: {mine}",
            readers.join(", ")
        ),
    }
}

/// A value of an option enum by its name (`Balance`, `Split`, …).
fn named<T: std::str::FromStr<Err = String>>(v: &Bound<'_, PyAny>) -> Result<T> {
    let s: String = v.extract()?;
    s.parse::<T>().map_err(|e| anyhow!("{e}"))
}

/// `plan`: a plan/1 file (gradpartition's output), checked against the layers and the world
/// as gradallreduce checks `--plan`.
fn plan_of(
    algo: Algo,
    v: &Bound<'_, PyAny>,
    layout: &Layout,
    world: usize,
) -> Result<Vec<PlanRow>> {
    let path: std::path::PathBuf = v.extract().context("option `plan`: give a path")?;
    let kind = algo
        .plan_kind()
        .ok_or_else(|| anyhow!("internal: {algo} reads a plan of no kind"))?;
    let loaded = read_table::<PlanRow>(&Input::Path(path.clone()), Default::default())
        .with_context(|| format!("option `plan` {}", path.display()))?;
    gradkit_collectives::plan::check(
        loaded.rows.clone(),
        Some(&loaded.meta),
        kind,
        layout,
        world,
        0,
    )
    .with_context(|| format!("option `plan` {}", path.display()))?;
    Ok(loaded.rows)
}

/// `obj` as a writable contiguous float32 buffer of `n` elements.
pub(crate) fn writable_f32(
    obj: &Bound<'_, PyAny>,
    what: &str,
    n: usize,
) -> PyResult<PyBuffer<f32>> {
    let buf = buffer_f32(obj, what, n)?;
    if buf.readonly() {
        return Err(value_error(anyhow!("`{what}` is read-only")));
    }
    Ok(buf)
}

pub(crate) fn buffer_f32(obj: &Bound<'_, PyAny>, what: &str, n: usize) -> PyResult<PyBuffer<f32>> {
    let buf = PyBuffer::<f32>::get(obj).map_err(|e| {
        value_error(anyhow!(
            "`{what}` must be a contiguous float32 array (numpy, or a CPU tensor's .numpy()): {e}"
        ))
    })?;
    if !buf.is_c_contiguous() {
        return Err(value_error(anyhow!(
            "`{what}` is not contiguous; a copy would be silent (np.ascontiguousarray, tensor.contiguous())"
        )));
    }
    if buf.item_count() != n {
        return Err(value_error(anyhow!(
            "`{what}` holds {} elements but the layers hold {n} (a bucket whose size changed?)",
            buf.item_count()
        )));
    }
    Ok(buf)
}
