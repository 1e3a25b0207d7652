//! The one `unsafe` call outside the SIMD kernels: mapping a model file read-only.
//!
//! The runtime's issue asks for tensor data borrowed from a memory map, so that a model's
//! weights are paged in from the page cache on demand and shared between processes
//! instead of being read into a private copy. `memmap2::Mmap::map` is `unsafe` because
//! another process could truncate or rewrite the file while it is mapped (the same caveat
//! llama.cpp lives with). kvcore never writes through the map; the crate otherwise
//! forbids `unsafe`, and this module is the single, audited exception.

use memmap2::Mmap;
use std::fs::File;

/// Maps all of `file` read-only.
#[allow(unsafe_code)]
pub(super) fn map_readonly(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the map is read-only and private to this process; kvcore never writes the
    // file. Its contents are validated by the GGUF parser before any tensor is handed out,
    // and the documented contract of `GgufFile::open` is that the file is not modified or
    // truncated while the `GgufFile` lives (a truncation would fault the process on access,
    // as with any memory-mapped reader).
    unsafe { Mmap::map(file) }
}
