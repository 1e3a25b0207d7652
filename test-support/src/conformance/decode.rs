//! An independent float64 decoder of the weight formats, for the oracle: scales and
//! quants are read and multiplied in f64 (`d·q` is exact there), and each weight is
//! rounded once to f32 as the format defines. It shares no code with `kvcore_scalar`;
//! the K-format layouts follow the `formats` text of `shared/reference/quant-blocks-k.json`
//! (the block scales `d·sc`, `dmin·m` and `d·scale` are exact in f32 as in f64, so a
//! kernel that forms them first rounds no differently).

use half::{bf16, f16};
use kvcore::backend::{DType, QK, QK_K};

/// One decoded weight: its exact value and the magnitude of the terms that make it.
#[derive(Clone, Copy, Debug)]
pub struct Decoded {
    /// The weight as the format defines it (an f32 value, held in f64).
    pub value: f64,
    /// `|d·q| + |m|` for `Q4_1` (a kernel may expand `Σ(d·q_j + m)·x_j` as
    /// `d·Σq_j·x_j + m·Σx_j`, whose rounding scales with both parts), likewise
    /// `|d·sc·q| + |dmin·m|` for `Q4_K`, `|value|` otherwise.
    pub mag: f64,
}

/// Decode `cols` weights of `dtype` from `bytes`.
///
/// # Panics
/// If `bytes` does not hold exactly `cols` weights.
pub fn decode(dtype: DType, bytes: &[u8], cols: usize) -> Vec<Decoded> {
    let plain = |value: f64| Decoded {
        value,
        mag: value.abs(),
    };
    let f16_at = |b: &[u8], at: usize| f64::from(f16::from_le_bytes([b[at], b[at + 1]]));
    let nibble = |qs: &[u8], j: usize| {
        if j < QK / 2 {
            qs[j] & 15
        } else {
            qs[j - QK / 2] >> 4
        }
    };
    let blocks = bytes.chunks_exact(dtype.block_bytes());
    let out: Vec<Decoded> = match dtype {
        DType::F32 => blocks
            .map(|b| plain(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))))
            .collect(),
        DType::F16 => blocks.map(|b| plain(f16_at(b, 0))).collect(),
        DType::BF16 => blocks
            .map(|b| plain(f64::from(bf16::from_le_bytes([b[0], b[1]]))))
            .collect(),
        DType::Q8_0 => blocks
            .flat_map(|b| {
                let d = f16_at(b, 0);
                (0..QK).map(move |j| plain(f64::from((d * f64::from(b[2 + j] as i8)) as f32)))
            })
            .collect(),
        DType::Q4_0 => blocks
            .flat_map(|b| {
                let d = f16_at(b, 0);
                (0..QK).map(move |j| {
                    let q = f64::from(nibble(&b[2..], j)) - 8.0;
                    plain(f64::from((d * q) as f32))
                })
            })
            .collect(),
        DType::Q4_1 => blocks
            .flat_map(|b| {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                (0..QK).map(move |j| {
                    let dq = d * f64::from(nibble(&b[4..], j));
                    Decoded {
                        value: f64::from((dq + m) as f32),
                        mag: dq.abs() + m.abs(),
                    }
                })
            })
            .collect(),
        DType::Q5_0 => blocks
            .flat_map(|b| {
                let d = f16_at(b, 0);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                (0..QK).map(move |j| {
                    let q = nibble(&b[6..], j) | (((qh >> j) & 1) as u8) << 4;
                    plain(f64::from((d * (f64::from(q) - 16.0)) as f32))
                })
            })
            .collect(),
        DType::Q4_K => blocks
            .flat_map(|b| {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let sc = |s: usize| &b[4 + s];
                (0..QK_K).map(move |i| {
                    let s = i / 32;
                    let (scale, min) = if s < 4 {
                        (sc(s) & 63, sc(s + 4) & 63)
                    } else {
                        (
                            (sc(s + 4) & 15) | (sc(s - 4) >> 6) << 4,
                            (sc(s + 4) >> 4) | (sc(s) >> 6) << 4,
                        )
                    };
                    let byte = b[16 + 32 * (s / 2) + i % 32];
                    let q = if s % 2 == 0 { byte & 15 } else { byte >> 4 };
                    let dq = d * f64::from(scale) * f64::from(q);
                    let m = dmin * f64::from(min);
                    Decoded {
                        value: f64::from((dq - m) as f32),
                        mag: dq.abs() + m.abs(),
                    }
                })
            })
            .collect(),
        DType::Q6_K => blocks
            .flat_map(|b| {
                let d = f16_at(b, 208);
                (0..QK_K).map(move |i| {
                    let (n, k, l) = (i / 128, i % 128 / 32, i % 32);
                    let low = b[64 * n + l + 32 * (k % 2)];
                    let low = if k < 2 { low & 15 } else { low >> 4 };
                    let high = (b[128 + 32 * n + l] >> (2 * k)) & 3;
                    let q = f64::from(low | high << 4) - 32.0;
                    let scale = f64::from(b[192 + i / 16] as i8);
                    plain(f64::from((d * scale * q) as f32))
                })
            })
            .collect(),
        other => panic!("the oracle has no decoder for {other}"),
    };
    assert_eq!(out.len(), cols, "decode: byte count does not match cols");
    out
}

/// `(Σ w_j·x_j, Σ mag_j·|x_j|)` in f64: the exact dot product (to f64 accuracy) and the
/// sum of the absolute terms that scales its rounding error.
pub fn dot_f64(w: &[Decoded], x: &[f32]) -> (f64, f64) {
    w.iter().zip(x).fold((0.0, 0.0), |(s, a), (w, &x)| {
        let x = f64::from(x);
        (s + w.value * x, a + w.mag * x.abs())
    })
}
