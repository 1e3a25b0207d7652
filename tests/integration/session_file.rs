//! Session files (`src/session/file.rs`, `docs/session-format.md`): every malformed file
//! gives its own error and leaves the target session exactly as it was (ids, every row
//! bitwise, length, capacity, bytes); counts that claim more than the file holds fail
//! before anything is allocated from them; a flipped bit anywhere is caught; and save →
//! load → continue gives bit for bit the tokens and logits of never having saved, on
//! random tiny models (property test) and on SmolLM2.

use std::path::{Path, PathBuf};

use crate::common::{put_u32, put_u64, smollm2_file};
use kvcore::gguf::GgufFile;
use kvcore::model::{Llama, Sampler, Sampling};
use kvcore::session::file::{MAGIC, VERSION};
use kvcore::tokenizer::{ChatMessage, ChatTemplate, Special, Tokenizer};
use kvcore::{
    Backend, DType, DenseKv, GrowKv, KvError, KvGeometry, KvStore, KvType, Session, SessionError,
};
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;
use kvcore_test_support::session::{fails, reseal, rows, snapshot, to_bytes};
use kvcore_test_support::tiny::TinyLlama;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use sha2::{Digest, Sha256};

/// Header offsets (docs/session-format.md).
const N_KV_HEADS_AT: usize = 52;
const HEAD_DIM_AT: usize = 56;
const N_TOKENS_AT: usize = 64;
const META_LEN_AT: usize = 72;
const N_ROWS_AT: usize = 80;
const TOKENS_AT: usize = 88;
/// Bytes of a layer's `start, count, window`.
const LAYER_HEADER: usize = 24;
/// Bytes of the key-offsets section of a store without key offsets (`n_means = 0`).
const NO_OFFSETS: usize = 8;

fn tiny_config(seed: u64) -> TinyLlama {
    TinyLlama {
        n_layers: 2,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 8,
        ffn_dim: 16,
        vocab_size: 32,
        context_len: 64,
        dtype: DType::F32,
        seed,
        untied_output: false,
    }
}

fn load(tiny: &TinyLlama) -> Llama<Scalar> {
    Llama::load(GgufFile::from_bytes(tiny.to_gguf()).unwrap(), Scalar::new()).unwrap()
}

fn tiny(seed: u64) -> Llama<Scalar> {
    load(&tiny_config(seed))
}

/// A session holding `ids` on a fresh `GrowKv` with the model's context.
fn session_with<B: Backend>(model: &Llama<B>, ids: &[u32]) -> Session<GrowKv> {
    session_typed(model, ids, (KvType::F32, KvType::F32))
}

/// [`session_with`] on a store of K and V types `types`.
fn session_typed<B: Backend>(
    model: &Llama<B>,
    ids: &[u32],
    types: (KvType, KvType),
) -> Session<GrowKv> {
    let (g, max_ctx) = (model.kv_geometry(), model.config().context_len);
    let mut s = Session::new(GrowKv::with_types(g, max_ctx, types).unwrap());
    if !ids.is_empty() {
        s.prefill(model, ids).unwrap();
    }
    s
}

/// The model, a session of 7 positions (a prefill and a decode step) with a blob, its
/// file's bytes, and a target session holding something else.
struct Fixture {
    model: Llama<Scalar>,
    saved: Session<GrowKv>,
    bytes: Vec<u8>,
    target: Session<GrowKv>,
}

const META: &[u8] = b"{\"messages\":[]}";

fn fixture() -> Fixture {
    let model = tiny(1);
    let mut saved = session_with(&model, &[3, 1, 4, 1, 5, 9]);
    saved.decode(&model, 2).unwrap();
    let bytes = to_bytes(&saved, &model, META);
    let target = session_with(&model, &[7, 7, 8]);
    Fixture {
        model,
        saved,
        bytes,
        target,
    }
}

/// The offset of layer `layer`'s `start` field in a file of `n` positions of `kv_dim`
/// f32 elements with the blob [`META`].
fn layer_at(n: usize, kv_dim: usize, layer: usize) -> usize {
    TOKENS_AT + 4 * n + META.len() + NO_OFFSETS + layer * (LAYER_HEADER + 2 * n * kv_dim * 4)
}

#[test]
fn the_file_has_the_documented_layout() {
    let f = fixture();
    let b = &f.bytes;
    let g = f.model.kv_geometry();
    let n = f.saved.len();
    assert_eq!(&b[0..8], &MAGIC);
    assert_eq!(&b[0..8], b"KVCSESS\0");
    assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), VERSION);
    assert_eq!(&b[16..48], f.model.fingerprint());
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
    assert_eq!((u32_at(48), u32_at(52), u32_at(56)), (2, 1, 8));
    assert_eq!((b[60], b[61]), (0, 0));
    assert_eq!((u64_at(N_TOKENS_AT), u64_at(META_LEN_AT)), (n, META.len()));
    assert_eq!(
        u64_at(N_ROWS_AT),
        g.n_layers * n,
        "every layer holds every position"
    );
    for (i, id) in f.saved.tokens().iter().enumerate() {
        assert_eq!(u32_at(TOKENS_AT + 4 * i) as u32, *id);
    }
    assert_eq!(&b[TOKENS_AT + 4 * n..TOKENS_AT + 4 * n + META.len()], META);
    let kv_dim = g.kv_dim();
    for (layer, want) in rows(f.saved.kv()).iter().enumerate() {
        let at = layer_at(n, kv_dim, layer);
        assert_eq!(
            (u64_at(at), u64_at(at + 8), u64_at(at + 16)),
            (0, n, 0),
            "layer {layer} span and window"
        );
        // f32 rows, little-endian: the bytes `rows` reads from the views.
        let stored = &b[at + LAYER_HEADER..at + LAYER_HEADER + 2 * n * kv_dim * 4];
        assert_eq!(stored, &want[..], "layer {layer} rows");
    }
    let end = b.len() - 32;
    assert_eq!(end, layer_at(n, kv_dim, g.n_layers));
    assert_eq!(&b[end..], Sha256::digest(&b[..end]).as_slice());
}

#[test]
fn the_fingerprint_is_the_sha256_of_the_model_file() {
    // The digest published with the reference data, computed by others.
    let file = smollm2_file();
    let want = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
    let got: String = file
        .fingerprint()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(got, want);
    // Same shapes, other weights: another fingerprint.
    assert_ne!(tiny(1).fingerprint(), tiny(2).fingerprint());
    assert_eq!(tiny(1).fingerprint(), tiny(1).fingerprint());
}

#[test]
fn a_good_file_restores_exactly() {
    let mut f = fixture();
    let meta = f
        .target
        .restore_from(&f.model, &f.bytes[..], f.bytes.len() as u64, |m| {
            Ok(m.to_vec())
        })
        .unwrap();
    assert_eq!(meta, META);
    assert_eq!(f.target.tokens(), f.saved.tokens());
    assert_eq!(rows(f.target.kv()), rows(f.saved.kv()));
    assert_eq!(to_bytes(&f.target, &f.model, META), f.bytes);
}

#[test]
fn every_malformed_file_gives_its_own_error_and_changes_nothing() {
    let mut f = fixture();
    let good = f.bytes.clone();
    let (n, kv_dim) = (f.saved.len(), f.model.kv_geometry().kv_dim());
    let (model, t) = (&f.model, &mut f.target);

    let mut bad_magic = good.clone();
    bad_magic[0] = b'G';
    assert!(matches!(
        fails(model, t, &bad_magic),
        SessionError::NotASessionFile
    ));
    let gguf = tiny_config(1).to_gguf();
    assert!(matches!(
        fails(model, t, &gguf),
        SessionError::NotASessionFile
    ));

    let newer = reseal(put_u32(good.clone(), 8, VERSION + 1));
    assert!(matches!(
        fails(model, t, &newer),
        SessionError::UnsupportedVersion { found, supported: VERSION } if found == VERSION + 1
    ));

    let flags = reseal(put_u32(good.clone(), 12, 1));
    let mut reserved = good.clone();
    reserved[63] = 1;
    for (bytes, at, v) in [(flags, 12, 1), (reserved, 62, 256)] {
        let err = fails(model, t, &bytes);
        assert!(
            matches!(err, SessionError::Reserved { offset, value } if (offset, value) == (at, v)),
            "{err}"
        );
    }

    let mut code = good.clone();
    code[61] = 9;
    assert!(matches!(
        fails(model, t, &reseal(code)),
        SessionError::UnknownKvType {
            which: "V",
            code: 9
        }
    ));

    let len = good.len() as u64;
    for cut in [
        0,
        5,
        8,
        11,
        40,
        79,
        80,
        TOKENS_AT + 3,
        layer_at(n, kv_dim, 0) + 20,
        good.len() - 33,
        good.len() - 1,
    ] {
        let err = fails(model, t, &good[..cut]);
        // Before the version is read the shortest header is assumed (version 1's).
        let declared_ok = match cut {
            0..12 => 112,
            12..TOKENS_AT => 120,
            _ => len,
        };
        assert!(
            matches!(err, SessionError::Truncated { declared, actual } if declared == declared_ok && actual == cut as u64),
            "cut at {cut}: {err}"
        );
    }
    let mut longer = good.clone();
    longer.push(0);
    assert!(matches!(
        fails(model, t, &longer),
        SessionError::TrailingBytes { declared, actual } if declared == len && actual == len + 1
    ));

    let other = tiny(2);
    assert_eq!(other.kv_geometry(), model.kv_geometry());
    let foreign = to_bytes(&session_with(&other, &[1, 2, 3]), &other, b"");
    assert!(matches!(
        fails(model, t, &foreign),
        SessionError::ModelMismatch { expected, found }
            if &expected == model.fingerprint() && &found == other.fingerprint()
    ));

    // The same row size in another shape: 2 heads of 4 instead of 1 of 8.
    let reshaped = reseal(put_u32(
        put_u32(good.clone(), N_KV_HEADS_AT, 2),
        HEAD_DIM_AT,
        4,
    ));
    let err = fails(model, t, &reshaped);
    assert!(
        matches!(
            err,
            SessionError::GeometryMismatch { expected, found }
                if expected == model.kv_geometry() && found == KvGeometry { n_layers: 2, n_kv_heads: 2, head_dim: 4 }
        ),
        "{err}"
    );

    let mut vocab = good.clone();
    vocab[TOKENS_AT + 8..TOKENS_AT + 12].copy_from_slice(&32u32.to_le_bytes());
    assert!(matches!(
        fails(model, t, &reseal(vocab)),
        SessionError::TokenOutOfVocab {
            position: 2,
            id: 32,
            vocab_size: 32
        }
    ));

    let at = layer_at(n, kv_dim, 1);
    let shifted = reseal(put_u64(good.clone(), at, 1));
    assert!(matches!(
        fails(model, t, &shifted),
        SessionError::LayerPositions {
            layer: 1,
            start: 1,
            count: 7,
            n_tokens: 7,
            first: 0,
            last: 0,
        }
    ));
    // A shorter layer and a longer one: same file length, wrong span.
    let shorter = reseal(put_u64(good.clone(), at + 8, 6));
    assert!(matches!(
        fails(model, t, &shorter),
        SessionError::LayerPositions { count: 6, .. }
    ));

    let mut flipped = good.clone();
    let row = at + LAYER_HEADER + 5;
    flipped[row] ^= 0x10;
    assert!(matches!(
        fails(model, t, &flipped),
        SessionError::ChecksumMismatch { stored, computed }
            if stored[..] == good[good.len() - 32..] && computed != stored
    ));

    let before = snapshot(t);
    let err = t
        .restore_from(model, &good[..], len, |_| Err::<(), _>("not ours".into()))
        .unwrap_err();
    assert!(matches!(err, SessionError::MetaRejected { ref reason } if reason == "not ours"));
    assert_eq!(snapshot(t), before);
}

#[test]
fn a_store_that_cannot_hold_the_file_refuses_it_unchanged() {
    let f = fixture();
    let g = f.model.kv_geometry();
    let mut small = Session::new(GrowKv::new(g, 5).unwrap());
    small.prefill(&f.model, &[1, 2]).unwrap();
    let err = fails(&f.model, &mut small, &f.bytes);
    assert!(
        matches!(
            err,
            SessionError::Kv(KvError::ContextOverflow { pos: 6, max_ctx: 5 })
        ),
        "{err}"
    );
    // A store of another geometry than the model's.
    let wrong = KvGeometry {
        n_kv_heads: 2,
        head_dim: 4,
        ..g
    };
    let mut odd = Session::new(GrowKv::new(wrong, 64).unwrap());
    assert!(matches!(
        fails(&f.model, &mut odd, &f.bytes),
        SessionError::GeometryMismatch { found, .. } if found == wrong
    ));
}

#[test]
fn counts_that_claim_more_than_the_file_holds_allocate_nothing() {
    let mut f = fixture();
    let good = f.bytes.clone();
    let (model, t) = (&f.model, &mut f.target);
    // Allocating what these claim (petabytes) would abort the test process: that it
    // passes shows the length check came first.
    for (at, count) in [
        (N_TOKENS_AT, 1u64 << 50),
        (META_LEN_AT, 1 << 56),
        (N_TOKENS_AT, 8),
    ] {
        let err = fails(model, t, &reseal(put_u64(good.clone(), at, count)));
        assert!(
            matches!(err, SessionError::Truncated { declared, actual } if declared > actual && actual == good.len() as u64),
            "{at}: {err}"
        );
    }
    for (at, field) in [(N_TOKENS_AT, "n_tokens"), (META_LEN_AT, "meta_len")] {
        let err = fails(model, t, &reseal(put_u64(good.clone(), at, u64::MAX)));
        assert!(
            matches!(err, SessionError::CountOverflow { field: f } if f == field),
            "{field}: {err}"
        );
    }
    let huge_rows = reseal(put_u32(
        put_u32(good.clone(), N_KV_HEADS_AT, u32::MAX),
        HEAD_DIM_AT,
        u32::MAX,
    ));
    let err = fails(model, t, &huge_rows);
    assert!(matches!(err, SessionError::CountOverflow { .. }), "{err}");
    // Fewer tokens than stored: the file is longer than the header says.
    let err = fails(model, t, &reseal(put_u64(good.clone(), N_TOKENS_AT, 6)));
    assert!(matches!(err, SessionError::TrailingBytes { .. }), "{err}");
}

#[test]
fn a_flipped_bit_anywhere_is_caught() {
    let mut f = fixture();
    let good = f.bytes.clone();
    // Every byte of the file (header fields, ids, blob, each layer's span and rows, the
    // checksum), one bit each, cycling through the eight bit positions.
    for at in 0..good.len() {
        let mut bad = good.clone();
        bad[at] ^= 1 << (at % 8);
        let err = fails(&f.model, &mut f.target, &bad);
        if at >= TOKENS_AT {
            assert!(
                matches!(
                    err,
                    SessionError::ChecksumMismatch { .. }
                        | SessionError::TokenOutOfVocab { .. }
                        | SessionError::LayerPositions { .. }
                        | SessionError::WindowMismatch { .. }
                        | SessionError::CalibrationLength { .. }
                ),
                "byte {at}: {err}"
            );
        }
    }
}

/// A fresh directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(test: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("kvcore-session-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn save_and_load_through_files() {
    let f = fixture();
    let dir = TempDir::new("files");
    let path = dir.path().join("chat.session");
    f.saved.save_with_meta(&f.model, &path, META).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), f.bytes);
    assert_eq!(dir.entries(), ["chat.session"], "no temporary file is left");

    let (loaded, meta) = Session::load_with_meta(&path, &f.model).unwrap();
    assert_eq!(meta, META);
    assert_eq!(loaded.kv().max_ctx(), f.model.config().context_len);
    assert_eq!(snapshot(&loaded).rows, rows(f.saved.kv()));
    assert_eq!(loaded.tokens(), f.saved.tokens());

    // Saving over a file replaces it whole.
    let shorter = session_with(&f.model, &[1]);
    shorter.save(&f.model, &path).unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        to_bytes(&shorter, &f.model, b"")
    );
    assert_eq!(dir.entries(), ["chat.session"]);

    // Into a dense store of another ceiling.
    let mut dense = Session::new(DenseKv::new(f.model.kv_geometry(), 12).unwrap());
    f.saved.save(&f.model, &path).unwrap();
    assert!(dense.restore(&f.model, &path).unwrap().is_empty());
    assert_eq!(rows(dense.kv()), rows(f.saved.kv()));

    // I/O errors name the path and change nothing.
    let missing = dir.path().join("no-such.session");
    let before = snapshot(&dense);
    let err = dense.restore(&f.model, &missing).unwrap_err();
    assert!(
        matches!(&err, SessionError::Io { path: Some(p), .. } if p == &missing),
        "{err}"
    );
    assert!(err.to_string().contains("no-such.session"), "{err}");
    assert_eq!(snapshot(&dense), before);
    let nowhere = dir.path().join("no-dir").join("x.session");
    let err = f.saved.save(&f.model, &nowhere).unwrap_err();
    assert!(
        matches!(&err, SessionError::Io { path: Some(p), .. } if p == &nowhere),
        "{err}"
    );
    assert_eq!(dir.entries(), ["chat.session"]);
    let err = f.saved.save(&f.model, "/").unwrap_err();
    assert!(matches!(err, SessionError::Io { .. }), "{err}");

    // A model that is not the store's is refused on save.
    let other_shape = load(&TinyLlama {
        n_kv_heads: 2,
        ..tiny_config(1)
    });
    let err = f.saved.save(&other_shape, &path).unwrap_err();
    assert!(
        matches!(err, SessionError::GeometryMismatch { .. }),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        to_bytes(&f.saved, &f.model, b"")
    );
}

/// An empty session saves and loads (no positions, no rows).
/// A file of one pair of KV types loads only into a store of the same types: another
/// store refuses it, naming both, and is left as it was.
#[test]
fn a_file_of_other_kv_types_is_refused_unchanged() {
    let model = tiny(9);
    let q8 = (KvType::F16, KvType::BF16);
    let saved = session_typed(&model, &[1, 2, 3, 4, 5], q8);
    let bytes = to_bytes(&saved, &model, b"");
    let mut target = session_with(&model, &[7, 8]);
    let before = snapshot(&target);
    let err = target
        .restore_from(&model, &bytes[..], bytes.len() as u64, |m| Ok(m.to_vec()))
        .unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::KvTypeMismatch {
                expected: (KvType::F32, KvType::F32),
                found,
            } if found == q8
        ),
        "{err:?}"
    );
    assert_eq!(snapshot(&target), before);
    let mut same = session_typed(&model, &[], q8);
    same.restore_from(&model, &bytes[..], bytes.len() as u64, |m| Ok(m.to_vec()))
        .unwrap();
    assert_eq!(rows(same.kv()), rows(saved.kv()));
}

#[test]
fn an_empty_session_round_trips() {
    let model = tiny(3);
    let empty = session_with(&model, &[]);
    let bytes = to_bytes(&empty, &model, b"");
    let n_layers = model.kv_geometry().n_layers;
    assert_eq!(bytes.len(), 88 + NO_OFFSETS + n_layers * 24 + 32);
    let mut t = session_with(&model, &[1, 2, 3]);
    t.restore_from(&model, &bytes[..], bytes.len() as u64, |_| Ok(()))
        .unwrap();
    assert!(t.is_empty() && t.kv().is_empty());
    // And the store is usable afterwards.
    let again = t.prefill(&model, &[1, 2, 3]).unwrap();
    let fresh = session_with(&model, &[])
        .prefill(&model, &[1, 2, 3])
        .unwrap();
    assert_eq!(bits(&again.logits), bits(&fresh.logits));
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Greedy continuation from `logits` for `n` tokens, with the logits of every step.
fn continue_greedy<B: Backend, K: KvStore>(
    model: &Llama<B>,
    s: &mut Session<K>,
    mut logits: Vec<f32>,
    n: usize,
) -> Vec<(u32, Vec<u32>)> {
    let mut greedy = Sampler::new(Sampling::Greedy).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let id = greedy.sample(&logits).unwrap();
        out.push((id, bits(&logits)));
        logits = s.decode(model, id).unwrap();
    }
    out.push((u32::MAX, bits(&logits)));
    out
}

#[derive(Clone, Debug)]
struct RoundTrip {
    model: TinyLlama,
    prompt: Vec<u32>,
    /// Prompt ids in the session when it is saved.
    split: usize,
    /// Greedy steps before saving.
    before: usize,
    /// Greedy steps after loading.
    after: usize,
    dense: bool,
    /// The store's K and V types (q8_0 only with heads of 32).
    types: (KvType, KvType),
}

fn round_trip() -> impl Strategy<Value = RoundTrip> {
    let dtypes = prop::sample::select(vec![DType::F32, DType::F16, DType::Q8_0, DType::Q4_1]);
    (1usize..=3, 1usize..=2, 1usize..=3, dtypes, any::<u64>())
        .prop_flat_map(|(n_layers, n_kv_heads, group, dtype, seed)| {
            let block = dtype.block_len() == 32;
            let model = TinyLlama {
                n_layers,
                n_heads: n_kv_heads * group,
                n_kv_heads,
                head_dim: if block { 32 } else { 6 },
                ffn_dim: if block { 64 } else { 20 },
                vocab_size: 48,
                context_len: 96,
                dtype,
                seed,
                untied_output: seed % 2 == 0,
            };
            (Just(model), prop::collection::vec(0u32..48, 2..40))
        })
        .prop_flat_map(|(model, prompt)| {
            let n = prompt.len();
            (
                Just(model),
                Just(prompt),
                1..n,
                0usize..4,
                (1usize..8, any::<bool>()),
                (0..KvType::ALL.len(), 0..KvType::ALL.len()),
            )
        })
        .prop_map(|(model, prompt, split, before, (after, dense), (k, v))| {
            // q8_0 blocks need heads of 32; the small heads take the first three types.
            let n = if model.head_dim % 32 == 0 { 4 } else { 3 };
            let types = (KvType::ALL[k % n], KvType::ALL[v % n]);
            RoundTrip {
                model,
                prompt,
                split,
                before,
                after,
                dense,
                types,
            }
        })
}

/// Save → load → continue against never saving, bit for bit.
fn check_round_trip(case: &RoundTrip) -> Result<(), TestCaseError> {
    let model = load(&case.model);
    let max_ctx = case.model.context_len;
    let mut never = session_typed(&model, &[], case.types);
    let mut logits = never
        .prefill(&model, &case.prompt[..case.split])
        .unwrap()
        .logits;
    let mut greedy = Sampler::new(Sampling::Greedy).unwrap();
    for _ in 0..case.before {
        let id = greedy.sample(&logits).unwrap();
        logits = never.decode(&model, id).unwrap();
    }
    let meta: Vec<u8> = case.prompt.iter().map(|&id| id as u8).collect();
    let bytes = to_bytes(&never, &model, &meta);

    let (mut loaded, got_meta): (Session<Box<dyn KvStore>>, Vec<u8>) = {
        let (g, t) = (model.kv_geometry(), case.types);
        let kv: Box<dyn KvStore> = if case.dense {
            Box::new(DenseKv::with_types(g, max_ctx, t).unwrap())
        } else {
            Box::new(GrowKv::with_types(g, max_ctx, t).unwrap())
        };
        let mut s = Session::new(kv);
        let meta = s
            .restore_from(&model, &bytes[..], bytes.len() as u64, |m| Ok(m.to_vec()))
            .unwrap();
        (s, meta)
    };
    prop_assert_eq!(got_meta, meta);
    prop_assert_eq!(loaded.tokens(), never.tokens());
    prop_assert_eq!(rows(loaded.kv()), rows(never.kv()));

    // Continue: the rest of the prompt after what the session holds, then greedy steps.
    let mut ids = never.tokens().to_vec();
    ids.extend_from_slice(&case.prompt[case.split..]);
    let a = never.prefill(&model, &ids).unwrap();
    let b = loaded.prefill(&model, &ids).unwrap();
    prop_assert_eq!((a.reused, a.prefilled), (b.reused, b.prefilled));
    prop_assert_eq!(bits(&a.logits), bits(&b.logits));
    let a = continue_greedy(&model, &mut never, a.logits, case.after);
    let b = continue_greedy(&model, &mut loaded, b.logits, case.after);
    prop_assert_eq!(a, b);
    Ok(())
}

#[test]
fn save_load_continue_is_bitwise_never_saving() {
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 48,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    runner
        .run(&round_trip(), |case| check_round_trip(&case))
        .unwrap();
}

/// SmolLM2 end to end: a real chat prompt and 8 greedy tokens, saved to a file, loaded
/// into a new session, then 16 more greedy tokens from both: the same tokens and logits
/// bit for bit, and the file has exactly the documented length.
#[test]
fn smollm2_session_survives_a_file() {
    let model = Llama::load(smollm2_file(), Simd::new()).unwrap();
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    let template = ChatTemplate::from_gguf(model.file()).unwrap().unwrap();
    let text = template
        .render(
            &[ChatMessage::new(
                "user",
                "Name three rivers in Europe and the seas they flow into.",
            )],
            true,
        )
        .unwrap();
    let prompt = tok.encode(&text, Special::Parse);
    let mut never = session_with(&model, &[]);
    let first = never.prefill(&model, &prompt).unwrap();
    let mut greedy = Sampler::new(Sampling::Greedy).unwrap();
    let mut logits = first.logits;
    for _ in 0..8 {
        let id = greedy.sample(&logits).unwrap();
        logits = never.decode(&model, id).unwrap();
    }
    let dir = TempDir::new("smollm2");
    let path = dir.path().join("smollm2.session");
    never
        .save_with_meta(&model, &path, text.as_bytes())
        .unwrap();
    let n = never.len() as u64;
    let g = model.kv_geometry();
    let want_len = 88
        + 4 * n
        + text.len() as u64
        + NO_OFFSETS as u64
        + g.n_layers as u64 * (24 + n * 2 * g.kv_dim() as u64 * 4)
        + 32;
    assert_eq!(std::fs::metadata(&path).unwrap().len(), want_len);

    let (mut loaded, meta) = Session::load_with_meta(&path, &model).unwrap();
    assert_eq!(meta, text.as_bytes());
    assert_eq!(loaded.tokens(), never.tokens());
    let a = continue_greedy(&model, &mut never, logits.clone(), 16);
    let b = continue_greedy(&model, &mut loaded, logits, 16);
    assert_eq!(a, b);
    let text = tok
        .decode(
            &a.iter()
                .map(|(id, _)| *id)
                .filter(|&id| id != u32::MAX)
                .collect::<Vec<_>>(),
        )
        .unwrap();
    assert!(!text.trim().is_empty());
}
