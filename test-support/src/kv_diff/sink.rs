//! Differential testing of the sink store, [`SinkKv`]: a [`Scenario`]'s ops replayed on
//! a `SinkKv` and on a [`DenseKv`] given the same calls (the reference: every position
//! kept), checked after the begin, every write and every op:
//! - both return the same `Result`, except that the sink store may refuse a rewind
//!   ([`KvError::BehindWindow`], only when a position its window ring needs for a query
//!   there is gone) or fail to allocate (its gate, armed by [`KvOp::RefuseNextAlloc`]):
//!   then the dense store is not asked (its append rolled back), and a failed or
//!   rolled-back op leaves both stores exactly as they were;
//! - `can_rewind_to` answers what `truncate` then does;
//! - every layer's view shows, in ascending order, every position a query can still see
//!   (the sinks `0 .. min(len, keep)` and the window `max(keep, len + 1 − w) .. len`, or
//!   during an append at `at` of `n`, from `at + 1 − w` on and every pending row), each
//!   with the dense store's stored bytes; the sinks scored as
//!   [`SinkKv::sink_scoring`], the rest as [`SinkKv::window_scoring`];
//! - outside an append, its bytes are at most `n_layers · (min(keep, max_ctx) + min(w,
//!   max_ctx))` positions' K and V rows, and it holds at most `keep + w` positions per
//!   layer.
//!
//! The sinks and window come from the scenario's first two windows
//! ([`sink_params`]); the `kv_sink` fuzz target decodes its input with
//! [`Scenario::from_window_bytes`], as `kv_window` does.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kvcore::kv::{DenseKv, KvError, KvStore, SinkKv};

use super::{
    Divergence, End, KvOp, MAX_SEQS, RefuseNext, Scenario, Snapshot, Start, layer_bits,
    position_bytes, rows, snapshot,
};

/// The sinks `keep` and the window `w` of a scenario's sink store: `keep` from its second
/// window (`w mod 9`, 0 when none), `w` from its first (`max_ctx + 1` when none: a window
/// that never evicts).
pub fn sink_params(scenario: &Scenario) -> (usize, usize) {
    let at = |i: usize| scenario.windows.get(i).copied().flatten();
    let keep = at(1).map_or(0, |k| k % 9);
    let window = at(0).unwrap_or(scenario.max_ctx + 1);
    (keep, window)
}

/// One sequence on both stores.
struct Pair {
    sink: SinkKv,
    dense: DenseKv,
}

impl Pair {
    fn snapshots(&self) -> Result<[Snapshot; 2], String> {
        Ok([snapshot(&self.sink)?, snapshot(&self.dense)?])
    }

    fn unchanged(&self, before: &[Snapshot; 2], what: &str) -> Result<(), String> {
        if self.snapshots()? == *before {
            Ok(())
        } else {
            Err(format!("{what} changed a store"))
        }
    }

    /// Layer `layer` of the sink store shows every position a query from `from` on sees
    /// up to `end` (the sinks below `keep`, the window from `from + 1 − w`), each with
    /// the dense store's bytes; returns the positions shown.
    fn shows(&self, layer: usize, from: usize, end: usize) -> Result<Vec<usize>, String> {
        let (keep, w) = (self.sink.keep(), self.sink.window_len());
        let mut needed = (0..end.min(keep)).chain(keep.max((from + 1).saturating_sub(w))..end);
        let (positions, k, v) = layer_bits(&self.sink, layer)?;
        let (all, dk, dv) = layer_bits(&self.dense, layer)?;
        if let Some(p) = needed.find(|p| positions.binary_search(p).is_err()) {
            return Err(format!(
                "layer {layer} (queries from {from}, {end} positions): position {p} is missing from {positions:?}"
            ));
        }
        let d = self.sink.geometry().kv_dim();
        let (kt, vt) = self.sink.kv_types();
        let row = |t: kvcore::KvType| t.row_bytes(d).expect("an accepted geometry");
        let (kr, vr) = (row(kt), row(vt));
        for (i, &p) in positions.iter().enumerate() {
            let j = all.binary_search(&p).map_err(|_| {
                format!("layer {layer}: SinkKv shows position {p} the dense store lacks")
            })?;
            if k[i * kr..(i + 1) * kr] != dk[j * kr..(j + 1) * kr]
                || v[i * vr..(i + 1) * vr] != dv[j * vr..(j + 1) * vr]
            {
                return Err(format!("layer {layer}: position {p} holds other bytes"));
            }
        }
        Ok(positions)
    }

    /// Outside an append: every layer shows what a query sees ([`shows`](Self::shows)),
    /// scored right, at most `keep + w` positions, and the bytes are bounded.
    fn check(&self) -> Result<(), String> {
        let (sink, dense) = (&self.sink, &self.dense);
        if sink.len() != dense.len() {
            return Err(format!(
                "len: SinkKv {}, DenseKv {}",
                sink.len(),
                dense.len()
            ));
        }
        let (keep, w, len) = (sink.keep(), sink.window_len(), sink.len());
        let g = sink.geometry();
        for layer in 0..g.n_layers {
            let view = sink.view(layer).map_err(|e| format!("SinkKv view: {e}"))?;
            for s in view.segments() {
                let want = if s.start() < keep {
                    sink.sink_scoring()
                } else {
                    sink.window_scoring()
                };
                if s.scoring() != want || (s.start() < keep && s.positions().end > keep) {
                    return Err(format!(
                        "layer {layer}: the segment at {:?} is scored {:?}",
                        s.positions(),
                        s.scoring()
                    ));
                }
            }
            let held = self.shows(layer, len, len)?.len();
            if held > keep + w {
                return Err(format!(
                    "layer {layer}: {held} positions held, more than {keep} + {w}"
                ));
            }
        }
        let per_position = position_bytes(g.kv_dim(), sink.kv_types());
        let max_ctx = sink.max_ctx();
        let bound = g.n_layers * (keep.min(max_ctx) + w.min(max_ctx)) * per_position;
        if sink.bytes() > bound {
            return Err(format!(
                "SinkKv holds {} bytes, more than {bound}",
                sink.bytes()
            ));
        }
        Ok(())
    }
}

/// Replays `scenario` on a [`SinkKv`] (sinks and window from [`sink_params`]) against a
/// [`DenseKv`].
///
/// # Errors
/// The first [`Divergence`].
pub fn run(scenario: &Scenario) -> Result<(), Divergence> {
    let (g, max_ctx, types) = (scenario.geometry(), scenario.max_ctx, scenario.types);
    let (keep, window) = sink_params(scenario);
    let at_start = |detail: String| Divergence { op: None, detail };
    let offsets = scenario.key_offsets();
    let sink = SinkKv::with_types(g, max_ctx, keep, window, types).and_then(|s| match &offsets {
        Some(o) => s.with_key_codec(&kvcore::kv::KvCodec::with_key_offsets(types.0, o.clone())?),
        None => Ok(s),
    });
    let dense = DenseKv::with_types(g, max_ctx, types).and_then(|d| match &offsets {
        Some(o) => d.with_key_offsets(o.clone()),
        None => Ok(d),
    });
    let (mut sink, dense) = match (sink, dense) {
        (Ok(s), Ok(d)) => (s, d),
        (Err(a), Err(b)) if a == b => return Ok(()),
        (a, b) => {
            return Err(at_start(format!(
                "constructors disagree: SinkKv {:?}, DenseKv {:?}",
                a.map(drop),
                b.map(drop)
            )));
        }
    };
    let gate = Arc::new(RefuseNext::default());
    sink.set_alloc_gate(Some(gate.clone()));
    let mut seqs = vec![Pair { sink, dense }];
    seqs[0].check().map_err(at_start)?;
    for (index, op) in scenario.ops.iter().enumerate() {
        let diverged = |detail: String| Divergence {
            op: Some((index, op.clone())),
            detail,
        };
        step(&mut seqs, op, &gate).map_err(diverged)?;
        if !matches!(op, KvOp::RefuseNextAlloc) {
            gate.0.store(false, Ordering::Relaxed);
        }
        for seq in &seqs {
            seq.check().map_err(diverged)?;
        }
    }
    Ok(())
}

/// Whether the sink store's refusal of a rewind to `n` may be right: its window ring
/// keeps positions `lo .. len` and refuses when `lo > n + 1 − w`; the view shows the
/// ring's positions from `keep` on, so `lo` is at most the first of them, or `len` when
/// none is shown.
fn refusal_ok(sink: &SinkKv, n: usize) -> Result<bool, String> {
    let view = sink.view(0).map_err(|e| format!("SinkKv view: {e}"))?;
    let keep = sink.keep();
    let first = view.positions().find(|&p| p >= keep).unwrap_or(sink.len());
    Ok(0 < n && n < sink.len() && n + 1 < sink.window_len() + first)
}

fn step(seqs: &mut Vec<Pair>, op: &KvOp, gate: &RefuseNext) -> Result<(), String> {
    let pick = |seq: u8, n: usize| usize::from(seq) % n;
    match op {
        KvOp::RefuseNextAlloc => gate.0.store(true, Ordering::Relaxed),
        KvOp::Append {
            seq,
            start,
            n,
            bits,
            end,
        } => {
            let i = pick(*seq, seqs.len());
            append(&mut seqs[i], *start, *n, bits, *end)?;
        }
        KvOp::Truncate { seq, .. } | KvOp::TruncateBack { seq, .. } => {
            let i = pick(*seq, seqs.len());
            let s = &mut seqs[i];
            let n = match op {
                KvOp::TruncateBack { back, .. } => s.sink.len().saturating_sub(usize::from(*back)),
                KvOp::Truncate { n, .. } => *n,
                _ => unreachable!("matched above"),
            };
            let before = s.snapshots()?;
            let can = n >= s.sink.len() || s.sink.can_rewind_to(n);
            match s.sink.truncate(n) {
                Ok(()) if can => s
                    .dense
                    .truncate(n)
                    .map_err(|e| format!("DenseKv truncate failed: {e}"))?,
                Err(KvError::BehindWindow { .. }) if !can && refusal_ok(&s.sink, n)? => {
                    s.unchanged(&before, "a refused truncate")?
                }
                other => {
                    return Err(format!(
                        "SinkKv truncate({n}): {other:?} where can_rewind_to said {can}"
                    ));
                }
            }
        }
        KvOp::Clear { seq } => {
            let i = pick(*seq, seqs.len());
            let s = &mut seqs[i];
            s.sink.clear();
            s.dense.clear();
        }
        KvOp::Fork { seq } => {
            let s = &seqs[pick(*seq, seqs.len())];
            if seqs.len() < MAX_SEQS {
                match (s.sink.fork(), s.dense.fork()) {
                    (Ok(sink), Ok(dense)) => {
                        let fork = Pair { sink, dense };
                        if fork.snapshots()? != s.snapshots()? {
                            return Err("a fork differs from its parent".into());
                        }
                        seqs.push(fork);
                    }
                    (Err(KvError::AllocFailed { .. }), Ok(_)) => {}
                    (a, b) => {
                        return Err(format!(
                            "fork: SinkKv {:?}, DenseKv {:?}",
                            a.map(drop),
                            b.map(drop)
                        ));
                    }
                }
            }
        }
        KvOp::Free { seq } => {
            if seqs.len() > 1 {
                let i = pick(*seq, seqs.len());
                seqs.remove(i);
            }
        }
    }
    Ok(())
}

/// One append driven step by step on both stores.
fn append(pair: &mut Pair, start: Start, n: usize, bits: &[u32], end: End) -> Result<(), String> {
    let before = pair.snapshots()?;
    let len = pair.sink.len();
    let at = match start {
        Start::End => len,
        Start::Back(back) => len.saturating_sub(usize::from(back)),
        Start::At(at) => at,
    };
    let g = pair.sink.geometry();
    let can = at <= len && pair.sink.can_rewind_to(at);
    let (sink, dense) = (pair.sink.begin(at, n), pair.dense.begin(at, n));
    match (&sink, &dense) {
        (Ok(()), Ok(())) => {}
        (Err(KvError::AllocFailed { .. }), _) => {}
        (Err(KvError::BehindWindow { .. }), Ok(())) if !can && refusal_ok(&pair.sink, at)? => {}
        (a, b) if a == b => {}
        (a, b) => return Err(format!("begin({at}, {n}): SinkKv {a:?}, DenseKv {b:?}")),
    }
    if sink.is_err() || dense.is_err() {
        if dense.is_ok() {
            pair.dense.rollback();
        }
        return pair.unchanged(&before, "a failed begin");
    }
    if at <= len && !can {
        return Err(format!("begin({at}) succeeded where can_rewind_to said no"));
    }
    let layers = g.n_layers;
    let (write_to, skip, bad) = match end {
        End::FailAfter(k) => (usize::from(k) % (layers + 1), None, None),
        End::SkipLayer(k) => (layers, Some(usize::from(k) % layers), None),
        End::BadRow(k) => (layers, None, Some(usize::from(k) % layers)),
        End::Commit | End::Rollback => (layers, None, None),
    };
    for layer in 0..write_to {
        if skip == Some(layer) {
            continue;
        }
        let kv_dim = g.kv_dim();
        let (k, v) = (
            rows(n, kv_dim, 0, layer, bits, false),
            rows(n, kv_dim, 0, layer, bits, true),
        );
        if bad == Some(layer) {
            let wide = rows(n, kv_dim, 1, layer, bits, true);
            let (a, b) = (
                pair.sink.write(layer, k.view(), wide.view()),
                pair.dense.write(layer, k.view(), wide.view()),
            );
            if a != b || a.is_ok() {
                return Err(format!("rows too wide: SinkKv {a:?}, DenseKv {b:?}"));
            }
        }
        let (a, b) = (
            pair.sink.write(layer, k.view(), v.view()),
            pair.dense.write(layer, k.view(), v.view()),
        );
        if a != b {
            return Err(format!("write({layer}): SinkKv {a:?}, DenseKv {b:?}"));
        }
        pair.shows(layer, at, at + n)?;
    }
    if matches!(end, End::Commit | End::BadRow(_) | End::SkipLayer(_)) {
        let (a, b) = (pair.sink.commit(), pair.dense.commit());
        if a != b {
            return Err(format!("commit: SinkKv {a:?}, DenseKv {b:?}"));
        }
        if a.is_ok() {
            return Ok(());
        }
    }
    pair.sink.rollback();
    pair.dense.rollback();
    pair.unchanged(&before, "a rolled-back append")
}
