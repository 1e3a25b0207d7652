//! Reference softmax and attention of one query head.
//!
//! Softmax is max-subtracted: `p_i = e^(x_i − max) / Σ_j e^(x_j − max)`, so the largest
//! exponent is `e^0 = 1` and nothing overflows; the sum is in f32, left to right.
//!
//! The fully masked row: when every entry is `−∞`, `max = −∞` and `x_i − max` is
//! `−∞ − (−∞) = NaN`, so a plain softmax returns NaN everywhere, and one NaN poisons every
//! later layer. Such a row has no weight to distribute; it becomes all zeros instead.
//! A NaN anywhere in a row is different: it is corrupt input, not masking, so the whole
//! row becomes NaN and the error surfaces downstream (`f32::max` ignores NaN, so without
//! this check a row of NaNs would be mistaken for a fully masked one and silently zeroed).
//!
//! Attention of one head (`attend_head`): `s_t = scale·(q·k_t)` for each cached key `t`,
//! `p = softmax(s)`, then `out = Σ_t p_t·v_t` accumulated over `t` in order, in f32.
//! Layout: `keys`/`values: [n_keys, kv_dim]`, the head reads columns
//! `kv_head·head_dim .. (kv_head+1)·head_dim` of each row.

use crate::matmul::dot;
use std::ops::Range;

/// Softmax of `x` in place (see the module docs for the −∞ row). Empty input is a no-op.
pub(crate) fn softmax(x: &mut [f32]) {
    if x.iter().any(|v| v.is_nan()) {
        x.fill(f32::NAN);
        return;
    }
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// Columns `cols` of the first `n_keys` rows of `m: [_, kv_dim]`.
fn head_rows<'a>(
    m: &'a [f32],
    kv_dim: usize,
    n_keys: usize,
    cols: &'a Range<usize>,
) -> impl Iterator<Item = &'a [f32]> {
    m.chunks_exact(kv_dim)
        .take(n_keys)
        .map(move |row| &row[cols.clone()])
}

/// One query head against `n_keys` cached rows. Shapes are checked by the caller.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_head(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    n_keys: usize,
    kv_dim: usize,
    kv_head: usize,
    scale: f32,
    out: &mut [f32],
) {
    let hd = q.len();
    if hd == 0 {
        // Nothing to write; the shape check allows `kv_dim = 0` only here.
        return;
    }
    let cols = kv_head * hd..(kv_head + 1) * hd;
    let mut scores: Vec<f32> = head_rows(keys, kv_dim, n_keys, &cols)
        .map(|k| scale * dot(q, k))
        .collect();
    softmax(&mut scores);
    out.fill(0.0);
    for (p, v) in scores.iter().zip(head_rows(values, kv_dim, n_keys, &cols)) {
        for (o, &vj) in out.iter_mut().zip(v) {
            *o += p * vj;
        }
    }
}
