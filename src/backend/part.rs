//! Attention in parts of the view: the split softmax (flash-decoding) and its exact merge.
//!
//! A backend that splits attention over its keys computes, for each query row and head and
//! each part of the view (a run of slots), the part's softmax state: the largest visible
//! score `m`, `l = Σ e^(s−m)` and the unnormalised output `o = Σ e^(s−m) v` over the
//! part's visible slots. Parts are folded left to right by [`merge_part`] and the result
//! is normalised by [`finish_part`]:
//!
//! - `M = max(m₁, m₂)`, `α = e^(m₁−M)`, `β = e^(m₂−M)` (the exact `f32::exp`),
//!   `l = l₁·α + l₂·β`, `o = o₁·α + o₂·β` element by element (two rounded products and a
//!   rounded sum, never fused);
//! - then `out = o / l`.
//!
//! Mathematically this is the softmax over the union of the parts; numerically it adds a
//! few roundings per part (relative `≈ 4u` per merge on every output, far inside the
//! conformance tolerance of attention). What matters for parallel backends is that the
//! operations are fixed: a backend whose whole-view attention is "its parts at
//! [`Backend::attention_part_len`] boundaries, folded by these functions" gives the same
//! bits when another backend (`kvcore_rayon::Rayon`) computes those parts on several
//! threads and folds them in the same order.
//!
//! Edge cases follow [`Backend::attention`]: a part whose row sees no slot is
//! [`PartStat::EMPTY`] with a zero output and changes nothing in a merge; a row that sees
//! nothing at all finishes as zeros; a NaN score makes the row NaN.
//!
//! [`Backend::attention_part_len`]: super::Backend::attention_part_len
//! [`Backend::attention`]: super::Backend::attention

/// The softmax state of one query row and head over the slots seen so far.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PartStat {
    /// The largest visible score (`−∞` when no slot was seen; NaN when a score was NaN).
    pub max: f32,
    /// `Σ e^(s − max)` over the visible scores.
    pub sum: f32,
}

impl PartStat {
    /// No slot seen.
    pub const EMPTY: PartStat = PartStat {
        max: f32::NEG_INFINITY,
        sum: 0.0,
    };

    /// Whether no slot was seen (a NaN state is not empty).
    pub fn is_empty(&self) -> bool {
        self.max == f32::NEG_INFINITY
    }
}

/// Folds a part `(part, part_out)` into the running state `(acc, acc_out)` (see the
/// module docs for the arithmetic). `acc_out` and `part_out` are one head's unnormalised
/// outputs, of equal length.
///
/// # Panics
/// If the lengths differ (a programming error).
pub fn merge_part(acc: &mut PartStat, acc_out: &mut [f32], part: PartStat, part_out: &[f32]) {
    assert_eq!(acc_out.len(), part_out.len(), "merge_part: head lengths");
    if part.is_empty() {
        return;
    }
    if acc.is_empty() {
        *acc = part;
        acc_out.copy_from_slice(part_out);
        return;
    }
    if acc.max.is_nan() || part.max.is_nan() {
        *acc = PartStat {
            max: f32::NAN,
            sum: f32::NAN,
        };
        acc_out.fill(f32::NAN);
        return;
    }
    let max = acc.max.max(part.max);
    let (a, b) = ((acc.max - max).exp(), (part.max - max).exp());
    acc.sum = acc.sum * a + part.sum * b;
    acc.max = max;
    for (o, &p) in acc_out.iter_mut().zip(part_out) {
        *o = *o * a + p * b;
    }
}

/// `out ← out / sum`, the end of a split softmax: zeros for a row that saw nothing.
pub fn finish_part(stat: PartStat, out: &mut [f32]) {
    if stat.is_empty() {
        out.fill(0.0);
        return;
    }
    for o in out.iter_mut() {
        *o /= stat.sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The softmax-weighted sum of `(score, value)` pairs in f64, the oracle.
    fn direct(pairs: &[(f32, f32)]) -> f64 {
        let m = pairs
            .iter()
            .fold(f64::NEG_INFINITY, |m, p| m.max(p.0.into()));
        let w: Vec<f64> = pairs.iter().map(|p| (f64::from(p.0) - m).exp()).collect();
        let l: f64 = w.iter().sum();
        pairs
            .iter()
            .zip(&w)
            .map(|(p, w)| w * f64::from(p.1))
            .sum::<f64>()
            / l
    }

    /// One part's state over `pairs`, computed directly in f32.
    fn part(pairs: &[(f32, f32)]) -> (PartStat, f32) {
        let max = pairs.iter().fold(f32::NEG_INFINITY, |m, p| m.max(p.0));
        if pairs.is_empty() {
            return (PartStat::EMPTY, 0.0);
        }
        let (mut sum, mut o) = (0.0f32, 0.0f32);
        for &(s, v) in pairs {
            let e = (s - max).exp();
            sum += e;
            o += e * v;
        }
        (PartStat { max, sum }, o)
    }

    #[test]
    fn merged_parts_are_the_softmax_of_their_union() {
        let pairs: Vec<(f32, f32)> = (0..300)
            .map(|i| {
                (
                    ((i * 37) % 101) as f32 * 0.21 - 9.0,
                    ((i * 13) % 17) as f32 - 8.0,
                )
            })
            .collect();
        for cut in [1, 7, 64, 150, 299] {
            let (mut acc, mut out) = (PartStat::EMPTY, [0.0f32]);
            for chunk in pairs.chunks(cut) {
                let (s, o) = part(chunk);
                merge_part(&mut acc, &mut out, s, &[o]);
            }
            finish_part(acc, &mut out);
            let want = direct(&pairs);
            assert!(
                (f64::from(out[0]) - want).abs() < 1e-4,
                "cut {cut}: {} vs {want}",
                out[0]
            );
        }
    }

    #[test]
    fn empty_parts_change_nothing_and_nan_spreads() {
        let (s, o) = part(&[(1.0, 2.0), (3.0, -1.0)]);
        let (mut acc, mut out) = (PartStat::EMPTY, [0.0f32]);
        merge_part(&mut acc, &mut out, PartStat::EMPTY, &[0.0]);
        merge_part(&mut acc, &mut out, s, &[o]);
        merge_part(&mut acc, &mut out, PartStat::EMPTY, &[0.0]);
        assert_eq!((acc, out[0]), (s, o));

        let mut none = [5.0f32];
        finish_part(PartStat::EMPTY, &mut none);
        assert_eq!(none, [0.0]);

        let nan = PartStat {
            max: f32::NAN,
            sum: f32::NAN,
        };
        merge_part(&mut acc, &mut out, nan, &[f32::NAN]);
        assert!(acc.max.is_nan() && out[0].is_nan());
    }
}
