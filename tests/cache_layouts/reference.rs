//! Independent reference (docs/fp8.md §1 format table, docs/fp8.md §3 scales, docs/fp8.md §5 offsets).

use super::*;

/// One FP8 flavour from the format table of docs/fp8.md §1: code values from the fields,
/// round to the nearest code (ties to the even code), saturate at max.
pub(crate) struct Fp8Ref {
    pub(crate) fnuz: bool,
    pub(crate) max: f64,
    /// Values of the non-negative finite codes 0..=max code, indexed by code.
    pub(crate) values: Vec<f64>,
    /// Where the code after max would sit: the top binade's step past max.
    pub(crate) beyond_max: f64,
}

impl Fp8Ref {
    pub(crate) fn new(fmt: Fp8Format) -> Self {
        // (bias, max code, fnuz): E4M3FN bias 7, max 0x7E = 448; FNUZ bias 8,
        // max 0x7F = 240.
        let (bias, max_code, fnuz) = match fmt {
            E4m3Fn => (7, 0x7E, false),
            E4m3Fnuz => (8, 0x7F, true),
        };
        let values: Vec<f64> = (0..=max_code)
            .map(|c: u8| {
                let (e, m) = (i32::from(c >> 3), f64::from(c & 7));
                if e == 0 {
                    m / 8.0 * 2f64.powi(1 - bias)
                } else {
                    (1.0 + m / 8.0) * 2f64.powi(e - bias)
                }
            })
            .collect();
        let max = values[usize::from(max_code)];
        assert_eq!(max, if fnuz { 240.0 } else { 448.0 });
        Fp8Ref {
            fnuz,
            max,
            beyond_max: max + (max - values[usize::from(max_code) - 1]),
            values,
        }
    }

    /// The value of a finite code.
    pub(crate) fn value(&self, code: u8) -> f64 {
        assert!(!(self.fnuz && code == 0x80), "fnuz NaN code");
        let magnitude = self.values[usize::from(code & 0x7F)];
        if code & 0x80 != 0 {
            -magnitude
        } else {
            magnitude
        }
    }

    /// The code nearest to the finite `x`, ties to the even code, saturating;
    /// a zero result is 0x00 under fnuz (0x80 is its NaN), signed under fn.
    pub(crate) fn encode(&self, x: f64) -> u8 {
        let mag = x.abs();
        let code = if mag >= self.max {
            self.values.len() - 1
        } else {
            let above = self.values.partition_point(|v| *v < mag);
            if above == 0 || self.values[above] == mag {
                above
            } else {
                let below_gap = mag - self.values[above - 1];
                let above_gap = self.values[above] - mag;
                if below_gap < above_gap || (below_gap == above_gap && above % 2 == 1) {
                    above - 1
                } else {
                    above
                }
            }
        } as u8;
        match (code, x.is_sign_negative()) {
            (0, _) if self.fnuz => 0,
            (c, true) => 0x80 | c,
            (c, false) => c,
        }
    }

    /// Half the gap between the codes around magnitude `mag`: the largest
    /// error of rounding to nearest there.
    pub(crate) fn half_step(&self, mag: f64) -> f64 {
        let above = self.values.partition_point(|v| *v < mag);
        if above == 0 {
            0.0
        } else if above == self.values.len() {
            (self.beyond_max - self.max) / 2.0
        } else {
            (self.values[above] - self.values[above - 1]) / 2.0
        }
    }

    /// The fp32 scale quotient `max(amax, 1e-4) / max`: the float64 quotient of
    /// two floats rounded to f32 is the correctly rounded fp32 quotient.
    pub(crate) fn scale_quotient(&self, amax: f32) -> f32 {
        let floored = if amax > 1e-4 { amax } else { 1e-4f32 };
        (f64::from(floored) / self.max) as f32
    }

    /// The UE8M0 byte: 127 + the smallest k with 2^k >= the fp32 quotient.
    pub(crate) fn scale_byte(&self, amax: f32) -> u8 {
        let q = f64::from(self.scale_quotient(amax));
        let mut k = -127i32;
        while 2f64.powi(k) < q {
            k += 1;
        }
        (k + 127) as u8
    }
}

/// docs/fp8.md §5: `bytes_per_page = ceil(584·P / 576)·576`; value slots of 576 bytes,
/// then scale slots of 8. Returns (value offset, scale offset) of `loc`.
pub(crate) fn ref_flashmla_offsets(p: u64, loc: u64) -> (u64, u64) {
    let bytes_per_page = (584 * p).div_ceil(576) * 576;
    let (page, slot) = (loc / p, loc % p);
    (
        page * bytes_per_page + slot * 576,
        page * bytes_per_page + 576 * p + slot * 8,
    )
}

/// docs/fp8.md §6: pages of 132·P bytes, 128 codes per key, then fp32 scales.
/// Returns (value offset, scale offset) of `loc`.
pub(crate) fn ref_indexer_offsets(p: u64, loc: u64) -> (u64, u64) {
    let (page, slot) = (loc / p, loc % p);
    (
        page * 132 * p + slot * 128,
        page * 132 * p + 128 * p + slot * 4,
    )
}

/// docs/fp8.md §3, §5 for one token: per 64-dim nope tile the UE8M0 byte of its
/// amax and codes of x / 2^(byte-127); the RoPE dims' bf16 bits little-endian.
/// Returns (576 value-slot bytes, 7 scale bytes).
pub(crate) fn ref_flashmla_token(row: &[bf16], f: &Fp8Ref) -> (Vec<u8>, Vec<u8>) {
    let mut value = Vec::with_capacity(576);
    let mut scales = Vec::with_capacity(7);
    for tile in row[..448].chunks(64) {
        let amax = tile.iter().map(|x| x.to_f32().abs()).fold(0.0, f32::max);
        let byte = f.scale_byte(amax);
        let scale = 2f64.powi(i32::from(byte) - 127);
        value.extend(tile.iter().map(|x| f.encode(f64::from(x.to_f32()) / scale)));
        scales.push(byte);
    }
    for x in &row[448..] {
        value.extend(x.to_bits().to_le_bytes());
    }
    (value, scales)
}

/// docs/fp8.md §3 for one indexer key, each fp32 operation done in float64 and
/// rounded to f32 (exact for a quotient, reciprocal or product of two floats):
/// scale = max(amax, 1e-4) / max, inv = 1 / scale, code = fp8(fp32(x · inv)).
/// Returns (codes, scale, the fp32 values x · inv that were encoded).
pub(crate) fn ref_indexer_key(key: &[f32], f: &Fp8Ref) -> (Vec<u8>, f32, Vec<f32>) {
    let amax = key.iter().map(|x| x.abs()).fold(0.0, f32::max);
    let scale = f.scale_quotient(amax);
    let inv = (1.0 / f64::from(scale)) as f32;
    let scaled: Vec<f32> = key
        .iter()
        .map(|&x| (f64::from(x) * f64::from(inv)) as f32)
        .collect();
    let codes = scaled.iter().map(|&y| f.encode(f64::from(y))).collect();
    (codes, scale, scaled)
}
