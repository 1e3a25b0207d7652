//! AVX2 + FMA + F16C attention kernels over KV rows in their stored types: the scores of
//! several query vectors against each key row, and the weighted sums of several outputs
//! over each value row, each row read (and converted to f32 in registers) once for all
//! the vectors of a pass.
//!
//! Rows are read in place through raw row pointers of their `ArrayView2`, so a row costs
//! no view construction: `f32` loaded, `f16` converted by `vcvtph2ps`, `bf16` widened and
//! shifted into the high half of an f32, `q8_0` widened to i32, converted and multiplied
//! by the block's scale (the reference's one rounded product `d · q`), `q4_0`'s nibbles
//! masked out of the block's 16 bytes, less 8, then as `q8_0`'s quants. Every conversion
//! but the block types' product is exact, so the kernels see the values the reference
//! decodes.
//!
//! Numerics, per query vector and per output, whatever the number of vectors in the call:
//! - a score, for heads of 32, 64, 128 or 256 values ([`scores_by_8`]), is one 8-lane FMA
//!   chain over the row's 8-value chunks, its lanes summed as `((x₀+x₁)+(x₂+x₃)) +
//!   ((x₄+x₅)+(x₆+x₇))`, then `scale ·`; for other heads ([`scores_one`]) `dot::dot`'s
//!   order (four accumulators over 32-value chunks, one over the rest, the horizontal
//!   sum, an unfused scalar tail);
//! - an output element is `dot::weighted_sum`'s chain `o ← fma(p_t, v_tj, o)` in `t`
//!   order (the `head_dim mod 8` tail `o + p_t·v_tj` unfused). Up to [`MAX_VECS`] outputs
//!   share a pass over the value rows, so their accumulators stay in the 16 ymm registers.

use super::Avx512;
use super::dot::{hsum, load, store};
use crate::kernel::HeadRows;
use kvcore::kv::{BlockQ4_0, BlockQ8_0, Q8_0_BLOCK};
use kvcore::ndarray::ArrayView2;
use std::arch::x86_64::*;
use std::marker::PhantomData;

/// Query vectors (or outputs) per pass.
pub(super) const MAX_VECS: usize = 8;

/// One KV head's rows as the kernels read them.
///
/// # Safety
/// `load8(t, j)` and `load32(t, j)` require `t < rows()` and `j + 8 ≤ head_dim()` (resp.
/// `j + 32`), `j` a multiple of 8 (of 32 for `load32`), and a CPU with AVX2, FMA and F16C.
trait Rows: Copy {
    fn rows(&self) -> usize;
    fn head_dim(&self) -> usize;
    /// Values `j .. j + 8` of row `t` as f32.
    unsafe fn load8(&self, t: usize, j: usize) -> __m256;
    /// Values `j .. j + 32` of row `t` as f32.
    #[inline(always)]
    unsafe fn load32(&self, t: usize, j: usize) -> [__m256; 4] {
        // SAFETY: the caller's contract covers `j .. j + 32`, so each 8 of it.
        unsafe {
            [
                self.load8(t, j),
                self.load8(t, j + 8),
                self.load8(t, j + 16),
                self.load8(t, j + 24),
            ]
        }
    }
    /// Value `j` of row `t` as f32 (bounds-checked).
    fn get(&self, t: usize, j: usize) -> f32;
    /// Prefetches row `t` (if it exists) into L1.
    fn prefetch(&self, t: usize);
}

/// A row-strided run of `rows` rows of `units` `T`s: the raw form of an `ArrayView2`
/// with a contiguous last axis.
#[derive(Clone, Copy)]
struct Raw<'a, T> {
    ptr: *const T,
    stride: isize,
    rows: usize,
    units: usize,
    _view: PhantomData<&'a T>,
}

impl<'a, T> Raw<'a, T> {
    /// # Panics
    /// If the last axis of `a` is not contiguous.
    fn new(a: &ArrayView2<'a, T>) -> Self {
        let (rows, units) = a.dim();
        assert!(
            rows == 0 || units <= 1 || a.strides()[1] == 1,
            "head rows: the last axis must be contiguous"
        );
        Raw {
            ptr: a.as_ptr(),
            stride: if rows <= 1 { 0 } else { a.strides()[0] },
            rows,
            units,
            _view: PhantomData,
        }
    }

    /// Unit `u` of row `t`.
    ///
    /// # Safety
    /// `t < rows`, `u < units`... or `u + k ≤ units` for a read of `k` units from it.
    #[inline(always)]
    unsafe fn at(&self, t: usize, u: usize) -> *const T {
        // SAFETY: in bounds of the view by the caller's contract: the view's element
        // `[t, u]` is at `ptr + t·stride + u`, and the view borrows its data for `'a`.
        unsafe { self.ptr.offset(t as isize * self.stride).add(u) }
    }

    /// Prefetches row `t` into L1 line by line, if it exists (a prefetch never
    /// faults).
    #[inline(always)]
    fn prefetch(&self, t: usize) {
        if t >= self.rows {
            return;
        }
        let bytes = self.units * std::mem::size_of::<T>();
        // SAFETY: `t < rows`, so row `t`'s `units` values are inside the view, which
        // borrows them for `'a`; any bytes are valid `u8`s.
        let row = unsafe { std::slice::from_raw_parts(self.at(t, 0).cast::<u8>(), bytes) };
        super::dot::prefetch_l1(row);
    }

    /// Unit `u` of row `t`, bounds-checked.
    fn unit(&self, t: usize, u: usize) -> &'a T {
        assert!(t < self.rows && u < self.units, "head rows index");
        // SAFETY: checked in bounds just above; the data is borrowed for `'a`.
        unsafe { &*self.at(t, u) }
    }
}

/// The f16 of `bits` as f32 (exact, by F16C) in every lane: a block's scale.
///
/// # Safety
/// A CPU with AVX and F16C.
#[inline(always)]
unsafe fn splat_f16(bits: u16) -> __m256 {
    // SAFETY: AVX and F16C by the caller's contract.
    unsafe {
        let d = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)));
        _mm256_set1_ps(_mm_cvtss_f32(d))
    }
}

/// A block's 32 signed quants, `lo` the first 16 and `hi` the last, as f32 each times
/// its lane of `d` ([`scaled`], 8 at a time).
///
/// # Safety
/// A CPU with AVX2.
#[inline(always)]
unsafe fn scaled32(lo: __m128i, hi: __m128i, d: __m256) -> [__m256; 4] {
    // SAFETY: AVX2 by the caller's contract.
    unsafe {
        [
            scaled(lo, d),
            scaled(_mm_srli_si128::<8>(lo), d),
            scaled(hi, d),
            scaled(_mm_srli_si128::<8>(hi), d),
        ]
    }
}

/// The [`Rows`] methods every stored type shares: its rows, their prefetch, and its
/// values per unit `$per` (1, or a block's 32).
macro_rules! raw_rows {
    ($per:expr) => {
        fn rows(&self) -> usize {
            self.0.rows
        }
        #[inline(always)]
        fn prefetch(&self, t: usize) {
            self.0.prefetch(t);
        }
        fn head_dim(&self) -> usize {
            self.0.units * $per
        }
    };
}

/// The low 8 signed quants of `q` as f32, each times its lane of `d`: a block type's one
/// rounded product `d · q`.
///
/// # Safety
/// A CPU with AVX2.
#[inline(always)]
unsafe fn scaled(q: __m128i, d: __m256) -> __m256 {
    // SAFETY: AVX2 by the caller's contract.
    unsafe { _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d) }
}

#[derive(Clone, Copy)]
struct F32Rows<'a>(Raw<'a, f32>);
#[derive(Clone, Copy)]
struct F16Rows<'a>(Raw<'a, half::f16>);
#[derive(Clone, Copy)]
struct Bf16Rows<'a>(Raw<'a, half::bf16>);
#[derive(Clone, Copy)]
struct Q8Rows<'a>(Raw<'a, BlockQ8_0>);
#[derive(Clone, Copy)]
struct Q4Rows<'a>(Raw<'a, BlockQ4_0>);

impl Rows for F32Rows<'_> {
    raw_rows!(1);
    #[inline(always)]
    unsafe fn load8(&self, t: usize, j: usize) -> __m256 {
        // SAFETY: 8 floats of row `t` from `j` are in bounds (the trait's contract);
        // unaligned loads are allowed.
        unsafe { _mm256_loadu_ps(self.0.at(t, j)) }
    }
    fn get(&self, t: usize, j: usize) -> f32 {
        *self.0.unit(t, j)
    }
}

impl Rows for F16Rows<'_> {
    raw_rows!(1);
    #[inline(always)]
    unsafe fn load8(&self, t: usize, j: usize) -> __m256 {
        // SAFETY: 8 halves (16 bytes) of row `t` from `j` are in bounds (the trait's
        // contract); F16C is present (the trait's contract); unaligned loads are allowed.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(self.0.at(t, j).cast())) }
    }
    fn get(&self, t: usize, j: usize) -> f32 {
        self.0.unit(t, j).to_f32()
    }
}

impl Rows for Bf16Rows<'_> {
    raw_rows!(1);
    #[inline(always)]
    unsafe fn load8(&self, t: usize, j: usize) -> __m256 {
        // SAFETY: 8 bf16 (16 bytes) of row `t` from `j` are in bounds (the trait's
        // contract); unaligned loads are allowed. A bf16 is the high half of an f32.
        unsafe {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(self.0.at(t, j).cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
        }
    }
    fn get(&self, t: usize, j: usize) -> f32 {
        self.0.unit(t, j).to_f32()
    }
}

impl Q8Rows<'_> {
    /// The block holding value `j` of row `t` and its scale as f32.
    ///
    /// # Safety
    /// `t < rows`, `j < head_dim`.
    #[inline(always)]
    unsafe fn block(&self, t: usize, j: usize) -> (*const i8, __m256) {
        // SAFETY: block `j / 32` of row `t` is in bounds by the caller's contract; the
        // scale is the block's first two bytes (`repr(C)`), converted exactly by F16C.
        unsafe {
            let b = self.0.at(t, j / Q8_0_BLOCK);
            let qs = std::ptr::addr_of!((*b).qs).cast::<i8>();
            (qs, splat_f16((*b).d.to_bits()))
        }
    }
}

impl Rows for Q8Rows<'_> {
    raw_rows!(Q8_0_BLOCK);
    #[inline(always)]
    unsafe fn load8(&self, t: usize, j: usize) -> __m256 {
        // SAFETY: value `j` is in bounds (the trait's contract) and `j % 32 ≤ 24` (a
        // multiple of 8), so 8 quants of the block from `j % 32` are in bounds.
        unsafe {
            let (qs, d) = self.block(t, j);
            let q = _mm_loadl_epi64(qs.add(j % Q8_0_BLOCK).cast());
            scaled(q, d)
        }
    }
    #[inline(always)]
    unsafe fn load32(&self, t: usize, j: usize) -> [__m256; 4] {
        // SAFETY: `j` is a multiple of 32 in bounds (the trait's contract): one whole
        // block, its 32 quants read as two 16-byte loads.
        unsafe {
            let (qs, d) = self.block(t, j);
            let lo = _mm_loadu_si128(qs.cast());
            let hi = _mm_loadu_si128(qs.add(16).cast());
            scaled32(lo, hi, d)
        }
    }
    fn get(&self, t: usize, j: usize) -> f32 {
        let b = self.0.unit(t, j / Q8_0_BLOCK);
        b.d.to_f32() * f32::from(b.qs[j % Q8_0_BLOCK])
    }
}

impl Q4Rows<'_> {
    /// The block holding value `j` of row `t`: its values `j % 32 < 16` (low nibbles) or
    /// `≥ 16` (high nibbles) less 8, as 16 signed bytes, and its scale as f32 in every
    /// lane.
    ///
    /// # Safety
    /// `t < rows`, `j < head_dim`.
    #[inline(always)]
    unsafe fn block(&self, t: usize, j: usize) -> (__m128i, __m256) {
        // SAFETY: block `j / 32` of row `t` is in bounds by the caller's contract: its
        // first two bytes are the scale (`repr(C)`, converted exactly by F16C), the next
        // 16 its nibbles.
        unsafe {
            let b = self.0.at(t, j / Q8_0_BLOCK);
            let qs = _mm_loadu_si128(std::ptr::addr_of!((*b).qs).cast());
            let q = if j % Q8_0_BLOCK < Q8_0_BLOCK / 2 {
                qs
            } else {
                _mm_srli_epi16::<4>(qs)
            };
            let q = _mm_sub_epi8(_mm_and_si128(q, _mm_set1_epi8(15)), _mm_set1_epi8(8));
            (q, splat_f16(u16::from_le_bytes((*b).d)))
        }
    }
}

impl Rows for Q4Rows<'_> {
    raw_rows!(Q8_0_BLOCK);
    #[inline(always)]
    unsafe fn load8(&self, t: usize, j: usize) -> __m256 {
        // SAFETY: value `j` is in bounds (the trait's contract) and a multiple of 8: the
        // 8 values from `j` are bytes `j % 16 ..` of the block's nibbles of that half.
        unsafe {
            let (q, d) = self.block(t, j);
            let q = if j.is_multiple_of(Q8_0_BLOCK / 2) {
                q
            } else {
                _mm_srli_si128::<8>(q)
            };
            scaled(q, d)
        }
    }
    #[inline(always)]
    unsafe fn load32(&self, t: usize, j: usize) -> [__m256; 4] {
        // SAFETY: `j` is a multiple of 32 in bounds (the trait's contract): one whole
        // block, its low nibbles (values 0..16) and high nibbles (16..32).
        unsafe {
            let (lo, d) = self.block(t, j);
            let (hi, _) = self.block(t, j + Q8_0_BLOCK / 2);
            scaled32(lo, hi, d)
        }
    }
    fn get(&self, t: usize, j: usize) -> f32 {
        let b = self.0.unit(t, j / Q8_0_BLOCK);
        let (byte, half) = (j % (Q8_0_BLOCK / 2), j % Q8_0_BLOCK / (Q8_0_BLOCK / 2));
        let q = (b.qs[byte] >> (4 * half)) & 15;
        half::f16::from_le_bytes(b.d).to_f32() * f32::from(q as i8 - 8)
    }
}

/// `out[t] ← scale · q·k_t` for one query `q: [head_dim]`, row by row: the fallback for
/// head sizes [`scores_by_8`] does not take, in `dot::dot`'s order.
#[target_feature(enable = "avx2,fma,f16c")]
fn scores_one<R: Rows>(q: &[f32], rows: R, scale: f32, out: &mut [f32]) {
    let (n, hd) = (rows.rows(), rows.head_dim());
    assert_eq!(q.len(), hd, "query vector");
    assert!(n <= out.len(), "scores length");
    for (t, o) in out.iter_mut().enumerate().take(n) {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= hd {
            // SAFETY: `t < n`, `i + 32 ≤ hd`, `i` a multiple of 32; features enabled.
            let k = unsafe { rows.load32(t, i) };
            for (l, lane) in acc.iter_mut().enumerate() {
                *lane = _mm256_fmadd_ps(load(&q[i + 8 * l..]), k[l], *lane);
            }
            i += 32;
        }
        while i + 8 <= hd {
            // SAFETY: `t < n`, `i + 8 ≤ hd`, `i` a multiple of 8; features enabled.
            let k = unsafe { rows.load8(t, i) };
            acc[0] = _mm256_fmadd_ps(load(&q[i..]), k, acc[0]);
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        for (j, &qj) in q.iter().enumerate().skip(i) {
            s += qj * rows.get(t, j);
        }
        *o = scale * s;
    }
}

/// Columns `c0 .. c0 + 8·C` of `NV` outputs: `outs[v] += Σ_t p[v·stride + t] · v_t`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn weighted_cols<R: Rows, const NV: usize, const C: usize>(
    p: &[f32],
    stride: usize,
    rows: R,
    outs: &mut [f32],
    c0: usize,
) {
    let hd = rows.head_dim();
    let mut acc = [[_mm256_setzero_ps(); C]; NV];
    for (v, a) in acc.iter_mut().enumerate() {
        for (c, x) in a.iter_mut().enumerate() {
            *x = load(&outs[v * hd + c0 + 8 * c..]);
        }
    }
    let whole = C == 4 && c0.is_multiple_of(32);
    let n = rows.rows();
    assert!(n == 0 || (NV - 1) * stride + n <= p.len(), "weights length");
    for t in 0..n {
        rows.prefetch(t + 8);
        let mut x = [_mm256_setzero_ps(); C];
        if whole {
            // SAFETY: `t < rows`, `c0 + 32 ≤ hd` (the caller's loop), `c0` a multiple of
            // 32; the same values as four `load8`.
            x.copy_from_slice(&unsafe { rows.load32(t, c0) });
        } else {
            for (c, xc) in x.iter_mut().enumerate() {
                // SAFETY: `t < rows`, `c0 + 8c + 8 ≤ hd` (the caller's loop), a multiple
                // of 8.
                *xc = unsafe { rows.load8(t, c0 + 8 * c) };
            }
        }
        for (v, a) in acc.iter_mut().enumerate() {
            // SAFETY: `v < NV` and `t < n`, so `v·stride + t < (NV − 1)·stride + n ≤
            // p.len()` (asserted above). Unchecked: the bounds checks of the six weight
            // reads per row took more instructions than the row's twelve FMAs.
            let pv = _mm256_broadcast_ss(unsafe { &*p.as_ptr().add(v * stride + t) });
            for (c, o) in a.iter_mut().enumerate() {
                *o = _mm256_fmadd_ps(pv, x[c], *o);
            }
        }
    }
    for (v, a) in acc.iter().enumerate() {
        for (c, x) in a.iter().enumerate() {
            store(&mut outs[v * hd + c0 + 8 * c..], *x);
        }
    }
}

/// `outs[v] += Σ_t p[v·stride + t] · v_t` for `NV` outputs `outs: [NV, head_dim]`, in
/// column passes of `8·C` (so `NV · C` accumulators stay in registers).
#[target_feature(enable = "avx2,fma,f16c")]
fn weighted_n<R: Rows, const NV: usize, const C: usize>(
    p: &[f32],
    stride: usize,
    rows: R,
    outs: &mut [f32],
) {
    let (n, hd) = (rows.rows(), rows.head_dim());
    assert_eq!(outs.len(), NV * hd, "outputs");
    assert!(n == 0 || (NV - 1) * stride + n <= p.len(), "weights length");
    let mut c0 = 0;
    while c0 + 8 * C <= hd {
        weighted_cols::<R, NV, C>(p, stride, rows, outs, c0);
        c0 += 8 * C;
    }
    weighted_from::<R, NV>(p, stride, rows, outs, c0);
}

/// [`weighted_n`]'s columns from `c0` on, 8 at a time, then the unfused tail (each
/// column's chain is the same whichever pass holds it).
#[target_feature(enable = "avx2,fma,f16c")]
fn weighted_from<R: Rows, const NV: usize>(
    p: &[f32],
    stride: usize,
    rows: R,
    outs: &mut [f32],
    mut c0: usize,
) {
    let (n, hd) = (rows.rows(), rows.head_dim());
    while c0 + 8 <= hd {
        weighted_cols::<R, NV, 1>(p, stride, rows, outs, c0);
        c0 += 8;
    }
    for j in c0..hd {
        for v in 0..NV {
            let mut o = outs[v * hd + j];
            for t in 0..n {
                o += p[v * stride + t] * rows.get(t, j);
            }
            outs[v * hd + j] = o;
        }
    }
}

/// Runs `$call` with the constant `$n` = `nv`, for `nv` in `1 ..= MAX_VECS`.
macro_rules! per_vecs {
    ($nv:expr, $n:ident => $call:expr) => {
        per_vecs!(@arms $nv, $n, $call, 1 2 3 4 5 6 7 8)
    };
    (@arms $nv:expr, $n:ident, $call:expr, $($k:literal)*) => {
        match $nv {
            $($k => {
                const $n: usize = $k;
                $call
            })*
            _ => unreachable!("passes hold 1 ..= MAX_VECS vectors"),
        }
    };
}

/// The rows of `$h` as a [`Rows`] value bound to `$r` in `$call`.
macro_rules! per_type {
    ($h:expr, $r:ident => $call:expr) => {
        match $h {
            HeadRows::F32(a) => {
                let $r = F32Rows(Raw::new(&a));
                $call
            }
            HeadRows::F16(a) => {
                let $r = F16Rows(Raw::new(&a));
                $call
            }
            HeadRows::BF16(a) => {
                let $r = Bf16Rows(Raw::new(&a));
                $call
            }
            HeadRows::Q8_0(a) => {
                let $r = Q8Rows(Raw::new(&a));
                $call
            }
            HeadRows::Q4_0(a) => {
                let $r = Q4Rows(Raw::new(&a));
                $call
            }
        }
    };
}

mod avx512;

/// The 8 sums of the lanes of `a[0..8]`, lane `r` ← `Σ a[r]` as
/// `((x₀+x₁)+(x₂+x₃)) + ((x₄+x₅)+(x₆+x₇))` for every `r` alike.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn lane_sums(a: &[__m256; 8]) -> __m256 {
    let h01 = _mm256_hadd_ps(a[0], a[1]);
    let h23 = _mm256_hadd_ps(a[2], a[3]);
    let h45 = _mm256_hadd_ps(a[4], a[5]);
    let h67 = _mm256_hadd_ps(a[6], a[7]);
    let h0123 = _mm256_hadd_ps(h01, h23);
    let h4567 = _mm256_hadd_ps(h45, h67);
    _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(h0123, h4567),
        _mm256_permute2f128_ps::<0x31>(h0123, h4567),
    )
}

/// Scores for heads of `8·CH` values (32, 64, 128 or 256), 8 key rows at a time:
/// the 8 rows are converted to f32 once into a stack buffer, then each vector runs 8
/// independent FMA chains (one per row, over the row's 8-value chunks in order) and one
/// transposing reduction ([`lane_sums`]) gives the 8 scores in one register. A score is
/// thus `scale · Σ` of the 8 lanes of its row's chain, the same operations for every
/// row, vector and position in a block of 8 (the last, partial block re-reads its last
/// row in the unused slots and stores only its own rows).
///
/// Register blocks of 2 or 3 vectors × 4 rows (fewer loads per FMA) ran 10–20 % slower
/// here on Zen 3 (`cargo bench --bench kernels -- attention_prefill`).
#[target_feature(enable = "avx2,fma,f16c")]
fn scores_by_8<R: Rows, const CH: usize>(
    qs: &[f32],
    rows: R,
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    let (n, hd) = (rows.rows(), rows.head_dim());
    assert!(hd == 8 * CH && CH > 0 && CH.is_multiple_of(4), "head size");
    let nv = qs.len() / hd;
    assert!(
        n == 0 || (nv - 1) * stride + n <= out.len(),
        "scores length"
    );
    let mut buf = [[_mm256_setzero_ps(); CH]; 8];
    let sc = _mm256_set1_ps(scale);
    for t0 in (0..n).step_by(8) {
        let m = (n - t0).min(8);
        // The block after next, from memory while these two are scored.
        for t in t0 + 16..t0 + 24 {
            rows.prefetch(t);
        }
        for (r, row) in buf.iter_mut().enumerate() {
            let t = t0 + r.min(m - 1);
            for (c4, x) in row.chunks_exact_mut(4).enumerate() {
                // SAFETY: `t < n`, `32·c4 + 32 ≤ hd` (`CH` is a multiple of 4), a multiple
                // of 32; features enabled.
                x.copy_from_slice(&unsafe { rows.load32(t, 32 * c4) });
            }
        }
        for (v, q) in qs.chunks_exact(hd).enumerate() {
            let mut acc = [_mm256_setzero_ps(); 8];
            for c in 0..CH {
                let qc = load(&q[8 * c..]);
                for (a, row) in acc.iter_mut().zip(&buf) {
                    *a = _mm256_fmadd_ps(qc, row[c], *a);
                }
            }
            let s = _mm256_mul_ps(sc, lane_sums(&acc));
            let dst = &mut out[v * stride + t0..];
            if m == 8 {
                // A whole block: one store (a `copy_from_slice` of 8 became a `memcpy`
                // call per vector and block, 4 % of a 4096-token prefill).
                store(dst, s);
            } else {
                let mut part = [0.0f32; 8];
                store(&mut part, s);
                dst[..m].copy_from_slice(&part[..m]);
            }
        }
    }
}

/// `out[v · stride + t] ← scale · q_v·k_t` for every vector of `qs: [nv, head_dim]` and
/// row of `keys` (see the module docs; heads of 32, 64, 128 or 256 values take
/// [`scores_by_8`], or its AVX-512F twin where `wide` is `Some`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn scores(
    qs: &[f32],
    keys: HeadRows<'_>,
    scale: f32,
    out: &mut [f32],
    stride: usize,
    wide: Option<Avx512>,
) {
    let hd = keys.head_dim();
    if hd == 0 || keys.len() == 0 {
        return;
    }
    macro_rules! by_8 {
        ($ch:literal) => {{
            if wide.is_some() {
                // SAFETY: an `Avx512` exists only where the CPU has the features.
                per_type!(keys, r => unsafe {
                    avx512::scores_by_8::<_, $ch>(qs, r, scale, out, stride)
                });
                return;
            }
            per_type!(keys, r => scores_by_8::<_, $ch>(qs, r, scale, out, stride));
            return;
        }};
    }
    match hd {
        32 => by_8!(4),
        64 => by_8!(8),
        128 => by_8!(16),
        256 => by_8!(32),
        _ => {}
    }
    for (v, q) in qs.chunks_exact(hd).enumerate() {
        let out = &mut out[v * stride..];
        per_type!(keys, r => scores_one(q, r, scale, out));
    }
}

/// Outputs per pass of [`weighted`] when a call has more than [`MAX_VECS`]: 6 outputs ×
/// 16 columns keep 12 accumulators and read 8 values (2 row chunks, 6 weights) per 12
/// FMAs; passes of 8 × 8 columns read 9 per 8.
const PASS_VECS: usize = 6;

std::thread_local! {
    /// [`weighted`]'s rows converted to f32 once for all its passes.
    static CONVERTED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `outs[v] += Σ_t p[v · stride + t] · v_t` for every output of `outs: [nv, head_dim]`
/// over the rows of `values` (see the module docs). A call of more than [`MAX_VECS`]
/// outputs (a prefill tile) runs in passes of [`PASS_VECS`] over the rows; rows stored
/// as f16, bf16 or q8_0 are then converted to f32 once, into a scratch the passes read,
/// instead of once per pass (the same values: every pass would convert them alike).
/// Every pass runs on the AVX-512F twin where `wide` is `Some`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn weighted(
    p: &[f32],
    stride: usize,
    values: HeadRows<'_>,
    outs: &mut [f32],
    wide: Option<Avx512>,
) {
    let (n, hd) = (values.len(), values.head_dim());
    if hd == 0 || n == 0 {
        return;
    }
    if outs.len() <= MAX_VECS * hd {
        if wide.is_some() {
            // SAFETY: an `Avx512` exists only where the CPU has the features.
            per_type!(values, r => unsafe { avx512::weighted(p, stride, r, outs) });
            return;
        }
        per_type!(values, r => weighted_pass(p, stride, r, outs));
        return;
    }
    if let HeadRows::F32(a) = values {
        return weighted_passes(p, stride, F32Rows(Raw::new(&a)), outs, wide);
    }
    CONVERTED.with_borrow_mut(|buf| {
        buf.resize(n * hd, 0.0);
        per_type!(values, r => convert(r, buf));
        let a = ArrayView2::from_shape((n, hd), &buf[..]).expect("n · head_dim values");
        weighted_passes(p, stride, F32Rows(Raw::new(&a)), outs, wide);
    });
}

/// [`weighted`] in passes of [`PASS_VECS`] outputs, on the AVX-512F twin where `wide` is
/// `Some` (the same bits).
#[target_feature(enable = "avx2,fma,f16c")]
fn weighted_passes(
    p: &[f32],
    stride: usize,
    r: F32Rows<'_>,
    outs: &mut [f32],
    wide: Option<Avx512>,
) {
    let hd = r.head_dim();
    for (pass, o) in outs.chunks_mut(PASS_VECS * hd).enumerate() {
        let p = &p[pass * PASS_VECS * stride..];
        match wide {
            // SAFETY: an `Avx512` exists only where the CPU has the features.
            Some(_) => unsafe { avx512::weighted(p, stride, r, o) },
            None => weighted_pass(p, stride, r, o),
        }
    }
}

/// One pass of [`weighted`] over `outs.len() / head_dim ≤ MAX_VECS` outputs, in column
/// passes of `8·C` (`NV · C ≤ 12` accumulators).
#[target_feature(enable = "avx2,fma,f16c")]
fn weighted_pass<R: Rows>(p: &[f32], stride: usize, r: R, o: &mut [f32]) {
    per_vecs!(o.len() / r.head_dim(), NV => match NV {
        1 => weighted_n::<_, NV, 8>(p, stride, r, o),
        2 | 3 => weighted_n::<_, NV, 4>(p, stride, r, o),
        4..=6 => weighted_n::<_, NV, 2>(p, stride, r, o),
        _ => weighted_n::<_, NV, 1>(p, stride, r, o),
    })
}

/// `out ← rows` as f32 (`[rows, head_dim]`): the values the kernels read them as, which
/// are the reference's decoding (see the module docs).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn decode(rows: HeadRows<'_>, out: &mut [f32]) {
    let (n, hd) = (rows.len(), rows.head_dim());
    assert!(out.len() >= n * hd, "decoded rows");
    if hd == 0 || n == 0 {
        return;
    }
    per_type!(rows, r => convert(r, out));
}

/// `out ← rows` as f32 (`[rows, head_dim]`), through the same `load8` (and `get` for a
/// `head_dim mod 8` tail) the kernels read them with.
#[target_feature(enable = "avx2,fma,f16c")]
fn convert<R: Rows>(rows: R, out: &mut [f32]) {
    let hd = rows.head_dim();
    for (t, o) in out.chunks_exact_mut(hd).enumerate().take(rows.rows()) {
        let mut j = 0;
        while j + 8 <= hd {
            // SAFETY: `t < rows`, `j + 8 ≤ hd`, `j` a multiple of 8; features enabled.
            store(&mut o[j..], unsafe { rows.load8(t, j) });
            j += 8;
        }
        for (jj, x) in o.iter_mut().enumerate().skip(j) {
            *x = rows.get(t, jj);
        }
    }
}

/// The Walsh–Hadamard stages within 8 values (`h` = 1, 2, 4) of one register, each
/// lane the one sum `x_i + x_{i+h}` (lower lane of its pair) or difference `x_i −
/// x_{i+h}` (upper lane) of `kvcore::kv::hadamard`, operands in its order.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hadamard8(v: __m256) -> __m256 {
    // Pairs 1 apart: partner lanes [1, 0, 3, 2, …].
    let s = _mm256_permute_ps::<0b10_11_00_01>(v);
    let v = _mm256_blend_ps::<0b1010_1010>(_mm256_add_ps(v, s), _mm256_sub_ps(s, v));
    // 2 apart: [2, 3, 0, 1, …].
    let s = _mm256_permute_ps::<0b01_00_11_10>(v);
    let v = _mm256_blend_ps::<0b1100_1100>(_mm256_add_ps(v, s), _mm256_sub_ps(s, v));
    // 4 apart: the two halves swapped.
    let s = _mm256_permute2f128_ps::<0x01>(v, v);
    _mm256_blend_ps::<0b1111_0000>(_mm256_add_ps(v, s), _mm256_sub_ps(s, v))
}

/// `o ← H o / n` per run of `n = rotation_len(o.len())` values: `kvcore_scalar::unrotate`
/// bit for bit (the same butterflies — every value the one sum or difference of its pair,
/// operands in the same order — then the exact product by `1/n`), a run held in
/// registers. Runs of fewer than 8 or more than 256 values take the scalar one.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn unrotate(o: &mut [f32]) {
    match kvcore::kv::codec::rotation_len(o.len()) {
        8 => unrotate_n::<1>(o),
        16 => unrotate_n::<2>(o),
        32 => unrotate_n::<4>(o),
        64 => unrotate_n::<8>(o),
        128 => unrotate_n::<16>(o),
        256 => unrotate_n::<32>(o),
        _ => kvcore_scalar::unrotate(o),
    }
}

/// [`unrotate`] for runs of `8·M` values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unrotate_n<const M: usize>(o: &mut [f32]) {
    let inv = _mm256_set1_ps(1.0 / (8 * M) as f32);
    for run in o.chunks_exact_mut(8 * M) {
        let mut r = [_mm256_setzero_ps(); M];
        for (i, x) in r.iter_mut().enumerate() {
            *x = hadamard8(load(&run[8 * i..]));
        }
        let mut h = 1;
        while h < M {
            for pair in r.chunks_exact_mut(2 * h) {
                let (lo, hi) = pair.split_at_mut(h);
                for (a, b) in lo.iter_mut().zip(hi) {
                    (*a, *b) = (_mm256_add_ps(*a, *b), _mm256_sub_ps(*a, *b));
                }
            }
            h *= 2;
        }
        for (i, x) in r.iter().enumerate() {
            store(&mut run[8 * i..], _mm256_mul_ps(*x, inv));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcore::backend::BlockFormat;
    use kvcore::backend::format::Q4_0;

    /// The AVX2 rotation equals the scalar one bit for bit, on values that make exact
    /// zeros (a difference of equal values: `+0`, whose negation would be `−0`), signed
    /// zeros, infinities and ordinary numbers, for every run length it takes and a
    /// few it hands to the scalar one.
    #[test]
    fn unrotate_matches_scalar_bits() {
        if !(is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        {
            eprintln!("no AVX2+FMA+F16C: nothing to compare (the Scalar path runs instead)");
            return;
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in [4, 8, 16, 24, 32, 64, 96, 128, 192, 256, 512] {
            for round in 0..200 {
                let x: Vec<f32> = (0..len)
                    .map(|_| match (next() % 8, round % 3) {
                        // Every third round only ±0 and ±1.5: sums of zeros, whose
                        // signs depend on each operand's order.
                        (r, 1) => [0.0, -0.0, 1.5, -1.5][r as usize % 4],
                        (0, _) => 1.5,
                        (1, _) => -0.0,
                        (2, 0) => f32::INFINITY,
                        _ => ((next() % 2001) as f32 - 1000.0) / 7.0,
                    })
                    .collect();
                let (mut a, mut b) = (x.clone(), x);
                kvcore_scalar::unrotate(&mut a);
                // SAFETY: features detected above.
                unsafe { unrotate(&mut b) };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "len {len} round {round}");
            }
        }
    }

    /// `q4_0` rows read by every load (`load8`, `load32`, AVX-512F's `load16`, `get`) are
    /// the reference's decoding (`Q4_0::decode`) bit for bit: every nibble of both halves,
    /// scales of every magnitude f16 holds (subnormal, 0, ±∞, NaN among them).
    #[test]
    fn q4_0_loads_are_the_reference_decoding() {
        if !(is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        {
            eprintln!("no AVX2+FMA+F16C: nothing to compare (the Scalar path runs instead)");
            return;
        }
        let wide = crate::x86::avx512::detect_or_say("q4_0_loads_are_the_reference_decoding");
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (n, hd) = (37, 128);
        let blocks: Vec<BlockQ4_0> = (0..n * hd / Q8_0_BLOCK)
            .map(|i| {
                let d = match i % 7 {
                    0 => 0x0001,
                    1 => 0x0000,
                    2 => 0x7c00,
                    3 => 0x7e00,
                    _ => (next() & 0xffff) as u16,
                };
                BlockQ4_0 {
                    d: d.to_le_bytes(),
                    qs: std::array::from_fn(|_| next() as u8),
                }
            })
            .collect();
        let a = ArrayView2::from_shape((n, hd / Q8_0_BLOCK), &blocks[..]).expect("rows");
        let r = Q4Rows(Raw::new(&a));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for t in 0..n {
            let mut want = vec![0.0; hd];
            for (o, b) in want.chunks_exact_mut(Q8_0_BLOCK).zip(a.row(t)) {
                Q4_0::decode(b, o);
            }
            let (mut by8, mut by32, mut by16) = (vec![0.0; hd], vec![0.0; hd], vec![0.0; hd]);
            for j in (0..hd).step_by(8) {
                // SAFETY: `t < n`, `j + 8 ≤ hd`, a multiple of 8; features detected above.
                unsafe { store(&mut by8[j..], r.load8(t, j)) };
            }
            for j in (0..hd).step_by(32) {
                // SAFETY: `t < n`, `j + 32 ≤ hd`, a multiple of 32; features detected.
                unsafe {
                    for (c, x) in r.load32(t, j).into_iter().enumerate() {
                        store(&mut by32[j + 8 * c..], x);
                    }
                }
            }
            let got: Vec<f32> = (0..hd).map(|j| r.get(t, j)).collect();
            assert_eq!(bits(&by8), bits(&want), "load8, row {t}");
            assert_eq!(bits(&by32), bits(&want), "load32, row {t}");
            assert_eq!(bits(&got), bits(&want), "get, row {t}");
            if wide.is_some() {
                for j in (0..hd).step_by(16) {
                    // SAFETY: `t < n`, `j + 16 ≤ hd`, a multiple of 16; AVX-512F detected.
                    unsafe { avx512::store16(&mut by16[j..], r, t, j) };
                }
                assert_eq!(bits(&by16), bits(&want), "load16, row {t}");
            }
        }
    }

    /// The AVX-512F kernels give the AVX2 kernels' bits on rows of every stored type:
    /// scores for every head size they take, 1 to 9 vectors, blocks of 8 rows and
    /// partial ones (whose unused pair slots re-read the last row); weighted sums for
    /// head sizes with and without 16- and 8-column tails, 1 to `MAX_VECS` outputs;
    /// values of mixed magnitudes, so a different order of any addition would show.
    #[test]
    fn avx512_matches_avx2_bits() {
        if crate::x86::avx512::detect_or_say("avx512_matches_avx2_bits").is_none() {
            return;
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let m = ((seed >> 11) % 20_001) as f32 / 10_000.0 - 1.0;
            m * [1.0, 1e-3, 37.0, 1e4][(seed % 4) as usize]
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // Runs `$body` with `$r` bound to the rows `x: [n, hd]` in each stored type
        // (`q8_0` and `q4_0` only when `hd` is a multiple of 32).
        macro_rules! each_type {
            ($x:expr, $n:expr, $hd:expr, $r:ident => $body:expr) => {{
                let (x, n, hd): (&[f32], usize, usize) = ($x, $n, $hd);
                let a = ArrayView2::from_shape((n, hd), x).expect("rows");
                let $r = F32Rows(Raw::new(&a));
                $body;
                let h: Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
                let a = ArrayView2::from_shape((n, hd), &h[..]).expect("rows");
                let $r = F16Rows(Raw::new(&a));
                $body;
                let h: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
                let a = ArrayView2::from_shape((n, hd), &h[..]).expect("rows");
                let $r = Bf16Rows(Raw::new(&a));
                $body;
                if hd % Q8_0_BLOCK == 0 {
                    let b: Vec<BlockQ8_0> =
                        x.chunks_exact(Q8_0_BLOCK).map(BlockQ8_0::encode).collect();
                    let a = ArrayView2::from_shape((n, hd / Q8_0_BLOCK), &b[..]).expect("rows");
                    let $r = Q8Rows(Raw::new(&a));
                    $body;
                    let b: Vec<BlockQ4_0> = x.chunks_exact(Q8_0_BLOCK).map(Q4_0::encode).collect();
                    let a = ArrayView2::from_shape((n, hd / Q8_0_BLOCK), &b[..]).expect("rows");
                    let $r = Q4Rows(Raw::new(&a));
                    $body;
                }
            }};
        }
        for hd in [32, 64, 128, 256] {
            for n in [1, 5, 8, 13, 40] {
                let keys: Vec<f32> = (0..n * hd).map(|_| next()).collect();
                for nv in 1..=9 {
                    let qs: Vec<f32> = (0..nv * hd).map(|_| next()).collect();
                    let stride = n + 3;
                    each_type!(&keys, n, hd, r => {
                        let (mut a, mut b) = (vec![0.5; nv * stride], vec![0.5; nv * stride]);
                        // SAFETY: features detected above.
                        unsafe {
                            match hd {
                                32 => scores_by_8::<_, 4>(&qs, r, 0.125, &mut a, stride),
                                64 => scores_by_8::<_, 8>(&qs, r, 0.125, &mut a, stride),
                                128 => scores_by_8::<_, 16>(&qs, r, 0.125, &mut a, stride),
                                _ => scores_by_8::<_, 32>(&qs, r, 0.125, &mut a, stride),
                            }
                            match hd {
                                32 => avx512::scores_by_8::<_, 4>(&qs, r, 0.125, &mut b, stride),
                                64 => avx512::scores_by_8::<_, 8>(&qs, r, 0.125, &mut b, stride),
                                128 => avx512::scores_by_8::<_, 16>(&qs, r, 0.125, &mut b, stride),
                                _ => avx512::scores_by_8::<_, 32>(&qs, r, 0.125, &mut b, stride),
                            }
                        }
                        assert_eq!(bits(&a), bits(&b), "scores hd {hd} n {n} nv {nv}");
                    });
                }
            }
        }
        for hd in [8, 16, 24, 36, 64, 72, 96, 128, 200, 256] {
            for n in [1, 2, 7, 33] {
                let vals: Vec<f32> = (0..n * hd).map(|_| next()).collect();
                for nv in 1..=MAX_VECS {
                    let stride = n + 2;
                    let p: Vec<f32> = (0..nv * stride).map(|_| next().abs()).collect();
                    let o: Vec<f32> = (0..nv * hd).map(|_| next()).collect();
                    each_type!(&vals, n, hd, r => {
                        let (mut a, mut b) = (o.clone(), o.clone());
                        // SAFETY: features detected above.
                        unsafe {
                            weighted_pass(&p, stride, r, &mut a);
                            avx512::weighted(&p, stride, r, &mut b);
                        }
                        assert_eq!(bits(&a), bits(&b), "weighted hd {hd} n {n} nv {nv}");
                    });
                }
            }
        }
    }
}
