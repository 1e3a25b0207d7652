//! Engine errors as Python exceptions.
//!
//! The classes are defined in Python (`kvcore/_errors.py`), where multiple inheritance
//! is plain (`InvalidArgumentError` is also a `ValueError`, `IoError` an `OSError`), and
//! looked up here on first use.

use kvcore_engine::{Error, ErrorKind};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyModule, PyType};

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The exception class named `name` (`"InvalidArgumentError"`, ...) raised with
/// `message`.
pub fn raise(name: &str, message: String) -> PyErr {
    Python::attach(|py| {
        let class = ERRORS
            .get_or_try_init(py, || py.import("kvcore._errors").map(Bound::unbind))
            .and_then(|m| m.bind(py).getattr(name))
            .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
        match class {
            Ok(class) => PyErr::from_type(class, message),
            Err(e) => e,
        }
    })
}

/// The class of an [`ErrorKind`].
pub fn class_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidArgument => "InvalidArgumentError",
        ErrorKind::Io => "IoError",
        ErrorKind::ModelFile => "ModelFileError",
        ErrorKind::ContextOverflow => "ContextOverflowError",
        ErrorKind::SessionFile => "SessionFileError",
        ErrorKind::Kv => "KvCacheError",
        ErrorKind::Tokenizer => "TokenizerError",
        ErrorKind::Fetch => "FetchError",
        _ => "KvcoreError",
    }
}

/// The engine's error as the exception of its kind, with its message.
pub fn to_py(e: Error) -> PyErr {
    raise(class_name(e.kind()), e.message())
}

/// An `InvalidArgumentError` (also a `ValueError`) raised by the binding's own argument
/// checks.
pub fn invalid(message: String) -> PyErr {
    raise("InvalidArgumentError", message)
}

/// The error of a call on a session another call holds.
pub fn busy() -> PyErr {
    raise(
        "SessionBusyError",
        "the session is in use: a generation or an unfinished stream (exhaust or close() it), \
         or a call from another thread, holds it"
            .to_string(),
    )
}
