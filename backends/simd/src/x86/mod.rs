//! x86_64 kernels: AVX2 + FMA, with F16C for `F16` weights.
//!
//! - `dot.rs`: the f32 lanes of `crate::lanes`'s loops, the loads, stores and horizontal
//!   sum the other kernels share, and the few-token GEMM on f32 rows;
//! - `quant.rs`: the block microkernels of every weight format (decode a block to lanes,
//!   the `Q8_0`/`Q4_*` row loop) as `kformat::Blocks`, whose generic loops make the GEMV,
//!   the decoder and the 8-bit quantiser (`kquant.rs`: the chunk decoders of `Q5_0`,
//!   `Q4_K` and `Q6_K`);
//! - `attn.rs`: attention's scores and weighted sums over KV rows in their stored types,
//!   several query heads per pass;
//! - `q8.rs`: the 8-bit activation quantiser and the integer-dot GEMV of the block
//!   formats against it.
//!
//! Every kernel is a safe `#[target_feature(enable = "avx2,fma,f16c")]` function; the
//! only `unsafe` outside the unaligned loads and stores is the call into that code from
//! [`Avx2`]'s trait methods, justified by the detection that created the token.
//!
//! The attention kernels and the few-token block GEMM have AVX-512F twins, bit for bit
//! the AVX2 ones (`avx512.rs`). One token type serves both paths: an [`Avx2`] made by
//! [`Avx2::with_avx512`] carries the proof that the twins may run and hands it to those
//! kernels, which pick the twin once per call.

mod attn;
mod avx512;
mod dot;
mod kquant;
mod q8;
mod quant;

use crate::kernel::{HeadRows, Kernel};
use kvcore::backend::{Q8Acts, Weights};

pub(crate) use avx512::Avx512;

/// Proof that this CPU runs AVX2, FMA and F16C, and whether the AVX-512F twins run: only
/// [`Avx2::detect`] and [`Avx2::with_avx512`] create one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2 {
    avx512: Option<Avx512>,
}

impl Avx2 {
    /// The AVX2 kernels alone, even on a CPU with AVX-512F: `Some` when the CPU has
    /// AVX2, FMA and F16C (run-time detection).
    pub(crate) fn detect() -> Option<Avx2> {
        let ok = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        ok.then_some(Avx2 { avx512: None })
    }

    /// The AVX2 kernels with their AVX-512F twins: `Some` when the CPU has AVX-512F
    /// too.
    pub(crate) fn with_avx512() -> Option<Avx2> {
        Avx512::detect().map(|t| Avx2 { avx512: Some(t) })
    }

    /// Whether the AVX-512F twins run.
    pub(crate) fn avx512(self) -> bool {
        self.avx512.is_some()
    }
}

// SAFETY (every `unsafe` block below): the callees need AVX2, FMA and F16C, and an `Avx2`
// value exists only after `Avx2::detect` or `Avx512::detect` found all three at run
// time. The callees check their slice lengths themselves.
impl Kernel for Avx2 {
    fn gemv_q8(self, w: &Weights<'_>, x: &Q8Acts, y: &mut [f32]) {
        // SAFETY: features detected (see above).
        unsafe { q8::gemv(w, x, y) }
    }

    fn gemv_q8_tokens(self, w: &Weights<'_>, x: &[Q8Acts], y: &mut [f32], stride: usize) {
        // SAFETY: features detected (see above).
        unsafe { q8::gemv_tokens(w, x, y, stride) }
    }

    fn gemm_rows(self, w: &[f32], x: &[f32], cols: usize, y: &mut [f32], stride: usize) {
        // SAFETY: features detected (see above).
        unsafe { dot::gemm_rows(w, x, cols, y, stride) }
    }

    fn gemm_stored(self, w: &Weights<'_>, x: &[f32], y: &mut [f32], stride: usize) -> bool {
        // SAFETY: features detected (see above).
        unsafe { quant::gemm_blocks(w, x, y, stride, self.avx512) }
    }

    fn prefetch(self, bytes: &[u8]) {
        // SAFETY: features detected (see above).
        unsafe { dot::prefetch_l2(bytes) }
    }

    fn scores_rows(
        self,
        qs: &[f32],
        keys: HeadRows<'_>,
        scale: f32,
        out: &mut [f32],
        stride: usize,
    ) {
        // SAFETY: features detected (see above).
        unsafe { attn::scores(qs, keys, scale, out, stride, self.avx512) }
    }

    fn weighted_rows(self, p: &[f32], stride: usize, values: HeadRows<'_>, outs: &mut [f32]) {
        // SAFETY: features detected (see above).
        unsafe { attn::weighted(p, stride, values, outs, self.avx512) }
    }

    fn decode_rows(self, rows: HeadRows<'_>, out: &mut [f32]) {
        // SAFETY: features detected (see above).
        unsafe { attn::decode(rows, out) }
    }

    fn unrotate(self, o: &mut [f32]) {
        // SAFETY: features detected (see above).
        unsafe { attn::unrotate(o) }
    }
}
