//! The `gemma3` architecture on tiny random files (`TinyLlama::to_gemma3_gguf`): the
//! config the loader derives (layer pattern, RoPE bases, windows, the optional steps), and
//! the sliding window's exact size, observed through the logits on every backend.
//!
//! The real model's numbers are `tests/golden_gemma3.rs`'s; these tests run in
//! milliseconds and pin the rules a golden test can only detect as a distance.

use crate::common;

use crate::common::{PerBackend, with_backend};
use kvcore::backend::{DType, RopeStyle};
use kvcore::gguf::GgufFile;
use kvcore::model::{Arch, FfnActivation, Llama, Logits};
use kvcore::{Backend, DenseKv};
use kvcore_scalar::Scalar;
use kvcore_test_support::tiny::TinyLlama;

fn tiny() -> TinyLlama {
    TinyLlama {
        n_layers: 7,
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 16,
        ffn_dim: 64,
        vocab_size: 96,
        context_len: 64,
        dtype: DType::Q8_0,
        seed: 5,
        untied_output: false,
    }
}

fn load<B: Backend>(window: usize, backend: B) -> Llama<B> {
    let file = GgufFile::from_bytes(tiny().to_gemma3_gguf(window)).unwrap();
    Llama::load(file, backend).unwrap()
}

#[test]
fn the_config_is_gemma3s() {
    let m = load(5, Scalar);
    let c = m.config();
    assert_eq!(c.arch, Arch::Gemma3);
    assert_eq!(c.q_dim(), 64);
    assert_eq!(c.kv_dim(), 16);
    assert!(c.qk_norm && c.post_norms);
    assert_eq!(c.ffn_activation, FfnActivation::GeluTanh);
    assert_eq!(c.rope_style, RopeStyle::Halves);
    assert_eq!(c.embed_scale, (64f32).sqrt());
    assert_eq!(c.attn_scale, 0.25);
    let windows: Vec<_> = c.layers.iter().map(|l| l.window).collect();
    let w = Some(5);
    assert_eq!(windows, [w, w, w, w, w, None, w]);
    let bases: Vec<_> = c.layers.iter().map(|l| l.rope_base).collect();
    assert_eq!(bases, [1e4, 1e4, 1e4, 1e4, 1e4, 1e6, 1e4]);
    assert_eq!(c.windows(), windows);

    // The same shapes as a llama file: none of it.
    let llama = Llama::load(GgufFile::from_bytes(tiny().to_gguf()).unwrap(), Scalar).unwrap();
    let c = llama.config();
    assert_eq!(c.arch, Arch::Llama);
    assert!(!c.qk_norm && !c.post_norms && c.embed_scale == 1.0);
    assert!(
        c.layers
            .iter()
            .all(|l| l.window.is_none() && l.rope_base == 1e4)
    );
}

/// With window `w`, a query at position `p < w` sees exactly what a causal query sees, so
/// the logits there are bitwise those of a file whose window is larger; at `p = w` the
/// first position drops out of the window layers and the logits move. Checked for `w`
/// against `w + 1`, so a window one too large or too small fails.
struct WindowIsExact;

impl PerBackend for WindowIsExact {
    fn run<B: Backend>(&self, backend: B) {
        let ids: Vec<u32> = (0..12).map(|i| (i * 37 % 96) as u32).collect();
        for w in [1usize, 3, 6] {
            let logits = |window: usize| {
                let m = load(window, &backend);
                let mut kv = DenseKv::new(m.kv_geometry(), 64).unwrap();
                m.forward(&mut kv, &ids, Logits::All).unwrap()
            };
            let (a, b) = (logits(w), logits(w + 1));
            for p in 0..ids.len() {
                let same = a
                    .row(p)
                    .iter()
                    .zip(b.row(p))
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert_eq!(same, p < w, "window {w}, position {p} ({})", backend.name());
            }
        }
    }
}

#[test]
fn the_window_is_exact_on_every_backend() {
    for name in common::BACKENDS {
        with_backend(name, &WindowIsExact);
    }
}
