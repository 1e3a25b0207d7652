//! Every kernel of every SIMD path this CPU runs, against the scalar reference.
//!
//! A `harness = false` test: `main` runs each check on the main thread (no test-harness
//! threads, no rayon), because creating a thread hangs under the qemu-user that runs the
//! aarch64 build (`.ci/aarch64.sh`). It prints one line per check and a closing
//! `simd: N passed, M failed`, and exits non-zero on any failure.
//!
//! Paths: `Simd::with_path` for each of the architecture's SIMD paths (on x86_64
//! `avx512`, the AVX2 kernels with their AVX-512F twins, and `avx2`, the AVX2 kernels
//! alone; NEON on aarch64, SIMD128 on wasm32) and for the scalar path; a path the CPU
//! lacks (or, on wasm32, a build without `+simd128`) is reported and skipped —
//! `.ci/aarch64.sh` and `.ci/wasm.sh` check from the output that the path they expect
//! ran. A first check holds the construction to its contract: `Simd::best` is the first
//! path of `SimdPath::ALL` the CPU runs, `Simd::with_path` gives the path named or
//! `None`, as the CPU's features say.
//! Inputs: proptest `TestRunner`s with a fixed seed and no persistence, plus
//! deterministic sweeps over every weight format and the shapes 0, 1, 31, 32, 33, 63,
//! 64, 65, an odd length, 576 and 1536 (block formats take the multiples of 32 among
//! them, plus 96, an odd number of blocks).
//!
//! Tolerances (`u = 2^-24`, `tiny` = the smallest normal f32, covering gradual
//! underflow per operation). Each backend's result is within a worst-case bound `B` of
//! the exact value, so the two are within `2·B` of each other:
//! - GEMV/GEMM output `Σ_j w_j x_j` over `n` terms, any summation order, with or without
//!   FMA: `B = (n + 2)·(u·Σ_j mag_j·|x_j| + tiny)`, `γ_n ≤ n·u` for the sum and `+ 2` for
//!   the product and the block-scale multiply; `mag_j = |w_j|`, except for `Q4_1`, where
//!   the SIMD kernel factors `d·Σ q x + m·Σ x` and `mag_j = |d·q_j| + |m|` (the decoded
//!   weight's own rounding, `≤ 2u·mag_j`, is inside the same `+ 2`).
//! - attention: each score `s_t = scale·q·k_t` is within
//!   `E_t = (head_dim + 3)·u·scale·Σ_j|q_j k_tj|` of exact, so the two backends' scores
//!   differ by `δ ≤ 2·max_t E_t`, which moves each softmax weight by a factor within
//!   `e^(±2δ)`; each runs its softmax (`exp` within a few ulps — the vectorised one
//!   within 3 —, a sum of `n_keys` terms, one division: `(n_keys + 8)·u` relative each)
//!   and then a weighted sum
//!   of `n_keys` rows (`(n_keys + 1)·u` each). Output `j` allows
//!   `(4.5·δ + 2·(2·n_keys + 9)·u)·Σ_t p_t·|v_tj| + 2·(n_keys + 2)·tiny`.
//! - RMSNorm: an f32 sum of `d` squares (`(d + 1)·u` relative) against the scalar's f64,
//!   halved by the square root, plus the reciprocal and two products:
//!   `2·((d + 3)/2 + 9)·u·|out|`.
//! - add, embedding rows: bit for bit (correctly rounded, or the same code).
//! - SwiGLU and GeGLU: bit for bit on the scalar path. On AVX2, NEON and SIMD128 (`g / (1 + e^k)`
//!   with the vectorised `exp`, the same algorithm in 8 or 4 lanes, without FMA on SIMD128): SwiGLU within `12u·|out|` (3 ulps of `exp` against 1,
//!   and each side's add, division and product), plus `1e-35·|u|` where the vector `exp`
//!   saturates to `∞` from 88.38 on and libm's only at 88.72; GeGLU within `20u·|g·u|`:
//!   the reference's `1 + tanh z` is within `3u·|out| + 10.5u·|g·u|` of exact (the
//!   conformance oracle's bound), the logistic form within `6u·|g·u|`.
//! - softmax of `n` entries: bit for bit on the scalar path; on AVX2, NEON and SIMD128 (vectorised
//!   `exp` within 3 ulps against libm's 1, an 8- or 4-lane sum against a left-to-right one,
//!   each within `n·u` relative, one division each) within `(2n + 12)·u·|p|`, plus
//!   `2·f32::MIN_POSITIVE` for weights below it, which the vector `exp` flushes to zero.
//! - 8-bit activations, both layouts (`Q8_0`, `Q8_K`): `quantize_q8` bit for bit
//!   (scales, sums and values) against `Q8Acts::quantize`, on random blocks and on blocks
//!   with ties, NaN, ±inf, zeros and subnormal magnitudes. `gemv_q8` against
//!   `q8::gemv_reference` (the exact value of the integer-dot formula, rounded once), for
//!   every format with an 8-bit path (and, for the 32-weight formats, with every f16 bit
//!   pattern as a block scale): each activation block (32 or 256) contributes up to
//!   8 partial integer dot products (exact) scaled by `d_w·d_a` plus one offset term,
//!   each with at most 3 roundings, so any summation order of the `K ≤ 9·blocks` terms
//!   is within `(K + 3)·u·Σ_b mag_b` (`mag_b = |d_w·d_a|·Σ_j|w_j q_j| + |m·d_a·s|`, from
//!   `q8::row_terms`), plus `tiny` per term.

use kvcore::backend::{
    AttnParams, Backend, DType, Mask, Q8Acts, Q8Layout, QK, QK_K, ShapeError, Weights, q8,
};
use kvcore::kv::KvView;
use kvcore::ndarray::Array3;
use kvcore_scalar::Scalar;
use kvcore_scalar::quant::quantize_row;
use kvcore_simd::{Simd, SimdPath};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::process::ExitCode;

/// f32 unit roundoff.
const U: f64 = 1.0 / (1u64 << 24) as f64;
/// Absolute error allowed per operation for gradual underflow.
const TINY: f64 = f32::MIN_POSITIVE as f64;
/// Proptest cases per randomised check.
const CASES: u32 = 48;
/// The reference.
const REF: Scalar = Scalar::new();

/// Reduction lengths of the plain formats (and the source of the block-format ones).
const LENGTHS: [usize; 14] = [0, 1, 31, 32, 33, 63, 64, 65, 96, 97, 256, 576, 768, 1536];
/// Weight rows of the randomised GEMV/GEMM cases.
const ROWS: [usize; 6] = [0, 1, 3, 17, 64, 65];
/// Tokens of the randomised GEMM cases.
const TOKENS: [usize; 5] = [0, 1, 2, 7, 33];

/// The reduction lengths valid for `dtype`.
fn lengths(dtype: DType) -> Vec<usize> {
    LENGTHS
        .into_iter()
        .filter(|c| c.is_multiple_of(dtype.block_len()))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------

/// Deterministic values from a seed (splitmix64), each `uniform(−1, 1)·2^k` with a
/// per-call scale exponent `k ∈ −4..=4`.
struct Values(u64);

impl Values {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        let scale = 2f32.powi((self.next_u64() % 9) as i32 - 4);
        (0..n).map(|_| self.unit() * scale).collect()
    }
}

/// A stored weight matrix `[rows, cols]` of `dtype`, quantised from random values with
/// the reference quantiser. `offset` bytes of padding precede the data (an `F32` view
/// at offset 1 is misaligned, exercising the GEMM panel path).
struct Matrix {
    dtype: DType,
    rows: usize,
    cols: usize,
    offset: usize,
    bytes: Vec<u8>,
}

impl Matrix {
    fn new(dtype: DType, rows: usize, cols: usize, offset: usize, v: &mut Values) -> Matrix {
        let mut bytes = vec![0u8; offset];
        for _ in 0..rows {
            bytes.extend(quantize_row(dtype, &v.vec(cols)));
        }
        Matrix {
            dtype,
            rows,
            cols,
            offset,
            bytes,
        }
    }

    fn weights(&self) -> Weights<'_> {
        Weights::new(self.dtype, self.rows, self.cols, &self.bytes[self.offset..])
            .expect("test matrix shape")
    }

    /// Per weight of row `r`: the magnitude entering the error bound (module docs).
    fn magnitudes(&self, r: usize) -> Vec<f64> {
        let w = self.weights();
        let mut row = vec![0.0f32; self.cols];
        kvcore_scalar::quant::dequantize_row(&w, r, &mut row);
        if self.dtype != DType::Q4_1 {
            return row.iter().map(|&v| f64::from(v).abs()).collect();
        }
        let f16_at = |b: &[u8], at| f64::from(half::f16::from_le_bytes([b[at], b[at + 1]]));
        let mut mags = Vec::with_capacity(self.cols);
        for block in w.row(r).chunks_exact(20) {
            let (d, m) = (f16_at(block, 0), f16_at(block, 2));
            let nibbles = block[4..]
                .iter()
                .map(|q| q & 15)
                .chain(block[4..].iter().map(|q| q >> 4));
            mags.extend(nibbles.map(|q| (d * f64::from(q)).abs() + m.abs()));
        }
        debug_assert_eq!(mags.len(), QK * (self.cols / QK));
        mags
    }

    /// The allowed difference of output `(t, r)` for activations `x: [cols]`.
    fn tolerance(&self, r: usize, x: &[f32]) -> f64 {
        let s: f64 = self
            .magnitudes(r)
            .iter()
            .zip(x)
            .map(|(m, &v)| m * f64::from(v).abs())
            .sum();
        2.0 * (self.cols as f64 + 2.0) * (U * s + TINY)
    }
}

// ---------------------------------------------------------------------------------------
// Comparisons
// ---------------------------------------------------------------------------------------

/// Fails unless `|got_i − want_i| ≤ tol(i)` for every `i` (NaN fails).
fn close(
    what: &str,
    got: &[f32],
    want: &[f32],
    tol: impl Fn(usize) -> f64,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len(), "{}: lengths", what);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (err, t) = ((f64::from(g) - f64::from(w)).abs(), tol(i));
        // `err.is_nan()` catches a NaN output, which fails every comparison.
        if err.is_nan() || err > t {
            return Err(TestCaseError::fail(format!(
                "{what}[{i}]: got {g:e}, want {w:e}: |diff| {err:e} > tolerance {t:e}"
            )));
        }
    }
    Ok(())
}

/// Fails unless `got` and `want` are bit for bit equal.
fn exact(what: &str, got: &[f32], want: &[f32]) -> Result<(), TestCaseError> {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    prop_assert_eq!(bits(got), bits(want), "{}", what);
    Ok(())
}

/// Both backends return the same `Result`; on `Ok`, the outputs go to `compare`.
fn same_result(
    what: &str,
    got: Result<(), ShapeError>,
    want: Result<(), ShapeError>,
) -> Result<bool, TestCaseError> {
    prop_assert_eq!(&got, &want, "{}: results", what);
    Ok(got.is_ok())
}

// ---------------------------------------------------------------------------------------
// Checks, one per kernel
// ---------------------------------------------------------------------------------------

/// GEMV `y ← W x` on one matrix.
fn check_gemv(s: &Simd, m: &Matrix, v: &mut Values) -> Result<(), TestCaseError> {
    let x = v.vec(m.cols);
    let (mut got, mut want) = (vec![f32::NAN; m.rows], vec![f32::NAN; m.rows]);
    let what = format!("gemv {} [{}, {}]", m.dtype, m.rows, m.cols);
    if same_result(
        &what,
        s.gemv(&m.weights(), &x, &mut got),
        REF.gemv(&m.weights(), &x, &mut want),
    )? {
        close(&what, &got, &want, |r| m.tolerance(r, &x))?;
    }
    Ok(())
}

/// `quantize_q8` of `x` in `layout`, bit for bit against the reference quantiser.
fn check_quantize_q8(s: &Simd, layout: Q8Layout, x: &[f32]) -> Result<(), TestCaseError> {
    let mut got = Q8Acts::new();
    let r = s.quantize_q8(layout, x, &mut got);
    let mut want = Q8Acts::new();
    let what = format!("quantize_q8 {layout:?} [{}]", x.len());
    prop_assert_eq!(&r, &want.quantize(layout, x), "{}: results", what);
    if r.is_ok() {
        exact(&format!("{what} scales"), got.scales(), want.scales())?;
        prop_assert_eq!(got.sums(), want.sums(), "{} sums", what);
        prop_assert_eq!(got.values(), want.values(), "{} values", what);
        prop_assert_eq!(got.layout(), layout);
    }
    Ok(())
}

/// [`special_activations`] in `Q8_K` blocks: a tie block (`|max| = 127`, so
/// `iscale = ∓1`) whose largest magnitude appears with both signs (the first decides),
/// and the special blocks repeated in 256-value blocks (NaN, ±inf, zeros, subnormal),
/// then random, 1e3 and 1e34 blocks (a row of 1e36 × 256 could overflow f32).
fn special_activations_k(v: &mut Values) -> Vec<f32> {
    let mut x: Vec<f32> = (0..QK_K).map(|j| (j % 64) as f32 - 31.5).collect();
    x[5] = -127.0;
    x[200] = 127.0;
    let blocks: [&dyn Fn(usize, f32) -> f32; 6] = [
        &|j, r| if j == 77 { f32::NAN } else { r },
        &|j, r| match j {
            3 => f32::INFINITY,
            250 => f32::NEG_INFINITY,
            _ => r,
        },
        &|_, _| 0.0,
        &|j, _| (j as f32 - 128.0) * 1e-40,
        &|_, r| r * 1e3,
        &|_, r| r * 1e34,
    ];
    for f in blocks {
        let r = v.vec(QK_K);
        x.extend(r.iter().enumerate().map(|(j, &r)| f(j, r)));
    }
    x.extend(v.vec(2 * QK_K));
    x
}

/// Activations with special blocks: a tie at every `k + 0.5` (block `amax = 127`, so
/// `d = 1`), a NaN, a ±inf, all zeros, all subnormal, random blocks, and blocks of
/// magnitudes up to 1e3 and 1e36 (`d > 1`).
fn special_activations(v: &mut Values) -> Vec<f32> {
    let mut x: Vec<f32> = (0..QK).map(|j| j as f32 - 15.5).collect();
    x[31] = 127.0;
    let mut nan = v.vec(QK);
    nan[3] = f32::NAN;
    let mut inf = v.vec(QK);
    inf[30] = f32::NEG_INFINITY;
    inf[2] = f32::INFINITY;
    x.extend(nan);
    x.extend(inf);
    x.extend([0.0f32; QK]);
    x.extend((0..QK).map(|j| (j as f32 - 16.0) * 1e-40));
    x.extend(v.vec(3 * QK));
    // Large magnitudes (d > 1): a block scaled by 1e3 and one near f32's top range.
    x.extend(v.vec(QK).iter().map(|a| a * 1e3));
    x.extend(v.vec(QK).iter().map(|a| a * 1e36));
    x
}

/// `gemv_q8` on one block-format matrix against the reference (module docs).
fn check_gemv_q8(s: &Simd, m: &Matrix, x: &[f32]) -> Result<(), TestCaseError> {
    let layout = Q8Layout::of(m.dtype).expect("a format with an 8-bit path");
    let xq = Q8Acts::from_f32(layout, x).expect("whole blocks");
    let (mut got, mut want) = (vec![f32::NAN; m.rows], vec![f32::NAN; m.rows]);
    let what = format!("gemv_q8 {} [{}, {}]", m.dtype, m.rows, m.cols);
    let w = m.weights();
    if same_result(
        &what,
        s.gemv_q8(&w, &xq, &mut got),
        q8::gemv_reference(&w, &xq, &mut want),
    )? {
        let blocks = m.cols / layout.block_len();
        let k = 9.0 * blocks as f64;
        close(&what, &got, &want, |r| {
            let mag: f64 = q8::row_terms(&w, r, &xq).map(|(_, a)| a).sum();
            (k + 3.0) * (U * mag + TINY)
        })?;
    }
    Ok(())
}

/// `gemv_q8` of a 32-weight format whose first block in row `i` has the f16 scale with
/// bit pattern `i` (all 65 536: normal, subnormal, zeros, ±inf, NaNs; `Q4_1`'s `m` the
/// pattern `40 503·i mod 2^16`, also every one) and a random second block, against the
/// reference: not finite where it is not (a NaN, or the same infinity: the kernels
/// scale partial dots, so an infinite scale times a zero partial makes a NaN where the
/// reference's one product is infinite), else within `check_gemv_q8`'s bound. The
/// SIMD128 kernels widen the scales by a shortcut that is exact for finite values only
/// and compute a row pair with a non-finite scale again: this checks both.
fn check_gemv_q8_every_scale(s: &Simd, dtype: DType) -> Result<(), TestCaseError> {
    let mut v = Values(400 + u64::from(dtype.ggml_type()));
    let (rows, cols, bb) = (1 << 16, 2 * QK, dtype.block_bytes());
    let mut m = Matrix::new(dtype, rows, cols, 0, &mut v);
    for (i, row) in m.bytes.chunks_exact_mut(2 * bb).enumerate() {
        row[..2].copy_from_slice(&(i as u16).to_le_bytes());
        if dtype == DType::Q4_1 {
            row[2..4].copy_from_slice(&((i as u32 * 40_503) as u16).to_le_bytes());
        }
    }
    let xq = Q8Acts::from_f32(Q8Layout::Q8_0, &v.vec(cols)).expect("whole blocks");
    let (mut got, mut want) = (vec![0.0f32; rows], vec![0.0f32; rows]);
    let w = m.weights();
    s.gemv_q8(&w, &xq, &mut got).expect("shapes");
    q8::gemv_reference(&w, &xq, &mut want).expect("shapes");
    let k = 9.0 * 2.0;
    for (r, (&g, &e)) in got.iter().zip(&want).enumerate() {
        let what = format!("gemv_q8 {dtype}, scale bits {r:#06x}: got {g:e}, want {e:e}");
        if e.is_nan() || e.is_infinite() {
            prop_assert!(g.is_nan() || g == e, "{}", what);
            continue;
        }
        let mag: f64 = q8::row_terms(&w, r, &xq).map(|(_, a)| a).sum();
        let err = (f64::from(g) - f64::from(e)).abs();
        prop_assert!(err <= (k + 3.0) * (U * mag + TINY), "{}", what);
    }
    Ok(())
}

/// GEMM `Y ← X Wᵀ` for `n` tokens on one matrix.
fn check_gemm(s: &Simd, m: &Matrix, n: usize, v: &mut Values) -> Result<(), TestCaseError> {
    let x = v.vec(n * m.cols);
    let len = n * m.rows;
    let (mut got, mut want) = (vec![f32::NAN; len], vec![f32::NAN; len]);
    let what = format!("gemm {} [{}, {}] n {n}", m.dtype, m.rows, m.cols);
    if same_result(
        &what,
        s.gemm(&m.weights(), &x, &mut got),
        REF.gemm(&m.weights(), &x, &mut want),
    )? {
        close(&what, &got, &want, |i| {
            let (t, r) = (i / m.rows, i % m.rows);
            m.tolerance(r, &x[t * m.cols..(t + 1) * m.cols])
        })?;
    }
    Ok(())
}

/// One attention head: `hd` elements, `n_keys` rows of `n_kv` heads, reading `kv_head`
/// through a head-sliced (strided) view of the rows.
fn check_attend_head(
    s: &Simd,
    hd: usize,
    n_keys: usize,
    n_kv: usize,
    kv_head: usize,
    v: &mut Values,
) -> Result<(), TestCaseError> {
    let kv_dim = hd * n_kv;
    let q = v.vec(hd);
    let keys = v.vec(n_keys * kv_dim);
    let values = v.vec(n_keys * kv_dim);
    let scale = 1.0 / (hd.max(1) as f32).sqrt();
    let rows = |m: &[f32]| Array3::from_shape_vec((n_keys, n_kv, hd), m.to_vec()).unwrap();
    let (k3, v3) = (rows(&keys), rows(&values));
    let view = KvView::from_f32(k3.view(), v3.view())
        .unwrap()
        .heads(kv_head..kv_head + 1);
    let q3 = Array3::from_shape_vec((1, 1, hd), q.clone()).unwrap();
    let params = AttnParams {
        scale,
        mask: Mask::Causal,
    };
    // The query sits at the last cached position, so it sees every row.
    let pos = [n_keys.saturating_sub(1)];
    let (mut got3, mut want3) = (
        Array3::from_elem((1, 1, hd), f32::NAN),
        Array3::from_elem((1, 1, hd), f32::NAN),
    );
    let what = format!("attention hd {hd} n_keys {n_keys} kv_dim {kv_dim} head {kv_head}");
    let run = |b: &dyn Backend, out: &mut Array3<f32>| {
        b.attention(q3.view(), &pos, &view, &params, out.view_mut())
    };
    if !same_result(&what, run(s, &mut got3), run(&REF, &mut want3))? {
        return Ok(());
    }
    let (got, want) = (
        got3.into_raw_vec_and_offset().0,
        want3.into_raw_vec_and_offset().0,
    );
    // Exact scores, their error bounds, and the softmax weights, in f64.
    let col = kv_head * hd;
    let row = |m: &[f32], t: usize| m[t * kv_dim + col..t * kv_dim + col + hd].to_vec();
    let (mut scores, mut max_e) = (Vec::with_capacity(n_keys), 0.0f64);
    for t in 0..n_keys {
        let k = row(&keys, t);
        let (dot, abs) = q.iter().zip(&k).fold((0.0, 0.0), |(d, a), (&qj, &kj)| {
            let p = f64::from(qj) * f64::from(kj);
            (d + p, a + p.abs())
        });
        scores.push(f64::from(scale) * dot);
        max_e = max_e.max((hd as f64 + 3.0) * U * f64::from(scale) * abs);
    }
    let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
    let total: f64 = e.iter().sum();
    let delta = 2.0 * max_e;
    let rel = 4.5 * delta + 2.0 * (2.0 * n_keys as f64 + 9.0) * U;
    close(&what, &got, &want, |j| {
        let weighted: f64 = (0..n_keys)
            .map(|t| e[t] / total * f64::from(values[t * kv_dim + col + j]).abs())
            .sum();
        rel * weighted + 2.0 * (n_keys as f64 + 2.0) * TINY
    })
}

/// RMSNorm of `n` rows of `d`.
fn check_rms_norm(s: &Simd, n: usize, d: usize, v: &mut Values) -> Result<(), TestCaseError> {
    let x = v.vec(n * d);
    let w = v.vec(d);
    let eps = 1e-5;
    let (mut got, mut want) = (vec![f32::NAN; n * d], vec![f32::NAN; n * d]);
    let what = format!("rms_norm [{n}, {d}]");
    if same_result(
        &what,
        s.rms_norm(&x, &w, eps, &mut got),
        REF.rms_norm(&x, &w, eps, &mut want),
    )? {
        let rel = 2.0 * ((d as f64 + 3.0) / 2.0 + 9.0) * U;
        close(&what, &got, &want, |i| {
            rel * f64::from(want[i]).abs() + TINY
        })?;
    }
    Ok(())
}

/// On a vector path (AVX2 or NEON, the vectorised `exp`) `got` within `bound(i)` of
/// `want`; on the scalar path (the reference's code) bit for bit.
fn vector_within(
    s: &Simd,
    what: &str,
    got: &[f32],
    want: &[f32],
    bound: impl Fn(usize) -> f64,
) -> Result<(), TestCaseError> {
    if s.path() != SimdPath::Scalar {
        close(what, got, want, bound)
    } else {
        exact(what, got, want)
    }
}

/// The element-wise kernels and embedding rows, bit for bit, at length `len`.
fn check_exact_ops(s: &Simd, len: usize, v: &mut Values) -> Result<(), TestCaseError> {
    let (a, b) = (v.vec(len), v.vec(len));
    let (mut got, mut want) = (a.clone(), a.clone());
    let what = format!("add [{len}]");
    if same_result(&what, s.add(&mut got, &b), REF.add(&mut want, &b))? {
        exact(&what, &got, &want)?;
    }
    // Wide gates reach both tails of silu (e^(−g) overflowing and underflowing).
    let gate: Vec<f32> = a.iter().map(|g| g * 100.0).collect();
    let (mut got, mut want) = (vec![f32::NAN; len], vec![f32::NAN; len]);
    let what = format!("swiglu [{len}]");
    let u = f64::from(f32::EPSILON) / 2.0;
    if same_result(
        &what,
        s.swiglu(&gate, &b, &mut got),
        REF.swiglu(&gate, &b, &mut want),
    )? {
        vector_within(s, &what, &got, &want, |i| {
            12.0 * u * f64::from(want[i]).abs() + 1e-35 * f64::from(b[i]).abs() + TINY
        })?;
    }
    let what = format!("geglu [{len}]");
    if same_result(
        &what,
        s.geglu(&gate, &b, &mut got),
        REF.geglu(&gate, &b, &mut want),
    )? {
        vector_within(s, &what, &got, &want, |i| {
            20.0 * u * (f64::from(gate[i]) * f64::from(b[i])).abs() + TINY
        })?;
    }
    let (mut got, mut want) = (gate.clone(), gate);
    s.softmax(&mut got);
    REF.softmax(&mut want);
    let what = format!("softmax [{len}]");
    if s.path() != SimdPath::Scalar {
        let rel = (2.0 * len as f64 + 12.0) * u;
        let tiny = 2.0 * f64::from(f32::MIN_POSITIVE);
        close(&what, &got, &want, |i| {
            rel * f64::from(want[i]).abs() + tiny
        })?;
    } else {
        exact(&what, &got, &want)?;
    }
    for dtype in DType::ALL {
        if !len.is_multiple_of(dtype.block_len()) || len == 0 {
            continue;
        }
        let m = Matrix::new(dtype, 3, len, 0, v);
        let (mut got, mut want) = (vec![f32::NAN; len], vec![f32::NAN; len]);
        for row in 0..4 {
            let what = format!("embed_row {dtype} [3, {len}] row {row}");
            let (g, w) = (
                s.embed_row(&m.weights(), row, &mut got),
                REF.embed_row(&m.weights(), row, &mut want),
            );
            if same_result(&what, g, w)? {
                exact(&what, &got, &want)?;
            }
        }
    }
    Ok(())
}

/// Mismatched shapes: the same `ShapeError` as the reference.
fn check_shape_errors(s: &Simd) -> Result<(), TestCaseError> {
    let w = Weights::from_f32(2, 3, &[0.0; 6]).expect("shape");
    let (mut y, mut y2) = ([0.0f32; 2], [0.0f32; 2]);
    same_result(
        "gemv short x",
        s.gemv(&w, &[1.0; 2], &mut y),
        REF.gemv(&w, &[1.0; 2], &mut y2),
    )?;
    same_result(
        "gemm ragged x",
        s.gemm(&w, &[1.0; 4], &mut y),
        REF.gemm(&w, &[1.0; 4], &mut y2),
    )?;
    let (kv_rows, q3) = (
        Array3::from_elem((2, 2, 4), 1.0f32),
        Array3::from_elem((1, 3, 4), 1.0f32),
    );
    let kv = KvView::from_f32(kv_rows.view(), kv_rows.view()).unwrap();
    let params = AttnParams::causal(4);
    let (mut out, mut out2) = (Array3::zeros((1, 3, 4)), Array3::zeros((1, 3, 4)));
    same_result(
        "attention heads not a multiple of the kv heads",
        s.attention(q3.view(), &[1], &kv, &params, out.view_mut()),
        REF.attention(q3.view(), &[1], &kv, &params, out2.view_mut()),
    )?;
    same_result(
        "rms_norm ragged x",
        s.rms_norm(&[1.0; 5], &[1.0; 2], 1e-5, &mut [0.0; 5]),
        REF.rms_norm(&[1.0; 5], &[1.0; 2], 1e-5, &mut [0.0; 5]),
    )?;
    same_result(
        "add lengths",
        s.add(&mut [0.0; 3], &[1.0; 2]),
        REF.add(&mut [0.0; 3], &[1.0; 2]),
    )?;
    prop_assert_eq!(&out, &out2, "outputs untouched on error");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Runner
// ---------------------------------------------------------------------------------------

/// Pass and fail counts, one line printed per check.
#[derive(Default)]
struct Report {
    passed: usize,
    failed: usize,
}

impl Report {
    fn record(&mut self, name: &str, result: Result<(), String>) {
        match result {
            Ok(()) => {
                self.passed += 1;
                println!("ok     {name}");
            }
            Err(e) => {
                self.failed += 1;
                println!("FAILED {name}: {e}");
            }
        }
    }

    /// A proptest check: `CASES` cases of `strategy`, fixed seed, no persistence, on
    /// this thread.
    fn prop<S: Strategy>(
        &mut self,
        name: &str,
        strategy: S,
        test: impl Fn(S::Value) -> Result<(), TestCaseError>,
    ) {
        let config = Config {
            cases: CASES,
            failure_persistence: None,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]);
        let mut runner = TestRunner::new_with_rng(config, rng);
        let result = runner.run(&strategy, test).map_err(|e| e.to_string());
        self.record(name, result);
    }

    /// A deterministic check.
    fn fixed(&mut self, name: &str, test: impl FnOnce() -> Result<(), TestCaseError>) {
        self.record(name, test().map_err(|e| e.to_string()));
    }
}

/// Every check on one backend instance.
fn check_path(report: &mut Report, s: &Simd) {
    let p = s.path().name();
    let dtype = (0..DType::ALL.len()).prop_map(|i| DType::ALL[i]);
    let shape = (
        dtype,
        any::<prop::sample::Index>(),
        0..ROWS.len(),
        any::<u64>(),
    );

    report.prop(
        &format!("{p}: gemv, random shapes"),
        shape.clone(),
        |(dt, c, r, seed)| {
            let mut v = Values(seed);
            let cols = c.get(&lengths(dt)).to_owned();
            let m = Matrix::new(dt, ROWS[r], cols, (seed % 2) as usize, &mut v);
            check_gemv(s, &m, &mut v)
        },
    );
    report.prop(
        &format!("{p}: gemm, random shapes"),
        (shape, 0..TOKENS.len()),
        |((dt, c, r, seed), n)| {
            let mut v = Values(seed);
            let cols = c.get(&lengths(dt)).to_owned();
            let m = Matrix::new(dt, ROWS[r], cols, (seed % 2) as usize, &mut v);
            check_gemm(s, &m, TOKENS[n], &mut v)
        },
    );
    for dt in DType::ALL {
        report.fixed(&format!("{p}: gemv/gemm {dt}, every length"), || {
            let mut v = Values(dt.ggml_type().into());
            for cols in lengths(dt) {
                let m = Matrix::new(dt, 5, cols, 0, &mut v);
                check_gemv(s, &m, &mut v)?;
                check_gemm(s, &m, 3, &mut v)?;
            }
            Ok(())
        });
        report.fixed(&format!("{p}: gemv/gemm {dt}, SmolLM2 shapes"), || {
            let mut v = Values(100 + u64::from(dt.ggml_type()));
            let shapes: [(usize, usize); 3] = [(576, 576), (1536, 576), (576, 1536)];
            for (rows, cols) in shapes
                .into_iter()
                .filter(|s| s.1.is_multiple_of(dt.block_len()))
            {
                let m = Matrix::new(dt, rows, cols, 0, &mut v);
                check_gemv(s, &m, &mut v)?;
                check_gemm(s, &m, 5, &mut v)?;
            }
            Ok(())
        });
    }
    let heads = (
        prop::sample::select(vec![1usize, 2, 31, 32, 33, 63, 64, 65]),
        prop::sample::select(vec![0usize, 1, 2, 31, 32, 33, 64, 65, 200]),
        1usize..=3,
        any::<u64>(),
    );
    report.prop(
        &format!("{p}: attention of one head"),
        heads,
        |(hd, n_keys, n_kv, seed)| {
            let mut v = Values(seed);
            let kv_head = (seed % n_kv as u64) as usize;
            check_attend_head(s, hd, n_keys, n_kv, kv_head, &mut v)
        },
    );
    report.fixed(
        &format!("{p}: attention of one head, SmolLM2 head (64) at 576 keys"),
        || check_attend_head(s, 64, 576, 3, 2, &mut Values(9)),
    );
    let norms = (
        1usize..4,
        prop::sample::select(LENGTHS[1..].to_vec()),
        any::<u64>(),
    );
    report.prop(&format!("{p}: rms_norm"), norms, |(n, d, seed)| {
        check_rms_norm(s, n, d, &mut Values(seed))
    });
    report.fixed(
        &format!("{p}: add, swiglu, geglu, softmax, embed_row, every length"),
        || {
            let mut v = Values(11);
            LENGTHS
                .into_iter()
                .try_for_each(|len| check_exact_ops(s, len, &mut v))
        },
    );
    report.fixed(&format!("{p}: shape errors"), || check_shape_errors(s));

    let q8_dtypes = [
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q4_K,
        DType::Q6_K,
    ];
    for layout in [Q8Layout::Q8_0, Q8Layout::Q8_K] {
        let bl = layout.block_len();
        report.prop(
            &format!("{p}: quantize_q8 {layout:?}, random lengths"),
            (0usize..60 * QK / bl, any::<u64>()),
            |(blocks, seed)| check_quantize_q8(s, layout, &Values(seed).vec(blocks * bl)),
        );
    }
    report.fixed(&format!("{p}: quantize_q8, special blocks"), || {
        check_quantize_q8(s, Q8Layout::Q8_0, &special_activations(&mut Values(12)))?;
        check_quantize_q8(s, Q8Layout::Q8_K, &special_activations_k(&mut Values(14)))?;
        check_quantize_q8(s, Q8Layout::Q8_0, &[1.0; 33])?;
        check_quantize_q8(s, Q8Layout::Q8_K, &[1.0; 288])
    });
    report.prop(
        &format!("{p}: gemv_q8, random shapes"),
        (
            prop::sample::select(q8_dtypes.to_vec()),
            0usize..8,
            0..ROWS.len(),
            any::<u64>(),
        ),
        |(dt, blocks, r, seed)| {
            let mut v = Values(seed);
            let cols = [0, 1, 2, 3, 5, 18, 48, 19][blocks] * dt.block_len();
            let cols = if dt.block_len() == QK_K {
                cols / 4
            } else {
                cols
            };
            let cols = cols / dt.block_len() * dt.block_len();
            let m = Matrix::new(dt, ROWS[r], cols, (seed % 2) as usize, &mut v);
            check_gemv_q8(s, &m, &v.vec(cols))
        },
    );
    for dt in q8_dtypes {
        report.fixed(&format!("{p}: gemv_q8 {dt}, model shapes"), || {
            let mut v = Values(200 + u64::from(dt.ggml_type()));
            // SmolLM2's projections for the legacy formats, Gemma 3's for the K formats.
            let shapes: &[(usize, usize)] = if dt.block_len() == QK {
                &[(576, 576), (1536, 576), (576, 1536), (1024, 640)]
            } else {
                &[(640, 1024), (640, 2048), (64, 1536)]
            };
            for &(rows, cols) in shapes {
                let m = Matrix::new(dt, rows, cols, 0, &mut v);
                check_gemv_q8(s, &m, &v.vec(cols))?;
            }
            Ok(())
        });
        if dt.block_len() == QK {
            report.fixed(&format!("{p}: gemv_q8 {dt}, every f16 scale"), || {
                check_gemv_q8_every_scale(s, dt)
            });
        }
        report.fixed(&format!("{p}: gemv_q8 {dt}, special activations"), || {
            let mut v = Values(300);
            let layout = Q8Layout::of(dt).expect("8-bit path");
            let x = match layout {
                Q8Layout::Q8_0 => special_activations(&mut v),
                Q8Layout::Q8_K => special_activations_k(&mut v),
            };
            let m = Matrix::new(dt, 7, x.len(), 0, &mut v);
            let xq = Q8Acts::from_f32(layout, &x).expect("whole blocks");
            let mut y = vec![0.0f32; 7];
            s.gemv_q8(&m.weights(), &xq, &mut y).expect("shapes");
            prop_assert!(
                y.iter().all(|v| v.is_nan()),
                "a NaN block makes every row NaN: {:?}",
                y
            );
            // Without the non-finite blocks, against the reference.
            let bl = layout.block_len();
            let finite: Vec<f32> = x[..bl].iter().chain(&x[3 * bl..]).copied().collect();
            let m = Matrix::new(dt, 7, finite.len(), 0, &mut v);
            check_gemv_q8(s, &m, &finite)
        });
    }
    report.fixed(&format!("{p}: gemv_q8 shape errors"), || {
        let mut v = Values(13);
        let x = v.vec(QK_K);
        let x0 = Q8Acts::from_f32(Q8Layout::Q8_0, &x).expect("whole blocks");
        let xk = Q8Acts::from_f32(Q8Layout::Q8_K, &x).expect("whole blocks");
        let empty = Q8Acts::new();
        for dt in DType::ALL {
            let m = Matrix::new(dt, 2, QK_K, 0, &mut v);
            let w = m.weights();
            for (x, ylen) in [(&x0, 2), (&x0, 3), (&xk, 2), (&xk, 3), (&empty, 2)] {
                let (mut a, mut b) = (vec![0.0; ylen], vec![0.0; ylen]);
                let got = s.gemv_q8(&w, x, &mut a);
                let want = q8::gemv_reference(&w, x, &mut b);
                prop_assert_eq!(&got, &want, "gemv_q8 {} errors", dt);
                let valid = Q8Layout::of(dt) == Some(x.layout()) && ylen == 2 && x.len() == QK_K;
                prop_assert_eq!(
                    got.is_ok(),
                    valid,
                    "gemv_q8 {} accepts only valid shapes",
                    dt
                );
            }
        }
        Ok(())
    });
}

/// Whether this CPU (this build, on wasm32) runs `path`, from its features as the
/// standard library detects them.
fn cpu_runs(path: SimdPath) -> bool {
    #[cfg(target_arch = "x86_64")]
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    match path {
        #[cfg(target_arch = "x86_64")]
        SimdPath::Avx512 => avx2 && is_x86_feature_detected!("avx512f"),
        #[cfg(target_arch = "x86_64")]
        SimdPath::Avx2Fma => avx2,
        #[cfg(target_arch = "aarch64")]
        SimdPath::Neon => std::arch::is_aarch64_feature_detected!("neon"),
        SimdPath::Simd128 => cfg!(all(target_arch = "wasm32", target_feature = "simd128")),
        SimdPath::Scalar => true,
        _ => false,
    }
}

fn main() -> ExitCode {
    let mut report = Report::default();
    let simd_paths: &[SimdPath] = if cfg!(target_arch = "aarch64") {
        &[SimdPath::Neon]
    } else if cfg!(target_arch = "wasm32") {
        &[SimdPath::Simd128]
    } else {
        &[SimdPath::Avx512, SimdPath::Avx2Fma]
    };
    println!(
        "arch {}, best path {:?}",
        std::env::consts::ARCH,
        Simd::best().path()
    );
    report.fixed("construction: best, with_path, the CPU's features", || {
        for p in SimdPath::ALL {
            let runs = cpu_runs(p);
            prop_assert_eq!(
                Simd::with_path(p).map(|s| s.path()),
                runs.then_some(p),
                "with_path({})",
                p.name()
            );
            prop_assert_eq!(p.runs_here(), runs, "{} runs here", p.name());
            prop_assert_eq!(SimdPath::from_name(p.name()), Some(p));
        }
        let best = SimdPath::ALL.into_iter().find(|&p| cpu_runs(p));
        prop_assert_eq!(Some(Simd::best().path()), best);
        prop_assert_eq!(Simd::new().path(), Simd::best().path());
        Ok(())
    });
    for &path in simd_paths.iter().chain([&SimdPath::Scalar]) {
        let Some(s) = Simd::with_path(path) else {
            println!("skip   {}: this CPU does not run it", path.name());
            continue;
        };
        println!("--- path {:?}", s.path());
        check_path(&mut report, &s);
    }
    println!("simd: {} passed, {} failed", report.passed, report.failed);
    if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
