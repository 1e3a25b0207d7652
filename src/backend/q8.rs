//! 8-bit activations: llama.cpp's decode numerics for block-quantised weights.
//!
//! The f32 GEMV decodes every 4- to 8-bit weight to f32 and multiplies it by an f32
//! activation. llama.cpp instead quantises the activation vector too, to 8 bits per value,
//! so that each weight block meets its activation block in an integer dot product
//! (`vpmaddubsw` on x86, `smull` on Arm) and only one or two f32 multiply-adds per block
//! remain. It is faster and less accurate: the activation rounding error is up to half a
//! step, `amax/254` per value (about 0.4 % of the block's largest magnitude), where the
//! f32 path's is `2^-24` relative.
//!
//! kvcore offers it as an opt-in (`Llama::with_activations`, `--activations q8`).
//!
//! ## Two activation layouts ([`Q8Layout`])
//! Each weight format meets the activation layout whose block it divides
//! ([`Q8Layout::of`], llama.cpp's `vec_dot_type`):
//!
//! | layout | block | sums `s` over | weight formats |
//! |--------|-------|---------------|----------------|
//! | `Q8_0` | [`QK`] = 32 | the block (32) | `Q8_0`, `Q4_0`, `Q4_1`, `Q5_0` |
//! | `Q8_K` | [`QK_K`] = 256 | each [`Q8K_SUM`] = 16 values (llama.cpp's `bsums`) | `Q4_K`, `Q6_K` |
//!
//! The geometry is stated here once ([`Q8Layout::block_len`], [`Q8Layout::sum_len`]);
//! the quantisers, the reference GEMV and the kernels take it from there.
//!
//! ## Quantisation of one block `x`
//! `Q8_0` (llama.cpp's `quantize_row_q8_0`, with ties to even):
//! ```text
//! amax = max_j |x_j|,  d = amax / 127  (f32, rounded)
//! q_j  = round_ties_even(x_j · (1/d))  ∈ [-127, 127]   (1/d and the product each rounded)
//! ```
//! `Q8_K` (llama.cpp's `quantize_row_q8_K_ref`):
//! ```text
//! max  = the first x_j of largest |x_j| (signed)
//! iscale = −127 / max,  q_j = min(127, round_ties_even(iscale · x_j)),  d = 1 / iscale
//! ```
//! (`d` is negative when `max` is positive; `d·q_j` has the sign of `x_j` either way.) In
//! both, `s = Σ q_j` over each sum group, exact in i32.
//!
//! Special cases, so that nothing is silently lost and nothing is undefined:
//! - a block holding a NaN or an infinity gets `d = NaN`, `q = 0`, `s = 0`: every output
//!   of a GEMV that reads it is then NaN (the f32 path would give NaN or ±inf);
//! - a block with `amax / 127 < f32::MIN_POSITIVE` (all `|x| < 1.5e-36`, including all
//!   zeros) gets `d = 0`, `q = 0`: `1/d` or `iscale` would overflow.
//!
//! Rounding is to nearest, ties to even, which is what a SIMD float-to-int conversion
//! does (`vcvtps2dq`, `fcvtns`) and what llama.cpp's `nearest_int` does, so a vector
//! quantiser gives the same bits as [`Q8Acts::quantize`].
//!
//! ## The GEMV `y = W·x̂` (`x̂_j = d·q_j`)
//! For weight block `b` of a row against activation block `b` (scale `d_a`, quants `q_j`,
//! sums `s`), with exact integer dot products:
//! - `Q8_0` (scale `d_w`, quants `w_j`), `i = Σ_j w_j q_j`: `d_w·d_a·i`;
//! - `Q4_0` (`w_j ∈ 0..16`, value `d_w·(w_j − 8)`): `d_w·d_a·i + (−8·d_w)·(d_a·s)`;
//! - `Q4_1` (value `d_w·w_j + m`): `d_w·d_a·i + m·(d_a·s)`;
//! - `Q5_0` (`w_j ∈ 0..32`, value `d_w·(w_j − 16)`): `d_w·d_a·i + (−16·d_w)·(d_a·s)`
//!   (llama.cpp's `ggml_vec_dot_q5_0_q8_0`);
//! - `Q4_K` (`d`, `dmin`, sub-block `t` of 32 with 6-bit `(sc_t, m_t)`, value
//!   `d·sc_t·w − dmin·m_t`; llama.cpp's `ggml_vec_dot_q4_K_q8_K`):
//!   `d·d_a·Σ_t sc_t·i_t − dmin·d_a·Σ_t m_t·(s_2t + s_2t+1)`, `i_t` the sub-block's dot,
//!   the minimums through the sums of 16;
//! - `Q6_K` (`d`, sub-block `t` of 16 with scale `sc_t`, value `d·sc_t·(w − 32)`;
//!   `ggml_vec_dot_q6_K_q8_K`): `d·d_a·Σ_t sc_t·Σ_{j∈t} (w_j − 32)·q_j`.
//!
//! [`gemv_reference`] sums these terms in f64 and rounds once, so it is the exact value
//! of the formula; a fast kernel sums them in f32 in its own order and is held to a
//! rounding bound by `tests/conformance.rs`. The plain formats (`F32`, `F16`, `BF16`)
//! have no integer path: [`gemv_reference`] refuses them, and the model keeps those
//! matrices on the f32 GEMV.

use super::format::q8_term;
use super::{DType, QK, QK_K, ShapeError, Weights};

/// The largest quantised magnitude.
pub const Q8_MAX: f32 = 127.0;

/// Values per sum of the `Q8_K` layout (llama.cpp's `bsums`): `Q6_K`'s sub-block.
pub const Q8K_SUM: usize = 16;

/// The block layout of a vector of 8-bit activations (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types, reason = "the ggml names of the formats")]
pub enum Q8Layout {
    /// Blocks of 32 with one sum each: the legacy formats' partner.
    #[default]
    Q8_0,
    /// Blocks of 256 with a sum per 16: the K formats' partner.
    Q8_K,
}

impl Q8Layout {
    /// Values per block (one scale each).
    pub const fn block_len(self) -> usize {
        match self {
            Q8Layout::Q8_0 => QK,
            Q8Layout::Q8_K => QK_K,
        }
    }

    /// Values per sum `s`.
    pub const fn sum_len(self) -> usize {
        match self {
            Q8Layout::Q8_0 => QK,
            Q8Layout::Q8_K => Q8K_SUM,
        }
    }

    /// The layout `dtype`'s blocks meet in [`gemv_reference`], or `None` for a format
    /// without an integer path (the plain formats).
    pub const fn of(dtype: DType) -> Option<Q8Layout> {
        match q8_term(dtype) {
            Some((layout, _)) => Some(layout),
            None => None,
        }
    }
}

/// A vector of activations quantised to 8 bits in one [`Q8Layout`] (see the module
/// docs). Reused between calls: quantising into it only reallocates when it grows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Q8Acts {
    layout: Q8Layout,
    scales: Vec<f32>,
    sums: Vec<i32>,
    values: Vec<i8>,
    /// `Q8_0` only: `[d, d·s]` per block (f32, `d·s` rounded once), interleaved: derived
    /// by [`fill`](Q8Acts::fill) for the kernels' block offset terms.
    pairs: Vec<f32>,
}

/// One block of a [`Q8Acts`]: what a weight block meets in
/// [`QuantFormat::dot_q8`](super::format::QuantFormat::dot_q8).
#[derive(Clone, Copy, Debug)]
pub struct Q8Block<'a> {
    /// The scale `d_a`.
    pub d: f32,
    /// The quants, `[block_len]`.
    pub values: &'a [i8],
    /// Their sums, `[block_len / sum_len]`.
    pub sums: &'a [i32],
}

/// Whether `dtype` has an 8-bit-activation GEMV ([`gemv_reference`], `Backend::gemv_q8`).
pub fn supports(dtype: DType) -> bool {
    Q8Layout::of(dtype).is_some()
}

/// The buffers of a [`Q8Acts`] for a quantiser to fill: `(scales, sums, values)`
/// (see [`Q8Acts::fill`]).
pub type Q8Buffers<'a> = (&'a mut [f32], &'a mut [i32], &'a mut [i8]);

impl Q8Acts {
    /// An empty vector.
    pub fn new() -> Self {
        Q8Acts::default()
    }

    /// Quantises `x` in `layout` with the reference quantiser: `Q8Acts::new()` then
    /// [`quantize`](Self::quantize).
    pub fn from_f32(layout: Q8Layout, x: &[f32]) -> Result<Self, ShapeError> {
        let mut q = Q8Acts::new();
        q.quantize(layout, x)?;
        Ok(q)
    }

    /// The block layout.
    pub fn layout(&self) -> Q8Layout {
        self.layout
    }

    /// Number of activations.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether it holds no activations.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Per-block scales `d`, `[len / block_len]`.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// The sums `s = Σ q`, one per [`Q8Layout::sum_len`] values, `[len / sum_len]`.
    pub fn sums(&self) -> &[i32] {
        &self.sums
    }

    /// The quantised values `q`, `[len]`.
    pub fn values(&self) -> &[i8] {
        &self.values
    }

    /// Block `b`.
    ///
    /// # Panics
    /// If `b` is not a block of the vector.
    pub fn block(&self, b: usize) -> Q8Block<'_> {
        let (block, sum) = (self.layout.block_len(), self.layout.sum_len());
        Q8Block {
            d: self.scales[b],
            values: &self.values[b * block..(b + 1) * block],
            sums: &self.sums[b * block / sum..(b + 1) * block / sum],
        }
    }

    /// The value each activation now stands for, `d·q` (f32), for tests and reports.
    pub fn dequantize(&self) -> Vec<f32> {
        self.values
            .chunks_exact(self.layout.block_len())
            .zip(&self.scales)
            .flat_map(|(q, &d)| q.iter().map(move |&v| d * f32::from(v)))
            .collect()
    }

    /// `Q8_0`: per block the pair `[d, d·s]` (`d·s` rounded to f32 once), interleaved,
    /// `[2·len/32]`: the factors of a block's offset term, computed once per quantisation
    /// rather than once per matrix row. Empty for `Q8_K`.
    pub fn scale_pairs(&self) -> &[f32] {
        &self.pairs
    }

    /// Sizes the buffers for `len` activations in `layout`, has `quantize` fill them —
    /// `(scales, sums, values)`, `[len/block_len]`, `[len/sum_len]`, `[len]` — and
    /// derives [`scale_pairs`](Self::scale_pairs). A backend's own quantiser runs through
    /// this; it must fill every entry exactly as [`quantize`](Self::quantize) would.
    ///
    /// Errors when `len` is not a multiple of the layout's block (before calling
    /// `quantize`).
    pub fn fill(
        &mut self,
        layout: Q8Layout,
        len: usize,
        quantize: impl FnOnce(Q8Buffers<'_>),
    ) -> Result<(), ShapeError> {
        let block = layout.block_len();
        if !len.is_multiple_of(block) {
            return Err(ShapeError::NotMultiple {
                what: "q8 activations",
                len,
                multiple: block,
            });
        }
        self.layout = layout;
        self.scales.resize(len / block, 0.0);
        self.sums.resize(len / layout.sum_len(), 0);
        self.values.resize(len, 0);
        quantize((&mut self.scales, &mut self.sums, &mut self.values));
        self.pairs.clear();
        if layout == Q8Layout::Q8_0 {
            self.pairs.extend(
                self.scales
                    .iter()
                    .zip(&self.sums)
                    .flat_map(|(&d, &s)| [d, d * s as f32]),
            );
        }
        Ok(())
    }

    /// The reference quantiser: every block of `x` as in the module docs.
    ///
    /// Errors when `x.len()` is not a multiple of the layout's block.
    pub fn quantize(&mut self, layout: Q8Layout, x: &[f32]) -> Result<(), ShapeError> {
        let (block, per) = (layout.block_len(), layout.block_len() / layout.sum_len());
        self.fill(layout, x.len(), |(scales, sums, values)| {
            for (((xb, qb), d), s) in x
                .chunks_exact(block)
                .zip(values.chunks_exact_mut(block))
                .zip(scales.iter_mut())
                .zip(sums.chunks_exact_mut(per))
            {
                *d = match layout {
                    Q8Layout::Q8_0 => quantize_block(xb, qb),
                    Q8Layout::Q8_K => quantize_block_k(xb, qb),
                };
                for (sj, qj) in s.iter_mut().zip(qb.chunks_exact(layout.sum_len())) {
                    *sj = qj.iter().map(|&v| i32::from(v)).sum();
                }
            }
        })
    }
}

/// The scale of a block that takes a special case (module docs): `Some(NaN)` for a
/// non-finite block, `Some(0)` for a tiny one, else `None`; with its `amax`.
fn special_scale(x: &[f32]) -> (Option<f32>, f32) {
    let finite = x.iter().all(|v| v.is_finite());
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let special = if !finite {
        Some(f32::NAN)
    } else if amax / Q8_MAX < f32::MIN_POSITIVE {
        Some(0.0)
    } else {
        None
    };
    (special, amax)
}

/// Quantises one `Q8_0` block `x: [32]` into `q`, returning `d` (see the module docs).
pub fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    let (special, amax) = special_scale(x);
    if let Some(d) = special {
        q.fill(0);
        return d;
    }
    let d = amax / Q8_MAX;
    let id = 1.0 / d;
    for (qj, &xj) in q.iter_mut().zip(x) {
        // |x·id| ≤ 127·(1 + 3u) < 127.5, so the cast neither saturates nor wraps.
        *qj = (xj * id).round_ties_even() as i8;
    }
    d
}

/// Quantises one `Q8_K` block `x: [256]` into `q`, returning `d` (see the module docs).
pub fn quantize_block_k(x: &[f32], q: &mut [i8]) -> f32 {
    let (special, amax) = special_scale(x);
    if let Some(d) = special {
        q.fill(0);
        return d;
    }
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
    let iscale = -Q8_MAX / max;
    for (qj, &xj) in q.iter_mut().zip(x) {
        // |iscale·x| ≤ 127·(1 + 2u) < 127.5: the result is in -127..=127 before the
        // clamp, which llama.cpp keeps and so do we.
        *qj = ((iscale * xj).round_ties_even() as i32).min(127) as i8;
    }
    1.0 / iscale
}

/// Each block's term of row `r` as f64 (module docs), with its magnitude (the same sum
/// with every integer product and offset taken by absolute value, for error bounds).
/// Shapes as [`gemv_reference`].
pub fn row_terms<'a>(
    w: &Weights<'a>,
    r: usize,
    x: &'a Q8Acts,
) -> impl Iterator<Item = (f64, f64)> + 'a {
    let dtype = w.dtype();
    let (_, term) = q8_term(dtype).expect("a format with an 8-bit path (checked by the caller)");
    w.row(r)
        .chunks_exact(dtype.block_bytes())
        .enumerate()
        .map(move |(b, bytes)| term(bytes, x.block(b)))
}

/// A legacy block's term `d_w·d_a·i + m·(d_a·s)` (module docs) and its magnitude, for
/// the weight scale `d_w`, the offset coefficient `m` and the integer quants `w`.
pub(crate) fn legacy_term(d_w: f32, m: f64, w: &[i32; QK], acts: Q8Block<'_>) -> (f64, f64) {
    let (i, abs) = int_dot(w, acts.values);
    let da = f64::from(acts.d);
    let scale = f64::from(d_w) * da;
    let offset = m * da * f64::from(acts.sums[0]);
    (
        scale * i as f64 + offset,
        scale.abs() * abs as f64 + offset.abs(),
    )
}

/// A K super-block's term `d·d_a·Σ_t sc_t·i_t − dmin·d_a·Σ_t m_t·s_t` (module docs) and
/// its magnitude, for the integer quants `w` and per sub-block of
/// `QK_K / scales.len()` weights the `(scale, min)` integers.
pub(crate) fn k_term(
    d: f32,
    dmin: f32,
    w: &[i32; QK_K],
    scales: &[(i32, i32)],
    acts: Q8Block<'_>,
) -> (f64, f64) {
    let sub = QK_K / scales.len();
    let (mut i, mut abs, mut mins, mut mins_abs) = (0i64, 0i64, 0i64, 0i64);
    for (t, &(sc, m)) in scales.iter().enumerate() {
        let range = t * sub..(t + 1) * sub;
        let (it, at) = int_dot(&w[range.clone()], &acts.values[range]);
        i += i64::from(sc) * it;
        abs += i64::from(sc).abs() * at;
        let s: i64 = acts.sums[t * sub / Q8K_SUM..(t + 1) * sub / Q8K_SUM]
            .iter()
            .map(|&s| i64::from(s))
            .sum();
        mins += i64::from(m) * s;
        mins_abs += (i64::from(m) * s).abs();
    }
    let da = f64::from(acts.d);
    let (scale, min_scale) = (f64::from(d) * da, f64::from(dmin) * da);
    (
        scale * i as f64 - min_scale * mins as f64,
        scale.abs() * abs as f64 + min_scale.abs() * mins_abs as f64,
    )
}

/// `(Σ_j w_j q_j, Σ_j |w_j q_j|)`, exact.
fn int_dot(w: &[i32], q: &[i8]) -> (i64, i64) {
    w.iter().zip(q).fold((0, 0), |(i, a), (&wj, &qj)| {
        let p = i64::from(wj) * i64::from(qj);
        (i + p, a + p.abs())
    })
}

/// The reference GEMV with 8-bit activations: `y_r ← Σ_b term_b` (module docs), summed in
/// f64 and rounded once to f32.
///
/// Errors (before writing `y`) for a plain-format `w`, activations in the other layout
/// or mismatched lengths.
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
    use half::f16;

    #[test]
    fn quantize_block_rounds_to_nearest_even_and_sums() {
        // amax = 127 → d = 1, id = 1: q is x rounded, ties to even.
        let mut x = [0.0f32; QK];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        x[3] = 0.49;
        x[4] = -127.0;
        let q = Q8Acts::from_f32(Q8Layout::Q8_0, &x).unwrap();
        assert_eq!(q.scales(), &[1.0]);
        assert_eq!(&q.values()[..5], &[127, 2, -4, 0, -127]);
        assert_eq!(q.sums(), &[127 + 2 - 4 - 127]);
    }

    #[test]
    fn quantize_error_is_within_half_a_step() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let q = Q8Acts::from_f32(Q8Layout::Q8_0, &x).unwrap();
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
    fn q8_k_takes_the_signed_maximum_and_sums_per_16() {
        // The first value of largest magnitude is +2: iscale = -63.5, d = -1/63.5.
        let mut x = vec![0.0f32; QK_K];
        x[3] = 2.0;
        x[7] = -2.0;
        x[20] = 1.0;
        x[21] = -0.5;
        let q = Q8Acts::from_f32(Q8Layout::Q8_K, &x).unwrap();
        assert_eq!(q.scales(), &[1.0 / (-127.0f32 / 2.0)]);
        assert_eq!(q.values()[3], -127);
        assert_eq!(q.values()[7], 127);
        // 63.5 → 64 and -31.75 → -32 (to nearest); the sums are per 16 values.
        assert_eq!((q.values()[20], q.values()[21]), (-64, 32));
        assert_eq!(q.sums().len(), QK_K / Q8K_SUM);
        assert_eq!(&q.sums()[..2], &[0, -32]);
        let back = q.dequantize();
        assert!((back[3] - 2.0).abs() < 1e-6 && (back[21] + 0.5).abs() < 0.01);
        assert!(Q8Acts::from_f32(Q8Layout::Q8_K, &[1.0; 32]).is_err());
    }

    #[test]
    fn special_blocks() {
        let mut x = vec![1.0f32; 3 * QK];
        x[5] = f32::NAN;
        x[QK + 7] = f32::INFINITY;
        for v in &mut x[2 * QK..] {
            *v = 1e-37;
        }
        let q = Q8Acts::from_f32(Q8Layout::Q8_0, &x).unwrap();
        assert!(q.scales()[0].is_nan() && q.scales()[1].is_nan());
        assert_eq!(q.scales()[2], 0.0);
        assert!(q.values().iter().all(|&v| v == 0));
        assert_eq!(q.sums(), &[0, 0, 0]);
        let mut k = vec![1e-37f32; 2 * QK_K];
        k[QK_K + 9] = f32::NEG_INFINITY;
        let q = Q8Acts::from_f32(Q8Layout::Q8_K, &k).unwrap();
        assert_eq!(q.scales()[0], 0.0);
        assert!(q.scales()[1].is_nan());
        assert!(q.values().iter().all(|&v| v == 0) && q.sums().iter().all(|&s| s == 0));
    }

    #[test]
    fn lengths_are_checked() {
        assert!(matches!(
            Q8Acts::from_f32(Q8Layout::Q8_0, &[1.0; 33]),
            Err(ShapeError::NotMultiple { len: 33, .. })
        ));
        let bytes = vec![0u8; 4 * 64];
        let w = Weights::new(DType::F32, 1, 64, &bytes).unwrap();
        let x = Q8Acts::from_f32(Q8Layout::Q8_0, &[1.0; 64]).unwrap();
        assert!(matches!(
            gemv_reference(&w, &x, &mut [0.0]),
            Err(ShapeError::Unsupported { .. })
        ));
        let bytes = vec![0u8; 2 * 20];
        let w = Weights::new(DType::Q4_1, 1, 64, &bytes).unwrap();
        assert!(gemv_reference(&w, &x, &mut [0.0; 2]).is_err());
        let x32 = Q8Acts::from_f32(Q8Layout::Q8_0, &[1.0; 32]).unwrap();
        assert!(gemv_reference(&w, &x32, &mut [0.0]).is_err());
        assert!(gemv_reference(&w, &x, &mut [0.0]).is_ok());
        // Activations in the layout the format does not meet.
        let bytes = vec![0u8; DType::Q4_K.block_bytes()];
        let wk = Weights::new(DType::Q4_K, 1, QK_K, &bytes).unwrap();
        let x0 = Q8Acts::from_f32(Q8Layout::Q8_0, &[1.0; QK_K]).unwrap();
        assert!(matches!(
            gemv_reference(&wk, &x0, &mut [0.0]),
            Err(ShapeError::Unsupported { .. })
        ));
        let xk = Q8Acts::from_f32(Q8Layout::Q8_K, &[1.0; QK_K]).unwrap();
        assert!(gemv_reference(&wk, &xk, &mut [0.0]).is_ok());
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
        let q = Q8Acts::from_f32(Q8Layout::Q8_0, &x).unwrap();
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
