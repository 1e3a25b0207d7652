//! Sessions on a sliding-window store (`WindowKv`), end to end through the forward pass
//! of a tiny random Gemma 3 model (window 8 on every layer):
//! - with windows longer than the conversation the logits are bitwise a `GrowKv`
//!   session's;
//! - a new turn that diverges behind the rewind limit is prefilled again from position 0
//!   (`reused = 0`), bitwise as a fresh session; one that diverges within it reuses the
//!   prefix;
//! - `Session::truncate` behind the window is `KvError::BehindWindow` and changes
//!   nothing; by one position, or to 0, it works;
//! - state files of windowed stores hold only the retained rows, restore bitwise
//!   (also after a truncation left `w − 1` positions) and continue as if never saved;
//!   a windowed file does not load into a dense store, a dense one not into a windowed
//!   store, nor one of other windows, and each refusal leaves the session unchanged;
//!   version-1 files of full stores still load into stores without windows;
//! - `Session::load` builds the model's own (windowed) store and continues bitwise.

use kvcore::gguf::GgufFile;
use kvcore::model::Llama;
use kvcore::session::file::VERSION;
use kvcore::{DType, GrowKv, KvError, KvRestore, KvStore, Session, SessionError, WindowKv};
use kvcore_scalar::Scalar;
use kvcore_test_support::session::{reseal, snapshot};
use kvcore_test_support::tiny::TinyLlama;

const WINDOW: usize = 8;
const CONTEXT: usize = 200;

fn model() -> Llama<Scalar> {
    let spec = TinyLlama {
        n_layers: 3,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 8,
        ffn_dim: 32,
        vocab_size: 64,
        context_len: CONTEXT,
        dtype: DType::F32,
        seed: 17,
        untied_output: true,
    };
    // A gemma3 file: every layer of three attends through a window of `WINDOW` (layer
    // `l` is a window layer when `l % 6 < 5`), so stores keeping that window or more on
    // any layer are exact for it (`Llama::forward` refuses a store whose window is
    // smaller than the layer's).
    Llama::load(
        GgufFile::from_bytes(spec.to_gemma3_gguf(WINDOW)).unwrap(),
        Scalar::new(),
    )
    .unwrap()
}

/// Decodes `ids` on `a` and `b`, one at a time: each step's logits bit for bit alike.
fn decode_alike<K: KvStore, L: KvStore>(
    model: &Llama<Scalar>,
    a: &mut Session<K>,
    b: &mut Session<L>,
    ids: &[u32],
) {
    for &id in ids {
        let (x, y) = (a.decode(model, id).unwrap(), b.decode(model, id).unwrap());
        assert_eq!(bits(&x), bits(&y), "decoding {id}");
    }
}

fn windowed(model: &Llama<Scalar>, windows: &[Option<usize>]) -> Session<WindowKv> {
    Session::new(WindowKv::new(model.kv_geometry(), CONTEXT, windows).unwrap())
}

/// The store keeps windows of [`WINDOW`] on layers 0 and 1 and every position on layer 2
/// (exact too: it keeps more than the layer sees).
const WINDOWS: [Option<usize>; 3] = [Some(WINDOW), Some(WINDOW), None];

fn ids(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7 + seed) % 64).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn to_bytes<K: KvStore>(s: &Session<K>, model: &Llama<Scalar>) -> Vec<u8> {
    let mut out = Vec::new();
    s.write_to(model, b"meta", &mut out).unwrap();
    out
}

fn restore<K: KvRestore>(
    s: &mut Session<K>,
    model: &Llama<Scalar>,
    bytes: &[u8],
) -> Result<(), SessionError> {
    s.restore_from(model, bytes, bytes.len() as u64, |_| Ok(()))
}

#[test]
fn windows_longer_than_the_conversation_are_a_grow_store() {
    let model = model();
    let mut grow = Session::new(GrowKv::new(model.kv_geometry(), CONTEXT).unwrap());
    let mut win = windowed(&model, &[Some(100), Some(50), None]);
    let a = ids(40, 3);
    let (g, w) = (
        grow.prefill(&model, &a).unwrap(),
        win.prefill(&model, &a).unwrap(),
    );
    assert_eq!(bits(&g.logits), bits(&w.logits));
    decode_alike(&model, &mut grow, &mut win, &[5, 9, 11]);
}

#[test]
fn a_turn_diverging_behind_the_window_is_prefilled_again_from_zero() {
    let model = model();
    let mut session = windowed(&model, &WINDOWS);
    let a = ids(30, 1);
    session.prefill(&model, &a).unwrap();
    // Diverging at 10 needs positions 3..10, long evicted: start over.
    let b: Vec<u32> = a[..10].iter().copied().chain(ids(6, 40)).collect();
    assert!(!session.kv().can_rewind_to(10));
    let turn = session.prefill(&model, &b).unwrap();
    assert_eq!((turn.reused, turn.prefilled), (0, b.len()));
    let mut fresh = windowed(&model, &WINDOWS);
    let want = fresh.prefill(&model, &b).unwrap();
    assert_eq!(bits(&turn.logits), bits(&want.logits));
    assert_eq!(snapshot(&session), snapshot(&fresh));
    // The same turn again re-runs its last token (always possible)...
    let again = session.prefill(&model, &b).unwrap();
    assert_eq!((again.reused, again.prefilled), (b.len() - 1, 1));
    // ... and a turn that extends it reuses everything.
    let c: Vec<u32> = b.iter().copied().chain([1, 2]).collect();
    let turn = session.prefill(&model, &c).unwrap();
    assert_eq!((turn.reused, turn.prefilled), (b.len(), 2));
    // A grow store reuses the prefix of 10.
    let mut grow = Session::new(GrowKv::new(model.kv_geometry(), CONTEXT).unwrap());
    grow.prefill(&model, &a).unwrap();
    assert_eq!(grow.prefill(&model, &b).unwrap().reused, 10);
}

#[test]
fn truncating_behind_the_window_is_refused_and_changes_nothing() {
    let model = model();
    let mut session = windowed(&model, &WINDOWS);
    session.prefill(&model, &ids(20, 2)).unwrap();
    let before = snapshot(&session);
    assert_eq!(
        session.truncate(12),
        Err(KvError::BehindWindow {
            pos: 12,
            earliest: 19
        })
    );
    assert_eq!(snapshot(&session), before);
    session.truncate(19).unwrap();
    assert_eq!(session.len(), 19);
    assert!(session.truncate(18).is_err(), "only one step back");
    // Regenerating the last token by truncate + decode is bitwise the prefill that
    // replaces it (the same store state reached two ways). (A fresh run would hold one
    // more position in the ring, which this causal-mask model would see.)
    let logits = session.decode(&model, 33).unwrap();
    let mut other = windowed(&model, &WINDOWS);
    other.prefill(&model, &ids(20, 2)).unwrap();
    let replaced: Vec<u32> = ids(20, 2)[..19].iter().copied().chain([33]).collect();
    let turn = other.prefill(&model, &replaced).unwrap();
    assert_eq!((turn.reused, turn.prefilled), (19, 1));
    assert_eq!(bits(&logits), bits(&turn.logits));
    assert_eq!(snapshot(&session), snapshot(&other));
    session.truncate(0).unwrap();
    assert!(session.is_empty() && session.kv().is_empty());
}

#[test]
fn windowed_files_hold_the_retained_rows_and_continue_bitwise() {
    let model = model();
    let g = model.kv_geometry();
    let row = 2 * g.kv_dim() * 4;
    let mut session = windowed(&model, &WINDOWS);
    session.prefill(&model, &ids(30, 5)).unwrap();
    for cut in [false, true] {
        if cut {
            // Seven positions left in the window layers.
            session.truncate(session.len() - 1).unwrap();
        }
        let n = session.len();
        let bytes = to_bytes(&session, &model);
        let window_rows = if cut { WINDOW - 1 } else { WINDOW };
        let n_rows = 2 * window_rows + n;
        assert_eq!(
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
            VERSION
        );
        assert_eq!(
            u64::from_le_bytes(bytes[80..88].try_into().unwrap()),
            n_rows as u64
        );
        assert_eq!(
            bytes.len(),
            88 + 4 * n + 4 + 8 + 3 * 24 + n_rows * row + 32,
            "only the retained rows"
        );
        // Layer 0 records start, count and its window.
        let layer0 = 88 + 4 * n + 4 + 8;
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        assert_eq!(
            (u64_at(layer0), u64_at(layer0 + 8), u64_at(layer0 + 16)),
            ((n - window_rows) as u64, window_rows as u64, WINDOW as u64)
        );
        let mut loaded = windowed(&model, &WINDOWS);
        loaded.prefill(&model, &[1, 2, 3]).unwrap();
        restore(&mut loaded, &model, &bytes).unwrap();
        assert_eq!(snapshot(&loaded).rows, snapshot(&session).rows);
        assert_eq!(loaded.tokens(), session.tokens());
        let mut never = windowed(&model, &WINDOWS);
        restore(&mut never, &model, &bytes).unwrap();
        for id in [4, 8, 15, 16, 23, 42] {
            let (a, b) = (
                session.fork().unwrap().decode(&model, id).unwrap(),
                loaded.decode(&model, id).unwrap(),
            );
            assert_eq!(bits(&a), bits(&b));
            session.decode(&model, id).unwrap();
        }
    }
}

#[test]
fn session_load_builds_the_models_windowed_store() {
    let model = model();
    let mut session = Session::new(model.new_kv(CONTEXT).unwrap());
    session.prefill(&model, &ids(30, 9)).unwrap();
    let path = std::env::temp_dir().join(format!(
        "kvcore-session-window-{}.session",
        std::process::id()
    ));
    session.save_with_meta(&model, &path, b"turns").unwrap();
    let loaded = Session::load_with_meta(&path, &model);
    let _ = std::fs::remove_file(&path);
    let (mut loaded, meta) = loaded.unwrap();
    assert_eq!(meta, b"turns");
    // The model's store: every layer of the tiny file is a window layer.
    for layer in 0..model.kv_geometry().n_layers {
        assert_eq!(loaded.kv().window(layer), Some(WINDOW), "layer {layer}");
    }
    assert_eq!(loaded.kv().max_ctx(), CONTEXT);
    assert_eq!(snapshot(&loaded).rows, snapshot(&session).rows);
    decode_alike(&model, &mut session, &mut loaded, &[4, 8, 15, 16, 23, 42]);
}

#[test]
fn files_of_other_windows_are_refused_and_change_nothing() {
    let model = model();
    let conversation = ids(25, 9);
    let mut win = windowed(&model, &WINDOWS);
    win.prefill(&model, &conversation).unwrap();
    let mut grow = Session::new(GrowKv::new(model.kv_geometry(), CONTEXT).unwrap());
    grow.prefill(&model, &conversation).unwrap();
    let (win_file, grow_file) = (to_bytes(&win, &model), to_bytes(&grow, &model));

    let mismatch = |err: SessionError, want_layer: usize, want_file, want_store| match err {
        SessionError::WindowMismatch { layer, file, store } => {
            assert_eq!((layer, file, store), (want_layer, want_file, want_store))
        }
        other => panic!("expected WindowMismatch, got {other}"),
    };
    let mut target = Session::new(GrowKv::new(model.kv_geometry(), CONTEXT).unwrap());
    target.prefill(&model, &[3, 4]).unwrap();
    let before = snapshot(&target);
    let err = restore(&mut target, &model, &win_file).unwrap_err();
    assert!(err.to_string().contains("sliding window 8"), "{err}");
    mismatch(err, 0, Some(WINDOW as u64), None);
    assert_eq!(snapshot(&target), before);

    for (windows, source, layer, file, store) in [
        (WINDOWS, &grow_file, 0, None, Some(WINDOW)),
        (
            [Some(WINDOW), Some(9), None],
            &win_file,
            1,
            Some(WINDOW as u64),
            Some(9),
        ),
        (
            [Some(WINDOW), Some(WINDOW), Some(WINDOW)],
            &win_file,
            2,
            None,
            Some(WINDOW),
        ),
    ] {
        let mut target = windowed(&model, &windows);
        target.prefill(&model, &[3, 4]).unwrap();
        let before = snapshot(&target);
        mismatch(
            restore(&mut target, &model, source).unwrap_err(),
            layer,
            file,
            store,
        );
        assert_eq!(snapshot(&target), before);
    }
    let mut same = windowed(&model, &WINDOWS);
    restore(&mut same, &model, &win_file).unwrap();
    assert_eq!(snapshot(&same).rows, snapshot(&win).rows);
}

/// A version-3 file of a full store without key offsets rewritten as version 1 (no
/// `n_rows`, no key-offsets section, no windows).
fn as_version_1(v2: &[u8], n: usize, n_layers: usize, row: usize) -> Vec<u8> {
    let mut v1 = v2[..80].to_vec();
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    let layers = 88 + 4 * n + 4 + 8;
    v1.extend_from_slice(&v2[88..layers - 8]);
    for layer in 0..n_layers {
        let at = layers + layer * (24 + n * row);
        v1.extend_from_slice(&v2[at..at + 16]);
        v1.extend_from_slice(&v2[at + 24..at + 24 + n * row]);
    }
    v1.extend_from_slice(&[0; 32]);
    reseal(v1)
}

#[test]
fn version_1_files_of_full_stores_still_load() {
    let model = model();
    let g = model.kv_geometry();
    let mut grow = Session::new(GrowKv::new(g, CONTEXT).unwrap());
    grow.prefill(&model, &ids(12, 4)).unwrap();
    let v1 = as_version_1(&to_bytes(&grow, &model), 12, g.n_layers, 2 * g.kv_dim() * 4);
    let mut loaded = Session::new(GrowKv::new(g, CONTEXT).unwrap());
    restore(&mut loaded, &model, &v1).unwrap();
    assert_eq!(snapshot(&loaded), snapshot(&grow));
    let mut win = windowed(&model, &WINDOWS);
    assert!(matches!(
        restore(&mut win, &model, &v1).unwrap_err(),
        SessionError::WindowMismatch {
            layer: 0,
            file: None,
            store: Some(WINDOW)
        }
    ));
}

#[test]
fn a_row_count_that_disagrees_with_the_layers_is_refused() {
    let model = model();
    let g = model.kv_geometry();
    let mut win = windowed(&model, &WINDOWS);
    win.prefill(&model, &ids(20, 6)).unwrap();
    let good = to_bytes(&win, &model);
    // One more row declared, and its bytes added before the checksum: the length checks
    // out, the layers do not.
    let mut more = good[..good.len() - 32].to_vec();
    let n_rows = u64::from_le_bytes(more[80..88].try_into().unwrap());
    more[80..88].copy_from_slice(&(n_rows + 1).to_le_bytes());
    more.extend(std::iter::repeat_n(0u8, 2 * g.kv_dim() * 4 + 32));
    let mut target = windowed(&model, &WINDOWS);
    let before = snapshot(&target);
    assert!(matches!(
        restore(&mut target, &model, &reseal(more)).unwrap_err(),
        SessionError::RowCount { declared, found } if declared == n_rows + 1 && found == n_rows
    ));
    // A window layer that claims every position (a dense layer's span).
    let layer0 = 88 + 4 * 20 + 4 + 8;
    let mut wide = good.clone();
    wide[layer0..layer0 + 8].copy_from_slice(&0u64.to_le_bytes());
    assert!(matches!(
        restore(&mut target, &model, &reseal(wide)).unwrap_err(),
        SessionError::LayerPositions {
            layer: 0,
            start: 0,
            first: 12,
            last: 13,
            ..
        }
    ));
    assert_eq!(snapshot(&target), before);
}
