//! AVX2 decoding and GEMV of the formats with 5-bit quants or super-blocks: `Q5_0`,
//! `Q4_K`, `Q6_K`.
//!
//! Each block is decoded 32 weights (a "chunk") at a time into four 8-lane f32 vectors
//! holding weights `0..8, 8..16, 16..24, 24..32` of the chunk; every lane is computed with
//! the scalar decoder's operations in its order (`kvcore_scalar::quant`), separately
//! rounded multiplies and subtractions and no FMA, so it is bit for bit the scalar value.
//! Quant bytes are zero-extended to i32 eight at a time straight from memory, then
//! shifted and masked per lane:
//! - `Q5_0`: the nibbles as `Q4_0`, with bit `j` of `qh` shifted into bit 4 of weight
//!   `j` by a per-lane variable shift;
//! - `Q4_K`: chunk `s` is sub-block `s`: the low (`s` even) or high (`s` odd) nibbles
//!   of `qs[32·(s/2)..]`, `w = (d·sc)·q − dmin·m` with `(sc, m)` from
//!   `kvcore_scalar::quant::q4_k_scale_min`;
//! - `Q6_K`: chunk `c` is quarter `k = c mod 4` of half `n = c / 4`: nibble `k / 2` of
//!   `ql[64n + 32·(k mod 2)..]`, bits `2k, 2k + 1` of `qh[32n..]`, minus 32, times
//!   `d·scale` (one scale per 16 weights).
//!
//! GEMV numerics, per row: the decoded weights are multiplied into four 8-lane FMA
//! accumulators, one per vector of the chunk, summed at the end (the order of `dot.rs`'s
//! f32 dot product); compared with the scalar reference, only the order of the sum and
//! the fused multiply-adds differ.

use kvcore::backend::QK;
use kvcore_scalar::quant::q4_k_scale_min;
use std::arch::x86_64::*;

use crate::kformat::Format;

impl Format {
    /// Decode chunk `c` (weights `32c..32c + 32`) of the stored block `b`.
    ///
    /// # Panics
    /// If `b` is not one whole block or `c` is past its last chunk.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn chunk(self, b: &[u8], c: usize) -> [__m256; 4] {
        assert_eq!(b.len(), self.dtype().block_bytes());
        assert!(c < self.dtype().block_len() / QK);
        match self {
            Format::Q5_0 => {
                let d = _mm256_set1_ps(f16_at(b, 0));
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let (lo, hi) = (u8x8(&b[6..14]), u8x8(&b[14..22]));
                let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                let one = _mm256_set1_epi32(1);
                let mask = _mm256_set1_epi32(15);
                let nibbles = [
                    _mm256_and_si256(lo, mask),
                    _mm256_and_si256(hi, mask),
                    _mm256_srli_epi32::<4>(lo),
                    _mm256_srli_epi32::<4>(hi),
                ];
                nibbles_to_weights(nibbles, |v, q| {
                    let bits = _mm256_set1_epi32((qh >> (8 * v)) as i32);
                    let high = _mm256_and_si256(_mm256_srlv_epi32(bits, lanes), one);
                    let q = _mm256_or_si256(q, _mm256_slli_epi32::<4>(high));
                    let q = _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(16)));
                    _mm256_mul_ps(d, q)
                })
            }
            Format::Q4_K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let (sc, m) = q4_k_scale_min(&b[4..16], c);
                let ds = _mm256_set1_ps(d * f32::from(sc));
                let dm = _mm256_set1_ps(dmin * f32::from(m));
                let qs = &b[16 + 32 * (c / 2)..][..32];
                let shift = _mm_cvtsi32_si128(4 * (c % 2) as i32);
                let mask = _mm256_set1_epi32(15);
                let nibble =
                    |v: usize| _mm256_and_si256(_mm256_srl_epi32(u8x8(&qs[8 * v..]), shift), mask);
                nibbles_to_weights([nibble(0), nibble(1), nibble(2), nibble(3)], |_, q| {
                    _mm256_sub_ps(_mm256_mul_ps(ds, _mm256_cvtepi32_ps(q)), dm)
                })
            }
            Format::Q6_K => {
                let (n, k) = (c / 4, c % 4);
                let d = f16_at(b, 208);
                let low = &b[64 * n + 32 * (k % 2)..][..32];
                let high = &b[128 + 32 * n..][..32];
                let scale =
                    |v: usize| _mm256_set1_ps(d * f32::from(b[192 + 8 * n + 2 * k + v / 2] as i8));
                let lo_shift = _mm_cvtsi32_si128(4 * (k / 2) as i32);
                let hi_shift = _mm_cvtsi32_si128(2 * k as i32);
                let (m15, m3) = (_mm256_set1_epi32(15), _mm256_set1_epi32(3));
                let quant = |v: usize| {
                    let l = _mm256_and_si256(_mm256_srl_epi32(u8x8(&low[8 * v..]), lo_shift), m15);
                    let h = _mm256_and_si256(_mm256_srl_epi32(u8x8(&high[8 * v..]), hi_shift), m3);
                    _mm256_or_si256(l, _mm256_slli_epi32::<4>(h))
                };
                nibbles_to_weights([quant(0), quant(1), quant(2), quant(3)], |v, q| {
                    let q = _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(32)));
                    _mm256_mul_ps(scale(v), q)
                })
            }
        }
    }
}

/// Apply `f(v, quants_v)` to each of the four integer vectors of a chunk.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles_to_weights(q: [__m256i; 4], f: impl Fn(usize, __m256i) -> __m256) -> [__m256; 4] {
    [f(0, q[0]), f(1, q[1]), f(2, q[2]), f(3, q[3])]
}

/// The little-endian f16 at `b[at..at + 2]`, widened with F16C (exact).
///
/// # Panics
/// If `b.len() < at + 2`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_at(b: &[u8], at: usize) -> f32 {
    let bits = i32::from(u16::from_le_bytes([b[at], b[at + 1]]));
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
}

/// `s[0..8]` zero-extended to eight i32 lanes.
///
/// # Panics
/// If `s.len() < 8`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn u8x8(s: &[u8]) -> __m256i {
    assert!(s.len() >= 8);
    // SAFETY: bytes 0..8 are in bounds (asserted); `loadl_epi64` reads 8 bytes with no
    // alignment requirement.
    _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(s.as_ptr().cast()) })
}
