//! NEON decoding and GEMV of the formats with 5-bit quants or super-blocks: `Q5_0`,
//! `Q4_K`, `Q6_K`; the twin of `x86/kquant.rs`.
//!
//! Each block is decoded 32 weights (a "chunk") at a time into eight 4-lane f32 vectors
//! holding weights `0..4, 4..8, …, 28..32` of the chunk; every lane is computed with the
//! scalar decoder's operations in its order (`kvcore_scalar::quant`), separately rounded
//! multiplies and subtractions and no FMA, so it is bit for bit the scalar value. Quant
//! bytes are widened to u32 four at a time, then shifted (`vshlq_u32` by a negative
//! count shifts right) and masked per lane:
//! - `Q5_0`: the nibbles as `Q4_0`, with bit `j` of `qh` shifted into bit 4 of weight
//!   `j` by a per-lane variable shift;
//! - `Q4_K`: chunk `s` is sub-block `s`: the low (`s` even) or high (`s` odd) nibbles
//!   of `qs[32·(s/2)..]`, `w = (d·sc)·q − dmin·m` with `(sc, m)` from
//!   `kvcore_scalar::quant::q4_k_scale_min`;
//! - `Q6_K`: chunk `c` is quarter `k = c mod 4` of half `n = c / 4`: nibble `k / 2` of
//!   `ql[64n + 32·(k mod 2)..]`, bits `2k, 2k + 1` of `qh[32n..]`, minus 32, times
//!   `d·scale` (one scale per 16 weights).
//!
//! GEMV numerics, per row: the decoded weights are multiplied into four 4-lane FMA
//! accumulators (vector `v` of a chunk into accumulator `v mod 4`), summed at the end;
//! compared with the scalar reference only the order of the sum and the fused
//! multiply-adds differ.

use kvcore::backend::QK;
use kvcore_scalar::quant::q4_k_scale_min;
use std::arch::aarch64::*;

use crate::kformat::{Format, f16_at};

/// One decoded chunk: weights `4v..4v + 4` in vector `v`.
type Chunk = [float32x4_t; 8];

impl Format {
    /// Decode chunk `c` (weights `32c..32c + 32`) of the stored block `b`.
    ///
    /// # Panics
    /// If `b` is not one whole block or `c` is past its last chunk.
    #[inline]
    #[target_feature(enable = "neon")]
    pub(super) fn chunk(self, b: &[u8], c: usize) -> Chunk {
        assert_eq!(b.len(), self.dtype().block_bytes());
        assert!(c < self.dtype().block_len() / QK);
        let mut out = [vdupq_n_f32(0.0); 8];
        match self {
            Format::Q5_0 => {
                let d = vdupq_n_f32(f16_at(b, 0));
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let qs = &b[6..22];
                for (v, o) in out.iter_mut().enumerate() {
                    // Weights 4v..4v + 4: nibble `v / 4` of bytes `4·(v mod 4)..`.
                    let bytes = u8x4(&qs[4 * (v % 4)..]);
                    let q = vandq_u32(shr(bytes, 4 * (v / 4) as i32), vdupq_n_u32(15));
                    let first = 4 * v as i32;
                    let counts = [-first, -first - 1, -first - 2, -first - 3];
                    // SAFETY: `counts` holds 4 i32, the 16 bytes `vld1q_s32` reads.
                    let counts = unsafe { vld1q_s32(counts.as_ptr()) };
                    let high = vandq_u32(vshlq_u32(vdupq_n_u32(qh), counts), vdupq_n_u32(1));
                    let q = vorrq_u32(q, vshlq_n_u32::<4>(high));
                    let q = vsubq_s32(vreinterpretq_s32_u32(q), vdupq_n_s32(16));
                    *o = vmulq_f32(d, vcvtq_f32_s32(q));
                }
            }
            Format::Q4_K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let (sc, m) = q4_k_scale_min(&b[4..16], c);
                let ds = vdupq_n_f32(d * f32::from(sc));
                let dm = vdupq_n_f32(dmin * f32::from(m));
                let qs = &b[16 + 32 * (c / 2)..][..32];
                for (v, o) in out.iter_mut().enumerate() {
                    let q = shr(u8x4(&qs[4 * v..]), 4 * (c % 2) as i32);
                    let q = vcvtq_f32_u32(vandq_u32(q, vdupq_n_u32(15)));
                    *o = vsubq_f32(vmulq_f32(ds, q), dm);
                }
            }
            Format::Q6_K => {
                let (n, k) = (c / 4, c % 4);
                let d = f16_at(b, 208);
                let low = &b[64 * n + 32 * (k % 2)..][..32];
                let high = &b[128 + 32 * n..][..32];
                for (v, o) in out.iter_mut().enumerate() {
                    let l = shr(u8x4(&low[4 * v..]), 4 * (k / 2) as i32);
                    let l = vandq_u32(l, vdupq_n_u32(15));
                    let h = vandq_u32(shr(u8x4(&high[4 * v..]), 2 * k as i32), vdupq_n_u32(3));
                    let q = vreinterpretq_s32_u32(vorrq_u32(l, vshlq_n_u32::<4>(h)));
                    let q = vcvtq_f32_s32(vsubq_s32(q, vdupq_n_s32(32)));
                    let scale = d * f32::from(b[192 + 8 * n + 2 * k + v / 4] as i8);
                    *o = vmulq_f32(vdupq_n_f32(scale), q);
                }
            }
        }
        out
    }
}

/// `v >> s` in every lane (`s ≥ 0`).
#[inline]
#[target_feature(enable = "neon")]
fn shr(v: uint32x4_t, s: i32) -> uint32x4_t {
    vshlq_u32(v, vdupq_n_s32(-s))
}

/// `s[0..4]` zero-extended to four u32 lanes.
///
/// # Panics
/// If `s.len() < 4`.
#[inline]
#[target_feature(enable = "neon")]
fn u8x4(s: &[u8]) -> uint32x4_t {
    let w = [
        u32::from(s[0]),
        u32::from(s[1]),
        u32::from(s[2]),
        u32::from(s[3]),
    ];
    // SAFETY: `w` holds 4 u32, the 16 bytes `vld1q_u32` reads.
    unsafe { vld1q_u32(w.as_ptr()) }
}
