//! The formats Gemma 3's Q4_K_M file adds (`Q5_0`, `Q4_K`, `Q6_K`, with `Q8_0`) against
//! real rows of that file (`shared/reference/quant-blocks-k.json`, decoded by the `gguf`
//! Python package 0.19.0, independent of kvcore):
//!
//! - decoding (`dequantize_row`, and `embed_row` of every backend) reproduces the values
//!   bit for bit: in these rows every product is exact in f32 and `Q4_K`'s one
//!   subtraction rounds once, so any correct decoder matches exactly (the reference
//!   README explains why);
//! - the scalar GEMV on the stored rows equals, bit for bit, the scalar GEMV on an F32
//!   copy of those values;
//! - the SIMD GEMM (whose panels use the SIMD decoder) on the stored rows equals its
//!   GEMM on the F32 copy bit for bit;
//! - per format, values encoded with `quantize_row` and decoded again lie within one
//!   quantisation step of the input (a wrong nibble, bit or scale position is off by the
//!   weight's whole range), and hand-built blocks decode to the values the layout in
//!   the reference's `formats` text gives.

use half::f16;
use kvcore::backend::{Backend, DType, QK_K, Weights};
use kvcore_rayon::Rayon;
use kvcore_scalar::Scalar;
use kvcore_scalar::quant::{dequantize, quantize_row};
use kvcore_simd::Simd;
use kvcore_test_support::conformance::inputs::Rng;
use kvcore_test_support::conformance::oracle::bits;
use kvcore_test_support::conformance::reference_data;

#[test]
fn gemma3_rows_cover_the_four_formats() {
    let types: Vec<DType> = reference_data::load_gemma3_rows()
        .iter()
        .map(|t| t.dtype)
        .collect();
    assert_eq!(types, [DType::Q5_0, DType::Q4_K, DType::Q6_K, DType::Q8_0]);
}

#[test]
fn gemma3_rows_dequantize_bitwise() {
    for t in reference_data::load_gemma3_rows() {
        assert_eq!(t.bytes.len(), 2, "{}: two rows", t.tensor);
        t.assert_scalar_decodes_bitwise();
    }
}

/// `b.embed_row` of every Gemma 3 reference row equals the reference values bit for bit.
fn embed_rows_bitwise<B: Backend>(b: &B) {
    for t in reference_data::load_gemma3_rows() {
        let data = t.bytes.concat();
        let w = Weights::new(t.dtype, t.bytes.len(), t.row_len, &data).expect("rows");
        for (r, values) in t.values.iter().enumerate() {
            let mut out = vec![f32::NAN; t.row_len];
            b.embed_row(&w, r, &mut out).expect("shapes");
            assert_eq!(
                bits(&out),
                bits(values),
                "{}: {} row {r}",
                b.name(),
                t.tensor
            );
        }
    }
}

#[test]
fn gemma3_rows_embed_row_bitwise_on_every_backend() {
    embed_rows_bitwise(&Scalar::new());
    embed_rows_bitwise(&Simd::new());
    embed_rows_bitwise(&Rayon::new(Simd::new(), 2).expect("thread pool"));
}

#[test]
fn gemma3_quantized_gemv_equals_f32_gemv_on_decoded_rows() {
    for t in reference_data::load_gemma3_rows() {
        let (rows, cols) = (t.bytes.len(), t.row_len);
        let (bytes, values) = (t.bytes.concat(), t.values.concat());
        let wq = Weights::new(t.dtype, rows, cols, &bytes).expect("stored rows");
        let wf = Weights::from_f32(rows, cols, &values).expect("f32 rows");
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        let (mut yq, mut yf) = (vec![f32::NAN; rows], vec![f32::NAN; rows]);
        Scalar::new().gemv(&wq, &x, &mut yq).expect("shapes");
        Scalar::new().gemv(&wf, &x, &mut yf).expect("shapes");
        assert_eq!(bits(&yq), bits(&yf), "{}", t.tensor);
    }
}

/// Encode random values of mixed magnitude and decode them: every weight must come back
/// within one ideal step of its sub-block (`max|x|` over the levels a side: 16 for
/// `Q5_0`, 31 for `Q6_K`; the span `max − min(0, min)` over 15 for `Q4_K`), plus 1/16 of
/// the largest such step in its block for the coarser super-block scale grid and the f16
/// scales (a correct round to nearest is within half a step). A misplaced nibble, high
/// bit or scale moves a weight by up to the whole range, far outside this.
#[test]
fn formats_round_trip_within_a_step() {
    let mut rng = Rng::new(17);
    for (dtype, sub) in [(DType::Q5_0, 32), (DType::Q4_K, 32), (DType::Q6_K, 16)] {
        let ideal_step = |xs: &[f32]| {
            let lo = xs.iter().fold(0.0f32, |m, &v| m.min(v));
            let hi = xs.iter().fold(0.0f32, |m, &v| m.max(v));
            let amax = hi.max(-lo);
            match dtype {
                DType::Q5_0 => amax / 16.0,
                DType::Q6_K => amax / 31.0,
                _ => (hi - lo) / 15.0,
            }
        };
        for _ in 0..20 {
            let n = 2 * QK_K;
            let scale = 2f32.powi(rng.below(12) as i32 - 6);
            let x: Vec<f32> = rng.values(n).iter().map(|v| v * scale).collect();
            let bytes = quantize_row(dtype, &x);
            assert_eq!(Some(bytes.len()), dtype.row_bytes(n));
            let mut back = vec![f32::NAN; n];
            dequantize(dtype, &bytes, &mut back);
            let block = dtype.block_len();
            for (xb, bb) in x.chunks(block).zip(back.chunks(block)) {
                let coarse = xb.chunks(sub).map(ideal_step).fold(0.0f32, f32::max) / 16.0;
                for (s, (xs, bs)) in xb.chunks(sub).zip(bb.chunks(sub)).enumerate() {
                    let bound = ideal_step(xs) + coarse;
                    for (j, (&a, &b)) in xs.iter().zip(bs).enumerate() {
                        assert!(
                            (a - b).abs() <= bound,
                            "{dtype}: sub-block {s} weight {j}: {a} decoded as {b} (bound {bound})"
                        );
                    }
                }
            }
        }
    }
}

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

/// A `Q5_0` block built by hand from the layout text: `d = 0.5`, weight `j` has 5-bit
/// quant `j` (so `w_j = 0.5·(j − 16)`): low nibbles `j & 15` in `qs[j]` / high nibbles
/// of `qs[j − 16]`, fifth bits `j >> 4` in `qh`.
#[test]
fn q5_0_hand_built_block() {
    let mut b = f16_bytes(0.5).to_vec();
    b.extend_from_slice(&0xffff_0000u32.to_le_bytes());
    b.extend((0..16u8).map(|j| j | j << 4));
    let mut out = [f32::NAN; 32];
    dequantize(DType::Q5_0, &b, &mut out);
    let want: Vec<f32> = (0..32).map(|j| 0.5 * (j as f32 - 16.0)).collect();
    assert_eq!(out.to_vec(), want);
}

/// A `Q4_K` super-block built by hand: `d = 1`, `dmin = 0.25`, sub-block `s` has scale
/// `s + 1` (and for `s ≥ 4`, 6-bit values with the high bits set: `sc = 48 + s`) and
/// minimum `2s` (`m = 32 + s` for `s ≥ 4`); weight `j` of a sub-block has quant `j % 16`.
#[test]
fn q4_k_hand_built_block() {
    let sc = |s: usize| if s < 4 { s as u8 + 1 } else { 48 + s as u8 };
    let m = |s: usize| if s < 4 { 2 * s as u8 } else { 32 + s as u8 };
    let mut scales = [0u8; 12];
    for s in 0..4 {
        scales[s] = sc(s) | (sc(s + 4) >> 4) << 6;
        scales[s + 4] = m(s) | (m(s + 4) >> 4) << 6;
        scales[s + 8] = (sc(s + 4) & 15) | (m(s + 4) & 15) << 4;
    }
    let mut b = f16_bytes(1.0).to_vec();
    b.extend_from_slice(&f16_bytes(0.25));
    b.extend_from_slice(&scales);
    // Byte l of group g: sub-block 2g's quant l % 16 low, sub-block 2g+1's high.
    b.extend((0..128).map(|i| {
        let q = (i % 32 % 16) as u8;
        q | q << 4
    }));
    let mut out = [f32::NAN; 256];
    dequantize(DType::Q4_K, &b, &mut out);
    for (i, &w) in out.iter().enumerate() {
        let (s, q) = (i / 32, (i % 32 % 16) as f32);
        let want = f32::from(sc(s)) * q - 0.25 * f32::from(m(s));
        assert_eq!(w, want, "weight {i}");
    }
}

/// A `Q6_K` super-block built by hand: `d = 0.5`, `scales[s] = s − 8` (negative ones
/// included), and weight `i` has the 6-bit quant `i % 64`, placed by the layout text:
/// half `n = i / 128`, `l = i % 32`, quarter `k = i % 128 / 32`.
#[test]
fn q6_k_hand_built_block() {
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for i in 0..256usize {
        let (n, k, l) = (i / 128, i % 128 / 32, i % 32);
        let q = (i % 64) as u8;
        let at = 64 * n + l + 32 * (k % 2);
        ql[at] |= (q & 15) << (4 * (k / 2));
        qh[32 * n + l] |= (q >> 4) << (2 * k);
    }
    let mut b = ql.to_vec();
    b.extend_from_slice(&qh);
    b.extend((0..16).map(|s| (s as i8 - 8) as u8));
    b.extend_from_slice(&f16_bytes(0.5));
    let mut out = [f32::NAN; 256];
    dequantize(DType::Q6_K, &b, &mut out);
    for (i, &w) in out.iter().enumerate() {
        let want = 0.5 * (i / 16) as f32 - 4.0;
        let want = want * ((i % 64) as f32 - 32.0);
        assert_eq!(w, want, "weight {i}");
    }
}

/// The SIMD backend's GEMM of several tokens decodes the weights into panels with its
/// own decoder, then runs the same `sgemm` as on F32 weights: on the Gemma 3 rows it must
/// equal its GEMM on the F32 copy of the reference values bit for bit, which holds only
/// if that decoder is bit-exact.
#[test]
fn gemma3_rows_simd_gemm_decodes_bitwise() {
    let s = Simd::new();
    for t in reference_data::load_gemma3_rows() {
        let (rows, cols, n) = (t.bytes.len(), t.row_len, 3);
        let (bytes, values) = (t.bytes.concat(), t.values.concat());
        let wq = Weights::new(t.dtype, rows, cols, &bytes).expect("stored rows");
        let wf = Weights::from_f32(rows, cols, &values).expect("f32 rows");
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 13.0)
            .collect();
        let (mut yq, mut yf) = (vec![f32::NAN; n * rows], vec![f32::NAN; n * rows]);
        s.gemm(&wq, &x, &mut yq).expect("shapes");
        s.gemm(&wf, &x, &mut yf).expect("shapes");
        assert_eq!(bits(&yq), bits(&yf), "{} ({:?})", t.tensor, s.path());
    }
}
