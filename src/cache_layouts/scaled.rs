//! Scaled FP8 rows (docs/fp8.md §8): the single-buffer FP8 layout of the
//! unified-pool kernels of sglang / ATOM (`kv_scales`), two parallel tensors
//! with one row per key:
//!
//! ```text
//! codes  [rows, 512] : the 512 latent dims as FP8 codes (e4m3fn, or e4m3fnuz on AMD gfx942)
//! scales [rows, 8]   : fp32, scale k multiplies the codes of dims 64k..64k+63
//! ```
//!
//! Unlike the FlashMLA layout and the unified pool's FP8 rows, every dim is
//! quantized (the RoPE dims too) and a scale may be any fp32 value, not only a
//! power of two, so a dequantized value is rounded: the reader's value is
//! `bf16(decode(code) · scale)`, the f32 product rounded to the nearest bf16
//! (the precision of the attention kernels' key tiles).

use half::bf16;

use crate::error::{ensure, Result};
use crate::fp8::{self, Fp8Format};

/// Codes per row: every dim of the 512-value latent.
pub const ROW_DIMS: usize = 512;
/// Dims per fp32 scale.
pub const TILE_DIMS: usize = 64;
/// Scales per row.
pub const SCALES_PER_ROW: usize = ROW_DIMS / TILE_DIMS;
/// The scale divisors a store accepts besides "the format's maximum": the
/// e4m3fn maximum, the e4m3fnuz maximum, and the 224 sglang's HIP C++ kernels
/// divide by for e4m3fnuz (docs/fp8.md §8).
pub const DIVISORS: [u32; 3] = [448, 240, 224];

/// The FP8 maximum a store divides each tile's amax by: `raw` = 0 picks the
/// format's own maximum (448 for e4m3fn, 240 for e4m3fnuz); otherwise one of
/// `DIVISORS` no larger than that maximum (448 would saturate e4m3fnuz codes).
/// Anything else is `InvalidArgument`.
pub fn scale_divisor(name: &str, raw: u32, fmt: Fp8Format) -> Result<f32> {
    if raw == 0 {
        return Ok(fmt.max());
    }
    ensure!(
        DIVISORS.contains(&raw) && raw as f32 <= fmt.max(),
        InvalidArgument,
        "{name}: {raw} is not a scale divisor of {fmt:?} codes (0 for the format's maximum {}, or one of {:?} up to it)",
        fmt.max(),
        DIVISORS
    );
    Ok(raw as f32)
}

/// Quantizes a 512-value latent row into its codes and scales: each 64-dim
/// tile goes through `fp8::quantize_fp32_scale` with `divisor` (amax floored
/// at 1e-4, `scale = amax / divisor`, codes `encode(x · (1 / scale))`, rounded
/// to nearest even with saturation; NaN encodes to the NaN code). The input
/// is bf16, whose values widen to f32 exactly.
pub fn quantize_row(
    row: &[bf16],
    fmt: Fp8Format,
    divisor: f32,
    codes: &mut [u8],
    scales: &mut [f32],
) {
    assert!(row.len() == ROW_DIMS && codes.len() >= ROW_DIMS && scales.len() >= SCALES_PER_ROW);
    let tiles = row
        .chunks_exact(TILE_DIMS)
        .zip(codes.chunks_exact_mut(TILE_DIMS));
    for ((tile, tile_codes), scale) in tiles.zip(scales.iter_mut()) {
        let values: [f32; TILE_DIMS] = std::array::from_fn(|i| tile[i].to_f32());
        *scale = fp8::quantize_fp32_scale(&values, fmt, divisor, tile_codes);
    }
}

/// The 512 values an attention reader sees for one row:
/// `bf16(decode(codes[d]) · scales[d / 64])`, one f32 product rounded to
/// nearest even, then rounded to the nearest bf16 (ties to even). A NaN code
/// or scale gives NaN.
pub fn dequantize_row(codes: &[u8], scales: &[f32], fmt: Fp8Format, out: &mut [f32]) {
    assert!(codes.len() >= ROW_DIMS && scales.len() >= SCALES_PER_ROW && out.len() >= ROW_DIMS);
    for (d, o) in out[..ROW_DIMS].iter_mut().enumerate() {
        *o = fp8::bf16_round(fp8::decode(codes[d], fmt) * scales[d / TILE_DIMS]);
    }
}
