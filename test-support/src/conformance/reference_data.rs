//! The reference data the suite reads: `quant-blocks.json`, the gguf-py test vectors of
//! the weight formats, and `quant-blocks-k.json`, real Gemma 3 rows of the formats its
//! Q4_K_M file adds (see the README next to them in kvcore's `shared/reference`), loaded
//! by [`load`] and [`load_gemma3_rows`].
//!
//! The directory is `$KVCORE_REFERENCE` when that is set (a backend outside kvcore's
//! repository points it at a copy), else kvcore's `shared/reference` beside the
//! repository (found from this crate's manifest directory). A missing or malformed file
//! panics with the path and the variable, so the tests that use it fail: they are never
//! skipped.
//!
//! Numbers are parsed with Rust's correctly rounded `str::parse::<f64>`: serde_json's
//! default float parser may be one f64 ulp off, which breaks bit-exact comparisons. The
//! text is first rewritten so that every JSON number becomes a JSON string
//! (`quote_numbers`), then serde_json parses the structure.

use std::path::{Path, PathBuf};

use kvcore::backend::DType;
use serde_json::Value;

/// The environment variable naming the reference data directory.
pub const REFERENCE_VAR: &str = "KVCORE_REFERENCE";

/// The file of the weight-format vectors, in the reference directory.
pub const QUANT_BLOCKS: &str = "quant-blocks.json";

/// The file of the real Gemma 3 rows (`Q5_0`, `Q4_K`, `Q6_K`, `Q8_0`), in the reference
/// directory.
pub const QUANT_BLOCKS_K: &str = "quant-blocks-k.json";

/// The reference data directory: `$KVCORE_REFERENCE` when set and not empty, else
/// `shared/reference` next to kvcore's repository (`<repo>/../shared/reference`).
pub fn dir() -> PathBuf {
    from_env().unwrap_or_else(default_dir)
}

/// `$KVCORE_REFERENCE`, unless unset or empty.
fn from_env() -> Option<PathBuf> {
    std::env::var_os(REFERENCE_VAR)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}

/// `<repo>/../shared/reference`, `<repo>` being the parent of this crate's directory.
fn default_dir() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate lies in the repository");
    repo.parent()
        .unwrap_or(repo)
        .join("shared")
        .join("reference")
}

/// One synthetic case: 64 inputs, the bytes gguf-py quantised them to, and the values
/// those bytes decode to.
pub struct Synthetic {
    /// The format.
    pub dtype: DType,
    /// What the inputs exercise (the file's case name).
    pub case: String,
    /// The values gguf-py quantised.
    pub input: Vec<f32>,
    /// The stored blocks gguf-py wrote.
    pub bytes: Vec<u8>,
    /// The values those blocks decode to.
    pub values: Vec<f32>,
}

/// Rows of a real SmolLM2 or Gemma 3 tensor: stored bytes and decoded values of each row.
pub struct RealRows {
    /// The tensor's name in the GGUF file.
    pub tensor: String,
    /// Its stored format.
    pub dtype: DType,
    /// Elements per row.
    pub row_len: usize,
    /// The stored bytes of each row.
    pub bytes: Vec<Vec<u8>>,
    /// The decoded values of each row.
    pub values: Vec<Vec<f32>>,
}

impl RealRows {
    /// Asserts that the scalar reference decodes every row to the stored values bit for
    /// bit.
    pub fn assert_scalar_decodes_bitwise(&self) {
        for (i, (bytes, values)) in self.bytes.iter().zip(&self.values).enumerate() {
            assert_eq!(values.len(), self.row_len);
            let w = kvcore::Weights::new(self.dtype, 1, self.row_len, bytes).expect("whole blocks");
            let mut out = vec![f32::NAN; self.row_len];
            kvcore_scalar::quant::dequantize_row(&w, 0, &mut out);
            assert_eq!(
                super::oracle::bits(&out),
                super::oracle::bits(values),
                "{} row {i}",
                self.tensor
            );
        }
    }
}

/// The parsed `quant-blocks.json`.
pub struct QuantBlocks {
    /// gguf-py's synthetic cases, five per block format.
    pub synthetic: Vec<Synthetic>,
    /// Rows of real SmolLM2 tensors.
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

/// Read and parse `file` from [`dir`].
///
/// # Panics
/// If the file cannot be read or is malformed; the message names the path and
/// `$KVCORE_REFERENCE`.
fn read(file: &str) -> Value {
    let path = dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        let which = match from_env() {
            Some(_) => format!("the one {REFERENCE_VAR} names"),
            None => format!("the default, as {REFERENCE_VAR} is not set"),
        };
        panic!(
            "cannot read the reference data {} ({e}); the directory is {which}. Set \
             {REFERENCE_VAR} to a directory holding a copy of kvcore's shared/reference.",
            path.display()
        )
    });
    serde_json::from_str(&quote_numbers(&text))
        .unwrap_or_else(|e| panic!("{}: not valid JSON: {e}", path.display()))
}

/// The real-rows list `v` (`smollm2_rows`, `gemma3_rows`).
fn real_rows(v: &Value) -> Vec<RealRows> {
    v.as_array()
        .expect("a list of tensors")
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
        .collect()
}

/// Load and parse `quant-blocks.json` from [`dir`].
///
/// # Panics
/// If the file cannot be read or is malformed; the message names the path and
/// `$KVCORE_REFERENCE`.
pub fn load() -> QuantBlocks {
    let json = read(QUANT_BLOCKS);
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
    let real = real_rows(&json["smollm2_rows"]);
    QuantBlocks { synthetic, real }
}

/// Load the real Gemma 3 rows of `quant-blocks-k.json` from [`dir`].
///
/// # Panics
/// As [`load`].
pub fn load_gemma3_rows() -> Vec<RealRows> {
    real_rows(&read(QUANT_BLOCKS_K)["gemma3_rows"])
}
