//! Choosing a backend and a KV store by name at run time.
//!
//! The library is generic (`Llama<B: Backend>`, `forward<K: KvStore>`); this is the one
//! place that turns a name into a type. A [`Job`] is code generic over the backend; the
//! dispatcher instantiates it once per backend, so the hot loops stay monomorphised.

use kvcore::Backend;
use kvcore_rayon::Rayon;
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;

pub use kvcore_engine::{BackendChoice, KvChoice, parse_activations, parse_kv_type};

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
