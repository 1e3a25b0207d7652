//! Session files: a [`Session`]'s token ids and KV rows on disk, so a conversation
//! survives the process (llama.cpp's `--prompt-cache`).
//!
//! ## The format (version 3)
//! Little-endian throughout; `docs/session-format.md` gives every offset.
//!
//! ```text
//! header  [88]   magic "KVCSESS\0", version u32 = 3, reserved u32 = 0,
//!                model fingerprint [32] (SHA-256 of the model file),
//!                n_layers, n_kv_heads, head_dim: u32 each,
//!                K type code u8, V type code u8 (KvType::code), reserved u16 = 0,
//!                n_tokens u64, meta_len u64, n_rows u64 (rows over all layers)
//! tokens  [n_tokens] u32
//! meta    [meta_len] bytes            (opaque to kvcore: the application's blob)
//! offsets n_means u64 (0: no key offsets), then [n_means] f32: the store's key offsets'
//!                pre-RoPE means [n_layers][n_kv_heads][head_dim] (KeyOffsets::means);
//!                n_means is 0 or, with q8_0 or q4_0 keys only, n_layers · n_kv_heads · head_dim
//! layers  [n_layers] of: start u64, count u64, window u64 (0: every position),
//!                        K rows [count, kv_dim], V rows [count, kv_dim]  (in the K and
//!                        V types: f32, f16 and bf16 values, q8_0 34-byte and q4_0
//!                        18-byte blocks)
//! sha256  [32]   over every byte before it
//! ```
//!
//! A layer records the positions it holds, `start .. n_tokens`, and its sliding window:
//! a layer that keeps every position has `window = 0, start = 0`; a window layer of `w`
//! ([`WindowKv`](crate::kv::WindowKv)) only its retained positions, the last `min(n, w)`
//! (or `w − 1` after its last position was truncated), the starts
//! [`restore_starts`] allows. The windows must be the target store's
//! ([`SessionError::WindowMismatch`]), so a windowed file never loads into a dense store
//! or one of other windows, nor the other way round. `n_rows` makes the exact length
//! follow from the header, up to the key-offsets section: a file is either that long
//! (`n_means = 0`) or, with q8_0 or q4_0 keys, longer by exactly `4 · n_layers · kv_dim`.
//!
//! The key-offsets section records what a `q8_0` or `q4_0` key store keeps its keys less of
//! (its key codec's calibration, [`KvCodec::calibration`], `kv/offsets.rs`): its stored key rows mean something only
//! together with those offsets, so a file loads only into a store with the same offsets,
//! bit for bit, or into one without offsets when it has none
//! ([`SessionError::CalibrationMismatch`]).
//!
//! Version 2 (no key-offsets section) and version 1 (also an 80-byte header without
//! `n_rows`, layers without `window`, every layer `0 .. n_tokens`) are still read, as
//! files of a store without key offsets (version 1: and without windows); this build
//! writes version 3 only.
//!
//! ## Writing
//! [`Session::save`] streams the header, ids, blob and every layer's rows (taken from the
//! store's views) through SHA-256 into a temporary file beside the target, appends the
//! digest, syncs, and renames it over the target: the target's name never holds a
//! half-written file.
//!
//! ## Reading
//! [`Session::restore`] streams too (no whole-file buffer), checking in this order, each
//! failure a [`SessionError`] of its own:
//! 1. magic, version, reserved fields, element type codes;
//! 2. the exact length the counts imply (checked arithmetic) against the real length
//!    (with or without a key-offsets section: its `n_means` comes after the blob),
//!    before anything sized by a count is allocated;
//! 3. the model fingerprint, the geometry and the element types against the model and
//!    the target store;
//! 4. then one restore append for all positions on the store
//!    ([`Append::begin_restore`]: a window layer stages only its retained rows, never a
//!    whole prefill), and as the bytes arrive: every id against the vocabulary; the
//!    key-offsets section's `n_means` (0 or the geometry's, before anything is sized by
//!    it) and with it the exact length, then its means against the store's key offsets,
//!    before any row is written; every layer's window and span, the rows written one
//!    layer at a time, the rows' total against `n_rows`; the checksum at the end; the
//!    application's check of its blob.
//!
//! Only then is the append committed and the session's ids replaced. Any failure drops
//! the append, which rolls the store back: the session is exactly as it was. (A flipped
//! bit in the header may therefore surface as the error of the field it lands in, e.g.
//! [`SessionError::ModelMismatch`], rather than as [`SessionError::ChecksumMismatch`].)

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use thiserror::Error;

use super::Session;
use crate::backend::Backend;
use crate::kv::{
    Append, KvCodec, KvError, KvGeometry, KvRestore, KvRows, KvSegment, KvStore, KvType,
    restore_starts,
};
use crate::model::Llama;

/// The first 8 bytes of every session file.
pub const MAGIC: [u8; 8] = *b"KVCSESS\0";

/// The format version this build writes (and reads).
pub const VERSION: u32 = 3;

/// The oldest version this build reads: version 1, whose layers hold every position
/// (files of full stores, loadable only into stores without windows). Versions 1 and 2
/// have no key-offsets section (files of stores without key offsets).
pub const OLDEST_VERSION: u32 = 1;

/// Bytes of the fixed header (version 1: 80, without `n_rows`).
const HEADER_LEN: u64 = 88;
/// Bytes of the version-1 header.
const HEADER_LEN_V1: u64 = 80;
/// Bytes of the trailing SHA-256.
const CHECKSUM_LEN: u64 = 32;
/// Bytes of a layer's `start, count, window` before its rows (version 1: 16, no window).
const LAYER_HEADER_LEN: u64 = 24;
/// Bytes of a version-1 layer's `start, count`.
const LAYER_HEADER_LEN_V1: u64 = 16;
/// Bytes of the key-offsets section's `n_means` (version 3; none before).
const OFFSETS_HEADER_LEN: u64 = 8;
/// The shortest possible file: a (version-1) header and the checksum.
const MIN_LEN: u64 = HEADER_LEN_V1 + CHECKSUM_LEN;

/// Why a session could not be saved or restored. A restore that fails leaves the session
/// exactly as it was.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SessionError {
    /// Reading or writing failed (the path, when there is one).
    #[error("I/O error on session file{}", path_suffix(path))]
    Io {
        /// The file.
        path: Option<PathBuf>,
        /// The cause.
        source: io::Error,
    },
    /// The file does not start with [`MAGIC`].
    #[error("not a kvcore session file (bad magic)")]
    NotASessionFile,
    /// A format version this build does not read.
    #[error(
        "session file format version {found} is not supported (this build reads version {supported})"
    )]
    UnsupportedVersion {
        /// The file's version.
        found: u32,
        /// The version this build reads, [`VERSION`].
        supported: u32,
    },
    /// A reserved header field is not zero (a feature of a newer writer).
    #[error("session file header: reserved field at byte {offset} is {value:#x}, must be 0")]
    Reserved {
        /// Byte offset of the field.
        offset: u64,
        /// Its value.
        value: u32,
    },
    /// An element type code no [`KvType`] has.
    #[error("session file: unknown {which} element type code {code}")]
    UnknownKvType {
        /// `"K"` or `"V"`.
        which: &'static str,
        /// The code.
        code: u8,
    },
    /// A count so large that the length it implies overflows (or does not fit this
    /// platform's `usize`).
    #[error("session file: {field} is too large to describe a file")]
    CountOverflow {
        /// The field (`n_tokens`, `meta_len`, `row size`).
        field: &'static str,
    },
    /// The file is shorter than its header's counts say: cut short, or a count claims
    /// more than the file holds (the two look alike before the checksum at the end).
    #[error("session file is truncated: its header declares {declared} bytes, it has {actual}")]
    Truncated {
        /// The length the header implies.
        declared: u64,
        /// The bytes present.
        actual: u64,
    },
    /// The file is longer than its header's counts say.
    #[error(
        "session file has trailing bytes: its header declares {declared} bytes, it has {actual}"
    )]
    TrailingBytes {
        /// The length the header implies.
        declared: u64,
        /// The bytes present.
        actual: u64,
    },
    /// The trailing SHA-256 is not that of the bytes before it.
    #[error(
        "session file checksum mismatch (stored {}, computed {}): the file is corrupt",
        hex(stored),
        hex(computed)
    )]
    ChecksumMismatch {
        /// The digest the file ends with.
        stored: [u8; 32],
        /// The digest of its contents.
        computed: [u8; 32],
    },
    /// The file was saved with another model.
    #[error(
        "session file is for another model (its fingerprint {}, this model's {})",
        hex(found),
        hex(expected)
    )]
    ModelMismatch {
        /// This model's fingerprint.
        expected: [u8; 32],
        /// The file's.
        found: [u8; 32],
    },
    /// The file's (or the target store's) KV geometry is not the model's.
    #[error("session file KV geometry {found:?} does not match the model's {expected:?}")]
    GeometryMismatch {
        /// The model's.
        expected: KvGeometry,
        /// The file's (or the store's).
        found: KvGeometry,
    },
    /// The file's element types are not the target store's.
    #[error("session file holds {}/{} K/V rows, the store keeps {}/{}", found.0, found.1, expected.0, expected.1)]
    KvTypeMismatch {
        /// The store's K and V types.
        expected: (KvType, KvType),
        /// The file's.
        found: (KvType, KvType),
    },
    /// A token id outside the model's vocabulary.
    #[error(
        "session file: token id {id} at position {position} is outside the vocabulary of {vocab_size}"
    )]
    TokenOutOfVocab {
        /// The position.
        position: usize,
        /// The id.
        id: u32,
        /// Tokens in the vocabulary.
        vocab_size: usize,
    },
    /// A layer whose positions are not the ones the store's layer keeps for `n_tokens`
    /// positions: `start .. n_tokens` for a `start` in `first ..= last` (`0 ..= 0` for a
    /// layer that keeps every position; for a sliding window of `w`, the last `w` or
    /// `w − 1` positions, [`restore_starts`]).
    #[error(
        "session layer {layer} holds positions {start}..{start}+{count}, expected start..{n_tokens} with start in {first}..={last}"
    )]
    LayerPositions {
        /// The layer.
        layer: usize,
        /// Its first position.
        start: u64,
        /// Its positions.
        count: u64,
        /// The session's positions.
        n_tokens: u64,
        /// The earliest start the store accepts.
        first: u64,
        /// The latest start the store accepts.
        last: u64,
    },
    /// A layer saved with another sliding window than the target store's layer has (a
    /// windowed file into a dense store, a dense file into a windowed one, or other
    /// windows). `None` is a layer that keeps every position.
    #[error(
        "session layer {layer} was saved with sliding window {}, the store's layer has {}",
        window_name(file),
        window_name(&store.map(|w| w as u64))
    )]
    WindowMismatch {
        /// The layer.
        layer: usize,
        /// The file's window (`None`: every position).
        file: Option<u64>,
        /// The store's window.
        store: Option<usize>,
    },
    /// The layers hold another number of rows than the header's `n_rows` declares.
    #[error(
        "session file header declares {declared} rows over its layers, the layers hold {found}"
    )]
    RowCount {
        /// The header's `n_rows`.
        declared: u64,
        /// The rows the layers declare (up to the first layer past `declared`).
        found: u64,
    },
    /// The calibration (key-offsets) section's `n_means` is neither 0 nor the header
    /// geometry's `n_layers · n_kv_heads · head_dim` (only 0 for a key type whose codec
    /// does not calibrate, [`KvCodec::calibrates`]).
    #[error(
        "session file: the key-offsets section (the key codec's calibration) declares {found} means, it must hold {}",
        means_allowed(*expected)
    )]
    CalibrationLength {
        /// The file's `n_means`.
        found: u64,
        /// The only other count allowed besides 0 (0 when the keys do not calibrate).
        expected: u64,
    },
    /// The file's keys were encoded under another calibration (key offsets) than the
    /// target store's key codec ([`KvCodec::calibration`]): the rows would decode to
    /// other keys. Both must have none, or both the same means bit for bit.
    #[error("session file does not match the key codec's calibration (key offsets) of the store: {}", offsets_mismatch(*file, *store))]
    CalibrationMismatch {
        /// Whether the file records a calibration (key offsets).
        file: bool,
        /// Whether the store's key codec has one.
        store: bool,
    },
    /// The application's check of the stored blob refused it.
    #[error("session file metadata rejected: {reason}")]
    MetaRejected {
        /// Why.
        reason: String,
    },
    /// The target store refused the positions (e.g. a context overflow against its
    /// `max_ctx`, a refused allocation).
    #[error(transparent)]
    Kv(#[from] KvError),
}

/// `" <path>"`, or nothing.
fn path_suffix(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map(|p| format!(" {}", p.display()))
        .unwrap_or_default()
}

/// `"none"` or the window.
fn window_name(w: &Option<u64>) -> String {
    w.map_or_else(|| "none (every position)".to_string(), |w| w.to_string())
}

/// The counts a key-offsets section may declare.
fn means_allowed(expected: u64) -> String {
    if expected == 0 {
        "0 (no key offsets: the keys' codec does not calibrate)".to_string()
    } else {
        format!("0 or {expected} (n_layers · n_kv_heads · head_dim)")
    }
}

/// Why a file's key offsets are not the store's.
fn offsets_mismatch(file: bool, store: bool) -> &'static str {
    match (file, store) {
        (true, false) => {
            "the file's keys were stored less key offsets, the store keeps its keys \
             without any (a store made without the model's offsets, e.g. not through \
             Llama::new_kv_with_types)"
        }
        (false, true) => {
            "the file's keys were stored without key offsets, the store keeps its keys \
             less the model's (a file saved from a store without offsets, or by an older \
             version of the format)"
        }
        _ => {
            "the file's keys were stored less other key offsets than the store's \
             (saved by another backend or build)"
        }
    }
}

/// Lower-case hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The decoded fixed header.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Header {
    /// [`VERSION`] or 1.
    version: u32,
    fingerprint: [u8; 32],
    /// `[n_layers, n_kv_heads, head_dim]` as stored.
    geometry: [u32; 3],
    types: (KvType, KvType),
    n_tokens: u64,
    meta_len: u64,
    /// Rows over all layers (version 1: `n_layers · n_tokens`).
    n_rows: u64,
}

/// Sizes derived from a header, every one checked.
#[derive(Clone, Copy, Debug)]
struct Layout {
    geometry: KvGeometry,
    n_tokens: usize,
    meta_len: usize,
    n_rows: u64,
    /// Whether layers record their window (version 2 on).
    windows: bool,
    /// Whether a key-offsets section follows the blob (version 3).
    offsets: bool,
    /// The one count of means besides 0 that section may declare: `n_layers · kv_dim`
    /// with q8_0 keys in version 3, else 0.
    n_means: usize,
    /// The exact file length with no key offsets (`n_means = 0`).
    file_len: u64,
    /// The exact file length with [`n_means`](Self::n_means) means (`file_len` when that
    /// is 0).
    file_len_means: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN as usize] {
        let mut h = [0u8; HEADER_LEN as usize];
        h[80..88].copy_from_slice(&self.n_rows.to_le_bytes());
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        // 12..16 reserved, zero.
        h[16..48].copy_from_slice(&self.fingerprint);
        for (i, v) in self.geometry.iter().enumerate() {
            h[48 + 4 * i..52 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        h[60] = self.types.0.code();
        h[61] = self.types.1.code();
        // 62..64 reserved, zero.
        h[64..72].copy_from_slice(&self.n_tokens.to_le_bytes());
        h[72..80].copy_from_slice(&self.meta_len.to_le_bytes());
        h
    }

    /// Reads and checks the header of a file of `len` bytes (everything but the model).
    fn read<R: Read>(src: &mut Source<R>, len: u64) -> Result<(Header, Layout), SessionError> {
        let mut h = [0u8; HEADER_LEN as usize];
        let mut have = usize::try_from(len.min(HEADER_LEN_V1)).unwrap_or(0);
        src.read(&mut h[..have])?;
        let magic = have.min(MAGIC.len());
        if h[..magic] != MAGIC[..magic] {
            return Err(SessionError::NotASessionFile);
        }
        let truncated = SessionError::Truncated {
            declared: MIN_LEN,
            actual: len,
        };
        if have < 12 {
            return Err(truncated);
        }
        let version = u32_at(&h, 8);
        if !(OLDEST_VERSION..=VERSION).contains(&version) {
            return Err(SessionError::UnsupportedVersion {
                found: version,
                supported: VERSION,
            });
        }
        let header_len = if version == 1 {
            HEADER_LEN_V1
        } else {
            HEADER_LEN
        };
        if version > 1 && have == HEADER_LEN_V1 as usize {
            let more = usize::try_from(len.min(HEADER_LEN)).unwrap_or(0);
            src.read(&mut h[have..more])?;
            have = more;
        }
        if have < header_len as usize {
            return Err(SessionError::Truncated {
                declared: header_len + CHECKSUM_LEN,
                actual: len,
            });
        }
        for (offset, value) in [(12, u32_at(&h, 12)), (62, u32::from(u16_at(&h, 62)))] {
            if value != 0 {
                return Err(SessionError::Reserved { offset, value });
            }
        }
        let kv_type = |which, code| {
            KvType::from_code(code).ok_or(SessionError::UnknownKvType { which, code })
        };
        let header = Header {
            version,
            fingerprint: {
                let mut fp = [0u8; 32];
                fp.copy_from_slice(&h[16..48]);
                fp
            },
            geometry: [u32_at(&h, 48), u32_at(&h, 52), u32_at(&h, 56)],
            types: (kv_type("K", h[60])?, kv_type("V", h[61])?),
            n_tokens: u64_at(&h, 64),
            meta_len: u64_at(&h, 72),
            n_rows: if version == 1 {
                u64::from(u32_at(&h, 48))
                    .checked_mul(u64_at(&h, 64))
                    .ok_or(SessionError::CountOverflow { field: "n_tokens" })?
            } else {
                u64_at(&h, 80)
            },
        };
        let layout = header.layout()?;
        // Whether the file holds key offsets shows only in its `n_means`, after the blob:
        // here its length is one of the two the header allows (the same one without q8_0
        // keys), and the read of `n_means` checks it exactly.
        src.declared = layout.file_len;
        if layout.file_len > len {
            return Err(SessionError::Truncated {
                declared: layout.file_len,
                actual: len,
            });
        }
        if layout.file_len_means < len {
            return Err(SessionError::TrailingBytes {
                declared: layout.file_len_means,
                actual: len,
            });
        }
        Ok((header, layout))
    }

    /// The exact file length and the sizes the header implies, with checked arithmetic.
    fn layout(&self) -> Result<Layout, SessionError> {
        let overflow = |field| SessionError::CountOverflow { field };
        let [n_layers, n_kv_heads, head_dim] = self.geometry;
        let geometry = KvGeometry {
            n_layers: n_layers as usize,
            n_kv_heads: n_kv_heads as usize,
            head_dim: head_dim as usize,
        };
        let kv_dim = geometry
            .n_kv_heads
            .checked_mul(geometry.head_dim)
            .ok_or(overflow("row size"))?;
        let row_bytes = |t: KvType| t.row_bytes(kv_dim).map(|b| b as u64);
        let position_bytes = row_bytes(self.types.0)
            .zip(row_bytes(self.types.1))
            .and_then(|(k, v)| k.checked_add(v))
            .ok_or(overflow("row size"))?;
        let v1 = self.version == 1;
        let (header_len, layer_header) = if v1 {
            (HEADER_LEN_V1, LAYER_HEADER_LEN_V1)
        } else {
            (HEADER_LEN, LAYER_HEADER_LEN)
        };
        let layer_bytes = self
            .n_rows
            .checked_mul(position_bytes)
            .and_then(|rows| rows.checked_add(layer_header * u64::from(n_layers)))
            .ok_or(overflow(if v1 { "n_tokens" } else { "n_rows" }))?;
        let offsets = self.version >= 3;
        let offsets_header = if offsets { OFFSETS_HEADER_LEN } else { 0 };
        let file_len = self
            .n_tokens
            .checked_mul(4)
            .and_then(|tokens| tokens.checked_add(header_len + CHECKSUM_LEN + offsets_header))
            .ok_or(overflow("n_tokens"))?
            .checked_add(self.meta_len)
            .ok_or(overflow("meta_len"))?
            .checked_add(layer_bytes)
            .ok_or(overflow("n_tokens"))?;
        // Only keys whose codec calibrates carry a calibration.
        let n_means = if offsets && KvCodec::calibrates(self.types.0) {
            (kv_dim as u64).checked_mul(u64::from(n_layers))
        } else {
            Some(0)
        };
        let file_len_means = n_means
            .and_then(|n| n.checked_mul(4))
            .and_then(|bytes| file_len.checked_add(bytes));
        // Every buffer is at most the file's length: the counts fit in memory sizes once
        // the file's length does.
        let fits = |n: u64| {
            usize::try_from(n)
                .ok()
                .filter(|_| file_len <= isize::MAX as u64)
        };
        Ok(Layout {
            geometry,
            n_tokens: fits(self.n_tokens).ok_or(overflow("n_tokens"))?,
            meta_len: fits(self.meta_len).ok_or(overflow("meta_len"))?,
            n_rows: self.n_rows,
            windows: !v1,
            offsets,
            n_means: n_means
                .and_then(|n| usize::try_from(n).ok())
                .filter(|_| file_len_means.is_some_and(|l| l <= isize::MAX as u64))
                .ok_or(overflow("n_means"))?,
            file_len,
            file_len_means: file_len_means.ok_or(overflow("n_means"))?,
        })
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// The reading side: a reader, the SHA-256 of everything read through
/// [`read`](Source::read), and the position for [`SessionError::Truncated`].
struct Source<R> {
    inner: R,
    path: Option<PathBuf>,
    hasher: Sha256,
    pos: u64,
    /// The file length the header declares ([`MIN_LEN`] until it is read).
    declared: u64,
}

impl<R: Read> Source<R> {
    fn new(inner: R, path: Option<&Path>) -> Self {
        Source {
            inner,
            path: path.map(Path::to_path_buf),
            hasher: Sha256::new(),
            pos: 0,
            declared: MIN_LEN,
        }
    }

    /// Fills `buf` without hashing it; a short read is [`SessionError::Truncated`].
    fn read_raw(&mut self, buf: &mut [u8]) -> Result<(), SessionError> {
        let mut got = 0;
        while got < buf.len() {
            match self.inner.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(SessionError::Truncated {
                        declared: self.declared,
                        actual: self.pos + got as u64,
                    });
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(SessionError::Io {
                        path: self.path.clone(),
                        source,
                    });
                }
            }
        }
        self.pos += got as u64;
        Ok(())
    }

    /// Fills `buf` and hashes it.
    fn read(&mut self, buf: &mut [u8]) -> Result<(), SessionError> {
        self.read_raw(buf)?;
        self.hasher.update(&*buf);
        Ok(())
    }

    fn u64(&mut self) -> Result<u64, SessionError> {
        let mut b = [0u8; 8];
        self.read(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Reads `out.len()` little-endian u32s.
    fn u32s(&mut self, out: &mut [u32]) -> Result<(), SessionError> {
        self.read(bytemuck::cast_slice_mut(out))?;
        out.iter_mut().for_each(|x| *x = u32::from_le(*x));
        Ok(())
    }

    /// Reads `out.len()` units of a plain Pod type whose little-endian bytes are fixed by
    /// `from_le` (a no-op on little-endian machines).
    fn units<T: bytemuck::Pod>(
        &mut self,
        out: &mut [T],
        from_le: impl Fn(&mut T),
    ) -> Result<(), SessionError> {
        self.read(bytemuck::cast_slice_mut(out))?;
        out.iter_mut().for_each(from_le);
        Ok(())
    }

    /// Reads the stored checksum and compares it with the digest of everything before.
    fn finish(mut self) -> Result<(), SessionError> {
        let computed: [u8; 32] = self.hasher.finalize_reset().into();
        let mut stored = [0u8; 32];
        self.read_raw(&mut stored)?;
        if stored == computed {
            Ok(())
        } else {
            Err(SessionError::ChecksumMismatch { stored, computed })
        }
    }
}

/// The writing side: a writer and the SHA-256 of everything written.
struct Sink<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
    /// Staging for encoded rows.
    buf: Vec<u8>,
}

/// Bytes staged before a write.
const STAGING: usize = 1 << 16;

impl<W: Write> Sink<W> {
    fn new(inner: W) -> Self {
        Sink {
            inner,
            hasher: Sha256::new(),
            written: 0,
            buf: Vec::with_capacity(STAGING),
        }
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.hasher.update(bytes);
        self.written += bytes.len() as u64;
        self.inner.write_all(bytes)
    }

    /// Writes rows (any layout, in logical order) of `codec`'s type in its file layout
    /// ([`KvCodec::write_le`]), in staged chunks.
    fn rows(&mut self, codec: &KvCodec, rows: KvRows<'_>) -> io::Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        let result = codec
            .write_le(rows, &mut buf, STAGING, |b| {
                self.write(b)?;
                b.clear();
                Ok(())
            })
            .and_then(|()| self.write(&buf));
        buf.clear();
        self.buf = buf;
        result
    }

    /// Writes every unit of `values` through `put`, in staged chunks.
    fn units<'a, T: 'a>(
        &mut self,
        values: impl Iterator<Item = &'a T>,
        put: impl Fn(&T, &mut Vec<u8>),
    ) -> io::Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        for v in values {
            put(v, &mut buf);
            if buf.len() >= STAGING {
                self.write(&buf)?;
                buf.clear();
            }
        }
        let result = self.write(&buf);
        buf.clear();
        self.buf = buf;
        result
    }

    /// Appends the digest of everything written; returns the file's length.
    fn finish(mut self) -> io::Result<u64> {
        let digest: [u8; 32] = self.hasher.finalize_reset().into();
        self.inner.write_all(&digest)?;
        self.inner.flush()?;
        Ok(self.written + CHECKSUM_LEN)
    }
}

/// The positions `start .. n_tokens` layer `layer`'s view holds, checked: consecutive
/// segments ending at `n_tokens` from a start the store would accept back
/// ([`restore_starts`] of its window). Returns `(start, count)`.
fn span<K: KvStore + ?Sized>(
    kv: &K,
    layer: usize,
    segments: &[KvSegment<'_>],
    n_tokens: usize,
) -> Result<(usize, usize), SessionError> {
    let starts = restore_starts(kv.window(layer), n_tokens);
    let count: usize = segments.iter().map(|s| s.len()).sum();
    let start = segments
        .first()
        .map_or(n_tokens - count.min(n_tokens), |s| s.start());
    let consecutive = segments
        .windows(2)
        .all(|w| w[0].start() + w[0].len() == w[1].start());
    if start + count == n_tokens && starts.contains(&start) && consecutive {
        Ok((start, count))
    } else {
        Err(SessionError::LayerPositions {
            layer,
            start: start as u64,
            count: count as u64,
            n_tokens: n_tokens as u64,
            first: *starts.start() as u64,
            last: *starts.end() as u64,
        })
    }
}

/// Distinguishes the temporary files of concurrent saves in one process.
static SAVES: AtomicU64 = AtomicU64::new(0);

impl<K: KvStore> Session<K> {
    /// Writes the session to `path` ([module docs](self)), with an empty application
    /// blob. See [`save_with_meta`](Self::save_with_meta).
    pub fn save<B: Backend>(
        &self,
        model: &Llama<B>,
        path: impl AsRef<Path>,
    ) -> Result<(), SessionError> {
        self.save_with_meta(model, path, &[])
    }

    /// Writes the session to `path` with the application's blob `meta` (stored as is,
    /// handed back by [`restore`](Self::restore)): into a temporary file in the same
    /// directory, synced, then renamed over `path`, so `path` never holds a partial file.
    ///
    /// Errors: [`SessionError::Io`] naming `path` (the temporary file is removed),
    /// [`SessionError::GeometryMismatch`] when the store is not the model's.
    pub fn save_with_meta<B: Backend>(
        &self,
        model: &Llama<B>,
        path: impl AsRef<Path>,
        meta: &[u8],
    ) -> Result<(), SessionError> {
        let path = path.as_ref();
        let io = |source| SessionError::Io {
            path: Some(path.to_path_buf()),
            source,
        };
        let name = path.file_name().ok_or_else(|| {
            io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the path names no file",
            ))
        })?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(
            ".{}.{}.tmp",
            std::process::id(),
            SAVES.fetch_add(1, Ordering::Relaxed)
        ));
        let tmp = path.with_file_name(tmp_name);
        let result = (|| {
            let file = File::create(&tmp).map_err(io)?;
            let mut w = BufWriter::with_capacity(1 << 20, file);
            self.write_to(model, meta, &mut w).map_err(|e| match e {
                SessionError::Io { source, .. } => io(source),
                other => other,
            })?;
            let file = w.into_inner().map_err(|e| io(e.into_error()))?;
            file.sync_all().map_err(io)?;
            fs::rename(&tmp, path).map_err(io)
        })();
        if result.is_err() {
            // Best effort: the temporary file holds nothing anyone needs.
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Writes the session in the file format to `w` (no temporary file, no sync) and
    /// returns the bytes written.
    ///
    /// Errors: [`SessionError::Io`] (no path), [`SessionError::GeometryMismatch`] when
    /// the store is not the model's, [`SessionError::LayerPositions`] when a layer of
    /// the store does not hold the positions it would accept back for the session's
    /// length (a store the format cannot describe).
    pub fn write_to<B: Backend, W: Write>(
        &self,
        model: &Llama<B>,
        meta: &[u8],
        w: W,
    ) -> Result<u64, SessionError> {
        let geometry = self.kv.geometry();
        if geometry != model.kv_geometry() {
            return Err(SessionError::GeometryMismatch {
                expected: model.kv_geometry(),
                found: geometry,
            });
        }
        let dim = |v: usize| {
            u32::try_from(v).map_err(|_| SessionError::CountOverflow { field: "row size" })
        };
        let n = self.tokens.len();
        let mut spans = Vec::with_capacity(geometry.n_layers);
        for layer in 0..geometry.n_layers {
            let view = self.kv.view(layer)?;
            spans.push(span(&self.kv, layer, view.segments(), n)?);
        }
        let types = self.kv.kv_types();
        let codecs = self.kv.codecs();
        let keys = &codecs.0;
        let means = keys.calibration();
        // A calibration is one value per layer and key element, of a key type that
        // calibrates; a store that says otherwise could not be read back.
        if !means.is_empty()
            && (!KvCodec::calibrates(types.0)
                || keys.kv_type() != types.0
                || means.len() != geometry.n_layers.saturating_mul(geometry.kv_dim()))
        {
            return Err(SessionError::Kv(KvError::Calibration {
                reason: "the store's key calibration does not fit its geometry and key type",
            }));
        }
        let header = Header {
            version: VERSION,
            n_rows: spans.iter().map(|&(_, count)| count as u64).sum(),
            fingerprint: *model.fingerprint(),
            geometry: [
                dim(geometry.n_layers)?,
                dim(geometry.n_kv_heads)?,
                dim(geometry.head_dim)?,
            ],
            types,
            n_tokens: self.tokens.len() as u64,
            meta_len: meta.len() as u64,
        };
        let io = |source| SessionError::Io { path: None, source };
        let mut sink = Sink::new(w);
        sink.write(&header.encode()).map_err(io)?;
        let mut ids = Vec::with_capacity(4 * self.tokens.len());
        self.tokens
            .iter()
            .for_each(|id| ids.extend_from_slice(&id.to_le_bytes()));
        sink.write(&ids).map_err(io)?;
        sink.write(meta).map_err(io)?;
        sink.write(&(means.len() as u64).to_le_bytes())
            .map_err(io)?;
        sink.units(means.iter(), |v, b| b.extend_from_slice(&v.to_le_bytes()))
            .map_err(io)?;
        for (layer, (start, count)) in spans.into_iter().enumerate() {
            let view = self.kv.view(layer)?;
            let window = self.kv.window(layer).map_or(0, |w| w as u64);
            sink.write(&(start as u64).to_le_bytes()).map_err(io)?;
            sink.write(&(count as u64).to_le_bytes()).map_err(io)?;
            sink.write(&window.to_le_bytes()).map_err(io)?;
            for (keys, codec) in [(true, &codecs.0), (false, &codecs.1)] {
                for s in view.segments() {
                    sink.rows(codec, if keys { s.keys() } else { s.values() })
                        .map_err(io)?;
                }
            }
        }
        sink.finish().map_err(io)
    }
}

/// Loading needs a store that takes stored rows ([`KvRestore`]; a `Box<dyn KvStore>`
/// through its [`restorer`](KvStore::restorer)).
impl<K: KvRestore> Session<K> {
    /// Replaces the session's ids and rows with those of the file at `path` and returns
    /// the application's blob. See [`restore_with`](Self::restore_with).
    pub fn restore<B: Backend>(
        &mut self,
        model: &Llama<B>,
        path: impl AsRef<Path>,
    ) -> Result<Vec<u8>, SessionError> {
        self.restore_with(model, path, |meta| Ok(meta.to_vec()))
    }

    /// Replaces the session's ids and rows with those of the file at `path`, streaming
    /// it and checking all of it first ([module docs](self)); `accept` sees the
    /// application's blob once everything else has checked out, and the session changes
    /// only if it returns `Ok` (whose value is returned).
    ///
    /// The store keeps its kind and ceiling: a file with more positions than its
    /// `max_ctx` is a [`KvError::ContextOverflow`] ([`SessionError::Kv`]).
    ///
    /// Errors, leaving the session exactly as it was: every [`SessionError`] of reading
    /// (named in the module docs), and [`SessionError::MetaRejected`] with `accept`'s
    /// reason.
    pub fn restore_with<B: Backend, T>(
        &mut self,
        model: &Llama<B>,
        path: impl AsRef<Path>,
        accept: impl FnOnce(&[u8]) -> Result<T, String>,
    ) -> Result<T, SessionError> {
        let path = path.as_ref();
        let io = |source| SessionError::Io {
            path: Some(path.to_path_buf()),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let reader = BufReader::with_capacity(1 << 20, file);
        self.read_stream(model, reader, len, Some(path), accept)
    }

    /// [`restore_with`](Self::restore_with) from any reader that yields `len` bytes (no
    /// more are read). I/O errors carry no path.
    pub fn restore_from<B: Backend, R: Read, T>(
        &mut self,
        model: &Llama<B>,
        reader: R,
        len: u64,
        accept: impl FnOnce(&[u8]) -> Result<T, String>,
    ) -> Result<T, SessionError> {
        self.read_stream(model, reader, len, None, accept)
    }

    fn read_stream<B: Backend, R: Read, T>(
        &mut self,
        model: &Llama<B>,
        reader: R,
        len: u64,
        path: Option<&Path>,
        accept: impl FnOnce(&[u8]) -> Result<T, String>,
    ) -> Result<T, SessionError> {
        let mut src = Source::new(reader, path);
        let (header, layout) = Header::read(&mut src, len)?;
        let expected = model.kv_geometry();
        if *model.fingerprint() != header.fingerprint {
            return Err(SessionError::ModelMismatch {
                expected: *model.fingerprint(),
                found: header.fingerprint,
            });
        }
        for found in [layout.geometry, self.kv.geometry()] {
            if found != expected {
                return Err(SessionError::GeometryMismatch { expected, found });
            }
        }
        if header.types != self.kv.kv_types() {
            return Err(SessionError::KvTypeMismatch {
                expected: self.kv.kv_types(),
                found: header.types,
            });
        }
        let n = layout.n_tokens;
        let codecs = self.kv.codecs();
        let store_means = codecs.0.calibration().to_vec();
        let mut tx = Append::begin_restore(&mut self.kv, n)?;

        let mut tokens = vec![0u32; n];
        src.u32s(&mut tokens)?;
        let vocab_size = model.config().vocab_size;
        if let Some((position, &id)) = tokens
            .iter()
            .enumerate()
            .find(|&(_, &id)| id as usize >= vocab_size)
        {
            return Err(SessionError::TokenOutOfVocab {
                position,
                id,
                vocab_size,
            });
        }
        let mut meta = vec![0u8; layout.meta_len];
        src.read(&mut meta)?;

        // The key offsets: their count, and with it the file's exact length, before
        // anything is sized by it; then against the store's, before any row is written.
        let n_means = if layout.offsets { src.u64()? } else { 0 };
        if n_means != 0 && n_means != layout.n_means as u64 {
            return Err(SessionError::CalibrationLength {
                found: n_means,
                expected: layout.n_means as u64,
            });
        }
        let declared = if n_means == 0 {
            layout.file_len
        } else {
            layout.file_len_means
        };
        src.declared = declared;
        if declared > len {
            return Err(SessionError::Truncated {
                declared,
                actual: len,
            });
        }
        if declared < len {
            return Err(SessionError::TrailingBytes {
                declared,
                actual: len,
            });
        }
        let mismatch = SessionError::CalibrationMismatch {
            file: n_means != 0,
            store: !store_means.is_empty(),
        };
        match store_means.is_empty() {
            true if n_means == 0 => {}
            false if n_means != 0 => {
                // n_means = n_layers · kv_dim here, within the file's checked length.
                let mut means = vec![0f32; layout.n_means];
                src.units(&mut means, |x| {
                    *x = f32::from_bits(u32::from_le(x.to_bits()))
                })?;
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                // Bit for bit: the rows were encoded against exactly these means.
                if bits(&means) != bits(&store_means) {
                    return Err(mismatch);
                }
            }
            _ => return Err(mismatch),
        }

        // A layer's count is checked against the rows left of `n_rows` before its buffers
        // are sized, and those rows' bytes are part of the file's length, which fits in
        // isize; with no layer, nothing is read into them.
        let kv_dim = expected.kv_dim();
        let (h, d) = (expected.n_kv_heads, expected.head_dim);
        // The store's codecs are of the file's types (checked above).
        let (mut k, mut v) = (codecs.0.stored_rows(), codecs.1.stored_rows());
        let mut found = 0u64;
        for layer in 0..expected.n_layers {
            let (start, count) = (src.u64()?, src.u64()?);
            let window = if layout.windows { src.u64()? } else { 0 };
            let file = (window != 0).then_some(window);
            let store = tx.window(layer);
            if file != store.map(|w| w as u64) {
                return Err(SessionError::WindowMismatch { layer, file, store });
            }
            let starts = restore_starts(store, n);
            let (first, last) = (*starts.start() as u64, *starts.end() as u64);
            if start.checked_add(count) != Some(n as u64) || start < first || start > last {
                return Err(SessionError::LayerPositions {
                    layer,
                    start,
                    count,
                    n_tokens: n as u64,
                    first,
                    last,
                });
            }
            found += count;
            if found > layout.n_rows {
                return Err(SessionError::RowCount {
                    declared: layout.n_rows,
                    found,
                });
            }
            // count ≤ n_tokens here, so count · kv_dim fits (see above).
            let rows = count as usize;
            k.read(rows, kv_dim, |b| src.read(b))?;
            v.read(rows, kv_dim, |b| src.read(b))?;
            tx.write_stored(layer, k.view(rows, h, d), v.view(rows, h, d))?;
        }
        if found != layout.n_rows {
            return Err(SessionError::RowCount {
                declared: layout.n_rows,
                found,
            });
        }
        src.finish()?;
        let accepted = accept(&meta).map_err(|reason| SessionError::MetaRejected { reason })?;
        tx.commit()?;
        self.tokens = tokens;
        Ok(accepted)
    }
}

impl Session<Box<dyn KvStore>> {
    /// A new session on the model's own store ([`Llama::new_kv`]: a
    /// [`GrowKv`](crate::kv::GrowKv) for an all-global model, a
    /// [`WindowKv`](crate::kv::WindowKv) when some layers attend through a sliding window)
    /// whose ceiling is the model's trained context, holding the file at `path`. See
    /// [`load_with_meta`](Self::load_with_meta).
    pub fn load<B: Backend>(
        path: impl AsRef<Path>,
        model: &Llama<B>,
    ) -> Result<Self, SessionError> {
        Ok(Self::load_with_meta(path, model)?.0)
    }

    /// [`load`](Self::load), also returning the application's blob.
    ///
    /// Errors: as [`restore`](Self::restore), and [`SessionError::Kv`] when the store
    /// cannot be made.
    pub fn load_with_meta<B: Backend>(
        path: impl AsRef<Path>,
        model: &Llama<B>,
    ) -> Result<(Self, Vec<u8>), SessionError> {
        let kv = model.new_kv(model.config().context_len)?;
        let mut session = Session::new(kv);
        let meta = session.restore(model, path)?;
        Ok((session, meta))
    }
}
