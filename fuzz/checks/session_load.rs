//! The `session_load` property: any bytes restored as a session file into a session that
//! holds something either load, or fail with a `SessionError` and leave the session
//! exactly as it was (ids, every row bitwise, length, capacity, bytes); nothing panics or
//! allocates without bound.
//!
//! Shared by the fuzz target `fuzz/fuzz_targets/session_load.rs` and the stable replay
//! test `tests/integration/fuzz_corpus_replay.rs` (both include this file with `#[path]`).
//!
//! The input is the file itself. It is restored twice: as it is, and as a fixed-up copy
//! whose fingerprint field is the fixture model's and whose trailing checksum is
//! recomputed, so mutations get past the integrity checks to the geometry, counts,
//! token ids, layer spans and rows behind them. A file that loads must write back to
//! exactly its own bytes (the format has one encoding of each session), or, for a
//! version-1 file (read for compatibility, written no more), to a current-version file
//! that loads back to the same session; the session must then run a decode step when it
//! has room. A blob starting with `!` is refused by
//! the application's check (`MetaRejected`), which must roll back too.

use kvcore::gguf::GgufFile;
use kvcore::model::Llama;
use kvcore::session::file::VERSION;
use kvcore::{GrowKv, KvStore, Session};
use kvcore_scalar::Scalar;
use kvcore_test_support::session::{reseal, snapshot, with_fingerprint};
use kvcore_test_support::tiny::TinyLlama;

/// The model the files are restored for: 2 layers, one KV head of 4 (64 bytes of rows a
/// position), a vocabulary of 16, a context of 40.
pub fn model_config() -> TinyLlama {
    TinyLlama {
        n_layers: 2,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 4,
        ffn_dim: 8,
        vocab_size: 16,
        context_len: 40,
        dtype: kvcore::DType::F32,
        seed: 11,
        untied_output: false,
    }
}

/// The fixture model and the session every input is restored into (a copy each time).
pub struct Fixture {
    /// The model of [`model_config`] on the scalar backend.
    pub model: Llama<Scalar>,
    /// Five positions on a `GrowKv` that starts at 4 slots, so restores exercise both
    /// growth and in-place replacement.
    pub base: Session<GrowKv>,
}

impl Fixture {
    /// Loads the model and fills the base session.
    pub fn build() -> Fixture {
        let file = GgufFile::from_bytes(model_config().to_gguf()).expect("a valid tiny model");
        let model = Llama::load(file, Scalar::new()).expect("a loadable tiny model");
        let kv = GrowKv::with_initial_capacity(model.kv_geometry(), 40, 4).expect("a store");
        let mut base = Session::new(kv);
        base.prefill(&model, &[1, 2, 3, 4, 5]).expect("a prefill");
        Fixture { model, base }
    }
}

/// Restores `data` as it is and fixed up (see the module docs).
pub fn check_session_load(data: &[u8], fx: &Fixture) {
    restore_and_check(data, fx);
    let fixed = reseal(with_fingerprint(data.to_vec(), fx.model.fingerprint()));
    if fixed != data {
        restore_and_check(&fixed, fx);
    }
}

fn restore_and_check(file: &[u8], fx: &Fixture) {
    let mut s = fx.base.fork().expect("a fork of the base session");
    let before = snapshot(&s);
    let result = s.restore_from(&fx.model, file, file.len() as u64, |meta| {
        if meta.first() == Some(&b'!') {
            Err("the blob starts with '!'".to_string())
        } else {
            Ok(meta.to_vec())
        }
    });
    match result {
        Err(e) => {
            assert_eq!(
                snapshot(&s),
                before,
                "a failed restore ({e}) changed the session"
            );
            // Every message formats.
            let _ = e.to_string();
        }
        Ok(meta) => {
            assert_eq!(s.kv().len(), s.tokens().len());
            let mut again = Vec::new();
            s.write_to(&fx.model, &meta, &mut again)
                .expect("a restored session saves");
            if file.get(8..12) != Some(&VERSION.to_le_bytes()[..]) {
                let mut back = fx.base.fork().expect("a fork of the base session");
                back.restore_from(&fx.model, &again[..], again.len() as u64, |_| Ok(()))
                    .expect("a version-1 file rewritten loads");
                assert_eq!(snapshot(&back), snapshot(&s), "a version-1 file rewritten");
            } else {
                assert!(again == file, "a loaded file does not write back to itself");
            }
            if s.len() < s.kv().max_ctx() {
                let logits = s.decode(&fx.model, 0).expect("a decode step with room");
                assert_eq!(logits.len(), 16);
            }
        }
    }
}
