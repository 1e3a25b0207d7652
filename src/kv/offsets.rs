//! Key offsets: what a `q8_0` key store subtracts from each key before quantising it, and
//! attention adds back.
//!
//! ## Why
//! Most of a transformer key's energy is a constant direction per layer and head (the
//! mean key), and a `q8_0` block's error grows with its largest magnitude, so quantising
//! `k` spends the 8 bits on a vector every position shares. SmolLM2's keys with plain
//! (rotated) `q8_0` had a mean KLD of 2.6e-4 against f32 keys; with the mean removed
//! before quantising, the keys' error falls to ~0.4 of that (BENCHMARKS.md).
//!
//! Softmax does not change when every score of a query moves by the same amount, so a
//! store could keep `k − μ` for one fixed `μ` and attention would not even notice. But
//! the keys attention reads are rotated by RoPE: position `p`'s mean key is `R_p m` for
//! the pre-RoPE mean `m`, and its slow pairs (SmolLM2: 62 % of `m`'s energy in 4 of 32
//! pairs) turn by 1–3 rad over 8192 positions. So the offset follows the position, in
//! blocks of [`KEY_OFFSET_BLOCK`] positions:
//!
//! - block `b` holds positions `b·256 .. (b+1)·256`, with centre `c_b = b·256 + 128`;
//! - its offset is `o_b = S R_{c_b} m` per layer and KV head (RoPE of the layer's base
//!   and the model's pairing, in f64, rounded once to f32), each RoPE pair `i` shrunk by
//!   `S_i = sinc(θ_i · 128)`, the mean of `cos(θ_i Δ)` over the block: a pair that turns
//!   through a radian or more within the block has no fixed mean there, and subtracting
//!   one would add error (SmolLM2's q8_0 mean KLD: 2.0e-4 without the shrinking, 1.5e-4
//!   with it);
//! - it is kept rotated as the store keeps `q8_0` heads: `t_b = H o_b` ([`hadamard`],
//!   unnormalised);
//! - a `q8_0` key row at position `p` in block `b` stores `Q8_0(H k − t_b)` per head;
//! - attention adds `t_b` back: the key it scores is the decoded row plus `t_b`
//!   (the reference), or, since `t_b` is one vector for all of a block's keys, a part of
//!   attention within one block adds `scale · (H q / n)·t_b` to its softmax maximum
//!   ([`PartStat`](crate::backend::PartStat)), which is the same softmax.
//!
//! Whatever `m` is, the result is exact up to the quantisation: `m` only decides how much
//! the quantiser has left to do. A model computes its `m` once from a calibration text
//! ([`Llama::key_codec`](crate::model::Llama::key_codec), through
//! [`KvCodec::for_keys`](crate::kv::KvCodec::for_keys)); a store given that key codec
//! ([`GrowKv::with_key_codec`](crate::kv::GrowKv::with_key_codec) and the others) encodes
//! every key through it, its views hand it to attention
//! ([`LayerCodec::key_offset`](crate::kv::LayerCodec::key_offset)), and state files record
//! `m`. Without offsets, a `q8_0` store keeps `Q8_0(H k)`.

use std::fmt;

use super::codec::{hadamard, rotation_len};
use super::{KvError, KvGeometry, KvStore, KvType};
use crate::backend::{Rope, RopeStyle};

/// Positions per block of one key offset: a multiple of every backend's attention part
/// ([`Backend::attention_part_len`](crate::backend::Backend::attention_part_len)), so
/// each part's keys share one offset.
pub const KEY_OFFSET_BLOCK: usize = 256;

/// The key offsets of one model's layers (see the module docs): the pre-RoPE mean key
/// `m` of each layer and KV head, the RoPE that turns it, and the rotated offsets `t_b`
/// of every block up to a context length, computed once.
#[derive(Clone, PartialEq)]
pub struct KeyOffsets {
    geometry: KvGeometry,
    /// `[n_layers][n_kv_heads][head_dim]`, pre-RoPE.
    means: Vec<f32>,
    /// Each layer's RoPE.
    ropes: Vec<Rope>,
    /// Blocks covered: `⌈max_ctx / KEY_OFFSET_BLOCK⌉`.
    blocks: usize,
    /// `[n_layers][blocks][n_kv_heads][head_dim]`: `t_b = H R_{c_b} m`.
    table: Vec<f32>,
}

impl fmt::Debug for KeyOffsets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyOffsets")
            .field("geometry", &self.geometry)
            .field("blocks", &self.blocks)
            .finish_non_exhaustive()
    }
}

impl KeyOffsets {
    /// The offsets of pre-RoPE means `means: [n_layers][n_kv_heads][head_dim]` under each
    /// layer's `ropes`, for positions `0 .. max_ctx`.
    ///
    /// Errors with [`KvError::Calibration`] when the lengths do not fit the geometry, a
    /// mean is not finite, the head size is odd (RoPE pairs) or not a multiple of 32
    /// (`q8_0`), or the table would not fit in memory.
    pub fn new(
        geometry: KvGeometry,
        means: Vec<f32>,
        ropes: Vec<Rope>,
        max_ctx: usize,
    ) -> Result<Self, KvError> {
        let bad = |reason: &'static str| Err(KvError::Calibration { reason });
        let per_layer = geometry.kv_dim();
        let d = geometry.head_dim;
        if means.len() != geometry.n_layers.saturating_mul(per_layer) {
            return bad("the means are not n_layers · n_kv_heads · head_dim values");
        }
        if ropes.len() != geometry.n_layers {
            return bad("not one RoPE per layer");
        }
        if KvType::Q8_0.check_head_dim(d).is_err() || d == 0 {
            return bad("the head size is not a multiple of 32");
        }
        if means.iter().any(|m| !m.is_finite()) {
            return bad("a mean is not finite");
        }
        let blocks = max_ctx.div_ceil(KEY_OFFSET_BLOCK);
        let len = geometry
            .n_layers
            .checked_mul(blocks)
            .and_then(|x| x.checked_mul(per_layer))
            .filter(|&n| n <= isize::MAX as usize / 4);
        let Some(len) = len else {
            return bad("the table would not fit in memory");
        };
        let mut table = Vec::new();
        if table.try_reserve_exact(len).is_err() {
            return bad("the table would not fit in memory");
        }
        let n_rot = rotation_len(d);
        let mut o = vec![0f32; d];
        for (layer, rope) in ropes.iter().enumerate() {
            let m = &means[layer * per_layer..(layer + 1) * per_layer];
            for b in 0..blocks {
                let centre = (b * KEY_OFFSET_BLOCK + KEY_OFFSET_BLOCK / 2) as f64;
                for head in m.chunks_exact(d) {
                    rotate(head, centre, rope, &mut o);
                    shrink(&mut o, rope);
                    hadamard(&mut o, n_rot);
                    table.extend_from_slice(&o);
                }
            }
        }
        Ok(KeyOffsets {
            geometry,
            means,
            ropes,
            blocks,
            table,
        })
    }

    /// The mean pre-RoPE key of each layer and KV head over positions `skip .. len` of
    /// `kv` (f32 keys; each key turned back by its position's RoPE, in f64), the `means`
    /// [`new`](Self::new) takes. `skip` leaves out the first positions (the first token's
    /// key is an outlier in most models).
    ///
    /// Errors with [`KvError::Calibration`] when the keys are not f32, `ropes` is not one
    /// per layer or `skip ≥ len`; with the store's error when a view fails.
    pub fn calibrate(kv: &dyn KvStore, ropes: &[Rope], skip: usize) -> Result<Vec<f32>, KvError> {
        let g = kv.geometry();
        let (d, per_layer) = (g.head_dim, g.kv_dim());
        if ropes.len() != g.n_layers || skip >= kv.len() || !d.is_multiple_of(2) {
            return Err(KvError::Calibration {
                reason: "calibration needs one RoPE per layer and positions past the skipped",
            });
        }
        let mut means = vec![0f32; g.n_layers * per_layer];
        let mut acc = vec![0f64; per_layer];
        let mut back = vec![0f32; d];
        for (layer, rope) in ropes.iter().enumerate() {
            let view = kv.view(layer)?;
            acc.fill(0.0);
            let mut count = 0usize;
            for seg in view.segments() {
                let super::KvRows::F32(keys) = seg.keys() else {
                    return Err(KvError::Calibration {
                        reason: "calibration needs f32 keys",
                    });
                };
                for (pos, row) in seg.positions().zip(keys.outer_iter()) {
                    if pos < skip {
                        continue;
                    }
                    for (h, head) in row.outer_iter().enumerate() {
                        let head: Vec<f32> = head.iter().copied().collect();
                        rotate(&head, -(pos as f64), rope, &mut back);
                        for (a, &x) in acc[h * d..(h + 1) * d].iter_mut().zip(&back) {
                            *a += f64::from(x);
                        }
                    }
                    count += 1;
                }
            }
            let out = &mut means[layer * per_layer..(layer + 1) * per_layer];
            for (o, a) in out.iter_mut().zip(&acc) {
                *o = (a / count.max(1) as f64) as f32;
            }
        }
        Ok(means)
    }

    /// Layers, KV heads and head size.
    pub fn geometry(&self) -> KvGeometry {
        self.geometry
    }

    /// The pre-RoPE means, `[n_layers][n_kv_heads][head_dim]` (what state files record).
    pub fn means(&self) -> &[f32] {
        &self.means
    }

    /// Each layer's RoPE.
    pub fn ropes(&self) -> &[Rope] {
        &self.ropes
    }

    /// Positions covered: `0 .. max_ctx()` (a multiple of [`KEY_OFFSET_BLOCK`]).
    pub fn max_ctx(&self) -> usize {
        self.blocks * KEY_OFFSET_BLOCK
    }

    /// The rotated offset `t_b` (`head_dim` values) of the block holding `pos` for KV head
    /// `kvh` of `layer`, or `None` past [`max_ctx`](Self::max_ctx) or the geometry.
    pub fn rotated(&self, layer: usize, pos: usize, kvh: usize) -> Option<&[f32]> {
        let g = &self.geometry;
        let b = pos / KEY_OFFSET_BLOCK;
        if layer >= g.n_layers || b >= self.blocks || kvh >= g.n_kv_heads {
            return None;
        }
        let at = ((layer * self.blocks + b) * g.n_kv_heads + kvh) * g.head_dim;
        self.table.get(at..at + g.head_dim)
    }

    /// Whether these offsets can serve a store of `geometry` holding up to `max_ctx`
    /// positions with K rows of `k_type`: [`KvError::Calibration`] if not.
    pub(super) fn check_store(
        &self,
        geometry: KvGeometry,
        max_ctx: usize,
        k_type: KvType,
    ) -> Result<(), KvError> {
        let reason = if !super::KvCodec::calibrates(k_type) {
            "key offsets need keys of a type that calibrates (q8_0, q4_0)"
        } else if geometry != self.geometry {
            "the offsets' geometry is not the store's"
        } else if max_ctx > self.max_ctx() {
            "the offsets cover fewer positions than the store's max_ctx"
        } else {
            return Ok(());
        };
        Err(KvError::Calibration { reason })
    }
}

/// Scales each RoPE pair of a block's offset by `sinc(θ_i · B/2)`
/// (`B` = [`KEY_OFFSET_BLOCK`]): the mean of `cos(θ_i Δ)` over the block's positions
/// `Δ ∈ [−B/2, B/2]` around its centre, which minimises the expected `|R_Δ m − s m|²`
/// over `s`. A slow pair keeps its offset (`≈ 1`); a pair that turns through a
/// radian or more within a block, where a fixed vector would be as far from most keys'
/// mean as zero is, gets (nearly) none.
fn shrink(o: &mut [f32], rope: &Rope) {
    for (a, b, theta) in pairs(o.len(), rope) {
        let x = theta * (KEY_OFFSET_BLOCK / 2) as f64;
        let s = if x == 0.0 { 1.0 } else { x.sin() / x };
        o[a] = (f64::from(o[a]) * s) as f32;
        o[b] = (f64::from(o[b]) * s) as f32;
    }
}

/// The RoPE pairs of a head of `d` values, `(a, b, θ_i)` for `i in 0..d/2`: the
/// elements turned together under `rope`'s pairing, and the pair's frequency
/// `θ_i = base^(−2i/d)`.
fn pairs(d: usize, rope: &Rope) -> impl Iterator<Item = (usize, usize, f64)> + '_ {
    let half = d / 2;
    (0..half).map(move |i| {
        let (a, b) = match rope.style {
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            RopeStyle::Halves => (i, i + half),
        };
        (a, b, f64::from(rope.base).powf(-2.0 * i as f64 / d as f64))
    })
}

/// `out ← R_angle(x)`: each RoPE pair of `x` turned by `angle · θ_i` (`θ_i =
/// base^(−2i/d)`), in f64, rounded once. A negative `angle` turns it back.
fn rotate(x: &[f32], angle: f64, rope: &Rope, out: &mut [f32]) {
    for (a, b, theta) in pairs(x.len(), rope) {
        let (sin, cos) = (angle * theta).sin_cos();
        let (xa, xb) = (f64::from(x[a]), f64::from(x[b]));
        out[a] = (xa * cos - xb * sin) as f32;
        out[b] = (xa * sin + xb * cos) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope(style: RopeStyle) -> Rope {
        Rope {
            base: 10000.0,
            style,
        }
    }

    /// A block's offset is the mean turned to the block's centre and rotated by `H`; a
    /// turn and its inverse give the mean back.
    #[test]
    fn offsets_are_the_mean_at_each_block_centre() {
        let g = KvGeometry {
            n_layers: 2,
            n_kv_heads: 2,
            head_dim: 64,
        };
        let means: Vec<f32> = (0..2 * 2 * 64)
            .map(|i| ((i * 7) % 13) as f32 - 6.0)
            .collect();
        for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
            let ropes = vec![rope(style); 2];
            let off = KeyOffsets::new(g, means.clone(), ropes.clone(), 600).unwrap();
            assert_eq!(off.max_ctx(), 768);
            for (layer, pos, kvh) in [(0, 0, 0), (1, 300, 1), (1, 767, 0)] {
                let m = &means[(layer * 2 + kvh) * 64..][..64];
                let mut want = vec![0f32; 64];
                rotate(m, (pos / 256 * 256 + 128) as f64, &ropes[layer], &mut want);
                shrink(&mut want, &ropes[layer]);
                hadamard(&mut want, 64);
                assert_eq!(off.rotated(layer, pos, kvh).unwrap(), &want[..]);
                let mut turned = vec![0f32; 64];
                rotate(m, 1000.0, &ropes[layer], &mut turned);
                let mut back = vec![0f32; 64];
                rotate(&turned, -1000.0, &ropes[layer], &mut back);
                for (b, m) in back.iter().zip(m) {
                    assert!((b - m).abs() <= 1e-5 * m.abs().max(1.0), "{b} vs {m}");
                }
            }
            assert!(off.rotated(0, 768, 0).is_none());
            assert!(off.rotated(2, 0, 0).is_none());
            assert!(off.rotated(0, 0, 2).is_none());
        }
    }

    #[test]
    fn bad_offsets_are_refused() {
        let g = KvGeometry {
            n_layers: 1,
            n_kv_heads: 1,
            head_dim: 32,
        };
        let r = vec![rope(RopeStyle::Halves)];
        let new = |m: Vec<f32>, r: Vec<Rope>, g| KeyOffsets::new(g, m, r, 10);
        assert!(new(vec![0.0; 31], r.clone(), g).is_err());
        assert!(new(vec![0.0; 32], vec![], g).is_err());
        let mut nan = vec![0.0; 32];
        nan[3] = f32::NAN;
        assert!(new(nan, r.clone(), g).is_err());
        let odd = KvGeometry { head_dim: 48, ..g };
        assert!(new(vec![0.0; 48], r.clone(), odd).is_err());
        let ok = new(vec![0.0; 32], r, g).unwrap();
        assert!(ok.check_store(g, 256, KvType::Q8_0).is_ok());
        assert!(ok.check_store(g, 257, KvType::Q8_0).is_err());
        assert!(ok.check_store(g, 10, KvType::F16).is_err());
    }
}

#[cfg(test)]
mod store_tests {
    use super::*;
    use crate::kv::{Append, DenseKv, GrowKv, KvPool, KvRows, KvStore, PoolConfig, WindowKv};
    use ndarray::Array2;
    use std::sync::Arc;

    const G: KvGeometry = KvGeometry {
        n_layers: 2,
        n_kv_heads: 2,
        head_dim: 32,
    };

    fn offsets(max_ctx: usize) -> Arc<KeyOffsets> {
        let means = (0..2 * 2 * 32)
            .map(|i| ((i * 5) % 11) as f32 - 5.0)
            .collect();
        let rope = Rope {
            base: 10000.0,
            style: RopeStyle::Interleaved,
        };
        Arc::new(KeyOffsets::new(G, means, vec![rope; 2], max_ctx).unwrap())
    }

    fn append(kv: &mut dyn KvStore, n: usize, seed: usize) {
        let at = kv.len();
        let rows = |s: usize| {
            Array2::from_shape_fn((n, 64), |(t, j)| {
                (((at + t) * 31 + j * 7 + s) % 23) as f32 * 0.25 - 2.5
            })
        };
        let mut tx = Append::begin(kv, at, n).unwrap();
        for layer in 0..2 {
            tx.write(layer, rows(seed + layer).view(), rows(seed + 9).view())
                .unwrap();
        }
        tx.commit().unwrap();
    }

    /// Every store kept less the same key offsets holds the same bytes and hands
    /// attention the same offsets, whatever its layout: a dense, a growing, a window
    /// store without windows and a pool's sequence of 48-position blocks, over appends
    /// that cross the 256-position blocks of the offsets, a truncation and a fork.
    #[test]
    fn stores_with_key_offsets_hold_the_same_rows() {
        let (ctx, ty) = (700, (KvType::Q8_0, KvType::Q8_0));
        let o = offsets(ctx);
        let pool = KvPool::new(
            G,
            ty,
            PoolConfig {
                block_len: 48,
                budget: usize::MAX,
                key: [7; 32],
            },
        )
        .unwrap()
        .with_key_offsets(o.clone())
        .unwrap();
        let mut stores: Vec<Box<dyn KvStore>> = vec![
            Box::new(
                DenseKv::with_types(G, ctx, ty)
                    .unwrap()
                    .with_key_offsets(o.clone())
                    .unwrap(),
            ),
            Box::new(
                GrowKv::with_types(G, ctx, ty)
                    .unwrap()
                    .with_key_offsets(o.clone())
                    .unwrap(),
            ),
            Box::new(
                WindowKv::with_types(G, ctx, &[None, None], ty)
                    .unwrap()
                    .with_key_offsets(o.clone())
                    .unwrap(),
            ),
            Box::new(pool.sequence(ctx).unwrap()),
        ];
        let plain = GrowKv::with_types(G, ctx, ty).unwrap();
        let mut plain: Box<dyn KvStore> = Box::new(plain);
        for (i, n) in [3, 250, 1, 60, 190].into_iter().enumerate() {
            for kv in stores.iter_mut().chain([&mut plain]) {
                append(kv.as_mut(), n, i);
            }
        }
        for kv in stores.iter_mut().chain([&mut plain]) {
            kv.truncate(300).unwrap();
            append(kv.as_mut(), 150, 99);
        }
        let forks: Vec<Box<dyn KvStore>> =
            stores.iter().map(|kv| kv.fork_boxed().unwrap()).collect();
        let bytes = |kv: &dyn KvStore, layer: usize| -> Vec<u8> {
            let view = kv.view(layer).unwrap();
            let mut out = Vec::new();
            for seg in view.segments() {
                let KvRows::Q8_0(k) = seg.keys() else {
                    panic!("q8_0 keys")
                };
                for b in k.iter() {
                    out.extend(b.d.to_bits().to_le_bytes());
                    out.extend(b.qs.iter().map(|&q| q as u8));
                }
            }
            out
        };
        for layer in 0..2 {
            let want = bytes(stores[0].as_ref(), layer);
            assert_eq!(want.len(), 450 * 2 * 34);
            for kv in stores.iter().chain(&forks) {
                assert_eq!(kv.codecs().0.calibration(), o.means());
                assert_eq!(bytes(kv.as_ref(), layer), want, "layer {layer}");
                let view = kv.view(layer).unwrap();
                assert_eq!(view.codecs().0.key_offset(257, 1), o.rotated(layer, 257, 1));
            }
            // Without offsets the stored keys differ (the offsets are not zero).
            assert_ne!(bytes(plain.as_ref(), layer), want);
            assert!(
                plain.codecs().0.calibration().is_empty()
                    && plain
                        .view(layer)
                        .unwrap()
                        .codecs()
                        .0
                        .key_offset(0, 0)
                        .is_none()
            );
        }
    }

    /// Offsets that do not fit a store are refused, leaving no store half-made.
    #[test]
    fn offsets_that_do_not_fit_are_refused() {
        let o = offsets(256);
        let q8 = (KvType::Q8_0, KvType::F32);
        assert!(
            GrowKv::with_types(G, 257, q8)
                .unwrap()
                .with_key_offsets(o.clone())
                .is_err()
        );
        let f16 = (KvType::F16, KvType::F32);
        assert!(
            DenseKv::with_types(G, 10, f16)
                .unwrap()
                .with_key_offsets(o.clone())
                .is_err()
        );
        let other = KvGeometry { n_layers: 1, ..G };
        assert!(
            GrowKv::with_types(other, 10, q8)
                .unwrap()
                .with_key_offsets(o.clone())
                .is_err()
        );
        let mut kv = GrowKv::with_types(G, 10, q8).unwrap();
        append(&mut kv, 2, 0);
        assert!(kv.with_key_offsets(o.clone()).is_err());
        let cfg = PoolConfig {
            block_len: 16,
            budget: usize::MAX,
            key: [0; 32],
        };
        let pool = KvPool::new(G, q8, cfg)
            .unwrap()
            .with_key_offsets(o)
            .unwrap();
        assert!(pool.sequence(257).is_err());
        assert!(pool.sequence(256).is_ok());
    }
}
