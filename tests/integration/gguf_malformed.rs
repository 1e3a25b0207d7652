//! The GGUF reader on malformed input: each case must fail with its own error variant,
//! and no input may make it panic.
//!
//! Files are made by [`GgufWriter`] and then patched at byte positions found by searching
//! for the length-prefixed key or tensor name, so each case changes exactly one field.

use crate::common::{put_u32, put_u64};
use kvcore::DType;
use kvcore::gguf::{GgufError, GgufFile, GgufWriter, Value};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngSeed};

const ARCH: &str = "general.architecture";
const KEY_U32: &str = "test.count";
const KEY_ARR: &str = "test.words";
const KEY_NESTED: &str = "test.nested";
const KEY_BOOL: &str = "test.flag";
const T0: &str = "tensor.zero"; // F32 [8, 2], 64 bytes
const T1: &str = "tensor.one"; // Q8_0 [32], 34 bytes (+30 padding)
const T2: &str = "tensor.two"; // F32 [8], 32 bytes: the file ends with its last byte

fn base_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.metadata(ARCH, Value::Str("llama".into()))
        .metadata(KEY_U32, Value::U32(7))
        .metadata(
            KEY_ARR,
            Value::Array(vec![Value::Str("ab".into()), Value::Str("cde".into())]),
        )
        .metadata(
            KEY_NESTED,
            Value::Array(vec![
                Value::Array(vec![Value::I16(-1), Value::I16(2)]),
                Value::Array(vec![Value::F64(0.5)]),
            ]),
        )
        .metadata(KEY_BOOL, Value::Bool(true));
    let f32s = |n: usize| {
        (0..n)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect::<Vec<u8>>()
    };
    w.tensor(T0, DType::F32, &[8, 2], f32s(16))
        .tensor(T1, DType::Q8_0, &[32], (0..34).collect())
        .tensor(T2, DType::F32, &[8], f32s(8));
    w
}

fn base() -> Vec<u8> {
    base_writer().to_bytes()
}

/// Position of the length prefix of the GGUF string `s` (which must occur exactly once).
fn str_at(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    let hits: Vec<usize> = bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle.as_slice())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hits.len(), 1, "string {s:?} occurs {} times", hits.len());
    hits[0]
}

/// Position of the type id that follows metadata key `key`.
fn key_type_at(bytes: &[u8], key: &str) -> usize {
    str_at(bytes, key) + 8 + key.len()
}

/// Field positions of one tensor info.
struct InfoAt {
    n_dims: usize,
    dims: usize,
    dtype: usize,
    offset: usize,
    end: usize,
}

fn info_at(bytes: &[u8], name: &str) -> InfoAt {
    let n_dims = str_at(bytes, name) + 8 + name.len();
    let nd = u32::from_le_bytes(bytes[n_dims..n_dims + 4].try_into().unwrap()) as usize;
    let dims = n_dims + 4;
    let dtype = dims + 8 * nd;
    InfoAt {
        n_dims,
        dims,
        dtype,
        offset: dtype + 4,
        end: dtype + 12,
    }
}

fn get64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

fn with_meta(key: &str, v: Value) -> Vec<u8> {
    let mut w = base_writer();
    w.metadata(key, v);
    w.to_bytes()
}

type Check<'a> = Box<dyn Fn(&GgufError) -> bool + 'a>;

macro_rules! case {
    ($name:expr, $bytes:expr, $pat:pat $(if $guard:expr)?) => {
        (
            $name,
            $bytes,
            Box::new(|e: &GgufError| matches!(e, $pat $(if $guard)?)) as Check<'_>,
        )
    };
}

#[test]
fn base_file_is_valid() {
    let f = GgufFile::from_bytes(base()).expect("base file parses");
    assert_eq!(f.metadata().len(), 5);
    assert_eq!(f.tensors().len(), 3);
    let b = base();
    assert_eq!(f.data_start() % 32, 0);
    let t2 = f.tensor(T2).unwrap();
    assert_eq!(f.data_start() + t2.offset as usize + t2.n_bytes, b.len());
}

#[test]
fn malformed_cases_give_their_error() {
    let b = base();
    let infos_start = str_at(&b, T0);
    let infos_end = info_at(&b, T2).end;
    let f = GgufFile::from_bytes(b.clone()).unwrap();
    let data_start = f.data_start();
    assert_ne!(
        infos_end % 32,
        0,
        "the base file needs padding after its infos"
    );
    let u32_type = key_type_at(&b, KEY_U32);
    let arr_type = key_type_at(&b, KEY_ARR);
    let arch_value = key_type_at(&b, ARCH) + 4;
    let bool_value = key_type_at(&b, KEY_BOOL) + 4;
    let t0 = info_at(&b, T0);
    let t1 = info_at(&b, T1);
    let t2 = info_at(&b, T2);

    let mut nested9 = Value::Array(vec![Value::U8(1)]);
    for _ in 0..8 {
        nested9 = Value::Array(vec![nested9]);
    }
    let mut nested8 = Value::Array(vec![Value::U8(1)]);
    for _ in 0..7 {
        nested8 = Value::Array(vec![nested8]);
    }
    assert!(GgufFile::from_bytes(with_meta("deep", nested8)).is_ok());

    let mut dup_tensor = base_writer();
    dup_tensor.tensor(T1, DType::F32, &[1], vec![0; 4]);
    let mut dup_key = base_writer();
    dup_key.metadata(KEY_BOOL, Value::Bool(false));

    let cases: Vec<(&str, Vec<u8>, Check<'_>)> = vec![
        case!("bad magic", {
            let mut x = b.clone();
            x[..4].copy_from_slice(b"GGUV");
            x
        }, GgufError::BadMagic { found } if found == b"GGUV"),
        case!(
            "version 1",
            put_u32(b.clone(), 4, 1),
            GgufError::UnsupportedVersion(1)
        ),
        case!(
            "version 4",
            put_u32(b.clone(), 4, 4),
            GgufError::UnsupportedVersion(4)
        ),
        case!(
            "big-endian version 3",
            put_u32(b.clone(), 4, 3u32.swap_bytes()),
            GgufError::UnsupportedVersion(0x0300_0000)
        ),
        case!(
            "empty file",
            Vec::new(),
            GgufError::Truncated {
                at: 0,
                need: 4,
                have: 0,
                what: "magic"
            }
        ),
        case!(
            "truncated in the header",
            b[..12].to_vec(),
            GgufError::Truncated {
                at: 8,
                need: 8,
                have: 4,
                what: "tensor count"
            }
        ),
        case!(
            "truncated after the header",
            b[..24].to_vec(),
            GgufError::CountTooLarge {
                at: 16,
                what: "metadata entry",
                count: 5,
                remaining: 0,
                ..
            }
        ),
        case!(
            "truncated inside a u32 value",
            b[..u32_type + 6].to_vec(),
            GgufError::Truncated {
                need: 4,
                have: 2,
                what: "u32 value",
                ..
            }
        ),
        case!(
            "truncated inside a key",
            b[..u32_type - 2].to_vec(),
            GgufError::CountTooLarge {
                at: 16,
                what: "metadata entry",
                count: 5,
                ..
            }
        ),
        case!(
            "truncated inside a tensor name",
            b[..str_at(&b, T2) + 8 + 3].to_vec(),
            GgufError::StringTooLong {
                len: 10,
                remaining: 3,
                ..
            }
        ),
        case!(
            "truncated after the metadata",
            b[..infos_start].to_vec(),
            GgufError::CountTooLarge {
                at: 8,
                what: "tensor info",
                count: 3,
                remaining: 0,
                ..
            }
        ),
        case!(
            "truncated inside a tensor info",
            b[..t1.dtype + 2].to_vec(),
            GgufError::Truncated {
                need: 4,
                have: 2,
                what: "tensor type",
                ..
            }
        ),
        case!(
            "truncated after the tensor infos",
            b[..infos_end].to_vec(),
            GgufError::Truncated {
                what: "padding before the tensor data",
                have: 0,
                ..
            }
        ),
        case!("truncated at the data section", b[..data_start].to_vec(),
            GgufError::TensorOutOfBounds { tensor, data_len: 0, .. } if tensor == T0),
        case!("truncated in the last tensor", b[..b.len() - 1].to_vec(),
            GgufError::TensorOutOfBounds { tensor, n_bytes: 32, .. } if tensor == T2),
        case!(
            "string length beyond the file",
            put_u64(b.clone(), arch_value, u64::MAX),
            GgufError::StringTooLong { len: u64::MAX, .. }
        ),
        case!(
            "key length beyond the file",
            put_u64(b.clone(), str_at(&b, KEY_U32), 1 << 40),
            GgufError::StringTooLong {
                len: 0x100_0000_0000,
                ..
            }
        ),
        case!(
            "metadata count beyond the file",
            put_u64(b.clone(), 16, 1 << 40),
            GgufError::CountTooLarge {
                at: 16,
                what: "metadata entry",
                ..
            }
        ),
        case!(
            "metadata count times entry size overflows",
            put_u64(b.clone(), 16, u64::MAX),
            GgufError::CountTooLarge {
                at: 16,
                count: u64::MAX,
                ..
            }
        ),
        case!(
            "tensor count beyond the file",
            put_u64(b.clone(), 8, u64::MAX / 2),
            GgufError::CountTooLarge {
                at: 8,
                what: "tensor info",
                ..
            }
        ),
        case!(
            "array count beyond the file",
            put_u64(b.clone(), arr_type + 8, u64::MAX),
            GgufError::CountTooLarge {
                what: "array element",
                count: u64::MAX,
                ..
            }
        ),
        case!("unknown value type", put_u32(b.clone(), u32_type, 13),
            GgufError::UnknownValueType { at, type_id: 13 } if *at == u32_type as u64),
        case!("unknown array element type", put_u32(b.clone(), arr_type + 4, 0xffff_ffff),
            GgufError::UnknownValueType { at, type_id: 0xffff_ffff } if *at == arr_type as u64 + 4),
        case!("invalid bool", {
            let mut x = b.clone();
            x[bool_value] = 2;
            x
        }, GgufError::InvalidBool { at, byte: 2 } if *at == bool_value as u64),
        case!("invalid UTF-8 key", {
            let mut x = b.clone();
            x[str_at(&b, KEY_U32) + 8 + 3] = 0xff;
            x
        }, GgufError::InvalidUtf8 { at } if *at == (str_at(&b, KEY_U32) + 8 + 3) as u64),
        case!("invalid UTF-8 tensor name", {
            let mut x = b.clone();
            x[str_at(&b, T1) + 8] = 0xc3; // a lead byte followed by ASCII
            x
        }, GgufError::InvalidUtf8 { at } if *at == (str_at(&b, T1) + 8) as u64),
        case!(
            "arrays nested too deep",
            with_meta("deep", nested9),
            GgufError::ArrayTooDeep { max: 8, .. }
        ),
        case!("duplicate key", dup_key.to_bytes(),
            GgufError::DuplicateKey(k) if k == KEY_BOOL),
        case!("duplicate tensor name", dup_tensor.to_bytes(),
            GgufError::DuplicateTensor(n) if n == T1),
        case!(
            "alignment zero",
            with_meta("general.alignment", Value::U32(0)),
            GgufError::BadAlignment(0)
        ),
        case!(
            "alignment not a power of two",
            with_meta("general.alignment", Value::U64(48)),
            GgufError::BadAlignment(48)
        ),
        case!(
            "alignment beyond usize",
            with_meta("general.alignment", Value::U64(u64::MAX)),
            GgufError::BadAlignment(u64::MAX)
        ),
        case!("alignment of a signed type", with_meta("general.alignment", Value::I32(32)),
            GgufError::WrongType { key, expected: "u32", found: "i32" } if key == "general.alignment"),
        case!(
            "alignment as a string",
            with_meta("general.alignment", Value::Str("32".into())),
            GgufError::WrongType {
                found: "string",
                ..
            }
        ),
        case!("too many dims", put_u32(b.clone(), t0.n_dims, 5),
            GgufError::TooManyDims { tensor, n_dims: 5 } if tensor == T0),
        case!(
            "n_dims u32::MAX",
            put_u32(b.clone(), t0.n_dims, u32::MAX),
            GgufError::TooManyDims {
                n_dims: u32::MAX,
                ..
            }
        ),
        case!("unknown tensor type", put_u32(b.clone(), t1.dtype, 99),
            GgufError::UnknownTensorType { tensor, type_id: 99 } if tensor == T1),
        case!(
            "removed ggml type slot",
            put_u32(b.clone(), t1.dtype, 4),
            GgufError::UnknownTensorType { type_id: 4, .. }
        ),
        case!("unsupported tensor type", put_u32(b.clone(), t1.dtype, 10),
            GgufError::UnsupportedTensorType { tensor, type_id: 10, type_name: "Q2_K" } if tensor == T1),
        case!("dims product overflows",
            put_u64(put_u64(b.clone(), t0.dims, 1 << 32), t0.dims + 8, 1 << 32),
            GgufError::DimsOverflow { tensor, .. } if tensor == T0),
        case!("byte size overflows", put_u64(b.clone(), t2.dims, u64::MAX),
            GgufError::DimsOverflow { tensor, dims } if tensor == T2 && dims == &[u64::MAX]),
        case!(
            "huge dims behind a zero dim",
            put_u64(put_u64(b.clone(), t0.dims, 0), t0.dims + 8, u64::MAX),
            GgufError::DimsOverflow { .. }
        ),
        case!("ne0 not a multiple of the block", put_u64(b.clone(), t1.dims, 16),
            GgufError::PartialBlock { tensor, dtype: DType::Q8_0, ne0: 16 } if tensor == T1),
        case!("tensor data out of bounds",
            put_u64(b.clone(), t2.offset, get64(&b, t2.offset) + 32),
            GgufError::TensorOutOfBounds { tensor, .. } if tensor == T2),
        case!("tensor offset + size overflows", put_u64(b.clone(), t2.offset, u64::MAX - 31),
            GgufError::TensorOutOfBounds { offset, .. } if *offset == u64::MAX - 31),
        case!("tensor larger than the data section", put_u64(b.clone(), t0.dims + 8, 1000),
            GgufError::TensorOutOfBounds { tensor, n_bytes: 32000, .. } if tensor == T0),
        case!("misaligned tensor offset",
            put_u64(b.clone(), t1.offset, get64(&b, t1.offset) + 1),
            GgufError::MisalignedTensor { tensor, alignment: 32, .. } if tensor == T1),
    ];
    let mut failures = Vec::new();
    for (name, bytes, check) in &cases {
        match GgufFile::from_bytes(bytes.clone()) {
            Err(e) if check(&e) => {
                // Every error renders a message.
                assert!(!e.to_string().is_empty());
            }
            Err(e) => failures.push(format!("{name}: wrong error {e:?}")),
            Ok(_) => failures.push(format!("{name}: parsed without error")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_prefix_is_an_error() {
    let b = base();
    for n in 0..b.len() {
        assert!(
            GgufFile::from_bytes(b[..n].to_vec()).is_err(),
            "prefix of {n} of {} bytes parsed",
            b.len()
        );
    }
}

#[test]
fn every_single_byte_corruption_is_handled() {
    // Not every flipped byte is an error (a flipped value byte is a different value), but
    // none may panic, and any file that parses must still hand out in-bounds tensors.
    let b = base();
    for i in 0..b.len() {
        for x in [0x01, 0x80, 0xff] {
            let mut c = b.clone();
            c[i] ^= x;
            if let Ok(f) = GgufFile::from_bytes(c) {
                for t in f.tensors() {
                    assert_eq!(f.tensor_data(t).len(), t.n_bytes);
                    f.weights(t).expect("validated tensor is a matrix");
                }
            }
        }
    }
}

#[test]
fn accepted_edge_cases() {
    // Zero tensors, zero metadata: the header and nothing else.
    let empty = GgufWriter::new().to_bytes();
    assert_eq!(empty.len(), 32);
    let f = GgufFile::from_bytes(empty).unwrap();
    assert!(f.tensors().is_empty() && f.metadata().is_empty());
    // Version 2 reads the same layout.
    let f = GgufFile::from_bytes(put_u32(base(), 4, 2)).unwrap();
    assert_eq!(f.version(), 2);
    // An empty tensor (a zero dim) is allowed, with any other dims.
    let mut w = GgufWriter::new();
    w.tensor("empty", DType::Q4_0, &[0, 1 << 40], Vec::new());
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let t = f.tensor("empty").unwrap();
    assert_eq!((t.n_bytes, f.tensor_data(t).len()), (0, 0));
    let wts = f.weights(t).unwrap();
    assert_eq!((wts.rows(), wts.cols()), (1 << 40, 0));
    // A u64 alignment is accepted too.
    let mut w = GgufWriter::new();
    w.metadata("general.alignment", Value::U64(32));
    assert_eq!(GgufFile::from_bytes(w.to_bytes()).unwrap().alignment(), 32);
}

proptest! {
    #![proptest_config(Config {
        cases: 1024,
        rng_seed: RngSeed::Fixed(0x6767_7566),
        ..Config::default()
    })]

    /// Random overwrites and truncation of a valid file: never a panic, and a file that
    /// still parses hands out tensor data that matches its infos.
    #[test]
    fn random_corruption_never_panics(
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        keep in any::<Index>(),
    ) {
        let mut b = base();
        for (at, byte) in edits {
            let n = b.len();
            b[at % n] = byte;
        }
        b.truncate(keep.index(b.len() + 1));
        if let Ok(f) = GgufFile::from_bytes(b) {
            for t in f.tensors() {
                prop_assert_eq!(f.tensor_data(t).len(), t.n_bytes);
                prop_assert!(f.weights(t).is_ok());
                prop_assert_eq!(t.offset % f.alignment() as u64, 0);
            }
        }
    }
}
