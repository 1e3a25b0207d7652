//! AVX-512F twin of [`super::gemm_blocks`]'s few-token kernel, **bit for bit** the AVX2
//! one. Two weight rows' blocks are decoded together at 512 bits (row `r` in the low
//! 256-bit half, row `r + 1` in the high one: the same integer widening, conversion, `d·q`
//! and `+ m` per weight as [`Block::lanes`] and [`Block::weights`]); each row's 8-weight
//! chunk is then copied into both halves and multiplied into one accumulator per token
//! pair, its low half the AVX2 kernel's 8-lane chain for the pair's first token and its
//! high half for the second, summed by the same [`hsum`]. The activations are first
//! interleaved by token pairs, so that every multiply-add reads two tokens' chunks with
//! one plain 512-bit load. An odd last row takes the AVX2 kernel. Used on the `avx512`
//! path (with an [`Avx512`](crate::x86::Avx512) token: the CPU has AVX-512F);
//! `super::tests` compares both kernels with the decoded rows through `gemm_rows`.
//!
//! An earlier layout held the two rows' chains in the halves of each accumulator, and
//! broadcast every token's chunk to both halves (`vbroadcastf64x4`, a load per token and
//! chunk, eight address registers): at 8 tokens it ran 12–21 % slower
//! (`cargo bench --bench kernels -- gemm_few`, Zen 5), and each format test stayed in
//! its inner loop.

use super::{Block, PREFETCH_ROWS, QK, Weights, hsum, prefetch_row};
use crate::x86::avx512::{high, low, pair};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// The two scales of blocks `a` and `b` (`d`, and `m` for `Q4_1`, else 0), each in its
/// row's half: exact F16C widening, as [`super::scales`].
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn pair_scales(fmt: Block, a: &[u8], b: &[u8]) -> (__m512, __m512) {
    let head = |x: &[u8]| i32::from_le_bytes([x[0], x[1], x[2], x[3]]);
    // [dA, mA, dB, mB] as f32.
    let v = _mm_cvtph_ps(_mm_setr_epi32(head(a), head(b), 0, 0));
    let spread = |i: i32, j: i32| {
        _mm512_permutexvar_ps(
            _mm512_setr_epi32(i, i, i, i, i, i, i, i, j, j, j, j, j, j, j, j),
            _mm512_castps128_ps512(v),
        )
    };
    let d = spread(0, 2);
    let m = match fmt {
        Block::Q4_1 => spread(1, 3),
        _ => _mm512_setzero_ps(),
    };
    (d, m)
}

/// The quants of blocks `a` and `b` (rows `r`, `r + 1`) as four vectors, lane `l` of each
/// block in its row's half: [`super::q4_lanes`] / [`super::q8_lanes`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn pair_lanes(fmt: Block, a: &[u8], b: &[u8]) -> [__m512; 4] {
    let f = |v: __m512i| _mm512_cvtepi32_ps(v);
    match fmt {
        Block::Q8_0 => {
            let (qa, qb) = (&a[2..34], &b[2..34]);
            let lane = |k: usize| {
                // SAFETY: bytes 8k..8k+8 ⊂ 0..32 of each block's quants (sliced above);
                // `loadl_epi64` reads 8 bytes with no alignment requirement.
                let v = unsafe {
                    _mm_unpacklo_epi64(
                        _mm_loadl_epi64(qa.as_ptr().add(8 * k).cast()),
                        _mm_loadl_epi64(qb.as_ptr().add(8 * k).cast()),
                    )
                };
                f(_mm512_cvtepi8_epi32(v))
            };
            [lane(0), lane(1), lane(2), lane(3)]
        }
        Block::Q4_0 | Block::Q4_1 => {
            let at = if fmt == Block::Q4_0 { 2 } else { 4 };
            let (qa, qb) = (&a[at..at + 16], &b[at..at + 16]);
            // SAFETY: 16 quant bytes of each block (sliced above); no alignment needed.
            let (va, vb) = unsafe {
                (
                    _mm_loadu_si128(qa.as_ptr().cast()),
                    _mm_loadu_si128(qb.as_ptr().cast()),
                )
            };
            // Bytes 0..8 of each row, and 8..16, widened.
            let lo = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(va, vb));
            let hi = _mm512_cvtepu8_epi32(_mm_unpackhi_epi64(va, vb));
            let mask = _mm512_set1_epi32(15);
            let off = _mm512_set1_epi32(if fmt == Block::Q4_0 { 8 } else { 0 });
            let g = |v: __m512i| f(_mm512_sub_epi32(v, off));
            [
                g(_mm512_and_si512(lo, mask)),
                g(_mm512_and_si512(hi, mask)),
                g(_mm512_srli_epi32::<4>(lo)),
                g(_mm512_srli_epi32::<4>(hi)),
            ]
        }
    }
}

/// [`super::gemm_blocks_n`]: `y[t·stride + r] ← w_r·x_t` for `T` tokens.
///
/// # Safety
/// The CPU has AVX-512F, AVX2, FMA and F16C ([`Avx512`](crate::x86::Avx512)).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn gemm_blocks_n<const T: usize>(
    fmt: Block,
    w: &Weights<'_>,
    x: &[f32],
    y: &mut [f32],
    stride: usize,
) {
    // One kernel per format, so that no format test stays in the inner loop.
    // SAFETY: the caller's contract.
    unsafe {
        match fmt {
            Block::Q8_0 => kernel::<T, { Block::Q8_0 as u8 }>(w, x, y, stride),
            Block::Q4_0 => kernel::<T, { Block::Q4_0 as u8 }>(w, x, y, stride),
            Block::Q4_1 => kernel::<T, { Block::Q4_1 as u8 }>(w, x, y, stride),
        }
    }
}

/// Token pairs of the interleaved activations: `T` tokens, an odd last one paired with
/// zeros.
const fn pairs(t: usize) -> usize {
    t.div_ceil(2)
}

thread_local! {
    /// This thread's interleaved activations ([`interleave`]), reused by every call.
    static XI: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `x: [T, cols]` interleaved by token pairs for [`kernel`] into `xi[..cols / 8 · p ·
/// 16]` (`p` pairs): for every 8-column chunk `k` and pair `p`, the 16 floats
/// `x[2p][8k..8k+8] ‖ x[2p+1][8k..8k+8]` (zeros for a missing odd token), chunks
/// outermost, so that one 512-bit load gives two tokens' activations against a weight
/// chunk held in both halves. Every float of the prefix is written.
///
/// # Panics
/// If `x.len() != T · cols` or `cols` is not a multiple of 8.
#[target_feature(enable = "avx512f,avx2")]
fn interleave<const T: usize>(x: &[f32], cols: usize, xi: &mut Vec<f32>) {
    assert!(x.len() == T * cols && cols.is_multiple_of(8));
    let p = pairs(T);
    let len = cols / 8 * p * 16;
    if xi.len() < len {
        xi.resize(len, 0.0);
    }
    let (src, dst) = (x.as_ptr(), xi.as_mut_ptr());
    for k in 0..cols / 8 {
        for tp in 0..p {
            let (t0, t1) = (2 * tp, 2 * tp + 1);
            // SAFETY: token `t < T` at chunk `k < cols / 8` lies in `x` (asserted), and
            // `(k·p + tp)·16 + 16 ≤ len ≤ xi.len()`; no alignment requirement.
            unsafe {
                let lo = _mm256_loadu_ps(src.add(t0 * cols + 8 * k));
                let hi = if t1 < T {
                    _mm256_loadu_ps(src.add(t1 * cols + 8 * k))
                } else {
                    _mm256_setzero_ps()
                };
                _mm512_storeu_ps(dst.add((k * p + tp) * 16), pair(lo, hi));
            }
        }
    }
}

/// [`gemm_blocks_n`] for format `F` ([`Block::from_code`]).
///
/// Two weight rows per pass, decoded together at 512 bits (row `r` in the low half, row
/// `r + 1` in the high one); each row's chunk is then copied into both halves
/// (`shuffle_f32x4`) and multiplied into one accumulator per token pair, whose low half
/// is the AVX2 kernel's 8-lane chain for the pair's first token and the high half for its
/// second. The activations come interleaved by token pairs ([`interleave`]), so each
/// multiply-add reads them with a plain load (no broadcast, one address register), and
/// the row's format is a constant.
///
/// # Safety
/// As [`gemm_blocks_n`].
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn kernel<const T: usize, const F: u8>(
    w: &Weights<'_>,
    x: &[f32],
    y: &mut [f32],
    stride: usize,
) {
    let fmt = Block::from_code(F);
    let (rows, cols, rb) = (w.rows(), w.cols(), w.row_bytes());
    assert!(x.len() == T * cols && y.len() >= (T - 1) * stride + rows);
    assert!(cols.is_multiple_of(QK) && rb == cols / QK * fmt.bytes());
    XI.with_borrow_mut(|xi| {
        interleave::<T>(x, cols, xi);
        // SAFETY: the caller's contract; `xi` holds the interleaved `x`.
        unsafe { rows_by_pairs::<T, F>(w, xi, y, stride) }
    });
    if rows % 2 == 1 {
        // The last row alone, on the AVX2 kernel.
        let last = rows - 1;
        let one = Weights::new(w.dtype(), 1, cols, &w.data()[last * rb..]).expect("one row");
        let mut out = [0.0f32; 8];
        super::gemm_blocks_n::<T>(fmt, &one, x, &mut out, 1);
        for (t, v) in out.iter().take(T).enumerate() {
            y[t * stride + last] = *v;
        }
    }
}

/// [`kernel`]'s rows two at a time (an odd last row is left), from the activations
/// interleaved by [`interleave`] into `xi`.
///
/// # Safety
/// As [`gemm_blocks_n`]; `xi` holds `w.cols() / 8 · ⌈T/2⌉ · 16` floats.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn rows_by_pairs<const T: usize, const F: u8>(
    w: &Weights<'_>,
    xi: &[f32],
    y: &mut [f32],
    stride: usize,
) {
    let fmt = Block::from_code(F);
    let (cols, rb) = (w.cols(), w.row_bytes());
    let p = pairs(T);
    assert!(xi.len() >= cols / 8 * p * 16);
    let (bb, xp, data) = (fmt.bytes(), xi.as_ptr(), w.data());
    for (pr, two) in data.chunks_exact(2 * rb).enumerate() {
        let r = 2 * pr;
        prefetch_row(data, r + PREFETCH_ROWS, rb);
        prefetch_row(data, r + 1 + PREFETCH_ROWS, rb);
        let (ra, rb_) = two.split_at(rb);
        // [row][token pair]; T ≤ 8, so at most 4 pairs.
        let mut acc = [[_mm512_setzero_ps(); 4]; 2];
        for (b, (a, bl)) in ra.chunks_exact(bb).zip(rb_.chunks_exact(bb)).enumerate() {
            let (d, m) = pair_scales(fmt, a, bl);
            let q = pair_lanes(fmt, a, bl);
            for (l, lane) in q.into_iter().enumerate() {
                let wv = match fmt {
                    Block::Q4_1 => _mm512_add_ps(_mm512_mul_ps(d, lane), m),
                    _ => _mm512_mul_ps(d, lane),
                };
                // Row r's chunk in both halves, and row r + 1's.
                let w0 = _mm512_shuffle_f32x4::<0x44>(wv, wv);
                let w1 = _mm512_shuffle_f32x4::<0xEE>(wv, wv);
                let k = b * (QK / 8) + l;
                // Indexed, not zipped: through `iter_mut` the accumulators lived in
                // memory and the kernel ran 3× slower.
                #[allow(clippy::needless_range_loop)]
                for tp in 0..p {
                    // SAFETY: `xi` holds `cols / 8 · p · 16` floats (`interleave`) and
                    // chunk `k < cols / 8`; `loadu` has no alignment requirement.
                    let xv = unsafe { _mm512_loadu_ps(xp.add((k * p + tp) * 16)) };
                    acc[0][tp] = _mm512_fmadd_ps(w0, xv, acc[0][tp]);
                    acc[1][tp] = _mm512_fmadd_ps(w1, xv, acc[1][tp]);
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            for (tp, a) in acc.iter().take(p).enumerate() {
                y[2 * tp * stride + r + i] = hsum(low(*a));
                if 2 * tp + 1 < T {
                    y[(2 * tp + 1) * stride + r + i] = hsum(high(*a));
                }
            }
        }
    }
}
