//! Loader for `shared/reference/quant-blocks.json`, the gguf-py test vectors of the weight
//! formats (see the README next to it). Shared by `quant_vectors.rs` and
//! `conformance.rs`. A missing or malformed file panics, so the tests that use it fail.

//!
//! Numbers are parsed with Rust's correctly rounded `str::parse::<f64>`: serde_json's
//! default float parser may be one f64 ulp off, which breaks bit-exact comparisons. The
//! text is first rewritten so that every JSON number becomes a JSON string ([`quote_numbers`]),
//! then serde_json parses the structure.

#![allow(dead_code)] // each test binary reads a different subset of the fields

use kvcore::backend::DType;
use serde_json::Value;

/// Path of the reference vectors, relative to the root crate.
const PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/reference/quant-blocks.json"
);

/// One synthetic case: 64 inputs, the bytes gguf-py quantised them to, and the values
/// those bytes decode to.
pub struct Synthetic {
    pub dtype: DType,
    pub case: String,
    pub input: Vec<f32>,
    pub bytes: Vec<u8>,
    pub values: Vec<f32>,
}

/// Rows of a real SmolLM2 tensor: stored bytes and decoded values of each row.
pub struct RealRows {
    pub tensor: String,
    pub dtype: DType,
    pub row_len: usize,
    pub bytes: Vec<Vec<u8>>,
    pub values: Vec<Vec<f32>>,
}

/// The parsed file.
pub struct QuantBlocks {
    pub synthetic: Vec<Synthetic>,
    pub real: Vec<RealRows>,
}

fn dtype(v: &Value) -> DType {
    let name = v.as_str().expect("type is a string");
    DType::ALL
        .into_iter()
        .find(|d| d.name() == name)
        .unwrap_or_else(|| panic!("unknown type {name}"))
}

fn hex(v: &Value) -> Vec<u8> {
    let s = v.as_str().expect("bytes are a hex string");
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// JSON numbers that are exact f32 values written in decimal.
fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("a list of numbers")
        .iter()
        .map(|x| {
            let f: f64 = number(x);
            let g = f as f32;
            assert_eq!(f64::from(g), f, "{f} is not an f32 value");
            g
        })
        .collect()
}

/// A JSON number that [`quote_numbers`] turned into a string, parsed exactly.
fn number<T: std::str::FromStr>(v: &Value) -> T {
    let s = v.as_str().expect("a quoted number");
    s.parse()
        .unwrap_or_else(|_| panic!("{s:?} is not a number"))
}

/// `json` with every number outside a string wrapped in quotes.
fn quote_numbers(json: &str) -> String {
    let mut out = String::with_capacity(json.len() * 5 / 4);
    let (mut in_string, mut escaped, mut in_number) = (false, false, false);
    for c in json.chars() {
        let numeric =
            !in_string && (c.is_ascii_digit() || c == '-' || (in_number && "+.eE".contains(c)));
        if in_number && !numeric {
            out.push('"');
            in_number = false;
        } else if !in_number && numeric {
            out.push('"');
            in_number = true;
        }
        if in_string {
            in_string = escaped || c != '"';
            escaped = !escaped && c == '\\';
        } else {
            in_string = c == '"';
        }
        out.push(c);
    }
    if in_number {
        out.push('"');
    }
    out
}

/// Load and parse the reference file.
pub fn load() -> QuantBlocks {
    let text = std::fs::read_to_string(PATH).unwrap_or_else(|e| panic!("{PATH}: {e}"));
    let json: Value = serde_json::from_str(&quote_numbers(&text)).expect("valid JSON");
    let synthetic = json["synthetic"]
        .as_array()
        .expect("synthetic list")
        .iter()
        .map(|c| Synthetic {
            dtype: dtype(&c["type"]),
            case: c["case"].as_str().expect("case name").to_owned(),
            input: floats(&c["input"]),
            bytes: hex(&c["bytes"]),
            values: floats(&c["values"]),
        })
        .collect();
    let real = json["smollm2_rows"]
        .as_array()
        .expect("smollm2_rows list")
        .iter()
        .map(|t| RealRows {
            tensor: t["tensor"].as_str().expect("tensor name").to_owned(),
            dtype: dtype(&t["type"]),
            row_len: number(&t["row_len"]),
            bytes: t["bytes"]
                .as_array()
                .expect("rows")
                .iter()
                .map(hex)
                .collect(),
            values: t["values"]
                .as_array()
                .expect("rows")
                .iter()
                .map(floats)
                .collect(),
        })
        .collect();
    QuantBlocks { synthetic, real }
}
