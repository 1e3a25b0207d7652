//! SIMD128 decoding and GEMV of the formats with 5-bit quants or super-blocks: `Q5_0`,
//! `Q4_K`, `Q6_K`; the twin of `aarch64/kquant.rs`.
//!
//! Each block is decoded 32 weights (a "chunk") at a time into eight 4-lane f32 vectors
//! holding weights `0..4, 4..8, …, 28..32` of the chunk; every lane is computed with the
//! scalar decoder's operations in its order (`kvcore_scalar::quant`), separately rounded
//! multiplies and subtractions (SIMD128 has no FMA anyway), so it is bit for bit the
//! scalar value. Unlike the NEON file, which widens quant bytes to u32 four at a time,
//! the quants are assembled sixteen at a time in 8-bit lanes (a 16-byte load, masks and
//! shifts — `u8x16_shr` takes a run-time count —, the offset subtracted in i8, where
//! every quant minus its offset fits), then sign-extended 8 → 16 → 32 bits and
//! converted to f32 (exact): WebAssembly has no per-lane variable shift to spare the
//! byte work, and this keeps the instruction count per weight low.
//! - `Q5_0`: the nibbles as `Q4_0` (low nibbles weights `0..16`, high ones `16..32`);
//!   bit `j` of `qh` becomes bit 4 of weight `j` by broadcasting byte `j / 8` of `qh` to
//!   lane `j` (`i8x16_swizzle`), testing bit `j mod 8` against a per-lane mask and
//!   keeping `0x10` where it is set;
//! - `Q4_K`: chunk `s` is sub-block `s`: the low (`s` even) or high (`s` odd) nibbles
//!   of `qs[32·(s/2)..]`, `w = (d·sc)·q − dmin·m` with `(sc, m)` from
//!   `kvcore_scalar::quant::q4_k_scale_min`;
//! - `Q6_K`: chunk `c` is quarter `k = c mod 4` of half `n = c / 4`: nibble `k / 2` of
//!   `ql[64n + 32·(k mod 2)..]`, bits `2k, 2k + 1` of `qh[32n..]`, minus 32, times
//!   `d·scale` (one scale per 16 weights).
//!
//! GEMV numerics, per row: the decoded weights are multiplied into four 4-lane
//! accumulators (vector `v` of a chunk into accumulator `v mod 4`; a rounded multiply,
//! then a rounded add), summed at the end; compared with the scalar reference only the
//! order of the sum (and the scalar's own fusing, if any) differs.

use super::quant::{i8x16_to_f32, join, load_bytes};
use core::arch::wasm32::*;
use kvcore::backend::QK;
use kvcore_scalar::quant::q4_k_scale_min;

use crate::kformat::{Format, f16_at};

/// One decoded chunk: weights `4v..4v + 4` in vector `v`.
type Chunk = [v128; 8];

impl Format {
    /// Decode chunk `c` (weights `32c..32c + 32`) of the stored block `b`.
    ///
    /// # Panics
    /// If `b` is not one whole block or `c` is past its last chunk.
    #[inline(always)]
    pub(super) fn chunk(self, b: &[u8], c: usize) -> Chunk {
        assert_eq!(b.len(), self.dtype().block_bytes());
        assert!(c < self.dtype().block_len() / QK);
        match self {
            Format::Q5_0 => {
                let d = f32x4_splat(f16_at(b, 0));
                let qs = load_bytes(&b[6..22]);
                // qh's four bytes in every 32-bit lane; lane j of `lo_bits` holds byte
                // j / 8 (bits 0..16 of qh), of `hi_bits` byte 2 + j / 8 (bits 16..32).
                let qh = u32x4_splat(u32::from_le_bytes([b[2], b[3], b[4], b[5]]));
                let lo_bits =
                    i8x16_swizzle(qh, u8x16(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
                let hi_bits =
                    i8x16_swizzle(qh, u8x16(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
                let bit = u8x16(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128);
                // 0x10 in lane j where bit j (mod 8, of the broadcast byte) is set.
                let fifth = |bits: v128| {
                    let set = u8x16_eq(v128_and(bits, bit), bit);
                    v128_and(set, u8x16_splat(0x10))
                };
                let off = i8x16_splat(16);
                let lo = i8x16_sub(v128_or(low_or_high_nibbles(qs, false), fifth(lo_bits)), off);
                let hi = i8x16_sub(v128_or(low_or_high_nibbles(qs, true), fifth(hi_bits)), off);
                let q = join(i8x16_to_f32(lo), i8x16_to_f32(hi));
                q.map(|q| f32x4_mul(d, q))
            }
            Format::Q4_K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let (sc, m) = q4_k_scale_min(&b[4..16], c);
                let ds = f32x4_splat(d * f32::from(sc));
                let dm = f32x4_splat(dmin * f32::from(m));
                let qs = &b[16 + 32 * (c / 2)..][..32];
                // Constant shifts (a run-time count costs more code in the engines).
                let nibbles = |s: &[u8]| low_or_high_nibbles(load_bytes(s), c % 2 == 1);
                let q = join(
                    i8x16_to_f32(nibbles(&qs[..16])),
                    i8x16_to_f32(nibbles(&qs[16..])),
                );
                q.map(|q| f32x4_sub(f32x4_mul(ds, q), dm))
            }
            Format::Q6_K => {
                let (n, k) = (c / 4, c % 4);
                let d = f16_at(b, 208);
                let low = &b[64 * n + 32 * (k % 2)..][..32];
                let high = &b[128 + 32 * n..][..32];
                let quants = |i: usize| {
                    let l = low_or_high_nibbles(load_bytes(&low[16 * i..]), k >= 2);
                    // (h >> 2k & 3) << 4, by one constant shift and a mask of bits 4, 5.
                    let h = load_bytes(&high[16 * i..]);
                    let h = match k {
                        0 => i8x16_shl(h, 4),
                        1 => i8x16_shl(h, 2),
                        2 => h,
                        _ => u8x16_shr(h, 2),
                    };
                    let h = v128_and(h, u8x16_splat(0x30));
                    i8x16_sub(v128_or(l, h), i8x16_splat(32))
                };
                let q = join(i8x16_to_f32(quants(0)), i8x16_to_f32(quants(1)));
                let mut out = q;
                for (v, o) in out.iter_mut().enumerate() {
                    let scale = d * f32::from(b[192 + 8 * n + 2 * k + v / 4] as i8);
                    *o = f32x4_mul(f32x4_splat(scale), *o);
                }
                out
            }
        }
    }
}

/// The high (`high`) or low nibble of each byte of `v`.
#[inline]
fn low_or_high_nibbles(v: v128, high: bool) -> v128 {
    if high {
        u8x16_shr(v, 4)
    } else {
        v128_and(v, u8x16_splat(15))
    }
}

#[cfg(test)]
mod tests {
    use crate::wasm32::Simd128;
    use kvcore::backend::DType;

    /// A small deterministic generator of test bytes (xorshift64).
    struct Bytes(u64);

    impl Bytes {
        fn fill(&mut self, out: &mut [u8]) {
            for b in out {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                *b = (self.0 >> 32) as u8;
            }
        }
    }

    /// Overwrite each block's f16 scales with finite values of a few magnitudes, normal
    /// and subnormal (random bytes would make most blocks NaN or ±inf).
    fn finite_scales(dtype: DType, bytes: &mut [u8], seed: u64) {
        let at: &[usize] = match dtype {
            DType::Q5_0 => &[0],
            DType::Q4_K => &[0, 2],
            _ => &[208],
        };
        let mut r = Bytes(seed);
        for b in bytes.chunks_exact_mut(dtype.block_bytes()) {
            for &i in at {
                let mut x = [0u8; 2];
                r.fill(&mut x);
                // Clear the top exponent bit: exponents 0..15, subnormals included.
                x[1] &= 0xbf;
                b[i..i + 2].copy_from_slice(&x);
            }
        }
    }

    /// `dequantize` is bit for bit the scalar decoder, on random quants and scales
    /// (NaN for NaN, as the scalar decoder gives for a NaN or ±inf scale).
    #[test]
    fn dequantize_is_bit_exact() {
        let mut source = Bytes(0x9e37_79b9_7f4a_7c15);
        for dtype in [DType::Q5_0, DType::Q4_K, DType::Q6_K] {
            let k = Simd128::detect().expect("compiled for SIMD128");
            for blocks in [1, 2, 7] {
                for round in 0..64u64 {
                    let n = blocks * dtype.block_len();
                    let mut bytes = vec![0u8; dtype.row_bytes(n).expect("whole blocks")];
                    source.fill(&mut bytes);
                    if round % 4 != 0 {
                        finite_scales(dtype, &mut bytes, round + 1);
                    }
                    let (mut got, mut want) = (vec![0.0f32; n], vec![1.0f32; n]);
                    crate::kformat::dequantize(k, dtype, &bytes, &mut got);
                    kvcore_scalar::quant::dequantize(dtype, &bytes, &mut want);
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                            "{dtype} weight {i} of {n}: {g:e} against {w:e}"
                        );
                    }
                }
            }
        }
    }
}
