//! [`Mem`], the zero-filled memory behind a store's rows: on the heap when small, and
//! on Linux, from [`HUGE_MIN`] bytes, an anonymous mapping aligned to 2 MiB with
//! transparent huge pages asked for (`madvise(MADV_HUGEPAGE)`).
//!
//! Why: attention reads one KV head's rows at a stride of all heads' rows (SmolLM2: 256
//! of every 768 bytes), so a deep cache is read as short runs spread over many 4 KiB
//! pages, and the hardware prefetchers stop at every page boundary. On 2 MiB pages the
//! same reads measured faster end to end (decode at depth 4096, f32 and f16 KV on AVX2).
//! Most Linux systems leave transparent huge pages to `madvise`
//! (`/sys/kernel/mm/transparent_hugepage/enabled`), so a plain `Vec` never gets them.
//!
//! An anonymous mapping is zero-filled by the kernel and faulted in as it is written, so
//! the resident memory still follows the positions held (in 2 MiB steps instead of 4 KiB
//! ones). Where the kernel refuses the advice (no THP support), the mapping keeps its
//! 4 KiB pages: the contents are the same either way.

#[cfg(target_os = "linux")]
use std::marker::PhantomData;
use std::mem;
use std::ops::{Deref, DerefMut};

use bytemuck::Pod;

use super::{Gate, KvError};

/// The size of a transparent huge page on x86_64 and aarch64 (4 KiB base pages), and
/// the smallest buffer that is mapped rather than allocated: a smaller one could not
/// hold a huge page.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(super) const HUGE_MIN: usize = 2 << 20;

/// The smallest buffer that is mapped: [`HUGE_MIN`], except in fuzzing builds
/// (cargo-fuzz sets `--cfg fuzzing`), where it is one 4 KiB page so the fuzz targets'
/// small geometries reach the mapped path too.
#[cfg(all(target_os = "linux", not(fuzzing)))]
const MAP_MIN: usize = HUGE_MIN;
#[cfg(all(target_os = "linux", fuzzing))]
const MAP_MIN: usize = 4096;

/// `len` zero-filled values of `T`.
pub(super) struct Mem<T: Pod> {
    inner: Inner<T>,
}

enum Inner<T> {
    Heap(Vec<T>),
    #[cfg(target_os = "linux")]
    Mapped {
        map: memmap2::MmapMut,
        /// Where the values start in `map` (its first 2 MiB boundary).
        at: usize,
        len: usize,
        _values: PhantomData<T>,
    },
}

impl<T: Pod> Mem<T> {
    /// `len` zeroed values, through `gate` (consulted only when `len > 0`): a refusal,
    /// of the gate or of the system, is [`KvError::AllocFailed`], never an abort.
    pub(super) fn zeroed(gate: &Gate, len: usize) -> Result<Self, KvError> {
        let bytes = len.saturating_mul(mem::size_of::<T>());
        let refused = KvError::AllocFailed { bytes };
        if len > 0 && gate.as_ref().is_some_and(|g| !g.admit(bytes)) {
            return Err(refused);
        }
        #[cfg(target_os = "linux")]
        if bytes >= MAP_MIN {
            return Self::mapped(bytes, len).map_err(|_| refused);
        }
        let mut v = Vec::new();
        v.try_reserve_exact(len).map_err(|_| refused)?;
        v.resize(len, T::zeroed());
        Ok(Mem {
            inner: Inner::Heap(v),
        })
    }

    /// An anonymous mapping of `bytes + HUGE_MIN` (room to start on a 2 MiB boundary),
    /// advised to use huge pages from that boundary on.
    #[cfg(target_os = "linux")]
    fn mapped(bytes: usize, len: usize) -> std::io::Result<Self> {
        let total = bytes
            .checked_add(HUGE_MIN)
            .ok_or(std::io::ErrorKind::OutOfMemory)?;
        let map = memmap2::MmapMut::map_anon(total)?;
        let at = (map.as_ptr() as usize).next_multiple_of(HUGE_MIN) - map.as_ptr() as usize;
        // The advice is a hint: a kernel without transparent huge pages refuses it and
        // the mapping keeps its small pages, with the same contents. Only for a buffer
        // that can hold a huge page (a fuzzing build maps smaller ones, see `MAP_MIN`).
        if bytes >= HUGE_MIN {
            let _ = map.advise_range(memmap2::Advice::HugePage, at, bytes);
        }
        Ok(Mem {
            inner: Inner::Mapped {
                map,
                at,
                len,
                _values: PhantomData,
            },
        })
    }

    /// Bytes held for the values (`len · size_of::<T>()`; a mapping also reserves up to
    /// 2 MiB of address space to align them, never touched).
    pub(super) fn bytes(&self) -> usize {
        self.len() * mem::size_of::<T>()
    }
}

impl<T: Pod> Deref for Mem<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.inner {
            Inner::Heap(v) => v,
            #[cfg(target_os = "linux")]
            Inner::Mapped { map, at, len, .. } => {
                // A 2 MiB boundary is aligned for any `T`, and the mapping holds `at +
                // len · size` bytes: the cast cannot fail.
                bytemuck::cast_slice(&map[*at..*at + *len * mem::size_of::<T>()])
            }
        }
    }
}

impl<T: Pod> DerefMut for Mem<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.inner {
            Inner::Heap(v) => v,
            #[cfg(target_os = "linux")]
            Inner::Mapped { map, at, len, .. } => {
                bytemuck::cast_slice_mut(&mut map[*at..*at + *len * mem::size_of::<T>()])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::kv::AllocGate;

    #[test]
    fn small_and_large_buffers_are_zeroed_writable_and_exact() {
        for len in [
            0usize,
            1,
            1000,
            HUGE_MIN / 4 - 1,
            HUGE_MIN / 4,
            HUGE_MIN / 4 + 3,
        ] {
            let mut m = Mem::<f32>::zeroed(&None, len).unwrap();
            assert_eq!(m.len(), len);
            assert_eq!(m.bytes(), 4 * len);
            assert!(m.iter().all(|&x| x.to_bits() == 0), "len {len}: zeroed");
            for (i, x) in m.iter_mut().enumerate() {
                *x = i as f32;
            }
            assert!(
                m.iter().enumerate().all(|(i, &x)| x == i as f32),
                "len {len}"
            );
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn large_buffers_start_on_a_huge_page_boundary() {
        let m = Mem::<half::f16>::zeroed(&None, HUGE_MIN).unwrap();
        assert!(matches!(m.inner, Inner::Mapped { .. }));
        assert_eq!(m.as_ptr() as usize % HUGE_MIN, 0);
    }

    #[derive(Debug)]
    struct Refuse;
    impl AllocGate for Refuse {
        fn admit(&self, _bytes: usize) -> bool {
            false
        }
    }

    #[test]
    fn a_refusal_is_an_error_naming_the_bytes() {
        let gate: Gate = Some(Arc::new(Refuse));
        for len in [1usize, HUGE_MIN] {
            match Mem::<f32>::zeroed(&gate, len) {
                Err(KvError::AllocFailed { bytes }) => assert_eq!(bytes, 4 * len),
                other => panic!("len {len}: {:?}", other.map(|m| m.len())),
            }
        }
        assert!(Mem::<f32>::zeroed(&gate, 0).is_ok(), "nothing to allocate");
    }
}
