//! The weight formats against gguf-py's own test vectors
//! (`shared/reference/quant-blocks.json`, made by the `gguf` Python package 0.19.0):
//!
//! - decoding (`kvcore_scalar::quant::dequantize_row`) reproduces `values` bit for bit,
//!   for the synthetic cases of every format and for real SmolLM2 rows;
//! - encoding (`quantize_row`) reproduces `bytes` exactly from `input`;
//! - the scalar GEMV on the stored rows equals, bit for bit, the scalar GEMV on an F32
//!   copy of the decoded values (the reference decodes first, then runs the f32 dot).
//!
//! Every other backend's quantised matmul is held to the f32 path within tolerance in
//! `conformance.rs`.

use kvcore::backend::{Backend, DType, Weights};
use kvcore_scalar::Scalar;
use kvcore_scalar::quant::{dequantize_row, quantize_row};
use kvcore_test_support::conformance::oracle::bits;
use kvcore_test_support::conformance::reference_data;

#[test]
fn every_format_has_synthetic_vectors() {
    let data = reference_data::load();
    // quant-blocks.json covers the formats SmolLM2 uses; the Gemma 3 ones are checked
    // against quant-blocks-k.json in `quant_vectors_k.rs`.
    for dtype in [
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
    ] {
        let n = data.synthetic.iter().filter(|c| c.dtype == dtype).count();
        assert_eq!(n, 5, "{dtype}: expected 5 synthetic cases");
    }
    assert_eq!(data.real.len(), 3, "expected 3 SmolLM2 tensors");
}

#[test]
fn dequantize_matches_gguf_py_bitwise() {
    for c in reference_data::load().synthetic {
        let w = Weights::new(c.dtype, 1, c.values.len(), &c.bytes).expect("whole blocks");
        let mut out = vec![f32::NAN; c.values.len()];
        dequantize_row(&w, 0, &mut out);
        assert_eq!(bits(&out), bits(&c.values), "{} {}", c.dtype, c.case);
    }
}

#[test]
fn quantize_matches_gguf_py_bytes() {
    for c in reference_data::load().synthetic {
        assert_eq!(
            quantize_row(c.dtype, &c.input),
            c.bytes,
            "{} {}",
            c.dtype,
            c.case
        );
    }
}

/// gguf-py rounds Q8_0 quants with `np_roundf` (ties away from zero, like ggml's C
/// `roundf`), not numpy's ties-to-even `np.round`. The reference vectors hold no exact
/// ties, so pin the tie rule here: with `max|x| = 127` the scale is exactly 1.
#[test]
fn q8_0_rounds_ties_away_from_zero() {
    let mut block = [0.0f32; 32];
    block[..6].copy_from_slice(&[127.0, 2.5, -2.5, 0.5, -0.5, 1.5]);
    let bytes = quantize_row(DType::Q8_0, &block);
    assert_eq!(bytes[..2], half::f16::from_f32(1.0).to_le_bytes());
    let q: Vec<i8> = bytes[2..8].iter().map(|&b| b as i8).collect();
    assert_eq!(q, [127, 3, -3, 1, -1, 2]);
}

#[test]
fn f32_round_trips_exactly() {
    for c in reference_data::load().synthetic {
        let bytes = quantize_row(DType::F32, &c.input);
        let w = Weights::new(DType::F32, 1, c.input.len(), &bytes).expect("f32 row");
        let mut out = vec![f32::NAN; c.input.len()];
        dequantize_row(&w, 0, &mut out);
        assert_eq!(bits(&out), bits(&c.input), "{}", c.case);
    }
}

#[test]
fn smollm2_rows_dequantize_bitwise() {
    for t in reference_data::load().real {
        t.assert_scalar_decodes_bitwise();
    }
}

#[test]
fn smollm2_rows_embed_row_matches_values() {
    for t in reference_data::load().real {
        let data = t.bytes.concat();
        let w = Weights::new(t.dtype, t.bytes.len(), t.row_len, &data).expect("rows");
        for (r, values) in t.values.iter().enumerate() {
            let mut out = vec![f32::NAN; t.row_len];
            Scalar::new().embed_row(&w, r, &mut out).expect("shapes");
            assert_eq!(bits(&out), bits(values), "{} row {r}", t.tensor);
        }
    }
}

/// A deterministic activation vector with mixed signs and magnitudes.
fn activations(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
        .collect()
}

#[test]
fn quantized_gemv_equals_f32_gemv_on_decoded_rows() {
    let data = reference_data::load();
    let cases = data
        .real
        .iter()
        .map(|t| (t.dtype, t.row_len, t.bytes.concat(), t.values.concat()))
        .chain(
            data.synthetic
                .iter()
                .map(|c| (c.dtype, c.values.len(), c.bytes.clone(), c.values.clone())),
        );
    for (dtype, cols, bytes, values) in cases {
        let rows = values.len() / cols;
        let wq = Weights::new(dtype, rows, cols, &bytes).expect("stored rows");
        let wf = Weights::from_f32(rows, cols, &values).expect("f32 rows");
        let x = activations(cols);
        let (mut yq, mut yf) = (vec![f32::NAN; rows], vec![f32::NAN; rows]);
        Scalar::new().gemv(&wq, &x, &mut yq).expect("shapes");
        Scalar::new().gemv(&wf, &x, &mut yf).expect("shapes");
        assert_eq!(bits(&yq), bits(&yf), "{dtype} [{rows}, {cols}]");
    }
}
