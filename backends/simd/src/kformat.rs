//! The weight formats each architecture's `kquant.rs` decodes and multiplies on its own
//! (5-bit quants or 256-weight super-blocks): one enum for all of them, each file adding
//! its decoder to it in its own `impl Format` block.

use kvcore::backend::DType;

/// `Q5_0`, `Q4_K` or `Q6_K`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types, reason = "the ggml names of the formats")]
pub(crate) enum Format {
    Q5_0,
    Q4_K,
    Q6_K,
}

impl Format {
    /// The format of `dtype`, if a `kquant.rs` decodes it.
    pub(crate) fn of(dtype: DType) -> Option<Format> {
        match dtype {
            DType::Q5_0 => Some(Format::Q5_0),
            DType::Q4_K => Some(Format::Q4_K),
            DType::Q6_K => Some(Format::Q6_K),
            _ => None,
        }
    }

    /// The format's `DType`.
    pub(crate) fn dtype(self) -> DType {
        match self {
            Format::Q5_0 => DType::Q5_0,
            Format::Q4_K => DType::Q4_K,
            Format::Q6_K => DType::Q6_K,
        }
    }
}
