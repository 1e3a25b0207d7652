//! Choosing a backend and a KV store by name at run time.
//!
//! The library is generic (`Llama<B: Backend>`, `forward<K: KvStore>`); this is the one
//! place that turns a name into a type. A [`Job`] is code generic over the backend; the
//! dispatcher instantiates it once per backend, so the hot loops stay monomorphised.

use kvcore::Backend;
use kvcore::model::Activations;
use kvcore_rayon::Rayon;
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;
use std::fmt;
use std::str::FromStr;

/// A backend by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// `kvcore-scalar`, the readable reference.
    Scalar,
    /// `kvcore-simd`, AVX2+FMA or NEON kernels on one thread.
    Simd,
    /// `kvcore-rayon` over `kvcore-simd`, on `--threads` threads.
    Rayon,
}

impl BackendChoice {
    /// The valid names, for messages.
    pub const NAMES: &'static str = "scalar, simd, rayon";
}

impl FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "scalar" => Ok(BackendChoice::Scalar),
            "simd" => Ok(BackendChoice::Simd),
            "rayon" => Ok(BackendChoice::Rayon),
            other => Err(format!(
                "unknown backend {other:?}; valid backends: {}",
                BackendChoice::NAMES
            )),
        }
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendChoice::Scalar => "scalar",
            BackendChoice::Simd => "simd",
            BackendChoice::Rayon => "rayon",
        })
    }
}

/// A KV store by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvChoice {
    /// `GrowKv`: grows on demand up to `--ctx`.
    Grow,
    /// `DenseKv`: preallocates `--ctx` positions.
    Dense,
}

impl FromStr for KvChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "grow" => Ok(KvChoice::Grow),
            "dense" => Ok(KvChoice::Dense),
            other => Err(format!("unknown KV store {other:?}; valid: grow, dense")),
        }
    }
}

impl fmt::Display for KvChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvChoice::Grow => "grow",
            KvChoice::Dense => "dense",
        })
    }
}

/// Parses `--activations`: `f32` or `q8`.
pub fn parse_activations(s: &str) -> Result<Activations, String> {
    match s {
        "f32" => Ok(Activations::F32),
        "q8" => Ok(Activations::Q8),
        other => Err(format!("unknown activations {other:?}; valid: f32, q8")),
    }
}

/// Work that is generic over the backend.
pub trait Job {
    /// What the job returns.
    type Output;
    /// Runs the job with backend `b`.
    fn run<B: Backend>(self, b: B) -> anyhow::Result<Self::Output>;
}

/// Runs `job` with the backend `choice` names (`threads` applies to `rayon`).
pub fn dispatch<J: Job>(
    choice: BackendChoice,
    threads: usize,
    job: J,
) -> anyhow::Result<J::Output> {
    match choice {
        BackendChoice::Scalar => job.run(Scalar::new()),
        BackendChoice::Simd => job.run(Simd::new()),
        BackendChoice::Rayon => job.run(Rayon::new(Simd::new(), threads)?),
    }
}
