//! KV element codecs: what each [`KvType`] does to a row on its way into a store and
//! what attention must do to read it back. The model, the engine, the views and the
//! state files ask a [`KvCodec`]; none of them knows what a type does.
//!
//! A codec owns, for its type:
//! - **encoding** of a row of f32 values into the type's units, one row at a time (the
//!   plain types' conversions and the `q8_0` rows of this module, `encode_q8_0_row`,
//!   written into `elem.rs`'s typed buffers);
//! - **decoding**: a stored row decodes exactly as a weight row of the format
//!   [`KvType::dtype`] names, by the backends' dequantisers;
//! - the **head transform** applied before encoding, which attention matches on the
//!   query (for keys) and undoes on the output (for values): none for the plain types,
//!   the Walsh–Hadamard rotation ([`hadamard`]) for `q8_0`
//!   ([`rotated`](KvCodec::rotated), [`unrotate`](KvCodec::unrotate), the reference
//!   every backend's own transform must equal bit for bit);
//! - its **calibration**: `q8_0` keys are kept less the model's key offsets
//!   (`offsets.rs`), computed from the mean keys of a calibration text. The model feeds
//!   that through one narrow callback ([`for_keys`](KvCodec::for_keys): a store holding
//!   the f32 keys of the model's own calibration pass), so the codec knows nothing of
//!   tokenizers; state files record and compare the calibration
//!   ([`calibration`](KvCodec::calibration)).
//!
//! Dispatch: a codec is a small value (the type and, for calibrated keys, an `Arc` of
//! its offsets) whose methods match on the type once per row, per head or per view,
//! never per element; the element loops below each arm, and the backends' row readers
//! (one per type and architecture, over [`KvRows`]), are monomorphic.
//! An enum keeps the hot paths static without a generic parameter on every store and
//! view. A new type is a [`KvType`] and `KvRows` variant, its arm in each method here,
//! and its row readers per architecture.

use std::sync::Arc;

use super::elem::{BlockQ4_0, BlockQ8_0, Q8_0_BLOCK, StoredRows, q4_0_block};
use super::{KEY_OFFSET_BLOCK, KeyOffsets, KvError, KvGeometry, KvRows, KvStore, KvType};
use crate::backend::Rope;

/// Positions of the calibration pass left out of the mean keys: the first token's key is
/// an outlier (an attention sink) in most models.
const CALIBRATION_SKIP: usize = 1;

/// [`KvError::RowType`] unless `codec` is of the store's key type `keys`.
pub(super) fn check_key_codec(codec: &KvCodec, keys: KvType) -> Result<(), KvError> {
    if codec.kv_type == keys {
        Ok(())
    } else {
        Err(KvError::RowType {
            what: "key codec",
            expected: keys,
            found: codec.kv_type,
        })
    }
}

/// The codec of one side (keys or values) of a store: its element type and, for keys of
/// a type that calibrates, the calibration (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct KvCodec {
    kv_type: KvType,
    /// `q8_0` keys kept less these offsets (`offsets.rs`).
    key_offsets: Option<Arc<KeyOffsets>>,
}

impl KvCodec {
    /// The codec of `kv_type` without calibration: values of any type, keys of a type
    /// that needs none, and `q8_0` keys kept as they come.
    pub fn new(kv_type: KvType) -> KvCodec {
        KvCodec {
            kv_type,
            key_offsets: None,
        }
    }

    /// A key codec of `kv_type` kept less `offsets`.
    ///
    /// Errors with [`KvError::Calibration`] for a type that does not calibrate.
    pub fn with_key_offsets(kv_type: KvType, offsets: Arc<KeyOffsets>) -> Result<KvCodec, KvError> {
        if !KvCodec::calibrates(kv_type) {
            return Err(KvError::Calibration {
                reason: "key offsets need keys of a type that calibrates (q8_0, q4_0)",
            });
        }
        Ok(KvCodec {
            kv_type,
            key_offsets: Some(offsets),
        })
    }

    /// The key codec of `kv_type` for a model of `geometry` and `ropes` (one per layer),
    /// covering positions `0 .. max_ctx`. A type that calibrates (`q8_0`) calls
    /// `calibration_keys` once for a store holding the f32 keys of the model's
    /// calibration pass and keeps its keys less the offsets of their mean; the others
    /// never call it.
    ///
    /// Errors: `calibration_keys`'s, and [`KvError::Calibration`] when the keys cannot
    /// be calibrated (not f32, too few positions, a head size that is odd or not a
    /// multiple of 32).
    pub fn for_keys<S: KvStore, E: From<KvError>>(
        kv_type: KvType,
        geometry: KvGeometry,
        ropes: &[Rope],
        max_ctx: usize,
        calibration_keys: impl FnOnce() -> Result<S, E>,
    ) -> Result<KvCodec, E> {
        if !KvCodec::calibrates(kv_type) {
            return Ok(KvCodec::new(kv_type));
        }
        let kv = calibration_keys()?;
        let means = KeyOffsets::calibrate(&kv, ropes, CALIBRATION_SKIP)?;
        let offsets = KeyOffsets::new(geometry, means, ropes.to_vec(), max_ctx)?;
        Ok(KvCodec::with_key_offsets(kv_type, Arc::new(offsets))?)
    }

    /// The same calibration covering positions `0 .. max_ctx` (itself when it covers them
    /// already, or has none): computed again from the recorded means, so the offsets of
    /// every position it covered are unchanged.
    ///
    /// Errors with [`KvError::Calibration`] when the table would not fit in memory.
    pub fn covering(&self, max_ctx: usize) -> Result<KvCodec, KvError> {
        match &self.key_offsets {
            Some(o) if o.max_ctx() < max_ctx => {
                let o = KeyOffsets::new(
                    o.geometry(),
                    o.means().to_vec(),
                    o.ropes().to_vec(),
                    max_ctx,
                )?;
                KvCodec::with_key_offsets(self.kv_type, Arc::new(o))
            }
            _ => Ok(self.clone()),
        }
    }

    /// The element type.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Whether this codec can serve the keys of a store of `geometry` holding up to
    /// `max_ctx` positions with keys of `keys`: [`KvError::RowType`] for another type,
    /// [`KvError::Calibration`] when its calibration does not fit the geometry or cover
    /// `max_ctx`.
    pub(super) fn check_store(
        &self,
        geometry: KvGeometry,
        max_ctx: usize,
        keys: KvType,
    ) -> Result<(), KvError> {
        check_key_codec(self, keys)?;
        match &self.key_offsets {
            Some(o) => o.check_store(geometry, max_ctx, keys),
            None => Ok(()),
        }
    }

    /// Appends the stored units of `rows` (rows of this codec's type, any strides, in
    /// logical order) to `out` in the type's little-endian file layout, the bytes of the
    /// GGUF format [`KvType::dtype`] names; `flush` is called whenever `out` holds at
    /// least `chunk` bytes. What state files write ([`stored_rows`](Self::stored_rows)
    /// reads it back).
    pub(crate) fn write_le<E>(
        &self,
        rows: KvRows<'_>,
        out: &mut Vec<u8>,
        chunk: usize,
        flush: impl FnMut(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        debug_assert_eq!(rows.kv_type(), self.kv_type, "rows of this codec's type");
        super::elem::rows_le(rows, out, chunk, flush)
    }

    /// A buffer for rows of this codec's type read back from the layout
    /// [`write_le`](Self::write_le) writes.
    pub(crate) fn stored_rows(&self) -> StoredRows {
        StoredRows::new(self.kv_type)
    }

    /// The key offsets the keys are kept less of, if any.
    pub fn key_offsets(&self) -> Option<&Arc<KeyOffsets>> {
        self.key_offsets.as_ref()
    }

    /// The calibration as state files record it: the key offsets' pre-RoPE means
    /// (`[n_layers][n_kv_heads][head_dim]`), or nothing.
    pub fn calibration(&self) -> &[f32] {
        self.key_offsets.as_deref().map_or(&[], KeyOffsets::means)
    }

    /// Whether keys of `kv_type` may be calibrated ([`for_keys`](Self::for_keys)); a
    /// calibration records one value per layer and key element, `n_layers · kv_dim`.
    pub fn calibrates(kv_type: KvType) -> bool {
        matches!(kv_type, KvType::Q8_0 | KvType::Q4_0)
    }

    /// Whether rows of this type hold transformed heads, so that attention transforms
    /// each query head against such keys ([`unrotate`](Self::unrotate) of the query) and
    /// each output head of a sum of such values (the same map).
    pub fn rotated(&self) -> bool {
        matches!(self.kv_type, KvType::Q8_0 | KvType::Q4_0)
    }

    /// `x ← H x / n` per head of `x` (`n` = [`rotation_len`] of the head, an exact
    /// division): a query head matched to rotated keys, or a weighted sum of rotated
    /// values rotated back (the transform is its own inverse up to `n`). The reference
    /// every backend's twin equals bit for bit.
    pub fn unrotate(x: &mut [f32]) {
        let n = rotation_len(x.len());
        hadamard(x, n);
        let inv = 1.0 / n as f32;
        x.iter_mut().for_each(|v| *v *= inv);
    }
}

impl KvCodec {
    /// This codec as the view of model layer `layer` carries it ([`LayerCodec`]): its
    /// type and, for calibrated keys, that layer's key offsets over every KV head.
    pub fn layer(&self, layer: usize) -> LayerCodec<'_> {
        LayerCodec {
            kv_type: self.kv_type,
            key_offsets: self.key_offsets.as_deref().map(|offsets| LayerOffsets {
                offsets,
                layer,
                kvh0: 0,
                n_kv_heads: offsets.geometry().n_kv_heads,
            }),
        }
    }
}

/// A side's codec as a view of one layer hands it to attention
/// ([`KvView::codecs`](super::KvView::codecs)): what a kernel must do to read the rows
/// ([`rotated`](Self::rotated)) and what calibrated keys lack
/// ([`key_offset`](Self::key_offset)). A borrow of the store's [`KvCodec`] bound to the
/// view's layer and heads; small and `Copy`.
#[derive(Clone, Copy, Debug)]
pub struct LayerCodec<'a> {
    kv_type: KvType,
    key_offsets: Option<LayerOffsets<'a>>,
}

/// The key offsets of one model layer, for the view's KV heads `kvh0 .. kvh0 + n_kv_heads`.
#[derive(Clone, Copy, Debug)]
struct LayerOffsets<'a> {
    offsets: &'a KeyOffsets,
    layer: usize,
    kvh0: usize,
    n_kv_heads: usize,
}

impl<'a> LayerCodec<'a> {
    /// The codec of rows of `kv_type` without calibration.
    pub fn plain(kv_type: KvType) -> LayerCodec<'a> {
        LayerCodec {
            kv_type,
            key_offsets: None,
        }
    }

    /// The element type.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Whether rows of this codec hold transformed heads ([`KvCodec::rotated`]): attention
    /// transforms each query head against such keys and each output head of a sum of
    /// such values ([`KvCodec::unrotate`]).
    pub fn rotated(&self) -> bool {
        KvCodec::new(self.kv_type).rotated()
    }

    /// The positions over which [`key_offset`](Self::key_offset) is constant (blocks of
    /// this many positions from position 0), or `None` when the keys lack no offset.
    pub fn offset_block(&self) -> Option<usize> {
        self.key_offsets.map(|_| KEY_OFFSET_BLOCK)
    }

    /// What the stored key of KV head `kvh` (of the view) at position `pos` lacks: the
    /// rotated key offset `t_b` (`head_dim` values, `offsets.rs`) attention adds back,
    /// or `None` for keys stored as they come (or a position or head not covered).
    pub fn key_offset(&self, pos: usize, kvh: usize) -> Option<&'a [f32]> {
        let o = self.key_offsets?;
        if kvh >= o.n_kv_heads {
            return None;
        }
        o.offsets.rotated(o.layer, pos, o.kvh0 + kvh)
    }

    /// The same codec restricted to the view's KV heads `heads` (already checked against
    /// the view's heads).
    pub(super) fn heads(self, heads: std::ops::Range<usize>) -> LayerCodec<'a> {
        LayerCodec {
            kv_type: self.kv_type,
            key_offsets: self.key_offsets.map(|o| LayerOffsets {
                kvh0: o.kvh0 + heads.start,
                n_kv_heads: heads.len(),
                ..o
            }),
        }
    }

    /// [`KvError::Calibration`] unless this codec's calibration covers a view of
    /// `n_kv_heads` heads of `head_dim` values holding positions up to `end` of model
    /// layer `layer`.
    pub(super) fn check_covers(
        &self,
        n_kv_heads: usize,
        head_dim: usize,
        end: usize,
    ) -> Result<(), KvError> {
        let Some(o) = self.key_offsets else {
            return Ok(());
        };
        let g = o.offsets.geometry();
        let reason = if (n_kv_heads, head_dim) != (o.n_kv_heads, g.head_dim) {
            "the key offsets' heads are not the view's"
        } else if o.layer >= g.n_layers {
            "the key offsets have no such layer"
        } else if end > o.offsets.max_ctx() {
            "the key offsets cover fewer positions than the view holds"
        } else {
            return Ok(());
        };
        Err(KvError::Calibration { reason })
    }
}

/// The rotation length of a `q8_0` head of `head_dim` values: the largest power of two
/// dividing it (64 for SmolLM2, 256 for Gemma 3; at least 32, since `head_dim` is a
/// multiple of 32).
pub fn rotation_len(head_dim: usize) -> usize {
    1 << head_dim.trailing_zeros().min(usize::BITS - 1)
}

/// The unnormalised Walsh–Hadamard transform of each `n`-value run of `x`, in place:
/// `x ← H_n x` with `H_n` the ±1 Sylvester matrix (`H_n H_n = n I`), by `log₂ n` butterfly
/// stages in f32. `n` is a power of two and `x.len()` a multiple of it.
///
/// Why: a `q8_0` block's scale is set by its largest magnitude, and the keys of a
/// transformer have a few channels far larger than the rest (SmolLM2's measured mean KLD
/// with plain q8_0 keys was 7.9e-4, four times the budget). Rotating a head spreads such
/// a channel over all of it before the scales are chosen (the idea of QuaRot and of
/// llama.cpp's rotated caches). The rotation is orthogonal up to the factor `n`, a power
/// of two, so attention rotates each query head the same way and divides by `n` exactly:
/// `(H q)·(H k) / n = q·k`; a weighted sum of rotated values is rotated back with the same
/// transform (`H (Σ p H v) / n = Σ p v`).
pub fn hadamard(x: &mut [f32], n: usize) {
    for run in x.chunks_exact_mut(n) {
        let mut h = 1;
        if n >= 8 {
            // The stages within 8 values, on fixed-size chunks the compiler unrolls.
            for c in run.chunks_exact_mut(8) {
                for h in [1, 2, 4] {
                    for i in (0..8).filter(|i| i & h == 0) {
                        (c[i], c[i + h]) = (c[i] + c[i + h], c[i] - c[i + h]);
                    }
                }
            }
            h = 8;
        }
        while h < n {
            // Each stage pairs the two halves of every `2h` run, written as slices so
            // the compiler vectorises the butterflies (no index arithmetic, no bounds
            // checks): every value is still the one sum or difference of its pair.
            for pair in run.chunks_exact_mut(2 * h) {
                let (lo, hi) = pair.split_at_mut(h);
                for (a, b) in lo.iter_mut().zip(hi) {
                    (*a, *b) = (*a + *b, *a - *b);
                }
            }
            h *= 2;
        }
    }
}

/// Encodes one row `y` of a block type (`q8_0`, `q4_0`) at position `pos` (heads of
/// `head_dim` values, overwritten) into `out`: each head rotated by [`hadamard`] over
/// [`rotation_len`] values, less the rotated key offset `t_b` of its block when `codec`
/// calibrates keys (`offsets.rs`), then quantised by `block`, 32 values at a time
/// ([`BlockQ8_0::encode`], `q4_0_block`).
pub(super) fn encode_block_row<B>(
    y: &mut [f32],
    head_dim: usize,
    codec: LayerCodec<'_>,
    pos: usize,
    out: &mut [B],
    block: impl Fn(&[f32]) -> B,
) {
    hadamard(y, rotation_len(head_dim));
    if codec.offset_block().is_some() {
        for (h, head) in y.chunks_exact_mut(head_dim).enumerate() {
            let t_b = codec
                .key_offset(pos, h)
                .expect("the store checked its offsets cover its layers and max_ctx");
            head.iter_mut().zip(t_b).for_each(|(y, &o)| *y -= o);
        }
    }
    for (x, o) in y.chunks_exact(Q8_0_BLOCK).zip(out) {
        *o = block(x);
    }
}

/// One row (or any whole number of heads) of `head_dim`-value heads as stored in `q8_0`:
/// each head rotated by [`hadamard`] over [`rotation_len`] values, then quantised block
/// by block ([`BlockQ8_0::encode`]).
pub fn encode_q8_0(x: &[f32], head_dim: usize) -> Vec<BlockQ8_0> {
    encode_rotated(x, head_dim, BlockQ8_0::encode)
}

/// One row (or any whole number of heads) of `head_dim`-value heads as stored in `q4_0`:
/// each head rotated by [`hadamard`] over [`rotation_len`] values, then quantised block
/// by block (`q4_0_block`).
pub fn encode_q4_0(x: &[f32], head_dim: usize) -> Vec<BlockQ4_0> {
    encode_rotated(x, head_dim, q4_0_block)
}

/// `x` with each head rotated, then `block` of each 32 values.
fn encode_rotated<B>(x: &[f32], head_dim: usize, block: impl Fn(&[f32]) -> B) -> Vec<B> {
    let mut y = x.to_vec();
    hadamard(&mut y, rotation_len(head_dim));
    y.chunks_exact(Q8_0_BLOCK).map(block).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `hadamard` is the product by the Sylvester matrix, `H[i][j] = (−1)^popcount(i & j)`,
    /// computed here from that definition. Small integers keep every sum exact, so the
    /// two must agree exactly, run by run.
    #[test]
    fn hadamard_is_the_sylvester_matrix_product() {
        for n in [1usize, 2, 4, 8, 32, 64, 128, 256] {
            let x: Vec<f32> = (0..3 * n)
                .map(|i| ((i * 7919) % 23) as f32 - 11.0)
                .collect();
            let mut y = x.clone();
            hadamard(&mut y, n);
            for (run, out) in x.chunks_exact(n).zip(y.chunks_exact(n)) {
                for (i, &o) in out.iter().enumerate() {
                    let want: f32 = (run.iter().enumerate())
                        .map(|(j, &v)| if (i & j).count_ones() % 2 == 0 { v } else { -v })
                        .sum();
                    assert_eq!(o, want, "n {n}, output {i}");
                }
            }
            // Its own inverse up to n.
            hadamard(&mut y, n);
            let back: Vec<f32> = y.iter().map(|v| v / n as f32).collect();
            assert_eq!(back, x, "n {n}: H H x / n");
        }
    }
}
