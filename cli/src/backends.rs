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
    /// The model's growing store (`Llama::new_kv`): grows on demand up to `--ctx`;
    /// `GrowKv`, or `WindowKv` for a model with sliding-window layers.
    Grow,
    /// `DenseKv`: preallocates `--ctx` positions of every layer.
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

/// Parses `--logit-bias ID(+|-)BIAS` as llama.cpp does: `15043+1`, `15043-0.5`,
/// `2-inf` (never pick token 2).
pub fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let bad = || format!("expected ID+BIAS or ID-BIAS (e.g. 15043+1, 2-inf), got {s:?}");
    let at = s.find(['+', '-']).ok_or_else(bad)?;
    let id: u32 = s[..at].trim().parse().map_err(|_| bad())?;
    let magnitude: f32 = s[at + 1..].trim().parse().map_err(|_| bad())?;
    if magnitude.is_nan() || magnitude < 0.0 {
        return Err(bad());
    }
    let bias = if s[at..].starts_with('-') {
        -magnitude
    } else {
        magnitude
    };
    Ok((id, bias))
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

#[cfg(test)]
mod tests {
    use super::parse_logit_bias;

    #[test]
    fn logit_bias_parses_like_llama_cpp() {
        assert_eq!(parse_logit_bias("15043+1"), Ok((15043, 1.0)));
        assert_eq!(parse_logit_bias("7-0.5"), Ok((7, -0.5)));
        assert_eq!(parse_logit_bias("2-inf"), Ok((2, f32::NEG_INFINITY)));
        for bad in ["", "15043", "+1", "x+1", "1+", "1+x", "1--2", "1+nan"] {
            let err = parse_logit_bias(bad).unwrap_err();
            assert!(err.contains("ID+BIAS"), "{bad:?}: {err}");
        }
    }
}
