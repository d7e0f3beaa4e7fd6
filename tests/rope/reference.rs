//! The float64 reference.

use super::*;

/// YaRN's (low, high) correction range of docs/prepare.md §3, before the `+0.001`.
pub(crate) fn ref_yarn_range(base: f64, yarn: &Yarn) -> (f64, f64) {
    let (fast, slow) = ref_correction_dims(base, yarn);
    (fast.floor().clamp(0.0, 63.0), slow.ceil().clamp(0.0, 63.0))
}

/// `64 ln(L0 / (beta 2 pi)) / (2 ln base)` for beta_fast and beta_slow, unrounded.
pub(crate) fn ref_correction_dims(base: f64, yarn: &Yarn) -> (f64, f64) {
    let l0 = yarn.original_max_position as f64;
    let dim = |beta: f64| 64.0 * (l0 / (beta * 2.0 * PI)).ln() / (2.0 * base.ln());
    (dim(yarn.beta_fast), dim(yarn.beta_slow))
}

/// `w_i` for the 32 pairs (docs/prepare.md §3).
pub(crate) fn ref_omegas(cfg: &RopeConfig) -> Vec<f64> {
    let mut omega: Vec<f64> = (0..R / 2)
        .map(|i| (-(2.0 * i as f64 / R as f64) * cfg.base.ln()).exp())
        .collect();
    if let Some(yarn) = &cfg.yarn {
        let (low, mut high) = ref_yarn_range(cfg.base, yarn);
        if low == high {
            high += 0.001;
        }
        for (i, w) in omega.iter_mut().enumerate() {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            *w = *w / yarn.factor * ramp + *w * (1.0 - ramp);
        }
    }
    omega
}

/// Exact (cos, sin) of pair i at position p.
pub(crate) fn ref_cos_sin(omega: &[f64], p: usize, i: usize) -> (f64, f64) {
    let angle = p as f64 * omega[i];
    (angle.cos(), angle.sin())
}

/// A table row built here: the exact values rounded to f32. The row tests hand it
/// to the code under test and use the same f32 values, so they test the row math
/// independently of `build_table`.
pub(crate) fn ref_table_row(omega: &[f64], p: usize) -> Vec<f32> {
    (0..R / 2)
        .flat_map(|i| {
            let (c, s) = ref_cos_sin(omega, p, i);
            [c as f32, s as f32]
        })
        .collect()
}

/// `x / sqrt(mean(x^2) + eps) * w` in f64.
pub(crate) fn ref_rms_norm(x: &[f32], weight: Option<&[f32]>, eps: f32) -> Vec<f64> {
    let mean = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len() as f64;
    let factor = 1.0 / (mean + f64::from(eps)).sqrt();
    x.iter()
        .enumerate()
        .map(|(i, &v)| f64::from(v) * factor * weight.map_or(1.0, |w| f64::from(w[i])))
        .collect()
}

/// `(re, im) * (c + j s)`.
pub(crate) struct Rotated {
    /// The two components; exact for f32 inputs up to one f64 rounding.
    pub(crate) exact: [f64; 2],
    /// Per component, the sum of the magnitudes of its two products
    /// (`|re c| + |im s|`, `|re s| + |im c|`): fp32 errors scale with it.
    pub(crate) magnitude: [f64; 2],
}

pub(crate) fn ref_rotate(re: f64, im: f64, c: f64, s: f64) -> Rotated {
    Rotated {
        exact: [re * c - im * s, re * s + im * c],
        magnitude: [
            (re * c).abs() + (im * s).abs(),
            (re * s).abs() + (im * c).abs(),
        ],
    }
}
