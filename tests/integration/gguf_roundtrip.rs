//! `GgufWriter` → `GgufFile` round trips: every value type, nested arrays, tensors of
//! every `DType`, custom alignments, and random files (proptest) that must read back
//! exactly and re-serialise to the same bytes.

use kvcore::DType;
use kvcore::gguf::{GgufFile, GgufWriter, TensorInfo, Value};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

/// Equality that compares floats by their bits (so NaN payloads must survive too).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::F32(x), Value::F32(y)) => x.to_bits() == y.to_bits(),
        (Value::F64(x), Value::F64(y)) => x.to_bits() == y.to_bits(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        _ => a == b,
    }
}

/// Deterministic filler bytes (SplitMix64).
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) as u8
        })
        .collect()
}

/// Bytes of a tensor of `dtype` with ggml `dims`.
fn n_bytes(dtype: DType, dims: &[u64]) -> usize {
    let cols = dims.first().copied().unwrap_or(1) as usize;
    let rows: u64 = dims.iter().skip(1).product();
    dtype.row_bytes(cols).unwrap() * rows as usize
}

/// A writer that reproduces `f` (metadata and tensors in file order, same alignment).
fn rewrite(f: &GgufFile) -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        w.metadata(k, v.clone());
    }
    if f.get("general.alignment").is_some() {
        w.alignment(f.alignment());
    }
    for t in f.tensors() {
        w.tensor(&t.name, t.dtype, &t.dims, f.tensor_data(t).to_vec());
    }
    w
}

fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("u8", Value::U8(u8::MAX)),
        ("i8", Value::I8(i8::MIN)),
        ("u16", Value::U16(0xBEEF)),
        ("i16", Value::I16(-12345)),
        ("u32", Value::U32(u32::MAX)),
        ("i32", Value::I32(i32::MIN)),
        ("f32", Value::F32(-1.5e-7)),
        ("bool.t", Value::Bool(true)),
        ("bool.f", Value::Bool(false)),
        ("str", Value::Str("héllo, wörld ✓ 🦀".into())),
        ("str.empty", Value::Str(String::new())),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(i64::MIN)),
        ("f64", Value::F64(std::f64::consts::PI)),
        ("arr.empty", Value::Array(vec![])),
        ("arr.u8", Value::Array(vec![Value::U8(0), Value::U8(255)])),
        (
            "arr.bool",
            Value::Array(vec![Value::Bool(true), Value::Bool(false)]),
        ),
        (
            "arr.f64",
            Value::Array(vec![Value::F64(1.0), Value::F64(-0.0)]),
        ),
        (
            "arr.str",
            Value::Array(vec![Value::Str("a".into()), Value::Str("".into())]),
        ),
        (
            "arr.nested",
            Value::Array(vec![
                Value::Array(vec![Value::I64(-1)]),
                Value::Array(vec![]),
                Value::Array(vec![Value::Array(vec![Value::Str("deep".into())])]),
            ]),
        ),
    ]
}

#[test]
fn every_value_type_round_trips() {
    let mut w = GgufWriter::new();
    for (k, v) in every_value() {
        w.metadata(k, v);
    }
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    let want = every_value();
    assert_eq!(f.metadata().len(), want.len());
    for ((k, v), (wk, wv)) in f.metadata().iter().zip(&want) {
        assert_eq!(k, wk);
        assert_eq!(v, wv, "{k}");
        assert_eq!(f.get(k), Some(wv), "{k}");
    }
    assert_eq!(f.get("u8").unwrap().type_name(), "u8");
    assert_eq!(f.get("arr.nested").unwrap().type_name(), "array");
    assert_eq!(f.get_u64("u64").unwrap(), u64::MAX);
    assert_eq!(f.get_u64("u16").unwrap(), 0xBEEF);
    assert_eq!(f.get_f32("f64").unwrap(), std::f32::consts::PI);
    assert!(f.get_bool("bool.t").unwrap());
    assert_eq!(f.get_str("str").unwrap(), "héllo, wörld ✓ 🦀");
    assert_eq!(f.get_array("arr.u8").unwrap().len(), 2);
    assert!(matches!(
        f.get_u64("i8"),
        Err(kvcore::gguf::GgufError::OutOfRange { value: -128, .. })
    ));
}

#[test]
fn value_accessors() {
    assert_eq!(Value::I32(5).as_u64(), Some(5));
    assert_eq!(Value::I32(-5).as_u64(), None);
    assert_eq!(Value::I32(-5).as_i64(), Some(-5));
    assert_eq!(Value::U64(u64::MAX).as_i64(), None);
    assert_eq!(Value::U64(u64::MAX).as_u64(), Some(u64::MAX));
    assert_eq!(Value::F32(1.0).as_u64(), None);
    assert_eq!(Value::Bool(true).as_u64(), None);
    assert_eq!(Value::F64(0.25).as_f32(), Some(0.25));
    assert_eq!(Value::U32(1).as_f32(), None);
    assert_eq!(Value::Str("x".into()).as_str(), Some("x"));
    assert_eq!(Value::U8(1).as_str(), None);
    let names: Vec<&str> = every_value().iter().map(|(_, v)| v.type_name()).collect();
    assert_eq!(
        names,
        [
            "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "bool", "string", "string",
            "u64", "i64", "f64", "array", "array", "array", "array", "array", "array"
        ]
    );
}

#[test]
fn tensors_of_every_dtype() {
    let shapes: [&[u64]; 5] = [&[64], &[32, 3], &[64, 2, 3], &[32, 1, 2, 2], &[0, 5]];
    let mut w = GgufWriter::new();
    let mut want = Vec::new();
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        // ne0 in units of 32 weights: 8 times more for the 256-weight K super-blocks.
        let widen = dtype.block_len().max(32) as u64 / 32;
        for (j, dims) in shapes.iter().enumerate() {
            let dims: &[u64] = &[&[dims[0] * widen][..], &dims[1..]].concat();
            let name = format!("{}.{j}", dtype.name());
            let data = bytes(n_bytes(dtype, dims), (i * 10 + j) as u64);
            w.tensor(&name, dtype, dims, data.clone());
            want.push((name, dtype, dims.to_vec(), data));
        }
    }
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(f.tensors().len(), want.len());
    for (t, (name, dtype, dims, data)) in f.tensors().iter().zip(&want) {
        assert_eq!(&t.name, name);
        assert_eq!(t.dtype, *dtype);
        assert_eq!(&t.dims, dims);
        assert_eq!(t.offset % 32, 0, "{name}");
        assert_eq!(f.tensor_data(t), data.as_slice(), "{name}");
        let m = f.weights(t).unwrap();
        assert_eq!(m.cols() as u64, dims[0]);
        assert_eq!(m.rows() as u64, dims[1..].iter().product::<u64>());
        assert_eq!(m.data(), data.as_slice());
    }
}

#[test]
fn custom_alignment_lays_out_the_file() {
    for a in [1usize, 8, 64, 4096] {
        let mut w = GgufWriter::new();
        w.metadata("x", Value::U8(1)).alignment(a);
        w.tensor("a", DType::F16, &[3], bytes(6, 1))
            .tensor("b", DType::Q4_1, &[32], bytes(20, 2));
        let out = w.to_bytes();
        assert_eq!(out.len() % a, 0);
        let f = GgufFile::from_bytes(out).unwrap();
        assert_eq!(f.alignment(), a);
        assert_eq!(f.get("general.alignment"), Some(&Value::U32(a as u32)));
        assert_eq!(f.data_start() % a, 0);
        let b = f.tensor("b").unwrap();
        assert_eq!(b.offset, 6u64.next_multiple_of(a as u64));
        assert_eq!(f.tensor_data(b), bytes(20, 2).as_slice());
    }
    // Setting the alignment twice keeps one key, in its first position.
    let mut w = GgufWriter::new();
    w.alignment(8).metadata("y", Value::U8(2)).alignment(16);
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(
        f.metadata()[0],
        ("general.alignment".into(), Value::U32(16))
    );
    assert_eq!(f.metadata().len(), 2);
}

#[test]
fn output_is_deterministic_and_stable_under_rewrite() {
    let mut w = GgufWriter::new();
    for (k, v) in every_value() {
        w.metadata(k, v);
    }
    w.tensor("t", DType::Q8_0, &[32, 2], bytes(68, 3));
    let first = w.to_bytes();
    assert_eq!(first, w.to_bytes());
    let f = GgufFile::from_bytes(first.clone()).unwrap();
    assert_eq!(rewrite(&f).to_bytes(), first);
}

#[test]
#[should_panic(expected = "homogeneous")]
fn writer_rejects_mixed_arrays() {
    GgufWriter::new().metadata("m", Value::Array(vec![Value::U8(1), Value::I8(1)]));
}

#[test]
#[should_panic(expected = "takes 8 bytes")]
fn writer_rejects_wrong_data_length() {
    GgufWriter::new().tensor("t", DType::F32, &[2], vec![0; 7]);
}

fn array_of<S>(elem: S, wrap: fn(S::Value) -> Value) -> BoxedStrategy<Value>
where
    S: Strategy + 'static,
{
    vec(elem, 0..6)
        .prop_map(move |xs| Value::Array(xs.into_iter().map(wrap).collect()))
        .boxed()
}

fn leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        any::<u32>().prop_map(|b| Value::F32(f32::from_bits(b))),
        any::<bool>().prop_map(Value::Bool),
        ".{0,12}".prop_map(Value::Str),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        any::<u64>().prop_map(|b| Value::F64(f64::from_bits(b))),
    ]
    .boxed()
}

fn array() -> BoxedStrategy<Value> {
    let flat = prop_oneof![
        array_of(any::<u8>(), Value::U8),
        array_of(any::<i16>(), Value::I16),
        array_of(any::<u32>(), Value::U32),
        array_of(any::<u32>(), |b| Value::F32(f32::from_bits(b))),
        array_of(any::<bool>(), Value::Bool),
        array_of(".{0,6}", Value::Str),
        array_of(any::<i64>(), Value::I64),
        array_of(any::<u64>(), |b| Value::F64(f64::from_bits(b))),
    ];
    flat.prop_recursive(3, 24, 4, |inner| vec(inner, 0..4).prop_map(Value::Array))
        .boxed()
}

fn value() -> BoxedStrategy<Value> {
    prop_oneof![3 => leaf(), 1 => array()].boxed()
}

/// A tensor: dtype, ggml dims (ne0 a whole number of blocks, possibly 0), data seed.
fn tensor() -> impl Strategy<Value = (DType, Vec<u64>, u64)> {
    (
        0..DType::ALL.len(),
        0u64..4,
        vec(1u64..4, 0..4),
        any::<u64>(),
    )
        .prop_map(|(d, blocks, rest, seed)| {
            let dtype = DType::ALL[d];
            let mut dims = vec![blocks * dtype.block_len() as u64];
            dims.extend(rest);
            (dtype, dims, seed)
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        rng_seed: RngSeed::Fixed(0x6767_7566),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_files_round_trip(
        meta in btree_map("[a-z]{1,3}(\\.[a-z_]{1,6}){0,2}", value(), 0..10),
        tensors in vec(tensor(), 0..6),
        align_log2 in proptest::option::of(0u32..9),
    ) {
        let mut w = GgufWriter::new();
        for (k, v) in &meta {
            w.metadata(k, v.clone());
        }
        if let Some(l) = align_log2 {
            w.alignment(1 << l);
        }
        let mut want = Vec::new();
        for (i, (dtype, dims, seed)) in tensors.iter().enumerate() {
            let name = format!("blk.{i}.weight");
            let data = bytes(n_bytes(*dtype, dims), *seed);
            w.tensor(&name, *dtype, dims, data.clone());
            want.push((name, *dtype, dims.clone(), data));
        }
        let out = w.to_bytes();
        let f = GgufFile::from_bytes(out.clone()).unwrap();
        prop_assert_eq!(f.alignment(), align_log2.map_or(32, |l| 1 << l));
        for (k, v) in &meta {
            prop_assert!(same(f.get(k).unwrap(), v), "{}: {:?} vs {:?}", k, f.get(k), v);
        }
        prop_assert_eq!(f.metadata().len(), meta.len() + usize::from(align_log2.is_some()));
        prop_assert_eq!(f.tensors().len(), want.len());
        for (name, dtype, dims, data) in &want {
            let t: &TensorInfo = f.tensor(name).unwrap();
            prop_assert_eq!(t.dtype, *dtype);
            prop_assert_eq!(&t.dims, dims);
            prop_assert_eq!(t.offset % f.alignment() as u64, 0);
            prop_assert_eq!(f.tensor_data(t), data.as_slice());
            prop_assert!(f.weights(t).is_ok());
        }
        prop_assert_eq!(rewrite(&f).to_bytes(), out);
    }
}
