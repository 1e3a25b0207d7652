//! The reference quantisers of every [`DType`], byte-compatible with the `gguf` Python
//! package (gguf-py `quants.py`), and the decoders they pair with.
//!
//! Each format's layout and reference decode are its type's in
//! [`kvcore::backend::format`]; [`dequantize`] runs that decoder over a row (bit for bit
//! gguf-py's numpy dequantiser: every product and sum rounded to f32 separately, never
//! fused), and [`quantize_row`] encodes one.
//!
//! Encoding of the legacy formats reproduces gguf-py's numpy quantisers, including their
//! exact order of operations and intermediate precisions (see each `quantize_*`
//! function); the results are checked byte for byte against
//! `shared/reference/quant-blocks.json` (which has no `Q5_0` vectors). gguf-py has no
//! K-format encoder; the ones here are simple round-to-nearest quantisers (no search
//! for the best scales, unlike llama.cpp's), for test data only.

use half::f16;
use kvcore::backend::format::decode_row;
use kvcore::backend::{DType, QK, QK_K, ShapeError, Weights};

/// Decode row `r` of `w` into `out`.
///
/// `out: [w.cols()]`, f32. Bit-exact with gguf-py's dequantiser (see the module docs).
///
/// # Panics
/// If `r >= w.rows()` or `out.len() != w.cols()` (programming errors).
pub fn dequantize_row(w: &Weights<'_>, r: usize, out: &mut [f32]) {
    assert_eq!(out.len(), w.cols(), "dequantize_row: out must hold one row");
    dequantize(w.dtype(), w.row(r), out);
}

/// Decode the stored bytes of `out.len()` consecutive weights of `dtype` into `out`.
///
/// `bytes` must be exactly `dtype.row_bytes(out.len())` long: whole blocks, starting at a
/// block boundary.
///
/// # Panics
/// If `out.len()` is not a whole number of blocks or `bytes` has the wrong length
/// (programming errors).
pub fn dequantize(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    let expected = dtype.row_bytes(out.len());
    assert_eq!(
        Some(bytes.len()),
        expected,
        "dequantize: {} bytes do not hold {} {dtype} weights",
        bytes.len(),
        out.len()
    );
    decode_row(dtype, bytes, out);
}

/// The 6-bit `(scale, min)` of a `Q4_K` sub-block; defined beside the format in
/// `kvcore::backend` and re-exported here for the decoders that import it from this crate.
pub use kvcore::backend::q4_k_scale_min;

/// The formats this crate implements: every [`DType`] (its kernels are written over
/// [`kvcore::backend::format`]'s types). The backends check a weight's format at their
/// entry points ([`check_format`]), so a kernel written for fewer never sees another.
pub const FORMATS: [DType; DType::ALL.len()] = DType::ALL;

/// [`ShapeError::Unsupported`] for a weight format outside [`FORMATS`] (a format a newer
/// `kvcore` defines that this backend does not implement yet).
pub fn check_format(what: &'static str, dtype: DType) -> Result<(), ShapeError> {
    if FORMATS.contains(&dtype) {
        Ok(())
    } else {
        Err(ShapeError::Unsupported { what, dtype })
    }
}

/// A decoder reached with a format outside [`FORMATS`]: the callers' entry-point check
/// rules it out.
#[track_caller]
pub fn unsupported(dtype: DType) -> ! {
    panic!("{dtype} is not a format this backend implements (checked at its entry points)")
}

/// Encode `values` as `dtype`, exactly as gguf-py's `quants.quantize` does.
///
/// Returns `dtype.row_bytes(values.len())` bytes. Per format:
/// - `F32`: the little-endian bytes.
/// - `F16`: round to nearest, ties to even (numpy `astype(float16)`).
/// - `BF16`: ggml's `fp32_to_bf16`: NaN forced quiet, otherwise round to nearest even on
///   the bit pattern.
/// - `Q8_0`: `d = max|x| / 127`, `q = round(x · (1/d))` with ties away from zero
///   (gguf-py's `np_roundf`), `1/d` taken as 0 when `d = 0`.
/// - `Q4_0`: `d = x_max / −8` where `x_max` is the first element of largest magnitude
///   (keeping its sign); `q = trunc(f32(f64(x)·f64(1/d) + 8.5))` clipped to `0..=15`.
/// - `Q4_1`: `d = (max − min) / 15`, `m = min`, `q = trunc((x − min)·(1/d) + 0.5)` in f32,
///   clipped to `0..=15`.
/// - `Q5_0`: `Q4_0`'s rule with 16 levels a side: `d = x_max / −16`,
///   `q = trunc(f32(f64(x)·f64(1/d) + 16.5))` clipped to `0..=31`.
/// - `Q4_K`, `Q6_K`: see `quantize_q4_k` and `quantize_q6_k` below (not gguf-py's, which
///   has no K encoder).
///
/// The scales are computed in f32 and rounded to f16 (ties to even) only when stored.
///
/// # Panics
/// If `values.len()` is not a whole number of `dtype` blocks or `dtype` is not in
/// [`FORMATS`] (programming errors).
pub fn quantize_row(dtype: DType, values: &[f32]) -> Vec<u8> {
    let n_bytes = dtype.row_bytes(values.len()).unwrap_or_else(|| {
        panic!(
            "quantize_row: {} values are not whole {dtype} blocks",
            values.len()
        )
    });
    let mut out = Vec::with_capacity(n_bytes);
    match dtype {
        DType::F32 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::F16 => values
            .iter()
            .for_each(|&v| out.extend_from_slice(&f16::from_f32(v).to_le_bytes())),
        DType::BF16 => values
            .iter()
            .for_each(|&v| out.extend_from_slice(&f32_to_bf16(v).to_le_bytes())),
        DType::Q8_0 => values
            .chunks_exact(QK)
            .for_each(|b| quantize_q8_0(b, &mut out)),
        DType::Q4_0 => values
            .chunks_exact(QK)
            .for_each(|b| quantize_q4_0(b, &mut out)),
        DType::Q4_1 => values
            .chunks_exact(QK)
            .for_each(|b| quantize_q4_1(b, &mut out)),
        DType::Q5_0 => values
            .chunks_exact(QK)
            .for_each(|b| quantize_q5_0(b, &mut out)),
        DType::Q4_K => values
            .chunks_exact(QK_K)
            .for_each(|b| quantize_q4_k(b, &mut out)),
        DType::Q6_K => values
            .chunks_exact(QK_K)
            .for_each(|b| quantize_q6_k(b, &mut out)),
        other => unsupported(other),
    }
    debug_assert_eq!(out.len(), n_bytes);
    out
}

/// ggml's `fp32_to_bf16`: NaN is forced quiet (keeping sign and top payload bits),
/// everything else is rounded to nearest, ties to even, on the bit pattern (finite values
/// past the bf16 range round to infinity).
fn f32_to_bf16(v: f32) -> u16 {
    let n = v.to_bits();
    if n & 0x7fff_ffff > 0x7f80_0000 {
        return ((n >> 16) | 0x40) as u16;
    }
    ((u64::from(n) + 0x7fff + u64::from((n >> 16) & 1)) >> 16) as u16
}

/// The reciprocal of a block scale, or 0 for a zero scale (numpy's
/// `np.where(d == 0, 0, 1 / d)`), in f32.
fn inverse(d: f32) -> f32 {
    if d == 0.0 { 0.0 } else { 1.0 / d }
}

/// One `Q8_0` block: `d: f16`, then `round(x/d)` as 32 `i8`.
fn quantize_q8_0(block: &[f32], out: &mut Vec<u8>) {
    let amax = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    // `f32::round` rounds ties away from zero, as gguf-py's `np_roundf` does; |q| ≤ 127.
    out.extend(block.iter().map(|&x| (x * id).round() as i8 as u8));
}

/// One `Q4_0` block: `d: f16`, then 16 bytes of packed nibbles (`j` low, `j + 16` high).
fn quantize_q4_0(block: &[f32], out: &mut Vec<u8>) {
    // numpy's argmax returns the first index of the largest |x|.
    let max = block
        .iter()
        .fold(0.0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
    let d = max / -8.0;
    let id = f64::from(inverse(d));
    // gguf-py computes this in f64 ("Q4_0's reference rounding is cursed and depends on
    // FMA") and rounds the sum to f32 before truncating: keep both steps.
    let q = |x: f32| {
        let v = (f64::from(x) * id + 8.5) as f32;
        (v.trunc() as u8).min(15)
    };
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    pack_nibbles(block, q, out);
}

/// One `Q5_0` block: `d: f16`, `qh: u32` (the 5th bits), 16 bytes of packed low nibbles.
fn quantize_q5_0(block: &[f32], out: &mut Vec<u8>) {
    let max = block
        .iter()
        .fold(0.0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
    let d = max / -16.0;
    let id = f64::from(inverse(d));
    let q: Vec<u8> = block
        .iter()
        .map(|&x| (((f64::from(x) * id + 16.5) as f32).trunc() as u8).min(31))
        .collect();
    let qh = q
        .iter()
        .enumerate()
        .fold(0u32, |h, (j, &q)| h | u32::from(q >> 4) << j);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend_from_slice(&qh.to_le_bytes());
    let (lo, hi) = q.split_at(QK / 2);
    out.extend(lo.iter().zip(hi).map(|(&l, &h)| (l & 15) | (h & 15) << 4));
}

/// The nearest integer to `v` (ties away from zero), clamped to `lo..=hi`.
fn nearest(v: f32, lo: i32, hi: i32) -> i32 {
    (v.round() as i32).clamp(lo, hi)
}

/// One `Q4_K` super-block, round to nearest without a search: sub-block `s` spans
/// `[min_s, max_s]` with `min_s ≤ 0`; its scale is rounded up, `sc_s = ⌈r_s / d⌉` with
/// `r_s = (max_s − min_s + dmin) / 15` and `d = max_s r_s / 63`, and its minimum
/// `m_s = ⌈−min_s / dmin⌉` with `dmin = max_s(−min_s) / 63` (`d`, `dmin` as stored in
/// f16), so every weight lies in range and is within half a step `d·sc_s` of its value
/// (up to the f16 rounding of the scales).
fn quantize_q4_k(block: &[f32], out: &mut Vec<u8>) {
    let subs: Vec<(f32, f32)> = block
        .chunks_exact(32)
        .map(|s| {
            let lo = s.iter().fold(0.0f32, |m, &x| m.min(x));
            let hi = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            (lo, hi)
        })
        .collect();
    let dmin = f16::from_f32(subs.iter().fold(0.0f32, |m, s| m.max(-s.0)) / 63.0).to_f32();
    let range = |(lo, hi): (f32, f32)| (hi - lo + dmin) / 15.0;
    let d = f16::from_f32(subs.iter().fold(0.0f32, |m, &s| m.max(range(s))) / 63.0).to_f32();
    let mut scales = [0u8; 12];
    let mut qs = [0u8; 128];
    for (s, (&(lo, hi), x)) in subs.iter().zip(block.chunks_exact(32)).enumerate() {
        let sc = (range((lo, hi)) * inverse(d)).ceil().min(63.0) as u8;
        let m = (-lo * inverse(dmin)).ceil().min(63.0) as u8;
        if s < 4 {
            scales[s] = sc;
            scales[s + 4] = m;
        } else {
            scales[s + 4] = (sc & 15) | (m & 15) << 4;
            scales[s - 4] |= (sc >> 4) << 6;
            scales[s] |= (m >> 4) << 6;
        }
        let (step, offset) = (d * f32::from(sc), dmin * f32::from(m));
        for (j, &x) in x.iter().enumerate() {
            let q = nearest((x + offset) * inverse(step), 0, 15) as u8;
            qs[32 * (s / 2) + j] |= q << (4 * (s % 2));
        }
    }
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend_from_slice(&f16::from_f32(dmin).to_le_bytes());
    out.extend_from_slice(&scales);
    out.extend_from_slice(&qs);
}

/// One `Q6_K` super-block, round to nearest without a search: sub-block `s` (16
/// weights) needs the step `r_s = max|x| / 31`; `d = max_s r_s / 127` (stored in f16) and
/// `scale_s = ⌈r_s / d⌉`, so `q = round(x / (d·scale_s)) + 32` stays in `0..64`.
fn quantize_q6_k(block: &[f32], out: &mut Vec<u8>) {
    let steps: Vec<f32> = block
        .chunks_exact(16)
        .map(|s| s.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 31.0)
        .collect();
    let d = f16::from_f32(steps.iter().fold(0.0f32, |m, &r| m.max(r)) / 127.0).to_f32();
    let scales: Vec<i8> = steps
        .iter()
        .map(|&r| (r * inverse(d)).ceil().min(127.0) as i8)
        .collect();
    let q: Vec<u8> = block
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let step = d * f32::from(scales[i / 16]);
            (nearest(x * inverse(step), -32, 31) + 32) as u8
        })
        .collect();
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for n in 0..2 {
        for l in 0..32 {
            let at = |k: usize| q[128 * n + 32 * k + l];
            ql[64 * n + l] = (at(0) & 15) | (at(2) & 15) << 4;
            ql[64 * n + l + 32] = (at(1) & 15) | (at(3) & 15) << 4;
            qh[32 * n + l] =
                (at(0) >> 4) | (at(1) >> 4) << 2 | (at(2) >> 4) << 4 | (at(3) >> 4) << 6;
        }
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(scales.iter().map(|&s| s as u8));
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
}

/// One `Q4_1` block: `d: f16`, `m: f16`, then 16 bytes of packed nibbles.
fn quantize_q4_1(block: &[f32], out: &mut Vec<u8>) {
    let max = block.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let min = block.iter().fold(f32::INFINITY, |m, &x| m.min(x));
    let d = (max - min) / 15.0;
    let id = inverse(d);
    let q = |x: f32| (((x - min) * id + 0.5).trunc() as u8).min(15);
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
    pack_nibbles(block, q, out);
}

/// Quantise a 32-weight block with `q` and pack weight `j` into the low nibble and weight
/// `j + 16` into the high nibble of byte `j`.
fn pack_nibbles(block: &[f32], q: impl Fn(f32) -> u8, out: &mut Vec<u8>) {
    let (lo, hi) = block.split_at(QK / 2);
    out.extend(lo.iter().zip(hi).map(|(&l, &h)| q(l) | (q(h) << 4)));
}
