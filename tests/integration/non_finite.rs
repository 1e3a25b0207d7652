//! NaN and infinite weights and activations: every kernel of every backend and the whole
//! forward pass return a defined result, never a panic or a hang.
//!
//! The defined behaviour (what these tests check, on Scalar, Simd, Rayon<Scalar> and
//! Rayon<Simd>):
//! - Contamination is local: poisoning one input element changes only the outputs that
//!   read it; every other output is bitwise what the clean input gives.
//! - GEMV/GEMM: a NaN in `x` makes every output NaN; a NaN in row `r` of `W` (an element,
//!   or the f16 scale of a block) makes `y[r]` NaN; an infinity makes the outputs that
//!   read it non-finite.
//! - GEMV with 8-bit activations (`quantize_q8` + `gemv_q8`): a NaN or an infinity in
//!   `x` makes its whole block's scale NaN, so every output is NaN (the f32 GEMV would
//!   give NaN or ±inf); a NaN block scale in row `r` of `W` makes `y[r]` NaN only.
//! - RMSNorm: a NaN in row `t` makes that whole row NaN (the mean square is NaN).
//! - Softmax: a NaN anywhere in a row makes the whole row NaN, and so does a `+∞` in a
//!   row with some finite entry (`∞ − ∞`, then a NaN sum). A fully masked row (every
//!   entry `−∞`) becomes all zeros. Attention inherits this: a query head whose scores
//!   hold a NaN (a NaN in `q`) outputs NaN.
//! - Attention: a NaN in key or value row `t` of a KV head reaches exactly the query rows
//!   at positions `≥ t` of the heads that read that KV head.
//! - Forward: a NaN weight gives NaN logits, and sampling a row with a NaN is
//!   `ModelError::NonFinite`; an infinite weight gives some non-finite logits or none,
//!   and sampling then errors exactly when the row holds a NaN.

use std::sync::mpsc;
use std::time::Duration;

use half::f16;
use kvcore::backend::{Q8Acts, Q8Layout};
use kvcore::gguf::GgufFile;
use kvcore::model::{Llama, Logits, ModelError, Sampler, Sampling};
use kvcore::ndarray::Array3;
use kvcore::{AttnParams, Backend, DType, KvView, Weights};
use kvcore_rayon::Rayon;
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;
use kvcore_test_support::tiny::TinyLlama;

fn backends() -> Vec<(&'static str, Box<dyn Backend>)> {
    vec![
        ("scalar", Box::new(Scalar::new())),
        ("simd", Box::new(Simd::new())),
        (
            "rayon-scalar",
            Box::new(Rayon::new(Scalar::new(), 2).expect("pool")),
        ),
        (
            "rayon-simd",
            Box::new(Rayon::new(Simd::new(), 2).expect("pool")),
        ),
    ]
}

/// Deterministic values in `[-1, 1)`.
fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let h = (i.wrapping_mul(0x9E37_79B9) ^ seed).wrapping_mul(0x85EB_CA6B);
            (h >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

const POISONS: [f32; 3] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];

/// Asserts `out` equals `clean` bitwise where `!depends[i]`, and where `depends[i]`:
/// NaN for a NaN poison, non-finite for an infinite one.
fn check_local(
    what: &str,
    poison: f32,
    clean: &[f32],
    out: &[f32],
    depends: impl Fn(usize) -> bool,
) {
    for (i, (&c, &o)) in clean.iter().zip(out).enumerate() {
        if depends(i) {
            if poison.is_nan() {
                assert!(o.is_nan(), "{what}: output {i} = {o}, expected NaN");
            } else {
                assert!(
                    !o.is_finite(),
                    "{what}: output {i} = {o}, expected non-finite"
                );
            }
        } else {
            assert_eq!(
                c.to_bits(),
                o.to_bits(),
                "{what}: untouched output {i} changed"
            );
        }
    }
}

/// The rows of `w: [rows, cols]` encoded as `dtype`, one after another.
fn quantized(dtype: DType, cols: usize, w: &[f32]) -> Vec<u8> {
    w.chunks_exact(cols)
        .flat_map(|row| kvcore_scalar::quant::quantize_row(dtype, row))
        .collect()
}

/// Runs `run` on `bytes` with the f16 block scale at `at` set to NaN and checks that only
/// output `r` of `clean` turns NaN; `bytes` are restored afterwards.
fn check_nan_scale(
    what: &str,
    bytes: &mut [u8],
    at: usize,
    r: usize,
    clean: &[f32],
    run: impl Fn(&[u8]) -> Vec<f32>,
) {
    let saved = [bytes[at], bytes[at + 1]];
    bytes[at..at + 2].copy_from_slice(&f16::NAN.to_le_bytes());
    let y = run(bytes);
    check_local(&format!("{what} NaN scale"), f32::NAN, clean, &y, |i| {
        i == r
    });
    bytes[at..at + 2].copy_from_slice(&saved);
}

#[test]
fn gemv_and_gemm_contaminate_only_dependent_outputs() {
    let (rows, cols, n) = (9, 64, 3);
    let w = values(rows * cols, 1);
    let x = values(n * cols, 2);
    for (name, b) in backends() {
        let gemm = |w: &[f32], x: &[f32]| {
            let wv = Weights::from_f32(rows, cols, w).unwrap();
            let mut y = vec![0.0; n * rows];
            b.gemm(&wv, x, &mut y).unwrap();
            let mut y1 = vec![0.0; rows];
            b.gemv(&wv, &x[..cols], &mut y1).unwrap();
            (y, y1)
        };
        let (clean, clean1) = gemm(&w, &x);
        for p in POISONS {
            let (r, j) = (4, 37);
            let mut wp = w.clone();
            wp[r * cols + j] = p;
            let (y, y1) = gemm(&wp, &x);
            check_local(&format!("{name} gemm W[{r},{j}]={p}"), p, &clean, &y, |i| {
                i % rows == r
            });
            check_local(
                &format!("{name} gemv W[{r},{j}]={p}"),
                p,
                &clean1,
                &y1,
                |i| i == r,
            );
            let t = 1;
            let mut xp = x.clone();
            xp[t * cols + j] = p;
            let (y, _) = gemm(&w, &xp);
            check_local(&format!("{name} gemm x[{t},{j}]={p}"), p, &clean, &y, |i| {
                i / rows == t
            });
        }
    }
}

#[test]
fn a_nan_block_scale_makes_its_row_nan() {
    let (rows, cols) = (5, 64);
    for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4_1] {
        let w = values(rows * cols, 3);
        let mut bytes = quantized(dtype, cols, &w);
        let x = values(cols, 4);
        for (name, b) in backends() {
            let run = |bytes: &[u8]| {
                let wv = Weights::new(dtype, rows, cols, bytes).unwrap();
                let mut y = vec![0.0; rows];
                b.gemv(&wv, &x, &mut y).unwrap();
                y
            };
            let clean = run(&bytes);
            let r = 2;
            let row_bytes = dtype.row_bytes(cols).unwrap();
            // The second block of row r: its scale `d` is the first two bytes.
            let at = r * row_bytes + dtype.block_bytes();
            check_nan_scale(&format!("{name} {dtype}"), &mut bytes, at, r, &clean, run);
        }
    }
}

#[test]
fn q8_activations_turn_any_non_finite_input_into_nan_and_stay_row_local() {
    let (rows, cols) = (5, 512);
    // Every format with an 8-bit path, and its activations' layout.
    for (dtype, layout) in DType::ALL
        .into_iter()
        .filter_map(|d| Q8Layout::of(d).map(|l| (d, l)))
    {
        let w = values(rows * cols, 6);
        let mut bytes = quantized(dtype, cols, &w);
        let x = values(cols, 7);
        for (name, b) in backends() {
            let run = |bytes: &[u8], x: &[f32]| {
                let wv = Weights::new(dtype, rows, cols, bytes).unwrap();
                let mut xq = Q8Acts::new();
                b.quantize_q8(layout, x, &mut xq).unwrap();
                let mut y = vec![0.0; rows];
                b.gemv_q8(&wv, &xq, &mut y).unwrap();
                y
            };
            let clean = run(&bytes, &x);
            assert!(
                clean.iter().all(|v| v.is_finite()),
                "{name} {dtype}: {clean:?}"
            );
            for poison in POISONS {
                let mut xp = x.clone();
                xp[40] = poison;
                let y = run(&bytes, &xp);
                check_local(
                    &format!("{name} {dtype} q8 x = {poison}"),
                    f32::NAN,
                    &clean,
                    &y,
                    |_| true,
                );
            }
            let r = 3;
            // The scale `d` of the row's third block (its last, for the K formats):
            // `Q6_K` stores it at the block's end.
            let block = 2.min(cols / dtype.block_len() - 1);
            let d_at = if dtype == DType::Q6_K { 208 } else { 0 };
            let at = r * dtype.row_bytes(cols).unwrap() + block * dtype.block_bytes() + d_at;
            check_nan_scale(
                &format!("{name} {dtype} q8"),
                &mut bytes,
                at,
                r,
                &clean,
                |b| run(b, &x),
            );
        }
    }
}

#[test]
fn rms_norm_makes_a_row_with_nan_nan() {
    let (n, d) = (3, 48);
    let x = values(n * d, 5);
    let weight = values(d, 6);
    for (name, b) in backends() {
        let run = |x: &[f32]| {
            let mut out = vec![0.0; n * d];
            b.rms_norm(x, &weight, 1e-5, &mut out).unwrap();
            out
        };
        let clean = run(&x);
        let mut xp = x.clone();
        xp[d + 7] = f32::NAN;
        check_local(
            &format!("{name} rms_norm"),
            f32::NAN,
            &clean,
            &run(&xp),
            |i| i / d == 1,
        );
        for p in [f32::INFINITY, f32::NEG_INFINITY] {
            let mut xp = x.clone();
            xp[d + 7] = p;
            let out = run(&xp);
            for (i, (c, o)) in clean.iter().zip(&out).enumerate() {
                if i / d != 1 {
                    assert_eq!(
                        c.to_bits(),
                        o.to_bits(),
                        "{name} rms_norm inf: row {}",
                        i / d
                    );
                }
            }
        }
    }
}

#[test]
fn softmax_rows_with_nan_or_inf() {
    let nan = f32::NAN;
    let (inf, ninf) = (f32::INFINITY, f32::NEG_INFINITY);
    for (name, b) in backends() {
        for len in [1usize, 7, 8, 9, 33] {
            let clean = values(len, 7);
            for (p, at) in [(nan, 0), (nan, len - 1), (inf, len / 2)] {
                let mut row = clean.clone();
                row[at] = p;
                if len == 1 && p.is_nan() {
                    continue;
                }
                b.softmax(&mut row);
                assert!(
                    row.iter().all(|v| v.is_nan()),
                    "{name} softmax len {len} {p}@{at}: {row:?}"
                );
            }
            let mut masked = vec![ninf; len];
            b.softmax(&mut masked);
            assert!(
                masked.iter().all(|&v| v == 0.0),
                "{name} softmax of a fully masked row: {masked:?}"
            );
            for fill in [[nan, nan], [nan, ninf]] {
                let mut row: Vec<f32> = (0..len).map(|i| fill[i % 2]).collect();
                b.softmax(&mut row);
                assert!(
                    row.iter().all(|v| v.is_nan()),
                    "{name} softmax {fill:?}: {row:?}"
                );
            }
        }
    }
}

#[test]
fn attention_contaminates_only_later_positions_of_the_same_group() {
    // 4 query heads over 2 KV heads of 8; new rows at positions 2, 3, 4.
    let (pos0, n_new, kv_dim) = (2, 3, 16);
    let n_keys = pos0 + n_new;
    let q = values(n_new * 4 * 8, 8);
    let k = values(n_keys * kv_dim, 9);
    let v = values(n_keys * kv_dim, 10);
    let q_pos: Vec<usize> = (pos0..pos0 + n_new).collect();
    for (name, b) in backends() {
        let run = |q: &[f32], k: &[f32], v: &[f32]| {
            let q = Array3::from_shape_vec((n_new, 4, 8), q.to_vec()).unwrap();
            let k = Array3::from_shape_vec((n_keys, 2, 8), k.to_vec()).unwrap();
            let v = Array3::from_shape_vec((n_keys, 2, 8), v.to_vec()).unwrap();
            let kv = KvView::from_f32(k.view(), v.view()).unwrap();
            let mut out = Array3::zeros((n_new, 4, 8));
            b.attention(
                q.view(),
                &q_pos,
                &kv,
                &AttnParams::causal(8),
                out.view_mut(),
            )
            .unwrap();
            out.into_raw_vec_and_offset().0
        };
        let clean = run(&q, &k, &v);
        // Key/value row t = 3 of KV head 1 (query heads 2 and 3); new rows sit at
        // positions 2, 3, 4, so rows 1 and 2 see it.
        let (t, kv_head) = (3, 1);
        let depends = |i: usize| {
            let (row, head) = (i / 32, (i / 8) % 4);
            pos0 + row >= t && head / 2 == kv_head
        };
        let at = t * kv_dim + kv_head * 8 + 5;
        let nan_local = |what: &str, y: &[f32], depends: &dyn Fn(usize) -> bool| {
            let what = format!("{name} attention NaN {what}");
            check_local(&what, f32::NAN, &clean, y, depends);
        };
        let nan_at = |x: &[f32]| {
            let mut x = x.to_vec();
            x[at] = f32::NAN;
            x
        };
        nan_local("key", &run(&q, &nan_at(&k), &v), &depends);
        // A NaN value element reaches only its own column of the dependent heads.
        nan_local("value", &run(&q, &k, &nan_at(&v)), &|i| {
            depends(i) && i % 8 == 5
        });
        // A NaN in query head 0 of row 1: every score of that head is NaN, so the
        // head outputs NaN; every other output is untouched.
        let mut qp = q.clone();
        qp[32 + 3] = f32::NAN;
        let out = run(&qp, &k, &v);
        for (i, (c, o)) in clean.iter().zip(&out).enumerate() {
            if (32..40).contains(&i) {
                assert!(o.is_nan(), "{name} attention NaN query: output {i} = {o}");
            } else {
                assert_eq!(
                    c.to_bits(),
                    o.to_bits(),
                    "{name} attention NaN query: output {i}"
                );
            }
        }
    }
}

/// A TinyLlama file with `value` written over element `at` of the F32 tensor `tensor`.
fn poisoned_model(tensor: &str, at: usize, value: f32) -> GgufFile {
    let tiny = TinyLlama {
        n_layers: 2,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 8,
        ffn_dim: 32,
        vocab_size: 24,
        context_len: 16,
        dtype: DType::F32,
        seed: 11,
        untied_output: true,
    };
    let mut bytes = tiny.to_gguf();
    let file = GgufFile::from_bytes(bytes.clone()).expect("TinyLlama is valid");
    let t = file.tensor(tensor).expect("tensor exists");
    let start = file.data_start() + t.offset as usize + 4 * at;
    bytes[start..start + 4].copy_from_slice(&value.to_le_bytes());
    GgufFile::from_bytes(bytes).expect("still valid")
}

/// Loads `file` on each backend, runs 3 tokens then one more, and samples the last row,
/// in a thread that must finish within 60 s. Returns (backend, last logits, sample).
fn run_model(
    file_of: impl Fn() -> GgufFile,
) -> Vec<(&'static str, Vec<f32>, Result<u32, ModelError>)> {
    let mut results = Vec::new();
    for (i, (name, _)) in backends().into_iter().enumerate() {
        let file = file_of();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let (_, b) = backends().swap_remove(i);
            let model = Llama::load(file, &*b).expect("the poisoned model loads");
            let mut kv = model.new_grow_kv(8).unwrap();
            model
                .forward(&mut kv, &[1, 5, 9], Logits::All)
                .expect("prefill runs");
            let last = model
                .forward(&mut kv, &[3], Logits::Last)
                .expect("decode runs");
            let row = last.row(0).to_vec();
            let sample = Sampler::new(Sampling::Greedy).unwrap().sample(&row);
            tx.send((row, sample)).unwrap();
        });
        let (row, sample) = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{name}: the forward pass hung or panicked: {e}"));
        results.push((name, row, sample));
    }
    results
}

/// A NaN in row 3 of a weight reaches the logits and sampling refuses them. Past the
/// attention (`W_v`, the FFN, the final norm) it makes every logit NaN. In layer 0's `W_k`
/// (one KV head) it puts a NaN in every key of that head, so every score of its query
/// heads is NaN: the softmax rule above at work in a whole model, the NaN not mistaken
/// for masking, and some logits NaN.
#[test]
fn a_nan_weight_reaches_the_logits_and_sampling_refuses_them() {
    for (tensor, every_logit) in [
        ("blk.0.attn_v.weight", true),
        ("blk.1.ffn_down.weight", true),
        ("output_norm.weight", true),
        ("blk.0.attn_k.weight", false),
    ] {
        for (name, row, sample) in run_model(|| poisoned_model(tensor, 3, f32::NAN)) {
            let nan = if every_logit {
                row.iter().all(|v| v.is_nan())
            } else {
                row.iter().any(|v| v.is_nan())
            };
            assert!(nan, "{name} {tensor}: {row:?}");
            assert!(
                matches!(sample, Err(ModelError::NonFinite { .. })),
                "{name} {tensor}: sampled {sample:?}"
            );
        }
    }
}

#[test]
fn infinite_weights_run_and_sampling_errors_exactly_on_nan() {
    for tensor in [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.1.ffn_gate.weight",
        "output.weight",
    ] {
        for p in [f32::INFINITY, f32::NEG_INFINITY] {
            for (name, row, sample) in run_model(|| poisoned_model(tensor, 3 * 8 + 1, p)) {
                let has_nan = row.iter().any(|v| v.is_nan());
                match sample {
                    Ok(id) => assert!(!has_nan && (id as usize) < row.len(), "{name} {tensor}"),
                    Err(ModelError::NonFinite { .. }) => assert!(has_nan, "{name} {tensor}"),
                    Err(e) => panic!("{name} {tensor} {p}: {e}"),
                }
            }
        }
    }
}
