//! Shape errors and the shape checks every [`Backend`](super::Backend) runs first.

use super::{AttnShape, DType, Weights};
use thiserror::Error;

/// A kernel was called with operands whose shapes do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShapeError {
    #[error("{what}: expected length {expected}, got {actual}")]
    Length {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    #[error("{what}: length {len} is not a multiple of {multiple}")]
    NotMultiple {
        what: &'static str,
        len: usize,
        multiple: usize,
    },
    #[error("{dtype} rows hold whole blocks of {} weights; {cols} columns do not", dtype.block_len())]
    PartialBlock { dtype: DType, cols: usize },
    #[error("{dtype} [{rows}, {cols}] takes {expected} bytes, got {actual}")]
    WeightBytes {
        dtype: DType,
        rows: usize,
        cols: usize,
        expected: usize,
        actual: usize,
    },
    #[error("index {index} out of range for {what} of length {len}")]
    Index {
        what: &'static str,
        index: usize,
        len: usize,
    },
    #[error("{what}: not available for {dtype} weights")]
    Unsupported { what: &'static str, dtype: DType },
    #[error("invalid geometry: {0}")]
    Geometry(&'static str),
    #[error("size overflow computing {what}")]
    Overflow { what: &'static str },
}

/// Shape checks shared by every backend, one per kernel, named after it.
pub mod check {
    use super::*;

    fn len(what: &'static str, actual: usize, expected: usize) -> Result<(), ShapeError> {
        if actual == expected {
            Ok(())
        } else {
            Err(ShapeError::Length {
                what,
                expected,
                actual,
            })
        }
    }

    /// `x: [cols]`, `y: [rows]`.
    pub fn gemv(w: &Weights<'_>, x: &[f32], y: &[f32]) -> Result<(), ShapeError> {
        len("gemv x", x.len(), w.cols())?;
        len("gemv y", y.len(), w.rows())
    }

    /// 8-bit activations: `w` a block format ([`q8::supports`](crate::backend::q8::supports)),
    /// `x: [cols]`, `y: [rows]`.
    pub fn gemv_q8(
        w: &Weights<'_>,
        x: &crate::backend::Q8Acts,
        y: &[f32],
    ) -> Result<(), ShapeError> {
        if !crate::backend::q8::supports(w.dtype()) {
            return Err(ShapeError::Unsupported {
                what: "gemv with q8 activations",
                dtype: w.dtype(),
            });
        }
        len("gemv_q8 x", x.len(), w.cols())?;
        len("gemv_q8 y", y.len(), w.rows())
    }

    /// `x: [n, cols]`, `y: [n, rows]`; returns `n`.
    pub fn gemm(w: &Weights<'_>, x: &[f32], y: &[f32]) -> Result<usize, ShapeError> {
        if w.cols() == 0 {
            return Err(ShapeError::Geometry("gemm with zero columns"));
        }
        if !x.len().is_multiple_of(w.cols()) {
            return Err(ShapeError::NotMultiple {
                what: "gemm x",
                len: x.len(),
                multiple: w.cols(),
            });
        }
        let n = x.len() / w.cols();
        let expected = n
            .checked_mul(w.rows())
            .ok_or(ShapeError::Overflow { what: "gemm y" })?;
        len("gemm y", y.len(), expected)?;
        Ok(n)
    }

    /// `x: [positions.len(), n_heads, head_dim]`, `head_dim` even and non-zero.
    pub fn rope(x: &[f32], head_dim: usize, positions: &[usize]) -> Result<(), ShapeError> {
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(ShapeError::Geometry(
                "rope head_dim must be even and non-zero",
            ));
        }
        if positions.is_empty() {
            return len("rope x", x.len(), 0);
        }
        let row = x.len() / positions.len();
        if !x.len().is_multiple_of(positions.len()) || !row.is_multiple_of(head_dim) {
            return Err(ShapeError::NotMultiple {
                what: "rope x",
                len: x.len(),
                multiple: positions.len() * head_dim,
            });
        }
        Ok(())
    }

    /// One head: `q`, `out`: `[head_dim]`, `keys`/`values`: `[n_keys, kv_dim]`.
    #[allow(clippy::too_many_arguments)]
    pub fn attend_head(
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        n_keys: usize,
        kv_dim: usize,
        kv_head: usize,
        out: &[f32],
    ) -> Result<(), ShapeError> {
        let hd = q.len();
        len("attention out", out.len(), hd)?;
        let end = (kv_head + 1)
            .checked_mul(hd)
            .ok_or(ShapeError::Overflow { what: "kv head" })?;
        if end > kv_dim {
            return Err(ShapeError::Index {
                what: "kv heads",
                index: kv_head,
                len: kv_dim / hd.max(1),
            });
        }
        let kv_len = n_keys
            .checked_mul(kv_dim)
            .ok_or(ShapeError::Overflow { what: "kv rows" })?;
        len("attention keys", keys.len(), kv_len)?;
        len("attention values", values.len(), kv_len)
    }

    /// Whole-layer attention; returns `n_new`.
    pub fn attention(
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        out: &[f32],
        s: &AttnShape,
    ) -> Result<usize, ShapeError> {
        if s.head_dim == 0 || s.n_kv_heads == 0 || s.n_heads == 0 {
            return Err(ShapeError::Geometry(
                "attention heads and head_dim must be non-zero",
            ));
        }
        if !s.n_heads.is_multiple_of(s.n_kv_heads) {
            return Err(ShapeError::Geometry(
                "n_heads must be a multiple of n_kv_heads",
            ));
        }
        let q_row = s.n_heads * s.head_dim;
        let kv_dim = s.n_kv_heads * s.head_dim;
        if !q.len().is_multiple_of(q_row) {
            return Err(ShapeError::NotMultiple {
                what: "attention q",
                len: q.len(),
                multiple: q_row,
            });
        }
        let n_new = q.len() / q_row;
        len("attention out", out.len(), q.len())?;
        if !keys.len().is_multiple_of(kv_dim) {
            return Err(ShapeError::NotMultiple {
                what: "attention keys",
                len: keys.len(),
                multiple: kv_dim,
            });
        }
        len("attention values", values.len(), keys.len())?;
        let n_keys = keys.len() / kv_dim;
        if s.pos0 + n_new > n_keys {
            return Err(ShapeError::Length {
                what: "attention keys (rows needed: pos0 + n_new)",
                expected: s.pos0 + n_new,
                actual: n_keys,
            });
        }
        Ok(n_new)
    }

    /// `x`, `out`: `[n, d]`, `weight: [d]`.
    pub fn rms_norm(x: &[f32], weight: &[f32], out: &[f32]) -> Result<(), ShapeError> {
        if weight.is_empty() {
            return Err(ShapeError::Geometry("rms_norm weight is empty"));
        }
        if !x.len().is_multiple_of(weight.len()) {
            return Err(ShapeError::NotMultiple {
                what: "rms_norm x",
                len: x.len(),
                multiple: weight.len(),
            });
        }
        len("rms_norm out", out.len(), x.len())
    }

    /// Element-wise binary op: all lengths equal.
    pub fn same_len(what: &'static str, a: usize, b: usize) -> Result<(), ShapeError> {
        len(what, b, a)
    }

    /// `out: [cols]`, `row < rows`.
    pub fn embed_row(table: &Weights<'_>, row: usize, out: &[f32]) -> Result<(), ShapeError> {
        if row >= table.rows() {
            return Err(ShapeError::Index {
                what: "embedding rows",
                index: row,
                len: table.rows(),
            });
        }
        len("embedding out", out.len(), table.cols())
    }
}
