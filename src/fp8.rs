//! FP8 E4M3 codec (e4m3fn and e4m3fnuz) and UE8M0 power-of-two block scales
//! (docs/fp8.md §2).
//!
//! The CPU backend and the tests use this codec; the device codec in
//! `kernels/fp8.cuh` and the hardware `cvt.rn.satfinite` conversion must agree
//! with it bit for bit, so every function here is integer bit manipulation or a
//! single correctly rounded fp32 operation, never a library call whose rounding
//! could differ between host and device.

use half::bf16;

/// An FP8 E4M3 flavour. Always explicit, never implied by the platform: the same
/// byte decodes to values a factor 2 apart in the two flavours, so writer and
/// reader of a pool must agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// OCP E4M3FN (NVIDIA; AMD gfx950, gfx12): bias 7, max 448 (0x7E), NaN 0x7F
    /// and 0xFF, signed zero.
    E4m3Fn,
    /// E4M3FNUZ (AMD gfx942): bias 8, max 240 (0x7F), one NaN (0x80), no
    /// negative zero.
    E4m3Fnuz,
}

impl Fp8Format {
    /// Largest finite value: both the saturation bound and the UE8M0 scale
    /// divisor. For fnuz it is the format's true max, 240, not the 224 of
    /// sglang's HIP C++ kernels, so fnuz pools are not byte-compatible with pools
    /// those kernels write (docs/fp8.md §1).
    pub fn max(self) -> f32 {
        match self {
            Fp8Format::E4m3Fn => 448.0,
            Fp8Format::E4m3Fnuz => 240.0,
        }
    }

    /// The code every NaN encodes to, whatever its sign or payload: 0x7F for fn
    /// (0xFF also decodes as NaN but is never produced), 0x80 for fnuz.
    pub fn nan_code(self) -> u8 {
        match self {
            Fp8Format::E4m3Fn => 0x7F,
            Fp8Format::E4m3Fnuz => 0x80,
        }
    }

    fn bias(self) -> i32 {
        match self {
            Fp8Format::E4m3Fn => 7,
            Fp8Format::E4m3Fnuz => 8,
        }
    }

    /// Magnitude bits (code without the sign) of `max()`.
    fn max_code(self) -> u32 {
        match self {
            Fp8Format::E4m3Fn => 0x7E,
            Fp8Format::E4m3Fnuz => 0x7F,
        }
    }

    fn is_nan_code(self, code: u8) -> bool {
        match self {
            Fp8Format::E4m3Fn => code & 0x7F == 0x7F,
            Fp8Format::E4m3Fnuz => code == 0x80,
        }
    }
}

/// The floor on a tile's amax before the scale division (CUDA kernels' eps,
/// docs/fp8.md §3): an all-zero tile gets a finite scale (byte 105 for fn, 106 for fnuz).
pub const AMAX_FLOOR: f32 = 1e-4;

/// Encodes `x` with round-to-nearest-even; finite overflow and ±Inf saturate
/// to ±max, and every NaN, whatever its sign, becomes `fmt.nan_code()`. For fn
/// this is bit for bit what `cvt.rn.satfinite.e4m3x2.f32` gives (an H200 agrees
/// on all 2^32 inputs; the hardware drops a NaN's sign), so a kernel may use
/// either. Under fnuz, zero results (including -0 and negative underflow) are
/// 0x00, since 0x80 is NaN.
pub fn encode(x: f32, fmt: Fp8Format) -> u8 {
    if x.is_nan() {
        return fmt.nan_code();
    }
    let bits = x.to_bits();
    let sign = ((bits >> 31) as u8) << 7;
    let magnitude = round_magnitude(bits & 0x7FFF_FFFF, fmt).min(fmt.max_code()) as u8;
    match fmt {
        Fp8Format::E4m3Fnuz if magnitude == 0 => 0,
        _ => sign | magnitude,
    }
}

/// The FP8 magnitude bits nearest (ties to even) to the non-NaN f32 magnitude
/// `abs_bits`, before saturation: the result exceeds the max code for values
/// past the max, and Inf lands there too.
///
/// The 24-bit significand is shifted right so that one unit of what is kept is
/// one FP8 mantissa step: 20 bits dropped for normal results, one more per
/// binade below the smallest normal. Normal results add the exponent on top of
/// the kept `1.mmm`, so a rounding carry moves into the exponent by itself.
fn round_magnitude(abs_bits: u32, fmt: Fp8Format) -> u32 {
    let exp = (abs_bits >> 23) as i32;
    let implicit = if exp > 0 { 1 << 23 } else { 0 };
    let significand = (abs_bits & 0x7F_FFFF) | implicit;
    // FP8 biased exponent the value would have as a normal number.
    let e8 = exp - 127 + fmt.bias();
    let shift = 20 + (1 - e8).max(0);
    if shift > 24 {
        // Below half the smallest FP8 subnormal (every f32 subnormal too).
        return 0;
    }
    let kept = significand >> shift;
    let rest = significand & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let round_up = rest > half || (rest == half && kept & 1 == 1);
    let exponent_base = ((e8 - 1).max(0) as u32) << 3;
    exponent_base + kept + round_up as u32
}

/// The value of an FP8 code; NaN codes give `f32::NAN` (bits 0x7FC00000 on the
/// device too). Every finite code is exact in f32.
pub fn decode(code: u8, fmt: Fp8Format) -> f32 {
    if fmt.is_nan_code(code) {
        return f32::NAN;
    }
    let exp_field = i32::from((code >> 3) & 0xF);
    let mantissa = u32::from(code & 0x7);
    // Subnormals share the smallest normal's exponent, without the implicit 1.
    let (significand, exp) = if exp_field == 0 {
        (mantissa, 1)
    } else {
        (8 + mantissa, exp_field)
    };
    let magnitude = significand as f32 * pow2(exp - fmt.bias() - 3);
    if code & 0x80 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// 2^k for a k with a normal f32 result, built from its exponent bits.
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// The UE8M0 byte of a tile whose largest magnitude is `amax`: `e` such that
/// 2^(e-127) is `max(amax, 1e-4) / fmt.max()` rounded up to a power of two.
///
/// The division is an fp32 division, as in the production CUDA kernels (docs/fp8.md §3 reports
/// a port that multiplies by fp32(1/max) instead). The round-up reads the
/// quotient's exponent bits (plus one when any mantissa bit is set) instead of
/// `ceil(log2)`, whose approximation misses exact powers of two (docs/fp8.md §3). The
/// byte is clamped to 254 (255 would be the E8M0 NaN); it can reach 254 only
/// from amax = Inf, and the 1e-4 floor keeps it at 105 or above. A NaN amax
/// counts as 0, like the NaN-ignoring max that produces it.
pub fn ue8m0_scale_byte(amax: f32, fmt: Fp8Format) -> u8 {
    let scale = amax.max(AMAX_FLOOR) / fmt.max();
    let bits = scale.to_bits();
    let round_up = u32::from(bits & 0x7F_FFFF != 0);
    ((bits >> 23) + round_up).min(254) as u8
}

/// The scale 2^(byte-127) of a UE8M0 byte: 0 gives the subnormal 2^-127 and
/// 255 is NaN, as in OCP E8M0 (neither is produced by `ue8m0_scale_byte`).
pub fn ue8m0_to_f32(byte: u8) -> f32 {
    match byte {
        0 => f32::from_bits(1 << 22),
        255 => f32::NAN,
        b => f32::from_bits(u32::from(b) << 23),
    }
}

/// `x` rounded to the nearest bf16 (ties to even) and widened back: the values
/// FP8 tiles are quantized from (the store path receives bf16 rows).
pub fn bf16_round(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// Quantizes one tile of bf16-representable values into `out_codes` and returns
/// its UE8M0 scale byte: amax is the NaN-ignoring max of |v|, and each code is
/// `encode(v / scale)`.
///
/// Divide or multiply by the inverse (the CUDA kernels multiply by 2^(127-e) built
/// from exponent bits): the scale is an exact power of two, so `v / scale` and
/// `v * 2^(127-e)` are the same correctly rounded real and bit-identical
/// whenever 2^(127-e) is exact. It is exact and normal for every byte a finite
/// amax gives (e <= 248). At e = 254 (an Inf in the tile) the kernels'
/// exponent-bit inverse is 0.0 rather than 2^-127, and Inf * 0 is NaN; dividing
/// keeps Inf saturating to max. So this divides, and the device must divide too
/// or multiply by an exact inverse (not flushed to zero).
///
/// There is no explicit clip before encoding: `encode` saturates, and a clip
/// with `fminf` would turn NaN into max instead of NaN.
pub fn quantize_block(values: &[f32], fmt: Fp8Format, out_codes: &mut [u8]) -> u8 {
    assert_eq!(values.len(), out_codes.len(), "one code per value");
    debug_assert!(
        values.iter().all(|v| v.is_nan() || bf16_round(*v) == *v),
        "quantize_block takes bf16-rounded values"
    );
    let amax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let byte = ue8m0_scale_byte(amax, fmt);
    let scale = ue8m0_to_f32(byte);
    for (code, v) in out_codes.iter_mut().zip(values) {
        *code = encode(v / scale, fmt);
    }
    byte
}

/// Quantizes a group of values with a plain fp32 scale (docs/fp8.md §3) into
/// `out_codes` and returns the scale: `amax` is the NaN-ignoring max of |v|,
/// `scale = max(amax, 1e-4) / divisor` (IEEE division), `inv = 1 / scale`
/// (correctly rounded reciprocal) and each code is `encode(v * inv)` (one fp32
/// product, then round-to-nearest-even with saturation). `divisor` is the FP8
/// maximum the writer divides by: `fmt.max()`, or 224 as sglang's HIP C++
/// kernels use for e4m3fnuz; it is at most `fmt.max()`, so `|v * inv|` stays
/// within half a code step of `divisor` and no clip before encoding is needed.
/// A device port must round the same way: IEEE division and reciprocal, not
/// the fast approximations. An infinite element makes the scale Inf and `inv`
/// 0, so that element encodes to NaN (Inf · 0) and the others to zero.
pub fn quantize_fp32_scale(
    values: &[f32],
    fmt: Fp8Format,
    divisor: f32,
    out_codes: &mut [u8],
) -> f32 {
    assert_eq!(values.len(), out_codes.len(), "one code per value");
    debug_assert!(divisor > 0.0 && divisor <= fmt.max());
    let amax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = amax.max(AMAX_FLOOR) / divisor;
    let inv = 1.0 / scale;
    for (code, v) in out_codes.iter_mut().zip(values) {
        *code = encode(v * inv, fmt);
    }
    scale
}
