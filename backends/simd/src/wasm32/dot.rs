//! SCAFFOLD (to be replaced by the SIMD128 kernels): the scalar reference.

use core::arch::wasm32::*;
use kvcore::backend::{Backend, PartStat};
use kvcore_scalar::Scalar;

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

pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0.0, |s, (x, y)| s + x * y)
}

pub(super) fn scores<'a>(
    q: &[f32],
    keys: impl Iterator<Item = &'a [f32]>,
    scale: f32,
    scores: &mut [f32],
) {
    for (s, k) in scores.iter_mut().zip(keys) {
        *s = scale * dot(q, k);
    }
}

pub(super) fn weighted_sum<'a>(
    p: &[f32],
    values: impl Iterator<Item = &'a [f32]>,
    out: &mut [f32],
) {
    for (&pt, v) in p.iter().zip(values) {
        out.iter_mut().zip(v).for_each(|(o, &x)| *o += pt * x);
    }
}

pub(super) fn exp_sum(x: &mut [f32]) -> PartStat {
    crate::kernel::exp_sum_with(x, |v| v.exp())
}

pub(super) fn softmax(x: &mut [f32]) {
    Scalar.softmax(x)
}

pub(super) fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    Scalar.swiglu(gate, up, out).expect("lengths checked")
}

pub(super) fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    Scalar.geglu(gate, up, out).expect("lengths checked")
}

pub(super) fn scale_mul(x: &[f32], r: f32, w: &[f32], out: &mut [f32]) {
    for ((o, &a), &b) in out.iter_mut().zip(x).zip(w) {
        *o = (a * r) * b;
    }
}

pub(super) fn add(acc: &mut [f32], x: &[f32]) {
    acc.iter_mut().zip(x).for_each(|(a, &b)| *a += b);
}
