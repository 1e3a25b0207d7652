//! `kvcore._kvcore`, the extension module of the `kvcore` Python package: a thin PyO3
//! layer over `kvcore-engine` (no numerics, sampling or text handling of its own).
//!
//! - [`Model`](model::Model): an `Arc<Engine>`, shared by every thread.
//! - [`Session`](session::Session): an `EngineSession` lent to one call at a time.
//! - [`Sampler`]: the core's sampler, behind a mutex.
//! - [`TextStream`](stream::TextStream): a generation on a worker thread.
//!
//! Every call that computes (load, prefill, step, sample, generate, embed, save, load a
//! session) releases the GIL. See `docs/python.md`.

#![forbid(unsafe_code)]
// The engine's `Error` is large (over clippy's 128 bytes); the closures that run engine
// calls without the GIL return it as it is, and it becomes a `PyErr` right after.
#![allow(clippy::result_large_err)]

mod args;
mod errors;
mod model;
mod session;
mod stream;

use kvcore_engine::kvcore::model::{self as core_model, SamplerParams};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// The core's sampler chain (llama.cpp's order): its parameters and the state of its
/// random generator, which advances with every draw.
#[pyclass(frozen, module = "kvcore", name = "Sampler")]
pub struct Sampler {
    inner: Mutex<core_model::Sampler>,
}

impl Sampler {
    fn lock(&self) -> MutexGuard<'_, core_model::Sampler> {
        session::lock(&self.inner)
    }

    fn from_params(params: SamplerParams) -> PyResult<Sampler> {
        let s = core_model::Sampler::with_params(params)
            .map_err(|e| errors::to_py(kvcore_engine::Error::from(e)))?;
        Ok(Sampler {
            inner: Mutex::new(s),
        })
    }

    fn params(&self) -> SamplerParams {
        self.lock().params().clone()
    }
}

#[pymethods]
impl Sampler {
    #[new]
    #[pyo3(signature = (
        temperature = 0.8,
        top_k = 40,
        top_p = 0.95,
        min_p = 0.05,
        repeat_penalty = 1.0,
        repeat_last_n = 64,
        presence_penalty = 0.0,
        frequency_penalty = 0.0,
        seed = 0,
        *,
        logit_bias = None,
    ))]
    #[allow(clippy::too_many_arguments)] // Python keywords, one per sampling knob
    fn new(
        temperature: f32,
        top_k: i64,
        top_p: f32,
        min_p: f32,
        repeat_penalty: f32,
        repeat_last_n: i64,
        presence_penalty: f32,
        frequency_penalty: f32,
        seed: i128,
        logit_bias: Option<HashMap<i64, f32>>,
    ) -> PyResult<Sampler> {
        let sampling = args::Sampling {
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            repeat_last_n,
            presence_penalty,
            frequency_penalty,
            logit_bias,
            seed,
        };
        Sampler::from_params(sampling.params()?)
    }

    /// Greedy with every other stage off: the highest logit, the lowest id among ties.
    #[staticmethod]
    fn greedy() -> PyResult<Sampler> {
        Sampler::from_params(SamplerParams::greedy())
    }

    /// Whether the sampler always picks the largest (biased, penalised) logit.
    #[getter]
    fn is_greedy(&self) -> bool {
        self.lock().is_greedy()
    }

    #[getter]
    fn temperature(&self) -> f32 {
        self.params().temperature
    }

    #[getter]
    fn top_k(&self) -> usize {
        self.params().top_k
    }

    #[getter]
    fn top_p(&self) -> f32 {
        self.params().top_p
    }

    #[getter]
    fn min_p(&self) -> f32 {
        self.params().min_p
    }

    #[getter]
    fn repeat_penalty(&self) -> f32 {
        self.params().repeat_penalty
    }

    /// `-1`: the whole context.
    #[getter]
    fn repeat_last_n(&self) -> i64 {
        i64::try_from(self.params().repeat_last_n).unwrap_or(-1)
    }

    #[getter]
    fn presence_penalty(&self) -> f32 {
        self.params().presence_penalty
    }

    #[getter]
    fn frequency_penalty(&self) -> f32 {
        self.params().frequency_penalty
    }

    #[getter]
    fn logit_bias(&self) -> HashMap<u32, f32> {
        self.params().logit_bias.into_iter().collect()
    }

    #[getter]
    fn seed(&self) -> u64 {
        self.params().seed
    }

    fn __repr__(&self) -> String {
        let p = self.params();
        format!(
            "Sampler(temperature={}, top_k={}, top_p={}, min_p={}, repeat_penalty={}, \
             repeat_last_n={}, presence_penalty={}, frequency_penalty={}, seed={})",
            p.temperature,
            p.top_k,
            p.top_p,
            p.min_p,
            p.repeat_penalty,
            self.repeat_last_n(),
            p.presence_penalty,
            p.frequency_penalty,
            p.seed
        )
    }
}

/// The engine's default sampling parameters, for the tests to hold the keyword defaults
/// of `Sampler`, `Model.generate` and `Model.chat` to.
fn default_sampling(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let p = SamplerParams::default();
    let d = PyDict::new(py);
    d.set_item("temperature", p.temperature)?;
    d.set_item("top_k", p.top_k)?;
    d.set_item("top_p", p.top_p)?;
    d.set_item("min_p", p.min_p)?;
    d.set_item("repeat_penalty", p.repeat_penalty)?;
    d.set_item("repeat_last_n", p.repeat_last_n)?;
    d.set_item("presence_penalty", p.presence_penalty)?;
    d.set_item("frequency_penalty", p.frequency_penalty)?;
    d.set_item("seed", p.seed)?;
    Ok(d)
}

/// The number of cores this process may use (the rayon backend's default threads).
#[pyfunction]
fn cores() -> usize {
    kvcore_engine::cores()
}

#[pymodule]
fn _kvcore(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<model::Model>()?;
    m.add_class::<session::Session>()?;
    m.add_class::<Sampler>()?;
    m.add_class::<stream::TextStream>()?;
    m.add_class::<model::Stats>()?;
    m.add_function(wrap_pyfunction!(cores, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("_DEFAULT_SAMPLING", default_sampling(m.py())?)?;
    Ok(())
}
