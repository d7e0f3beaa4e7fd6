//! Input rows: literal patterns, and random bytes, FlashMLA rows and keys.

use super::*;

pub(crate) fn bf16s(values: &[f32]) -> Vec<bf16> {
    values.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// `pattern` repeated to `len` values.
pub(crate) fn repeat(pattern: &[f32], len: usize) -> Vec<f32> {
    pattern.iter().copied().cycle().take(len).collect()
}

pub(crate) fn random_bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.random()).collect()
}

pub(crate) fn random_flashmla_row(rng: &mut StdRng) -> Vec<bf16> {
    let mut row = Vec::with_capacity(512);
    for _ in 0..8 {
        // Per-tile magnitudes from 2^-16 (below the amax floor) to 2^12.
        let magnitude = 2f32.powf(rng.random_range(-16.0..12.0));
        row.extend((0..64).map(|_| bf16::from_f32(magnitude * rng.random_range(-1.0..1.0))));
    }
    row
}

pub(crate) fn random_key(rng: &mut StdRng) -> Vec<f32> {
    let magnitude = 2f32.powf(rng.random_range(-16.0..12.0));
    (0..128)
        .map(|_| magnitude * rng.random_range(-1.0f32..1.0))
        .collect()
}
