//! Choices by name: the backend, its kernel path, the KV store, the activations and the
//! KV element type, as a CLI flag, a C string or a Python keyword names them.

use kvcore::kv::Checkpoints;
use kvcore::model::Activations;
use kvcore::model::{Llama, ModelError};
use kvcore::{Backend, DenseKv, KvStore, KvType, SinkKv, WindowKv};
use kvcore_simd::{Simd, SimdPath};
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

    /// The SIMD backend this backend computes with on the kernel path `kernels` (`None`:
    /// the best this CPU runs), or why not: a path this CPU does not run is refused,
    /// naming the ones it does (never a silent fallback), and the scalar backend takes
    /// no path but `scalar` (it runs no SIMD kernel: the `Simd` is then unused).
    pub fn simd(self, kernels: Option<SimdPath>) -> Result<Simd, String> {
        match (self, kernels) {
            (BackendChoice::Scalar, Some(p)) if p != SimdPath::Scalar => Err(format!(
                "the scalar backend has no {p} kernels; kernels apply to the simd and rayon backends"
            )),
            (_, None) => Ok(Simd::best()),
            (_, Some(p)) => simd_on(p),
        }
    }
}

/// `FromStr` and `Display` for the choice `$ty` from one table of its variants' names;
/// an unknown name's error names `$what` and the valid names ([`unknown`]).
macro_rules! named {
    ($ty:ident, $what:literal: $($variant:ident = $name:literal),+ $(,)?) => {
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($name => Ok($ty::$variant),)+
                    other => Err(unknown($what, other, &[$($name),+])),
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self {
                    $($ty::$variant => $name,)+
                })
            }
        }
    };
}

/// The error for the unknown `name` of a `what`, listing the valid `names`.
fn unknown(what: &str, name: &str, names: &[&str]) -> String {
    format!("unknown {what} {name:?}; valid: {}", names.join(", "))
}

named!(BackendChoice, "backend": Scalar = "scalar", Simd = "simd", Rayon = "rayon");

/// A KV store by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvChoice {
    /// The model's growing store (`Llama::new_kv`): grows on demand up to the context;
    /// `GrowKv`, or `WindowKv` for a model with sliding-window layers.
    Grow,
    /// `DenseKv`: preallocates the whole context of every layer.
    Dense,
}

named!(KvChoice, "KV store": Grow = "grow", Dense = "dense");

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

    /// [`new_store`](Self::new_store) for a session: the growing store of a model with
    /// sliding-window layers keeps window `checkpoints` ([`Checkpoints`]: a rewind
    /// behind the window then re-prefills from the nearest one); every other store is
    /// `new_store`'s.
    pub fn new_session_store<B: Backend>(
        self,
        model: &Llama<B>,
        max_ctx: usize,
        types: (KvType, KvType),
        checkpoints: Checkpoints,
    ) -> Result<Box<dyn KvStore>, ModelError> {
        let windows = model.config().windows();
        if self != KvChoice::Grow || checkpoints.count == 0 || windows.iter().all(Option::is_none) {
            return self.new_store(model, max_ctx, types);
        }
        // `with_types` checks the types' blocks before the keys' calibration runs.
        let kv = WindowKv::with_types(model.kv_geometry(), max_ctx, &windows, types)?;
        let keys = model.key_codec(types.0, max_ctx)?;
        Ok(Box::new(
            kv.with_key_codec(&keys)?.with_checkpoints(checkpoints),
        ))
    }
}

/// An empty sink store for `model` ([`SinkKv`]: StreamingLLM's attention sinks beside a
/// window): every layer keeps the first `keep` positions and the last `cache − keep` of
/// a sequence of up to `max_positions`, so at most `cache` positions per layer; K rows
/// in `types.0`, V rows in `types.1`, keys through the model's codec.
///
/// Errors, naming the problem: a model with sliding-window layers (their own window
/// is the model's; sinks are for models trained without one), `cache ≤ keep` (no
/// window), and the store's own errors.
pub fn sink_store<B: Backend>(
    model: &Llama<B>,
    cache: usize,
    keep: usize,
    max_positions: usize,
    types: (KvType, KvType),
) -> Result<Box<dyn KvStore>, String> {
    if model.config().windows().iter().any(Option::is_some) {
        return Err(
            "attention sinks are for models without sliding-window layers; this model has some"
                .into(),
        );
    }
    if cache <= keep {
        return Err(format!(
            "a cache of {cache} positions leaves no window beside {keep} sinks (--keep)"
        ));
    }
    let keys = (model.key_codec(types.0, max_positions)).map_err(|e| e.to_string())?;
    let store = SinkKv::with_types(
        model.kv_geometry(),
        max_positions,
        keep,
        cache - keep,
        types,
    )
    .and_then(|s| s.with_key_codec(&keys))
    .map_err(|e| e.to_string())?;
    Ok(Box::new(store))
}

/// Parses a kernel path of the SIMD backend by name: `avx512`, `avx2`, `neon`, `simd128`
/// or `scalar` (the names of [`SimdPath::ALL`]), whether or not this CPU runs it
/// ([`BackendChoice::simd`] says).
pub fn parse_kernels(s: &str) -> Result<SimdPath, String> {
    SimdPath::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = SimdPath::ALL.iter().map(|p| p.name()).collect();
        unknown("kernels", s, &names)
    })
}

/// The SIMD backend on `path`, or an error naming the paths this CPU runs.
fn simd_on(path: SimdPath) -> Result<Simd, String> {
    Simd::with_path(path).ok_or_else(|| {
        let here: Vec<&str> = SimdPath::ALL
            .iter()
            .filter(|p| p.runs_here())
            .map(|p| p.name())
            .collect();
        format!(
            "this CPU does not run the {path} kernels; it runs: {}",
            here.join(", ")
        )
    })
}

/// Parses activations by name: `f32` or `q8`.
pub fn parse_activations(s: &str) -> Result<Activations, String> {
    match s {
        "f32" => Ok(Activations::F32),
        "q8" => Ok(Activations::Q8),
        other => Err(unknown("activations", other, &["f32", "q8"])),
    }
}

/// Parses a KV element type by name: `f32`, `f16`, `bf16`, `q8_0`, `q4_0` (the names of
/// [`KvType::ALL`]).
pub fn parse_kv_type(s: &str) -> Result<KvType, String> {
    KvType::ALL
        .into_iter()
        .find(|t| t.name() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = KvType::ALL.iter().map(|t| t.name()).collect();
            unknown("KV type", s, &names)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_run_here_or_the_error_names_the_paths_that_do() {
        let rayon = BackendChoice::Rayon;
        assert_eq!(rayon.simd(None).map(|s| s.path()), Ok(Simd::best().path()));
        for p in SimdPath::ALL {
            match rayon.simd(Some(p)) {
                Ok(s) => assert_eq!(s.path(), p),
                Err(e) => {
                    assert!(!p.runs_here(), "{p}: {e}");
                    let want = format!("this CPU does not run the {p} kernels; it runs: ");
                    assert!(e.starts_with(&want), "{e}");
                    assert!(e.ends_with("scalar"), "{e}");
                }
            }
        }
        // Another architecture's path is refused everywhere.
        let foreign = if cfg!(target_arch = "x86_64") {
            SimdPath::Neon
        } else {
            SimdPath::Avx2Fma
        };
        assert!(BackendChoice::Simd.simd(Some(foreign)).is_err());
        let scalar = BackendChoice::Scalar;
        assert!(scalar.simd(Some(SimdPath::Scalar)).is_ok());
        let e = scalar.simd(Some(SimdPath::Avx2Fma)).unwrap_err();
        assert!(
            e.starts_with("the scalar backend has no avx2 kernels"),
            "{e}"
        );
    }

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
        for p in SimdPath::ALL {
            assert_eq!(parse_kernels(p.name()), Ok(p));
        }
        assert!(
            parse_kernels("avx")
                .unwrap_err()
                .contains("unknown kernels \"avx\"; valid: avx512, avx2, neon, simd128, scalar")
        );
        assert_eq!(parse_kv_type("f32"), Ok(KvType::F32));
        assert_eq!(parse_kv_type("q8_0"), Ok(KvType::Q8_0));
        assert_eq!(parse_kv_type("q4_0"), Ok(KvType::Q4_0));
        assert!(
            parse_kv_type("q4_1")
                .unwrap_err()
                .contains("unknown KV type \"q4_1\"; valid: f32, f16, bf16, q8_0, q4_0")
        );
    }
}
