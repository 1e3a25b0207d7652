//! Shape errors and the shape checks every [`Backend`](super::Backend) runs first.

use super::{DType, Weights};
use crate::kv::{KvType, KvView};
use ndarray::{ArrayView3, ArrayViewMut3};
use thiserror::Error;

/// A kernel was called with operands whose shapes do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ShapeError {
    /// A slice of the wrong length.
    #[error("{what}: expected length {expected}, got {actual}")]
    Length {
        /// Which field or operand.
        what: &'static str,
        /// What was expected.
        expected: usize,
        /// What was given.
        actual: usize,
    },
    /// A length that is not a whole number of rows (or blocks).
    #[error("{what}: length {len} is not a multiple of {multiple}")]
    NotMultiple {
        /// Which field or operand.
        what: &'static str,
        /// The declared or actual length.
        len: usize,
        /// The factor it must be a multiple of.
        multiple: usize,
    },
    /// Columns that are not a whole number of the format's blocks.
    #[error("{dtype} rows hold whole blocks of {} weights; {cols} columns do not", dtype.block_len())]
    PartialBlock {
        /// The element format.
        dtype: DType,
        /// Columns given.
        cols: usize,
    },
    /// Weight bytes that do not match the matrix's shape.
    #[error("{dtype} [{rows}, {cols}] takes {expected} bytes, got {actual}")]
    WeightBytes {
        /// The element format.
        dtype: DType,
        /// Rows given.
        rows: usize,
        /// Columns given.
        cols: usize,
        /// What was expected.
        expected: usize,
        /// What was given.
        actual: usize,
    },
    /// An index past the end.
    #[error("index {index} out of range for {what} of length {len}")]
    Index {
        /// Which field or operand.
        what: &'static str,
        /// The index given.
        index: usize,
        /// The declared or actual length.
        len: usize,
    },
    /// An operation the weight format does not support.
    #[error("{what}: not available for {dtype} weights")]
    Unsupported {
        /// Which field or operand.
        what: &'static str,
        /// The element format.
        dtype: DType,
    },
    /// Inconsistent dimensions (zero heads, heads not dividing, an odd RoPE head...).
    #[error("invalid geometry: {0}")]
    Geometry(&'static str),
    /// A size that overflows `usize`.
    #[error("size overflow computing {what}")]
    Overflow {
        /// Which field or operand.
        what: &'static str,
    },
    /// An array whose dimensions do not fit.
    #[error("{what}: expected dims {expected:?}, got {actual:?}")]
    Dims {
        /// Which field or operand.
        what: &'static str,
        /// What was expected.
        expected: [usize; 3],
        /// What was given.
        actual: [usize; 3],
    },
    /// An array view whose last axis is strided.
    #[error("{what}: the last axis must be contiguous")]
    NotContiguous {
        /// Which field or operand.
        what: &'static str,
    },
    /// An optional kernel this backend does not provide.
    #[error("{backend} does not provide {what}")]
    NotProvided {
        /// The kernel.
        what: &'static str,
        /// The backend's name.
        backend: &'static str,
    },
    /// KV rows of an element type the kernel does not read.
    #[error("{what}: not available for {kv_type} KV rows")]
    UnsupportedKv {
        /// Which field or operand.
        what: &'static str,
        /// The element type.
        kv_type: KvType,
    },
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

    /// The number of rows of `width` elements in `len`: [`ShapeError::Geometry`] (`empty`)
    /// for a zero width, [`ShapeError::NotMultiple`] (`what`) unless they divide `len`.
    fn rows(
        empty: &'static str,
        what: &'static str,
        len: usize,
        width: usize,
    ) -> Result<usize, ShapeError> {
        if width == 0 {
            return Err(ShapeError::Geometry(empty));
        }
        if !len.is_multiple_of(width) {
            return Err(ShapeError::NotMultiple {
                what,
                len,
                multiple: width,
            });
        }
        Ok(len / width)
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
        match crate::backend::Q8Layout::of(w.dtype()) {
            None => {
                return Err(ShapeError::Unsupported {
                    what: "gemv with q8 activations",
                    dtype: w.dtype(),
                });
            }
            Some(layout) if layout != x.layout() => {
                return Err(ShapeError::Unsupported {
                    what: "gemv with q8 activations in the other block layout",
                    dtype: w.dtype(),
                });
            }
            Some(_) => {}
        }
        len("gemv_q8 x", x.len(), w.cols())?;
        len("gemv_q8 y", y.len(), w.rows())
    }

    /// 8-bit activations for `n = x.len()` tokens, each as [`gemv_q8`] requires it;
    /// `y: [n, rows]`. Returns `n`.
    pub fn gemm_q8(
        w: &Weights<'_>,
        x: &[crate::backend::Q8Acts],
        y: &[f32],
    ) -> Result<usize, ShapeError> {
        len("gemm_q8 y", y.len(), x.len().saturating_mul(w.rows()))?;
        for xt in x {
            gemv_q8(w, xt, &y[..w.rows()])?;
        }
        Ok(x.len())
    }

    /// `x: [n, cols]`, `y: [n, rows]`; returns `n`.
    pub fn gemm(w: &Weights<'_>, x: &[f32], y: &[f32]) -> Result<usize, ShapeError> {
        let n = rows("gemm with zero columns", "gemm x", x.len(), w.cols())?;
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

    /// Whether the last axis of a view with this shape and these strides is contiguous
    /// (an empty view is, whatever strides it reports).
    fn last_contiguous(shape: &[usize], strides: &[isize]) -> bool {
        shape.contains(&0) || shape.last().is_none_or(|&d| d <= 1) || strides.last() == Some(&1)
    }

    /// Attention: `q`, `out`: `[n, n_heads, head_dim]`, `q_pos: [n]`, the view's heads
    /// dividing `n_heads` and its `head_dim` equal; heads and `head_dim` non-zero; the
    /// last axis of `q`, `out` and every segment's rows contiguous.
    pub fn attention(
        q: &ArrayView3<'_, f32>,
        q_pos: &[usize],
        kv: &KvView<'_>,
        out: &ArrayViewMut3<'_, f32>,
    ) -> Result<(), ShapeError> {
        let (n, n_heads, hd) = q.dim();
        let (on, oh, od) = out.dim();
        if (on, oh, od) != (n, n_heads, hd) {
            return Err(ShapeError::Dims {
                what: "attention out",
                expected: [n, n_heads, hd],
                actual: [on, oh, od],
            });
        }
        len("attention q_pos", q_pos.len(), n)?;
        if n_heads == 0 || hd == 0 || kv.n_kv_heads() == 0 {
            return Err(ShapeError::Geometry(
                "attention heads and head_dim must be non-zero",
            ));
        }
        if !n_heads.is_multiple_of(kv.n_kv_heads()) {
            return Err(ShapeError::Geometry(
                "n_heads must be a multiple of n_kv_heads",
            ));
        }
        len("attention kv head_dim", kv.head_dim(), hd)?;
        if !last_contiguous(q.shape(), q.strides()) {
            return Err(ShapeError::NotContiguous {
                what: "attention q",
            });
        }
        if !last_contiguous(out.shape(), out.strides()) {
            return Err(ShapeError::NotContiguous {
                what: "attention out",
            });
        }
        for seg in kv.segments() {
            for (what, rows) in [
                ("attention keys", seg.keys()),
                ("attention values", seg.values()),
            ] {
                if !rows.last_axis_contiguous() {
                    return Err(ShapeError::NotContiguous { what });
                }
            }
        }
        Ok(())
    }

    /// `x`, `out`: `[n, d]`, `weight: [d]`.
    pub fn rms_norm(x: &[f32], weight: &[f32], out: &[f32]) -> Result<(), ShapeError> {
        rows(
            "rms_norm weight is empty",
            "rms_norm x",
            x.len(),
            weight.len(),
        )?;
        len("rms_norm out", out.len(), x.len())
    }

    /// Element-wise binary op: all lengths equal.
    pub fn same_len(what: &'static str, a: usize, b: usize) -> Result<(), ShapeError> {
        len(what, b, a)
    }

    /// [`attention`] and `stats: [n · n_heads]`.
    pub fn attention_part(
        q: &ArrayView3<'_, f32>,
        q_pos: &[usize],
        kv: &KvView<'_>,
        out: &ArrayViewMut3<'_, f32>,
        stats: &[crate::backend::PartStat],
    ) -> Result<(), ShapeError> {
        attention(q, q_pos, kv, out)?;
        let (n, n_heads, _) = q.dim();
        len("attention_part stats", stats.len(), n * n_heads)
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
