//! `unikv::rope` against an independent float64 reference written here from spec
//! store_fused §3.2-§3.5 and unified_kv §5.4; no expectation is computed with the
//! code under test:
//!
//! * table (§3.3): `w_i = base^(-2i/64)` (here `exp(-(2i/64) ln base)`), YaRN
//!   `low = floor(64 ln(L0/(b_fast 2 pi)) / (2 ln base))`, `high = ceil(.. b_slow ..)`,
//!   both clamped to [0, 63], `high += 0.001` when equal,
//!   `ramp_i = clamp((i - low)/(high - low), 0, 1)`, `w_i <- w_i/factor ramp_i + w_i (1 - ramp_i)`;
//!   row p = `[cos(p w_0), sin(p w_0), cos(p w_1), ...]`;
//! * RoPE (§3.3): pairs of the last 64 dims times `cos + j sin` (inverse: the
//!   conjugate, unified_kv §5.4);
//! * RMSNorm (§3.2): `x / sqrt(mean(x^2) + eps) * w`;
//! * Q (§3.4, rounding per §3.7's CUDA kernel): bf16(norm), then bf16(RoPE of those);
//!   KV (§3.5): bf16 of norm * w (nope) and of RoPE of the unrounded norm * w (rope).
//!
//! Tolerances. u = 2^-24 is the fp32 unit roundoff. The fp32 primitives are checked
//! against bounds of a few u derived from the operations they perform. A bf16
//! output is accepted when it is the bf16 nearest to some value within the
//! implementation's fp32 error bound E of the exact result, i.e. its rank lies in
//! `[bf16(exact - E), bf16(exact + E)]`: with E a few u this is the exact rounding
//! except within E of a bf16 rounding midpoint, where the neighbour is accepted too
//! (1 bf16 ulp). Every directly rounded output is held to that 1 ulp. The Q rope dims
//! round twice (before and after RoPE) and RoPE can cancel, so there E follows the
//! candidates of the first rounding and the cancellation; the tests count the
//! elements whose accepted range is wider than 1 ulp and require them to be rare.
//!
//! Every run draws fresh random inputs (never zeros); the seed is printed. Rerun a
//! failure with `UNIKV_TEST_SEED=<seed>`. Every test asserts how many elements it
//! checked, so none can pass by checking nothing.

mod common;

use common::*;
use std::f64::consts::PI;

use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;
use unikv::error::Error;
use unikv::ffi::rope::{unikv_rope_params, unikv_rope_table, unikv_rope_yarn};
use unikv::rope::{
    build_table, inverse_rope_row, prepare_kv_row, prepare_q_row, rms_norm, rope_row, table_row,
    RopeConfig, Yarn,
};

/// Latent row width.
const D: usize = 512;
/// Rotated dims at the end of a row.
const R: usize = 64;
/// Dims before them.
const NOPE: usize = D - R;
/// `config.rms_norm_eps` (spec §3.1).
const EPS: f32 = 1e-6;
/// The fp32 unit roundoff, 2^-24.
const U: f64 = 1.0 / 16_777_216.0;
/// At most this fraction of rope elements may get an accepted range wider than 1
/// bf16 ulp (a first rounding within E of a midpoint, or cancellation of 2^8 or
/// more; each has a probability near 2^-13 per element).
const WIDE_FRACTION: f64 = 0.01;

// ---------------------------------------------------------------------------
// Randomness and inputs

/// A nonzero value of either sign around `2^scale_exp` (within a factor 2^4).
fn random_f32(rng: &mut StdRng, scale_exp: i32) -> f32 {
    let mantissa: f32 = rng.random_range(1.0..2.0);
    let exp = scale_exp + rng.random_range(-3..=3);
    let sign = if rng.random_bool(0.5) { -1.0 } else { 1.0 };
    sign * mantissa * 2f32.powi(exp)
}

/// A nonzero bf16 value around `2^scale_exp`, widened to f32.
fn random_bf16(rng: &mut StdRng, scale_exp: i32) -> f32 {
    bf16::from_f32(random_f32(rng, scale_exp)).to_f32()
}

/// A row of `len` random bf16 values sharing a random scale (2^-14 .. 2^8, so
/// that eps dominates the mean square in some rows).
fn random_bf16_row(rng: &mut StdRng, len: usize) -> Vec<f32> {
    let scale = rng.random_range(-14..=8);
    (0..len).map(|_| random_bf16(rng, scale)).collect()
}

/// The configurations the row tests draw from: a dense layer and a compressed
/// layer with DeepSeek-V3's YaRN values.
fn random_config(rng: &mut StdRng) -> RopeConfig {
    if rng.random_bool(0.5) {
        RopeConfig::new(10_000.0, None)
    } else {
        RopeConfig::new(40_000.0, Some(v3_yarn()))
    }
}

/// A random configuration's table row (built here) at a random position.
fn random_table_row(rng: &mut StdRng) -> (usize, Vec<f32>) {
    let cfg = random_config(rng);
    let p = rng.random_range(0..1 << 20);
    (p, ref_table_row(&ref_omegas(&cfg), p))
}

fn v3_yarn() -> Yarn {
    Yarn {
        factor: 40.0,
        original_max_position: 4096,
        beta_fast: 32.0,
        beta_slow: 1.0,
    }
}

// ---------------------------------------------------------------------------
// The float64 reference

/// YaRN's (low, high) correction range of §3.3, before the `+0.001`.
fn ref_yarn_range(base: f64, yarn: &Yarn) -> (f64, f64) {
    let (fast, slow) = ref_correction_dims(base, yarn);
    (fast.floor().clamp(0.0, 63.0), slow.ceil().clamp(0.0, 63.0))
}

/// `64 ln(L0 / (beta 2 pi)) / (2 ln base)` for beta_fast and beta_slow, unrounded.
fn ref_correction_dims(base: f64, yarn: &Yarn) -> (f64, f64) {
    let l0 = yarn.original_max_position as f64;
    let dim = |beta: f64| 64.0 * (l0 / (beta * 2.0 * PI)).ln() / (2.0 * base.ln());
    (dim(yarn.beta_fast), dim(yarn.beta_slow))
}

/// `w_i` for the 32 pairs (§3.3).
fn ref_omegas(cfg: &RopeConfig) -> Vec<f64> {
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
fn ref_cos_sin(omega: &[f64], p: usize, i: usize) -> (f64, f64) {
    let angle = p as f64 * omega[i];
    (angle.cos(), angle.sin())
}

/// A table row built here: the exact values rounded to f32. The row tests hand it
/// to the code under test and use the same f32 values, so they test the row math
/// independently of `build_table`.
fn ref_table_row(omega: &[f64], p: usize) -> Vec<f32> {
    (0..R / 2)
        .flat_map(|i| {
            let (c, s) = ref_cos_sin(omega, p, i);
            [c as f32, s as f32]
        })
        .collect()
}

/// `x / sqrt(mean(x^2) + eps) * w` in f64.
fn ref_rms_norm(x: &[f32], weight: Option<&[f32]>, eps: f32) -> Vec<f64> {
    let mean = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len() as f64;
    let factor = 1.0 / (mean + f64::from(eps)).sqrt();
    x.iter()
        .enumerate()
        .map(|(i, &v)| f64::from(v) * factor * weight.map_or(1.0, |w| f64::from(w[i])))
        .collect()
}

/// `(re, im) * (c + j s)`.
struct Rotated {
    /// The two components; exact for f32 inputs up to one f64 rounding.
    exact: [f64; 2],
    /// Per component, the sum of the magnitudes of its two products
    /// (`|re c| + |im s|`, `|re s| + |im c|`): fp32 errors scale with it.
    magnitude: [f64; 2],
}

fn ref_rotate(re: f64, im: f64, c: f64, s: f64) -> Rotated {
    Rotated {
        exact: [re * c - im * s, re * s + im * c],
        magnitude: [
            (re * c).abs() + (im * s).abs(),
            (re * s).abs() + (im * c).abs(),
        ],
    }
}

// ---------------------------------------------------------------------------
// Rounding and acceptance

/// The bf16 nearest to `x` (ties to even), rounded from f64 directly.
fn bf16_nearest(x: f64) -> f64 {
    if x == 0.0 {
        return x;
    }
    let exp = ((x.to_bits() >> 52) & 0x7FF) as i32 - 1023;
    assert!(
        (-126..=127).contains(&exp),
        "{x} is outside bf16's normal range"
    );
    let step = 2f64.powi(exp - 7);
    (x / step).round_ties_even() * step
}

/// The spacing of f32 values in the binade of `x` (floored at the subnormal step).
fn f32_ulp(x: f64) -> f64 {
    let exp = (((x.abs() as f32).to_bits() >> 23) & 0xFF) as i32 - 127;
    2f64.powi(exp.max(-126) - 23)
}

/// The spacing of bf16 values in the binade of `x`.
fn bf16_ulp(x: f64) -> f64 {
    f32_ulp(x) * 65536.0
}

/// The index of a bf16 value on the ordered line of bf16 values (adjacent values
/// differ by 1, both zeros are 0).
fn bf16_rank(v: f64) -> i64 {
    let f = v as f32;
    assert_eq!(f64::from(f), v, "{v} is not an f32");
    let bits = f.to_bits();
    assert_eq!(bits & 0xFFFF, 0, "{v} is not a bf16 value");
    let magnitude = i64::from((bits >> 16) & 0x7FFF);
    if bits >> 31 == 1 {
        -magnitude
    } else {
        magnitude
    }
}

/// The bf16 values, by rank, a result within `err` of `exact` may round to.
#[derive(Debug, Clone, Copy)]
struct Accept {
    lo: i64,
    hi: i64,
}

impl Accept {
    fn new(exact: f64, err: f64) -> Self {
        Accept {
            lo: bf16_rank(bf16_nearest(exact - err)),
            hi: bf16_rank(bf16_nearest(exact + err)),
        }
    }

    fn union(self, other: Accept) -> Accept {
        Accept {
            lo: self.lo.min(other.lo),
            hi: self.hi.max(other.hi),
        }
    }

    /// How many bf16 ulps the accepted range spans.
    fn width(&self) -> i64 {
        self.hi - self.lo
    }

    fn contains(&self, got: f32) -> bool {
        (self.lo..=self.hi).contains(&bf16_rank(f64::from(got)))
    }

    /// The accepted bf16 values themselves (one or two for a 1-ulp range).
    fn values(&self) -> Vec<f64> {
        (self.lo..=self.hi).map(value_of_rank).collect()
    }
}

fn value_of_rank(rank: i64) -> f64 {
    let sign = if rank < 0 { 1 << 31 } else { 0 };
    let bits = ((rank.unsigned_abs() as u32) << 16) | sign;
    f64::from(f32::from_bits(bits))
}

/// Counts of the row-preparation checks.
#[derive(Default)]
struct Tally {
    checked: usize,
    /// Elements whose accepted range is wider than 1 bf16 ulp.
    wide: usize,
}

impl Tally {
    fn add(&mut self, accept: &Accept) {
        self.checked += 1;
        self.wide += usize::from(accept.width() > 1);
    }

    fn assert_rare_wide(&self, what: &str) {
        eprintln!(
            "{what}: {} elements, {} with a range over 1 bf16 ulp",
            self.checked, self.wide
        );
        assert!(
            (self.wide as f64) <= WIDE_FRACTION * self.checked as f64,
            "{what}: {} of {} elements needed more than 1 bf16 ulp",
            self.wide,
            self.checked
        );
    }
}

// ---------------------------------------------------------------------------
// Tables

/// Compares every entry of a `build_table` table with the reference and returns
/// the number of entries checked.
///
/// Bound: the entry is the f32 rounding (1/2 f32 ulp) of an f64 cos/sin whose
/// angle differs from the reference's by a few f64 ulps of `w` times p (the two
/// compute `w` differently), so `|got - exact| <= ulp/2 + p w 2^-48 + 2^-60`.
fn check_table(cfg: &RopeConfig, max_pos: usize) -> usize {
    let table = build_table(cfg, max_pos).expect("valid config");
    assert_eq!(table.len(), max_pos * R, "{cfg:?}: table shape");
    let omega = ref_omegas(cfg);
    let mut checked = 0;
    for p in 0..max_pos {
        for i in 0..R / 2 {
            let (c, s) = ref_cos_sin(&omega, p, i);
            let angle_err = p as f64 * omega[i] * 2f64.powi(-48) + 2f64.powi(-60);
            for (k, exact) in [c, s].into_iter().enumerate() {
                let got = f64::from(table[p * R + 2 * i + k]);
                let tol = 0.5 * f32_ulp(exact) + angle_err;
                assert!(
                    (got - exact).abs() <= tol,
                    "{cfg:?}: table[{p}][{}] = {got}, reference {exact} (tol {tol:e})",
                    2 * i + k
                );
                checked += 1;
            }
        }
    }
    checked
}

#[test]
fn table_matches_reference() {
    let (mut rng, _) = seeded("table_matches_reference");
    // The V3 values put the ramp strictly inside the 32 pairs: some pairs keep
    // their frequency, some ramp, some are divided by the factor.
    let (low, high) = ref_yarn_range(40_000.0, &v3_yarn());
    assert!(0.0 < low && low < high && high < 31.0, "ramp {low}..{high}");
    // L0 = 2 puts both ends of the ramp at 0 (the `high += 0.001` case).
    let degenerate = Yarn {
        factor: rng.random_range(2.0..64.0),
        original_max_position: 2,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    assert_eq!(ref_yarn_range(40_000.0, &degenerate), (0.0, 0.0));
    // A random YaRN whose ramp ends are inside the pairs and land where floor and
    // ceil differ from rounding to nearest (fractions above / below one half).
    let random_base = rng.random_range(1e3..1e6);
    let random_yarn = loop {
        let yarn = Yarn {
            factor: rng.random_range(1.5..64.0),
            original_max_position: rng.random_range(256..=1 << 17),
            beta_fast: rng.random_range(8.0..64.0),
            beta_slow: rng.random_range(0.25..4.0),
        };
        let (fast, slow) = ref_correction_dims(random_base, &yarn);
        if 1.0 < fast && fast.fract() > 0.5 && slow < 30.0 && slow.fract() < 0.5 {
            break yarn;
        }
    };
    let long = (1 << 17) + rng.random_range(1..1000);
    let short = rng.random_range(1000..5000);
    let cases = [
        (RopeConfig::new(10_000.0, None), long),
        (RopeConfig::new(40_000.0, Some(v3_yarn())), long),
        (RopeConfig::new(40_000.0, Some(degenerate)), short),
        (RopeConfig::new(random_base, Some(random_yarn)), short),
    ];
    let mut checked = 0;
    for (cfg, max_pos) in &cases {
        checked += check_table(cfg, *max_pos);
    }
    assert_eq!(checked, (2 * long + 2 * short) * R);
}

#[test]
fn table_rejects_bad_configs() {
    let good = RopeConfig::new(10_000.0, Some(v3_yarn()));
    let with_yarn = |edit: fn(&mut Yarn)| {
        let mut cfg = good;
        edit(cfg.yarn.as_mut().unwrap());
        cfg
    };
    let cases: Vec<(RopeConfig, usize, &str)> = vec![
        (RopeConfig { base: 1.0, ..good }, 8, "base"),
        (
            RopeConfig {
                base: f64::NAN,
                ..good
            },
            8,
            "base",
        ),
        (
            RopeConfig {
                rotary_dim: 0,
                ..good
            },
            8,
            "rotary_dim",
        ),
        (
            RopeConfig {
                rotary_dim: 63,
                ..good
            },
            8,
            "rotary_dim",
        ),
        (good, 0, "max_pos"),
        (good, usize::MAX / 2, "max_pos"),
        (with_yarn(|y| y.factor = 0.0), 8, "yarn.factor"),
        (with_yarn(|y| y.factor = f64::INFINITY), 8, "yarn.factor"),
        (
            with_yarn(|y| y.original_max_position = 0),
            8,
            "yarn.original_max_position",
        ),
        (with_yarn(|y| y.beta_slow = 0.0), 8, "yarn.beta_slow"),
        (with_yarn(|y| y.beta_fast = 0.5), 8, "yarn.beta_fast"),
    ];
    let mut checked = 0;
    for (cfg, max_pos, name) in &cases {
        match build_table(cfg, *max_pos) {
            Err(Error::InvalidArgument(msg)) => {
                assert!(
                    msg.starts_with(name),
                    "{cfg:?}: message {msg:?} names {name}"
                )
            }
            other => panic!("{cfg:?}, max_pos {max_pos}: expected an error, got {other:?}"),
        }
        checked += 1;
    }
    assert_eq!(checked, 11);
    assert!(build_table(&good, 8).is_ok());
}

#[test]
fn table_row_selects_positions() {
    let (mut rng, _) = seeded("table_row_selects_positions");
    let max_pos = rng.random_range(100..300);
    let table = build_table(&RopeConfig::new(10_000.0, None), max_pos).unwrap();
    let mut checked = 0;
    for p in [-1, i64::MIN, max_pos as i64, i64::MAX, i64::from(i32::MIN)] {
        assert_eq!(table_row(&table, R, p), None, "position {p}");
        checked += 1;
    }
    let mut positions = vec![0, max_pos - 1];
    positions.extend((0..20).map(|_| rng.random_range(0..max_pos)));
    for p in positions {
        // Positions arrive as int32 or int64; both widen to the same row.
        let from_i32 = table_row(&table, R, i64::from(p as i32)).unwrap();
        let from_i64 = table_row(&table, R, p as i64).unwrap();
        assert_eq!(from_i32, &table[p * R..(p + 1) * R]);
        assert!(std::ptr::eq(from_i32, from_i64));
        checked += 1;
    }
    assert_eq!(checked, 5 + 22);
}

// ---------------------------------------------------------------------------
// RoPE rows

/// Rotates random rows forward and back and checks both against the reference:
/// the nope dims are untouched (bit for bit) and each rope output is within
/// `2u` times its products' magnitudes (`|re c| + |im s|` for the real part: two
/// rounded products and their rounded sum) of the exact rotation by the table
/// row's f32 values.
#[test]
fn rope_matches_reference() {
    let (mut rng, _) = seeded("rope_matches_reference");
    let rows = 2000;
    let mut checked = 0;
    for _ in 0..rows {
        let (p, cs) = random_table_row(&mut rng);
        let scale = rng.random_range(-20..=20);
        let x: Vec<f32> = (0..D).map(|_| random_f32(&mut rng, scale)).collect();
        for inverse in [false, true] {
            let mut row = x.clone();
            if inverse {
                inverse_rope_row(&mut row, &cs);
            } else {
                rope_row(&mut row, &cs);
            }
            assert_eq!(
                row[..NOPE].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                x[..NOPE].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "nope dims changed"
            );
            checked += NOPE;
            for i in 0..R / 2 {
                let (re, im) = (f64::from(x[NOPE + 2 * i]), f64::from(x[NOPE + 2 * i + 1]));
                let c = f64::from(cs[2 * i]);
                let s = f64::from(cs[2 * i + 1]) * if inverse { -1.0 } else { 1.0 };
                let want = ref_rotate(re, im, c, s);
                for k in 0..2 {
                    let exact = want.exact[k];
                    let tol = 2.0 * U * (1.0 + 1e-6) * want.magnitude[k];
                    let got = f64::from(row[NOPE + 2 * i + k]);
                    assert!(
                        (got - exact).abs() <= tol,
                        "inverse {inverse}, position {p}, dim {}: {got} vs {exact}",
                        NOPE + 2 * i + k
                    );
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, rows * 2 * D);
}

/// Row 0 of every table is `cos 0 = 1, sin 0 = 0`, so RoPE and its inverse at
/// position 0 are the identity, bit for bit.
#[test]
fn rope_at_position_zero_is_identity() {
    let (mut rng, _) = seeded("rope_at_position_zero_is_identity");
    let mut checked = 0;
    let configs = [
        RopeConfig::new(10_000.0, None),
        RopeConfig::new(40_000.0, Some(v3_yarn())),
    ];
    for cfg in &configs {
        let table = build_table(cfg, 4).unwrap();
        let row0 = table_row(&table, R, 0).unwrap();
        let unit: Vec<f32> = (0..R).map(|k| if k % 2 == 0 { 1.0 } else { 0.0 }).collect();
        assert_eq!(row0, &unit[..]);
        for _ in 0..100 {
            let x = random_bf16_row(&mut rng, D);
            for inverse in [false, true] {
                let mut row = x.clone();
                if inverse {
                    inverse_rope_row(&mut row, row0);
                } else {
                    rope_row(&mut row, row0);
                }
                for (got, want) in row.iter().zip(&x) {
                    assert_eq!(got.to_bits(), want.to_bits());
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 2 * 100 * 2 * D);
}

/// `inverse(bf16(rope(x)))` gives back the bf16 input `x` up to the bf16 rounding
/// of the rotated values: with `y = bf16(rope(x)) = rope(x) + e`, `R^T y` is
/// `x + R^T e`, so component 0 is off by `|c| e0 + |s| e1` and component 1 by
/// `|s| e0 + |c| e1`, where `|e_k| <= ulp_bf16(y_k)/2` plus the forward fp32 error
/// (`2u` times the magnitudes); add the inverse's own fp32 error and `2u|x_k|`
/// for `c^2 + s^2` of the f32 table being 1 only to within 2u.
#[test]
fn inverse_undoes_rope_within_bf16_rounding() {
    let (mut rng, _) = seeded("inverse_undoes_rope_within_bf16_rounding");
    let rows = 2000;
    let mut checked = 0;
    for _ in 0..rows {
        let (p, cs) = random_table_row(&mut rng);
        let x = random_bf16_row(&mut rng, D);
        let mut y = x.clone();
        rope_row(&mut y, &cs);
        y.iter_mut().for_each(|v| *v = bf16::from_f32(*v).to_f32());
        let mut z = y.clone();
        inverse_rope_row(&mut z, &cs);
        assert_eq!(&z[..NOPE], &x[..NOPE]);
        checked += NOPE;
        for i in 0..R / 2 {
            let (c, s) = (f64::from(cs[2 * i]), f64::from(cs[2 * i + 1]));
            let (x0, x1) = (f64::from(x[NOPE + 2 * i]), f64::from(x[NOPE + 2 * i + 1]));
            let (y0, y1) = (f64::from(y[NOPE + 2 * i]), f64::from(y[NOPE + 2 * i + 1]));
            let forward = ref_rotate(x0, x1, c, s).magnitude;
            let e0 = bf16_ulp(y0) / 2.0 + 2.0 * U * forward[0];
            let e1 = bf16_ulp(y1) / 2.0 + 2.0 * U * forward[1];
            let back = ref_rotate(y0, y1, c, -s).magnitude;
            let propagated = [c.abs() * e0 + s.abs() * e1, s.abs() * e0 + c.abs() * e1];
            for (k, xk) in [x0, x1].into_iter().enumerate() {
                let fp32 = 2.0 * U * (back[k] + xk.abs());
                let tol = (propagated[k] + fp32) * (1.0 + 1e-6);
                let got = f64::from(z[NOPE + 2 * i + k]);
                assert!(
                    (got - xk).abs() <= tol,
                    "position {p}, dim {}: {got} vs {xk} (tol {tol:e})",
                    NOPE + 2 * i + k
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, rows * D);
}

// ---------------------------------------------------------------------------
// RMSNorm

/// Bound: the norm factor is rounded to f32 once from an exact-to-f64 value
/// (`u`), then `x * factor` (`u`) and `* w` (`u`): `|got - exact| <= 3.01u |exact|`.
#[test]
fn rms_norm_matches_reference() {
    let (mut rng, _) = seeded("rms_norm_matches_reference");
    let rows = 3000;
    let mut checked = 0;
    let mut expected = 0;
    for r in 0..rows {
        let len = [D, 128, 64, 7][r % 4];
        let x = random_bf16_row(&mut rng, len);
        let w: Vec<f32> = (0..len).map(|_| random_bf16(&mut rng, 0)).collect();
        let weight = (r % 3 != 0).then_some(&w[..]);
        let want = ref_rms_norm(&x, weight, EPS);
        let mut got = x.clone();
        rms_norm(&mut got, weight, EPS);
        for (k, (g, e)) in got.iter().zip(&want).enumerate() {
            let tol = 3.01 * U * e.abs();
            assert!(
                (f64::from(*g) - e).abs() <= tol,
                "row {r} (len {len}, weight {}), dim {k}: {g} vs {e}",
                weight.is_some()
            );
            checked += 1;
        }
        expected += len;
    }
    assert_eq!(checked, expected);
    assert_eq!(expected, rows / 4 * (D + 128 + 64 + 7));
}

// ---------------------------------------------------------------------------
// Q and KV rows

/// Q per token `[H, 512]`. Reference: `n = rms(x)` exact; nope dims are bf16(n),
/// accepted within `E_n = 2.01u|n|` (factor and product roundings), i.e. exactly
/// 1 ulp. The rope dims rotate one of the accepted bf16 values of each `n_k`
/// (candidates of the first rounding) and round again; the rotation's fp32 error is
/// `2u` times the products' magnitudes.
#[test]
fn prepare_q_matches_reference() {
    let (mut rng, _) = seeded("prepare_q_matches_reference");
    let heads = [1, 2, 7, 16, 64, 128];
    let tokens = 6;
    let mut nope = Tally::default();
    let mut rope = Tally::default();
    for &h in &heads {
        for _ in 0..tokens {
            let (p, cs) = random_table_row(&mut rng);
            // Per-head scales differ, as the norm is per head.
            let x: Vec<f32> = (0..h).flat_map(|_| random_bf16_row(&mut rng, D)).collect();
            let mut got = x.clone();
            prepare_q_row(&mut got, EPS, &cs);
            for (head, (x, got)) in x.chunks(D).zip(got.chunks(D)).enumerate() {
                let n = ref_rms_norm(x, None, EPS);
                let first: Vec<Accept> = n
                    .iter()
                    .map(|&v| Accept::new(v, 2.01 * U * v.abs()))
                    .collect();
                for k in 0..NOPE {
                    assert!(first[k].width() <= 1);
                    assert!(
                        first[k].contains(got[k]),
                        "H {h}, head {head}, dim {k}: {} vs {}",
                        got[k],
                        n[k]
                    );
                    nope.add(&first[k]);
                }
                for i in 0..R / 2 {
                    let d = NOPE + 2 * i;
                    let (c, s) = (f64::from(cs[2 * i]), f64::from(cs[2 * i + 1]));
                    for k in 0..2 {
                        let mut accept: Option<Accept> = None;
                        for n0 in first[d].values() {
                            for n1 in first[d + 1].values() {
                                let rotated = ref_rotate(n0, n1, c, s);
                                let err = 2.0 * U * (1.0 + 1e-6) * rotated.magnitude[k];
                                let a = Accept::new(rotated.exact[k], err);
                                accept = Some(accept.map_or(a, |acc| acc.union(a)));
                            }
                        }
                        let accept = accept.unwrap();
                        assert!(
                            accept.contains(got[d + k]),
                            "H {h}, head {head}, position {p}, dim {}: {} not in {accept:?}",
                            d + k,
                            got[d + k]
                        );
                        rope.add(&accept);
                    }
                }
            }
        }
    }
    let total_heads: usize = heads.iter().sum::<usize>() * tokens;
    assert_eq!(nope.checked, total_heads * NOPE);
    assert_eq!(nope.wide, 0);
    assert_eq!(rope.checked, total_heads * R);
    rope.assert_rare_wide("Q rope dims");
}

/// KV rows. Reference: `k = rms(x) * w` exact, with the implementation's fp32 error
/// `E_k = 3.01u|k|`. Nope dims: bf16(k) within `E_k` (1 ulp). Rope dims: bf16 of
/// the exact rotation of the unrounded `k`, within the propagated `|c| E_k0 + |s| E_k1`
/// (real part; `|s| E_k0 + |c| E_k1` for the imaginary part) plus the rotation's
/// `2u` times the same magnitudes (`|k0 c| + |k1 s|` for the real part):
/// `5.02u` times the magnitudes.
#[test]
fn prepare_kv_matches_reference() {
    let (mut rng, _) = seeded("prepare_kv_matches_reference");
    let tokens = 3000;
    let weight: Vec<f32> = (0..D).map(|_| random_bf16(&mut rng, 0)).collect();
    let mut nope = Tally::default();
    let mut rope = Tally::default();
    for t in 0..tokens {
        let (p, cs) = random_table_row(&mut rng);
        let x = random_bf16_row(&mut rng, D);
        let mut got = x.clone();
        prepare_kv_row(&mut got, &weight, EPS, &cs);
        let k = ref_rms_norm(&x, Some(&weight), EPS);
        for d in 0..NOPE {
            let accept = Accept::new(k[d], 3.01 * U * k[d].abs());
            assert!(accept.width() <= 1);
            assert!(
                accept.contains(got[d]),
                "token {t}, dim {d}: {} vs {}",
                got[d],
                k[d]
            );
            nope.add(&accept);
        }
        for i in 0..R / 2 {
            let d = NOPE + 2 * i;
            let (c, s) = (f64::from(cs[2 * i]), f64::from(cs[2 * i + 1]));
            let (k0, k1) = (k[d], k[d + 1]);
            let rotated = ref_rotate(k0, k1, c, s);
            for j in 0..2 {
                let exact = rotated.exact[j];
                let accept = Accept::new(exact, 5.02 * U * rotated.magnitude[j]);
                assert!(
                    accept.contains(got[d + j]),
                    "token {t}, position {p}, dim {}: {} vs {exact} ({accept:?})",
                    d + j,
                    got[d + j]
                );
                rope.add(&accept);
            }
        }
    }
    assert_eq!(nope.checked, tokens * NOPE);
    assert_eq!(nope.wide, 0);
    assert_eq!(rope.checked, tokens * R);
    rope.assert_rare_wide("KV rope dims");
}

// ---------------------------------------------------------------------------
// The C ABI builder

fn c_params(base: f64, yarn: Option<Yarn>) -> unikv_rope_params {
    let yarn = yarn.map_or(
        unikv_rope_yarn {
            factor: 0.0,
            original_max_position: 0,
            beta_fast: 0.0,
            beta_slow: 0.0,
        },
        |y| unikv_rope_yarn {
            factor: y.factor,
            original_max_position: y.original_max_position,
            beta_fast: y.beta_fast,
            beta_slow: y.beta_slow,
        },
    );
    unikv_rope_params {
        struct_size: std::mem::size_of::<unikv_rope_params>(),
        base,
        yarn,
    }
}

/// `unikv_rope_table` fills exactly `max_pos` rows, bit for bit the Rust builder's
/// (itself checked against the float64 reference above), and nothing past them.
#[test]
fn c_abi_table_matches_the_builder() {
    let (mut rng, _) = seeded("c_abi_table_matches_the_builder");
    let mut checked = 0;
    for (base, yarn) in [(10_000.0, None), (40_000.0, Some(v3_yarn()))] {
        let max_pos = rng.random_range(1..600u32);
        let want = build_table(&RopeConfig::new(base, yarn), max_pos as usize).unwrap();
        let mut got = vec![f32::from_bits(0x7FA5_A5A5); want.len() + 7];
        ok(unsafe {
            unikv_rope_table(&c_params(base, yarn), max_pos, got.as_mut_ptr(), got.len())
        });
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "entry {i} of base {base}");
            checked += 1;
        }
        assert!(
            got[want.len()..].iter().all(|v| v.to_bits() == 0x7FA5_A5A5),
            "wrote past max_pos rows"
        );
    }
    assert!(checked >= 2 * 64);
}

/// Every bad argument gets its own status and names the argument; the table is
/// left as it was.
#[test]
fn c_abi_table_rejects_bad_input() {
    let good = c_params(40_000.0, Some(v3_yarn()));
    let mut table = vec![f32::from_bits(0x7FA5_A5A5); 8 * 64 + 1];
    let poison = table.clone();
    let len = table.len();
    let t = table.as_mut_ptr();
    unsafe {
        fails(
            unikv_rope_table(std::ptr::null(), 8, t, len),
            UNIKV_NULL_ARGUMENT,
            "params",
        );
        fails(
            unikv_rope_table(&good, 8, std::ptr::null_mut(), len),
            UNIKV_NULL_ARGUMENT,
            "table",
        );
        fails(
            unikv_rope_table(&good, 8, t.cast::<u8>().add(1).cast(), len - 1),
            UNIKV_BAD_ALIGNMENT,
            "table",
        );
        fails(
            unikv_rope_table(&good, 0, t, len),
            UNIKV_INVALID_ARGUMENT,
            "max_pos",
        );
        fails(
            unikv_rope_table(&good, 9, t, len),
            UNIKV_CAPACITY_EXCEEDED,
            "table_len",
        );
        let small = unikv_rope_params {
            struct_size: 8,
            ..good
        };
        fails(
            unikv_rope_table(&small, 8, t, len),
            UNIKV_BAD_STRUCT_SIZE,
            "params.struct_size",
        );
        let cases = [
            (c_params(1.0, None), "params.base"),
            (c_params(f64::NAN, None), "params.base"),
            (
                c_params(
                    40_000.0,
                    Some(Yarn {
                        factor: -1.0,
                        ..v3_yarn()
                    }),
                ),
                "params.yarn.factor",
            ),
            (
                c_params(
                    40_000.0,
                    Some(Yarn {
                        original_max_position: 0,
                        ..v3_yarn()
                    }),
                ),
                "params.yarn.original_max_position",
            ),
            (
                c_params(
                    40_000.0,
                    Some(Yarn {
                        beta_fast: 0.5,
                        ..v3_yarn()
                    }),
                ),
                "params.yarn.beta_fast",
            ),
        ];
        for (params, arg) in cases {
            fails(
                unikv_rope_table(&params, 8, t, len),
                UNIKV_INVALID_ARGUMENT,
                arg,
            );
        }
    }
    assert!(
        table
            .iter()
            .zip(&poison)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "a failing call wrote"
    );
}
