//! Choices by name: the backend, the KV store, the activations and the KV element type,
//! as a CLI flag, a C string or a Python keyword names them.

use kvcore::model::Activations;
use kvcore::model::{Llama, ModelError};
use kvcore::{Backend, DenseKv, KvStore, KvType};
use std::fmt;
use std::str::FromStr;

/// A backend by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// `kvcore-scalar`, the readable reference.
    Scalar,
    /// `kvcore-simd`, AVX2+FMA or NEON kernels on one thread.
    Simd,
    /// `kvcore-rayon` over `kvcore-simd`, on several threads.
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
    /// The model's growing store (`Llama::new_kv`): grows on demand up to the context;
    /// `GrowKv`, or `WindowKv` for a model with sliding-window layers.
    Grow,
    /// `DenseKv`: preallocates the whole context of every layer.
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

impl KvChoice {
    /// An empty store of this kind for `model`, holding up to `max_ctx` positions, with
    /// K rows in `types.0` and V rows in `types.1`: the one place the CLI, the engine and
    /// the bindings make a store.
    pub fn new_store<B: Backend>(
        self,
        model: &Llama<B>,
        max_ctx: usize,
        types: (KvType, KvType),
    ) -> Result<Box<dyn KvStore>, ModelError> {
        Ok(match self {
            KvChoice::Grow => model.new_kv_with_types(max_ctx, types)?,
            KvChoice::Dense => {
                let keys = model.key_codec(types.0, max_ctx)?;
                let kv = DenseKv::with_types(model.kv_geometry(), max_ctx, types)?;
                Box::new(kv.with_key_codec(&keys)?)
            }
        })
    }
}

/// Parses activations by name: `f32` or `q8`.
pub fn parse_activations(s: &str) -> Result<Activations, String> {
    match s {
        "f32" => Ok(Activations::F32),
        "q8" => Ok(Activations::Q8),
        other => Err(format!("unknown activations {other:?}; valid: f32, q8")),
    }
}

/// Parses a KV element type by name: `f32`, `f16`, `bf16`, `q8_0` (the names of
/// [`KvType::ALL`]).
pub fn parse_kv_type(s: &str) -> Result<KvType, String> {
    KvType::ALL
        .into_iter()
        .find(|t| t.name() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = KvType::ALL.iter().map(|t| t.name()).collect();
            format!("unknown KV type {s:?}; valid: {}", names.join(", "))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for b in [
            BackendChoice::Scalar,
            BackendChoice::Simd,
            BackendChoice::Rayon,
        ] {
            assert_eq!(b.to_string().parse::<BackendChoice>(), Ok(b));
        }
        for k in [KvChoice::Grow, KvChoice::Dense] {
            assert_eq!(k.to_string().parse::<KvChoice>(), Ok(k));
        }
        assert!(
            "cuda"
                .parse::<BackendChoice>()
                .unwrap_err()
                .contains("\"cuda\"")
        );
        assert_eq!(parse_activations("q8"), Ok(Activations::Q8));
        assert!(
            parse_activations("q4")
                .unwrap_err()
                .contains("valid: f32, q8")
        );
        assert_eq!(parse_kv_type("f32"), Ok(KvType::F32));
        assert_eq!(parse_kv_type("q8_0"), Ok(KvType::Q8_0));
        assert!(
            parse_kv_type("q4_0")
                .unwrap_err()
                .contains("unknown KV type \"q4_0\"; valid: f32, f16, bf16, q8_0")
        );
    }
}
