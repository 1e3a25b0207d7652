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
use kvcore::backend::{AttnParams, PartStat, ShapeError};
use kvcore::kv::{KvCodec, KvRows, KvView};
use kvcore::ndarray::{ArrayView3, ArrayViewMut3, Axis};

/// The maximum of a softmax row, or `None` once the row's outcome is settled without
/// exponentials (see the module docs): a row holding a NaN becomes all NaN, an all-`−∞`
/// (or empty) row all zeros. Shared by every softmax implementation, so they agree on
/// the special rows.
pub fn softmax_max(x: &mut [f32]) -> Option<f32> {
    // One pass in 8 lanes, as compare-and-select, which the compiler turns into vector
    // max instructions (`f32::max` over an iterator stays scalar: its NaN rule does not
    // map onto them, and a NaN is found here anyway). For values that are not NaN it is
    // the maximum; which of +0 and −0 stands for a zero maximum is fixed by the input,
    // and the exponentials do not tell them apart.
    const L: usize = 8;
    let pick = |m: f32, v: f32| if v > m { v } else { m };
    let (mut lanes, mut nan) = ([f32::NEG_INFINITY; L], [false; L]);
    let chunks = x.chunks_exact(L);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..L {
            lanes[l] = pick(lanes[l], c[l]);
            nan[l] |= c[l].is_nan();
        }
    }
    if nan.contains(&true) || tail.iter().any(|v| v.is_nan()) {
        x.fill(f32::NAN);
        return None;
    }
    let max = tail
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &v| pick(m, v));
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

/// The `[head_dim]` row of slot `t`, KV head `kvh`, as f32: an f32 row itself, any other
/// type decoded into `tmp` by the reference dequantiser (one row, never a layer). The last
/// axis is contiguous (checked by the caller).
fn head_row<'a: 'b, 'b>(
    rows: KvRows<'a>,
    t: usize,
    kvh: usize,
    tmp: &'b mut Vec<f32>,
) -> &'b [f32] {
    if let KvRows::F32(a) = rows {
        return a
            .index_axis_move(Axis(0), t)
            .index_axis_move(Axis(0), kvh)
            .to_slice()
            .expect("the last axis is contiguous (checked)");
    }
    let bytes = rows
        .head_bytes(t, kvh)
        .expect("the last axis is contiguous (checked)");
    tmp.resize(rows.dim().2, 0.0);
    crate::quant::dequantize(rows.kv_type().dtype(), bytes, tmp);
    tmp
}

/// One layer's attention; shapes checked by the caller. Rows of every [`KvType`] are read
/// in place: each key and value row is decoded (`quant::dequantize`, exactly as a weight
/// row of the same format) just before its dot product or its weighted add. The view's
/// codecs (`KvView::codecs`) say the rest: against keys whose codec rotates heads each
/// query head is rotated the same way and divided by the rotation length (exact) before
/// its dot products; a sum of such values is rotated back after it; a key stored less a
/// key offset (`LayerCodec::key_offset`) has it added back to the decoded row.
pub(crate) fn attention(
    q: ArrayView3<'_, f32>,
    q_pos: &[usize],
    kv: &KvView<'_>,
    params: &AttnParams,
    out: ArrayViewMut3<'_, f32>,
) -> Result<(), ShapeError> {
    each_head(q, q_pos, kv, params, out, false, |_, scores| {
        softmax(scores)
    });
    Ok(())
}

/// One part of attention (`Backend::attention_part`; shapes checked by the caller):
/// `attention`'s loop with each row's scores `s` turned into `e^(s − m)` instead of
/// their softmax (`m` their maximum, [`softmax_max`]'s special rows kept: all `−∞` or
/// none gives [`PartStat::EMPTY`] and zeros, a NaN a NaN state and output), the output
/// left unnormalised and `stats[i · n_heads + h] ← (m, Σ e^(s − m))`. With `q_rotated`
/// the queries are already rotated for rotated keys (a caller folding several parts
/// rotates them once).
///
/// The reference part reader: `kvcore-simd` hands it views of element types it has no
/// row readers of, so its whole-layer attention is still these parts folded.
pub fn attention_part(
    q: ArrayView3<'_, f32>,
    q_pos: &[usize],
    kv: &KvView<'_>,
    params: &AttnParams,
    out: ArrayViewMut3<'_, f32>,
    stats: &mut [PartStat],
    q_rotated: bool,
) {
    each_head(q, q_pos, kv, params, out, q_rotated, |idx, scores| {
        stats[idx] = match softmax_max(scores) {
            Some(max) => {
                let mut sum = 0.0f32;
                for v in scores.iter_mut() {
                    *v = (*v - max).exp();
                    sum += *v;
                }
                PartStat { max, sum }
            }
            None if scores.first().is_some_and(|v| v.is_nan()) => PartStat {
                max: f32::NAN,
                sum: f32::NAN,
            },
            None => PartStat::EMPTY,
        };
    });
}

/// For each new row `i` and query head `h`: the scores of the slots row `i` sees,
/// `weigh(i · n_heads + h, scores)` turning them into weights in place, then `out[i, h]
/// ← Σ_t w_t v_t` (see `attention` for the codecs; `q_rotated`: the queries are
/// rotated for rotated keys already).
#[allow(clippy::too_many_arguments)] // attention's operands, the flag, the weighting
fn each_head(
    q: ArrayView3<'_, f32>,
    q_pos: &[usize],
    kv: &KvView<'_>,
    params: &AttnParams,
    mut out: ArrayViewMut3<'_, f32>,
    q_rotated: bool,
    mut weigh: impl FnMut(usize, &mut [f32]),
) {
    let n_heads = q.dim().1;
    let group = n_heads / kv.n_kv_heads();
    let (keys, values) = kv.codecs();
    let (k_rot, v_rot) = (keys.rotated() && !q_rotated, values.rotated());
    let (mut scores, mut tmp, mut qrot, mut key) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, &pos) in q_pos.iter().enumerate() {
        for h in 0..n_heads {
            let qh = q.index_axis_move(Axis(0), i).index_axis_move(Axis(0), h);
            let mut qh = qh
                .to_slice()
                .expect("the last axis is contiguous (checked)");
            if k_rot {
                qh = rotate(qh, &mut qrot);
            }
            let kvh = h / group;
            scores.clear();
            for seg in kv.segments() {
                for t in seg.visible(pos, params.mask) {
                    let mut k = head_row(seg.keys(), t, kvh, &mut tmp);
                    // A key stored less its key offset is the stored row plus it.
                    if let Some(t_b) = keys.key_offset(seg.start() + t, kvh) {
                        key.clear();
                        key.extend(k.iter().zip(t_b).map(|(a, b)| a + b));
                        k = &key;
                    }
                    scores.push(params.scale * dot(qh, k));
                }
            }
            weigh(i * n_heads + h, &mut scores);
            let mut o = out.index_axis_mut(Axis(0), i).index_axis_move(Axis(0), h);
            o.fill(0.0);
            let mut p = scores.iter();
            for seg in kv.segments() {
                for t in seg.visible(pos, params.mask) {
                    let pt = *p.next().expect("one score per visible slot");
                    for (oj, &vj) in o.iter_mut().zip(head_row(seg.values(), t, kvh, &mut tmp)) {
                        *oj += pt * vj;
                    }
                }
            }
            if v_rot {
                let o = o
                    .as_slice_mut()
                    .expect("the last axis is contiguous (checked)");
                unrotate(o);
            }
        }
    }
}

/// `H q / n` ([`unrotate`]) in `buf`: a query head matched to rotated keys.
fn rotate<'b>(q: &[f32], buf: &'b mut Vec<f32>) -> &'b [f32] {
    buf.clear();
    buf.extend_from_slice(q);
    unrotate(buf);
    buf
}

/// `o ← H o / n`, the codec's reference ([`KvCodec::unrotate`]): a weighted sum of
/// rotated values rotated back, or a query head matched to rotated keys.
pub fn unrotate(o: &mut [f32]) {
    KvCodec::unrotate(o);
}

#[cfg(test)]
mod tests {
    use super::softmax_max;

    /// Rows of every length around the 8 lanes, the maximum anywhere (a lane, the tail),
    /// against a plain left-to-right scan; a NaN anywhere turns the row to NaN; an
    /// all-`−∞` row to zeros.
    #[test]
    fn softmax_max_is_the_maximum_and_settles_the_special_rows() {
        for n in 0..40usize {
            for at in 0..n {
                let row: Vec<f32> = (0..n)
                    .map(|i| ((i * 37 + 11) % 17) as f32 - 20.0 + if i == at { 50.0 } else { 0.0 })
                    .collect();
                let mut plain = f32::NEG_INFINITY;
                for &v in &row {
                    if v > plain {
                        plain = v;
                    }
                }
                let mut x = row.clone();
                assert_eq!(softmax_max(&mut x), Some(plain), "n {n}, max at {at}");
                assert_eq!(x, row, "the row is left as it was");
                let mut x = row.clone();
                x[at] = f32::NAN;
                assert_eq!(softmax_max(&mut x), None, "n {n}, NaN at {at}");
                assert!(x.iter().all(|v| v.is_nan()), "n {n}, NaN at {at}: all NaN");
            }
            let mut x = vec![f32::NEG_INFINITY; n];
            assert_eq!(softmax_max(&mut x), None, "n {n}: all −∞");
            assert!(x.iter().all(|&v| v == 0.0), "n {n}: all −∞ becomes zeros");
        }
    }
}
