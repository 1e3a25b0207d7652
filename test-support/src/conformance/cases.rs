//! One input set per kernel, built from a seed, that any backend can run and the f64
//! oracle can answer. The suites differ only in what they compare: the conformance
//! suite (a backend against the scalar reference within the oracle's bound), and in
//! kvcore's own tests `scalar_reference.rs` (scalar against the oracle) and
//! `rayon_bitwise.rs` (rayon against its inner backend, bit for bit).

use half::{bf16, f16};
use kvcore::backend::format::Q4_0;
use kvcore::backend::{
    AttnJob, AttnParams, Backend, BlockFormat, DType, Mask, Q8Acts, Q8Layout, Rope, RopeStyle,
};
use kvcore::kv::codec::{encode_q4_0, encode_q8_0, hadamard, rotation_len};
use kvcore::kv::{
    BlockQ4_0, BlockQ8_0, KeyOffsets, KvCodec, KvGeometry, KvRows, KvSegment, KvType, KvView,
    Q8_0_BLOCK,
};
use kvcore::ndarray::Array3;
use std::sync::Arc;

use super::inputs::{Matrix, Rng};
use super::oracle::{self, Bounded};

/// A kernel call with fixed inputs.
pub trait Case {
    /// A label for failure messages (kernel and shape).
    fn label(&self) -> String;
    /// The outputs of `b` on these inputs (shape errors panic: cases are well formed).
    fn run<B: Backend>(&self, b: &B) -> Vec<f32>;
    /// The exact outputs and error bounds.
    fn oracle(&self) -> Vec<Bounded>;
}

/// `y ← W x`.
pub struct Gemv {
    /// `W`, `[rows, cols]`.
    pub m: Matrix,
    /// `x`, `[cols]`.
    pub x: Vec<f32>,
}

impl Gemv {
    /// A random `W: [rows, cols]` in `dtype` and `x: [cols]`.
    pub fn new(dtype: DType, rows: usize, cols: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let m = Matrix::random(dtype, rows, cols, &mut rng);
        let x = rng.values(cols);
        Gemv { m, x }
    }
}

impl Case for Gemv {
    fn label(&self) -> String {
        format!("gemv {} [{}, {}]", self.m.dtype, self.m.rows, self.m.cols)
    }
    fn run<B: Backend>(&self, b: &B) -> Vec<f32> {
        let mut y = vec![f32::NAN; self.m.rows];
        b.gemv(&self.m.weights(), &self.x, &mut y)
            .expect("gemv shapes");
        y
    }
    fn oracle(&self) -> Vec<Bounded> {
        oracle::gemv(&self.m, &self.x)
    }
}

/// `y ← W x̂` with 8-bit activations: the backend quantises `x` (`quantize_q8`, in the
/// layout `W`'s format meets) and runs `gemv_q8`. `W` is a block format.
pub struct GemvQ8 {
    /// `W`, `[rows, cols]`.
    pub m: Matrix,
    /// `x` before quantisation, `[cols]`.
    pub x: Vec<f32>,
}

impl GemvQ8 {
    /// The inputs of [`Gemv::new`] with the same arguments.
    pub fn new(dtype: DType, rows: usize, cols: usize, seed: u64) -> Self {
        let g = Gemv::new(dtype, rows, cols, seed);
        GemvQ8 { m: g.m, x: g.x }
    }
}

impl Case for GemvQ8 {
    fn label(&self) -> String {
        format!(
            "gemv_q8 {} [{}, {}]",
            self.m.dtype, self.m.rows, self.m.cols
        )
    }
    fn run<B: Backend>(&self, b: &B) -> Vec<f32> {
        let layout = Q8Layout::of(self.m.dtype).expect("a format with an 8-bit path");
        let mut xq = Q8Acts::new();
        b.quantize_q8(layout, &self.x, &mut xq)
            .expect("whole blocks");
        let mut y = vec![f32::NAN; self.m.rows];
        b.gemv_q8(&self.m.weights(), &xq, &mut y)
            .expect("gemv_q8 shapes");
        y
    }
    fn oracle(&self) -> Vec<Bounded> {
        oracle::gemv_q8(&self.m, &self.x)
    }
}

/// `Y ← X Wᵀ`.
pub struct Gemm {
    /// `W`, `[rows, cols]`.
    pub m: Matrix,
    /// Tokens: rows of `X`.
    pub n: usize,
    /// `X`, `[n, cols]`.
    pub x: Vec<f32>,
}

impl Gemm {
    /// A random `W: [rows, cols]` in `dtype` and `X: [n, cols]`; `cols` must be
    /// positive.
    pub fn new(dtype: DType, rows: usize, cols: usize, n: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let m = Matrix::random(dtype, rows, cols, &mut rng);
        let x = rng.values(n * cols);
        Gemm { m, n, x }
    }

    /// Row `t` of `Y` computed by `b.gemv` on row `t` of `X`.
    pub fn run_as_gemv<B: Backend>(&self, b: &B) -> Vec<f32> {
        let mut y = vec![f32::NAN; self.n * self.m.rows];
        for (xt, yt) in self
            .x
            .chunks_exact(self.m.cols)
            .zip(y.chunks_exact_mut(self.m.rows.max(1)))
        {
            b.gemv(&self.m.weights(), xt, yt).expect("gemv shapes");
        }
        y
    }
}

impl Case for Gemm {
    fn label(&self) -> String {
        let (t, r, c) = (self.m.dtype, self.m.rows, self.m.cols);
        format!("gemm {t} [{r}, {c}] x [{}, {c}]", self.n)
    }
    fn run<B: Backend>(&self, b: &B) -> Vec<f32> {
        let mut y = vec![f32::NAN; self.n * self.m.rows];
        b.gemm(&self.m.weights(), &self.x, &mut y)
            .expect("gemm shapes");
        y
    }
    fn oracle(&self) -> Vec<Bounded> {
        oracle::gemm(&self.m, &self.x)
    }
}

/// `out ← W[row]`.
pub struct Embed {
    /// The embedding table, `[rows, cols]`.
    pub m: Matrix,
    /// The row looked up.
    pub row: usize,
}

impl Embed {
    /// A random table `[rows, cols]` in `dtype` and a random row; `rows` must be
    /// positive.
    pub fn new(dtype: DType, rows: usize, cols: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let m = Matrix::random(dtype, rows, cols, &mut rng);
        let row = rng.below(rows);
        Embed { m, row }
    }
}

impl Case for Embed {
    fn label(&self) -> String {
        let (t, r, c) = (self.m.dtype, self.m.rows, self.m.cols);
        format!("embed_row {t} [{r}, {c}] row {}", self.row)
    }
    fn run<B: Backend>(&self, b: &B) -> Vec<f32> {
        let mut out = vec![f32::NAN; self.m.cols];
        b.embed_row(&self.m.weights(), self.row, &mut out)
            .expect("embed shapes");
        out
    }
    /// Decoding is exact: bound 0.
    fn oracle(&self) -> Vec<Bounded> {
        self.m
            .row(self.row)
            .iter()
            .map(|d| Bounded {
                value: d.value,
                bound: 0.0,
            })
            .collect()
    }
}

/// RoPE in place on `[positions.len(), n_heads, head_dim]`.
pub struct RopeCase {
    /// `[positions.len(), n_heads, head_dim]`.
    pub x: Vec<f32>,
    /// Elements per head (even).
    pub head_dim: usize,
    /// The position of each row of `x`.
    pub positions: Vec<usize>,
    /// Frequency base and pairing.
    pub rope: Rope,
}

impl RopeCase {
    /// Random `x` in `[-2, 2)` of `positions.len()` rows of `n_heads` heads.
    pub fn new(
        head_dim: usize,
        n_heads: usize,
        positions: Vec<usize>,
        base: f32,
        style: RopeStyle,
        seed: u64,
    ) -> Self {
        let x = Rng::new(seed).uniform(positions.len() * n_heads * head_dim, 2.0);
        RopeCase {
            x,
            head_dim,
            positions,
            rope: Rope { base, style },
        }
    }
}

impl Case for RopeCase {
    fn label(&self) -> String {
        format!(
            "rope {:?} base {} head_dim {} x {} positions {:?}",
            self.rope.style,
            self.rope.base,
            self.head_dim,
            self.x.len(),
            self.positions
        )
    }
    fn run<B: Backend>(&self, b: &B) -> Vec<f32> {
        let mut x = self.x.clone();
        b.rope(&mut x, self.head_dim, &self.positions, &self.rope)
            .expect("rope shapes");
        x
    }
    fn oracle(&self) -> Vec<Bounded> {
        oracle::rope(&self.x, self.head_dim, &self.positions, &self.rope)
    }
}

/// The geometry of an attention case: `n_new` query rows at positions `pos0 ..`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    /// Query heads; a multiple of `n_kv_heads`.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Position of the first query row.
    pub pos0: usize,
}

/// Grouped-query attention of a layer: `q: [n, n_heads, head_dim]` at positions
/// `pos0 ..`, against cached rows at positions `0 .. n_keys` held in one or more segments,
/// under a mask and a scale.
pub struct Attention {
    /// Heads, head size and the first query position.
    pub shape: AttnShape,
    /// `[n_new, n_heads, head_dim]`
    pub q: Vec<f32>,
    /// `[n_keys, n_kv_heads, head_dim]`
    pub keys: Vec<f32>,
    /// `[n_keys, n_kv_heads, head_dim]`
    pub values: Vec<f32>,
    /// Cached rows, at positions `0 .. n_keys`.
    pub n_keys: usize,
    /// Where the rows are cut into segments (ascending slot indices in `1..n_keys`).
    pub cuts: Vec<usize>,
    /// The element types the keys and values are stored in (f32 unless
    /// [`with_kv_types`](Attention::with_kv_types)).
    pub kv_types: (KvType, KvType),
    /// Mask and scale.
    pub params: AttnParams,
    /// The key codec whose key offsets the `q8_0` keys are stored less of (layer 0 of
    /// one layer's offsets), if any ([`with_key_offsets`](Attention::with_key_offsets)).
    pub key_codec: Option<KvCodec>,
}

impl Attention {
    /// `n_keys = pos0 + n_new + extra` cached rows (the rows past the queries are
    /// masked), one segment, causal, scale `1/√head_dim`.
    pub fn new(shape: AttnShape, n_new: usize, extra: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let kv_dim = shape.n_kv_heads * shape.head_dim;
        let n_keys = shape.pos0 + n_new + extra;
        Attention {
            shape,
            q: rng.uniform(n_new * shape.n_heads * shape.head_dim, 2.0),
            keys: rng.uniform(n_keys * kv_dim, 2.0),
            values: rng.values(n_keys * kv_dim),
            n_keys,
            cuts: Vec::new(),
            kv_types: (KvType::F32, KvType::F32),
            params: AttnParams::causal(shape.head_dim),
            key_codec: None,
        }
    }

    /// The same case with `q8_0` keys stored less key offsets (`kvcore::kv::KeyOffsets`)
    /// of random pre-RoPE means of magnitude up to 3 (the keys' own are up to 2, so a
    /// key offset applied wrongly moves scores by as much as the keys do), RoPE base
    /// 10 000 in halves. A case whose keys are not `q8_0` is left as it is.
    pub fn with_key_offsets(mut self, seed: u64) -> Self {
        if self.kv_types.0 != KvType::Q8_0 {
            return self;
        }
        let s = self.shape;
        let geometry = KvGeometry {
            n_layers: 1,
            n_kv_heads: s.n_kv_heads,
            head_dim: s.head_dim,
        };
        let means = Rng::new(seed).uniform(s.n_kv_heads * s.head_dim, 3.0);
        let rope = Rope {
            base: 10_000.0,
            style: RopeStyle::Halves,
        };
        let offsets = KeyOffsets::new(geometry, means, vec![rope], self.n_keys.max(1))
            .expect("valid key offsets");
        let codec = KvCodec::with_key_offsets(KvType::Q8_0, Arc::new(offsets));
        self.key_codec = Some(codec.expect("q8_0 keys calibrate"));
        self
    }

    /// One query row per KV head (group 1) at the last of `n_keys` positions, with a
    /// random scale: each head against every cached row (the kernel of one decode step).
    pub fn heads(head_dim: usize, n_kv_heads: usize, n_keys: usize, seed: u64) -> Self {
        let shape = AttnShape {
            n_heads: n_kv_heads,
            n_kv_heads,
            head_dim,
            pos0: n_keys.saturating_sub(1),
        };
        let mut case = Attention::new(shape, 1, 0, seed);
        case.n_keys = n_keys;
        case.keys.truncate(n_keys * n_kv_heads * head_dim);
        case.values.truncate(n_keys * n_kv_heads * head_dim);
        case.params.scale = Rng::new(!seed).range(0.1, 1.5);
        case
    }

    /// The same rows cut into segments at `cuts` (slot indices, clamped and deduplicated).
    pub fn with_cuts(mut self, cuts: &[usize]) -> Self {
        let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(self.n_keys)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        self.cuts = cuts;
        self
    }

    /// The same case with keys stored as `types.0` and values as `types.1` (each row
    /// encoded on its own, as a store does; the oracle sees the decoded values).
    /// `head_dim` must be a whole number of the types' blocks.
    pub fn with_kv_types(mut self, types: (KvType, KvType)) -> Self {
        self.kv_types = types;
        self
    }

    /// The same case under `mask`.
    pub fn with_mask(mut self, mask: Mask) -> Self {
        self.params.mask = mask;
        self
    }

    /// The same case under a sliding window of `window` positions, or causal for `None`.
    pub fn with_window(self, window: Option<usize>) -> Self {
        match window {
            Some(window) => self.with_mask(Mask::SlidingWindow { window }),
            None => self,
        }
    }

    fn n_new(&self) -> usize {
        self.q.len() / (self.shape.n_heads * self.shape.head_dim)
    }

    fn q_pos(&self) -> Vec<usize> {
        (self.shape.pos0..self.shape.pos0 + self.n_new()).collect()
    }

    /// The rows as a view of segments cut at `cuts`.
    pub fn view<'a>(&'a self, keys: &'a Encoded, values: &'a Encoded) -> KvView<'a> {
        let mut bounds = vec![0];
        bounds.extend(self.cuts.iter().copied());
        bounds.push(self.n_keys);
        let segments = bounds
            .windows(2)
            .map(|w| {
                let slots = w[0]..w[1];
                KvSegment::new(
                    w[0],
                    keys.rows().slots(slots.clone()),
                    values.rows().slots(slots),
                )
                .expect("same shapes")
            })
            .collect();
        let view =
            KvView::new(self.shape.n_kv_heads, self.shape.head_dim, segments).expect("ascending");
        match &self.key_codec {
            Some(c) => view.with_key_codec(c, 0).expect("offsets fit the view"),
            None => view,
        }
    }

    /// [`Case::run`]'s output computed one query row per `attention` call: what a
    /// backend must give bit for bit whatever the number of rows a call holds (`Simd`
    /// stages a part's rows as f32 for a call of several tiles, reads them in place for
    /// one row).
    pub fn run_by_rows<B: Backend>(&self, b: &B) -> Vec<f32> {
        let s = self.shape;
        let (keys, values) = self.arrays();
        let view = self.view(&keys, &values);
        let q_pos = self.q_pos();
        let row = s.n_heads * s.head_dim;
        let mut all = Vec::with_capacity(self.q.len());
        for (i, q) in self.q.chunks_exact(row.max(1)).enumerate() {
            let q = Array3::from_shape_vec((1, s.n_heads, s.head_dim), q.to_vec()).expect("q row");
            let mut out = Array3::from_elem((1, s.n_heads, s.head_dim), f32::NAN);
            b.attention(q.view(), &q_pos[i..=i], &view, &self.params, out.view_mut())
                .expect("attention shapes");
            all.extend(out.iter());
        }
        all
    }

    /// The keys and values as stored, `[n_keys, n_kv_heads, head_dim]` in their types.
    pub fn arrays(&self) -> (Encoded, Encoded) {
        let dims = (self.n_keys, self.shape.n_kv_heads, self.shape.head_dim);
        let keys = match self.key_codec.as_ref().and_then(KvCodec::key_offsets) {
            Some(o) => Encoded::less_offsets(&self.keys, dims, o),
            None => Encoded::new(self.kv_types.0, &self.keys, dims),
        };
        (keys, Encoded::new(self.kv_types.1, &self.values, dims))
    }

    /// The keys the oracle scores: the stored values decoded, plus the key offsets
    /// they were stored less of.
    fn oracle_keys(&self, keys: &Encoded) -> Vec<f32> {
        let Some(o) = self.key_codec.as_ref().and_then(KvCodec::key_offsets) else {
            return keys.decoded();
        };
        let Encoded::Q8_0(a) = keys else {
            unreachable!("key offsets only with q8_0 keys")
        };
        let d = self.shape.head_dim;
        let mut out = Vec::with_capacity(self.keys.len());
        for (t, row) in a.outer_iter().enumerate() {
            for (h, head) in row.outer_iter().enumerate() {
                let mut y: Vec<f32> = head
                    .iter()
                    .flat_map(|b| {
                        let mut v = [0f32; Q8_0_BLOCK];
                        b.decode(&mut v);
                        v
                    })
                    .collect();
                let t_b = o.rotated(0, t, h).expect("the offsets cover the keys");
                y.iter_mut().zip(t_b).for_each(|(y, &t)| *y += t);
                debug_assert_eq!(y.len(), d);
                out.extend(unrotate_f64(&y));
            }
        }
        out
    }
}

/// `H y / n` of one rotated head `y` (`n` = `kvcore::kv::codec::rotation_len`), in f64 and
/// rounded once: the values a rotated `q8_0` head stands for (`kvcore::kv::codec::hadamard`),
/// computed independently of the kernels' f32 butterflies.
fn unrotate_f64(y: &[f32]) -> Vec<f32> {
    let n = rotation_len(y.len());
    y.chunks_exact(n)
        .flat_map(|run| {
            (0..n).map(move |i| {
                let sum: f64 = (0..n)
                    .map(|j| {
                        // Sylvester's H: entry (i, j) is (−1)^popcount(i & j).
                        let sign = if (i & j).count_ones() % 2 == 0 {
                            1.0
                        } else {
                            -1.0
                        };
                        sign * f64::from(run[j])
                    })
                    .sum();
                (sum / n as f64) as f32
            })
        })
        .collect()
}

/// Rows `[n, h, d]` in one KV element type, each encoded on its own (`half`'s
/// conversions, `kvcore::kv::codec::encode_q8_0`).
pub enum Encoded {
    /// f32 rows.
    F32(Array3<f32>),
    /// f16 rows.
    F16(Array3<f16>),
    /// bf16 rows.
    BF16(Array3<bf16>),
    /// q8_0 blocks, `[n, h, d / 32]`.
    Q8_0(Array3<BlockQ8_0>),
    /// q4_0 blocks, `[n, h, d / 32]`.
    Q4_0(Array3<BlockQ4_0>),
}

impl Encoded {
    /// `x: [n · h · d]` encoded in `ty`.
    pub fn new(ty: KvType, x: &[f32], (n, h, d): (usize, usize, usize)) -> Encoded {
        let err = "n · h · d values";
        match ty {
            KvType::F16 => Encoded::F16(
                Array3::from_shape_vec((n, h, d), x.iter().map(|&v| f16::from_f32(v)).collect())
                    .expect(err),
            ),
            KvType::BF16 => Encoded::BF16(
                Array3::from_shape_vec((n, h, d), x.iter().map(|&v| bf16::from_f32(v)).collect())
                    .expect(err),
            ),
            KvType::Q8_0 => Encoded::Q8_0(
                Array3::from_shape_vec((n, h, d / Q8_0_BLOCK), encode_q8_0(x, d)).expect(err),
            ),
            KvType::Q4_0 => Encoded::Q4_0(
                Array3::from_shape_vec((n, h, d / Q8_0_BLOCK), encode_q4_0(x, d)).expect(err),
            ),
            _ => Encoded::F32(Array3::from_shape_vec((n, h, d), x.to_vec()).expect(err)),
        }
    }

    /// `q8_0` keys `x: [n · h · d]` stored less `offsets` (layer 0; row `t` at position
    /// `t`), as `kv/offsets.rs` states it: each head rotated (`H x`), its block's rotated
    /// offset subtracted, then quantised block by block.
    pub fn less_offsets(
        x: &[f32],
        (n, h, d): (usize, usize, usize),
        offsets: &KeyOffsets,
    ) -> Encoded {
        let mut blocks = Vec::with_capacity(n * h * d / Q8_0_BLOCK);
        for (i, head) in x.chunks_exact(d).enumerate() {
            let (t, kvh) = (i / h, i % h);
            let mut y = head.to_vec();
            hadamard(&mut y, rotation_len(d));
            let t_b = offsets
                .rotated(0, t, kvh)
                .expect("the offsets cover the keys");
            y.iter_mut().zip(t_b).for_each(|(y, &o)| *y -= o);
            blocks.extend(y.chunks_exact(Q8_0_BLOCK).map(BlockQ8_0::encode));
        }
        Encoded::Q8_0(
            Array3::from_shape_vec((n, h, d / Q8_0_BLOCK), blocks).expect("n · h · d values"),
        )
    }

    /// The rows as a store hands them out.
    pub fn rows(&self) -> KvRows<'_> {
        match self {
            Encoded::F32(a) => KvRows::F32(a.view()),
            Encoded::F16(a) => KvRows::F16(a.view()),
            Encoded::BF16(a) => KvRows::BF16(a.view()),
            Encoded::Q8_0(a) => KvRows::Q8_0(a.view()),
            Encoded::Q4_0(a) => KvRows::Q4_0(a.view()),
        }
    }

    /// The values the rows hold, decoded (`f32(d) · q` for q8_0), row-major.
    pub fn decoded(&self) -> Vec<f32> {
        match self {
            Encoded::F32(a) => a.iter().copied().collect(),
            Encoded::F16(a) => a.iter().map(|v| v.to_f32()).collect(),
            Encoded::BF16(a) => a.iter().map(|v| v.to_f32()).collect(),
            // The stored values are of rotated heads (`H x`): rotated back, in f64.
            Encoded::Q8_0(a) => rotated_blocks(a, |b, y| b.decode(y)),
            Encoded::Q4_0(a) => rotated_blocks(a, <Q4_0 as BlockFormat>::decode),
        }
    }

    /// For rotated types, `spread_blocks` of the stored values and the rotation length:
    /// what the oracle adds to a back-rotated output's error bound.
    pub fn spread(&self) -> Option<(Vec<f32>, usize)> {
        let (spread, d) = match self {
            Encoded::Q8_0(a) => (spread_blocks(a, |b, y| b.decode(y)), a.dim().2),
            Encoded::Q4_0(a) => (spread_blocks(a, <Q4_0 as BlockFormat>::decode), a.dim().2),
            _ => return None,
        };
        Some((spread, rotation_len(d * Q8_0_BLOCK)))
    }
}

/// Blocks `[n, h, d / 32]` of rotated heads: each stored value replaced by the mean
/// magnitude `(1/n) Σ_i |y_i|` of its rotation group (`n` = `rotation_len`), row-major.
/// A backend sums the rotated values and rotates the sum back (`H o / n`), so its
/// rounding errors spread over every channel of the group in proportion to this, however
/// small a channel's own back-rotated values are.
fn spread_blocks<B>(a: &Array3<B>, decode: impl Fn(&B, &mut [f32])) -> Vec<f32> {
    let y = stored_values(a, decode);
    let n = rotation_len(a.dim().2 * Q8_0_BLOCK);
    y.chunks_exact(n)
        .flat_map(|g| {
            let mean = g.iter().map(|v| f64::from(v.abs())).sum::<f64>() / n as f64;
            std::iter::repeat_n(mean as f32, n)
        })
        .collect()
}

/// Every block of `a` decoded by `decode`, as stored (rotated), row-major.
fn stored_values<B>(a: &Array3<B>, decode: impl Fn(&B, &mut [f32])) -> Vec<f32> {
    a.iter()
        .flat_map(|b| {
            let mut y = [0f32; Q8_0_BLOCK];
            decode(b, &mut y);
            y
        })
        .collect()
}

/// Blocks `[n, h, d / 32]` of rotated heads, each decoded by `decode` and rotated back
/// in f64, row-major.
fn rotated_blocks<B>(a: &Array3<B>, decode: impl Fn(&B, &mut [f32])) -> Vec<f32> {
    stored_values(a, decode)
        .chunks_exact(a.dim().2 * Q8_0_BLOCK)
        .flat_map(unrotate_f64)
        .collect()
}

/// Several sequences' attention in one [`Backend::attention_batch`] call (a batched
/// decode step or prefill): each job an [`Attention`] case of its own queries, positions
/// and rows, all with the first job's [`AttnParams`]. The output is the jobs' outputs
/// one after another, so it can be compared with each job run alone; the oracle is the
/// jobs' oracles one after another (so the jobs must share their params).
pub struct AttentionBatch {
    /// The jobs (each job's own `params` is ignored but the first's).
    pub jobs: Vec<Attention>,
}

impl Case for AttentionBatch {
    fn label(&self) -> String {
        let jobs: Vec<String> = self.jobs.iter().map(|j| j.label()).collect();
        format!("attention_batch of {}: [{}]", jobs.len(), jobs.join("; "))
    }
    fn run<B: Backend>(&self, b: &B) -> Vec<f32> {
        let Some(first) = self.jobs.first() else {
            b.attention_batch(&mut [], &AttnParams::causal(1))
                .expect("an empty batch");
            return Vec::new();
        };
        let params = first.params;
        let qs: Vec<Array3<f32>> = (self.jobs.iter())
            .map(|j| {
                let dims = (j.n_new(), j.shape.n_heads, j.shape.head_dim);
                Array3::from_shape_vec(dims, j.q.clone()).expect("q rows")
            })
            .collect();
        let mut outs: Vec<Array3<f32>> = qs
            .iter()
            .map(|q| Array3::from_elem(q.raw_dim(), f32::NAN))
            .collect();
        let arrays: Vec<(Encoded, Encoded)> = self.jobs.iter().map(|j| j.arrays()).collect();
        let views: Vec<KvView<'_>> = (self.jobs.iter().zip(&arrays))
            .map(|(j, (k, v))| j.view(k, v))
            .collect();
        let positions: Vec<Vec<usize>> = self.jobs.iter().map(|j| j.q_pos()).collect();
        let mut jobs: Vec<AttnJob<'_>> = (qs.iter().zip(&mut outs).zip(&views).zip(&positions))
            .map(|(((q, out), kv), q_pos)| AttnJob {
                q: q.view(),
                q_pos,
                kv,
                out: out.view_mut(),
            })
            .collect();
        b.attention_batch(&mut jobs, &params)
            .expect("attention_batch shapes");
        drop(jobs);
        outs.into_iter()
            .flat_map(|o| o.into_raw_vec_and_offset().0)
            .collect()
    }
    fn oracle(&self) -> Vec<Bounded> {
        self.jobs.iter().flat_map(|j| j.oracle()).collect()
    }
}

impl Case for Attention {
    fn label(&self) -> String {
        format!(
            "attention {:?} n_new {} n_keys {} cuts {:?} {:?} kv {:?} key offsets {}",
            self.shape,
            self.n_new(),
            self.n_keys,
            self.cuts,
            self.params,
            self.kv_types,
            self.key_codec.is_some()
        )
    }
    fn run<B: Backend>(&self, b: &B) -> Vec<f32> {
        let s = self.shape;
        let dims = (self.n_new(), s.n_heads, s.head_dim);
        let q = Array3::from_shape_vec(dims, self.q.clone()).expect("q rows");
        let mut out = Array3::from_elem(dims, f32::NAN);
        let (keys, values) = self.arrays();
        b.attention(
            q.view(),
            &self.q_pos(),
            &self.view(&keys, &values),
            &self.params,
            out.view_mut(),
        )
        .expect("attention shapes");
        out.into_raw_vec_and_offset().0
    }
    fn oracle(&self) -> Vec<Bounded> {
        let s = self.shape;
        let kv_dim = s.n_kv_heads * s.head_dim;
        let group = s.n_heads / s.n_kv_heads;
        let q_pos = self.q_pos();
        let (keys, values) = self.arrays();
        let spread = values.spread();
        let (keys, values) = (self.oracle_keys(&keys), values.decoded());
        self.q
            .chunks_exact(s.head_dim)
            .enumerate()
            .flat_map(|(pair, qh)| {
                let (i, h) = (pair / s.n_heads, pair % s.n_heads);
                let seen: Vec<usize> = (0..self.n_keys)
                    .filter(|&k| self.params.mask.sees(q_pos[i], k))
                    .collect();
                let head = |m: &[f32]| -> Vec<f32> {
                    seen.iter()
                        .flat_map(|&t| &m[t * kv_dim..(t + 1) * kv_dim])
                        .copied()
                        .collect()
                };
                let spread = spread.as_ref().map(|(sp, n)| (head(sp), *n));
                oracle::attend_head(
                    qh,
                    &head(&keys),
                    &head(&values),
                    spread.as_ref().map(|(sp, n)| (sp.as_slice(), *n)),
                    seen.len(),
                    kv_dim,
                    h / group,
                    self.params.scale,
                )
            })
            .collect()
    }
}

/// RMSNorm of `[n, d]`.
pub struct RmsNorm {
    /// `[n, d]`.
    pub x: Vec<f32>,
    /// `[d]`.
    pub weight: Vec<f32>,
    /// Added to the mean square.
    pub eps: f32,
}

impl RmsNorm {
    /// Random `x: [n, d]` and weights in `[-2, 2)`.
    pub fn new(n: usize, d: usize, eps: f32, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        RmsNorm {
            x: rng.values(n * d),
            weight: rng.uniform(d, 2.0),
            eps,
        }
    }
}

impl Case for RmsNorm {
    fn label(&self) -> String {
        format!(
            "rms_norm [{}, {}] eps {}",
            self.x.len() / self.weight.len(),
            self.weight.len(),
            self.eps
        )
    }
    fn run<B: Backend>(&self, b: &B) -> Vec<f32> {
        let mut out = vec![f32::NAN; self.x.len()];
        b.rms_norm(&self.x, &self.weight, self.eps, &mut out)
            .expect("rms_norm shapes");
        out
    }
    fn oracle(&self) -> Vec<Bounded> {
        oracle::rms_norm(&self.x, &self.weight, self.eps)
    }
}

/// SwiGLU; gates up to `±gate_scale` (beyond ±88 `e^(−g)` overflows f32).
pub struct Swiglu {
    /// `[len]`, in `[-gate_scale, gate_scale)`.
    pub gate: Vec<f32>,
    /// `[len]`.
    pub up: Vec<f32>,
}

impl Swiglu {
    /// Random gates up to `±gate_scale` and up values of `len` elements.
    pub fn new(len: usize, gate_scale: f32, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        Swiglu {
            gate: rng.uniform(len, gate_scale),
            up: rng.values(len),
        }
    }
}

impl Case for Swiglu {
    fn label(&self) -> String {
        format!("swiglu len {}", self.gate.len())
    }
    fn run<B: Backend>(&self, b: &B) -> Vec<f32> {
        let mut out = vec![f32::NAN; self.gate.len()];
        b.swiglu(&self.gate, &self.up, &mut out)
            .expect("swiglu shapes");
        out
    }
    fn oracle(&self) -> Vec<Bounded> {
        oracle::swiglu(&self.gate, &self.up)
    }
}

/// GeGLU (tanh GELU); gates up to `±gate_scale`.
pub struct Geglu {
    /// `[len]`, in `[-gate_scale, gate_scale)`.
    pub gate: Vec<f32>,
    /// `[len]`.
    pub up: Vec<f32>,
}

impl Geglu {
    /// Random gates up to `±gate_scale` and up values of `len` elements.
    pub fn new(len: usize, gate_scale: f32, seed: u64) -> Self {
        let Swiglu { gate, up } = Swiglu::new(len, gate_scale, seed);
        Geglu { gate, up }
    }
}

impl Case for Geglu {
    fn label(&self) -> String {
        format!("geglu len {}", self.gate.len())
    }
    fn run<B: Backend>(&self, b: &B) -> Vec<f32> {
        let mut out = vec![f32::NAN; self.gate.len()];
        b.geglu(&self.gate, &self.up, &mut out)
            .expect("geglu shapes");
        out
    }
    fn oracle(&self) -> Vec<Bounded> {
        oracle::geglu(&self.gate, &self.up)
    }
}

/// Residual add.
pub struct Add {
    /// The accumulator, `[len]`.
    pub acc: Vec<f32>,
    /// Added to it, `[len]`.
    pub x: Vec<f32>,
}

impl Add {
    /// Random `acc` and `x` of `len` elements.
    pub fn new(len: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        Add {
            acc: rng.values(len),
            x: rng.values(len),
        }
    }
}

impl Case for Add {
    fn label(&self) -> String {
        format!("add len {}", self.acc.len())
    }
    fn run<B: Backend>(&self, b: &B) -> Vec<f32> {
        let mut acc = self.acc.clone();
        b.add(&mut acc, &self.x).expect("add shapes");
        acc
    }
    fn oracle(&self) -> Vec<Bounded> {
        oracle::add(&self.acc, &self.x)
    }
}

/// Softmax of one row; `masked` of the entries are `−∞` (all of them when
/// `masked ≥ len`).
pub struct Softmax {
    /// The row, `[len]`.
    pub x: Vec<f32>,
}

impl Softmax {
    /// A random row in `[-scale, scale)` with `masked` random entries (with repeats)
    /// set to `−∞`, or all of them when `masked ≥ len`.
    pub fn new(len: usize, scale: f32, masked: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let mut x = rng.uniform(len, scale);
        for _ in 0..masked.min(len) {
            let i = rng.below(len);
            x[i] = f32::NEG_INFINITY;
        }
        if masked >= len {
            x.fill(f32::NEG_INFINITY);
        }
        Softmax { x }
    }
}

impl Case for Softmax {
    fn label(&self) -> String {
        let masked = self.x.iter().filter(|v| v.is_infinite()).count();
        format!("softmax len {} masked {masked}", self.x.len())
    }
    fn run<B: Backend>(&self, b: &B) -> Vec<f32> {
        let mut x = self.x.clone();
        b.softmax(&mut x);
        x
    }
    fn oracle(&self) -> Vec<Bounded> {
        oracle::softmax(&self.x)
    }
}
