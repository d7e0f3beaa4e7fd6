//! The FP8 codec (`unikv::fp8`) against an independent float64 reference written
//! from docs/fp8.md §2: code values come from the format table's fields,
//! encoding picks the nearest code value (ties to the even code) and saturates,
//! UE8M0 bytes are the smallest power of two not below the fp32 quotient. No
//! expectation is computed with the code under test. Every test counts what it
//! checked, so none can pass by checking nothing.

mod common;

use common::seeded;
use std::cmp::Ordering;

use half::bf16;
use rand::Rng;
use unikv::fp8::{self, Fp8Format};

/// One row of the format table (docs/fp8.md §1) and what follows from it.
struct Spec {
    fmt: Fp8Format,
    bias: i32,
    fnuz: bool,
    max_code: u8,
    max: f64,
    /// Where one more code after max would sit (the top binade's next step).
    beyond_max: f64,
    /// Values of the non-negative codes 0..=max_code, indexed by code.
    values: Vec<f64>,
}

impl Spec {
    fn new(fmt: Fp8Format, bias: i32, fnuz: bool, max_code: u8, max: f64, beyond_max: f64) -> Self {
        let mut spec = Spec {
            fmt,
            bias,
            fnuz,
            max_code,
            max,
            beyond_max,
            values: Vec::new(),
        };
        spec.values = (0..=max_code).map(|c| spec.value(c).unwrap()).collect();
        assert_eq!(spec.values[usize::from(max_code)], max);
        assert!(spec.values.windows(2).all(|w| w[0] < w[1]));
        spec
    }

    /// A code's value from its sign, exponent and mantissa fields; None for NaN.
    fn value(&self, code: u8) -> Option<f64> {
        let nan = if self.fnuz {
            code == 0x80
        } else {
            code & 0x7F == 0x7F
        };
        if nan {
            return None;
        }
        let e = i32::from((code >> 3) & 0xF);
        let m = f64::from(code & 7);
        let magnitude = if e == 0 {
            m / 8.0 * 2f64.powi(1 - self.bias)
        } else {
            (1.0 + m / 8.0) * 2f64.powi(e - self.bias)
        };
        Some(if code & 0x80 != 0 {
            -magnitude
        } else {
            magnitude
        })
    }

    /// The nearest code (ties to the even code), ±max beyond max and for ±Inf;
    /// one NaN code per format (0x7F, 0x80) whatever the NaN's sign; fnuz has no
    /// negative zero.
    fn encode(&self, x: f32) -> u8 {
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        if x.is_nan() {
            return if self.fnuz { 0x80 } else { 0x7F };
        }
        let mag = f64::from(x).abs();
        let code = if mag >= self.max {
            self.max_code
        } else {
            let above = self.values.partition_point(|v| *v < mag);
            let nearest = if above == 0 || self.values[above] == mag {
                above
            } else {
                let (lo, hi) = (self.values[above - 1], self.values[above]);
                match (mag - lo).partial_cmp(&(hi - mag)).unwrap() {
                    Ordering::Less => above - 1,
                    Ordering::Greater => above,
                    Ordering::Equal if above % 2 == 0 => above,
                    Ordering::Equal => above - 1,
                }
            };
            nearest as u8
        };
        if self.fnuz && code == 0 {
            0
        } else {
            sign | code
        }
    }

    /// Half the gap between the code values around `mag` (the top binade's gap
    /// beyond max): the largest error round-to-nearest may make there.
    fn half_step(&self, mag: f64) -> f64 {
        let above = self.values.partition_point(|v| *v < mag);
        if above == 0 {
            0.0
        } else if above > usize::from(self.max_code) {
            (self.beyond_max - self.max) / 2.0
        } else {
            (self.values[above] - self.values[above - 1]) / 2.0
        }
    }

    /// The UE8M0 byte: the smallest k with 2^k >= fp32(max(amax, 1e-4) / max),
    /// plus 127, clamped to 254. The f64 quotient of two floats rounded to f32
    /// is the correctly rounded fp32 quotient (53 >= 2 * 24 + 2 bits).
    fn scale_byte(&self, amax: f32) -> u8 {
        let floored = if amax >= 1e-4 { amax } else { 1e-4 };
        let q = f64::from((f64::from(floored) / self.max) as f32);
        if q.is_infinite() {
            return 254;
        }
        let mut k = q.log2().ceil() as i32;
        while 2f64.powi(k - 1) >= q {
            k -= 1;
        }
        while 2f64.powi(k) < q {
            k += 1;
        }
        (k + 127).clamp(0, 254) as u8
    }
}

fn specs() -> [Spec; 2] {
    [
        Spec::new(Fp8Format::E4m3Fn, 7, false, 0x7E, 448.0, 480.0),
        Spec::new(Fp8Format::E4m3Fnuz, 8, true, 0x7F, 240.0, 256.0),
    ]
}

/// The next f32 up / down from a positive finite value.
fn next_up(x: f32) -> f32 {
    f32::from_bits(x.to_bits() + 1)
}
fn next_down(x: f32) -> f32 {
    f32::from_bits(x.to_bits() - 1)
}

/// Asserts the codec encodes `x` as the reference does.
#[track_caller]
fn check_encode(spec: &Spec, x: f32) {
    let (got, want) = (fp8::encode(x, spec.fmt), spec.encode(x));
    assert_eq!(
        got,
        want,
        "{:?}: encode({x:e} = {:#010x}) = {got:#04x}, want {want:#04x}",
        spec.fmt,
        x.to_bits()
    );
}

// ---------------------------------------------------------------------------
// Format constants and decoding

#[test]
fn format_constants_match_the_spec_table() {
    for spec in specs() {
        assert_eq!(f64::from(spec.fmt.max()), spec.max);
        assert!(spec.value(spec.fmt.nan_code()).is_none());
        assert!(fp8::decode(spec.fmt.nan_code(), spec.fmt).is_nan());
    }
    assert_eq!(Fp8Format::E4m3Fn.nan_code(), 0x7F);
    assert_eq!(Fp8Format::E4m3Fnuz.nan_code(), 0x80);
}

#[test]
fn all_256_codes_decode_to_the_spec_values() {
    let mut checked = 0;
    let mut nans = [0; 2];
    for (i, spec) in specs().iter().enumerate() {
        for code in 0..=255u8 {
            let got = fp8::decode(code, spec.fmt);
            match spec.value(code) {
                None => {
                    assert!(got.is_nan(), "{:?}: {code:#04x} is NaN", spec.fmt);
                    nans[i] += 1;
                }
                Some(want) => {
                    assert_eq!(f64::from(got), want, "{:?}: {code:#04x}", spec.fmt);
                    // -0.0 == 0.0: the sign of zero is checked by its bits.
                    assert_eq!(got.is_sign_negative(), code & 0x80 != 0, "{code:#04x}");
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 512);
    assert_eq!(nans, [2, 1], "fn has 0x7F and 0xFF, fnuz only 0x80");
}

#[test]
fn decode_anchors_from_the_spec() {
    let fn_ = Fp8Format::E4m3Fn;
    let uz = Fp8Format::E4m3Fnuz;
    let cases: [(u8, Fp8Format, f32); 14] = [
        (0x7E, fn_, 448.0),
        (0xFE, fn_, -448.0),
        (0x38, fn_, 1.0),
        (0x08, fn_, 2f32.powi(-6)),
        (0x07, fn_, 7.0 * 2f32.powi(-9)),
        (0x01, fn_, 2f32.powi(-9)),
        (0x77, fn_, 240.0),
        (0x7F, uz, 240.0),
        (0xFF, uz, -240.0),
        (0x40, uz, 1.0),
        (0x08, uz, 2f32.powi(-7)),
        (0x01, uz, 2f32.powi(-10)),
        (0x81, uz, -(2f32.powi(-10))),
        (0x00, uz, 0.0),
    ];
    for (code, fmt, want) in cases {
        assert_eq!(fp8::decode(code, fmt), want, "{fmt:?} {code:#04x}");
    }
    assert_eq!(fp8::decode(0x80, fn_).to_bits(), (-0.0f32).to_bits());
    assert!(fp8::decode(0x7F, fn_).is_nan() && fp8::decode(0xFF, fn_).is_nan());
    assert!(fp8::decode(0x80, uz).is_nan());
    // One NaN bit pattern, the one the device decoder returns too.
    for (code, fmt) in [(0x7F, fn_), (0xFF, fn_), (0x80, uz)] {
        assert_eq!(fp8::decode(code, fmt).to_bits(), 0x7FC0_0000);
    }
}

// ---------------------------------------------------------------------------
// Encoding

#[test]
fn every_code_value_encodes_back_to_its_code() {
    let mut checked = 0;
    for spec in specs() {
        for code in 0..=255u8 {
            if let Some(v) = spec.value(code) {
                assert_eq!(fp8::encode(v as f32, spec.fmt), code, "{:?}", spec.fmt);
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 254 + 255);
}

/// Every midpoint between adjacent code values (and between max and where the
/// next code would be) and one f32 ULP either side, both signs.
#[test]
fn midpoints_tie_to_even_and_their_neighbours_round_to_nearest() {
    let mut checked = 0;
    let mut expected = 0;
    for spec in specs() {
        let mut pairs: Vec<(f64, f64)> = spec.values.windows(2).map(|w| (w[0], w[1])).collect();
        pairs.push((spec.max, spec.beyond_max));
        for (i, (lo, hi)) in pairs.iter().copied().enumerate() {
            let mid = (lo + hi) / 2.0;
            let mid32 = mid as f32;
            assert_eq!(f64::from(mid32), mid, "midpoints are exact in f32");
            let points = [
                mid32,
                next_down(mid32),
                next_up(mid32),
                hi as f32,
                next_down(hi as f32),
            ];
            for x in points {
                check_encode(&spec, x);
                check_encode(&spec, -x);
                checked += 2;
            }
            if i < usize::from(spec.max_code) {
                // Reference-free: the tie goes to the even code, the neighbours
                // to the nearer side.
                let even = if i % 2 == 0 { i } else { i + 1 } as u8;
                assert_eq!(
                    fp8::encode(mid32, spec.fmt),
                    even,
                    "{:?} mid {mid}",
                    spec.fmt
                );
                assert_eq!(fp8::encode(next_down(mid32), spec.fmt), i as u8);
                assert_eq!(fp8::encode(next_up(mid32), spec.fmt), i as u8 + 1);
            } else {
                // Past max everything saturates.
                assert!(points
                    .iter()
                    .all(|x| fp8::encode(*x, spec.fmt) == spec.max_code));
            }
        }
        expected += 10 * (usize::from(spec.max_code) + 1);
    }
    assert_eq!(checked, expected);
    assert_eq!(checked, 10 * (127 + 128));
}

#[test]
fn special_values_encode_as_specified() {
    let p = |k: i32| 2f32.powi(k);
    #[rustfmt::skip]
    let cases: [(f32, u8, u8); 38] = [
        // input, e4m3fn code, e4m3fnuz code
        (f32::from_bits(0x7FC0_0000), 0x7F, 0x80),  // NaN
        (f32::from_bits(0xFFC0_0000), 0x7F, 0x80),  // -NaN: the sign is dropped, as the H200's cvt does
        (f32::from_bits(0x7F80_0001), 0x7F, 0x80),  // signalling NaN
        (f32::from_bits(0xFF80_0001), 0x7F, 0x80),
        (f32::from_bits(0x7FFF_FFFF), 0x7F, 0x80),  // NaN, all payload bits
        (f32::from_bits(0xFFFF_FFFF), 0x7F, 0x80),
        (f32::INFINITY, 0x7E, 0x7F),
        (f32::NEG_INFINITY, 0xFE, 0xFF),
        (0.0, 0x00, 0x00),
        (-0.0, 0x80, 0x00),                          // no negative zero in fnuz
        (f32::from_bits(1), 0x00, 0x00),             // f32 subnormals
        (f32::from_bits(0x8000_0001), 0x80, 0x00),
        (f32::from_bits(0x007F_FFFF), 0x00, 0x00),
        (f32::from_bits(0x807F_FFFF), 0x80, 0x00),
        (f32::MIN_POSITIVE, 0x00, 0x00),
        (-f32::MIN_POSITIVE, 0x80, 0x00),
        (-1e-30, 0x80, 0x00),                        // negative underflow
        (f32::MAX, 0x7E, 0x7F),
        (f32::MIN, 0xFE, 0xFF),
        (449.0, 0x7E, 0x7F),                         // between max and the next would-be code
        (464.0, 0x7E, 0x7F),
        (479.0, 0x7E, 0x7F),
        (480.0, 0x7E, 0x7F),
        (-1e6, 0xFE, 0xFF),
        (240.0, 0x77, 0x7F),
        (241.0, 0x77, 0x7F),
        (248.0, 0x78, 0x7F),                         // fn: tie 240 (odd) / 256 (even)
        (1.0, 0x38, 0x40),
        (1.0625, 0x38, 0x40),                        // tie between 1 (even) and 1.125
        (1.1875, 0x3A, 0x42),                        // tie between 1.125 and 1.25 (even)
        (p(-9), 0x01, 0x02),
        (p(-10), 0x00, 0x01),                        // fn: tie between 0 and 0x01
        (p(-11), 0x00, 0x00),                        // fnuz: tie between 0 and 0x01
        (-p(-11), 0x80, 0x00),
        (1.5 * p(-10), 0x01, 0x02),                  // fnuz: tie 0x01 / 0x02
        (7.5 * p(-9), 0x08, 0x0F),                   // fn: tie last subnormal / first normal
        (15.5 * p(-10), 0x08, 0x10),                 // fnuz: tie 0x0F (15 * 2^-10) / 0x10 (2^-6)
        (p(-6), 0x08, 0x10),
    ];
    let [fn_spec, uz_spec] = specs();
    for (x, want_fn, want_uz) in cases {
        assert_eq!(
            fp8::encode(x, Fp8Format::E4m3Fn),
            want_fn,
            "fn {x:e} ({:#010x})",
            x.to_bits()
        );
        assert_eq!(
            fp8::encode(x, Fp8Format::E4m3Fnuz),
            want_uz,
            "fnuz {x:e} ({:#010x})",
            x.to_bits()
        );
        check_encode(&fn_spec, x);
        check_encode(&uz_spec, x);
    }
}

/// All 65536 bf16 bit patterns: with a power-of-two scale this is every value
/// a bf16 tile can present to the encoder.
#[test]
fn every_bf16_value_encodes_like_the_reference() {
    let mut checked = 0;
    for spec in specs() {
        for h in 0..=u16::MAX {
            check_encode(&spec, bf16::from_bits(h).to_f32());
            checked += 1;
        }
    }
    assert_eq!(checked, 2 * 65536);
}

#[test]
fn random_f32_values_encode_like_the_reference() {
    let (mut rng, seed) = seeded("random_f32_values_encode_like_the_reference");
    const N: usize = 1 << 19;
    let mut checked = 0;
    for spec in specs() {
        for i in 0..N {
            let bits = if i % 2 == 0 {
                // Around the format's range: exponents 2^-14 .. 2^9.
                let exp: u32 = rng.random_range(127 - 14..=127 + 9);
                (rng.random::<u32>() & 0x807F_FFFF) | (exp << 23)
            } else {
                rng.random()
            };
            let x = f32::from_bits(bits);
            let (got, want) = (fp8::encode(x, spec.fmt), spec.encode(x));
            assert_eq!(
                got, want,
                "{:?} {bits:#010x} (UNIKV_TEST_SEED={seed})",
                spec.fmt
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 2 * N);
}

// ---------------------------------------------------------------------------
// UE8M0 scales

#[track_caller]
fn check_scale(spec: &Spec, amax: f32) -> u8 {
    let (got, want) = (fp8::ue8m0_scale_byte(amax, spec.fmt), spec.scale_byte(amax));
    assert_eq!(
        got,
        want,
        "{:?} amax {amax:e} ({:#010x})",
        spec.fmt,
        amax.to_bits()
    );
    got
}

/// amax = max * 2^k gives 2^k exactly; one ULP above rounds up to 2^(k+1); one
/// below stays at 2^k. A window of ULPs around each checks the boundary.
#[test]
fn ue8m0_exact_powers_of_two_stay_and_anything_above_rounds_up() {
    let mut checked = 0;
    for spec in specs() {
        // k from the first power whose amax clears the 1e-4 floor to the last
        // whose amax is finite.
        let k_min = (1e-4 / spec.max).log2().ceil() as i32;
        let k_max = (f64::from(f32::MAX) / spec.max).log2().floor() as i32;
        assert_eq!(
            (k_min, k_max),
            if spec.fnuz { (-21, 120) } else { (-22, 119) }
        );
        for k in k_min..=k_max {
            let amax = (spec.max * 2f64.powi(k)) as f32;
            assert_eq!(f64::from(amax), spec.max * 2f64.powi(k));
            let byte = (127 + k) as u8;
            assert_eq!(check_scale(&spec, amax), byte);
            assert_eq!(check_scale(&spec, next_down(amax)), byte);
            if k < k_max {
                assert_eq!(check_scale(&spec, next_up(amax)), byte + 1);
            }
            for d in 1..=64 {
                check_scale(&spec, f32::from_bits(amax.to_bits() + d));
                check_scale(&spec, f32::from_bits(amax.to_bits() - d));
            }
            checked += 1;
        }
    }
    assert_eq!(checked, (119 + 22 + 1) + (120 + 21 + 1));
}

#[test]
fn ue8m0_floor_applies_to_zero_tiny_negative_and_nan() {
    let mut checked = 0;
    for spec in specs() {
        let floor_byte = if spec.fnuz { 106 } else { 105 };
        for amax in [
            0.0,
            -0.0,
            f32::from_bits(1),
            1e-30,
            next_down(1e-4),
            1e-4,
            -5.0,
            f32::NEG_INFINITY,
            f32::NAN,
        ] {
            assert_eq!(
                check_scale(&spec, amax),
                floor_byte,
                "{:?} {amax:e}",
                spec.fmt
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 18);
}

#[test]
fn ue8m0_huge_amax_and_inf() {
    for spec in specs() {
        let top = check_scale(&spec, f32::MAX);
        assert_eq!(top, if spec.fnuz { 248 } else { 247 });
        // The largest finite tile still fits: amax / scale <= max.
        assert!(f64::from(f32::MAX) / 2f64.powi(i32::from(top) - 127) <= spec.max);
        assert_eq!(check_scale(&spec, f32::INFINITY), 254, "clamped from 255");
    }
}

#[test]
fn ue8m0_matches_the_reference_for_every_bf16_amax() {
    let mut checked = 0;
    for spec in specs() {
        for h in 0..=u16::MAX {
            check_scale(&spec, bf16::from_bits(h).to_f32());
            checked += 1;
        }
    }
    assert_eq!(checked, 2 * 65536);
}

#[test]
fn ue8m0_bytes_decode_to_powers_of_two() {
    let mut checked = 0;
    for byte in 0..=255u8 {
        let got = fp8::ue8m0_to_f32(byte);
        if byte == 255 {
            assert!(got.is_nan());
        } else {
            assert_eq!(
                f64::from(got),
                2f64.powi(i32::from(byte) - 127),
                "byte {byte}"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 256);
}

// ---------------------------------------------------------------------------
// bf16 rounding

/// Round to 8 significant bits, ties to even, in f64 (bf16 subnormals keep the
/// 2^-133 step; past the largest bf16 the result is Inf).
fn ref_bf16(x: f32) -> f64 {
    let x = f64::from(x);
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let e = (x.abs().log2().floor() as i32).max(-126);
    let step = 2f64.powi(e - 7);
    let q = x / step;
    let r = q.round();
    let r = if (q - q.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - q.signum()
    } else {
        r
    };
    let y = r * step;
    if y.abs() >= 2f64.powi(128) {
        f64::INFINITY.copysign(x)
    } else {
        y
    }
}

#[test]
fn bf16_round_is_round_to_nearest_even() {
    let p = |k: i32| 2f32.powi(k);
    assert_eq!(fp8::bf16_round(1.0 + p(-8)), 1.0);
    assert_eq!(fp8::bf16_round(1.0 + 3.0 * p(-8)), 1.0 + p(-6));
    assert_eq!(fp8::bf16_round(1.0 + p(-8) + p(-20)), 1.0 + p(-7));
    assert_eq!(fp8::bf16_round(f32::MAX), f32::INFINITY);
    assert_eq!(fp8::bf16_round(-0.0).to_bits(), (-0.0f32).to_bits());
    assert!(fp8::bf16_round(f32::NAN).is_nan());
    let (mut rng, seed) = seeded("bf16_round_is_round_to_nearest_even");
    const N: usize = 1 << 16;
    for _ in 0..N {
        let x = f32::from_bits(rng.random::<u32>());
        if x.is_nan() {
            continue;
        }
        assert_eq!(
            f64::from(fp8::bf16_round(x)),
            ref_bf16(x),
            "{:#010x} (UNIKV_TEST_SEED={seed})",
            x.to_bits()
        );
    }
}

// ---------------------------------------------------------------------------
// Block quantization

const TILE: usize = 64;

/// Quantizes twice over two different poisons so an unwritten code shows.
fn quantize(values: &[f32], fmt: Fp8Format) -> (u8, Vec<u8>) {
    let mut a = vec![0xA5u8; values.len()];
    let mut b = vec![0x5Au8; values.len()];
    let byte_a = fp8::quantize_block(values, fmt, &mut a);
    let byte_b = fp8::quantize_block(values, fmt, &mut b);
    assert_eq!((byte_a, &a), (byte_b, &b), "every code is written");
    (byte_a, a)
}

#[test]
fn quantize_block_matches_the_reference_and_errs_by_at_most_half_a_step() {
    let (mut rng, seed) =
        seeded("quantize_block_matches_the_reference_and_errs_by_at_most_half_a_step");
    const TILES: usize = 4000;
    let mut checked = 0;
    for spec in specs() {
        for t in 0..TILES {
            let k: i32 = rng.random_range(-40..=40);
            let mut values: Vec<f32> = (0..TILE)
                .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0) * 2f32.powi(k)).to_f32())
                .collect();
            if t % 4 == 0 {
                let at = rng.random_range(0..TILE);
                values[at] = bf16::from_f32(values[at] * rng.random_range(1.0f32..1000.0)).to_f32();
            }
            let (byte, codes) = quantize(&values, spec.fmt);
            let amax = values
                .iter()
                .map(|v| f64::from(*v).abs())
                .fold(0.0, f64::max);
            let ctx = format!("{:?} tile {t} (UNIKV_TEST_SEED={seed})", spec.fmt);
            assert_eq!(byte, spec.scale_byte(amax as f32), "{ctx}");
            let scale = 2f64.powi(i32::from(byte) - 127);
            if amax >= 1e-4 {
                // Rounded up to a power of two: the tile fills (max/2, max].
                assert!(
                    amax / scale > spec.max / 2.0 && amax / scale <= spec.max,
                    "{ctx}"
                );
            }
            for (v, code) in values.iter().zip(&codes) {
                let x = f64::from(*v) / scale;
                assert_eq!(*code, spec.encode(x as f32), "{ctx}: {v:e}");
                let err = (spec.value(*code).unwrap() - x).abs();
                assert!(err <= spec.half_step(x.abs()), "{ctx}: {v:e} err {err:e}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 2 * TILES * TILE);
}

#[test]
fn quantize_block_special_tiles() {
    for spec in specs() {
        let fmt = spec.fmt;
        let floor_byte = if spec.fnuz { 106 } else { 105 };
        let neg_zero = if spec.fnuz { 0x00 } else { 0x80 };

        // NaN is ignored by amax and stays NaN.
        let (byte, codes) = quantize(&[1.0, f32::NAN, -0.5, -f32::NAN], fmt);
        assert_eq!(byte, spec.scale_byte(1.0));
        assert_eq!(
            byte,
            if spec.fnuz { 120 } else { 119 },
            "1/448 -> 2^-8, 1/240 -> 2^-7"
        );
        let half_code = spec.encode(-0.5 * 2f32.powi(127 - i32::from(byte)));
        let one_code = spec.encode(2f32.powi(127 - i32::from(byte)));
        assert_eq!(
            codes,
            [
                one_code,
                spec.encode(f32::NAN),
                half_code,
                spec.encode(-f32::NAN)
            ]
        );

        // Inf clamps the scale to 2^127 and saturates; finite values vanish.
        let (byte, codes) = quantize(&[f32::INFINITY, 1.0, -1.0, f32::NEG_INFINITY], fmt);
        assert_eq!(byte, 254);
        assert_eq!(codes, [spec.max_code, 0x00, neg_zero, 0x80 | spec.max_code]);

        // Zeros take the floor scale and keep their sign under fn.
        let (byte, codes) = quantize(&[0.0, -0.0, 0.0, -0.0], fmt);
        assert_eq!(
            (byte, codes),
            (floor_byte, vec![0x00, neg_zero, 0x00, neg_zero])
        );

        let (byte, codes) = quantize(&[f32::NAN; 4], fmt);
        assert_eq!(byte, floor_byte);
        assert!(codes.iter().all(|c| fp8::decode(*c, fmt).is_nan()));

        assert_eq!(quantize(&[], fmt), (floor_byte, vec![]));
    }
}

#[test]
#[should_panic(expected = "one code per value")]
fn quantize_block_needs_one_code_per_value() {
    fp8::quantize_block(&[1.0, 2.0], Fp8Format::E4m3Fn, &mut [0u8; 1]);
}
