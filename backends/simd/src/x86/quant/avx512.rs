//! AVX-512F twin of [`super::gemm_blocks`]'s few-token kernel, **bit for bit** the AVX2
//! one: two weight rows share each 512-bit register, row `r` in the low 256-bit half and
//! row `r + 1` in the high one, against each token's 8 activations in both halves. Both
//! rows' blocks are decoded together at 512 bits (the same integer widening, conversion,
//! `d·q` and `+ m` per weight as [`Block::lanes`] and [`Block::weights`]), and each
//! half of an accumulator is the AVX2 kernel's 8-lane chain for its row and token, summed
//! by the same [`hsum`]. An odd last row takes the AVX2 kernel. Used where the CPU has
//! AVX-512F ([`enabled`](crate::x86::avx512::enabled)); `super::tests` compares both
//! kernels with the decoded rows through `gemm_rows`.

use super::{Block, PREFETCH_ROWS, QK, Weights, hsum, prefetch_row};
use crate::x86::avx512::{high, low};
use std::arch::x86_64::*;

/// Eight f32 from `p` in both 256-bit halves (a broadcast load).
///
/// # Safety
/// `p .. p + 8` is readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn both8(p: *const f32) -> __m512 {
    // SAFETY: 8 floats readable (the caller's contract); no alignment requirement.
    unsafe { _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(p.cast()))) }
}

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
/// The CPU has AVX-512F, AVX2, FMA and F16C ([`enabled`](crate::x86::avx512::enabled)).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn gemm_blocks_n<const T: usize>(
    fmt: Block,
    w: &Weights<'_>,
    x: &[f32],
    y: &mut [f32],
    stride: usize,
) {
    let (rows, cols, rb) = (w.rows(), w.cols(), w.row_bytes());
    assert!(x.len() == T * cols && y.len() >= (T - 1) * stride + rows);
    assert!(cols.is_multiple_of(QK) && rb == cols / QK * fmt.bytes());
    let (bb, xp, data) = (fmt.bytes(), x.as_ptr(), w.data());
    for (p, two) in data.chunks_exact(2 * rb).enumerate() {
        let r = 2 * p;
        prefetch_row(data, r + PREFETCH_ROWS, rb);
        prefetch_row(data, r + 1 + PREFETCH_ROWS, rb);
        let (ra, rb_) = two.split_at(rb);
        let mut acc = [_mm512_setzero_ps(); T];
        for (b, (a, bl)) in ra.chunks_exact(bb).zip(rb_.chunks_exact(bb)).enumerate() {
            let (d, m) = pair_scales(fmt, a, bl);
            let q = pair_lanes(fmt, a, bl);
            for (l, lane) in q.into_iter().enumerate() {
                let wv = match fmt {
                    Block::Q4_1 => _mm512_add_ps(_mm512_mul_ps(d, lane), m),
                    _ => _mm512_mul_ps(d, lane),
                };
                let c = b * QK + 8 * l;
                for (t, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: `x` is `T` rows of `cols` (asserted) and `c + 8 ≤ cols`.
                    let xv = unsafe { both8(xp.add(t * cols + c)) };
                    *acc = _mm512_fmadd_ps(wv, xv, *acc);
                }
            }
        }
        for (t, a) in acc.iter().enumerate() {
            y[t * stride + r] = hsum(low(*a));
            y[t * stride + r + 1] = hsum(high(*a));
        }
    }
    if rows % 2 == 1 {
        // The last row alone, on the AVX2 kernel.
        let last = rows - 1;
        let one = Weights::new(w.dtype(), 1, cols, &data[last * rb..]).expect("one row");
        let mut out = [0.0f32; 8];
        super::gemm_blocks_n::<T>(fmt, &one, x, &mut out, 1);
        for (t, v) in out.iter().take(T).enumerate() {
            y[t * stride + last] = *v;
        }
    }
}
