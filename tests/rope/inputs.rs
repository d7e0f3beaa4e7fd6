//! Randomness and inputs.

use super::*;

/// A nonzero value of either sign around `2^scale_exp` (within a factor 2^4).
pub(crate) fn random_f32(rng: &mut StdRng, scale_exp: i32) -> f32 {
    let mantissa: f32 = rng.random_range(1.0..2.0);
    let exp = scale_exp + rng.random_range(-3..=3);
    let sign = if rng.random_bool(0.5) { -1.0 } else { 1.0 };
    sign * mantissa * 2f32.powi(exp)
}

/// A nonzero bf16 value around `2^scale_exp`, widened to f32.
pub(crate) fn random_bf16(rng: &mut StdRng, scale_exp: i32) -> f32 {
    bf16::from_f32(random_f32(rng, scale_exp)).to_f32()
}

/// A row of `len` random bf16 values sharing a random scale (2^-14 .. 2^8, so
/// that eps dominates the mean square in some rows).
pub(crate) fn random_bf16_row(rng: &mut StdRng, len: usize) -> Vec<f32> {
    let scale = rng.random_range(-14..=8);
    (0..len).map(|_| random_bf16(rng, scale)).collect()
}

/// The configurations the row tests draw from: a dense layer and a compressed
/// layer with DeepSeek-V3's YaRN values.
pub(crate) fn random_config(rng: &mut StdRng) -> RopeConfig {
    if rng.random_bool(0.5) {
        RopeConfig::new(10_000.0, None)
    } else {
        RopeConfig::new(40_000.0, Some(v3_yarn()))
    }
}

/// A random configuration's table row (built here) at a random position.
pub(crate) fn random_table_row(rng: &mut StdRng) -> (usize, Vec<f32>) {
    let cfg = random_config(rng);
    let p = rng.random_range(0..1 << 20);
    (p, ref_table_row(&ref_omegas(&cfg), p))
}

pub(crate) fn v3_yarn() -> Yarn {
    Yarn {
        factor: 40.0,
        original_max_position: 4096,
        beta_fast: 32.0,
        beta_slow: 1.0,
    }
}
