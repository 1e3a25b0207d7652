//! The suite's checks, generic over the backend, and [`conformance_suite!`], which
//! instantiates them as `#[test]` functions for one backend.
//!
//! [`conformance_suite!`]: crate::conformance_suite

use std::any::Any;
use std::sync::OnceLock;

use kvcore::backend::{Backend, Q8Acts, Q8Layout, Weights};
use kvcore_scalar::Scalar;
use proptest::test_runner::TestCaseError;

use super::cases::{Case, Gemm};
use super::inputs::{Matrix, Rng};
use super::oracle::{self, bits, check_pair};
use super::reference_data;

/// The reference every backend is compared with.
pub const REFERENCE: Scalar = Scalar::new();

/// `b` on `case` within twice the oracle's bound of the scalar reference.
pub fn conforms<B: Backend>(b: &B, case: &impl Case) -> Result<(), TestCaseError> {
    let label = format!("{}: {}", b.name(), case.label());
    check_pair(&label, &case.run(b), &case.run(&REFERENCE), &case.oracle())
        .map_err(TestCaseError::fail)
}

/// `b` on `case` bit for bit equal to the scalar reference.
pub fn exact<B: Backend>(b: &B, case: &impl Case) -> Result<(), TestCaseError> {
    let (got, want) = (case.run(b), case.run(&REFERENCE));
    proptest::prop_assert_eq!(bits(&got), bits(&want), "{}: {}", b.name(), case.label());
    Ok(())
}

/// GEMM row `t` within twice the bound of the backend's own GEMV of token `t`.
pub fn gemm_rows_match_gemv<B: Backend>(b: &B, case: &Gemm) -> Result<(), TestCaseError> {
    let label = format!("{}: {} rows vs gemv", b.name(), case.label());
    check_pair(&label, &case.run(b), &case.run_as_gemv(b), &case.oracle())
        .map_err(TestCaseError::fail)
}

/// `gemm_q8` of `n` tokens (activations from `seed`, quantised by the backend) on the
/// block-format `m`: each row bit for bit the backend's `gemv_q8` of that token (the
/// trait's contract), and a token count that disagrees with `y` the reference's error.
pub fn gemm_q8_rows_match_gemv_q8<B: Backend>(
    b: &B,
    m: &Matrix,
    n: usize,
    seed: u64,
) -> Result<(), TestCaseError> {
    let layout = Q8Layout::of(m.dtype).expect("a format with an 8-bit path");
    let x: Vec<Q8Acts> = (0..n as u64)
        .map(|t| {
            let mut q = Q8Acts::new();
            b.quantize_q8(layout, &Rng::new(seed ^ t).values(m.cols), &mut q)
                .expect("whole blocks");
            q
        })
        .collect();
    let w = m.weights();
    let mut y = vec![f32::NAN; n * m.rows];
    b.gemm_q8(&w, &x, &mut y).expect("gemm_q8 shapes");
    for (t, xt) in x.iter().enumerate() {
        let mut want = vec![f32::NAN; m.rows];
        b.gemv_q8(&w, xt, &mut want).expect("gemv_q8 shapes");
        let label = format!(
            "{}: gemm_q8 {} [{}, {}] token {t} of {n}",
            b.name(),
            m.dtype,
            m.rows,
            m.cols
        );
        proptest::prop_assert_eq!(
            bits(&y[t * m.rows..(t + 1) * m.rows]),
            bits(&want),
            "{}",
            label
        );
    }
    let mut short = vec![0.0f32; (n + 1) * m.rows];
    proptest::prop_assert_eq!(
        b.gemm_q8(&w, &x, &mut short).map_err(|e| e.to_string()),
        Scalar
            .gemm_q8(&w, &x, &mut short.clone())
            .map_err(|e| e.to_string()),
        "{}: gemm_q8 with y for n + 1 tokens",
        b.name()
    );
    if m.rows > 0 {
        proptest::prop_assert!(b.gemm_q8(&w, &x, &mut short).is_err());
    }
    Ok(())
}

/// Quantised GEMV and GEMM (`n` tokens, activations from `seed`) on `m` against the same
/// backend on the decoded F32 copy: within twice the quantised product's bound (the
/// decoded values are exact f32, so the exact results are equal).
pub fn quantized_matches_f32<B: Backend>(
    b: &B,
    m: &Matrix,
    n: usize,
    seed: u64,
) -> Result<(), TestCaseError> {
    let values = m.decoded_f32();
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

/// The real SmolLM2 rows of the reference data ([`reference_data::load`]), quantised against
/// their decoded values.
///
/// # Panics
/// If a check fails, or the reference data is missing.
pub fn smollm2_rows_match_f32<B: Backend>(b: &B) {
    real_rows_match_f32(b, reference_data::load().real);
}

/// As [`smollm2_rows_match_f32`], for the real Gemma 3 rows of `quant-blocks-k.json`
/// (`Q5_0`, `Q4_K`, `Q6_K`, `Q8_0`).
///
/// # Panics
/// If the reference data cannot be read or a check fails.
pub fn gemma3_rows_match_f32<B: Backend>(b: &B) {
    real_rows_match_f32(b, reference_data::load_gemma3_rows());
}

fn real_rows_match_f32<B: Backend>(b: &B, tensors: Vec<reference_data::RealRows>) {
    for t in tensors {
        let m = Matrix {
            dtype: t.dtype,
            rows: t.bytes.len(),
            cols: t.row_len,
            bytes: t.bytes.concat(),
        };
        assert_eq!(
            m.decoded_f32(),
            t.values.concat(),
            "{}: decoded values",
            t.tensor
        );
        quantized_matches_f32(b, &m, 3, 0x51).unwrap();
    }
}

/// The backend of one instantiation of [`conformance_suite!`], built on first use and
/// shared by its tests (a `static` of a type the macro's caller need not name).
///
/// [`conformance_suite!`]: crate::conformance_suite
pub struct SharedBackend(OnceLock<Box<dyn Any + Send + Sync>>);

impl SharedBackend {
    /// Empty: nothing is built until [`get_or_init`](Self::get_or_init).
    pub const fn new() -> Self {
        SharedBackend(OnceLock::new())
    }

    /// The backend, built by `make` on the first call.
    ///
    /// # Panics
    /// If an earlier call built a backend of another type (each `static` serves one
    /// constructor).
    pub fn get_or_init<B: Backend + 'static>(
        &'static self,
        make: impl FnOnce() -> B,
    ) -> &'static B {
        (self.0.get_or_init(|| Box::new(make())).downcast_ref())
            .expect("a SharedBackend holds one backend type")
    }
}

impl Default for SharedBackend {
    fn default() -> Self {
        Self::new()
    }
}

/// The backend conformance suite as `#[test]` functions in a new module: every kernel of
/// a backend against the scalar reference (see [`conformance`](crate::conformance)).
///
/// `conformance_suite!(module, make)` declares `mod module`, whose tests share one
/// backend built on first use by `make`: a function or closure taking no arguments and
/// returning a `'static` [`Backend`](kvcore::backend::Backend), such as `Scalar::new`
/// or `|| Rayon::new(Simd::new(), 2).expect("thread pool")`. `make` is evaluated inside
/// the module, which imports the items of the enclosing one.
///
/// The tests, each reporting the backend's name and the case on failure:
/// - proptests (fixed RNG seed, so every run draws the same inputs; 48 cases each):
///   `gemv`, `gemm` (also against the backend's own GEMV), `quantized_vs_f32`,
///   `gemv_q8` (every format with an 8-bit path), `gemm_q8` (each row bit for bit the
///   token's `gemv_q8`, up to 139 rows so SIMD panels of 64 split), `embed_row` (exact), `rope`, `attention_heads`, `attention`,
///   `attention_segments_do_not_change_bits`, `rms_norm`, `swiglu`, `geglu`, `add` (exact),
///   `softmax`;
/// - SmolLM2-135M's shapes: `model_matmul_{f32,f16,bf16,q8_0,q4_0,q4_1}`,
///   `model_output_gemv_49152x576`, `model_attention_and_elementwise`;
/// - `smollm2_rows_quantized_vs_f32` (reads the reference data, see
///   [`reference_data`](crate::conformance::reference_data));
/// - `shape_errors`.
///
/// The caller needs only `kvcore-test-support` (and `kvcore` for its backend) as
/// dev-dependencies: the expansion reaches proptest through this crate. The
/// [`conformance`](crate::conformance) module shows a complete test file.
#[macro_export]
macro_rules! conformance_suite {
    ($module:ident, $make:expr $(,)?) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            use $crate::conformance::__private::kvcore::backend::{Backend, DType, Mask};
            use $crate::conformance::__private::proptest::prelude::{
                Just, any, prop, prop_assert_eq, prop_oneof, proptest,
            };
            use $crate::conformance::cases::{
                Add, Attention, AttnShape, Case, Embed, Gemm, Gemv, GemvQ8, RmsNorm, RopeCase,
                Softmax, Swiglu, Geglu,
            };
            use $crate::conformance::inputs::{Matrix, Rng};
            use $crate::conformance::oracle::bits;
            use $crate::conformance::strategy::{
                config, dim, dim1, dtype_cols, head_dim, head_dim_even, kv_attention, position,
                q8_dtype, rope_base, rope_style,
            };
            use $crate::conformance::suite::{
                SharedBackend, conforms, exact, gemm_q8_rows_match_gemv_q8, gemm_rows_match_gemv,
                quantized_matches_f32,
            };
            use $crate::conformance::{model, shape_errors as errors, suite};

            static BACKEND: SharedBackend = SharedBackend::new();

            fn b() -> &'static impl Backend {
                BACKEND.get_or_init($make)
            }

            proptest! {
                #![proptest_config(config(48))]

                #[test]
                fn gemv((dtype, cols) in dtype_cols(), rows in dim(), seed in any::<u64>()) {
                    conforms(b(), &Gemv::new(dtype, rows, cols, seed))?;
                }

                #[test]
                fn gemm(
                    (dtype, cols) in dtype_cols(), rows in dim(), n in 0usize..20,
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
                    dtype in q8_dtype(),
                    blocks in 0usize..20, rows in dim(), seed in any::<u64>()
                ) {
                    // 0..640 columns, rounded up to whole blocks of the format.
                    let cols = (blocks * 32).div_ceil(dtype.block_len()) * dtype.block_len();
                    conforms(b(), &GemvQ8::new(dtype, rows, cols, seed))?;
                }

                #[test]
                fn gemm_q8(
                    dtype in q8_dtype(),
                    blocks in 0usize..12, rows in 0usize..140, n in 0usize..10, seed in any::<u64>()
                ) {
                    let cols = (blocks * 32).div_ceil(dtype.block_len()) * dtype.block_len();
                    let m = Matrix::random(dtype, rows, cols, &mut Rng::new(seed));
                    gemm_q8_rows_match_gemv_q8(b(), &m, n, seed ^ 7)?;
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
                    let case = Attention::new(shape, n_new, extra, seed)
                        .with_cuts(&cuts)
                        .with_window(window);
                    conforms(b(), &case)?;
                }

                /// Keys and values stored as f16, bf16 or q8_0 (chosen separately), read
                /// in place: within the f32 tolerance of attention over the decoded
                /// values, at SmolLM2's and Gemma 3's head sizes.
                #[test]
                fn attention_kv_types(
                    // Up to 27 query vectors: `Simd`'s tiles of 24 and its weighted sums
                    // of more than 8 outputs (passes over rows converted once).
                    case in kv_attention(
                        vec![32, 64, 256], 1..3, 0..90, prop_oneof![1usize..4, 8usize..10], 1,
                        1..40, false,
                    )
                ) {
                    conforms(b(), &case.case())?;
                }

                /// Deep caches, where attention runs in parts of the keys (`Simd` folds
                /// parts of 256 positions): causal and windowed, every KV type, the
                /// rows cut into segments, a decode step, a few prefill rows, or more
                /// rows than one of `Simd`'s tiles (which stages a part's rows as f32).
                #[test]
                fn attention_at_depth(
                    case in kv_attention(
                        vec![32, 64], 1..3, 200..1100,
                        prop_oneof![1usize..4, 9usize..12, 25usize..30], 1, 1..700, true,
                    )
                ) {
                    conforms(b(), &case.case())?;
                }

                /// How many query rows a call holds never changes the bits: a prefill
                /// of several tiles (which `Simd` serves from the part's rows staged as
                /// f32) equals its rows computed one at a time (rows read in place),
                /// every KV type, at depth, cut into segments, causal or windowed.
                #[test]
                fn attention_rows_do_not_change_bits(
                    case in kv_attention(vec![32, 64], 1..3, 0..700, 9usize..40, 1, 1..400, true)
                ) {
                    let case = case.case();
                    prop_assert_eq!(bits(&case.run(b())), bits(&case.run_by_rows(b())), "{}", case.label());
                }

                /// How a store cuts its rows into segments never changes the bits.

                #[test]
                fn attention_segments_do_not_change_bits(
                    n_kv in 1usize..4, group in 1usize..4, pos0 in 0usize..40,
                    n_new in 1usize..5, cuts in prop::collection::vec(1usize..48, 1..4),
                    deep in prop_oneof![Just(0usize), 250usize..600], seed in any::<u64>()
                ) {
                    let pos0 = pos0 + deep;
                    let cuts: Vec<usize> = cuts.iter().map(|c| c + deep / 2).collect();
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
                fn geglu(
                    len in dim(), gate_scale in prop::sample::select(vec![4.0f32, 20.0, 120.0]),
                    seed in any::<u64>()
                ) {
                    conforms(b(), &Geglu::new(len, gate_scale, seed))?;
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

            $crate::__conformance_tests! {
                model_matmul_f32 => model::matmul_conforms(b(), DType::F32);
                model_matmul_f16 => model::matmul_conforms(b(), DType::F16);
                model_matmul_bf16 => model::matmul_conforms(b(), DType::BF16);
                model_matmul_q8_0 => model::matmul_conforms(b(), DType::Q8_0);
                model_matmul_q4_0 => model::matmul_conforms(b(), DType::Q4_0);
                model_matmul_q4_1 => model::matmul_conforms(b(), DType::Q4_1);
                model_matmul_gemma3 => model::gemma3_matmuls_conform(b());
                model_matmul_gemma3_q8 => model::gemma3_matmuls_q8_conform(b());
                model_output_gemv_49152x576 => model::output_gemv_conforms(b());
                model_attention_and_elementwise => model::ops_conform(b());
                smollm2_rows_quantized_vs_f32 => suite::smollm2_rows_match_f32(b());
                gemma3_rows_quantized_vs_f32 => suite::gemma3_rows_match_f32(b());
                shape_errors => errors::check(b());
            }
        }
    };
}

/// One `#[test]` function a row, `name => check;`, running the check: the tests of
/// [`conformance_suite!`] on fixed inputs.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($($name:ident => $check:expr;)*) => {
        $(
            #[test]
            fn $name() {
                $check;
            }
        )*
    };
}
