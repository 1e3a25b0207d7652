//! AVX2 GEMV and decoding on the stored bytes of every weight format.
//!
//! Decoding (shared by the GEMV and by `dequantize`): each 32-weight block becomes four
//! 8-lane f32 vectors holding weights `0..8, 8..16, 16..24, 24..32`.
//! - `Q4_*`: 8 packed bytes at a time are zero-extended to i32 straight from memory; in
//!   each lane `byte & 15` is the low nibble (weights `0..16`) and `byte >> 4` the high
//!   one (`16..32`); `Q4_0`'s offset 8 is subtracted in i32 and the lanes converted to
//!   f32 (all exact: `|q| ≤ 15`).
//! - `Q8_0`: 8 bytes at a time sign-extended from memory and converted.
//! - `F16`: F16C `vcvtph2ps`; `BF16`: zero-extended to 32 bits and shifted left by 16;
//!   `F32`: an unaligned load. All exact.
//!
//! GEMV numerics, per row: for block `b` with scale `d`, the 32 products `q_j·x_j` are
//! summed in an 8-lane vector `t` (one multiply, then three FMAs), and
//! `acc_{b mod 2} ← d·t + acc_{b mod 2}` (FMA; two accumulators so consecutive blocks do
//! not wait on each other). `Q4_1` uses `Σ_j (d·q_j + m)·x_j = d·Σ_j q_j x_j + m·Σ_j x_j`
//! with the per-block `Σ x_j` precomputed once per call; the `m·Σx` terms go into an
//! 8-lane accumulator of their own, by one FMA per four blocks. At the end the three
//! accumulators are added and their 8 lanes summed.
//! Compared with the scalar reference (decode each weight, then a left-to-right f32
//! sum) only the rounding differs: the order of the sum, the fused multiply-adds, and
//! for `Q4_1` the factored form, whose error is bounded by `u` times
//! `Σ_j (|d·q_j| + |m|)·|x_j|`. The plain formats use `dot.rs`'s order (four
//! 8-lane accumulators).
//!
//! `dequantize` computes `d·q` (then `+ m` for `Q4_1`) with separately rounded
//! multiplies and adds, bit for bit as the scalar decoder. `gemm_blocks` (the GEMM of a
//! few tokens on `Q8_0`/`Q4_0`/`Q4_1`) decodes each block the same way, in registers, and
//! runs `dot.rs`'s `gemm_rows` chains on it: the bits of the decoded panel path.
//!
//! `Q5_0`, `Q4_K` and `Q6_K` are decoded and multiplied in `kquant.rs`.

use super::dot::{PREFETCH_ROWS, hsum, load, prefetch_row};
use super::{Avx2, Avx512};
use crate::kformat::{self, Block, Blocks, F16, F32, Format, width};
use kvcore::backend::{DType, QK, Weights};
use std::arch::x86_64::*;

/// Eight weights of plain format `FMT` from `b[0 .. 8·width]`, widened to f32.
///
/// # Panics
/// If `b` is shorter than 8 elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen8<const FMT: u8>(b: &[u8]) -> __m256 {
    assert!(b.len() >= 8 * width::<FMT>());
    if FMT == F32 {
        // SAFETY: 32 bytes in bounds (asserted); `loadu` has no alignment requirement.
        return unsafe { _mm256_loadu_ps(b.as_ptr().cast()) };
    }
    // SAFETY: 16 bytes in bounds (asserted); `loadu` has no alignment requirement.
    let h = unsafe { _mm_loadu_si128(b.as_ptr().cast()) };
    if FMT == F16 {
        _mm256_cvtph_ps(h)
    } else {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    }
}

/// The 32 nibbles of a `Q4_*` block (`qs[0..16]`) minus `OFFSET`, as four f32 vectors.
///
/// Bytes `0..8` and `8..16` are each zero-extended to eight 32-bit lanes straight from
/// memory (one shuffle per 8 bytes); in each lane the low nibble is `byte & 15` (weights
/// `0..16`) and the high one `byte >> 4` (weights `16..32`).
///
/// # Panics
/// If `qs.len() < 16`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn q4_lanes<const OFFSET: i32>(qs: &[u8]) -> [__m256; 4] {
    assert!(qs.len() >= 16);
    // SAFETY: bytes 0..16 are in bounds (asserted); `loadl_epi64` reads 8 bytes with no
    // alignment requirement.
    let (a, b) = unsafe {
        (
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(qs.as_ptr().cast())),
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(qs.as_ptr().add(8).cast())),
        )
    };
    let mask = _mm256_set1_epi32(15);
    let off = _mm256_set1_epi32(OFFSET);
    let f = |v: __m256i| _mm256_cvtepi32_ps(_mm256_sub_epi32(v, off));
    [
        f(_mm256_and_si256(a, mask)),
        f(_mm256_and_si256(b, mask)),
        f(_mm256_srli_epi32::<4>(a)),
        f(_mm256_srli_epi32::<4>(b)),
    ]
}

/// The 32 signed bytes of a `Q8_0` block (`qs[0..32]`) as four f32 vectors, each 8 bytes
/// sign-extended straight from memory.
///
/// # Panics
/// If `qs.len() < 32`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn q8_lanes(qs: &[u8]) -> [__m256; 4] {
    assert!(qs.len() >= 32);
    let lane = |k: usize| {
        // SAFETY: bytes 8k..8k+8 ⊂ 0..32 are in bounds (asserted); `loadl_epi64` reads
        // 8 bytes with no alignment requirement.
        let v = unsafe { _mm_loadl_epi64(qs.as_ptr().add(8 * k).cast()) };
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
    };
    [lane(0), lane(1), lane(2), lane(3)]
}

/// `Σ_j q_j·x_j` of one block as an 8-lane vector (lanes still to be summed): one
/// multiply and three FMAs, a chain within the block (the blocks in flight overlap).
///
/// # Panics
/// If `x.len() < 32`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn block_dot(q: [__m256; 4], x: &[f32]) -> __m256 {
    let p = _mm256_mul_ps(q[0], load(&x[0..]));
    let p = _mm256_fmadd_ps(q[1], load(&x[8..]), p);
    let p = _mm256_fmadd_ps(q[2], load(&x[16..]), p);
    _mm256_fmadd_ps(q[3], load(&x[24..]), p)
}

/// The two f16 values at `b[0..4]` widened with F16C: a block's `d` and (`Q4_1`) `m`.
/// Exact, as the `half` crate's conversion, without its per-call feature check.
///
/// # Panics
/// If `b.len() < 4`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scales(b: &[u8]) -> (f32, f32) {
    let bits = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

impl Block {
    /// The format whose discriminant is `b` (a const-generic kernel's parameter).
    const fn from_code(b: u8) -> Block {
        match b {
            0 => Block::Q8_0,
            1 => Block::Q4_0,
            _ => Block::Q4_1,
        }
    }

    /// Decode one stored block into `(lanes, d, m)`; `m = 0` except for `Q4_1` (the other
    /// formats' second f16 is quant bytes, ignored).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn decode(self, b: &[u8]) -> ([__m256; 4], f32, f32) {
        let (d, m) = scales(b);
        let m = if self == Block::Q4_1 { m } else { 0.0 };
        (self.lanes(b), d, m)
    }

    /// The quants of one stored block as four f32 vectors (its scales are read apart, by
    /// [`Block::decode`] or, four blocks at a time, [`quad_scales`]).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn lanes(self, b: &[u8]) -> [__m256; 4] {
        match self {
            Block::Q8_0 => q8_lanes(&b[2..]),
            Block::Q4_0 => q4_lanes::<8>(&b[2..]),
            Block::Q4_1 => q4_lanes::<0>(&b[4..]),
        }
    }

    /// Eight of a block's weights from their quants `lane` ([`Block::decode`]) and the
    /// block's `d` and `m` broadcast: `d·q`, then `+ m` for `Q4_1`, separately rounded —
    /// the scalar decoder's values, bit for bit. (Per lane, so that a kernel computes
    /// each weight vector where it uses it.)
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn weights(self, lane: __m256, dv: __m256, mv: __m256) -> __m256 {
        let w = _mm256_mul_ps(dv, lane);
        if self == Block::Q4_1 {
            _mm256_add_ps(w, mv)
        } else {
            w
        }
    }
}

/// The first four bytes of each of up to four blocks of `fmt` in `quad` (a block's `d`
/// and, for `Q4_1`, `m`; for the others `d` and two quant bytes), widened as f16 pairs
/// with F16C: `[d0, m0, d1, m1, d2, m2, d3, m3]`, zeros past the blocks `quad` holds.
///
/// # Panics
/// If `quad` holds more than four blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn quad_scales(fmt: Block, quad: &[u8]) -> __m256 {
    let bb = fmt.bytes();
    assert!(quad.len() <= 4 * bb);
    let head = |k: usize| -> i32 {
        match quad.get(k * bb..k * bb + 4) {
            Some(h) => i32::from_le_bytes([h[0], h[1], h[2], h[3]]),
            None => 0,
        }
    };
    _mm256_cvtph_ps(_mm_setr_epi32(head(0), head(1), head(2), head(3)))
}

/// `Σ_j w_j x_j` for one row of block format `Block::of(B)` (see the module docs).
///
/// The blocks go four at a time: their scales are converted together
/// ([`quad_scales`]), each block's `d` is a lane permute of that vector, and the `Q4_1`
/// offsets are one FMA per four blocks. Per block the loop is its quants' decode, one
/// multiply and three FMAs, and one FMA by `d`: 15 vector operations where a converted
/// scale per block, its broadcast and a scalar offset made 22. Measured on Zen 3
/// (`benches/kernels.rs`, `[576, 576]` `Q4_1`): 29.8 → 28.5 µs; SmolLM2 decode on one
/// thread 75–78 → 81 tok/s. Tried and slower: storing the converted scales and
/// broadcasting them back from the stack (a store-to-load round trip at each row's
/// start), and the four blocks as a loop (not unrolled: a branch per block).
///
/// # Panics
/// If `row` is not `x.len() / 32` blocks or (`Q4_1`) `sums2` is shorter than `2·blocks`
/// rounded up to a multiple of 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_blocks<const B: u8>(row: &[u8], x: &[f32], sums2: &[f32]) -> f32 {
    let fmt = Block::from_code(B);
    let bb = fmt.bytes();
    assert_eq!(row.len(), x.len() / QK * bb);
    // The lanes of each block's `d` in `quad_scales`' vector.
    let lanes = [0, 2, 4, 6].map(|k| _mm256_set1_epi32(k));
    // Two chains, even blocks and odd ones (consecutive blocks do not wait on each other).
    let (mut even, mut odd) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut offsets = _mm256_setzero_ps();
    let mut quads = row.chunks_exact(4 * bb).zip(x.chunks_exact(4 * QK));
    let mut g = 0;
    for (q, xq) in quads.by_ref() {
        let dm = quad_scales(fmt, q);
        if fmt == Block::Q4_1 {
            offsets = _mm256_fmadd_ps(dm, load(&sums2[8 * g..]), offsets);
        }
        let t0 = block_dot(fmt.lanes(&q[..bb]), &xq[..QK]);
        let t1 = block_dot(fmt.lanes(&q[bb..2 * bb]), &xq[QK..2 * QK]);
        let t2 = block_dot(fmt.lanes(&q[2 * bb..3 * bb]), &xq[2 * QK..3 * QK]);
        let t3 = block_dot(fmt.lanes(&q[3 * bb..]), &xq[3 * QK..]);
        even = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dm, lanes[0]), t0, even);
        odd = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dm, lanes[1]), t1, odd);
        even = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dm, lanes[2]), t2, even);
        odd = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dm, lanes[3]), t3, odd);
        g += 1;
    }
    let (q, xq) = (&row[4 * bb * g..], &x[4 * QK * g..]);
    if !q.is_empty() {
        let dm = quad_scales(fmt, q);
        if fmt == Block::Q4_1 {
            offsets = _mm256_fmadd_ps(dm, load(&sums2[8 * g..]), offsets);
        }
        let blocks = q.chunks_exact(bb).zip(xq.chunks_exact(QK));
        for (k, ((b, xb), lane)) in blocks.zip(lanes).enumerate() {
            let t = block_dot(fmt.lanes(b), xb);
            let d = _mm256_permutevar8x32_ps(dm, lane);
            if k % 2 == 0 {
                even = _mm256_fmadd_ps(d, t, even);
            } else {
                odd = _mm256_fmadd_ps(d, t, odd);
            }
        }
    }
    hsum(_mm256_add_ps(_mm256_add_ps(even, odd), offsets))
}

/// `y ← W x` for `w` of `fmt`, one row at a time ([`dot_blocks`]).
#[target_feature(enable = "avx2,fma,f16c")]
fn gemv_blocks(fmt: Block, w: &Weights<'_>, x: &[f32], sums: &[f32], y: &mut [f32]) {
    // `Q4_1`'s block sums at the odd lanes of pairs, as `quad_scales` converts each block's
    // `(d, m)`: one FMA per four blocks makes their offsets.
    let mut sums2 = Vec::new();
    if fmt == Block::Q4_1 {
        sums2.resize(2 * sums.len().next_multiple_of(4), 0.0);
        for (pair, &s) in sums2.chunks_exact_mut(2).zip(sums) {
            pair[1] = s;
        }
    }
    let sums = &sums2[..];
    let (data, rb) = (w.data(), w.row_bytes());
    for (i, (r, yr)) in data.chunks_exact(rb).zip(y.iter_mut()).enumerate() {
        prefetch_row(data, i + PREFETCH_ROWS, rb);
        *yr = match fmt {
            Block::Q8_0 => dot_blocks::<{ Block::Q8_0 as u8 }>(r, x, sums),
            Block::Q4_0 => dot_blocks::<{ Block::Q4_0 as u8 }>(r, x, sums),
            Block::Q4_1 => dot_blocks::<{ Block::Q4_1 as u8 }>(r, x, sums),
        };
    }
}

/// The most bytes of activations [`gemm_blocks`] takes: every row passes over all the
/// tokens, which must stay in L1 (32 KiB here). Measured (`[1536, 576]` Q4_1, 8 tokens,
/// 18 KiB): 14 % faster than decoded panels through `gemm_rows`; `[576, 1536]` (48 KiB),
/// 7 % slower, so wider ones take the panels.
const FUSED_X_BYTES: usize = 24 << 10;

/// [`FUSED_X_BYTES`] for the AVX-512F kernel, which decodes two rows' blocks per pass at
/// half the instructions: `[576, 1536]` Q4_1 (Q8_0) with 8 tokens, 48 KiB, took 117 (130)
/// µs straight from the blocks against 170 (162) through the decoded panels, and takes
/// 97–100 (99–101) µs since its activations are interleaved by token pairs
/// (`cargo bench --bench kernels -- gemm_few`, Zen 5, L1d 48 KiB).
const FUSED_X_BYTES_AVX512: usize = 48 << 10;

/// The most bytes of activations [`gemm_blocks`] takes, with the AVX-512F kernel
/// (`wide` is `Some`) or the AVX2 one.
fn fused_x_bytes(wide: Option<Avx512>) -> usize {
    match wide {
        Some(_) => FUSED_X_BYTES_AVX512,
        None => FUSED_X_BYTES,
    }
}

/// The few-token GEMM straight from the stored blocks of `Q8_0`, `Q4_0` or `Q4_1`
/// weights: `y[t·stride + r] ← w_r·x_t` for every row of `w` and token of `x: [n, cols]`
/// (`2 ≤ n ≤ 8`, at most [`fused_x_bytes`] of them), or `false` (nothing written) for
/// another format or other tokens; on the AVX-512F twin where `wide` is `Some`. Each
/// block is decoded once into registers (`d·q`, then `+ m`, as [`dequantize`] rounds
/// them) and multiplied into every token's chain, one 8-lane FMA chain per output over
/// the 8-weight chunks in order, its lanes summed by [`hsum`]: the operations
/// `dot::gemm_rows` runs on the decoded rows, so the same bits, without writing and
/// reading back a decoded panel. The row `PREFETCH_ROWS` ahead is prefetched as in
/// [`gemv`].
///
/// # Panics
/// If `x` is not `n` rows of `w.cols()` or `y` is too short.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn gemm_blocks(
    w: &Weights<'_>,
    x: &[f32],
    y: &mut [f32],
    stride: usize,
    wide: Option<Avx512>,
) -> bool {
    let fmt = match w.dtype() {
        DType::Q8_0 => Block::Q8_0,
        DType::Q4_0 => Block::Q4_0,
        DType::Q4_1 => Block::Q4_1,
        _ => return false,
    };
    let (rows, cols) = (w.rows(), w.cols());
    if cols == 0 || !x.len().is_multiple_of(cols) || 4 * x.len() > fused_x_bytes(wide) {
        return false;
    }
    if rows == 0 {
        return true;
    }
    if wide.is_some() && cols.is_multiple_of(QK) {
        // SAFETY: an `Avx512` exists only where the CPU has the features.
        unsafe {
            match x.len() / cols {
                2 => avx512::gemm_blocks_n::<2>(fmt, w, x, y, stride),
                3 => avx512::gemm_blocks_n::<3>(fmt, w, x, y, stride),
                4 => avx512::gemm_blocks_n::<4>(fmt, w, x, y, stride),
                5 => avx512::gemm_blocks_n::<5>(fmt, w, x, y, stride),
                6 => avx512::gemm_blocks_n::<6>(fmt, w, x, y, stride),
                7 => avx512::gemm_blocks_n::<7>(fmt, w, x, y, stride),
                8 => avx512::gemm_blocks_n::<8>(fmt, w, x, y, stride),
                _ => return false,
            }
        }
        return true;
    }
    gemm_blocks_avx2(fmt, w, x, y, stride)
}

/// [`gemm_blocks`] on the AVX2 kernel (`rows > 0`).
#[target_feature(enable = "avx2,fma,f16c")]
fn gemm_blocks_avx2(fmt: Block, w: &Weights<'_>, x: &[f32], y: &mut [f32], stride: usize) -> bool {
    match x.len() / w.cols() {
        2 => gemm_blocks_n::<2>(fmt, w, x, y, stride),
        3 => gemm_blocks_n::<3>(fmt, w, x, y, stride),
        4 => gemm_blocks_n::<4>(fmt, w, x, y, stride),
        5 => gemm_blocks_n::<5>(fmt, w, x, y, stride),
        6 => gemm_blocks_n::<6>(fmt, w, x, y, stride),
        7 => gemm_blocks_n::<7>(fmt, w, x, y, stride),
        8 => gemm_blocks_n::<8>(fmt, w, x, y, stride),
        _ => return false,
    }
    true
}

mod avx512;

/// [`gemm_blocks`] for `T` tokens.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn gemm_blocks_n<const T: usize>(
    fmt: Block,
    w: &Weights<'_>,
    x: &[f32],
    y: &mut [f32],
    stride: usize,
) {
    let (rows, cols, rb) = (w.rows(), w.cols(), w.row_bytes());
    assert!(x.len() == T * cols && y.len() >= (T - 1) * stride + rows);
    assert_eq!(rb, cols / QK * fmt.bytes());
    let xp = x.as_ptr();
    let data = w.data();
    for (r, row) in data.chunks_exact(rb).enumerate() {
        prefetch_row(data, r + PREFETCH_ROWS, rb);
        let mut acc = [_mm256_setzero_ps(); T];
        for (b, block) in row.chunks_exact(fmt.bytes()).enumerate() {
            let (q, d, m) = fmt.decode(block);
            let (dv, mv) = (_mm256_set1_ps(d), _mm256_set1_ps(m));
            for (l, lane) in q.into_iter().enumerate() {
                let wv = fmt.weights(lane, dv, mv);
                let c = b * QK + 8 * l;
                for (t, a) in acc.iter_mut().enumerate() {
                    // SAFETY: `x` is `T` rows of `cols` (asserted) and `c + 8 ≤ cols`
                    // (`row` holds `cols / 32` blocks); `loadu` has no alignment
                    // requirement.
                    let xv = unsafe { _mm256_loadu_ps(xp.add(t * cols + c)) };
                    *a = _mm256_fmadd_ps(wv, xv, *a);
                }
            }
        }
        for (t, a) in acc.into_iter().enumerate() {
            y[t * stride + r] = hsum(a);
        }
    }
}

// SAFETY (every `unsafe` block below): the callees need AVX2, FMA and F16C, which an
// `Avx2` value proves (`x86/mod.rs`); they check their slice lengths themselves.
impl Blocks for Avx2 {
    type Chunk = [__m256; 4];
    type Eight = [__m256; 1];

    #[inline(always)]
    fn widen8<const FMT: u8>(self, b: &[u8]) -> [__m256; 1] {
        [unsafe { widen8::<FMT>(b) }]
    }
    #[inline(always)]
    fn block(self, fmt: Block, b: &[u8]) -> ([__m256; 4], f32, f32) {
        unsafe { fmt.decode(b) }
    }
    #[inline(always)]
    fn chunk(self, fmt: Format, b: &[u8], c: usize) -> [__m256; 4] {
        unsafe { fmt.chunk(b, c) }
    }
    #[inline(always)]
    fn touch_row(self, data: &[u8], rb: usize, i: usize) {
        unsafe { prefetch_row(data, i + PREFETCH_ROWS, rb) }
    }
    #[inline(always)]
    fn touch_block(self, bytes: &[u8], at: usize) {
        // The bytes PREFETCH_ROWS · 128 ahead, as the GEMVs prefetch rows (`dot.rs`).
        if let Some(ahead) = bytes.get(at + PREFETCH_ROWS * 128) {
            unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(ahead).cast()) };
        }
    }
    #[inline(always)]
    fn gemv_blocks(self, fmt: Block, w: &Weights<'_>, x: &[f32], sums: &[f32], y: &mut [f32]) {
        unsafe { gemv_blocks(fmt, w, x, sums, y) }
    }
    #[inline(always)]
    fn abs_max(self, x: &[f32]) -> (bool, f32) {
        unsafe { super::q8::abs_max(x) }
    }
    #[inline(always)]
    fn quantize16(self, x: &[f32], factor: f32, q: &mut [i8]) -> i32 {
        unsafe { super::q8::quantize16(x, factor, q) }
    }
}

kformat::block_loops!(Avx2, #[target_feature(enable = "avx2,fma,f16c")]);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kformat::BlockLoops;
    use crate::x86::dot::gemm_rows;

    /// `gemm_blocks` bit for bit the decoded rows through `gemm_rows` (its docs' claim),
    /// on the AVX2 path and on the AVX-512F one (where the CPU has it), and the AVX2
    /// kernel itself, for each of its formats, every token count it takes, row counts
    /// around the prefetch distance (odd ones: the twin's last row alone); `false` and
    /// nothing written for one token, nine, or another format.
    #[test]
    fn gemm_blocks_is_the_decoded_rows_through_gemm_rows() {
        assert!(
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c"),
            "these tests need AVX2, FMA and F16C"
        );
        let mut paths = vec![None];
        paths.extend(crate::x86::avx512::detect_or_say("gemm_blocks on avx512").map(Some));
        for wide in paths {
            gemm_blocks_on(wide);
        }
    }

    /// The test on one path: the AVX2 kernels alone (`None`) or with their twins.
    fn gemm_blocks_on(wide: Option<Avx512>) {
        let avx2 = Avx2::detect().expect("AVX2, FMA and F16C");
        let val = |i: usize, salt: usize| ((i * 7919 + salt * 104_729) % 2001) as f32 / 700.0 - 1.4;
        for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0] {
            for (rows, cols) in [(1, 32), (4, 32), (5, 64), (6, 64), (11, 576), (3, 1536)] {
                let values: Vec<f32> = (0..rows * cols).map(|i| val(i, 1)).collect();
                let bytes = kvcore_scalar::quant::quantize_row(dtype, &values);
                let w = Weights::new(dtype, rows, cols, &bytes).expect("shape");
                let mut decoded = vec![0.0f32; rows * cols];
                // SAFETY (every block below): AVX2, FMA and F16C detected by the caller,
                // AVX-512F by whoever made `wide`.
                unsafe { avx2.run_dequantize(dtype, &bytes, &mut decoded) };
                for n in 1..=9 {
                    let x: Vec<f32> = (0..n * cols).map(|i| val(i, 2)).collect();
                    let stride = rows + 2;
                    let mut got = vec![f32::NAN; n * stride];
                    let done = unsafe { gemm_blocks(&w, &x, &mut got, stride, wide) };
                    let takes = (2..=8).contains(&n)
                        && dtype != DType::Q5_0
                        && 4 * n * cols <= fused_x_bytes(wide);
                    assert_eq!(done, takes, "{dtype} n {n} {wide:?}");
                    if !takes {
                        assert!(got.iter().all(|v| v.is_nan()), "{dtype} n {n} wrote");
                        continue;
                    }
                    let mut want = vec![f32::NAN; n * stride];
                    unsafe { gemm_rows(&decoded, &x, cols, &mut want, stride) };
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{dtype} [{rows}, {cols}] n {n} {wide:?}"
                    );
                    if wide.is_none() {
                        continue;
                    }
                    // The AVX2 kernel itself on what the AVX-512F path takes (activations
                    // up to its wider limit).
                    let fmt = match dtype {
                        DType::Q8_0 => Block::Q8_0,
                        DType::Q4_0 => Block::Q4_0,
                        _ => Block::Q4_1,
                    };
                    let mut avx2 = vec![f32::NAN; n * stride];
                    assert!(unsafe { gemm_blocks_avx2(fmt, &w, &x, &mut avx2, stride) });
                    assert_eq!(
                        bits(&avx2),
                        bits(&want),
                        "AVX2 {dtype} [{rows}, {cols}] n {n}"
                    );
                }
            }
        }
    }
}
