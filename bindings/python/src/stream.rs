//! `stream=True`: the generation runs on a worker thread, which sends each piece of text
//! through a bounded channel; the Python iterator receives them with the GIL released.
//!
//! Cancellation: closing or dropping the iterator drops the receiver, so the worker's
//! next send fails, the engine's text callback returns false and the generation stops
//! after that piece. The worker holds the session's [`Lease`] for the whole generation
//! and drops it before it ends; `close()`, the end of the stream and the iterator's drop
//! all join the worker, so once any of them returns the session is back in its
//! `Session`.

use crate::errors::{class_name, raise};
use crate::model::Stats;
use crate::session::{Lease, get_mut, lock};
use kvcore_engine::{Engine, GenerateParams};
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Pieces the worker may run ahead of the reader.
const BUFFER: usize = 4;

/// How often a waiting `__next__` checks for Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

enum Msg {
    Piece(String),
    /// The engine's error, as its exception class and message.
    Failed(&'static str, String),
}

/// An iterator over the pieces of text of a generation running on a worker thread.
#[pyclass(frozen, module = "kvcore", name = "TextStream")]
pub struct TextStream {
    /// `None` once the stream is finished or closed.
    rx: Mutex<Option<Receiver<Msg>>>,
    /// `None` once joined.
    worker: Mutex<Option<JoinHandle<()>>>,
    /// Written by the worker when the generation ends.
    stats: Arc<Mutex<Option<Stats>>>,
}

/// Starts generating after `ids` in `lease`'s session on a worker thread.
pub fn start(
    engine: Arc<Engine>,
    mut lease: Lease,
    ids: Vec<u32>,
    params: GenerateParams,
) -> PyResult<TextStream> {
    let (tx, rx) = sync_channel(BUFFER);
    let stats = Arc::new(Mutex::new(None));
    let out = Arc::clone(&stats);
    let worker = std::thread::Builder::new()
        .name("kvcore-generate".to_string())
        .spawn(move || {
            let result = engine.generate(&mut lease, &ids, &params, |piece| {
                tx.send(Msg::Piece(piece.to_owned())).is_ok()
            });
            match result {
                Ok(c) => {
                    let s = Stats::new(&c);
                    lease.slot().set_stats(s.clone());
                    *lock(&out) = Some(s);
                    drop(lease);
                }
                Err(e) => {
                    drop(lease);
                    let _ = tx.send(Msg::Failed(class_name(e.kind()), e.message()));
                }
            }
        })
        .map_err(|e| raise("IoError", format!("cannot start a generation thread: {e}")))?;
    Ok(TextStream {
        rx: Mutex::new(Some(rx)),
        worker: Mutex::new(Some(worker)),
        stats,
    })
}

enum Next {
    Piece(String),
    End,
    Failed(&'static str, String),
    Interrupted(PyErr),
}

impl TextStream {
    /// Ends the stream: drops the receiver (cancelling a generation still running) and
    /// waits for the worker, without the GIL.
    fn finish(&self, py: Python<'_>) -> PyResult<()> {
        let joined = py.detach(|| {
            lock(&self.rx).take();
            lock(&self.worker).take().map(JoinHandle::join)
        });
        match joined {
            Some(Err(_)) => Err(PanicException::new_err("the generation thread panicked")),
            _ => Ok(()),
        }
    }
}

#[pymethods]
impl TextStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let next = py.detach(|| {
            let rx = lock(&self.rx);
            let Some(rx) = rx.as_ref() else {
                return Next::End;
            };
            loop {
                match rx.recv_timeout(SIGNAL_POLL) {
                    Ok(Msg::Piece(p)) => return Next::Piece(p),
                    Ok(Msg::Failed(class, message)) => return Next::Failed(class, message),
                    Err(RecvTimeoutError::Disconnected) => return Next::End,
                    Err(RecvTimeoutError::Timeout) => {
                        if let Err(e) = Python::attach(|py| py.check_signals()) {
                            return Next::Interrupted(e);
                        }
                    }
                }
            }
        });
        match next {
            Next::Piece(p) => Ok(Some(p)),
            Next::End => self.finish(py).map(|()| None),
            Next::Failed(class, message) => {
                self.finish(py)?;
                Err(raise(class, message))
            }
            Next::Interrupted(e) => Err(e),
        }
    }

    /// Stops the generation (if it is still running) and gives the session back.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.finish(py)
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.finish(py).map(|()| false)
    }

    /// The statistics of the generation once it has ended (`None` before).
    #[getter]
    fn stats(&self) -> Option<Stats> {
        lock(&self.stats).clone()
    }
}

impl Drop for TextStream {
    fn drop(&mut self) {
        // Cancel, then wait for the worker so the session is back when the iterator is
        // gone; without the GIL, since a long prefill may still be running.
        get_mut(&mut self.rx).take();
        if let Some(w) = get_mut(&mut self.worker).take() {
            Python::attach(|py| py.detach(|| drop(w.join())));
        }
    }
}
