//! Reference (de)quantisers for every [`DType`], byte-compatible with the `gguf` Python
//! package (gguf-py `quants.py`).
//!
//! Decoding follows the layouts of `kvcore::backend` (`dtype.rs`): per 32-weight block a
//! little-endian f16 scale `d` (and for `Q4_1` an f16 offset `m`), then the quants. Every
//! product and sum is rounded to f32 separately, never fused, so the decoded values are
//! bit for bit those of gguf-py's numpy dequantiser:
//!
//! | format | weight `j` of a block |
//! |--------|------------------------|
//! | `Q8_0` | `d·qs[j]` |
//! | `Q4_0` | `d·(nibble_j − 8)` |
//! | `Q4_1` | `(d·nibble_j) + m` (two roundings) |
//!
//! where `nibble_j` is the low nibble of `qs[j]` for `j < 16` and the high nibble of
//! `qs[j − 16]` otherwise.
//!
//! Encoding reproduces gguf-py's numpy quantisers, including their exact order of
//! operations and intermediate precisions (see each `quantize_*` function); the results
//! are checked byte for byte against `shared/reference/quant-blocks.json`.

use half::f16;
use kvcore::backend::{DType, QK, ShapeError, Weights};

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
/// If `out.len()` is not a whole number of blocks, `bytes` has the wrong length, or
/// `dtype` is not in [`FORMATS`] (programming errors).
pub fn dequantize(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    let expected = dtype.row_bytes(out.len());
    assert_eq!(
        Some(bytes.len()),
        expected,
        "dequantize: {} bytes do not hold {} {dtype} weights",
        bytes.len(),
        out.len()
    );
    let blocks = bytes.chunks_exact(dtype.block_bytes());
    match dtype {
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(blocks) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::F16 => {
            for (o, b) in out.iter_mut().zip(blocks) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        DType::BF16 => {
            for (o, b) in out.iter_mut().zip(blocks) {
                *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        DType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(blocks) {
                let d = f16_at(b, 0);
                for (w, &q) in o.iter_mut().zip(&b[2..]) {
                    *w = d * f32::from(q as i8);
                }
            }
        }
        DType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(blocks) {
                let d = f16_at(b, 0);
                let (lo, hi) = o.split_at_mut(QK / 2);
                for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&b[2..]) {
                    *l = d * f32::from((q & 15) as i8 - 8);
                    *h = d * f32::from((q >> 4) as i8 - 8);
                }
            }
        }
        DType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(blocks) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                let (lo, hi) = o.split_at_mut(QK / 2);
                for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&b[4..]) {
                    *l = d * f32::from(q & 15) + m;
                    *h = d * f32::from(q >> 4) + m;
                }
            }
        }
        other => unsupported(other),
    }
}

/// The formats this crate implements, [`FORMATS`]; the backends check a weight's
/// format at their entry points ([`check_format`]), so the decoders never see another.
pub const FORMATS: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
];

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
        other => unsupported(other),
    }
    debug_assert_eq!(out.len(), n_bytes);
    out
}

/// `bfloat16` bits widened to f32: the bits become the top half of a binary32.
fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
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

/// The little-endian f16 at `bytes[at..at + 2]`, widened to f32.
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
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
