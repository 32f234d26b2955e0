//! `OnebitOptimizer(method, comm, sizes, config)`: 1-bit Adam and 1-bit LAMB of gradkit-train
//! (`optim::OnebitAdam`, `optim::OnebitLamb`, the ones `gradtrain --optimizer onebit-*` runs),
//! stepping the flat parameter vector of a PyTorch model from each rank's own gradient: during
//! the warm-up (`freeze_step` steps) the gradient's ring allreduce (mean) and the optimiser's
//! step; after it [`gradkit_train::exchange::onebit_compressed_step`]: local momentum, the
//! error-compensated 1-bit allreduce (the `onebit` reducer), the step with frozen variance.
//! `gradkit.torch.OnebitAdam` / `OnebitLamb` wrap it as `torch.optim.Optimizer`s.
//!
//! The config takes DeepSpeed's argument names where they exist (`betas`, `eps`,
//! `weight_decay`, `freeze_step`, `max_coeff`, `min_coeff`, `coeff_beta`, `factor_max`,
//! `factor_min`, `factor_threshold`) and gradkit's (`onebit_clip`, `onebit_mask`), each
//! refused where the method does not read it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use anyhow::{anyhow, bail, Context, Result};
use gradkit_collectives::{dense, reducer_for, Algo, Op, Params, Reducer};
use gradkit_core::trace::Layout;
use gradkit_train::optim::{Method, Opt, OptConfig};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::comm::{with_comm, PyComm, Shared};
use crate::reducer::{buffer_f32, writable_f32};
use crate::{run_error, value_error};

/// The options every 1-bit optimiser reads, and 1-bit LAMB's own.
const COMMON: &[&str] = &[
    "betas",
    "eps",
    "weight_decay",
    "freeze_step",
    "onebit_clip",
    "onebit_mask",
];
const LAMB_ONLY: &[&str] = &[
    "max_coeff",
    "min_coeff",
    "coeff_beta",
    "factor_max",
    "factor_min",
    "factor_threshold",
];

struct Running {
    opt: Opt,
    reducer: Box<dyn Reducer>,
}

/// See the module docs.
#[pyclass(frozen, name = "OnebitOptimizer", module = "gradkit._native")]
pub struct PyOnebit {
    shared: Shared,
    method: Method,
    n: usize,
    /// The momentum as one tensor, as gradtrain's 1-bit exchange reduces it.
    layout: Layout,
    running: Mutex<Running>,
}

#[pymethods]
impl PyOnebit {
    /// `sizes`: elements of each parameter tensor, in the order of the flat vector.
    #[new]
    fn new(
        method: &str,
        comm: &PyComm,
        sizes: Vec<usize>,
        config: BTreeMap<String, Bound<'_, PyAny>>,
    ) -> PyResult<PyOnebit> {
        let method: Method = method
            .parse()
            .map_err(|e: String| value_error(anyhow!(e)))?;
        if !method.is_onebit() {
            return Err(value_error(anyhow!(
                "{} is not a 1-bit optimiser (onebit-adam or onebit-lamb)",
                method.name()
            )));
        }
        let cfg = config_of(method, &config).map_err(value_error)?;
        let mut segments = Vec::with_capacity(sizes.len());
        let mut n = 0;
        for s in sizes {
            segments.push((n, s));
            n += s;
        }
        let opt = Opt::new(&cfg, segments).map_err(value_error)?;
        let onebit: Algo = "onebit".parse().map_err(|e| value_error(anyhow!("{e}")))?;
        let reducer = reducer_for(onebit, &Params::default()).map_err(value_error)?;
        Ok(PyOnebit {
            shared: comm.shared.clone(),
            method,
            n,
            layout: Layout::new(vec![(0, "momentum".into(), n as u64, None)]),
            running: Mutex::new(Running { opt, reducer }),
        })
    }

    /// `onebit-adam` or `onebit-lamb`.
    #[getter]
    fn method(&self) -> &'static str {
        self.method.name()
    }

    /// One step (from 0) of `params` (float32, writable, updated in place) from this rank's
    /// gradient `grad` (float32) at learning rate `lr`; a collective. Returns the step's
    /// metrics (`compressed`, the 1-bit reducer's).
    fn step(
        &self,
        py: Python<'_>,
        params: &Bound<'_, PyAny>,
        grad: &Bound<'_, PyAny>,
        lr: f32,
        step: u32,
    ) -> PyResult<Vec<(String, f64)>> {
        let pbuf = writable_f32(params, "params", self.n)?;
        let mut w = pbuf.to_vec(py)?;
        let g = buffer_f32(grad, "grad", self.n)?.to_vec(py)?;
        let layout = &self.layout;
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let running = &mut *running;
        let metrics = with_comm(py, &self.shared, |c| -> Result<Vec<(String, f64)>> {
            if !running.opt.compressing(step) {
                let mut g = g;
                let ring: Algo = "ring".parse().map_err(|e| anyhow!("{e}"))?;
                dense::allreduce(c, ring, Op::Mean, &mut g)?;
                running.opt.step(&mut w, &g, lr, step);
                return Ok(vec![("compressed".into(), 0.0)]);
            }
            let done = gradkit_train::exchange::onebit_compressed_step(
                c,
                &mut running.opt,
                running.reducer.as_mut(),
                layout,
                &mut w,
                &g,
                lr,
                step,
            )?;
            let mut m = done.metrics;
            m.push(("compressed".into(), 1.0));
            Ok(m)
        })
        .map_err(run_error)?;
        pbuf.copy_from_slice(py, &w)?;
        Ok(metrics)
    }

    /// The optimiser's state (moments, frozen and fresh variance, LAMB's coefficients) and the
    /// 1-bit reducer's error buffers (`onebit.*`), as (name, float32 bytes).
    fn state<'py>(&self, py: Python<'py>) -> Vec<(String, Bound<'py, PyBytes>)> {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let reducer = running
            .reducer
            .state()
            .into_iter()
            .map(|(k, v)| (format!("onebit.{k}"), v));
        crate::state::to_py(py, running.opt.state().into_iter().chain(reducer).collect())
    }

    /// Restores what `state()` returned.
    fn load_state(&self, py: Python<'_>, state: Vec<(String, Bound<'_, PyAny>)>) -> PyResult<()> {
        let (mut opt, mut red) = (Vec::new(), Vec::new());
        for (name, values) in crate::state::from_py(py, &state)? {
            match name.strip_prefix("onebit.") {
                Some(k) => red.push((k.to_string(), values)),
                None => opt.push((name, values)),
            }
        }
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running.opt.load_state(&opt).map_err(value_error)?;
        running.reducer.load_state_owned(red).map_err(value_error)
    }
}

/// The optimiser's config from the keywords (DeepSpeed's names), each checked.
fn config_of(method: Method, config: &BTreeMap<String, Bound<'_, PyAny>>) -> Result<OptConfig> {
    let mut c = OptConfig {
        method,
        ..OptConfig::default()
    };
    let lamb: &[&str] = match method {
        Method::OnebitLamb => LAMB_ONLY,
        _ => &[],
    };
    let reads: Vec<&str> = COMMON.iter().chain(lamb).copied().collect();
    for (name, v) in config {
        if !reads.contains(&name.as_str()) {
            let name = name.as_str();
            bail!(
                "{} takes no option `{name}`; it takes: {}",
                method.name(),
                reads.join(", ")
            );
        }
        let ctx = || format!("option `{name}`");
        let f = |v: &Bound<'_, PyAny>| -> Result<f32> { v.extract::<f32>().with_context(ctx) };
        match name.as_str() {
            "betas" => {
                let (b1, b2): (f32, f32) = v.extract().with_context(ctx)?;
                if !(0.0..1.0).contains(&b1) || !(0.0..1.0).contains(&b2) {
                    bail!("option `betas`: each must be in [0, 1), not ({b1}, {b2})");
                }
                (c.beta1, c.beta2) = (b1, b2);
            }
            "eps" => c.eps = f(v)?,
            "weight_decay" => c.weight_decay = f(v)?,
            "freeze_step" => c.freeze_step = v.extract().with_context(ctx)?,
            "onebit_clip" => c.onebit_clip = v.extract().with_context(ctx)?,
            "onebit_mask" => c.onebit_mask = v.extract().with_context(ctx)?,
            "max_coeff" => c.lamb_max = f(v)?,
            "min_coeff" => c.lamb_min = f(v)?,
            "coeff_beta" => c.coeff_beta = f(v)?,
            "factor_max" => c.factor_max = f(v)?,
            "factor_min" => c.factor_min = f(v)?,
            "factor_threshold" => c.factor_threshold = f(v)?,
            _ => bail!("internal: option `{name}` is read but not parsed"),
        }
    }
    Ok(c)
}
