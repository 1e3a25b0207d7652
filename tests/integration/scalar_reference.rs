//! The scalar reference backend against a float64 oracle
//! (`kvcore_test_support::conformance::oracle`): weights decoded independently in f64,
//! dot products, softmax, RoPE angles, norms all in f64. Every output must lie within
//! the oracle's worst-case error bound for one f32 implementation (the bounds and their
//! derivation are documented there).
//!
//! Inputs: proptest draws shapes (0, 1, tile sizes ±1, odd lengths, 192 and 576) and a
//! seed for the data, with a fixed RNG seed; the model shapes run as deterministic cases.
//! Bitwise properties of the reference are checked too: decoding equals the f64
//! decoder's f32 values exactly, and GEMM row `t` equals GEMV of token `t` bit for bit.

use kvcore::backend::{DType, Mask};
use kvcore_scalar::Scalar;
use kvcore_test_support::conformance::cases::{
    Add, Attention, AttnShape, Case, Embed, Geglu, Gemm, Gemv, RmsNorm, RopeCase, Softmax, Swiglu,
};
use kvcore_test_support::conformance::model::MATMUL_SHAPES;
use kvcore_test_support::conformance::oracle::{bits, check};
use kvcore_test_support::conformance::strategy::*;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const B: Scalar = Scalar::new();

/// The scalar output of `case` within the oracle's bound.
fn against_oracle(case: &impl Case) -> Result<(), TestCaseError> {
    check(&case.label(), &case.run(&B), &case.oracle()).map_err(TestCaseError::fail)
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn gemv((dtype, cols) in dtype_cols(), rows in dim(), seed in any::<u64>()) {
        against_oracle(&Gemv::new(dtype, rows, cols, seed))?;
    }

    #[test]
    fn gemm_rows_equal_gemv_bitwise(
        (dtype, cols) in dtype_cols(), rows in dim(), n in 0usize..6, seed in any::<u64>()
    ) {
        let case = Gemm::new(dtype, rows, cols.max(dtype.block_len()), n, seed);
        against_oracle(&case)?;
        prop_assert_eq!(bits(&case.run(&B)), bits(&case.run_as_gemv(&B)), "{}", case.label());
    }

    #[test]
    fn embed_row_is_exact((dtype, cols) in dtype_cols(), rows in 1usize..5, seed in any::<u64>()) {
        against_oracle(&Embed::new(dtype, rows, cols, seed))?;
    }

    #[test]
    fn rope(
        head_dim in head_dim_even(), n_heads in 1usize..4,
        positions in prop::collection::vec(position(), 0..4),
        base in rope_base(), style in rope_style(), seed in any::<u64>()
    ) {
        against_oracle(&RopeCase::new(head_dim, n_heads, positions, base, style, seed))?;
    }

    #[test]
    fn attention_heads(
        head_dim in head_dim(), n_kv in 1usize..4, n_keys in prop_oneof![0usize..4, 0usize..80],
        seed in any::<u64>()
    ) {
        against_oracle(&Attention::heads(head_dim, n_kv, n_keys, seed))?;
    }

    #[test]
    fn attention(
        head_dim in head_dim(), n_kv in 1usize..4, group in 1usize..4, pos0 in 0usize..40,
        n_new in 0usize..5, extra in 0usize..3, cuts in prop::collection::vec(0usize..48, 0..3),
        window in prop::option::of(0usize..12), seed in any::<u64>()
    ) {
        let shape = AttnShape { n_heads: n_kv * group, n_kv_heads: n_kv, head_dim, pos0 };
        let mut case = Attention::new(shape, n_new, extra, seed).with_cuts(&cuts);
        if let Some(window) = window {
            case = case.with_mask(Mask::SlidingWindow { window });
        }
        against_oracle(&case)?;
    }

    #[test]
    fn rms_norm(n in 0usize..4, d in dim1(), eps in prop::sample::select(vec![1e-5f32, 1e-6]), seed in any::<u64>()) {
        against_oracle(&RmsNorm::new(n, d, eps, seed))?;
    }

    #[test]
    fn swiglu(len in dim(), gate_scale in prop::sample::select(vec![4.0f32, 20.0, 120.0]), seed in any::<u64>()) {
        against_oracle(&Swiglu::new(len, gate_scale, seed))?;
    }

    #[test]
    fn geglu(len in dim(), gate_scale in prop::sample::select(vec![4.0f32, 20.0, 120.0]), seed in any::<u64>()) {
        against_oracle(&Geglu::new(len, gate_scale, seed))?;
    }

    #[test]
    fn add_is_correctly_rounded(len in dim(), seed in any::<u64>()) {
        let case = Add::new(len, seed);
        let want: Vec<f32> = case.oracle().iter().map(|b| b.value as f32).collect();
        prop_assert_eq!(bits(&case.run(&B)), bits(&want), "{}", case.label());
    }

    #[test]
    fn softmax(
        len in dim(), scale in prop::sample::select(vec![1.0f32, 10.0, 60.0]),
        masked in prop_oneof![Just(0usize), 0usize..4, Just(usize::MAX)], seed in any::<u64>()
    ) {
        against_oracle(&Softmax::new(len, scale, masked, seed))?;
    }
}

#[test]
fn model_shape_gemv_every_dtype() {
    for dtype in DType::ALL {
        let shapes = MATMUL_SHAPES.iter().enumerate();
        for (i, &(rows, cols)) in shapes.filter(|s| s.1.1.is_multiple_of(dtype.block_len())) {
            let case = Gemv::new(dtype, rows, cols, 0x5eed + i as u64);
            check(&case.label(), &case.run(&B), &case.oracle()).unwrap();
        }
    }
}

#[test]
fn model_output_gemv_49152x576() {
    // The tied embedding / output projection, in the real model's format.
    let case = Gemv::new(DType::Q8_0, 49152, 576, 0x0b1e);
    check(&case.label(), &case.run(&B), &case.oracle()).unwrap();
}

#[test]
fn model_shape_attention_gqa() {
    // SmolLM2: 9 query heads over 3 KV heads of 64; a 7-token prefill after 100 cached.
    let shape = AttnShape {
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
        pos0: 100,
    };
    let case = Attention::new(shape, 7, 0, 0xa77e);
    check(&case.label(), &case.run(&B), &case.oracle()).unwrap();
}

#[test]
fn all_masked_softmax_is_zeros_not_nan() {
    for len in [1, 2, 33] {
        let case = Softmax::new(len, 1.0, usize::MAX, 1);
        assert_eq!(bits(&case.run(&B)), vec![0; len]);
    }
    let mut empty: [f32; 0] = [];
    kvcore::Backend::softmax(&B, &mut empty);
}

#[test]
fn attention_that_sees_no_key_is_zeros() {
    for hd in [1, 8, 64] {
        let case = Attention::heads(hd, 2, 0, 3);
        assert_eq!(bits(&case.run(&B)), vec![0; 2 * hd]);
        // A zero window hides every key, the query's own included.
        let shape = AttnShape {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: hd,
            pos0: 5,
        };
        let case = Attention::new(shape, 2, 0, 4).with_mask(Mask::SlidingWindow { window: 0 });
        assert_eq!(bits(&case.run(&B)), vec![0; 2 * 2 * hd]);
    }
}

/// The 8-bit-activation reference (`q8::gemv_reference`, the integer-dot formula of every
/// format with an 8-bit path) against an independent computation of the same value: the
/// oracle's f64 weight decoder dotted in f64 with the dequantised activations
/// `Q8Acts::dequantize`. The two differ only by the rounding of each decoded weight
/// (`Q4_K`'s subtraction, `≤ u·mag`) and of each `d·q` (`≤ u`) to f32, and the reference's
/// final rounding: `2u·Σ mag_j·|x̂_j| + u·|y| + TINY`. A wrong nibble order, fifth bit,
/// scale or dropped minimum term misses by far more.
#[test]
fn q8_formula_equals_the_dequantised_dot() {
    use kvcore::backend::{Q8Acts, Q8Layout, q8};
    use kvcore_test_support::conformance::decode::dot_f64;
    use kvcore_test_support::conformance::inputs::{Matrix, Rng};
    use kvcore_test_support::conformance::oracle::{TINY, U};
    for dtype in DType::ALL.into_iter().filter(|&d| q8::supports(d)) {
        let mut rng = Rng::new(0x9e1 + u64::from(dtype.ggml_type()));
        let (rows, cols) = (9, 4 * kvcore::backend::QK_K);
        let m = Matrix::random(dtype, rows, cols, &mut rng);
        let x = rng.values(cols);
        let layout = Q8Layout::of(dtype).unwrap();
        let xq = Q8Acts::from_f32(layout, &x).unwrap();
        let xd = xq.dequantize();
        let mut y = vec![0.0f32; rows];
        q8::gemv_reference(&m.weights(), &xq, &mut y).unwrap();
        for (r, &yr) in y.iter().enumerate() {
            let (want, mag) = dot_f64(&m.row(r), &xd);
            let tol = 2.0 * U * mag + U * f64::from(yr).abs() + TINY;
            let diff = (f64::from(yr) - want).abs();
            assert!(
                diff <= tol,
                "{dtype} row {r}: {yr} vs {want} (|diff| {diff:e} > {tol:e})"
            );
        }
    }
}
