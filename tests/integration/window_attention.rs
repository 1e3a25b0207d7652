//! Sliding-window attention over a `WindowKv` view equals, bit for bit (`f32::to_bits`),
//! the same attention over a `DenseKv` view holding the same rows, on the scalar, SIMD and
//! rayon backends: the window store hands attention only its retained positions (one or
//! two ring segments, then the pending rows), the dense store every position, and
//! `Mask::SlidingWindow` must make the difference invisible.
//!
//! Random sequences of appends (decode steps, prefills longer than the window, tail
//! replacements of the last position, refused rewinds behind the window) drive both
//! stores with the same random rows; during every append, before its commit, the
//! append's own queries attend to the window layer (`Mask::SlidingWindow`) and to the
//! global layer (`Mask::Causal`) of both stores, so the early queries of a long prefill
//! and the decode steps after eviction are both compared.

use kvcore::backend::{AttnParams, Backend, Mask};
use kvcore::kv::{DenseKv, KvError, KvGeometry, KvStore, WindowKv};
use kvcore::ndarray::{Array2, Array3};
use kvcore_rayon::Rayon;
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;
use proptest::prelude::*;

const N_HEADS: usize = 4;
const N_KV_HEADS: usize = 2;
const HEAD_DIM: usize = 8;
const KV_DIM: usize = N_KV_HEADS * HEAD_DIM;
const MAX_CTX: usize = 2048;

/// A small xorshift stream of floats in `[-2, 2)`, so both stores get the same rows.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
    }

    fn array2(&mut self, rows: usize, cols: usize) -> Array2<f32> {
        Array2::from_shape_simple_fn((rows, cols), || self.next())
    }

    fn array3(&mut self, d: (usize, usize, usize)) -> Array3<f32> {
        Array3::from_shape_simple_fn(d, || self.next())
    }
}

/// One step of a sequence.
#[derive(Clone, Debug)]
enum Step {
    /// Append `n` positions at the end.
    Append(usize),
    /// Replace the last `back` positions by `n` new ones (refused behind the window).
    Replace { back: usize, n: usize },
}

/// The attention of `q` (rows at `q_pos`) over layer `layer` of `kv`, as bits.
fn attend<B: Backend>(
    backend: &B,
    kv: &dyn KvStore,
    layer: usize,
    q: &Array3<f32>,
    q_pos: &[usize],
    mask: Mask,
) -> Vec<u32> {
    let params = AttnParams {
        scale: 1.0 / (HEAD_DIM as f32).sqrt(),
        mask,
    };
    let mut out = Array3::zeros(q.dim());
    let view = kv.view(layer).expect("view");
    backend
        .attention(q.view(), q_pos, &view, &params, out.view_mut())
        .expect("attention");
    out.iter().map(|x| x.to_bits()).collect()
}

/// Runs `steps` on a dense and a window store (layer 0 a window of `window`, layer 1
/// global), comparing each append's attention on every backend before its commit.
fn compare(window: usize, steps: &[Step], seed: u64, backends: &[&dyn Backend]) {
    let g = KvGeometry {
        n_layers: 2,
        n_kv_heads: N_KV_HEADS,
        head_dim: HEAD_DIM,
    };
    let mut dense = DenseKv::new(g, MAX_CTX).expect("dense");
    let mut win = WindowKv::new(g, MAX_CTX, &[Some(window), None]).expect("window");
    let mut rng = Rng(seed | 1);
    for step in steps {
        let len = dense.len();
        let (at, n) = match *step {
            Step::Append(n) => (len, n),
            Step::Replace { back, n } => (len.saturating_sub(back), n),
        };
        if at + n > MAX_CTX {
            continue;
        }
        match win.begin(at, n) {
            Err(KvError::BehindWindow { pos, earliest }) => {
                assert_eq!(pos, at);
                assert!(at > 0 && at < len && earliest > at, "{pos} {earliest}");
                assert!(!win.can_rewind_to(at));
                continue;
            }
            other => other.expect("begin on the window store"),
        }
        dense.begin(at, n).expect("begin on the dense store");
        for layer in 0..2 {
            let (k, v) = (rng.array2(n, KV_DIM), rng.array2(n, KV_DIM));
            for kv in [&mut dense as &mut dyn KvStore, &mut win] {
                kv.write(layer, k.view(), v.view()).expect("write");
            }
        }
        let q = rng.array3((n, N_HEADS, HEAD_DIM));
        let q_pos: Vec<usize> = (at..at + n).collect();
        let masks = [Mask::SlidingWindow { window }, Mask::Causal];
        for (layer, mask) in masks.into_iter().enumerate() {
            for b in backends {
                let want = attend(b, &dense, layer, &q, &q_pos, mask);
                let got = attend(b, &win, layer, &q, &q_pos, mask);
                assert!(
                    got == want,
                    "{}: layer {layer} ({mask:?}) of an append of {n} at {at} differs",
                    b.name()
                );
            }
        }
        dense.commit().expect("commit");
        win.commit().expect("commit");
        let retained = win.view(0).expect("view").len();
        assert!(retained <= window.min(win.len()), "{retained} > {window}");
    }
}

fn backends() -> (Scalar, Simd, Rayon<Scalar>) {
    (
        Scalar::new(),
        Simd::new(),
        Rayon::new(Scalar::new(), 2).expect("thread pool"),
    )
}

#[test]
fn a_long_prefill_then_decode_after_eviction_matches_the_dense_store() {
    let (scalar, simd, rayon) = backends();
    let all: [&dyn Backend; 3] = [&scalar, &simd, &rayon];
    // A prefill of 3 windows (its early queries see their own window of the same pass),
    // decode steps that wrap the ring, a replaced last position, a refused rewind behind
    // the window, and a second long prefill.
    let mut steps = vec![Step::Append(3 * 64 + 5)];
    steps.extend((0..80).map(|_| Step::Append(1)));
    steps.extend([
        Step::Replace { back: 1, n: 1 },
        Step::Replace { back: 10, n: 2 },
        Step::Append(150),
        Step::Replace { back: 1, n: 3 },
    ]);
    compare(64, &steps, 0x5eed, &all);
    compare(1, &steps, 0x5eee, &all);
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1usize..=3).prop_map(Step::Append),
        2 => (1usize..=120).prop_map(Step::Append),
        1 => (1usize..=2, 0usize..=4).prop_map(|(back, n)| Step::Replace { back, n }),
        1 => (3usize..=60, 1usize..=4).prop_map(|(back, n)| Step::Replace { back, n }),
    ]
}

proptest! {
    #![proptest_config(crate::common::persisted_proptest_config(
        48,
        0x77696e64,
        "proptest-regressions/window_attention.txt"
    ))]

    #[test]
    fn window_attention_matches_the_dense_store(
        window in prop_oneof![1usize..=8, 9usize..=70],
        steps in prop::collection::vec(step(), 1..=24),
        seed in any::<u64>(),
    ) {
        let (scalar, simd, rayon) = backends();
        compare(window, &steps, seed, &[&scalar, &simd, &rayon]);
    }
}
