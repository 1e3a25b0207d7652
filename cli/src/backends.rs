//! Choosing a backend, its kernels and a KV store by name at run time.
//!
//! The library is generic (`Llama<B: Backend>`, `forward<K: KvStore>`); this is the one
//! place that turns a name into a type. A [`Job`] is code generic over the backend; the
//! dispatcher instantiates it once per backend, so the hot loops stay monomorphised.
//! The kernel path comes from `--kernels`, or from the environment ([`kernels`]): the
//! CLI is the one place that reads it.

use anyhow::anyhow;
use kvcore::Backend;
use kvcore_rayon::Rayon;
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;

pub use kvcore_engine::{
    BackendChoice, KvChoice, SimdPath, parse_activations, parse_kernels, parse_kv_type,
};

/// The kernel path of `backend`: `flag` (`--kernels`) when given, else what the
/// environment names for the SIMD backends: `KVCORE_SIMD=NAME` (a path by name), or
/// `KVCORE_AVX512=0` (the AVX2 kernels where the best path would be `avx512`, to measure
/// them on one machine); else `None`, the best path this CPU runs.
pub fn kernels(backend: BackendChoice, flag: Option<SimdPath>) -> anyhow::Result<Option<SimdPath>> {
    if flag.is_some() || backend == BackendChoice::Scalar {
        return Ok(flag);
    }
    let var = |name| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if let Some(name) = var("KVCORE_SIMD") {
        let path = parse_kernels(name.trim()).map_err(|e| anyhow!("KVCORE_SIMD: {e}"))?;
        return Ok(Some(path));
    }
    let avx2 = var("KVCORE_AVX512").is_some_and(|v| v.trim() == "0")
        && Simd::best().path() == SimdPath::Avx512;
    Ok(avx2.then_some(SimdPath::Avx2Fma))
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

/// Runs `job` with the backend `choice` names (`threads` applies to `rayon`) on the
/// kernel path [`kernels`] gives for `--kernels` (`flag`).
pub fn dispatch<J: Job>(
    choice: BackendChoice,
    threads: usize,
    flag: Option<SimdPath>,
    job: J,
) -> anyhow::Result<J::Output> {
    let simd = choice
        .simd(kernels(choice, flag)?)
        .map_err(anyhow::Error::msg)?;
    match choice {
        BackendChoice::Scalar => job.run(Scalar::new()),
        BackendChoice::Simd => job.run(simd),
        BackendChoice::Rayon => job.run(Rayon::new(simd, threads)?),
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
