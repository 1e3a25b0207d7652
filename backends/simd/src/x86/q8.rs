//! AVX2 kernels for 8-bit activations (`kvcore::backend::q8` has the numerics).
//!
//! - the quantiser's microkernels (`kformat::quantize` has its loop): `abs_max` by
//!   `vmaxps`, and `quantize16`: the products in f32, `vcvtps2dq` (round to nearest, ties
//!   to even, under the default MXCSR), `min(·, 127)`, saturating packs to bytes (no value
//!   saturates: `|q| ≤ 127`) and the sum `Σq` in i32.
//! - `gemv` of the 32-weight formats (`Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`; the K formats are
//!   `dot_q4_k` and `dot_q6_k`, each documented there): per row, per block: the 32
//!   weight quants in one 256-bit register (`Q4_*`, `Q5_0` with its fifth bits OR-ed in:
//!   the 16 packed bytes, low nibbles in the low half and high nibbles in the high half,
//!   matching activations `0..16, 16..32`; `Q8_0`: the 32 bytes), against the 32
//!   activation bytes with `vpmaddubsw` (unsigned × signed bytes, pairs summed to i16:
//!   at most `2·128·127 = 32512`, so it never saturates; `Q8_0`'s signed weights go in
//!   as `|w|` with the sign moved onto the activation, `vpsignb`) and `vpmaddwd` by ones
//!   (i32, 8 lanes, exact). The lanes are converted to f32 (exact) and accumulated with
//!   one FMA by `d_w·d_a` into a single 8-lane accumulator; the offset term
//!   `m·(d_a·s)` (`m = −8·d_w` for `Q4_0`) is summed in order in one lane. For `Q4_*` one
//!   4-lane multiply of the block's f16 `[d_w, m]` by the activation block's
//!   `[d_a, d_a·s]` (`Q8Acts::scale_pairs`, derived once per quantisation) gives both
//!   `d_w·d_a` and the offset term (fewer scalar operations per block than computing them
//!   one by one; same roundings). At the end the lanes are summed and the offsets added. Against the reference (each term exact,
//!   summed in f64) only the rounding of `d_w·d_a`, the FMAs and the final sums differ.
//!
//! One accumulator is faster here than two: the loop is bound by the loads and the
//! integer ports, not by the FMA latency (measured: a two-accumulator version ran at
//! 0.75× on `[1536, 576]` `Q4_1`).

use super::dot::{PREFETCH_ROWS, hsum, load, prefetch_row, store};
use super::kquant::f16_at;
use crate::kformat::gemv_start;
use kvcore::backend::{DType, Q8Acts, Q8Layout, QK, Weights, q4_k_scale_min};
use std::arch::x86_64::*;

/// The largest of the 8 lanes of `v` (no NaN lanes).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// The sum of the 8 i32 lanes of `v` (exact: the callers' sums are far from overflow).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    _mm_cvtsi128_si32(s)
}

/// Whether none of `x` (a multiple of 8 values) is NaN or infinite, and the largest `|x|`
/// (`vmaxps`: exact; only meaningful when none is).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn abs_max(x: &[f32]) -> (bool, f32) {
    let sign = _mm256_set1_ps(-0.0);
    let inf = _mm256_set1_ps(f32::INFINITY);
    let (mut bad, mut amax) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for c in x.chunks_exact(8) {
        let a = _mm256_andnot_ps(sign, load(c));
        // |x| ≥ inf, or unordered (NaN).
        bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NLT_UQ>(a, inf));
        amax = _mm256_max_ps(amax, a);
    }
    (_mm256_movemask_ps(bad) == 0, hmax(amax))
}

/// `q[0..16] ← min(round(x_j·factor), 127)`: the products in f32, `vcvtps2dq` (to nearest,
/// ties to even, under the default MXCSR), packed to bytes with saturating packs (no
/// value saturates: `|q| ≤ 127`); returns `Σ q_j`.
///
/// # Panics
/// If `x` or `q` holds fewer than 16 values.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn quantize16(x: &[f32], factor: f32, q: &mut [i8]) -> i32 {
    assert!(q.len() >= 16);
    let (f, cap) = (_mm256_set1_ps(factor), _mm256_set1_epi32(127));
    let i = [&x[..8], &x[8..16]]
        .map(|c| _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(load(c), f)), cap));
    let half =
        |v: __m256i| _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let p = _mm_packs_epi16(half(i[0]), half(i[1]));
    // SAFETY: `q` holds at least 16 bytes (asserted); `storeu` has no alignment
    // requirement.
    unsafe { _mm_storeu_si128(q.as_mut_ptr().cast(), p) };
    hsum_i32(_mm256_add_epi32(i[0], i[1]))
}

/// The 32 bytes `16·bit_j` for bits `j = 0..32` of `qh` (a `Q5_0` block's fifth bits),
/// byte `j` in lane `j`: each byte of `qh` broadcast to 8 lanes, tested against its bit.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn fifth_bits(qh: u32) -> __m256i {
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), spread);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bits), bits);
    _mm256_and_si256(set, _mm256_set1_epi8(16))
}

/// The format `dot_nibbles_n::<FMT, N>` reads.
const fn nibble_format(fmt: u8) -> DType {
    match fmt {
        0 => DType::Q4_0,
        1 => DType::Q4_1,
        _ => DType::Q5_0,
    }
}

/// One row of `Q4_K` against `Q8_K` activations `x` (module docs), per super-block:
/// each pair of sub-blocks `2g, 2g + 1` shares 32 packed bytes (low and high nibbles);
/// `vpmaddubsw` against the 32 activation bytes of each, then `vpmaddwd` by the
/// sub-block's 6-bit scale (i32: at most `2·(2·15·127)·63` per lane and step, `3.9e6`
/// per lane over the super-block, so the lanes convert to f32 exactly). One FMA by
/// `d·d_a` per super-block; the minimums' integer `Σ_t m_t·(s_2t + s_2t+1)` in scalar
/// i32 (exact, below `2^21`), times `dmin·d_a`, summed in a scalar and subtracted at the
/// end.
///
/// # Panics
/// If `row` is not `x.len() / 256` super-blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q4_k(row: &[u8], x: &Q8Acts) -> f32 {
    let (bytes, block) = (DType::Q4_K.block_bytes(), Q8Layout::Q8_K.block_len());
    let per = block / Q8Layout::Q8_K.sum_len();
    assert_eq!(row.len(), x.scales().len() * bytes);
    assert_eq!(x.sums().len(), x.scales().len() * per);
    let mask = _mm256_set1_epi8(15);
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    let blocks = row
        .chunks_exact(bytes)
        .zip(x.values().chunks_exact(block))
        .zip(x.scales().iter().zip(x.sums().chunks_exact(per)));
    for ((b, a), (&da, s)) in blocks {
        assert!(b.len() == 144 && a.len() == 256 && s.len() == 16);
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let mut sumi = _mm256_setzero_si256();
        let mut m_int = 0i32;
        for g in 0..4 {
            let (sc0, m0) = q4_k_scale_min(&b[4..16], 2 * g);
            let (sc1, m1) = q4_k_scale_min(&b[4..16], 2 * g + 1);
            // SAFETY: bytes `16 + 32g .. 48 + 32g ≤ 144` of the block and activation bytes
            // `64g .. 64g + 64 ≤ 256` are in bounds (asserted); `loadu` has no alignment
            // requirement.
            let (packed, a0, a1) = unsafe {
                (
                    _mm256_loadu_si256(b.as_ptr().add(16 + 32 * g).cast()),
                    _mm256_loadu_si256(a.as_ptr().add(64 * g).cast()),
                    _mm256_loadu_si256(a.as_ptr().add(64 * g + 32).cast()),
                )
            };
            let lo = _mm256_and_si256(packed, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), mask);
            let p0 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(lo, a0),
                _mm256_set1_epi16(i16::from(sc0)),
            );
            let p1 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(hi, a1),
                _mm256_set1_epi16(i16::from(sc1)),
            );
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
            m_int += i32::from(m0) * (s[4 * g] + s[4 * g + 1])
                + i32::from(m1) * (s[4 * g + 2] + s[4 * g + 3]);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * da), _mm256_cvtepi32_ps(sumi), acc);
        mins += (dmin * da) * m_int as f32;
    }
    hsum(acc) - mins
}

/// One row of `Q6_K` against `Q8_K` activations `x` (module docs), per super-block: chunk
/// `c` (32 weights) is quarter `k = c mod 4` of half `n = c / 4` (the layout of
/// `kvcore_scalar::quant`): nibble `k / 2` of `ql[64n + 32·(k mod 2)..]` and bits
/// `2k, 2k + 1` of `qh[32n..]`, minus 32, as signed bytes `w ∈ −32..32`; `vpmaddubsw` of
/// `|w|` against the activations with `w`'s sign (pairs at most `2·32·127`), then
/// `vpmaddwd` by the two 16-weight scales of the chunk (low and high 128-bit half). The i32
/// lanes reach at most `8·2·(2·32·127)·127 < 2^24` over the super-block, so they convert to
/// f32 exactly; one FMA by `d·d_a` per super-block.
///
/// # Panics
/// If `row` is not `x.len() / 256` super-blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q6_k(row: &[u8], x: &Q8Acts) -> f32 {
    let (bytes, block) = (DType::Q6_K.block_bytes(), Q8Layout::Q8_K.block_len());
    assert_eq!(row.len(), x.scales().len() * bytes);
    let (m15, m3, m32) = (
        _mm256_set1_epi8(15),
        _mm256_set1_epi8(3),
        _mm256_set1_epi8(32),
    );
    let mut acc = _mm256_setzero_ps();
    let blocks = row
        .chunks_exact(bytes)
        .zip(x.values().chunks_exact(block))
        .zip(x.scales());
    for ((b, a), &da) in blocks {
        assert!(b.len() == 210 && a.len() == 256);
        let d = f16_at(b, 208);
        let mut sumi = _mm256_setzero_si256();
        for c in 0..8 {
            let (n, k) = (c / 4, c % 4);
            // SAFETY: `ql` bytes `64n + 32·(k mod 2) + 0..32 < 128`, `qh` bytes
            // `128 + 32n + 0..32 ≤ 192` and activation bytes `32c .. 32c + 32 ≤ 256` are in
            // bounds (asserted); `loadu` has no alignment requirement.
            let (low, high, av) = unsafe {
                (
                    _mm256_loadu_si256(b.as_ptr().add(64 * n + 32 * (k % 2)).cast()),
                    _mm256_loadu_si256(b.as_ptr().add(128 + 32 * n).cast()),
                    _mm256_loadu_si256(a.as_ptr().add(32 * c).cast()),
                )
            };
            let l = _mm256_and_si256(
                _mm256_srl_epi16(low, _mm_cvtsi32_si128(4 * (k / 2) as i32)),
                m15,
            );
            let h = _mm256_and_si256(_mm256_srl_epi16(high, _mm_cvtsi32_si128(2 * k as i32)), m3);
            let w = _mm256_sub_epi8(_mm256_or_si256(l, _mm256_slli_epi16::<4>(h)), m32);
            let p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(av, w));
            let (s0, s1) = (b[192 + 2 * c] as i8, b[193 + 2 * c] as i8);
            let sc = _mm256_set_m128i(_mm_set1_epi16(i16::from(s1)), _mm_set1_epi16(i16::from(s0)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sc));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * da), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

/// `y ← W x̂` for a block-format `w`.
///
/// # Panics
/// If the shapes do not fit (`x: [cols]`, `y: [rows]`) or `w` is a plain format.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn gemv(w: &Weights<'_>, x: &Q8Acts, y: &mut [f32]) {
    let Some(rb) = gemv_start(w, x.len(), y) else {
        return;
    };
    let dtype = w.dtype();
    assert!(
        kvcore::backend::q8::supports(dtype),
        "no q8 GEMV for {dtype}"
    );
    if !matches!(dtype, DType::Q4_K | DType::Q6_K) {
        // The 32-weight formats: the grouped kernels with a group of one.
        let rows = y.len();
        return group::<1>(w, std::slice::from_ref(x), y, rows);
    }
    // Plain loops (not closures) so the row kernels inline under this target feature.
    let data = w.data();
    for (i, (r, yr)) in data.chunks_exact(rb).zip(y.iter_mut()).enumerate() {
        prefetch_row(data, i + PREFETCH_ROWS, rb);
        *yr = if dtype == DType::Q4_K {
            dot_q4_k(r, x)
        } else {
            dot_q6_k(r, x)
        };
    }
}

/// Where a nibble format's quants start in its block, and the factor on its offset
/// term (`Q4_1`: its `m`, applied as is; `Q4_0`, `Q5_0`: `−8`, `−16` times `d_w`).
const fn nibble_layout(dtype: DType) -> (usize, f32) {
    match dtype {
        DType::Q4_1 => (4, 1.0),
        DType::Q5_0 => (6, -16.0),
        _ => (2, -8.0),
    }
}

/// A nibble block's 32 unsigned weights in one register (module docs): the 16 packed
/// bytes at `qs`, low nibbles in the low half and high nibbles in the high half (`mask`
/// = 15 in every byte), `Q5_0`'s fifth bits OR-ed in as `16·bit`.
///
/// # Safety
/// `b` holds at least `qs + 16` bytes (the callers assert `block_bytes ≥ qs + 16` once
/// per row, so the loop carries no bounds check), and the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_weights(dtype: DType, b: &[u8], qs: usize, mask: __m256i) -> __m256i {
    // SAFETY: bytes `qs .. qs + 16` of `b` are in bounds (the contract); `loadu` has no
    // alignment requirement.
    let packed = unsafe { _mm_loadu_si128(b.as_ptr().add(qs).cast()) };
    let w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed), mask);
    if dtype == DType::Q5_0 {
        _mm256_or_si256(w, fifth_bits(u32::from_le_bytes([b[2], b[3], b[4], b[5]])))
    } else {
        w
    }
}

/// The activations of `N` tokens as [`dot_nibbles_n`] and [`dot_q8_0_n`] read them:
/// per token its bytes, block scales and `[d_a, d_a·s]` pairs, lengths checked once for
/// a whole GEMV (`blocks` blocks of 32).
struct Tokens<'a, const N: usize> {
    values: [&'a [i8]; N],
    scales: [&'a [f32]; N],
    pairs: [&'a [f32]; N],
}

impl<'a, const N: usize> Tokens<'a, N> {
    /// # Panics
    /// If a token is not `blocks` blocks of 32 (or lacks its pairs, for `pairs`).
    fn new(x: &'a [Q8Acts], blocks: usize, pairs: bool) -> Self {
        assert_eq!(x.len(), N);
        for xt in x {
            assert_eq!(xt.values().len(), blocks * QK);
            assert_eq!(xt.scales().len(), blocks);
            if pairs {
                assert_eq!(xt.scale_pairs().len(), 2 * blocks);
            }
        }
        Tokens {
            values: std::array::from_fn(|t| x[t].values()),
            scales: std::array::from_fn(|t| x[t].scales()),
            pairs: std::array::from_fn(|t| x[t].scale_pairs()),
        }
    }
}

/// One row of a 32-weight nibble format against each of `N` tokens (module docs): `Q4_0`, `Q4_1` or
/// `Q5_0` (`FMT` is its `DType` as `u8`, see [`nibble_format`]).
///
/// Per block, the f16 `[d_w, m]` (`Q4_0`, `Q5_0`: `[d_w, d_w]`) times the activation
/// block's `[d_a, d_a·s]` (`Q8Acts::scale_pairs`) in one 4-lane multiply: lane 0 is
/// `d_w·d_a` (broadcast for the FMA), lane 1 the offset term (`Q4_0`, `Q5_0`: without
/// its `−8` or `−16`, applied to the sum), accumulated in lane 1 of a vector (the same
/// sequential f32 sum as a scalar). `Q5_0`'s fifth bits are OR-ed into the nibbles as
/// `16·bit` bytes, so the unsigned weights `0..32` meet `vpmaddubsw` as `Q4_*`'s do (pair
/// sums at most `2·31·127`).
///
/// Each block's scales and nibbles are decoded once for all `N` tokens; each token's
/// arithmetic is the same whatever `N` (the same products, FMAs and sums in its order),
/// so `out[t]` is bit for bit the one-token result (`N = 1`, what `gemv` runs).
///
/// # Panics
/// If `row` is not as many blocks as `x` holds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_nibbles_n<const FMT: u8, const N: usize>(row: &[u8], x: &Tokens<'_, N>) -> [f32; N] {
    let dtype = nibble_format(FMT);
    let bytes = dtype.block_bytes();
    let (qs, offset) = nibble_layout(dtype);
    let nb = row.len() / bytes;
    assert!(row.len() == nb * bytes && bytes >= qs + 16);
    for t in 0..N {
        assert!(x.values[t].len() == nb * QK && x.pairs[t].len() == 2 * nb);
    }
    let mask = _mm256_set1_epi8(15);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut offsets = [_mm_setzero_ps(); N];
    for (j, b) in row.chunks_exact(bytes).enumerate() {
        let bits = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
        let dm = if dtype == DType::Q4_1 {
            dm
        } else {
            _mm_moveldup_ps(dm)
        };
        // SAFETY: `b` is one block of `bytes >= qs + 16` bytes (asserted); AVX2 is enabled.
        let w = unsafe { block_weights(dtype, b, qs, mask) };
        for t in 0..N {
            // SAFETY: `j < nb`, and every token holds `nb · 32` bytes and `2 · nb`
            // factors (asserted), so bytes `32j .. 32j + 32` and factors `2j, 2j + 1` are
            // in bounds; `loadu`/`load_sd` have no alignment requirement.
            let (a, fv) = unsafe {
                (
                    _mm256_loadu_si256(x.values[t].as_ptr().add(j * QK).cast()),
                    _mm_castpd_ps(_mm_load_sd(x.pairs[t].as_ptr().add(2 * j).cast())),
                )
            };
            let tt = _mm_mul_ps(dm, fv);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones);
            acc[t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(tt), _mm256_cvtepi32_ps(p), acc[t]);
            offsets[t] = _mm_add_ps(offsets[t], tt);
        }
    }
    let mut out = [0.0f32; N];
    for t in 0..N {
        let o = _mm_cvtss_f32(_mm_movehdup_ps(offsets[t]));
        out[t] = hsum(acc[t]) + offset * o;
    }
    out
}

/// One row of `Q8_0` against each of `N` tokens (module docs), each block's scale and
/// `|w|` decoded once; `out[t]` is bit for bit the one-token result (the same operations
/// per token whatever `N`).
///
/// # Panics
/// If `row` is not as many blocks as `x` holds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q8_0_n<const N: usize>(row: &[u8], x: &Tokens<'_, N>) -> [f32; N] {
    let nb = row.len() / 34;
    assert_eq!(row.len(), nb * 34);
    for t in 0..N {
        assert!(x.values[t].len() == nb * QK && x.scales[t].len() == nb);
    }
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    for (j, b) in row.chunks_exact(34).enumerate() {
        let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
            u16::from_le_bytes([b[0], b[1]]),
        ))));
        // SAFETY: bytes `2..34` of the 34-byte block are in bounds; `loadu` has no
        // alignment requirement.
        let w = unsafe { _mm256_loadu_si256(b.as_ptr().add(2).cast()) };
        let aw = _mm256_abs_epi8(w);
        for (t, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `j < nb` and every token holds `nb · 32` bytes and `nb` scales
            // (asserted).
            let (a, da) = unsafe {
                (
                    _mm256_loadu_si256(x.values[t].as_ptr().add(j * QK).cast()),
                    *x.scales[t].get_unchecked(j),
                )
            };
            let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w));
            let p = _mm256_madd_epi16(p, ones);
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), _mm256_cvtepi32_ps(p), *acc);
        }
    }
    let mut out = [0.0f32; N];
    for (o, a) in out.iter_mut().zip(acc) {
        *o = hsum(a);
    }
    out
}

/// Blocks of 32 a row may hold for [`dot_nibbles_8`] and [`dot_q8_0_8`] (their factor
/// tables live on the stack): 2048 columns, the widest matrix input of SmolLM2 (1536) and
/// Gemma 3 270M (2048). Wider rows take groups of 4.
const MAX_BLOCKS_8: usize = 64;

/// Eight tokens as [`dot_nibbles_8`] and [`dot_q8_0_8`] read them: per token its bytes,
/// and per block the 8 tokens' factors side by side (lane `t` = token `t`), so a block's
/// `d_w·d_a` and offset terms of all 8 tokens are two vector multiplies.
struct Tokens8<'a> {
    values: [&'a [i8]; 8],
    /// `d_a` of token `t`, block `j`: `da[j][t]` (`Q4_*`, `Q5_0`: lane 0 of its pair).
    da: [[f32; 8]; MAX_BLOCKS_8],
    /// `d_a·s` (lane 1 of the pair; unused for `Q8_0`).
    ds: [[f32; 8]; MAX_BLOCKS_8],
}

impl<'a> Tokens8<'a> {
    /// # Panics
    /// If `x` is not 8 tokens of `blocks ≤ MAX_BLOCKS_8` blocks of 32 (with their pairs,
    /// for `pairs`).
    fn new(x: &'a [Q8Acts], blocks: usize, pairs: bool) -> Self {
        assert!(x.len() == 8 && blocks <= MAX_BLOCKS_8);
        let mut t8 = Tokens8 {
            values: std::array::from_fn(|t| x[t].values()),
            da: [[0.0; 8]; MAX_BLOCKS_8],
            ds: [[0.0; 8]; MAX_BLOCKS_8],
        };
        for (t, xt) in x.iter().enumerate() {
            assert!(xt.values().len() == blocks * QK && xt.scales().len() == blocks);
            if pairs {
                let fp = xt.scale_pairs();
                assert_eq!(fp.len(), 2 * blocks);
                for j in 0..blocks {
                    t8.da[j][t] = fp[2 * j];
                    t8.ds[j][t] = fp[2 * j + 1];
                }
            } else {
                for (j, &d) in xt.scales().iter().enumerate() {
                    t8.da[j][t] = d;
                }
            }
        }
        t8
    }
}

/// [`dot_nibbles_n`] of 8 tokens, bit for bit: each block's `d_w·d_a` and offset terms
/// for the 8 tokens come from two 8-lane multiplies (the same products as the 4-lane
/// one per token there), the offsets summed in one vector (lane `t` the same sequential
/// sum as token `t`'s), and each token's FMA takes its factor by a broadcast load. Fewer
/// operations per token and block than the generic kernel, and the row's blocks decoded
/// once for all 8 (two groups of 4 read the weights twice).
///
/// # Panics
/// If `row` is not as many blocks as `x` holds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_nibbles_8<const FMT: u8>(row: &[u8], x: &Tokens8<'_>) -> [f32; 8] {
    let dtype = nibble_format(FMT);
    let bytes = dtype.block_bytes();
    let (qs, offset) = nibble_layout(dtype);
    let nb = row.len() / bytes;
    assert!(row.len() == nb * bytes && bytes >= qs + 16 && nb <= MAX_BLOCKS_8);
    for v in x.values {
        assert!(v.len() == nb * QK);
    }
    let mask = _mm256_set1_epi8(15);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut offsets = _mm256_setzero_ps();
    let mut f = [0.0f32; 8];
    for (j, b) in row.chunks_exact(bytes).enumerate() {
        let bits = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
        let dw = _mm256_broadcastss_ps(dm);
        let m = if dtype == DType::Q4_1 {
            _mm256_broadcastss_ps(_mm_movehdup_ps(dm))
        } else {
            dw
        };
        store(&mut f, _mm256_mul_ps(dw, load(&x.da[j])));
        offsets = _mm256_add_ps(offsets, _mm256_mul_ps(m, load(&x.ds[j])));
        // SAFETY: `b` is one block of `bytes >= qs + 16` bytes (asserted); AVX2 is enabled.
        let w = unsafe { block_weights(dtype, b, qs, mask) };
        for t in 0..8 {
            // SAFETY: `j < nb` and every token holds `nb · 32` bytes (asserted), so
            // bytes `32j .. 32j + 32` are in bounds; `loadu` has no alignment requirement.
            let a = unsafe { _mm256_loadu_si256(x.values[t].as_ptr().add(j * QK).cast()) };
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(f[t]), _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
    let mut o = [0.0f32; 8];
    store(&mut o, offsets);
    std::array::from_fn(|t| hsum(acc[t]) + offset * o[t])
}

/// [`dot_q8_0_n`] of 8 tokens, bit for bit: each block's `d_w·d_a` for the 8 tokens in
/// one 8-lane multiply, each token's FMA taking its factor by a broadcast load.
///
/// # Panics
/// If `row` is not as many blocks as `x` holds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q8_0_8(row: &[u8], x: &Tokens8<'_>) -> [f32; 8] {
    let nb = row.len() / 34;
    assert!(row.len() == nb * 34 && nb <= MAX_BLOCKS_8);
    for v in x.values {
        assert!(v.len() == nb * QK);
    }
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut f = [0.0f32; 8];
    for (j, b) in row.chunks_exact(34).enumerate() {
        let dw = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
            u16::from_le_bytes([b[0], b[1]]),
        ))));
        store(&mut f, _mm256_mul_ps(dw, load(&x.da[j])));
        // SAFETY: bytes `2..34` of the 34-byte block are in bounds; `loadu` has no
        // alignment requirement.
        let w = unsafe { _mm256_loadu_si256(b.as_ptr().add(2).cast()) };
        let aw = _mm256_abs_epi8(w);
        for (t, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `j < nb` and every token holds `nb · 32` bytes (asserted).
            let a = unsafe { _mm256_loadu_si256(x.values[t].as_ptr().add(j * QK).cast()) };
            let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w));
            let p = _mm256_madd_epi16(p, ones);
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(f[t]), _mm256_cvtepi32_ps(p), *acc);
        }
    }
    std::array::from_fn(|t| hsum(acc[t]))
}

/// [`gemv_tokens`] of exactly 8 tokens of a 32-weight format of at most
/// [`MAX_BLOCKS_8`] blocks a row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn group8(w: &Weights<'_>, x: &[Q8Acts], y: &mut [f32], stride: usize) {
    let dtype = w.dtype();
    let xs = Tokens8::new(x, w.cols() / QK, dtype != DType::Q8_0);
    let (data, rb) = (w.data(), w.row_bytes());
    for (r, row) in data.chunks_exact(rb).enumerate() {
        prefetch_row(data, r + PREFETCH_ROWS, rb);
        let out = match dtype {
            DType::Q4_0 => dot_nibbles_8::<0>(row, &xs),
            DType::Q4_1 => dot_nibbles_8::<1>(row, &xs),
            DType::Q5_0 => dot_nibbles_8::<2>(row, &xs),
            _ => dot_q8_0_8(row, &xs),
        };
        for (t, v) in out.into_iter().enumerate() {
            y[t * stride + r] = v;
        }
    }
}

/// `y[t·stride ..][..rows] ← W x̂_t` for every token of `x`, each bit for bit [`gemv`] of
/// that token: the 32-weight formats decode each row's blocks once per group of 8 (rows of
/// at most [`MAX_BLOCKS_8`] blocks; [`dot_nibbles_8`], [`dot_q8_0_8`]), then 4, 2, 1 tokens
/// ([`dot_nibbles_n`], [`dot_q8_0_n`]); the K formats run [`gemv`] per
/// token.
///
/// # Panics
/// If the shapes do not fit or `w` is a plain format.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn gemv_tokens(w: &Weights<'_>, x: &[Q8Acts], y: &mut [f32], stride: usize) {
    let rows = w.rows();
    if x.is_empty() {
        return;
    }
    assert!(stride >= rows && y.len() >= (x.len() - 1) * stride + rows);
    let grouped = matches!(
        w.dtype(),
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q8_0
    );
    let mut t0 = 0;
    if grouped && w.row_bytes() > 0 {
        if w.cols() / QK <= MAX_BLOCKS_8 {
            while x.len() - t0 >= 8 {
                group8(w, &x[t0..t0 + 8], &mut y[t0 * stride..], stride);
                t0 += 8;
            }
        }
        while x.len() - t0 >= 4 {
            group::<4>(w, &x[t0..t0 + 4], &mut y[t0 * stride..], stride);
            t0 += 4;
        }
        if x.len() - t0 >= 2 {
            group::<2>(w, &x[t0..t0 + 2], &mut y[t0 * stride..], stride);
            t0 += 2;
        }
    }
    for (t, xt) in x.iter().enumerate().skip(t0) {
        gemv(w, xt, &mut y[t * stride..][..rows]);
    }
}

/// [`gemv_tokens`] of exactly `N` tokens of a 32-weight format.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn group<const N: usize>(w: &Weights<'_>, x: &[Q8Acts], y: &mut [f32], stride: usize) {
    let dtype = w.dtype();
    let blocks = w.cols() / QK;
    let xs = Tokens::<N>::new(x, blocks, dtype != DType::Q8_0);
    let (data, rb) = (w.data(), w.row_bytes());
    for (r, row) in data.chunks_exact(rb).enumerate() {
        // The row PREFETCH_ROWS ahead, line by line: each row's blocks take N tokens'
        // work, so fewer rows are in flight than in a one-token GEMV and the loads of a
        // matrix streaming from memory would wait (measured on SmolLM2: without this,
        // two tokens grouped ran slower than two GEMVs).
        prefetch_row(data, r + PREFETCH_ROWS, rb);
        let out = match dtype {
            DType::Q4_0 => dot_nibbles_n::<0, N>(row, &xs),
            DType::Q4_1 => dot_nibbles_n::<1, N>(row, &xs),
            DType::Q5_0 => dot_nibbles_n::<2, N>(row, &xs),
            _ => dot_q8_0_n::<N>(row, &xs),
        };
        for (t, v) in out.into_iter().enumerate() {
            y[t * stride + r] = v;
        }
    }
}
