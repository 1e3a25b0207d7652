//! `kvcore-simd`: a [`Backend`] with explicit SIMD kernels, AVX2+FMA(+F16C) on x86_64,
//! NEON on aarch64 and SIMD128 on wasm32, chosen once at construction by run-time CPU
//! feature detection (on wasm32 at compile time: the platform has no run-time detection).
//! A [`SimdPath`] names each kernel family: [`Simd::best`] takes the best one this CPU
//! runs, [`Simd::with_path`] the one named. On x86_64 there are two: `avx512` (the AVX2
//! kernels, the attention and the few-token block GEMM in their AVX-512F twins, bit for
//! bit the AVX2 ones) and `avx2` (the AVX2 kernels alone, even on a CPU with AVX-512F).
//!
//! Layout (one job per file, one folder per architecture):
//! - `lib.rs`: [`Simd`], [`SimdPath`], feature detection and dispatch;
//! - `kernel.rs`: the crate-private `Kernel` trait an instruction-set family implements;
//! - `lanes.rs`: the f32 loops every family shares (dot, scores, weighted sums, softmax,
//!   the GLUs, RMSNorm's parts, the residual add), written once over its lane operations;
//! - `kformat.rs`: the formats the `kquant.rs` files decode (`Q5_0`, `Q4_K`, `Q6_K`);
//! - `ops.rs`: the drivers (GEMV, GEMM panels, attention, RMSNorm), generic over the
//!   kernel and so monomorphised per family;
//! - `sgemm.rs`: the checked wrapper around `matrixmultiply::sgemm` used by GEMM;
//! - `x86/`, `aarch64/`, `wasm32/`: the kernels (`dot.rs` f32 vector code, `quant.rs` GEMV and
//!   decoding on the packed weight bytes, `kquant.rs` that of `Q5_0`, `Q4_K`, `Q6_K`,
//!   `q8.rs` the 8-bit activation quantiser and integer-dot GEMV).
//!
//! | op | SIMD path |
//! |----|-----------|
//! | `gemv` | per row, the packed blocks decoded in registers, FMA against `x` in f32; on x86 the row 4 ahead prefetched (`x86/dot.rs`, `PREFETCH_ROWS`: mapped weights cross a 4 KiB page every few rows, where the hardware prefetchers stop); on SIMD128 (no FMA) a multiply then an add, two rows of `Q4_*`/`Q8_0` at a time in a transposed block order that needs no byte shuffles (`wasm32/quant.rs`) |
//! | `gemm` | `n = 1`: `gemv`; up to 8 tokens: panels of 64 decoded rows (f32 weights as stored) dotted with every token (AVX2: 3 rows × 4 tokens per pass, `x86/dot.rs`; `Q8_0`/`Q4_0`/`Q4_1` with up to 24 KiB of tokens straight from the blocks, each decoded in registers once for all tokens, the same bits, `x86/quant.rs`); more: `matrixmultiply::sgemm` on the f32 weights or on wider decoded panels |
//! | `attention` | in parts of 256 slots folded by an exact log-sum-exp merge (so `Rayon` can split a decode step's keys over threads); per tile of query rows and a KV group's heads, blocks of 64 key/value rows read in their stored type (f32, f16, bf16, q8_0, q4_0) once for every vector of the tile; SIMD scores, `exp` and weighted sums |
//! | `softmax` | a vectorised `exp` within 3 ulps, the same Cephes `expf` in 8 (AVX2, `x86/dot.rs`) or 4 lanes (NEON, `aarch64/dot.rs`; SIMD128, `wasm32/dot.rs`, without FMA) |
//! | `rms_norm` | SIMD sum of squares and products |
//! | `add` | SIMD (bit for bit the scalar result) |
//! | `swiglu`, `geglu` | `g / (1 + e^k)` with the vectorised `exp` (AVX2, NEON, SIMD128) |
//! | `rope`, `embed_row` | the scalar reference |
//! | `quantize_q8` | SIMD 8-bit quantiser (`Q8_0` and `Q8_K` layouts), bit for bit the reference |
//! | `gemm_q8` | per panel of 64 weight rows, the tokens in groups of up to 8 (AVX2: 8 with the 8 tokens' block factors in one vector, then 4, 2, 1; NEON: one by one): each row's blocks decoded once per group, each token's arithmetic its `gemv_q8`'s, so each token's row is bit for bit its GEMV |
//! | `gemv_q8` | integer dot products of the weight and activation bytes per block (K formats: scaled per sub-block in i32), one f32 FMA per block (`q8.rs`); SIMD128 has no 8-bit multiply: the activations widened to i16 once per call, `i32x4.dot_i16x8_s`, two rows at a time |
//!
//! Apart from the opt-in 8-bit path (`quantize_q8`, `gemv_q8`, see `kvcore::backend::q8`),
//! activations stay f32, so results differ from [`kvcore_scalar::Scalar`] by rounding
//! only; each kernel file states its order of accumulation. `unsafe` appears only in the kernel files and `sgemm.rs`, each block
//! with a `// SAFETY:` comment.

mod kernel;
// Without a SIMD family (wasm32 without SIMD128, other targets) no lanes instantiate
// these, but `Kernel` names their traits.
#[cfg_attr(
    not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        all(target_arch = "wasm32", target_feature = "simd128")
    )),
    allow(dead_code)
)]
mod kformat;
#[cfg_attr(
    not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        all(target_arch = "wasm32", target_feature = "simd128")
    )),
    allow(dead_code)
)]
mod lanes;
mod ops;
mod sgemm;

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm32;
#[cfg(target_arch = "x86_64")]
mod x86;

use kvcore::backend::{
    AttnParams, Backend, PartStat, Q8Acts, Q8Layout, Rope, ShapeError, Weights, check, q8,
};
use kvcore::kv::KvView;
use kvcore::ndarray::{ArrayView3, ArrayViewMut3};
use kvcore_scalar::Scalar;

/// The kernel family a [`Simd`] backend runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SimdPath {
    /// x86_64 AVX2 with FMA and F16C, the attention and the few-token block GEMM in
    /// their AVX-512F twins (the same bits, faster); the CPU needs AVX-512F too.
    Avx512,
    /// x86_64 AVX2 with FMA and F16C alone, even on a CPU with AVX-512F.
    Avx2Fma,
    /// aarch64 Advanced SIMD (NEON).
    Neon,
    /// WebAssembly SIMD128 (a wasm32 build with `-C target-feature=+simd128`).
    Simd128,
    /// No SIMD kernels: every operation is the scalar reference.
    Scalar,
}

impl SimdPath {
    /// Every path, the fastest first.
    pub const ALL: [SimdPath; 5] = [
        SimdPath::Avx512,
        SimdPath::Avx2Fma,
        SimdPath::Neon,
        SimdPath::Simd128,
        SimdPath::Scalar,
    ];

    /// Its name: `"avx512"`, `"avx2"`, `"neon"`, `"simd128"` or `"scalar"`.
    pub const fn name(self) -> &'static str {
        match self {
            SimdPath::Avx512 => "avx512",
            SimdPath::Avx2Fma => "avx2",
            SimdPath::Neon => "neon",
            SimdPath::Simd128 => "simd128",
            SimdPath::Scalar => "scalar",
        }
    }

    /// The path called `name` (see [`name`](SimdPath::name)), or `None`.
    pub fn from_name(name: &str) -> Option<SimdPath> {
        SimdPath::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Whether this CPU (this build, on wasm32) runs the path.
    pub fn runs_here(self) -> bool {
        Simd::with_path(self).is_some()
    }
}

impl std::fmt::Display for SimdPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The detected kernel family: a token proving the CPU supports it.
#[derive(Clone, Copy, Debug)]
enum Active {
    /// The AVX2 kernels, with or without their AVX-512F twins (the token says which).
    #[cfg(target_arch = "x86_64")]
    Avx2(x86::Avx2),
    #[cfg(target_arch = "aarch64")]
    Neon(aarch64::Neon),
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    Simd128(wasm32::Simd128),
    Scalar,
}

/// The SIMD backend: single-threaded, on the kernel family it was built with.
///
/// Operations it does not accelerate, and every operation on the scalar path, run the
/// scalar reference.
#[derive(Clone, Copy, Debug)]
pub struct Simd {
    active: Active,
}

impl Default for Simd {
    /// [`Simd::best`].
    fn default() -> Self {
        Simd::best()
    }
}

impl Simd {
    /// The best path this CPU runs: [`Simd::best`].
    pub fn new() -> Self {
        Simd::best()
    }

    /// The best path this CPU runs: the first of [`SimdPath::ALL`] it runs (the scalar
    /// path runs everywhere).
    pub fn best() -> Self {
        SimdPath::ALL
            .into_iter()
            .find_map(Simd::with_path)
            .unwrap_or(Simd {
                active: Active::Scalar,
            })
    }

    /// The backend on `path`, or `None` where this CPU does not run it (its features
    /// are not detected, or it is another architecture's).
    pub fn with_path(path: SimdPath) -> Option<Self> {
        let active = match path {
            #[cfg(target_arch = "x86_64")]
            SimdPath::Avx512 => Active::Avx2(x86::Avx2::with_avx512()?),
            #[cfg(target_arch = "x86_64")]
            SimdPath::Avx2Fma => Active::Avx2(x86::Avx2::detect()?),
            #[cfg(target_arch = "aarch64")]
            SimdPath::Neon => Active::Neon(aarch64::Neon::detect()?),
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            SimdPath::Simd128 => Active::Simd128(wasm32::Simd128::detect()?),
            SimdPath::Scalar => Active::Scalar,
            _ => return None,
        };
        Some(Simd { active })
    }

    /// The path in use.
    pub fn path(&self) -> SimdPath {
        match self.active {
            #[cfg(target_arch = "x86_64")]
            Active::Avx2(k) if k.avx512() => SimdPath::Avx512,
            #[cfg(target_arch = "x86_64")]
            Active::Avx2(_) => SimdPath::Avx2Fma,
            #[cfg(target_arch = "aarch64")]
            Active::Neon(_) => SimdPath::Neon,
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            Active::Simd128(_) => SimdPath::Simd128,
            Active::Scalar => SimdPath::Scalar,
        }
    }
}

/// Run `$simd` with `$k` bound to the active kernel token, or `$scalar` on the scalar
/// path.
macro_rules! dispatch {
    ($self:ident, $k:ident => $simd:expr, scalar => $scalar:expr) => {
        match $self.active {
            #[cfg(target_arch = "x86_64")]
            Active::Avx2($k) => $simd,
            #[cfg(target_arch = "aarch64")]
            Active::Neon($k) => $simd,
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            Active::Simd128($k) => $simd,
            Active::Scalar => $scalar,
        }
    };
}

impl Backend for Simd {
    fn name(&self) -> &'static str {
        "simd"
    }

    /// `"simd/"` and the path's name: `"simd/avx512"`, `"simd/avx2"`, ...
    fn kernel_path(&self) -> &'static str {
        match self.path() {
            SimdPath::Avx512 => "simd/avx512",
            SimdPath::Avx2Fma => "simd/avx2",
            SimdPath::Neon => "simd/neon",
            SimdPath::Simd128 => "simd/simd128",
            SimdPath::Scalar => "simd/scalar",
        }
    }

    fn gemv(&self, w: &Weights<'_>, x: &[f32], y: &mut [f32]) -> Result<(), ShapeError> {
        check::gemv(w, x, y)?;
        kvcore_scalar::quant::check_format("simd gemv", w.dtype())?;
        dispatch!(self, k => ops::gemv(k, w, x, y), scalar => Scalar.gemv(w, x, y)?);
        Ok(())
    }

    fn quantize_q8(&self, layout: Q8Layout, x: &[f32], out: &mut Q8Acts) -> Result<(), ShapeError> {
        dispatch!(
            self,
            k => out.fill(layout, x.len(), |(scales, sums, values)| {
                kernel::Kernel::quantize_q8(k, layout, x, scales, sums, values)
            })?,
            scalar => out.quantize(layout, x)?
        );
        Ok(())
    }

    fn gemv_q8(&self, w: &Weights<'_>, x: &Q8Acts, y: &mut [f32]) -> Result<(), ShapeError> {
        check::gemv_q8(w, x, y)?;
        dispatch!(self, k => kernel::Kernel::gemv_q8(k, w, x, y), scalar => q8::gemv_reference(w, x, y)?);
        Ok(())
    }

    fn gemm_q8(&self, w: &Weights<'_>, x: &[Q8Acts], y: &mut [f32]) -> Result<(), ShapeError> {
        check::gemm_q8(w, x, y)?;
        dispatch!(
            self,
            k => ops::gemm_q8(k, w, x, y),
            scalar => {
                for (xt, yt) in x.iter().zip(y.chunks_exact_mut(w.rows().max(1))) {
                    q8::gemv_reference(w, xt, yt)?;
                }
            }
        );
        Ok(())
    }

    fn gemm(&self, w: &Weights<'_>, x: &[f32], y: &mut [f32]) -> Result<(), ShapeError> {
        check::gemm(w, x, y)?;
        kvcore_scalar::quant::check_format("simd gemm", w.dtype())?;
        dispatch!(self, k => ops::gemm(k, w, x, y), scalar => Scalar.gemm(w, x, y)?);
        Ok(())
    }

    /// Past 8 tokens (`ops::SMALL_N`) every GEMM takes `sgemm` (on the stored f32 weights
    /// or on decoded panels), whose output rows do not depend on the other rows of `X`;
    /// up to it, the few-token kernels, whose bits differ from `sgemm`'s.
    fn gemm_rows_alone_from(&self) -> Option<usize> {
        match self.path() {
            SimdPath::Scalar => Scalar.gemm_rows_alone_from(),
            _ => Some(ops::SMALL_N + 1),
        }
    }

    fn rope(
        &self,
        x: &mut [f32],
        head_dim: usize,
        positions: &[usize],
        rope: &Rope,
    ) -> Result<(), ShapeError> {
        Scalar.rope(x, head_dim, positions, rope)
    }

    fn attention(
        &self,
        q: ArrayView3<'_, f32>,
        q_pos: &[usize],
        kv: &KvView<'_>,
        params: &AttnParams,
        out: ArrayViewMut3<'_, f32>,
    ) -> Result<(), ShapeError> {
        check::attention(&q, q_pos, kv, &out)?;
        dispatch!(
            self,
            k => ops::attention(k, q, q_pos, kv, params, out)?,
            scalar => Scalar.attention(q, q_pos, kv, params, out)?
        );
        Ok(())
    }

    fn attention_part_len(&self) -> Option<usize> {
        (self.path() != SimdPath::Scalar).then_some(ops::ATTN_PART)
    }

    fn attention_part(
        &self,
        q: ArrayView3<'_, f32>,
        q_pos: &[usize],
        kv: &KvView<'_>,
        params: &AttnParams,
        out: ArrayViewMut3<'_, f32>,
        stats: &mut [PartStat],
    ) -> Result<(), ShapeError> {
        check::attention_part(&q, q_pos, kv, &out, stats)?;
        // Keys of more than one block of key offsets: the parts' fold (each part's keys
        // share one offset).
        let span = kv.span();
        let blocks = (kv.codecs().0.offset_block())
            .is_some_and(|b| span.start / b != span.end.saturating_sub(1) / b);
        dispatch!(
            self,
            k => if blocks {
                ops::attention_fold(k, q, q_pos, kv, params, out, stats)?
            } else {
                ops::attention_part(k, q, q_pos, kv, 0..usize::MAX, params, out, stats, false)?
            },
            scalar => Scalar.attention_part(q, q_pos, kv, params, out, stats)?
        );
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &[f32],
        weight: &[f32],
        eps: f32,
        out: &mut [f32],
    ) -> Result<(), ShapeError> {
        check::rms_norm(x, weight, out)?;
        dispatch!(
            self,
            k => ops::rms_norm(k, x, weight, eps, out),
            scalar => Scalar.rms_norm(x, weight, eps, out)?
        );
        Ok(())
    }

    fn swiglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), ShapeError> {
        check::same_len("swiglu up", gate.len(), up.len())?;
        check::same_len("swiglu out", gate.len(), out.len())?;
        dispatch!(self, k => kernel::Kernel::swiglu(k, gate, up, out), scalar => Scalar.swiglu(gate, up, out)?);
        Ok(())
    }

    fn geglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), ShapeError> {
        check::same_len("geglu up", gate.len(), up.len())?;
        check::same_len("geglu out", gate.len(), out.len())?;
        dispatch!(self, k => kernel::Kernel::geglu(k, gate, up, out), scalar => Scalar.geglu(gate, up, out)?);
        Ok(())
    }

    fn add(&self, acc: &mut [f32], x: &[f32]) -> Result<(), ShapeError> {
        check::same_len("add x", acc.len(), x.len())?;
        dispatch!(self, k => kernel::Kernel::add(k, acc, x), scalar => Scalar.add(acc, x)?);
        Ok(())
    }

    fn softmax(&self, x: &mut [f32]) {
        dispatch!(self, k => kernel::Kernel::softmax(k, x), scalar => Scalar.softmax(x));
    }

    fn embed_row(
        &self,
        table: &Weights<'_>,
        row: usize,
        out: &mut [f32],
    ) -> Result<(), ShapeError> {
        Scalar.embed_row(table, row, out)
    }
}
