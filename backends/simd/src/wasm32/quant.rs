//! SIMD128 GEMV and decoding on the stored bytes of every weight format.
//!
//! Decoding (shared by the GEMV and by `dequantize`): each 32-weight block becomes eight
//! 4-lane f32 vectors holding weights `0..4, 4..8, …, 28..32`.
//! - `Q4_*`: the 16 packed bytes are split into low nibbles (weights `0..16`) and high
//!   nibbles (`16..32`) with a mask and a shift, `Q4_0`'s offset 8 is subtracted in 8-bit
//!   integers (exact), then widened 8 → 16 → 32 bits and converted to f32 (exact).
//! - `Q8_0`: the signed bytes widened and converted the same way.
//! - `F16`: widened in integer lanes: `(h & 0x7fff) << 13` reinterpreted as f32 and
//!   multiplied by `2^112` rebases the exponent exactly for normal and subnormal values;
//!   infinities and NaNs (exponent 31) get the f32 exponent 255 (NaNs made quiet, as the
//!   `half` crate does); the sign bit is moved to bit 31. `BF16`: shifted left by 16.
//!   `F32`: a byte load.
//!
//! GEMV of `Q4_0`, `Q4_1`, `Q8_0`: two rows at a time, sharing the activation loads and
//! the conversion of both rows' f16 scales (one 4-lane widening, `[d_0, m_0, d_1, m_1]`).
//! The weights are decoded in a transposed order within each 16-weight half-block (see
//! [`transpose_blocks`]): shifting the bytes as 32-bit lanes and masking gives the nibbles
//! (or, shifted up and arithmetically back down, the signed bytes) of four weights with
//! two integer operations and no byte shuffle; the activations are put in the same order
//! once per call (a reused buffer), so each product pairs the same weight and activation
//! as in the natural order. Numerics, per row: for block `b` with scale `d`, the 32
//! products `q_j·x_j` are summed in a 4-lane vector (two chains of one multiply and three
//! multiply-adds each, then an add), and `acc_{b mod 2} ← acc_{b mod 2} + d·t` (two
//! accumulators, so consecutive blocks do not wait on each other); at the end the
//! accumulators and lanes are summed. SIMD128 has no fused multiply-add: every product is rounded, then added (one
//! rounding more per term than the FMA paths, inside the `+ 2` of the tolerance; the
//! relaxed-SIMD build may fuse them, see `mod.rs`). `Q4_1`
//! uses `Σ_j (d·q_j + m)·x_j = d·Σ_j q_j x_j + m·Σ_j x_j` with the per-block `Σ x_j`
//! precomputed once per call, adding `m·Σx` in a scalar accumulator. Compared with the
//! scalar reference only the rounding differs (order of the sum, `Q4_1`'s factored form:
//! error `≤ γ·Σ_j (|d·q_j| + |m|)·|x_j|`). The plain formats use `dot.rs`'s order (four
//! 4-lane accumulators), one row at a time.
//!
//! Every GEMV row loop touches the next row (or row pair) before it multiplies one
//! (`dot::touch_next`: WebAssembly has no prefetch instruction).
//!
//! `dequantize` computes `d·q` (then `+ m` for `Q4_1`) with separately rounded
//! multiplies and adds, bit for bit as the scalar decoder.
//!
//! `Q5_0`, `Q4_K` and `Q6_K` are decoded and multiplied in `kquant.rs`.

use super::Simd128;
use super::dot::{hsum, load, mul_add, touch_next};
use crate::kformat::{Block, Blocks, F16, F32, Format, f16_at};
use core::arch::wasm32::*;
use kvcore::backend::{QK, Weights};

/// Sixteen bytes from `b[0..16]`.
///
/// # Panics
/// If `b.len() < 16`.
#[inline]
pub(super) fn load_bytes(b: &[u8]) -> v128 {
    assert!(b.len() >= 16);
    // SAFETY: 16 bytes are in bounds (asserted); `v128_load` has no alignment requirement.
    unsafe { v128_load(b.as_ptr().cast()) }
}

/// Four f16 bit patterns (in u32 lanes) widened exactly to f32 (see the module docs).
#[inline]
fn f16x4_to_f32(w: v128) -> v128 {
    let sign = i32x4_shl(v128_and(w, u32x4_splat(0x8000)), 16);
    let em = i32x4_shl(v128_and(w, u32x4_splat(0x7fff)), 13);
    let rebased = f32x4_mul(em, f32x4_splat(f32::from_bits(0x7780_0000)));
    let exp_all_ones = i32x4_eq(v128_and(w, u32x4_splat(0x7c00)), u32x4_splat(0x7c00));
    let mantissa = i32x4_ne(v128_and(w, u32x4_splat(0x03ff)), u32x4_splat(0));
    let quiet = v128_and(mantissa, u32x4_splat(0x0040_0000));
    let special = v128_or(v128_or(em, u32x4_splat(0x7f80_0000)), quiet);
    v128_or(v128_bitselect(special, rebased, exp_all_ones), sign)
}

/// Eight weights of plain format `FMT` from `b[0 .. 8·width]`, widened to f32.
///
/// # Panics
/// If `b` is shorter than 8 elements.
#[inline]
fn widen8<const FMT: u8>(b: &[u8]) -> [v128; 2] {
    if FMT == F32 {
        return [load_bytes(&b[..16]), load_bytes(&b[16..32])];
    }
    let h = load_bytes(b);
    if FMT == F16 {
        [
            f16x4_to_f32(u32x4_extend_low_u16x8(h)),
            f16x4_to_f32(u32x4_extend_high_u16x8(h)),
        ]
    } else {
        [
            i32x4_shl(u32x4_extend_low_u16x8(h), 16),
            i32x4_shl(u32x4_extend_high_u16x8(h), 16),
        ]
    }
}

/// Sixteen signed bytes converted to f32, in order, as four vectors.
#[inline]
pub(super) fn i8x16_to_f32(v: v128) -> [v128; 4] {
    let lo = i16x8_extend_low_i8x16(v);
    let hi = i16x8_extend_high_i8x16(v);
    [
        f32x4_convert_i32x4(i32x4_extend_low_i16x8(lo)),
        f32x4_convert_i32x4(i32x4_extend_high_i16x8(lo)),
        f32x4_convert_i32x4(i32x4_extend_low_i16x8(hi)),
        f32x4_convert_i32x4(i32x4_extend_high_i16x8(hi)),
    ]
}

/// Concatenate two groups of four vectors.
#[inline]
pub(super) fn join(a: [v128; 4], b: [v128; 4]) -> [v128; 8] {
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}

/// The 32 nibbles of a `Q4_*` block (`qs[0..16]`) minus `OFFSET`, as eight f32 vectors.
#[inline]
fn q4_lanes<const OFFSET: i8>(qs: &[u8]) -> [v128; 8] {
    let v = load_bytes(qs);
    let off = i8x16_splat(OFFSET);
    let lo = i8x16_sub(v128_and(v, u8x16_splat(15)), off);
    let hi = i8x16_sub(u8x16_shr(v, 4), off);
    join(i8x16_to_f32(lo), i8x16_to_f32(hi))
}

/// The order in which the GEMV decodes a 32-weight block: vector `4h + m` holds, in lane
/// `k`, weight `16h + 4k + m`. Shifting the block's bytes as four 32-bit lanes puts byte
/// `4k + m` of each 16-byte half (its low or high nibble, for `Q4_*`) in lane `k` with
/// two integer operations per vector and no byte shuffle (SIMD128's shuffles of bytes
/// into wider lanes lower to several instructions); the activations are put in the same
/// order once per call ([`transpose_blocks`]), so each product pairs the same weight and
/// activation as in the natural order.
fn transpose_blocks(x: &[f32], out: &mut Vec<f32>) {
    out.clear();
    for half in x.chunks_exact(16) {
        out.extend((0..16).map(|i| half[4 * (i % 4) + i / 4]));
    }
}

/// The 32 nibbles of a `Q4_*` block (`qs[0..16]`) minus `OFFSET`, as eight f32 vectors in
/// the GEMV order ([`transpose_blocks`]): vector `4h + m` is the low (`h = 0`) or high
/// nibble of byte `m` of each 32-bit lane. The offset is subtracted in f32 (exact).
#[inline]
fn q4_lanes_t<const OFFSET: i8>(qs: &[u8]) -> [v128; 8] {
    let v = load_bytes(qs);
    let mask = u32x4_splat(15);
    let q: [v128; 8] = core::array::from_fn(|i| {
        let shift = (8 * (i % 4) + 4 * (i / 4)) as u32;
        f32x4_convert_i32x4(v128_and(u32x4_shr(v, shift), mask))
    });
    if OFFSET == 0 {
        return q;
    }
    let off = f32x4_splat(f32::from(OFFSET));
    q.map(|l| f32x4_sub(l, off))
}

/// The 32 signed bytes of a `Q8_0` block (`qs[0..32]`) as eight f32 vectors in the GEMV
/// order ([`transpose_blocks`]): byte `m` of each 32-bit lane moved to the top and
/// shifted back down arithmetically (sign-extended).
#[inline]
fn q8_lanes_t(qs: &[u8]) -> [v128; 8] {
    let v = [load_bytes(&qs[..16]), load_bytes(&qs[16..32])];
    core::array::from_fn(|i| {
        let top = i32x4_shl(v[i / 4], (24 - 8 * (i % 4)) as u32);
        f32x4_convert_i32x4(i32x4_shr(top, 24))
    })
}

/// The 32 signed bytes of a `Q8_0` block (`qs[0..32]`) as eight f32 vectors.
#[inline]
fn q8_lanes(qs: &[u8]) -> [v128; 8] {
    join(
        i8x16_to_f32(load_bytes(&qs[..16])),
        i8x16_to_f32(load_bytes(&qs[16..32])),
    )
}

/// `Σ_j q_j·x_j` of one block as a 4-lane vector (lanes still to be summed), `x` the
/// block's activations as eight vectors.
#[inline]
fn block_dot(q: [v128; 8], x: &[v128; 8]) -> v128 {
    let mut p0 = f32x4_mul(q[0], x[0]);
    let mut p1 = f32x4_mul(q[1], x[1]);
    for l in (2..8).step_by(2) {
        p0 = mul_add(p0, q[l], x[l]);
        p1 = mul_add(p1, q[l + 1], x[l + 1]);
    }
    f32x4_add(p0, p1)
}

/// The f16 scales at byte `0` and (`Q4_1`'s offset) byte `2` of two blocks, widened in
/// one vector: `[d_a, m_a, d_b, m_b]` (the `m` lanes are garbage for the formats without).
#[inline]
fn scales2(a: &[u8], b: &[u8]) -> v128 {
    let word = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let w = u32x4(
        word(a) & 0xffff,
        word(a) >> 16,
        word(b) & 0xffff,
        word(b) >> 16,
    );
    f16x4_to_f32(w)
}

impl Block {
    /// Decode one stored block's weights (without its scales) in the GEMV order
    /// ([`transpose_blocks`]).
    #[inline(always)]
    fn lanes_t(self, b: &[u8]) -> [v128; 8] {
        match self {
            Block::Q8_0 => q8_lanes_t(&b[2..]),
            Block::Q4_0 => q4_lanes_t::<8>(&b[2..]),
            Block::Q4_1 => q4_lanes_t::<0>(&b[4..]),
        }
    }

    /// Decode one stored block into `(lanes, d, m)` in the natural order; `m = 0` except
    /// for `Q4_1`.
    #[inline]
    fn decode(self, b: &[u8]) -> ([v128; 8], f32, f32) {
        match self {
            Block::Q8_0 => (q8_lanes(&b[2..]), f16_at(b, 0), 0.0),
            Block::Q4_0 => (q4_lanes::<8>(&b[2..]), f16_at(b, 0), 0.0),
            Block::Q4_1 => (q4_lanes::<0>(&b[4..]), f16_at(b, 0), f16_at(b, 2)),
        }
    }
}

/// `Σ_j w_j x_j` for two rows of block format `fmt` at once, sharing the activation
/// loads and the scale conversion (see the module docs for each row's order).
///
/// # Panics
/// If a row is not `x.len() / 32` blocks or (`Q4_1`) `sums` is shorter than that.
#[inline(always)]
fn dot2_blocks(fmt: Block, rows: [&[u8]; 2], x: &[f32], sums: &[f32]) -> [f32; 2] {
    let bb = fmt.bytes();
    assert!(rows.iter().all(|r| r.len() == x.len() / QK * bb));
    // Per row two chains, even blocks and odd ones, as `acc[r][i & 1]`. (The x86 twin
    // swaps its chains in registers instead; here that made f32-activation decode 20 %
    // slower under wasmtime, 24.4 → 19.9 tok/s, so the array stays.)
    let mut acc = [[f32x4_splat(0.0); 2]; 2];
    let mut offsets = [0.0f32; 2];
    let blocks = rows[0]
        .chunks_exact(bb)
        .zip(rows[1].chunks_exact(bb))
        .zip(x.chunks_exact(QK));
    for (i, ((b0, b1), xb)) in blocks.enumerate() {
        let xv: [v128; 8] = core::array::from_fn(|l| load(&xb[4 * l..]));
        let s = scales2(b0, b1);
        let t0 = block_dot(fmt.lanes_t(b0), &xv);
        let t1 = block_dot(fmt.lanes_t(b1), &xv);
        acc[0][i & 1] = mul_add(acc[0][i & 1], i32x4_shuffle::<0, 0, 0, 0>(s, s), t0);
        acc[1][i & 1] = mul_add(acc[1][i & 1], i32x4_shuffle::<2, 2, 2, 2>(s, s), t1);
        if fmt == Block::Q4_1 {
            offsets[0] += f32x4_extract_lane::<1>(s) * sums[i];
            offsets[1] += f32x4_extract_lane::<3>(s) * sums[i];
        }
    }
    [0, 1].map(|r| hsum(f32x4_add(acc[r][0], acc[r][1])) + offsets[r])
}

/// `Σ_j w_j x_j` for one row of block format `fmt` (see the module docs).
///
/// # Panics
/// If `row` is not `x.len() / 32` blocks or (`Q4_1`) `sums` is shorter than that.
#[inline]
fn dot_blocks(fmt: Block, row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
    assert_eq!(row.len(), x.len() / QK * fmt.bytes());
    let mut acc = [f32x4_splat(0.0); 2];
    let mut offsets = 0.0f32;
    let blocks = row.chunks_exact(fmt.bytes()).zip(x.chunks_exact(QK));
    for (i, (b, xb)) in blocks.enumerate() {
        let s = scales2(b, b);
        let xv: [v128; 8] = core::array::from_fn(|l| load(&xb[4 * l..]));
        let t = block_dot(fmt.lanes_t(b), &xv);
        acc[i & 1] = mul_add(acc[i & 1], i32x4_shuffle::<0, 0, 0, 0>(s, s), t);
        let m = f32x4_extract_lane::<1>(s);
        if fmt == Block::Q4_1 {
            offsets += m * sums[i];
        }
    }
    hsum(f32x4_add(acc[0], acc[1])) + offsets
}

thread_local! {
    /// The activations in the GEMV order ([`transpose_blocks`]), reused across calls.
    static TRANSPOSED: core::cell::RefCell<Vec<f32>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// `y ← W x` for a block format, two rows at a time (an odd last row alone), against
/// the activations in the GEMV order. Inlined into each of `gemv`'s arms, so `fmt` is a
/// constant there. The buffer is taken out of its thread-local and put back rather than
/// borrowed in a closure: a closure passed to `with_borrow_mut` is one function for
/// every format, which left `fmt` a run-time value in the block loop (a branch per
/// block and spilled registers).
#[inline(always)]
fn gemv_blocks(fmt: Block, w: &Weights<'_>, x: &[f32], sums: &[f32], y: &mut [f32]) {
    let mut xt = TRANSPOSED.take();
    transpose_blocks(x, &mut xt);
    gemv_blocks_t(fmt, w, &xt, sums, y);
    TRANSPOSED.set(xt);
}

/// [`gemv_blocks`] on activations already in the GEMV order.
#[inline(always)]
fn gemv_blocks_t(fmt: Block, w: &Weights<'_>, x: &[f32], sums: &[f32], y: &mut [f32]) {
    let (rb, data) = (w.row_bytes(), w.data());
    let mut pairs = data.chunks_exact(2 * rb);
    let mut yp = y.chunks_exact_mut(2);
    for (i, (r, yr)) in pairs.by_ref().zip(yp.by_ref()).enumerate() {
        touch_next(data, 2 * rb, i);
        let (r0, r1) = r.split_at(rb);
        yr.copy_from_slice(&dot2_blocks(fmt, [r0, r1], x, sums));
    }
    if let [last] = yp.into_remainder() {
        *last = dot_blocks(fmt, pairs.remainder(), x, sums);
    }
}

impl Blocks for Simd128 {
    type Chunk = [v128; 8];
    type Eight = [v128; 2];

    #[inline(always)]
    fn widen8<const FMT: u8>(self, b: &[u8]) -> [v128; 2] {
        widen8::<FMT>(b)
    }
    #[inline(always)]
    fn block(self, fmt: Block, b: &[u8]) -> ([v128; 8], f32, f32) {
        fmt.decode(b)
    }
    #[inline(always)]
    fn chunk(self, fmt: Format, b: &[u8], c: usize) -> [v128; 8] {
        fmt.chunk(b, c)
    }
    #[inline(always)]
    fn touch_row(self, data: &[u8], rb: usize, i: usize) {
        touch_next(data, rb, i);
    }
    #[inline(always)]
    fn gemv_blocks(self, fmt: Block, w: &Weights<'_>, x: &[f32], sums: &[f32], y: &mut [f32]) {
        gemv_blocks(fmt, w, x, sums, y);
    }
    #[inline(always)]
    fn abs_max(self, x: &[f32]) -> (bool, f32) {
        super::q8::abs_max(x)
    }
    #[inline(always)]
    fn quantize16(self, x: &[f32], factor: f32, q: &mut [i8]) -> i32 {
        super::q8::quantize16(x, factor, q)
    }
}

crate::kformat::block_loops!(Simd128);
