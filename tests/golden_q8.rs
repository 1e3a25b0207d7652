//! Golden test of the 8-bit activation path (`Activations::Q8`, llama.cpp's numerics)
//! against the independent float64 reference (`../shared/reference`).
//!
//! Quantising activations adds error that no rounding bound of the f32 path covers: each
//! activation moves by up to `amax/254` of its 32-value block (0.4 % of the block's
//! largest magnitude), in every matmul of 30 layers. The reference README says what that
//! does to llama.cpp's own Q8 path: its greedy continuation departs from the reference
//! after a few tokens on two of the three prompts. So this test does not demand the
//! reference's greedy continuation; it teacher-forces the reference tokens through the
//! one-token decode path (where Q8 applies) and checks, at every position:
//! - every listed (top-20) logit within [`TOL_Q8`] = 3.0 of the reference, and the mean
//!   absolute difference over all of them within [`MEAN_TOL_Q8`] = 0.35;
//! - the same top-1 token wherever the reference's top-1 margin exceeds
//!   [`SAFE_MARGIN`] = 2·TOL_Q8 (a smaller error could not flip it), and the same top-1
//!   on at least 95 % of all positions.
//!
//! Where the numbers come from: llama.cpp itself (llama-cpp-python 0.3.36, AVX2 build,
//! Q8_1 activations, f16 KV cache) on the same tokens fed one at a time lands at worst
//! 1.39, mean 0.209, top-1 agreeing at 99 of 101 positions (`benches/llamacpp_driver.py
//! reference-error MODEL`; fed as one batch: worst 1.80, mean 0.209). kvcore measured: worst 0.97 (AVX2) and 1.93 (the scalar
//! reference kernels: the tiny rounding differences of the other ops flip some
//! activation roundings, and the errors that follow are of the quantisation's size),
//! mean 0.21–0.23, 99 of 101. The bounds leave room of about 1.5× over the worst seen
//! and still fail a wrong scale, a dropped `Q4_1` offset or a swapped nibble half
//! (logits off by 5–50).
//!
//! Prefill (GEMM) stays f32 in this mode, so the prefill path is the f32 golden test's.

mod common;

use common::*;
use kvcore::model::{Activations, Logits};
use kvcore::{Backend, GrowKv};

const TOL_Q8: f32 = 3.0;
const MEAN_TOL_Q8: f64 = 0.35;
const SAFE_MARGIN: f64 = 2.0 * TOL_Q8 as f64;

struct GoldenQ8;

impl PerBackend for GoldenQ8 {
    fn run<B: Backend>(&self, backend: B) {
        let model = load_smollm2(backend).with_activations(Activations::Q8);
        let c = model.config().clone();
        let name_b = model.backend().name();
        let (mut worst, mut sum, mut count) = (0.0f32, 0.0f64, 0usize);
        let (mut agree, mut positions_seen) = (0usize, 0usize);
        for prompt in reference_logits() {
            let name = prompt["name"].as_str().unwrap();
            let all: Vec<u32> = ids(&prompt["prompt_ids"])
                .into_iter()
                .chain(ids(&prompt["greedy_ids"]))
                .collect();
            let positions = prompt["positions"].as_array().unwrap();
            let mut kv = GrowKv::new(c.kv_geometry(), c.context_len).unwrap();
            for (p, &id) in all.iter().enumerate() {
                let logits = model.forward(&mut kv, &[id], Logits::Last).unwrap();
                let row = logits.row(0);
                let reference = &positions[p];
                let top = reference["top"].as_array().unwrap();
                for pair in top {
                    let tid = pair[0].as_u64().unwrap() as usize;
                    let want = pair[1].as_f64().unwrap() as f32;
                    let diff = (row[tid] - want).abs();
                    assert!(
                        diff <= TOL_Q8,
                        "{name_b} {name} position {p} token {tid}: logit {} vs reference {want} (|diff| {diff} > {TOL_Q8})",
                        row[tid]
                    );
                    worst = worst.max(diff);
                    sum += f64::from(diff);
                    count += 1;
                }
                let argmax = row
                    .iter()
                    .enumerate()
                    .fold(
                        (0, f32::NEG_INFINITY),
                        |a, (i, &v)| if v > a.1 { (i, v) } else { a },
                    )
                    .0;
                let ref_top = top[0][0].as_u64().unwrap() as usize;
                let margin = reference["margin"].as_f64().unwrap();
                assert!(
                    argmax == ref_top || margin <= SAFE_MARGIN,
                    "{name_b} {name} position {p}: top-1 {argmax} vs reference {ref_top} at margin {margin}"
                );
                agree += usize::from(argmax == ref_top);
                positions_seen += 1;
            }
        }
        let mean = sum / count as f64;
        eprintln!(
            "{name_b} q8: worst |logit - reference| {worst:.3}, mean {mean:.3}, top-1 agrees at {agree}/{positions_seen} positions"
        );
        assert!(
            mean <= MEAN_TOL_Q8,
            "{name_b}: mean |diff| {mean} > {MEAN_TOL_Q8}"
        );
        assert!(
            agree * 20 >= positions_seen * 19,
            "{name_b}: top-1 agrees at only {agree}/{positions_seen} positions"
        );
    }
}

#[test]
fn golden_q8_simd() {
    with_backend("simd", &GoldenQ8);
}

#[test]
fn golden_q8_rayon() {
    with_backend("rayon", &GoldenQ8);
}

#[test]
fn golden_q8_scalar() {
    with_backend("scalar", &GoldenQ8);
}
