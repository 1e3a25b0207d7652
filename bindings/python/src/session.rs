//! `kvcore.Session`, and the slot that lends its engine session to one call at a time.
//!
//! An [`EngineSession`] is `Send` but not `Sync`. The Python object holds it in a
//! [`Slot`]: a call takes it out (a [`Lease`]), runs with the GIL released, and puts it
//! back when the lease drops (also on an error or a panic). A second call while it is
//! out, from another thread or while a stream holds it, gets `SessionBusyError` at once
//! instead of blocking: a block could never end when the caller is the thread that must
//! consume the stream holding the session. The slot's mutex is only held to take the
//! session out or put it back, never during compute, so taking it with the GIL held
//! cannot deadlock.

use crate::args::{count, token_id, token_ids};
use crate::errors::{busy, to_py};
use crate::model::{Model, Stats};
use kvcore_engine::{Engine, EngineSession};
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyType;
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Locks `m`; a poisoned lock (a panic while it was held) is taken as it is: every value
/// guarded here is valid whatever the panic interrupted.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// [`lock`] for an exclusive borrow.
pub fn get_mut<T>(m: &mut Mutex<T>) -> &mut T {
    m.get_mut().unwrap_or_else(PoisonError::into_inner)
}

/// An engine session when no call holds it, and the statistics of its last generation.
pub struct Slot {
    session: Mutex<Option<EngineSession>>,
    stats: Mutex<Option<Stats>>,
}

impl Slot {
    pub fn new(session: EngineSession) -> Arc<Slot> {
        Arc::new(Slot {
            session: Mutex::new(Some(session)),
            stats: Mutex::new(None),
        })
    }

    /// Takes the session out until the lease drops; `SessionBusyError` when a call
    /// already holds it.
    pub fn lease(self: &Arc<Self>) -> PyResult<Lease> {
        let session = lock(&self.session).take().ok_or_else(busy)?;
        Ok(Lease {
            slot: Arc::clone(self),
            session: Some(session),
        })
    }

    pub fn set_stats(&self, stats: Stats) {
        *lock(&self.stats) = Some(stats);
    }

    pub fn stats(&self) -> Option<Stats> {
        lock(&self.stats).clone()
    }
}

/// The session of a [`Slot`], out of it until dropped. `Send`: a stream's worker thread
/// holds it for the whole generation.
pub struct Lease {
    slot: Arc<Slot>,
    /// `Some` until `drop` puts it back.
    session: Option<EngineSession>,
}

const HELD: &str = "a lease holds its session until it is dropped";

impl Lease {
    pub fn slot(&self) -> &Slot {
        &self.slot
    }
}

impl Deref for Lease {
    type Target = EngineSession;
    fn deref(&self) -> &EngineSession {
        self.session.as_ref().expect(HELD)
    }
}

impl DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut EngineSession {
        self.session.as_mut().expect(HELD)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            *lock(&self.slot.session) = Some(s);
        }
    }
}

/// The logits the engine holds, copied into a vector NumPy takes over (the engine keeps
/// its own for `sample`).
fn logits_vec(s: &EngineSession) -> Vec<f32> {
    s.logits().map(<[f32]>::to_vec).unwrap_or_default()
}

/// A sequence in a model's KV cache: the ids it holds and the logits of its last
/// position.
#[pyclass(frozen, module = "kvcore", name = "Session")]
pub struct Session {
    model: Py<Model>,
    engine: Arc<Engine>,
    slot: Arc<Slot>,
}

impl Session {
    fn wrap(model: Py<Model>, engine: Arc<Engine>, session: EngineSession) -> Session {
        Session {
            model,
            engine,
            slot: Slot::new(session),
        }
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }
}

fn max_ctx(ctx: Option<i64>) -> PyResult<Option<usize>> {
    ctx.map(|n| count("ctx", n)).transpose()
}

#[pymethods]
impl Session {
    #[new]
    #[pyo3(signature = (model, ctx = None))]
    fn new(py: Python<'_>, model: Bound<'_, Model>, ctx: Option<i64>) -> PyResult<Session> {
        let ctx = max_ctx(ctx)?;
        let engine = Arc::clone(&model.get().engine);
        let s = py.detach(|| engine.new_session(ctx)).map_err(to_py)?;
        Ok(Session::wrap(model.unbind(), engine, s))
    }

    /// Makes the session hold `ids`, running the model only past the prefix it already
    /// holds; returns the logits of the last position.
    fn prefill<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let ids = token_ids(ids)?;
        let mut lease = self.slot.lease()?;
        let engine = &*self.engine;
        let logits = py
            .detach(|| {
                engine.prefill(&mut lease, &ids)?;
                Ok(logits_vec(&lease))
            })
            .map_err(to_py)?;
        Ok(PyArray1::from_vec(py, logits))
    }

    /// Appends `id` (one decode step); returns its logits.
    fn step<'py>(&self, py: Python<'py>, id: i64) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let id = token_id(id)?;
        let mut lease = self.slot.lease()?;
        let engine = &*self.engine;
        let logits = py
            .detach(|| engine.decode(&mut lease, id).map(<[f32]>::to_vec))
            .map_err(to_py)?;
        Ok(PyArray1::from_vec(py, logits))
    }

    /// The next token `sampler` picks from the last logits (the session is unchanged).
    fn sample(&self, py: Python<'_>, sampler: &Bound<'_, crate::Sampler>) -> PyResult<u32> {
        let lease = self.slot.lease()?;
        let engine = &*self.engine;
        let sampler = sampler.get();
        py.detach(move || engine.sample(&lease, &mut sampler.lock()))
            .map_err(to_py)
    }

    /// The logits of the last position (after `prefill` or `step`; `None` after a
    /// generation, a truncation or a load).
    #[getter]
    fn logits<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArray1<f32>>>> {
        let lease = self.slot.lease()?;
        Ok(lease
            .logits()
            .is_some()
            .then(|| PyArray1::from_vec(py, logits_vec(&lease))))
    }

    /// Keeps the first `min(n, len)` positions.
    fn truncate(&self, n: i64) -> PyResult<()> {
        let n = count("n", n)?;
        self.slot.lease()?.truncate(n).map_err(to_py)
    }

    /// A second, independent session starting from this one's positions and logits.
    fn fork(&self, py: Python<'_>) -> PyResult<Session> {
        let lease = self.slot.lease()?;
        let s = py.detach(move || lease.fork()).map_err(to_py)?;
        Ok(Session::wrap(
            self.model.clone_ref(py),
            Arc::clone(&self.engine),
            s,
        ))
    }

    /// Writes the session to `path` (atomically).
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let lease = self.slot.lease()?;
        let engine = &*self.engine;
        py.detach(move || engine.save_session(&lease, &path))
            .map_err(to_py)
    }

    /// Replaces the session's positions with those of the file at `path`; on error the
    /// session is unchanged.
    fn restore(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let mut lease = self.slot.lease()?;
        let engine = &*self.engine;
        py.detach(|| engine.restore_session(&mut lease, &path))
            .map_err(to_py)
    }

    /// A session holding the file at `path` (written by `save` for this model).
    #[classmethod]
    #[pyo3(signature = (path, model, ctx = None))]
    fn load(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        path: PathBuf,
        model: Bound<'_, Model>,
        ctx: Option<i64>,
    ) -> PyResult<Session> {
        let ctx = max_ctx(ctx)?;
        let engine = Arc::clone(&model.get().engine);
        let s = py
            .detach(|| engine.load_session(&path, ctx))
            .map_err(to_py)?;
        Ok(Session::wrap(model.unbind(), engine, s))
    }

    /// The ids held, one per cached position.
    #[getter]
    fn tokens(&self) -> PyResult<Vec<u32>> {
        Ok(self.slot.lease()?.tokens().to_vec())
    }

    fn __len__(&self) -> PyResult<usize> {
        Ok(self.slot.lease()?.len())
    }

    /// The most positions the session can hold.
    #[getter]
    fn max_ctx(&self) -> PyResult<usize> {
        Ok(self.slot.lease()?.max_ctx())
    }

    /// Bytes the KV cache holds now.
    #[getter]
    fn kv_bytes(&self) -> PyResult<usize> {
        Ok(self.slot.lease()?.kv_bytes())
    }

    /// The model the session belongs to.
    #[getter]
    fn model(&self, py: Python<'_>) -> Py<Model> {
        self.model.clone_ref(py)
    }

    /// The statistics of the last generation run in this session (`None` before one).
    #[getter]
    fn last_stats(&self) -> Option<Stats> {
        self.slot.stats()
    }

    fn __repr__(&self) -> String {
        match self.slot.lease() {
            Ok(s) => format!("Session(len={}, max_ctx={})", s.len(), s.max_ctx()),
            Err(_) => "Session(<in use>)".to_string(),
        }
    }
}
