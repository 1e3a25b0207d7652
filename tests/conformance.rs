//! The backend conformance suite: every kernel of every backend against the scalar
//! reference, on the same inputs.
//!
//! One generic suite (`conformance!`) is instantiated for each backend: [`Scalar`],
//! [`Simd`], `Rayon<Scalar>` and `Rayon<Simd>` (2 threads). For each kernel:
//! - proptest cases (fixed RNG seed, so every run draws the same inputs) over shapes 0,
//!   1, tile sizes ±1 (8, 16, 32, 64 ±1), odd lengths, 192 and 576, every weight format,
//!   RoPE positions up to 40 000, GQA groupings;
//! - SmolLM2-135M's shapes as deterministic cases: its projections as GEMV and 7-token
//!   GEMM in every weight format, the `[49152, 576]` output GEMV in its real format
//!   (Q8_0), GQA attention, and batched RMSNorm, SwiGLU, add and RoPE;
//! - GEMM row `t` against the backend's own GEMV of token `t`;
//! - quantised GEMV/GEMM against the same backend on an F32 copy of the decoded weights
//!   (random matrices and the real SmolLM2 rows of `shared/reference/quant-blocks.json`);
//! - every shape error, returned as the specific [`ShapeError`] with the output left
//!   untouched.
//!
//! Tolerance: output `i` of a backend must be within `2·bound_i` of the scalar's, where
//! `bound_i = ε_abs + ε_rel·Σ|terms|` is the worst-case error of one correct f32
//! implementation of that output (derived per kernel in `backend_support/oracle.rs`; for
//! a dot product of `n` terms `ε_rel = (min(n, 8·√n) + 2)·2^-24`, `1.1e-5` at `n = 576`,
//! and `Σ|terms| = Σ_j |w_j·x_j|`).
//! Both backends lie within `bound_i` of the exact value, so within `2·bound_i` of each
//! other; the scalar reference is itself held to `bound_i` against a float64 oracle in
//! `scalar_reference.rs`. Embedding lookups and residual adds are exact operations and
//! must match bit for bit.

mod backend_support;
mod quant_data;

use backend_support::cases::{
    Add, Attention, AttnShape, Case, Embed, Gemm, Gemv, GemvQ8, RmsNorm, RopeCase, Softmax, Swiglu,
};
use backend_support::oracle::{self, Bounded, check_pair};
use backend_support::{Matrix, Rng, bits, strategy::*};
use kvcore::backend::{AttnParams, Backend, DType, Mask, Rope, RopeStyle, ShapeError, Weights};
use kvcore::kv::KvView;
use kvcore::ndarray::{Array3, Axis, Slice};
use kvcore_rayon::Rayon;
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::sync::OnceLock;

/// The reference every backend is compared with.
const REFERENCE: Scalar = Scalar::new();

/// Threads of the rayon instantiations.
const RAYON_THREADS: usize = 2;

// ---------------------------------------------------------------------------------------
// Generic checks
// ---------------------------------------------------------------------------------------

/// `b` on `case` within twice the oracle's bound of the scalar reference.
fn conforms<B: Backend>(b: &B, case: &impl Case) -> Result<(), TestCaseError> {
    let label = format!("{}: {}", b.name(), case.label());
    check_pair(&label, &case.run(b), &case.run(&REFERENCE), &case.oracle())
        .map_err(TestCaseError::fail)
}

/// `b` on `case` bit for bit equal to the scalar reference.
fn exact<B: Backend>(b: &B, case: &impl Case) -> Result<(), TestCaseError> {
    let (got, want) = (case.run(b), case.run(&REFERENCE));
    prop_assert_eq!(bits(&got), bits(&want), "{}: {}", b.name(), case.label());
    Ok(())
}

/// GEMM row `t` within twice the bound of the backend's own GEMV of token `t`.
fn gemm_rows_match_gemv<B: Backend>(b: &B, case: &Gemm) -> Result<(), TestCaseError> {
    let label = format!("{}: {} rows vs gemv", b.name(), case.label());
    check_pair(&label, &case.run(b), &case.run_as_gemv(b), &case.oracle())
        .map_err(TestCaseError::fail)
}

/// The same stored matrix as plain f32 values: `(bytes, decoded values)`.
fn decoded_f32(m: &Matrix) -> Vec<f32> {
    (0..m.rows)
        .flat_map(|r| m.row(r).into_iter().map(|d| d.value as f32))
        .collect()
}

/// Quantised GEMV and GEMM on `m` against the same backend on the decoded F32 copy:
/// within twice the quantised product's bound (the decoded values are exact f32, so the
/// exact results are equal).
fn quantized_matches_f32<B: Backend>(
    b: &B,
    m: &Matrix,
    n: usize,
    seed: u64,
) -> Result<(), TestCaseError> {
    let values = decoded_f32(m);
    let wf = Weights::from_f32(m.rows, m.cols, &values).expect("f32 copy");
    let x = Rng::new(seed).values(n * m.cols);
    let want = oracle::gemm(m, &x);
    let label = format!(
        "{}: {} [{}, {}] vs F32, n {n}",
        b.name(),
        m.dtype,
        m.rows,
        m.cols
    );
    let (mut yq, mut yf) = (vec![f32::NAN; n * m.rows], vec![f32::NAN; n * m.rows]);
    b.gemm(&m.weights(), &x, &mut yq).expect("gemm shapes");
    b.gemm(&wf, &x, &mut yf).expect("gemm shapes");
    check_pair(&format!("{label} gemm"), &yq, &yf, &want).map_err(TestCaseError::fail)?;
    let x0 = &x[..m.cols];
    let (mut yq, mut yf) = (vec![f32::NAN; m.rows], vec![f32::NAN; m.rows]);
    b.gemv(&m.weights(), x0, &mut yq).expect("gemv shapes");
    b.gemv(&wf, x0, &mut yf).expect("gemv shapes");
    check_pair(&format!("{label} gemv"), &yq, &yf, &want[..m.rows]).map_err(TestCaseError::fail)
}

/// The real SmolLM2 rows of the reference vectors, quantised vs their decoded values.
fn smollm2_rows_match_f32<B: Backend>(b: &B) {
    for t in quant_data::load().real {
        let m = Matrix {
            dtype: t.dtype,
            rows: t.bytes.len(),
            cols: t.row_len,
            bytes: t.bytes.concat(),
        };
        assert_eq!(
            decoded_f32(&m),
            t.values.concat(),
            "{}: decoded values",
            t.tensor
        );
        quantized_matches_f32(b, &m, 3, 0x51).unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// Model shapes: inputs, scalar outputs and oracle built once, shared by every backend
// ---------------------------------------------------------------------------------------

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

/// SmolLM2-135M's projections, `[out, in]`: q/o, k/v, gate/up, down.
const MODEL_MATMUL: [(usize, usize); 4] = [(576, 576), (192, 576), (1536, 576), (576, 1536)];

/// Tokens of the model-shape GEMMs (a short prefill).
const MODEL_TOKENS: usize = 7;

/// The model-shape GEMVs and GEMMs of one weight format.
struct ModelMatmul {
    gemv: Vec<Prepared<Gemv>>,
    gemm: Vec<Prepared<Gemm>>,
}

/// The model-shape matmuls of `dtype`, built on first use.
fn model_matmul(dtype: DType) -> &'static ModelMatmul {
    static CACHE: [OnceLock<ModelMatmul>; DType::ALL.len()] =
        [const { OnceLock::new() }; DType::ALL.len()];
    let i = DType::ALL.iter().position(|&d| d == dtype).expect("listed");
    CACHE[i].get_or_init(|| {
        let seed = |k: usize| 0x5eed + (i * MODEL_MATMUL.len() + k) as u64;
        ModelMatmul {
            gemv: (MODEL_MATMUL.iter().enumerate())
                .map(|(k, &(r, c))| Prepared::new(Gemv::new(dtype, r, c, seed(k))))
                .collect(),
            gemm: (MODEL_MATMUL.iter().enumerate())
                .map(|(k, &(r, c))| Prepared::new(Gemm::new(dtype, r, c, MODEL_TOKENS, !seed(k))))
                .collect(),
        }
    })
}

/// The model-shape matmuls of `dtype` on `b`, and GEMM rows against `b`'s own GEMV.
fn model_matmul_conforms<B: Backend>(b: &B, dtype: DType) {
    let m = model_matmul(dtype);
    m.gemv.iter().for_each(|p| p.check(b));
    for p in &m.gemm {
        p.check(b);
        let label = format!("{}: {} rows vs gemv", b.name(), p.case.label());
        check_pair(&label, &p.case.run(b), &p.case.run_as_gemv(b), &p.want).unwrap();
    }
}

/// The output projection (tied embedding) `[49152, 576]` in the real model's format.
fn output_gemv() -> &'static Prepared<Gemv> {
    static CASE: OnceLock<Prepared<Gemv>> = OnceLock::new();
    CASE.get_or_init(|| Prepared::new(Gemv::new(DType::Q8_0, 49152, 576, 0x0b1e)))
}

/// Attention with GQA, RMSNorm, SwiGLU, the residual add and RoPE at SmolLM2's sizes,
/// batched like a 64-token prefill (crossing the rayon backend's parallel thresholds).
struct ModelOps {
    attention: Vec<Prepared<Attention>>,
    rms_norm: Prepared<RmsNorm>,
    swiglu: Prepared<Swiglu>,
    add: Prepared<Add>,
    rope: Vec<Prepared<RopeCase>>,
}

fn model_ops() -> &'static ModelOps {
    static OPS: OnceLock<ModelOps> = OnceLock::new();
    OPS.get_or_init(|| {
        // SmolLM2: 9 query heads over 3 KV heads of 64.
        let shape = AttnShape {
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            pos0: 100,
        };
        ModelOps {
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

fn model_ops_conform<B: Backend>(b: &B) {
    let ops = model_ops();
    ops.attention.iter().for_each(|p| p.check(b));
    ops.rms_norm.check(b);
    ops.swiglu.check(b);
    ops.add.check_exact(b);
    ops.rope.iter().for_each(|p| p.check(b));
}

// ---------------------------------------------------------------------------------------
// Shape errors
// ---------------------------------------------------------------------------------------

/// Every shape error of every kernel: the specific [`ShapeError`], nothing written.
fn shape_errors<B: Backend>(b: &B) {
    const SENTINEL: f32 = -1234.5;
    let f = |n: usize| vec![SENTINEL; n];
    let untouched = |v: &[f32]| assert!(v.iter().all(|&x| x.to_bits() == SENTINEL.to_bits()));
    let len = |what, expected, actual| ShapeError::Length {
        what,
        expected,
        actual,
    };
    let not_multiple = |what, len, multiple| ShapeError::NotMultiple {
        what,
        len,
        multiple,
    };
    let wdata = vec![0.5f32; 4 * 8];
    let w = Weights::from_f32(4, 8, &wdata).unwrap();

    // gemv: x [cols], y [rows]
    let mut y = f(4);
    assert_eq!(b.gemv(&w, &f(7), &mut y), Err(len("gemv x", 8, 7)));
    untouched(&y);
    let mut y = f(3);
    assert_eq!(b.gemv(&w, &f(8), &mut y), Err(len("gemv y", 4, 3)));
    untouched(&y);

    // gemm: x [n, cols], y [n, rows], cols > 0
    let mut y = f(8);
    assert_eq!(
        b.gemm(&w, &f(12), &mut y),
        Err(not_multiple("gemm x", 12, 8))
    );
    untouched(&y);
    let mut y = f(7);
    assert_eq!(b.gemm(&w, &f(16), &mut y), Err(len("gemm y", 8, 7)));
    untouched(&y);
    let empty = Weights::from_f32(4, 0, &[]).unwrap();
    let mut y = f(0);
    assert_eq!(
        b.gemm(&empty, &f(0), &mut y),
        Err(ShapeError::Geometry("gemm with zero columns"))
    );

    // rope: head_dim even and non-zero, x [positions, k·head_dim]
    let rope = Rope {
        base: 10_000.0,
        style: RopeStyle::Halves,
    };
    let odd = ShapeError::Geometry("rope head_dim must be even and non-zero");
    for hd in [0, 3] {
        let mut x = f(12);
        assert_eq!(b.rope(&mut x, hd, &[0, 1], &rope), Err(odd.clone()));
        untouched(&x);
    }
    let mut x = f(10);
    assert_eq!(
        b.rope(&mut x, 4, &[0, 1], &rope),
        Err(not_multiple("rope x", 10, 8))
    );
    untouched(&x);
    let mut x = f(9);
    assert_eq!(
        b.rope(&mut x, 2, &[0, 1, 2], &rope),
        Err(not_multiple("rope x", 9, 6))
    );
    assert_eq!(b.rope(&mut x, 2, &[], &rope), Err(len("rope x", 0, 9)));
    untouched(&x);

    // attention: q, out [n, n_heads, hd]; q_pos [n]; the view's heads dividing n_heads,
    // its head_dim equal; heads and head_dim non-zero; last axes contiguous.
    let a3 = |n, h, d| Array3::from_elem((n, h, d), SENTINEL);
    let untouched3 = |a: &Array3<f32>| untouched(a.as_slice().expect("standard layout"));
    let (keys, values) = (a3(3, 2, 2), a3(3, 2, 2));
    let kv = KvView::from_f32(keys.view(), values.view()).unwrap();
    let params = AttnParams::causal(2);
    let (q, mut out) = (a3(2, 4, 2), a3(2, 4, 2));
    let dims = |what, expected, actual| {
        Err(ShapeError::Dims {
            what,
            expected,
            actual,
        })
    };
    let mut small = a3(2, 3, 2);
    assert_eq!(
        b.attention(q.view(), &[1, 2], &kv, &params, small.view_mut()),
        dims("attention out", [2, 4, 2], [2, 3, 2])
    );
    untouched3(&small);
    assert_eq!(
        b.attention(q.view(), &[1], &kv, &params, out.view_mut()),
        Err(len("attention q_pos", 2, 1))
    );
    let geometry = |what| Err(ShapeError::Geometry(what));
    let zero = "attention heads and head_dim must be non-zero";
    let (q0, mut out0) = (a3(2, 0, 2), a3(2, 0, 2));
    assert_eq!(
        b.attention(q0.view(), &[1, 2], &kv, &params, out0.view_mut()),
        geometry(zero)
    );
    let (qd, mut outd) = (a3(2, 4, 0), a3(2, 4, 0));
    let (kd, vd) = (a3(3, 2, 0), a3(3, 2, 0));
    let kvd = KvView::from_f32(kd.view(), vd.view()).unwrap();
    assert_eq!(
        b.attention(qd.view(), &[1, 2], &kvd, &params, outd.view_mut()),
        geometry(zero)
    );
    let (q3, mut out3) = (a3(2, 3, 2), a3(2, 3, 2));
    assert_eq!(
        b.attention(q3.view(), &[1, 2], &kv, &params, out3.view_mut()),
        geometry("n_heads must be a multiple of n_kv_heads")
    );
    untouched3(&out3);
    let (q4, mut out4) = (a3(2, 4, 4), a3(2, 4, 4));
    assert_eq!(
        b.attention(q4.view(), &[1, 2], &kv, &params, out4.view_mut()),
        Err(len("attention kv head_dim", 4, 2))
    );
    untouched3(&out4);
    // Every other element of a [.., 4] axis: shape [.., 2], stride 2.
    let wide = a3(2, 4, 4);
    let strided = wide.slice_axis(Axis(2), Slice::new(0, None, 2));
    assert_eq!(
        b.attention(strided, &[1, 2], &kv, &params, out.view_mut()),
        Err(ShapeError::NotContiguous {
            what: "attention q"
        })
    );
    let mut wide_out = a3(2, 4, 4);
    assert_eq!(
        b.attention(
            q.view(),
            &[1, 2],
            &kv,
            &params,
            wide_out.slice_axis_mut(Axis(2), Slice::new(0, None, 2))
        ),
        Err(ShapeError::NotContiguous {
            what: "attention out"
        })
    );
    untouched3(&wide_out);
    let wide_keys = a3(3, 2, 4);
    let strided_kv = KvView::from_f32(
        wide_keys.slice_axis(Axis(2), Slice::new(0, None, 2)),
        values.view(),
    )
    .unwrap();
    assert_eq!(
        b.attention(q.view(), &[1, 2], &strided_kv, &params, out.view_mut()),
        Err(ShapeError::NotContiguous {
            what: "attention keys"
        })
    );
    untouched3(&out);

    // rms_norm: x, out [n, d], weight [d] non-empty
    let mut out = f(6);
    assert_eq!(
        b.rms_norm(&f(6), &[], 1e-5, &mut out),
        Err(ShapeError::Geometry("rms_norm weight is empty"))
    );
    assert_eq!(
        b.rms_norm(&f(6), &f(4), 1e-5, &mut out),
        Err(not_multiple("rms_norm x", 6, 4))
    );
    assert_eq!(
        b.rms_norm(&f(8), &f(4), 1e-5, &mut out),
        Err(len("rms_norm out", 8, 6))
    );
    untouched(&out);

    // swiglu, add: equal lengths (the `what` label is the backend's own)
    let length_mismatch = |r: Result<(), ShapeError>, expected, actual| match r {
        Err(ShapeError::Length {
            expected: e,
            actual: a,
            ..
        }) => assert_eq!((e, a), (expected, actual)),
        other => panic!("expected a length error, got {other:?}"),
    };
    let mut out = f(5);
    length_mismatch(b.swiglu(&f(5), &f(4), &mut out), 5, 4);
    untouched(&out);
    let mut out = f(4);
    length_mismatch(b.swiglu(&f(5), &f(5), &mut out), 5, 4);
    untouched(&out);
    let mut acc = f(5);
    length_mismatch(b.add(&mut acc, &f(6)), 5, 6);
    untouched(&acc);

    // embed_row: row < rows, out [cols]
    let mut out = f(8);
    let index = ShapeError::Index {
        what: "embedding rows",
        index: 4,
        len: 4,
    };
    assert_eq!(b.embed_row(&w, 4, &mut out), Err(index));
    untouched(&out);
    let mut out = f(7);
    assert_eq!(
        b.embed_row(&w, 0, &mut out),
        Err(len("embedding out", 8, 7))
    );
    untouched(&out);
}

// ---------------------------------------------------------------------------------------
// The suite, instantiated once per backend
// ---------------------------------------------------------------------------------------

macro_rules! conformance {
    ($module:ident, $backend:ty, $make:expr) => {
        mod $module {
            use super::*;
            use std::sync::LazyLock;

            static BACKEND: LazyLock<$backend> = LazyLock::new(|| $make);

            fn b() -> &'static $backend {
                &BACKEND
            }

            proptest! {
                #![proptest_config(config(48))]

                #[test]
                fn gemv((dtype, cols) in dtype_cols(), rows in dim(), seed in any::<u64>()) {
                    conforms(b(), &Gemv::new(dtype, rows, cols, seed))?;
                }

                #[test]
                fn gemm(
                    (dtype, cols) in dtype_cols(), rows in dim(), n in 0usize..6,
                    seed in any::<u64>()
                ) {
                    let case = Gemm::new(dtype, rows, cols.max(dtype.block_len()), n, seed);
                    conforms(b(), &case)?;
                    gemm_rows_match_gemv(b(), &case)?;
                }

                #[test]
                fn quantized_vs_f32(
                    (dtype, cols) in dtype_cols(), rows in dim(), n in 1usize..4,
                    seed in any::<u64>()
                ) {
                    let cols = cols.max(dtype.block_len());
                    let m = Matrix::random(dtype, rows, cols, &mut Rng::new(seed));
                    quantized_matches_f32(b(), &m, n, seed ^ 1)?;
                }

                #[test]
                fn gemv_q8(
                    dtype in prop::sample::select(vec![DType::Q8_0, DType::Q4_0, DType::Q4_1]),
                    blocks in 0usize..20, rows in dim(), seed in any::<u64>()
                ) {
                    conforms(b(), &GemvQ8::new(dtype, rows, blocks * 32, seed))?;
                }

                #[test]
                fn embed_row((dtype, cols) in dtype_cols(), rows in 1usize..5, seed in any::<u64>()) {
                    exact(b(), &Embed::new(dtype, rows, cols, seed))?;
                }

                #[test]
                fn rope(
                    head_dim in head_dim_even(), n_heads in 1usize..4,
                    positions in prop::collection::vec(position(), 0..4),
                    base in rope_base(), style in rope_style(), seed in any::<u64>()
                ) {
                    conforms(b(), &RopeCase::new(head_dim, n_heads, positions, base, style, seed))?;
                }

                #[test]
                fn attention_heads(
                    head_dim in head_dim(), n_kv in 1usize..4,
                    n_keys in prop_oneof![0usize..4, 0usize..80], seed in any::<u64>()
                ) {
                    conforms(b(), &Attention::heads(head_dim, n_kv, n_keys, seed))?;
                }

                #[test]
                fn attention(
                    head_dim in head_dim(), n_kv in 1usize..4, group in 1usize..4,
                    pos0 in 0usize..40, n_new in 0usize..5, extra in 0usize..3,
                    cuts in prop::collection::vec(0usize..48, 0..3),
                    window in prop::option::of(0usize..12), seed in any::<u64>()
                ) {
                    let shape = AttnShape { n_heads: n_kv * group, n_kv_heads: n_kv, head_dim, pos0 };
                    let mut case = Attention::new(shape, n_new, extra, seed).with_cuts(&cuts);
                    if let Some(window) = window {
                        case = case.with_mask(Mask::SlidingWindow { window });
                    }
                    conforms(b(), &case)?;
                }

                /// How a store cuts its rows into segments never changes the bits.
                #[test]
                fn attention_segments_do_not_change_bits(
                    n_kv in 1usize..4, group in 1usize..4, pos0 in 0usize..40,
                    n_new in 1usize..5, cuts in prop::collection::vec(1usize..48, 1..4),
                    seed in any::<u64>()
                ) {
                    let shape = AttnShape { n_heads: n_kv * group, n_kv_heads: n_kv, head_dim: 8, pos0 };
                    let whole = Attention::new(shape, n_new, 2, seed);
                    let cut = Attention::new(shape, n_new, 2, seed).with_cuts(&cuts);
                    prop_assert_eq!(bits(&whole.run(b())), bits(&cut.run(b())), "cuts {:?}", cuts);
                }

                #[test]
                fn rms_norm(
                    n in 0usize..4, d in dim1(), eps in prop::sample::select(vec![1e-5f32, 1e-6]),
                    seed in any::<u64>()
                ) {
                    conforms(b(), &RmsNorm::new(n, d, eps, seed))?;
                }

                #[test]
                fn swiglu(
                    len in dim(), gate_scale in prop::sample::select(vec![4.0f32, 20.0, 120.0]),
                    seed in any::<u64>()
                ) {
                    conforms(b(), &Swiglu::new(len, gate_scale, seed))?;
                }

                #[test]
                fn add(len in dim(), seed in any::<u64>()) {
                    exact(b(), &Add::new(len, seed))?;
                }

                #[test]
                fn softmax(
                    len in dim(), scale in prop::sample::select(vec![1.0f32, 10.0, 60.0]),
                    masked in prop_oneof![Just(0usize), 0usize..4, Just(usize::MAX)],
                    seed in any::<u64>()
                ) {
                    conforms(b(), &Softmax::new(len, scale, masked, seed))?;
                }
            }

            #[test]
            fn model_matmul_f32() {
                model_matmul_conforms(b(), DType::F32);
            }

            #[test]
            fn model_matmul_f16() {
                model_matmul_conforms(b(), DType::F16);
            }

            #[test]
            fn model_matmul_bf16() {
                model_matmul_conforms(b(), DType::BF16);
            }

            #[test]
            fn model_matmul_q8_0() {
                model_matmul_conforms(b(), DType::Q8_0);
            }

            #[test]
            fn model_matmul_q4_0() {
                model_matmul_conforms(b(), DType::Q4_0);
            }

            #[test]
            fn model_matmul_q4_1() {
                model_matmul_conforms(b(), DType::Q4_1);
            }

            #[test]
            fn model_output_gemv_49152x576() {
                output_gemv().check(b());
            }

            #[test]
            fn model_attention_and_elementwise() {
                model_ops_conform(b());
            }

            #[test]
            fn smollm2_rows_quantized_vs_f32() {
                smollm2_rows_match_f32(b());
            }

            #[test]
            fn shape_errors() {
                super::shape_errors(b());
            }
        }
    };
}

conformance!(scalar, Scalar, Scalar::new());
conformance!(
    rayon_scalar,
    Rayon<Scalar>,
    Rayon::new(Scalar::new(), RAYON_THREADS).expect("thread pool")
);
conformance!(simd, Simd, Simd::new());
conformance!(
    rayon_simd,
    Rayon<Simd>,
    Rayon::new(Simd::new(), RAYON_THREADS).expect("thread pool")
);
