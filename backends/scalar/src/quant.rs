//! The reference quantisers of every [`DType`], byte-compatible with the `gguf` Python
//! package (gguf-py `quants.py`), and the decoders they pair with.
//!
//! Each format's layout, reference decode and reference encoder are its type's in
//! [`kvcore::backend::format`]; [`dequantize`] runs that decoder over a row (bit for bit
//! gguf-py's numpy dequantiser: every product and sum rounded to f32 separately, never
//! fused), and [`quantize_row`] runs the encoder (gguf-py's numpy quantisers for the
//! float and legacy formats, round to nearest for the K formats: see that module's
//! docs).

use kvcore::backend::format::{decode_row, encode_row};
use kvcore::backend::{DType, ShapeError, Weights};

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

/// Encode `values` as `dtype`, exactly as gguf-py's `quants.quantize` does for the float
/// and legacy formats: each format's [`BlockFormat::encode`] (its rule in that impl's
/// docs), block after block.
///
/// Returns `dtype.row_bytes(values.len())` bytes.
///
/// # Panics
/// If `values.len()` is not a whole number of `dtype` blocks (a programming error).
///
/// [`BlockFormat::encode`]: kvcore::backend::format::BlockFormat::encode
pub fn quantize_row(dtype: DType, values: &[f32]) -> Vec<u8> {
    let n_bytes = dtype.row_bytes(values.len()).unwrap_or_else(|| {
        panic!(
            "quantize_row: {} values are not whole {dtype} blocks",
            values.len()
        )
    });
    let out = encode_row(dtype, values);
    debug_assert_eq!(out.len(), n_bytes);
    out
}
