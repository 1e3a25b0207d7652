//! Session files record the key offsets a `q8_0` key store keeps its keys less of
//! (format version 3, `src/session/file.rs`, `docs/session-format.md`), on SmolLM2:
//! - a q8_0/q8_0 session made by `Llama::new_kv_with_types` (the model's offsets), with
//!   a prompt crossing a 256-position offset block, saved and restored into a fresh store
//!   of the same kind continues with bitwise the logits of never having saved; the file
//!   holds the store's means after the blob;
//! - its file refuses to load into a q8_0 store without offsets, a file of a store
//!   without offsets (version 3 or 2) refuses to load into one with them, and a file of
//!   other means refuses too: `CalibrationMismatch`, leaving the target exactly as it was;
//! - a corrupted `n_means` is a clear error (`CalibrationLength`, `Truncated`), never a
//!   panic or an allocation sized by it.

use std::path::PathBuf;

use crate::common::{greedy_steps, load_smollm2};
use kvcore::model::Llama;
use kvcore::session::file::VERSION;
use kvcore::{Backend, GrowKv, KvStore, KvType, Session, SessionError};
use kvcore_simd::Simd;
use kvcore_test_support::session::{fails, reseal, rows, to_bytes};

const Q8: (KvType, KvType) = (KvType::Q8_0, KvType::Q8_0);
/// The stores' ceiling: two offset blocks of 256.
const CTX: usize = 512;
/// Prompt length: past the first 256-position block.
const PROMPT: usize = 300;
const META: &[u8] = b"{\"messages\":[]}";
/// Where the key-offsets section of a file of `n` positions with blob [`META`] starts.
fn means_at(n: usize) -> usize {
    88 + 4 * n + META.len()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn prompt(model: &Llama<Simd>, n: usize) -> Vec<u32> {
    let vocab = model.config().vocab_size as u64;
    (0..n as u64)
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect()
}

/// A q8_0/q8_0 session with the model's key offsets.
fn with_offsets(model: &Llama<Simd>, ctx: usize) -> Session<Box<dyn KvStore>> {
    let s = Session::new(model.new_kv_with_types(ctx, Q8).unwrap());
    assert!(
        !s.kv().codecs().0.calibration().is_empty(),
        "the model's q8_0 store has offsets"
    );
    s
}

/// A q8_0/q8_0 session on a store without key offsets.
fn without_offsets(model: &Llama<Simd>) -> Session<GrowKv> {
    let s = Session::new(GrowKv::with_types(model.kv_geometry(), CTX, Q8).unwrap());
    assert!(s.kv().codecs().0.calibration().is_empty());
    s
}

fn put_u64(mut bytes: Vec<u8>, at: usize, v: u64) -> Vec<u8> {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
    bytes
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// `n_layers · n_kv_heads · head_dim`: the means of a store with offsets.
fn n_means<B: Backend>(model: &Llama<B>) -> usize {
    let g = model.kv_geometry();
    g.n_layers * g.kv_dim()
}

/// A file path in the temp dir, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(test: &str) -> TempFile {
        TempFile(std::env::temp_dir().join(format!(
            "kvcore-key-offsets-{}-{test}.session",
            std::process::id()
        )))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `err` is `CalibrationMismatch` with these sides.
#[track_caller]
fn assert_mismatch(err: &SessionError, file: bool, store: bool) {
    assert!(
        matches!(err, SessionError::CalibrationMismatch { file: f, store: s } if (*f, *s) == (file, store)),
        "{err}"
    );
}

#[test]
fn q8_session_with_key_offsets_round_trips_bitwise() {
    let model = load_smollm2(Simd::new());
    let ids = prompt(&model, PROMPT);
    let mut never = with_offsets(&model, CTX);
    let first = never.prefill(&model, &ids).unwrap().logits;
    let file = TempFile::new("round-trip");
    never.save_with_meta(&model, &file.0, META).unwrap();
    let bytes = std::fs::read(&file.0).unwrap();

    // The documented layout: version 3, the store's means after the blob.
    let keys = never.kv().codecs().0;
    assert_eq!(
        u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
        VERSION
    );
    assert_eq!(VERSION, 3);
    let at = means_at(PROMPT);
    assert_eq!(&bytes[at - META.len()..at], META);
    assert_eq!(u64_at(&bytes, at) as usize, n_means(&model));
    let stored: Vec<u32> = bytes[at + 8..at + 8 + 4 * n_means(&model)]
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(stored, bits(keys.calibration()));
    let g = model.kv_geometry();
    let row = 2 * KvType::Q8_0.row_bytes(g.kv_dim()).unwrap();
    assert_eq!(
        bytes.len(),
        at + 8 + 4 * n_means(&model) + g.n_layers * (24 + PROMPT * row) + 32
    );

    // Into a fresh store of the same kind, and one of a higher ceiling (the same means).
    for ctx in [CTX, 2 * CTX] {
        let mut never = never.fork().unwrap();
        let mut loaded = with_offsets(&model, ctx);
        loaded.prefill(&model, &[1, 2, 3]).unwrap();
        assert_eq!(loaded.restore(&model, &file.0).unwrap(), META);
        assert_eq!(loaded.tokens(), never.tokens());
        assert_eq!(rows(loaded.kv()), rows(never.kv()));
        assert_eq!(
            to_bytes(&loaded, &model, META),
            bytes,
            "writes back to the same file"
        );
        let a = greedy_steps(&model, &mut never, first.clone(), 4);
        let b = greedy_steps(&model, &mut loaded, first.clone(), 4);
        assert_eq!(a, b, "ctx {ctx}: the next tokens' logits differ");
    }
}

#[test]
fn a_file_with_key_offsets_refuses_a_store_without_them() {
    let model = load_smollm2(Simd::new());
    let mut saved = with_offsets(&model, CTX);
    saved.prefill(&model, &prompt(&model, PROMPT)).unwrap();
    let bytes = to_bytes(&saved, &model, META);

    let mut empty = without_offsets(&model);
    let err = fails(&model, &mut empty, &bytes);
    assert_mismatch(&err, true, false);
    assert!(err.to_string().contains("key offsets"), "{err}");
    assert!(empty.is_empty() && empty.kv().is_empty());

    let mut holding = without_offsets(&model);
    holding.prefill(&model, &[5, 6, 7, 8]).unwrap();
    let err = fails(&model, &mut holding, &bytes);
    assert_mismatch(&err, true, false);
    assert_eq!(holding.tokens(), [5, 6, 7, 8]);
    // Still usable, as it was.
    holding.decode(&model, 9).unwrap();

    // Other means (another backend or build): refused, even by a store with offsets.
    let at = means_at(PROMPT) + 8;
    let mut other = bytes.clone();
    other[at] ^= 1;
    let mut target = with_offsets(&model, CTX);
    let err = fails(&model, &mut target, &reseal(other));
    assert_mismatch(&err, true, true);
    assert!(err.to_string().contains("other key offsets"), "{err}");
}

#[test]
fn a_file_without_key_offsets_refuses_a_store_with_them() {
    let model = load_smollm2(Simd::new());
    let n = 40;
    let mut plain = without_offsets(&model);
    plain.prefill(&model, &prompt(&model, n)).unwrap();
    let bytes = to_bytes(&plain, &model, META);
    assert_eq!(u64_at(&bytes, means_at(n)), 0, "no key offsets recorded");

    let mut target = with_offsets(&model, CTX);
    target.prefill(&model, &[1, 2]).unwrap();
    let err = fails(&model, &mut target, &bytes);
    assert_mismatch(&err, false, true);

    // The same session as a version-2 file (no key-offsets section): read as a file
    // without offsets, so refused the same way, and loaded by a store without them.
    let mut v2 = bytes[..means_at(n)].to_vec();
    v2.extend_from_slice(&bytes[means_at(n) + 8..]);
    v2[8..12].copy_from_slice(&2u32.to_le_bytes());
    let v2 = reseal(v2);
    let err = fails(&model, &mut target, &v2);
    assert_mismatch(&err, false, true);
    for file in [&bytes, &v2] {
        let mut same = without_offsets(&model);
        same.restore_from(&model, &file[..], file.len() as u64, |_| Ok(()))
            .unwrap();
        assert_eq!(rows(same.kv()), rows(plain.kv()));
        assert_eq!(to_bytes(&same, &model, META), bytes);
    }
}

#[test]
fn a_corrupt_key_offsets_count_is_a_clear_error() {
    let model = load_smollm2(Simd::new());
    let n = 30;
    let count = n_means(&model) as u64;
    let mut saved = with_offsets(&model, CTX);
    saved.prefill(&model, &prompt(&model, n)).unwrap();
    let good = to_bytes(&saved, &model, META);
    let at = means_at(n);
    assert_eq!(u64_at(&good, at), count);
    let mut target = with_offsets(&model, CTX);
    target.prefill(&model, &[4, 5, 6]).unwrap();

    // Counts that are neither 0 nor the geometry's: refused before anything is sized by
    // them (allocating u64::MAX floats would abort the test process).
    for bad in [u64::MAX, 1 << 62, count + 1, count - 1, 1] {
        let err = fails(&model, &mut target, &reseal(put_u64(good.clone(), at, bad)));
        assert!(
            matches!(err, SessionError::CalibrationLength { found, expected } if found == bad && expected == count),
            "{bad}: {err}"
        );
        assert!(err.to_string().contains("key-offsets section"), "{err}");
    }
    // Zero on a file that holds the means: longer than it says.
    let err = fails(&model, &mut target, &reseal(put_u64(good.clone(), at, 0)));
    assert!(
        matches!(err, SessionError::TrailingBytes { declared, actual } if declared + 4 * count == actual),
        "{err}"
    );
    // Cut in the means, or the means missing: truncated.
    let len = good.len() as u64;
    for cut in [at + 8 + 10, at + 8] {
        let mut short = good[..cut].to_vec();
        short.extend_from_slice(&good[at + 8 + 4 * count as usize..]);
        let err = fails(&model, &mut target, &reseal(short.clone()));
        assert!(
            matches!(err, SessionError::Truncated { declared, actual } if declared == len && actual == short.len() as u64),
            "{cut}: {err}"
        );
    }
    // A file of f32 keys has no key offsets: only 0 is allowed.
    let mut f32_session = Session::new(GrowKv::new(model.kv_geometry(), CTX).unwrap());
    f32_session.prefill(&model, &prompt(&model, n)).unwrap();
    let f32_file = to_bytes(&f32_session, &model, META);
    let mut f32_target = Session::new(GrowKv::new(model.kv_geometry(), CTX).unwrap());
    let err = fails(
        &model,
        &mut f32_target,
        &reseal(put_u64(f32_file, at, count)),
    );
    assert!(
        matches!(err, SessionError::CalibrationLength { found, expected: 0 } if found == count),
        "{err}"
    );
    // And the good file loads.
    target
        .restore_from(&model, &good[..], len, |_| Ok(()))
        .unwrap();
    assert_eq!(rows(target.kv()), rows(saved.kv()));
}
