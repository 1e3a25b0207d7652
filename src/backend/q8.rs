//! 8-bit activations: llama.cpp's decode numerics for block-quantised weights.
//!
//! The f32 GEMV decodes every 4- or 8-bit weight to f32 and multiplies it by an f32
//! activation. llama.cpp instead quantises the activation vector too, to 8 bits per value
//! in blocks of 32 (its `Q8_0`/`Q8_1`), so that each weight block meets its activation
//! block in an integer dot product (`vpmaddubsw` on x86, `sdot`/`smull` on Arm) and
//! only one f32 multiply-add per block remains. It is faster and less accurate: the
//! activation rounding error is up to `amax/254` per value (about 0.4 % of the block's
//! largest magnitude), where the f32 path's is `2^-24` relative.
//!
//! kvcore offers it as an opt-in (`Llama::with_activations`, `--activations q8`).
//!
//! ## Quantisation of one block of 32 activations `x`
//! ```text
//! amax = max_j |x_j|,  d = amax / 127  (f32, rounded)
//! q_j  = round_ties_even(x_j · (1/d))  ∈ [-127, 127]   (1/d and the product each rounded)
//! s    = Σ_j q_j                                        (exact, i32)
//! ```
//! Special cases, so that nothing is silently lost and nothing is undefined:
//! - a block holding a NaN or an infinity gets `d = NaN`, `q = 0`, `s = 0`: every output
//!   of a GEMV that reads it is then NaN (the f32 path would give NaN or ±inf);
//! - a block whose `d` would be below `f32::MIN_POSITIVE` (all `|x| < 1.5e-36`,
//!   including all zeros) gets `d = 0`, `q = 0`: `1/d` would overflow.
//!
//! Rounding is to nearest, ties to even, which is what a SIMD float-to-int conversion
//! does (`vcvtps2dq`, `fcvtns`), so a vector quantiser gives the same bits as
//! [`Q8Acts::quantize`].
//!
//! ## The GEMV `y = W·x̂` (`x̂_j = d·q_j`)
//! For weight block `b` of a row (scale `d_w`, quants `w_j`) against activation block `b`
//! (scale `d_a`, quants `q_j`, sum `s`), with the integer dot `i = Σ_j w_j q_j` (exact:
//! `|i| ≤ 32·128·127 < 2^24`, so also exact as f32):
//! - `Q8_0`: `d_w·d_a·i`;
//! - `Q4_0` (`w_j ∈ 0..16`, value `d_w·(w_j − 8)`): `d_w·d_a·i + (−8·d_w)·(d_a·s)`;
//! - `Q4_1` (value `d_w·w_j + m`): `d_w·d_a·i + m·(d_a·s)`.
//!
//! [`gemv_reference`] sums these terms in f64 and rounds once, so it is the exact value
//! of the formula; a fast kernel sums them in f32 in its own order and is held to a
//! rounding bound by `tests/conformance.rs`. The plain formats (`F32`, `F16`, `BF16`)
//! have no integer path: [`gemv_reference`] refuses them, and the model keeps those
//! matrices on the f32 GEMV.

use super::{DType, QK, ShapeError, Weights};
use half::f16;

/// The largest quantised magnitude.
pub const Q8_MAX: f32 = 127.0;

/// A vector of activations quantised to 8 bits in blocks of [`QK`] = 32 (see the module
/// docs). Reused between calls: quantising into it only reallocates when it grows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Q8Acts {
    scales: Vec<f32>,
    sums: Vec<i32>,
    values: Vec<i8>,
    /// `[d, d·s]` per block (f32, `d·s` rounded once), interleaved: derived by
    /// [`fill`](Q8Acts::fill) for the kernels' block offset terms.
    pairs: Vec<f32>,
}

/// Whether `dtype` has an 8-bit-activation GEMV ([`gemv_reference`], `Backend::gemv_q8`).
pub fn supports(dtype: DType) -> bool {
    matches!(dtype, DType::Q8_0 | DType::Q4_0 | DType::Q4_1)
}

/// The buffers of a [`Q8Acts`] for a quantiser to fill: `(scales, sums, values)`
/// (see [`Q8Acts::fill`]).
pub type Q8Buffers<'a> = (&'a mut [f32], &'a mut [i32], &'a mut [i8]);

impl Q8Acts {
    /// An empty vector.
    pub fn new() -> Self {
        Q8Acts::default()
    }

    /// Quantises `x` with the reference quantiser: `Q8Acts::new()` then
    /// [`quantize`](Self::quantize).
    pub fn from_f32(x: &[f32]) -> Result<Self, ShapeError> {
        let mut q = Q8Acts::new();
        q.quantize(x)?;
        Ok(q)
    }

    /// Number of activations.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether it holds no activations.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Per-block scales `d`, `[len / 32]`.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Per-block sums `s = Σ q`, `[len / 32]`.
    pub fn sums(&self) -> &[i32] {
        &self.sums
    }

    /// The quantised values `q`, `[len]`.
    pub fn values(&self) -> &[i8] {
        &self.values
    }

    /// The value each activation now stands for, `d·q` (f32), for tests and reports.
    pub fn dequantize(&self) -> Vec<f32> {
        self.values
            .chunks_exact(QK)
            .zip(&self.scales)
            .flat_map(|(q, &d)| q.iter().map(move |&v| d * f32::from(v)))
            .collect()
    }

    /// Per block the pair `[d, d·s]` (`d·s` rounded to f32 once), interleaved,
    /// `[2·len/32]`: the factors of a `Q4_*` block's offset term, computed once per
    /// quantisation rather than once per matrix row.
    pub fn scale_pairs(&self) -> &[f32] {
        &self.pairs
    }

    /// Sizes the buffers for `len` activations, has `quantize` fill them —
    /// `(scales, sums, values)`, `[len/32]`, `[len/32]`, `[len]` — and derives
    /// [`scale_pairs`](Self::scale_pairs). A backend's own quantiser runs through this;
    /// it must fill every entry exactly as [`quantize`](Self::quantize) would.
    ///
    /// Errors when `len` is not a multiple of 32 (before calling `quantize`).
    pub fn fill(
        &mut self,
        len: usize,
        quantize: impl FnOnce(Q8Buffers<'_>),
    ) -> Result<(), ShapeError> {
        if !len.is_multiple_of(QK) {
            return Err(ShapeError::NotMultiple {
                what: "q8 activations",
                len,
                multiple: QK,
            });
        }
        self.scales.resize(len / QK, 0.0);
        self.sums.resize(len / QK, 0);
        self.values.resize(len, 0);
        quantize((&mut self.scales, &mut self.sums, &mut self.values));
        self.pairs.clear();
        self.pairs.extend(
            self.scales
                .iter()
                .zip(&self.sums)
                .flat_map(|(&d, &s)| [d, d * s as f32]),
        );
        Ok(())
    }

    /// The reference quantiser: every block of `x` as in the module docs.
    ///
    /// Errors when `x.len()` is not a multiple of 32.
    pub fn quantize(&mut self, x: &[f32]) -> Result<(), ShapeError> {
        self.fill(x.len(), |(scales, sums, values)| {
            for (((xb, qb), d), s) in x
                .chunks_exact(QK)
                .zip(values.chunks_exact_mut(QK))
                .zip(scales.iter_mut())
                .zip(sums.iter_mut())
            {
                (*d, *s) = quantize_block(xb, qb);
            }
        })
    }
}

/// Quantises one block `x: [32]` into `q`, returning `(d, s)` (see the module docs).
pub fn quantize_block(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    let finite = x.iter().all(|v| v.is_finite());
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / Q8_MAX;
    if !finite || d < f32::MIN_POSITIVE {
        q.fill(0);
        return (if finite { 0.0 } else { f32::NAN }, 0);
    }
    let id = 1.0 / d;
    let mut s = 0;
    for (qj, &xj) in q.iter_mut().zip(x) {
        // |x·id| ≤ 127·(1 + 3u) < 127.5, so the cast neither saturates nor wraps.
        *qj = (xj * id).round_ties_even() as i8;
        s += i32::from(*qj);
    }
    (d, s)
}

/// The f16 at `b[at..at + 2]`, widened.
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// One stored weight block, decoded to `(d_w, m, quants)` with `m` the per-block offset
/// coefficient (`0`, `−8·d_w` or the stored `m`) and quants as integers.
fn decode_block(dtype: DType, b: &[u8]) -> (f32, f64, [i32; QK]) {
    let d = f16_at(b, 0);
    let mut w = [0i32; QK];
    match dtype {
        DType::Q8_0 => {
            for (wj, &byte) in w.iter_mut().zip(&b[2..34]) {
                *wj = i32::from(byte as i8);
            }
            (d, 0.0, w)
        }
        DType::Q4_0 | DType::Q4_1 => {
            let (qs, m) = if dtype == DType::Q4_0 {
                (&b[2..18], -8.0 * f64::from(d))
            } else {
                (&b[4..20], f64::from(f16_at(b, 2)))
            };
            for (j, &byte) in qs.iter().enumerate() {
                w[j] = i32::from(byte & 15);
                w[j + 16] = i32::from(byte >> 4);
            }
            (d, m, w)
        }
        _ => unreachable!("checked by the caller"),
    }
}

/// Each block's term of row `r` as f64, `d_w·d_a·i + m·d_a·s`, with its magnitude
/// `|d_w·d_a|·Σ|w_j q_j| + |m·d_a·s|` (for error bounds). Shapes as [`gemv_reference`].
pub fn row_terms(w: &Weights<'_>, r: usize, x: &Q8Acts) -> impl Iterator<Item = (f64, f64)> {
    let dtype = w.dtype();
    w.row(r)
        .chunks_exact(dtype.block_bytes())
        .enumerate()
        .map(move |(b, bytes)| {
            let (dw, m, wq) = decode_block(dtype, bytes);
            let qa = &x.values[b * QK..(b + 1) * QK];
            let da = f64::from(x.scales[b]);
            let (mut i, mut abs) = (0i64, 0i64);
            for (&wj, &qj) in wq.iter().zip(qa) {
                let p = i64::from(wj) * i64::from(qj);
                i += p;
                abs += p.abs();
            }
            let scale = f64::from(dw) * da;
            let offset = m * da * f64::from(x.sums[b]);
            (
                scale * i as f64 + offset,
                scale.abs() * abs as f64 + offset.abs(),
            )
        })
}

/// The reference GEMV with 8-bit activations: `y_r ← Σ_b term_b` (module docs), summed in
/// f64 and rounded once to f32.
///
/// Errors (before writing `y`) for a plain-format `w` or mismatched lengths.
pub fn gemv_reference(w: &Weights<'_>, x: &Q8Acts, y: &mut [f32]) -> Result<(), ShapeError> {
    super::check::gemv_q8(w, x, y)?;
    for (r, yr) in y.iter_mut().enumerate() {
        *yr = row_terms(w, r, x).map(|(t, _)| t).sum::<f64>() as f32;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_block_rounds_to_nearest_even_and_sums() {
        // amax = 127 → d = 1, id = 1: q is x rounded, ties to even.
        let mut x = [0.0f32; QK];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        x[3] = 0.49;
        x[4] = -127.0;
        let mut q = [0i8; QK];
        let (d, s) = quantize_block(&x, &mut q);
        assert_eq!(d, 1.0);
        assert_eq!(&q[..5], &[127, 2, -4, 0, -127]);
        assert_eq!(s, 127 + 2 - 4 - 127);
    }

    #[test]
    fn quantize_error_is_within_half_a_step() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let q = Q8Acts::from_f32(&x).unwrap();
        let back = q.dequantize();
        for (b, (xb, yb)) in x.chunks(QK).zip(back.chunks(QK)).enumerate() {
            let d = q.scales()[b];
            for (a, c) in xb.iter().zip(yb) {
                assert!(
                    (a - c).abs() <= 0.5 * d * (1.0 + 1e-6),
                    "{a} vs {c}, d = {d}"
                );
            }
            let s: i32 = q.values()[b * QK..(b + 1) * QK]
                .iter()
                .map(|&v| i32::from(v))
                .sum();
            assert_eq!(q.sums()[b], s);
        }
    }

    #[test]
    fn special_blocks() {
        let mut x = vec![1.0f32; 3 * QK];
        x[5] = f32::NAN;
        x[QK + 7] = f32::INFINITY;
        for v in &mut x[2 * QK..] {
            *v = 1e-37;
        }
        let q = Q8Acts::from_f32(&x).unwrap();
        assert!(q.scales()[0].is_nan() && q.scales()[1].is_nan());
        assert_eq!(q.scales()[2], 0.0);
        assert!(q.values().iter().all(|&v| v == 0));
        assert_eq!(q.sums(), &[0, 0, 0]);
    }

    #[test]
    fn lengths_are_checked() {
        assert!(matches!(
            Q8Acts::from_f32(&[1.0; 33]),
            Err(ShapeError::NotMultiple { len: 33, .. })
        ));
        let bytes = vec![0u8; 4 * 64];
        let w = Weights::new(DType::F32, 1, 64, &bytes).unwrap();
        let x = Q8Acts::from_f32(&[1.0; 64]).unwrap();
        assert!(matches!(
            gemv_reference(&w, &x, &mut [0.0]),
            Err(ShapeError::Unsupported { .. })
        ));
        let bytes = vec![0u8; 2 * 20];
        let w = Weights::new(DType::Q4_1, 1, 64, &bytes).unwrap();
        assert!(gemv_reference(&w, &x, &mut [0.0; 2]).is_err());
        let x32 = Q8Acts::from_f32(&[1.0; 32]).unwrap();
        assert!(gemv_reference(&w, &x32, &mut [0.0]).is_err());
        assert!(gemv_reference(&w, &x, &mut [0.0]).is_ok());
    }

    #[test]
    fn gemv_reference_matches_dequantised_dot() {
        // One Q4_1 row: d = 0.5, m = -1, nibbles j % 16; activations exact in q8.
        let mut row = Vec::new();
        for _ in 0..2 {
            row.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
            row.extend_from_slice(&f16::from_f32(-1.0).to_le_bytes());
            row.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        }
        let w = Weights::new(DType::Q4_1, 1, 64, &row).unwrap();
        let x: Vec<f32> = (0..64).map(|j| (j as f32 - 30.0) * 2.0).collect();
        let q = Q8Acts::from_f32(&x).unwrap();
        let xd = q.dequantize();
        let mut expect = 0.0f64;
        for (b, chunk) in row.chunks(20).enumerate() {
            for j in 0..32 {
                let nib = if j < 16 {
                    chunk[4 + j] & 15
                } else {
                    chunk[4 + j - 16] >> 4
                };
                let wv = 0.5 * f64::from(nib) - 1.0;
                expect += wv * f64::from(xd[b * 32 + j]);
            }
        }
        let mut y = [0.0f32];
        gemv_reference(&w, &q, &mut y).unwrap();
        assert!((f64::from(y[0]) - expect).abs() <= 1e-6 * expect.abs().max(1.0));
    }
}
