//! SIMD128 f32 lanes: the loads, stores, horizontal sum and multiply-add the other
//! SIMD128 kernels share, and [`Simd128`]'s 4 lanes for the loops of `crate::lanes` (dot
//! products, scores, weighted sums, softmax, SwiGLU, GeGLU, RMSNorm's products, the
//! residual add).
//!
//! SIMD128 has no fused multiply-add, so [`mul_add`] rounds the product and then the sum:
//! `lanes::dot` is then within `γ_(n+1)·Σ|a_j b_j|` of the exact value (one more rounding
//! per term than with FMA, inside the `+ 2` of the tolerance in `tests/simd_paths.rs`;
//! with relaxed SIMD, [`mul_add`] may be fused, see `mod.rs`). The Cephes `exp` of
//! `lanes.rs` runs with separate multiplies and adds, as Cephes itself wrote it, and
//! stays within the bounds `lanes.rs` states. [`hsum`] adds `(x₀+x₂)+(x₁+x₃)`.

use super::Simd128;
use crate::lanes::F32Lanes;
use core::arch::wasm32::*;

/// Four f32 from `s[0..4]`.
///
/// # Panics
/// If `s.len() < 4`.
#[inline]
pub(super) fn load(s: &[f32]) -> v128 {
    assert!(s.len() >= 4);
    // SAFETY: 16 bytes are in bounds (asserted); `v128_load` has no alignment requirement.
    unsafe { v128_load(s.as_ptr().cast()) }
}

/// Store four f32 to `s[0..4]`.
///
/// # Panics
/// If `s.len() < 4`.
#[inline]
pub(super) fn store(s: &mut [f32], v: v128) {
    assert!(s.len() >= 4);
    // SAFETY: 16 bytes are in bounds (asserted); `v128_store` has no alignment requirement.
    unsafe { v128_store(s.as_mut_ptr().cast(), v) }
}

/// The sum of the four lanes, `(l0 + l2) + (l1 + l3)`.
#[inline]
pub(super) fn hsum(v: v128) -> f32 {
    let h = f32x4_add(v, i32x4_shuffle::<2, 3, 0, 1>(v, v));
    f32x4_extract_lane::<0>(h) + f32x4_extract_lane::<1>(h)
}

/// `acc + a·b`, rounded twice (SIMD128 has no fused multiply-add).
#[cfg(not(target_feature = "relaxed-simd"))]
#[inline]
pub(super) fn mul_add(acc: v128, a: v128, b: v128) -> v128 {
    f32x4_add(acc, f32x4_mul(a, b))
}

/// `acc + a·b`, rounded once or twice as the engine chooses (relaxed SIMD's
/// `f32x4.relaxed_madd`: one FMA on a CPU that has it).
#[cfg(target_feature = "relaxed-simd")]
#[inline]
pub(super) fn mul_add(acc: v128, a: v128, b: v128) -> v128 {
    f32x4_relaxed_madd(a, b, acc)
}

// SAFETY: a `Simd128` exists only in a module compiled with SIMD128, which an engine
// loads only after validating its SIMD instructions.
unsafe impl F32Lanes for Simd128 {
    const N: usize = 4;
    type V = v128;

    #[inline(always)]
    fn zero(self) -> v128 {
        f32x4_splat(0.0)
    }
    #[inline(always)]
    fn splat(self, x: f32) -> v128 {
        f32x4_splat(x)
    }
    #[inline(always)]
    fn load(self, s: &[f32]) -> v128 {
        load(s)
    }
    #[inline(always)]
    fn store(self, s: &mut [f32], v: v128) {
        store(s, v)
    }
    crate::lanes::binary_lane_ops!(
        add => f32x4_add,
        sub => f32x4_sub,
        mul => f32x4_mul,
        div => f32x4_div,
    );
    #[inline(always)]
    fn neg(self, a: v128) -> v128 {
        f32x4_neg(a)
    }
    /// [`mul_add`]: two roundings, or one as the engine chooses with relaxed SIMD.
    #[inline(always)]
    fn mul_add(self, acc: v128, a: v128, b: v128) -> v128 {
        mul_add(acc, a, b)
    }
    /// A multiply, then a subtraction (even with relaxed SIMD: Cephes' own steps).
    #[inline(always)]
    fn mul_sub(self, c: v128, a: v128, b: v128) -> v128 {
        f32x4_sub(c, f32x4_mul(a, b))
    }
    /// `pmin`/`pmax`: the clamps of a NaN lane give NaN or a bound.
    #[inline(always)]
    fn clamp(self, x: v128, lo: v128, hi: v128) -> v128 {
        f32x4_pmin(f32x4_pmax(x, lo), hi)
    }
    #[inline(always)]
    fn round(self, x: v128) -> v128 {
        f32x4_nearest(x)
    }
    /// `n` is integral and in range, so the truncating conversion is exact.
    #[inline(always)]
    fn pow2(self, n: v128) -> v128 {
        i32x4_shl(i32x4_add(i32x4_trunc_sat_f32x4(n), i32x4_splat(127)), 23)
    }
    #[inline(always)]
    fn zero_below(self, x: v128, lo: v128, y: v128) -> v128 {
        v128_andnot(y, f32x4_lt(x, lo))
    }
    #[inline(always)]
    fn nan_where_nan(self, x: v128, y: v128) -> v128 {
        v128_bitselect(y, f32x4_splat(f32::NAN), f32x4_eq(x, x))
    }
    /// [`hsum`]'s order.
    #[inline(always)]
    fn hsum(self, v: v128) -> f32 {
        hsum(v)
    }
}

crate::lanes::f32_loops!(Simd128);

/// Reads one byte of each 64-byte cache line of piece `i + 1` of `data` cut into
/// `unit`-byte pieces (nothing past the end), and drops it. WebAssembly has no prefetch
/// instruction, and the hardware prefetchers stop at every 4 KiB page of the weights, so
/// the GEMVs touch the next row (or row pair) before they multiply one: its lines are
/// then fetched side by side, not one page's first lines after another as the loop
/// reaches them. SmolLM2's 8-bit decode under wasmtime and Node measured faster with it
/// (BENCHMARKS.md); touching two or more pieces ahead measured slower than one.
#[inline(always)]
pub(super) fn touch_next(data: &[u8], unit: usize, i: usize) {
    let start = (i + 1) * unit;
    if let Some(piece) = data.get(start..(start + unit).min(data.len())) {
        for line in piece.chunks(64) {
            // SAFETY: `line` is a non-empty chunk of `data`, so its first byte is in
            // bounds; a volatile read is emitted even though its value is unused.
            unsafe { core::ptr::read_volatile(line.as_ptr()) };
        }
    }
}
