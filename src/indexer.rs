//! Reference math of the lightning indexer's query and key preparation (see
//! docs/indexer.md §1, §2). The CPU backend computes with it; the GPU kernels
//! (kernels/indexer.cu) perform the same fp32 operations in the same order, so
//! query codes, scales and weights agree bit for bit, and keys within one FP8
//! code (their RMSNorm factor is a reduction: see `rope::rms_norm`).
//!
//! Per 128-dim vector, all in fp32 with no bf16 rounding in between:
//! 1. (keys only) RMSNorm with the compressor's norm weight;
//! 2. GPT-J RoPE of dims 64..127 (`rope::rope_row`);
//! 3. the 128-point Walsh-Hadamard transform in natural (Sylvester) order,
//!    `y[i] = 128^-1/2 sum_j (-1)^popcount(i & j) x[j]`, as seven butterfly
//!    stages of strides 1, 2, .., 64 (lower element `a + b`, upper `a - b`),
//!    then one multiply by `HADAMARD_SCALE`;
//! 4. FP8 with one fp32 scale, `max(amax, 1e-4) / fp8_max`, codes
//!    `encode(y * (1 / scale))` (`cache_layouts::indexer::quantize_key`).
//!
//! The query's folded weight is `(weight * weight_scale) * scale`.

use crate::cache_layouts::indexer::{quantize_key, KEY_DIMS};
use crate::fp8::Fp8Format;
use crate::rope::{rms_norm, rope_row, ROPE_DIM};

/// `1 / sqrt(128)` rounded to nearest f32 (bits 0x3DB504F3, the kernels'
/// constant): the transform's normalization.
pub const HADAMARD_SCALE: f32 = 0.088_388_346;

/// The normalized 128-point Walsh-Hadamard transform, in place (step 3).
pub fn hadamard(x: &mut [f32]) {
    assert_eq!(x.len(), KEY_DIMS, "a {KEY_DIMS}-point transform");
    let mut stride = 1;
    while stride < KEY_DIMS {
        for i in (0..KEY_DIMS).filter(|i| i & stride == 0) {
            let (a, b) = (x[i], x[i + stride]);
            x[i] = a + b;
            x[i + stride] = a - b;
        }
        stride *= 2;
    }
    x.iter_mut().for_each(|v| *v *= HADAMARD_SCALE);
}

/// One query head (docs/indexer.md §1): RoPE, Hadamard, FP8. `x` holds the head's 128
/// values on entry and the transformed values on return; the codes and the
/// scale are returned.
pub fn prepare_query(x: &mut [f32], table_row: &[f32], fmt: Fp8Format) -> ([u8; KEY_DIMS], f32) {
    assert_eq!(
        table_row.len(),
        ROPE_DIM,
        "one table row of {ROPE_DIM} floats"
    );
    rope_row(x, table_row);
    hadamard(x);
    quantize_key(x, fmt)
}

/// The query's folded weight, `(weight * weight_scale) * q_scale` in f32.
pub fn query_weight(weight: f32, weight_scale: f32, q_scale: f32) -> f32 {
    weight * weight_scale * q_scale
}

/// One compressed key (docs/indexer.md §2) up to its quantization: RMSNorm with `weight`,
/// RoPE at the group's first position, Hadamard. The caller stores it with
/// `cache_layouts::indexer::store_token`.
pub fn prepare_key(x: &mut [f32], weight: &[f32], eps: f32, table_row: &[f32]) {
    assert_eq!(
        table_row.len(),
        ROPE_DIM,
        "one table row of {ROPE_DIM} floats"
    );
    rms_norm(x, Some(weight), eps);
    rope_row(x, table_row);
    hadamard(x);
}

/// Raw tokens per compressed indexer key (the C4 compressor): a token at
/// position p sees the `(p + 1) / 4` keys of the groups closed at or before it.
pub const RATIO: i64 = 4;

/// Compressed keys a token at `position` may score (docs/indexer.md §3 causality).
/// `(p + 1) / 4` written so that a hostile `i64::MAX` cannot overflow.
pub fn visible_keys(position: i64) -> usize {
    if position < 0 {
        return 0;
    }
    (position / RATIO + i64::from(position % RATIO == RATIO - 1)) as usize
}

/// Key `s`'s score for one query token (docs/indexer.md §3):
/// `k_scale * sum_h weights[h] * relu(q[h] . k)` over the token's H heads of
/// 128 codes. Every FP8 value is a multiple of 2^-10 below 2^9, so each dot
/// product is exact in f64; the head sum is f64 in head order and the result
/// rounds to f32 once.
pub fn key_score(q: &[u8], weights: &[f32], key: &[u8], k_scale: f32, fmt: Fp8Format) -> f32 {
    let k: Vec<f64> = key
        .iter()
        .map(|&c| f64::from(crate::fp8::decode(c, fmt)))
        .collect();
    let sum: f64 = q
        .chunks_exact(KEY_DIMS)
        .zip(weights)
        .map(|(qh, &w)| {
            let dot: f64 = qh
                .iter()
                .zip(&k)
                .map(|(&c, &kv)| f64::from(crate::fp8::decode(c, fmt)) * kv)
                .sum();
            f64::from(w) * dot.max(0.0)
        })
        .sum();
    (f64::from(k_scale) * sum) as f32
}

/// The total order the top-k selection ranks scores by, as an unsigned key
/// (larger = better): IEEE order, with -0 equal to +0 and NaN below every
/// number. Kernels use the same mapping, so ties are the same on every backend.
pub fn order_key(x: f32) -> u32 {
    if x.is_nan() {
        return 0;
    }
    let bits = if x == 0.0 { 0 } else { x.to_bits() };
    if bits >> 31 == 1 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// The top `k` of `scores` by (`order_key` descending, index ascending): every
/// index when there are at most `k`; returned in ascending index order.
pub fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    if scores.len() > k {
        order.sort_by_key(|&i| (std::cmp::Reverse(order_key(scores[i])), i));
        order.truncate(k);
        order.sort_unstable();
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_keys_is_the_closed_groups_at_every_position() {
        let positions = (-9..40).chain([i64::MIN, i64::MAX - 4, i64::MAX - 1, i64::MAX]);
        for p in positions {
            let want = if p < 0 {
                0
            } else {
                ((i128::from(p) + 1) / 4) as usize
            };
            assert_eq!(visible_keys(p), want, "position {p}");
        }
    }
}
