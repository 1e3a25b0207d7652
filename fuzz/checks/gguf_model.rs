//! The `gguf_model` property: a tiny Llama or Gemma 3 GGUF with fields mutated by the input either
//! fails to parse or load with an error, or runs a forward pass; nothing panics, hangs or
//! allocates without bound.
//!
//! Shared by the fuzz target `fuzz/fuzz_targets/gguf_model.rs` and the stable replay test
//! `tests/integration/fuzz_corpus_replay.rs` (both include this file with `#[path]`).
//!
//! Input format (every read past the end gives zero bytes, so any input is valid):
//!
//! ```text
//! byte 0  dtype of the matrices: MODEL_DTYPES[b % 6]
//! byte 1  n_heads = [1, 2, 4][b % 3]; n_kv_heads = n_heads >> ((b / 3) % 3), at least 1
//! byte 2  head_dim: F32/F16/BF16 [2, 4, 8, 16][b % 4]; block formats (32 / n_heads)·(1 + b % 2)
//! byte 3  n_layers = 1 + b % 2; a `gemma3` file (window 1 + (b >> 4) % 4) if b & 2, else
//!         `llama`; untied output if b & 4; ffn_dim from (b >> 3) % 2
//! byte 4  vocab_size = 4 + b % 29
//! byte 5  weight seed
//! byte 6  prompt length 1 + b % 4, then that many token ids, one byte each, taken
//!         modulo vocab_size + 1 (so `vocab_size` itself is the one id outside)
//! then up to MAX_EDITS edits, each an opcode byte (b % 8) and its operands:
//!   0 key, value   set metadata entry `key % (entries + 4)` (an index past the end adds one
//!                  of EXTRA_KEYS) to a value decoded by `value` (any of the 13 types)
//!   1 key          remove metadata entry `key % entries`
//!   2 t            remove tensor `t % tensors`
//!   3 t, d         re-type tensor t as MODEL_DTYPES[d % 6] (data resized with zeros)
//!   4 t, n, dims   give tensor t new dims (n % 4 + 1 of them, a byte each; data resized)
//!   5 t, f, v8     after writing: overwrite field f % 6 of tensor t's info (n_dims, dim 0,
//!                  dim 1, ggml type, offset, name length) with the u64 v
//!   6 t, at, k     poison element `at` (u16) of tensor t's data with NaN, ±inf, a huge or
//!                  a subnormal value, in the tensor's own format (k % 5 picks which)
//!   7 at, b        after writing: set byte `at % len` (u16) to b; b = 0xff truncates there
//! ```
//!
//! The mutated file is parsed, loaded with the scalar backend, and run for the prompt
//! (all logits) and one more token (last logits) on a 6-position KV store, so long
//! prompts also overflow the context. Greedy sampling of the last row must give a token
//! inside the vocabulary or, exactly when the row holds a NaN, `ModelError::NonFinite`.

use half::{bf16, f16};
use kvcore::DType;
use kvcore::gguf::{GgufFile, GgufWriter, Value};
use kvcore::model::{Llama, Logits, ModelError, Sampler, Sampling};
use kvcore_scalar::Scalar;
use kvcore_test_support::tiny::TinyLlama;

/// The most edits one input applies.
const MAX_EDITS: usize = 8;

/// The formats a fuzzed model's matrices take: the first six of `DType::ALL`, `F32` to
/// `Q4_1`, whose blocks fit its small widths (the K formats' 256-weight super-blocks do
/// not).
const MODEL_DTYPES: [DType; 6] = *DType::ALL.first_chunk().unwrap();

/// Keys an edit may add (beyond those TinyLlama writes).
const EXTRA_KEYS: [&str; 4] = [
    "general.alignment",
    "llama.rope.dimension_count",
    "tokenizer.ggml.model",
    "llama.attention.head_count_kv",
];

/// KV positions of the store the forward pass runs on.
const MAX_CTX: usize = 6;

/// Reads the input front to back, yielding zeros once it runs out.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        std::array::from_fn(|_| self.u8())
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }

    fn index(&mut self, len: usize) -> Option<usize> {
        let b = usize::from(self.u8());
        (len > 0).then(|| b % len)
    }

    fn dtype(&mut self) -> DType {
        MODEL_DTYPES[usize::from(self.u8()) % MODEL_DTYPES.len()]
    }

    /// A metadata value of any of the 13 GGUF types.
    fn value(&mut self) -> Value {
        match self.u8() % 13 {
            0 => Value::U8(self.u8()),
            1 => Value::I8(self.u8() as i8),
            2 => Value::U16(self.u16()),
            3 => Value::I16(self.u16() as i16),
            4 => Value::U32(self.u32()),
            5 => Value::I32(self.u32() as i32),
            6 => Value::F32(f32::from_bits(self.u32())),
            7 => Value::Bool(self.u8() & 1 == 1),
            8 => Value::Str(["llama", "", "gpt2", "llama\0"][usize::from(self.u8() % 4)].into()),
            9 => Value::Array((0..self.u8() % 4).map(|_| Value::U32(self.u32())).collect()),
            10 => Value::U64(self.u64()),
            11 => Value::I64(self.u64() as i64),
            _ => Value::F64(f64::from_bits(self.u64())),
        }
    }
}

/// The model before writing: TinyLlama's metadata and tensors, as data to edit.
struct Description {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, DType, Vec<u64>, Vec<u8>)>,
}

impl Description {
    fn of(tiny: &TinyLlama, gemma3_window: Option<usize>) -> Description {
        let bytes = match gemma3_window {
            Some(window) => tiny.to_gemma3_gguf(window),
            None => tiny.to_gguf(),
        };
        let file = GgufFile::from_bytes(bytes).expect("TinyLlama writes valid GGUF");
        Description {
            metadata: file.metadata().to_vec(),
            tensors: file
                .tensors()
                .iter()
                .map(|t| {
                    let data = file.tensor_data(t).to_vec();
                    (t.name.clone(), t.dtype, t.dims.clone(), data)
                })
                .collect(),
        }
    }

    /// Gives tensor `t` a new type and dims, resizing its data with zeros, when the
    /// writer can represent them (whole blocks, at most 64 KiB of data).
    fn reshape(&mut self, t: usize, dtype: DType, dims: Vec<u64>) {
        let size = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
            .filter(|_| {
                dims.first()
                    .is_none_or(|&c| (c as usize).is_multiple_of(dtype.block_len()))
            })
            .and_then(|_| {
                let cols = dims.first().map_or(1, |&c| c as usize);
                let rows: usize = dims.iter().skip(1).map(|&d| d as usize).product();
                dtype.row_bytes(cols)?.checked_mul(rows)
            });
        if let Some(n_bytes) = size.filter(|&n| n <= 1 << 16) {
            let tensor = &mut self.tensors[t];
            tensor.1 = dtype;
            tensor.2 = dims;
            tensor.3.resize(n_bytes, 0);
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut w = GgufWriter::new();
        for (key, value) in &self.metadata {
            w.metadata(key, value.clone());
        }
        for (name, dtype, dims, data) in &self.tensors {
            w.tensor(name, *dtype, dims, data.clone());
        }
        w.to_bytes()
    }
}

/// Edits applied to the written bytes.
enum Patch {
    /// Field `field` of tensor `tensor`'s info ← `value`.
    Field {
        tensor: String,
        field: u8,
        value: u64,
    },
    /// Byte `at` ← `value`, or truncation at `at` when `value` is 0xff.
    Byte { at: u16, value: u8 },
}

/// The value poisoned into a tensor: NaN, +inf, −inf, huge, subnormal.
const POISON: [f32; 5] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 3.0e38, 1.0e-40];

/// Writes `v` over element `at` of data stored as `dtype` (for block formats: the f16
/// scale of block `at`).
fn poison(data: &mut [u8], dtype: DType, at: usize, v: f32) {
    let (at, bytes) = match dtype {
        DType::F32 => (at * 4, v.to_le_bytes().to_vec()),
        DType::F16 => (at * 2, f16::from_f32(v).to_le_bytes().to_vec()),
        DType::BF16 => (at * 2, bf16::from_f32(v).to_le_bytes().to_vec()),
        // Every block format of kvcore starts its block with an f16 scale.
        _ => (
            at * dtype.block_bytes(),
            f16::from_f32(v).to_le_bytes().to_vec(),
        ),
    };
    if let Some(dst) = data.get_mut(at..at + bytes.len()) {
        dst.copy_from_slice(&bytes);
    }
}

/// Overwrites one field of the tensor info of `name` in a written file, found by its
/// name string (skipped when the name is not found or the field is past the end).
fn patch_field(bytes: &mut [u8], name: &str, field: u8, value: u64) {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    let Some(start) = bytes.windows(needle.len()).position(|w| w == needle) else {
        return;
    };
    let after_name = start + needle.len();
    let n_dims = bytes.get(after_name..after_name + 4).map_or(0, |b| {
        u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize
    });
    let after_dims = after_name + 4 + 8 * n_dims;
    let (at, width) = match field % 6 {
        0 => (after_name, 4),
        1 => (after_name + 4, 8),
        2 => (after_name + 12, 8),
        3 => (after_dims, 4),
        4 => (after_dims + 4, 8),
        _ => (start, 8),
    };
    if let Some(dst) = bytes.get_mut(at..at + width) {
        dst.copy_from_slice(&value.to_le_bytes()[..width]);
    }
}

/// Builds the mutated model that `data` describes and runs it.
///
/// # Panics
/// When parsing, loading, the forward pass or sampling panics, or a result contradicts
/// its contract (logits of the wrong shape, a sampled id outside the vocabulary, a NaN
/// row sampled without an error).
pub fn check_gguf_model(data: &[u8]) {
    let mut input = Input { data, pos: 0 };
    let dtype = input.dtype();
    let b = input.u8();
    let n_heads = [1, 2, 4][usize::from(b) % 3];
    let n_kv_heads = (n_heads >> ((b / 3) % 3)).max(1);
    let b = usize::from(input.u8());
    let block = dtype.block_len() > 1;
    let head_dim = if block {
        32 / n_heads * (1 + b % 2)
    } else {
        [2, 4, 8, 16][b % 4]
    };
    let b = input.u8();
    let ffn_unit = if block { 32 } else { 4 };
    let tiny = TinyLlama {
        n_layers: 1 + usize::from(b % 2),
        n_heads,
        n_kv_heads,
        head_dim,
        ffn_dim: ffn_unit * (1 + usize::from(b >> 3) % 2),
        vocab_size: 4 + usize::from(input.u8() % 29),
        context_len: 16,
        dtype,
        seed: u64::from(input.u8()),
        untied_output: b & 4 != 0,
    };
    let n_prompt = 1 + usize::from(input.u8() % 4);
    let ids = tiny.vocab_size as u32 + 1;
    let prompt: Vec<u32> = (0..n_prompt).map(|_| u32::from(input.u8()) % ids).collect();

    let gemma3_window = (b & 2 != 0).then_some(1 + usize::from(b >> 4) % 4);
    let mut desc = Description::of(&tiny, gemma3_window);
    let mut patches = Vec::new();
    for _ in 0..MAX_EDITS {
        if input.is_empty() {
            break;
        }
        match input.u8() % 8 {
            0 => {
                let n = desc.metadata.len();
                let i = usize::from(input.u8()) % (n + EXTRA_KEYS.len());
                let value = input.value();
                match desc.metadata.get_mut(i) {
                    Some(entry) => entry.1 = value,
                    None => desc.metadata.push((EXTRA_KEYS[i - n].to_string(), value)),
                }
            }
            1 => {
                if let Some(i) = input.index(desc.metadata.len()) {
                    desc.metadata.remove(i);
                }
            }
            2 => {
                if let Some(t) = input.index(desc.tensors.len()) {
                    desc.tensors.remove(t);
                }
            }
            3 => {
                let (t, dtype) = (input.index(desc.tensors.len()), input.dtype());
                if let Some(t) = t {
                    let dims = desc.tensors[t].2.clone();
                    desc.reshape(t, dtype, dims);
                }
            }
            4 => {
                let t = input.index(desc.tensors.len());
                let n = usize::from(input.u8() % 4) + 1;
                let dims: Vec<u64> = (0..n).map(|_| u64::from(input.u8())).collect();
                if let Some(t) = t {
                    let dtype = desc.tensors[t].1;
                    desc.reshape(t, dtype, dims);
                }
            }
            5 => {
                let t = input.index(desc.tensors.len());
                let (field, value) = (input.u8(), input.u64());
                if let Some(t) = t {
                    let tensor = desc.tensors[t].0.clone();
                    patches.push(Patch::Field {
                        tensor,
                        field,
                        value,
                    });
                }
            }
            6 => {
                let t = input.index(desc.tensors.len());
                let (at, k) = (usize::from(input.u16()), usize::from(input.u8()));
                if let Some(t) = t {
                    let (_, dtype, _, data) = &mut desc.tensors[t];
                    poison(data, *dtype, at, POISON[k % POISON.len()]);
                }
            }
            _ => patches.push(Patch::Byte {
                at: input.u16(),
                value: input.u8(),
            }),
        }
    }

    let mut bytes = desc.to_bytes();
    for patch in patches {
        match patch {
            Patch::Field {
                tensor,
                field,
                value,
            } => {
                patch_field(&mut bytes, &tensor, field, value);
            }
            Patch::Byte { at, value } => {
                let at = usize::from(at) % bytes.len().max(1);
                if value == 0xff {
                    bytes.truncate(at);
                } else if let Some(b) = bytes.get_mut(at) {
                    *b = value;
                }
            }
        }
    }
    run(bytes, &prompt);
}

/// Parses, loads and runs the file; errors are fine, panics and broken contracts are not.
fn run(bytes: Vec<u8>, prompt: &[u32]) {
    let Ok(file) = GgufFile::from_bytes(bytes) else {
        return;
    };
    let Ok(model) = Llama::load(file, Scalar::new()) else {
        return;
    };
    let vocab = model.config().vocab_size;
    let Ok(mut kv) = model.new_grow_kv(MAX_CTX) else {
        return;
    };
    if let Ok(logits) = model.forward(&mut kv, prompt, Logits::All) {
        assert_eq!(logits.dim(), (prompt.len(), vocab), "prefill logits shape");
    }
    let Ok(last) = model.forward(&mut kv, &prompt[..1], Logits::Last) else {
        return;
    };
    assert_eq!(last.dim(), (1, vocab), "decode logits shape");
    let row = last.row(0).to_vec();
    let mut sampler = Sampler::new(Sampling::Greedy).expect("greedy sampling is valid");
    match sampler.sample(&row) {
        Ok(id) => {
            assert!((id as usize) < vocab, "sampled id {id} of {vocab}");
            assert!(row.iter().all(|v| !v.is_nan()), "sampled a row with NaN");
        }
        Err(ModelError::NonFinite { .. }) => {
            assert!(
                row.iter().any(|v| v.is_nan()),
                "NonFinite on a NaN-free row"
            );
        }
        Err(e) => panic!("greedy sampling failed: {e}"),
    }
}
