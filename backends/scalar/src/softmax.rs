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
//! Attention (`attention`): for each new row `i` and query head `h` (reading KV head
//! `h / group`), the scores `s_t = scale·(q·k_t)` of the slots `t` the row's position
//! sees, segment by segment in view order; `p = softmax(s)`; then `out = Σ_t p_t·v_t`
//! accumulated over the same slots in the same order, in f32. Rows and heads are
//! independent, so any split of them (the rayon backend's) gives the same bits.

use crate::matmul::dot;
use kvcore::backend::{AttnParams, ShapeError};
use kvcore::kv::KvView;
use kvcore::ndarray::{ArrayView3, ArrayViewMut3, Axis};

/// The maximum of a softmax row, or `None` once the row's outcome is settled without
/// exponentials (see the module docs): a row holding a NaN becomes all NaN, an all-`−∞`
/// (or empty) row all zeros. Shared by every softmax implementation, so they agree on
/// the special rows.
pub fn softmax_max(x: &mut [f32]) -> Option<f32> {
    if x.iter().any(|v| v.is_nan()) {
        x.fill(f32::NAN);
        return None;
    }
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return None;
    }
    Some(max)
}

/// Softmax of `x` in place (see the module docs for the −∞ row). Empty input is a no-op.
pub(crate) fn softmax(x: &mut [f32]) {
    let Some(max) = softmax_max(x) else {
        return;
    };
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// The `[head_dim]` row of slot `t`, KV head `kvh`, of an f32 run (contiguous last axis,
/// checked by the caller).
fn head_row<'a>(rows: ArrayView3<'a, f32>, t: usize, kvh: usize) -> &'a [f32] {
    rows.index_axis_move(Axis(0), t)
        .index_axis_move(Axis(0), kvh)
        .to_slice()
        .expect("the last axis is contiguous (checked)")
}

/// One layer's attention; shapes checked by the caller. Only f32 rows: other element
/// types are [`ShapeError::UnsupportedKv`], checked before any output is written.
pub(crate) fn attention(
    q: ArrayView3<'_, f32>,
    q_pos: &[usize],
    kv: &KvView<'_>,
    params: &AttnParams,
    mut out: ArrayViewMut3<'_, f32>,
) -> Result<(), ShapeError> {
    let runs = kv
        .f32_segments()
        .map_err(|kv_type| ShapeError::UnsupportedKv {
            what: "scalar attention",
            kv_type,
        })?;
    let n_heads = q.dim().1;
    let group = n_heads / kv.n_kv_heads();
    let mut scores = Vec::new();
    for (i, &pos) in q_pos.iter().enumerate() {
        for h in 0..n_heads {
            let qh = q.index_axis_move(Axis(0), i).index_axis_move(Axis(0), h);
            let qh = qh
                .to_slice()
                .expect("the last axis is contiguous (checked)");
            let kvh = h / group;
            scores.clear();
            for run in &runs {
                for t in run.segment.visible(pos, params.mask) {
                    scores.push(params.scale * dot(qh, head_row(run.keys, t, kvh)));
                }
            }
            softmax(&mut scores);
            let mut o = out.index_axis_mut(Axis(0), i).index_axis_move(Axis(0), h);
            o.fill(0.0);
            let mut p = scores.iter();
            for run in &runs {
                for t in run.segment.visible(pos, params.mask) {
                    let pt = *p.next().expect("one score per visible slot");
                    for (oj, &vj) in o.iter_mut().zip(head_row(run.values, t, kvh)) {
                        *oj += pt * vj;
                    }
                }
            }
        }
    }
    Ok(())
}
