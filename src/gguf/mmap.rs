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

/// Maps all of `file` read-only, populated (`MAP_POPULATE`): the kernel maps every page at
/// once from the page cache (reading it in if it is not there), as llama.cpp does by
/// default, instead of one fault per 4 KiB page on first touch. The pages stay the shared,
/// reclaimable page cache (no copy), but they are all resident from the start: a 6-token
/// Gemma 3 prefill spent about half of its 70–100 ms faulting in the 178 MB embedding
/// table and the layers; the load pays it instead, and the whole run takes as long.
#[allow(unsafe_code)]
pub(super) fn map_readonly(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the map is read-only and private to this process; kvcore never writes the
    // file. Its contents are validated by the GGUF parser before any tensor is handed out,
    // and the documented contract of `GgufFile::open` is that the file is not modified or
    // truncated while the `GgufFile` lives (a truncation would fault the process on access,
    // as with any memory-mapped reader).
    unsafe { memmap2::MmapOptions::new().populate().map(file) }
}
