//! The unified pool's FP8 row (docs/fp8.md §4, the two-pool "MXFP8"
//! format): one row id addresses a 512-byte nope row and a 64-wide bf16 rope
//! row in two parallel buffers.
//!
//! ```text
//! nope row: 448 FP8 codes | s0 s0 s1 s1 .. s6 s6 (UE8M0, each twice) | 50 zero bytes
//! rope row: 64 bf16 (dims 448..512), never quantized
//! ```
//!
//! The tiles quantize exactly as the FlashMLA layout's (`flashmla::quantize_nope`:
//! 64-dim tiles, UE8M0 from the NaN-ignoring amax floored at 1e-4, RNE with
//! saturation), so a row's codes and scales are byte-identical in both layouts.
//! Unlike FlashMLA's never-written padding, the 50 pad bytes are written as
//! zeros: a pool row is rewritten many times and a reader may checksum rows.

use half::bf16;

use super::flashmla::{quantize_nope, NOPE_DIMS, NOPE_TILES, TILE_DIMS, TOKEN_DIMS};
use crate::fp8::{self, Fp8Format};

/// Bytes of a nope row (the asm reader of the format assumes this stride).
pub const NOPE_ROW_BYTES: usize = 512;
/// Width of a rope row in bf16 values.
pub const ROPE_DIMS: usize = TOKEN_DIMS - NOPE_DIMS;
/// Byte offset of the duplicated scale bytes in a nope row.
pub const SCALES_AT: usize = NOPE_DIMS;
/// Bytes of one nope row plus one rope row: what a reader moves per key.
pub const ROW_BYTES: usize = NOPE_ROW_BYTES + ROPE_DIMS * 2;

/// Quantizes a 512-value latent row into its nope row and rope row.
pub fn quantize_row(
    row: &[bf16],
    fmt: Fp8Format,
    nope: &mut [u8; NOPE_ROW_BYTES],
    rope: &mut [bf16; ROPE_DIMS],
) {
    assert_eq!(row.len(), TOKEN_DIMS, "a latent row has 512 values");
    let (codes, scales) = quantize_nope(&row[..NOPE_DIMS], fmt);
    nope[..NOPE_DIMS].copy_from_slice(&codes);
    for (k, &s) in scales.iter().enumerate() {
        nope[SCALES_AT + 2 * k] = s;
        nope[SCALES_AT + 2 * k + 1] = s;
    }
    nope[SCALES_AT + 2 * NOPE_TILES..].fill(0);
    rope.copy_from_slice(&row[NOPE_DIMS..]);
}

/// The 512 values a reader sees: `decode(code) · 2^(s_k - 127)` for nope dim d
/// in tile k (the first copy of each scale byte), the rope row as is. Exact:
/// an FP8 value times a power of two in f32's normal range needs no rounding.
pub fn dequantize_row(nope: &[u8], rope: &[bf16], fmt: Fp8Format, out: &mut [f32]) {
    assert!(nope.len() >= NOPE_ROW_BYTES && rope.len() >= ROPE_DIMS && out.len() >= TOKEN_DIMS);
    for k in 0..NOPE_TILES {
        let scale = fp8::ue8m0_to_f32(nope[SCALES_AT + 2 * k]);
        for d in k * TILE_DIMS..(k + 1) * TILE_DIMS {
            out[d] = fp8::decode(nope[d], fmt) * scale;
        }
    }
    for (o, r) in out[NOPE_DIMS..TOKEN_DIMS].iter_mut().zip(rope) {
        *o = r.to_f32();
    }
}
