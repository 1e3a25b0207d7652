//! AVX-512F twin of [`super::gemm_blocks`]'s few-token kernel, **bit for bit** the AVX2
//! one: two tokens share a 512-bit accumulator, one in each 256-bit half, so a block's
//! weights (decoded by the same AVX2 code, then put in both halves) meet two tokens per
//! FMA. Each half is the AVX2 kernel's 8-lane chain for its token, summed by the same
//! [`hsum`]. Taken for 4, 6 or 8 tokens (2 ran slower) where the CPU has AVX-512F
//! ([`enabled`]); `super::tests` compares both with the decoded rows through `gemm_rows`.

use super::{Block, PREFETCH_ROWS, QK, Weights, hsum, prefetch_row};
use std::arch::x86_64::*;
use std::cell::RefCell;

pub(in crate::x86) use crate::x86::attn::avx512_enabled as enabled;

std::thread_local! {
    /// The tokens in pairs, chunk by chunk: `[x_{2i}[8k..8k+8], x_{2i+1}[8k..8k+8]]`.
    static PAIRS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `x` in both 256-bit halves.
#[inline]
#[target_feature(enable = "avx512f")]
fn both(x: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(x)))
}

/// The high 256-bit half of `x`.
#[inline]
#[target_feature(enable = "avx512f")]
fn high(x: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)))
}

/// [`super::gemm_blocks_n`] for an even `T`: `y[t·stride + r] ← w_r·x_t`.
///
/// # Safety
/// The CPU has AVX-512F, AVX2, FMA and F16C ([`enabled`]).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn gemm_blocks_n<const T: usize>(
    fmt: Block,
    w: &Weights<'_>,
    x: &[f32],
    y: &mut [f32],
    stride: usize,
) {
    let (rows, cols, rb) = (w.rows(), w.cols(), w.row_bytes());
    assert!(T.is_multiple_of(2) && T <= 8, "tokens in pairs");
    assert!(x.len() == T * cols && y.len() >= (T - 1) * stride + rows);
    assert!(cols.is_multiple_of(QK) && rb == cols / QK * fmt.bytes());
    PAIRS.with_borrow_mut(|xp| {
        xp.clear();
        for i in 0..T / 2 {
            let (a, b) = (&x[2 * i * cols..][..cols], &x[(2 * i + 1) * cols..][..cols]);
            for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
                xp.extend_from_slice(ca);
                xp.extend_from_slice(cb);
            }
        }
        let xp: &[f32] = xp;
        let data = w.data();
        for (r, row) in data.chunks_exact(rb).enumerate() {
            prefetch_row(data, r + PREFETCH_ROWS, rb);
            let mut acc = [_mm512_setzero_ps(); 4];
            for (b, block) in row.chunks_exact(fmt.bytes()).enumerate() {
                let (q, d, m) = fmt.decode(block);
                let (dv, mv) = (_mm256_set1_ps(d), _mm256_set1_ps(m));
                for (l, lane) in q.into_iter().enumerate() {
                    let wv = both(fmt.weights(lane, dv, mv));
                    let k = b * (QK / 8) + l;
                    for (i, a) in acc.iter_mut().take(T / 2).enumerate() {
                        // SAFETY: pair `i < T/2` holds `cols / 8` chunks of 16 floats and
                        // `k < cols / 8` (`row` holds `cols / 32` blocks of 4 chunks).
                        let xv =
                            unsafe { _mm512_loadu_ps(xp.as_ptr().add((i * cols / 8 + k) * 16)) };
                        *a = _mm512_fmadd_ps(wv, xv, *a);
                    }
                }
            }
            for (i, a) in acc.iter().take(T / 2).enumerate() {
                y[2 * i * stride + r] = hsum(_mm512_castps512_ps256(*a));
                y[(2 * i + 1) * stride + r] = hsum(high(*a));
            }
        }
    });
}
