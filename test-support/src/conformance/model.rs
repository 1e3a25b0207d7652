//! SmolLM2-135M's shapes as deterministic cases: its projections as GEMV and 7-token GEMM
//! in every weight format whose blocks divide 576, Gemma 3 270M's projections in the
//! formats its Q4_K_M file stores them in, the `[49152, 576]` output GEMV in its real format (Q8_0), GQA
//! attention, and batched RMSNorm, SwiGLU, add and RoPE. Inputs, the scalar reference's
//! outputs and the oracle's bounds are built once per test binary and shared by every
//! backend it checks.

use std::sync::OnceLock;

use kvcore::backend::{Backend, DType, RopeStyle};

use super::cases::{
    Add, Attention, AttnShape, Case, Gemm, Gemv, GemvQ8, RmsNorm, RopeCase, Swiglu,
};
use super::oracle::{Bounded, bits, check_pair};
use super::suite::REFERENCE;

/// SmolLM2-135M's projections, `[out, in]`: q/o, k/v, gate/up, down.
pub const MATMUL_SHAPES: [(usize, usize); 4] = [(576, 576), (192, 576), (1536, 576), (576, 1536)];

/// Gemma 3 270M's projections `[out, in]` in the formats of its Q4_K_M file: q (and
/// gate/up) in `Q5_0` (640 is not a multiple of 256), o in `Q4_K`, down in `Q6_K`.
pub const GEMMA3_MATMULS: [(DType, usize, usize); 4] = [
    (DType::Q5_0, 1024, 640),
    (DType::Q5_0, 2048, 640),
    (DType::Q4_K, 640, 1024),
    (DType::Q6_K, 640, 2048),
];

/// Tokens of the model-shape GEMMs (a short prefill).
const TOKENS: usize = 7;

/// A case with the scalar reference's outputs and the oracle's bounds precomputed.
struct Prepared<C> {
    case: C,
    reference: Vec<f32>,
    want: Vec<Bounded>,
}

impl<C: Case> Prepared<C> {
    fn new(case: C) -> Self {
        Prepared {
            reference: case.run(&REFERENCE),
            want: case.oracle(),
            case,
        }
    }

    /// `b` within twice the bound of the scalar reference.
    fn check<B: Backend>(&self, b: &B) {
        let label = format!("{}: {}", b.name(), self.case.label());
        check_pair(&label, &self.case.run(b), &self.reference, &self.want).unwrap();
    }

    /// `b` bit for bit equal to the scalar reference.
    fn check_exact<B: Backend>(&self, b: &B) {
        let got = self.case.run(b);
        let label = self.case.label();
        assert_eq!(bits(&got), bits(&self.reference), "{}: {label}", b.name());
    }
}

/// The model-shape GEMVs and GEMMs of one weight format.
struct Matmul {
    gemv: Vec<Prepared<Gemv>>,
    gemm: Vec<Prepared<Gemm>>,
}

/// The model-shape matmuls of `dtype`, built on first use.
fn matmul(dtype: DType) -> &'static Matmul {
    static CACHE: [OnceLock<Matmul>; DType::ALL.len()] =
        [const { OnceLock::new() }; DType::ALL.len()];
    let i = DType::ALL.iter().position(|&d| d == dtype).expect("listed");
    CACHE[i].get_or_init(|| {
        let seed = |k: usize| 0x5eed + (i * MATMUL_SHAPES.len() + k) as u64;
        Matmul {
            gemv: (MATMUL_SHAPES.iter().enumerate())
                .map(|(k, &(r, c))| Prepared::new(Gemv::new(dtype, r, c, seed(k))))
                .collect(),
            gemm: (MATMUL_SHAPES.iter().enumerate())
                .map(|(k, &(r, c))| Prepared::new(Gemm::new(dtype, r, c, TOKENS, !seed(k))))
                .collect(),
        }
    })
}

/// The model-shape matmuls of `dtype` on `b` within twice the bound of the scalar
/// reference, and GEMM rows against `b`'s own GEMV.
///
/// # Panics
/// If a check fails.
pub fn matmul_conforms<B: Backend>(b: &B, dtype: DType) {
    check_matmul(b, matmul(dtype));
}

fn check_matmul<B: Backend>(b: &B, m: &Matmul) {
    m.gemv.iter().for_each(|p| p.check(b));
    for p in &m.gemm {
        p.check(b);
        let label = format!("{}: {} rows vs gemv", b.name(), p.case.label());
        check_pair(&label, &p.case.run(b), &p.case.run_as_gemv(b), &p.want).unwrap();
    }
}

/// Gemma 3's projections ([`GEMMA3_MATMULS`]) on `b`, as [`matmul_conforms`].
///
/// # Panics
/// If a check fails.
pub fn gemma3_matmuls_conform<B: Backend>(b: &B) {
    static CACHE: OnceLock<Matmul> = OnceLock::new();
    let m = CACHE.get_or_init(|| {
        let cases = GEMMA3_MATMULS.iter().enumerate();
        let seed = |k: usize| 0x6e33 + k as u64;
        Matmul {
            gemv: (cases.clone())
                .map(|(k, &(t, r, c))| Prepared::new(Gemv::new(t, r, c, seed(k))))
                .collect(),
            gemm: cases
                .map(|(k, &(t, r, c))| Prepared::new(Gemm::new(t, r, c, TOKENS, !seed(k))))
                .collect(),
        }
    });
    check_matmul(b, m);
}

/// Gemma 3 270M's projections ([`GEMMA3_MATMULS`]) with 8-bit activations
/// (`quantize_q8` + `gemv_q8`, the one-token path of `Activations::Q8`) on `b`, within
/// twice the bound of the scalar reference.
///
/// # Panics
/// If a check fails.
pub fn gemma3_matmuls_q8_conform<B: Backend>(b: &B) {
    static CACHE: OnceLock<Vec<Prepared<GemvQ8>>> = OnceLock::new();
    let cases = CACHE.get_or_init(|| {
        (GEMMA3_MATMULS.iter().enumerate())
            .map(|(k, &(t, r, c))| Prepared::new(GemvQ8::new(t, r, c, 0x6e38 + k as u64)))
            .collect()
    });
    for case in cases {
        case.check(b);
    }
}

/// The output projection (tied embedding) `[49152, 576]` in the real model's format on
/// `b`, within twice the bound of the scalar reference.
///
/// # Panics
/// If the check fails.
pub fn output_gemv_conforms<B: Backend>(b: &B) {
    static CASE: OnceLock<Prepared<Gemv>> = OnceLock::new();
    CASE.get_or_init(|| Prepared::new(Gemv::new(DType::Q8_0, 49152, 576, 0x0b1e)))
        .check(b);
}

/// Attention with GQA, RMSNorm, SwiGLU, the residual add and RoPE at SmolLM2's sizes,
/// batched like a 64-token prefill (crossing the rayon backend's parallel thresholds).
struct Ops {
    attention: Vec<Prepared<Attention>>,
    rms_norm: Prepared<RmsNorm>,
    swiglu: Prepared<Swiglu>,
    add: Prepared<Add>,
    rope: Vec<Prepared<RopeCase>>,
}

fn ops() -> &'static Ops {
    static OPS: OnceLock<Ops> = OnceLock::new();
    OPS.get_or_init(|| {
        // SmolLM2: 9 query heads over 3 KV heads of 64.
        let shape = AttnShape {
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            pos0: 100,
        };
        Ops {
            attention: vec![
                Prepared::new(Attention::new(shape, 7, 0, 0xa7)),
                Prepared::new(Attention::new(AttnShape { pos0: 0, ..shape }, 64, 5, 0xa8)),
            ],
            rms_norm: Prepared::new(RmsNorm::new(64, 576, 1e-5, 0x4e)),
            swiglu: Prepared::new(Swiglu::new(64 * 1536, 20.0, 0x5a)),
            add: Prepared::new(Add::new(64 * 576, 0xad)),
            rope: [RopeStyle::Interleaved, RopeStyle::Halves]
                .into_iter()
                .map(|style| {
                    let positions: Vec<usize> = (8150..8214).collect();
                    Prepared::new(RopeCase::new(64, 9, positions, 100_000.0, style, 0x40))
                })
                .collect(),
        }
    })
}

/// Attention, RMSNorm, SwiGLU and RoPE at SmolLM2's sizes on `b` within twice the bound
/// of the scalar reference, and the residual add bit for bit.
///
/// # Panics
/// If a check fails.
pub fn ops_conform<B: Backend>(b: &B) {
    let ops = ops();
    ops.attention.iter().for_each(|p| p.check(b));
    ops.rms_norm.check(b);
    ops.swiglu.check(b);
    ops.add.check_exact(b);
    ops.rope.iter().for_each(|p| p.check(b));
}
