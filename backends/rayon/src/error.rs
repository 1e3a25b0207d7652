//! The error of building a [`Rayon`](crate::Rayon) backend.

use std::error::Error;
use std::fmt;

/// Why [`Rayon::new`](crate::Rayon::new) failed.
///
/// (Written without `thiserror`: the backend crates depend on `kvcore`, `rayon` and the
/// numeric crates only.)
#[derive(Debug)]
#[non_exhaustive]
pub enum RayonError {
    /// A pool of zero threads was asked for.
    ZeroThreads,
    /// The operating system refused to start the pool's threads.
    Pool {
        /// Threads asked for.
        threads: usize,
        /// rayon's error.
        source: rayon::ThreadPoolBuildError,
    },
}

impl fmt::Display for RayonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RayonError::ZeroThreads => f.write_str("a rayon backend needs at least one thread"),
            RayonError::Pool { threads, .. } => {
                write!(f, "could not start a pool of {threads} threads")
            }
        }
    }
}

impl Error for RayonError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            RayonError::ZeroThreads => None,
            RayonError::Pool { source, .. } => Some(source),
        }
    }
}
