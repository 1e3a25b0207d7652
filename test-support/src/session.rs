//! Sessions in tests and fuzzing: [`snapshot`], everything observable about a
//! [`Session`] (to check that a failed restore changed nothing), and edits of session
//! files that keep them self-consistent ([`reseal`], [`with_fingerprint`]), so a test or a
//! fuzzer can reach the checks behind the checksum.

use kvcore::kv::KvRows;
use kvcore::model::Llama;
use kvcore::{Backend, KvRestore, KvStore, Session, SessionError};
use sha2::{Digest, Sha256};

/// Bytes of the trailing checksum of a session file.
const CHECKSUM_LEN: usize = 32;
/// Where the model fingerprint sits in a session file's header.
const FINGERPRINT: std::ops::Range<usize> = 16..48;

/// Everything observable about a session: its ids and its store's length, capacity,
/// bytes and rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSnapshot {
    /// [`Session::tokens`].
    pub tokens: Vec<u32>,
    /// [`KvStore::len`].
    pub len: usize,
    /// [`KvStore::capacity`].
    pub capacity: usize,
    /// [`KvStore::bytes`].
    pub bytes: usize,
    /// [`rows`] of the store.
    pub rows: Vec<Vec<u8>>,
}

/// `s` saved with the blob `meta`, as the bytes of a session file (the length
/// [`Session::write_to`] reports checked against them).
pub fn to_bytes<B: Backend, K: KvStore>(s: &Session<K>, model: &Llama<B>, meta: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let n = s
        .write_to(model, meta, &mut out)
        .expect("the session saves");
    assert_eq!(n, out.len() as u64);
    out
}

/// Restores `bytes` into `target` (the blob accepted as it is), asserting that it fails
/// and leaves the session exactly as it was ([`snapshot`]); returns the error.
pub fn fails<B: Backend, K: KvRestore>(
    model: &Llama<B>,
    target: &mut Session<K>,
    bytes: &[u8],
) -> SessionError {
    let before = snapshot(target);
    let err = target
        .restore_from(model, bytes, bytes.len() as u64, |m| Ok(m.to_vec()))
        .expect_err("the file must not load");
    assert_eq!(
        snapshot(target),
        before,
        "a failed restore ({err}) changed the session"
    );
    err
}

/// A [`SessionSnapshot`] of `s`.
pub fn snapshot<K: KvStore>(s: &Session<K>) -> SessionSnapshot {
    SessionSnapshot {
        tokens: s.tokens().to_vec(),
        len: s.kv().len(),
        capacity: s.kv().capacity(),
        bytes: s.kv().bytes(),
        rows: rows(s.kv()),
    }
}

/// Per layer, the stored bytes of every key row and then of every value row the layer's
/// view holds, segment by segment (native byte order: the file's on little-endian
/// machines).
///
/// # Panics
/// On an element type this helper does not know yet.
pub fn rows<K: KvStore + ?Sized>(kv: &K) -> Vec<Vec<u8>> {
    (0..kv.geometry().n_layers)
        .map(|layer| {
            let view = kv.view(layer).expect("a layer of the store");
            let mut bits = Vec::new();
            for part in [0, 1] {
                for s in view.segments() {
                    match if part == 0 { s.keys() } else { s.values() } {
                        KvRows::F32(a) => a.iter().for_each(|v| bits.extend(bytemuck::bytes_of(v))),
                        KvRows::F16(a) => a.iter().for_each(|v| bits.extend(bytemuck::bytes_of(v))),
                        KvRows::BF16(a) => {
                            a.iter().for_each(|v| bits.extend(bytemuck::bytes_of(v)))
                        }
                        KvRows::Q8_0(a) => {
                            a.iter().for_each(|v| bits.extend(bytemuck::bytes_of(v)))
                        }
                        KvRows::Q4_0(a) => {
                            a.iter().for_each(|v| bits.extend(bytemuck::bytes_of(v)))
                        }
                        other => panic!("rows of type {} are not handled", other.kv_type()),
                    }
                }
            }
            bits
        })
        .collect()
}

/// `file` with its trailing SHA-256 recomputed over the bytes before it (unchanged when
/// it is shorter than a checksum).
pub fn reseal(mut file: Vec<u8>) -> Vec<u8> {
    if let Some(end) = file.len().checked_sub(CHECKSUM_LEN) {
        let digest = Sha256::digest(&file[..end]);
        file[end..].copy_from_slice(&digest);
    }
    file
}

/// `file` with the model fingerprint in its header replaced by `fingerprint` (where the
/// file is long enough to hold one).
pub fn with_fingerprint(mut file: Vec<u8>, fingerprint: &[u8; 32]) -> Vec<u8> {
    if let Some(field) = file.get_mut(FINGERPRINT) {
        field.copy_from_slice(fingerprint);
    }
    file
}
