//! The FlashMLA FP8 KV cache and indexer key cache layouts
//! (`unikv::cache_layouts`, spec store_fused §1.1, §1.2, §2.3).
//!
//! Three kinds of check:
//! * literal bytes for hand-computed inputs (each expected scale byte and code
//!   is derived in a comment), at literal offsets, comparing the whole buffer;
//! * bad input (unsupported page sizes, short rows, partial pages, locations
//!   past the end) fails with a typed error and leaves the buffer as it was, and
//!   negative locations write nothing;
//! * random rows at random locations across pages against an independent
//!   float64 reference written here from the spec (code table from the format
//!   fields, nearest code with ties to even, UE8M0 as the smallest power of two
//!   not below the scale), byte for byte over the whole buffer, then the
//!   dequantized values against that reference exactly and against the input
//!   within half a quantization step and the spec §8 tolerance.
//!
//! Random tests draw fresh inputs each run; the seed is printed. Rerun a failure
//! with `UNIKV_TEST_SEED=<seed>`.

mod common;

use common::seeded;
use half::bf16;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use unikv::cache_layouts::flashmla::{self, FlashMlaGeometry};
use unikv::cache_layouts::indexer::{self, IndexerGeometry};
use unikv::error::Error;
use unikv::fp8::Fp8Format::{self, E4m3Fn, E4m3Fnuz};

/// Byte pattern a buffer starts with in the literal tests, so unwritten bytes
/// show.
const POISON: u8 = 0xA5;

fn bf16s(values: &[f32]) -> Vec<bf16> {
    values.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// `pattern` repeated to `len` values.
fn repeat(pattern: &[f32], len: usize) -> Vec<f32> {
    pattern.iter().copied().cycle().take(len).collect()
}

// ---------------------------------------------------------------------------
// Independent reference (spec §2.1 format table, §2.3 scales, §1 offsets)
// ---------------------------------------------------------------------------

/// One FP8 flavour from the spec's format table: code values from the fields,
/// round to the nearest code (ties to the even code), saturate at max.
struct Fp8Ref {
    fnuz: bool,
    max: f64,
    /// Values of the non-negative finite codes 0..=max code, indexed by code.
    values: Vec<f64>,
    /// Where the code after max would sit: the top binade's step past max.
    beyond_max: f64,
}

impl Fp8Ref {
    fn new(fmt: Fp8Format) -> Self {
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
    fn value(&self, code: u8) -> f64 {
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
    fn encode(&self, x: f64) -> u8 {
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
    fn half_step(&self, mag: f64) -> f64 {
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
    fn scale_quotient(&self, amax: f32) -> f32 {
        let floored = if amax > 1e-4 { amax } else { 1e-4f32 };
        (f64::from(floored) / self.max) as f32
    }

    /// The UE8M0 byte: 127 + the smallest k with 2^k >= the fp32 quotient.
    fn scale_byte(&self, amax: f32) -> u8 {
        let q = f64::from(self.scale_quotient(amax));
        let mut k = -127i32;
        while 2f64.powi(k) < q {
            k += 1;
        }
        (k + 127) as u8
    }
}

/// Spec §1.1: `bytes_per_page = ceil(584·P / 576)·576`; value slots of 576 bytes,
/// then scale slots of 8. Returns (value offset, scale offset) of `loc`.
fn ref_flashmla_offsets(p: u64, loc: u64) -> (u64, u64) {
    let bytes_per_page = (584 * p).div_ceil(576) * 576;
    let (page, slot) = (loc / p, loc % p);
    (
        page * bytes_per_page + slot * 576,
        page * bytes_per_page + 576 * p + slot * 8,
    )
}

/// Spec §1.2: pages of 132·P bytes, 128 codes per key, then fp32 scales.
/// Returns (value offset, scale offset) of `loc`.
fn ref_indexer_offsets(p: u64, loc: u64) -> (u64, u64) {
    let (page, slot) = (loc / p, loc % p);
    (
        page * 132 * p + slot * 128,
        page * 132 * p + 128 * p + slot * 4,
    )
}

/// Spec §1.1 / §2.3 for one token: per 64-dim nope tile the UE8M0 byte of its
/// amax and codes of x / 2^(byte-127); the RoPE dims' bf16 bits little-endian.
/// Returns (576 value-slot bytes, 7 scale bytes).
fn ref_flashmla_token(row: &[bf16], f: &Fp8Ref) -> (Vec<u8>, Vec<u8>) {
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

/// Spec §2.3 for one indexer key, each fp32 operation done in float64 and
/// rounded to f32 (exact for a quotient, reciprocal or product of two floats):
/// scale = max(amax, 1e-4) / max, inv = 1 / scale, code = fp8(fp32(x · inv)).
/// Returns (codes, scale, the fp32 values x · inv that were encoded).
fn ref_indexer_key(key: &[f32], f: &Fp8Ref) -> (Vec<u8>, f32, Vec<f32>) {
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

// ---------------------------------------------------------------------------
// Geometry
// ---------------------------------------------------------------------------

#[test]
fn flashmla_page_stride_is_rounded_up_to_576() {
    // Spec §1.1 table: 584·P rounded up to a multiple of 576, and the padding.
    for (p, bytes_per_page, padding) in [(2, 1_728, 560), (64, 37_440, 64), (256, 149_760, 256)] {
        for fmt in [E4m3Fn, E4m3Fnuz] {
            let g = FlashMlaGeometry::new(p, fmt).unwrap();
            assert_eq!(g.page_size(), p);
            assert_eq!(g.format(), fmt);
            assert_eq!(g.bytes_per_page(), bytes_per_page, "P = {p}");
            assert_eq!(bytes_per_page - 584 * p, padding, "P = {p}");
            assert_eq!(bytes_per_page % 576, 0);
        }
    }
}

#[test]
fn flashmla_offsets_at_page_boundaries() {
    // (P, loc, value, rope = value + 448, scale): first and last slot of page
    // 0 and of a later page. Page p starts at p·bytes_per_page; its scale
    // slots start 576·P bytes in.
    let cases: [(u64, u64, u64, u64, u64); 14] = [
        // P = 2: pages of 1 728 bytes, scale slots at +1 152.
        (2, 0, 0, 448, 1_152),
        (2, 1, 576, 1_024, 1_160),
        (2, 2, 1_728, 2_176, 2_880),
        (2, 3, 2_304, 2_752, 2_888),
        (2, 9, 7_488, 7_936, 8_072), // page 4, slot 1
        // P = 64: pages of 37 440 bytes, scale slots at +36 864.
        (64, 0, 0, 448, 36_864),
        (64, 63, 36_288, 36_736, 37_368),
        (64, 64, 37_440, 37_888, 74_304),
        (64, 127, 73_728, 74_176, 74_808),
        // P = 256: pages of 149 760 bytes, scale slots at +147 456.
        (256, 0, 0, 448, 147_456),
        (256, 255, 146_880, 147_328, 149_496),
        (256, 256, 149_760, 150_208, 297_216),
        (256, 511, 296_640, 297_088, 299_256),
        (256, 1_024, 599_040, 599_488, 746_496), // page 4, slot 0
    ];
    for (p, loc, value, rope, scale) in cases {
        let g = FlashMlaGeometry::new(p, E4m3Fn).unwrap();
        assert_eq!(g.value_offset(loc), value, "P = {p}, loc {loc}");
        assert_eq!(g.rope_offset(loc), rope, "P = {p}, loc {loc}");
        assert_eq!(g.scale_offset(loc), scale, "P = {p}, loc {loc}");
        assert_eq!(ref_flashmla_offsets(p, loc), (value, scale));
    }
}

#[test]
fn offsets_are_64_bit() {
    // Spec §1.1: a per-layer cache passes 2 GiB (~3.68 M tokens); 32-bit byte
    // offsets faulted. loc 4 000 000 = page 15 625 of 149 760 bytes.
    let g = FlashMlaGeometry::new(256, E4m3Fn).unwrap();
    assert_eq!(g.value_offset(4_000_000), 2_340_000_000);
    assert_eq!(g.rope_offset(4_000_000), 2_340_000_448);
    assert_eq!(g.scale_offset(4_000_000), 2_340_147_456);
    assert_eq!(g.value_offset(4_000_255), 2_340_146_880);
    assert_eq!(g.scale_offset(4_000_255), 2_340_149_496);
    // Indexer: loc 2^26 = page 2^20 of 8 448 bytes, past 4 GiB.
    let g = IndexerGeometry::new(64, E4m3Fn).unwrap();
    assert_eq!(g.value_offset(1 << 26), 8_858_370_048);
    assert_eq!(g.scale_offset(1 << 26), 8_858_378_240);
}

#[test]
fn indexer_offsets_at_page_boundaries() {
    // Pages of 132·64 = 8 448 bytes: 64 × 128 codes, then 64 × 4 scale bytes
    // from +8 192. (loc, value, scale): first and last slot of pages 0, 1, 5.
    let g = IndexerGeometry::new(64, E4m3Fnuz).unwrap();
    assert_eq!(g.page_size(), 64);
    assert_eq!(g.format(), E4m3Fnuz);
    assert_eq!(g.bytes_per_page(), 8_448);
    let cases: [(u64, u64, u64); 6] = [
        (0, 0, 8_192),
        (63, 8_064, 8_444),
        (64, 8_448, 16_640),
        (127, 16_512, 16_892),
        (320, 42_240, 50_432),
        (383, 50_304, 50_684),
    ];
    for (loc, value, scale) in cases {
        assert_eq!(g.value_offset(loc), value, "loc {loc}");
        assert_eq!(g.scale_offset(loc), scale, "loc {loc}");
        assert_eq!(ref_indexer_offsets(64, loc), (value, scale));
    }
}

#[test]
fn unsupported_page_sizes_are_rejected() {
    let mut checked = 0;
    for p in [0, 1, 3, 4, 32, 63, 128, 255, 257, 512, u64::MAX] {
        for fmt in [E4m3Fn, E4m3Fnuz] {
            let e = FlashMlaGeometry::new(p, fmt).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
            assert!(e.to_string().starts_with("page_size"), "{e}");
            checked += 1;
        }
    }
    for p in [0, 1, 2, 32, 63, 65, 128, 256, u64::MAX] {
        let e = IndexerGeometry::new(p, E4m3Fn).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(e.to_string().starts_with("page_size"), "{e}");
        checked += 1;
    }
    for p in [2, 64, 256] {
        FlashMlaGeometry::new(p, E4m3Fn).unwrap();
    }
    IndexerGeometry::new(64, E4m3Fn).unwrap();
    assert_eq!(checked, 31);
}

// ---------------------------------------------------------------------------
// FlashMLA literal bytes
// ---------------------------------------------------------------------------

/// Tile 6 of `literal_row`: x_i = i/8 for i in 0..64. amax 7.875; 7.875/448 =
/// 1.125·2^-6 rounds up to 2^-5 (byte 122 = 0x7A), so x_i / scale = 4i, and
/// these are the E4M3FN codes of 4i: exact up to 16, then rounded to steps of 2
/// (from 16), 4 (32), 8 (64), 16 (128) with ties to the even mantissa (68 ->
/// 64, 76 -> 80, 124 -> 128, 136 -> 128, 248 -> 256). Under fnuz the scale is
/// 2^-4 (7.875/240 = 1.05·2^-5) and the codes of 2i are the same bytes.
const RAMP_CODES: [u8; 64] = [
    0x00, 0x48, 0x50, 0x54, 0x58, 0x5A, 0x5C, 0x5E, 0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67,
    0x68, 0x68, 0x69, 0x6A, 0x6A, 0x6A, 0x6B, 0x6C, 0x6C, 0x6C, 0x6D, 0x6E, 0x6E, 0x6E, 0x6F, 0x70,
    0x70, 0x70, 0x70, 0x71, 0x71, 0x71, 0x72, 0x72, 0x72, 0x72, 0x72, 0x73, 0x73, 0x73, 0x74, 0x74,
    0x74, 0x74, 0x74, 0x75, 0x75, 0x75, 0x76, 0x76, 0x76, 0x76, 0x76, 0x77, 0x77, 0x77, 0x78, 0x78,
];

/// The RoPE dims of `literal_row`: (-1)^j (1 + j/128), whose bf16 bits are
/// 0x3F80 + j (even j) or 0xBF80 + j (odd j), stored little-endian.
const ROPE_BYTES: [u8; 128] = [
    0x80, 0x3F, 0x81, 0xBF, 0x82, 0x3F, 0x83, 0xBF, 0x84, 0x3F, 0x85, 0xBF, 0x86, 0x3F, 0x87, 0xBF,
    0x88, 0x3F, 0x89, 0xBF, 0x8A, 0x3F, 0x8B, 0xBF, 0x8C, 0x3F, 0x8D, 0xBF, 0x8E, 0x3F, 0x8F, 0xBF,
    0x90, 0x3F, 0x91, 0xBF, 0x92, 0x3F, 0x93, 0xBF, 0x94, 0x3F, 0x95, 0xBF, 0x96, 0x3F, 0x97, 0xBF,
    0x98, 0x3F, 0x99, 0xBF, 0x9A, 0x3F, 0x9B, 0xBF, 0x9C, 0x3F, 0x9D, 0xBF, 0x9E, 0x3F, 0x9F, 0xBF,
    0xA0, 0x3F, 0xA1, 0xBF, 0xA2, 0x3F, 0xA3, 0xBF, 0xA4, 0x3F, 0xA5, 0xBF, 0xA6, 0x3F, 0xA7, 0xBF,
    0xA8, 0x3F, 0xA9, 0xBF, 0xAA, 0x3F, 0xAB, 0xBF, 0xAC, 0x3F, 0xAD, 0xBF, 0xAE, 0x3F, 0xAF, 0xBF,
    0xB0, 0x3F, 0xB1, 0xBF, 0xB2, 0x3F, 0xB3, 0xBF, 0xB4, 0x3F, 0xB5, 0xBF, 0xB6, 0x3F, 0xB7, 0xBF,
    0xB8, 0x3F, 0xB9, 0xBF, 0xBA, 0x3F, 0xBB, 0xBF, 0xBC, 0x3F, 0xBD, 0xBF, 0xBE, 0x3F, 0xBF, 0xBF,
];

/// A latent row whose every tile has a hand-derivable scale and codes (see
/// the expectations in the two tests that store it).
fn literal_row() -> Vec<bf16> {
    let tiny = 2f32.powi(-20);
    let tiles = [
        repeat(&[1.0], 64),
        repeat(&[0.5, -0.25, 3.0, 0.0], 64),
        repeat(&[tiny], 64),
        repeat(&[-100.0], 64),
        repeat(&[448.0, 1.0], 64),
        repeat(&[7.0, 2f32.powi(-14), -tiny, -3.5], 64),
        (0..64).map(|i| i as f32 / 8.0).collect(),
        (0..64)
            .map(|j| (1.0 + j as f32 / 128.0) * if j % 2 == 1 { -1.0 } else { 1.0 })
            .collect(),
    ];
    bf16s(&tiles.concat())
}

/// Stores `row` at location 3 of a two-page P = 2 cache (page 1, slot 1) and
/// returns the buffer: value slot at 1 728 + 576 = 2 304, rope at 2 752, scale
/// slot at 1 728 + 1 152 + 8 = 2 888.
fn store_at_page1_slot1(row: &[bf16], fmt: Fp8Format) -> Vec<u8> {
    let g = FlashMlaGeometry::new(2, fmt).unwrap();
    let mut cache = vec![POISON; 2 * 1_728];
    flashmla::store_token(&mut cache, &g, 3, row).unwrap();
    cache
}

/// The expected buffer of `store_at_page1_slot1`: poison everywhere except the
/// token's 448 codes, 128 rope bytes and 7 scale bytes (the scale slot's
/// padding byte 2 895 stays poisoned).
fn expected_page1_slot1(codes: &[u8], scales: [u8; 7]) -> Vec<u8> {
    let mut expected = vec![POISON; 2 * 1_728];
    expected[2_304..2_752].copy_from_slice(codes);
    expected[2_752..2_880].copy_from_slice(&ROPE_BYTES);
    expected[2_888..2_895].copy_from_slice(&scales);
    expected
}

#[test]
fn flashmla_store_writes_literal_bytes_fn() {
    // Scale byte e: 2^(e-127) is max(amax, 1e-4)/448 rounded up to a power of
    // two; codes are E4M3FN (bias 7) of x / 2^(e-127).
    let codes = [
        // Tile 0, all 1.0: 1/448 = 1.14·2^-9 -> 2^-8 (byte 119); 1·256 = 2^8
        // -> exponent field 15, mantissa 0 = 0x78.
        vec![0x78; 64],
        // Tile 1, [0.5, -0.25, 3, 0]: 3/448 = 1.71·2^-8 -> 2^-7 (byte 120);
        // 64 = 0x68, -32 = 0x80|0x60, 384 = 1.5·2^8 = 0x7C, 0.
        [0x68, 0xE0, 0x7C, 0x00].repeat(16),
        // Tile 2, all 2^-20: below the 1e-4 floor, 1e-4/448 = 2.2e-7 -> 2^-22
        // (byte 105); 2^-20·2^22 = 4 = 0x48.
        vec![0x48; 64],
        // Tile 3, all -100: 100/448 = 1.79·2^-3 -> 2^-2 (byte 125); -400 is
        // halfway between 384 (mantissa 4) and 416 (5): ties to even, 0xFC.
        vec![0xFC; 64],
        // Tile 4, [448, 1]: 448/448 = 1 exactly stays 2^0 (byte 127); 448 =
        // 0x7E (max), 1 = 0x38.
        [0x7E, 0x38].repeat(32),
        // Tile 5, [7, 2^-14, -2^-20, -3.5]: 7/448 = 2^-6 exactly (byte 121);
        // 448 = 0x7E; 2^-8 is subnormal, 2 steps of 2^-9 = 0x02; -2^-14
        // underflows to negative zero 0x80; -224 = -1.75·2^7 = 0xF6.
        [0x7E, 0x02, 0x80, 0xF6].repeat(16),
        // Tile 6, the ramp i/8: byte 122, see RAMP_CODES.
        RAMP_CODES.to_vec(),
    ]
    .concat();
    let scales = [119, 120, 105, 125, 127, 121, 122];
    let cache = store_at_page1_slot1(&literal_row(), E4m3Fn);
    assert_eq!(cache, expected_page1_slot1(&codes, scales));

    // Every stored byte decodes exactly: code value times a power of two.
    let g = FlashMlaGeometry::new(2, E4m3Fn).unwrap();
    let got = flashmla::dequantize_token(&cache, &g, 3).unwrap();
    let f = Fp8Ref::new(E4m3Fn);
    let ramp: Vec<f32> = RAMP_CODES
        .iter()
        .map(|&c| (f.value(c) / 32.0) as f32)
        .collect();
    let want = [
        repeat(&[1.0], 64),
        repeat(&[0.5, -0.25, 3.0, 0.0], 64),
        repeat(&[2f32.powi(-20)], 64),
        repeat(&[-96.0], 64), // code 384 · 2^-2
        repeat(&[448.0, 1.0], 64),
        repeat(&[7.0, 2f32.powi(-14), -0.0, -3.5], 64),
        ramp,
        literal_row()[448..].iter().map(|x| x.to_f32()).collect(),
    ]
    .concat();
    assert_eq!(got, want);
    assert_eq!(got[448 + 1], -(1.0 + 1.0 / 128.0));
}

#[test]
fn flashmla_store_writes_literal_bytes_fnuz() {
    // Under E4M3FNUZ (bias 8, divisor 240) each quotient amax/240 is 1.87x
    // amax/448, so every scale here rounds up one binade higher and a code
    // means half as much: the same codes, scale bytes one higher. Tile by tile:
    // 1/240 -> 2^-7, 3/240 -> 2^-6, 1e-4/240 = 4.2e-7 -> 2^-21, 100/240 ->
    // 2^-1 (-200 ties to 192), 448/240 -> 2^1, 7/240 -> 2^-5, 7.875/240 ->
    // 2^-4. The one difference: -2^-20·2^5 underflows to 0x00, since 0x80 is
    // the fnuz NaN.
    let codes = [
        vec![0x78; 64],
        [0x68, 0xE0, 0x7C, 0x00].repeat(16),
        vec![0x48; 64],
        vec![0xFC; 64],
        [0x7E, 0x38].repeat(32),
        [0x7E, 0x02, 0x00, 0xF6].repeat(16),
        RAMP_CODES.to_vec(),
    ]
    .concat();
    let scales = [120, 121, 106, 126, 128, 122, 123];
    let cache = store_at_page1_slot1(&literal_row(), E4m3Fnuz);
    assert_eq!(cache, expected_page1_slot1(&codes, scales));
}

#[test]
fn flashmla_store_special_values_literal_bytes() {
    // Location 63 of a one-page P = 64 cache: the last slot of the page, value
    // slot at 63·576 = 36 288, rope at 36 736, scale slot at 36 864 + 504 =
    // 37 368 (its padding byte 37 375 and the page's 64 tail bytes from 37 376
    // stay poisoned).
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let values = [
        // NaN is ignored by amax (2 -> 2/448 -> 2^-7, byte 120) and encodes to
        // the NaN code 0x7F; 2·128 = 256 = 0x78.
        repeat(&[nan, 2.0], 64),
        // An Inf amax gives byte 254 (scale 2^127): ±Inf saturates to ±448
        // (0x7E, 0xFE), ±1·2^-127 underflows to 0x00 / 0x80.
        repeat(&[inf, 1.0, -inf, -1.0], 64),
        // Zeros: the amax floor gives byte 105, codes +0 / -0.
        repeat(&[0.0, -0.0], 64),
        // Tiles 3-6 all 1.0 as in the literal row: byte 119, code 0x78.
        repeat(&[1.0], 256),
    ]
    .concat();
    let mut row = bf16s(&values);
    // The RoPE dims are copied bit for bit, NaN payload and sign included.
    let rope_bits = [0xFFC1u16, 0x7F80, 0x8000, 0x3F80];
    row.extend((0..64).map(|j| bf16::from_bits(rope_bits[j % 4])));

    let g = FlashMlaGeometry::new(64, E4m3Fn).unwrap();
    let mut cache = vec![POISON; 37_440];
    flashmla::store_token(&mut cache, &g, 63, &row).unwrap();

    let mut expected = vec![POISON; 37_440];
    let codes = [
        [0x7F, 0x78].repeat(32),
        [0x7E, 0x00, 0xFE, 0x80].repeat(16),
        [0x00, 0x80].repeat(32),
        vec![0x78; 256],
    ]
    .concat();
    expected[36_288..36_736].copy_from_slice(&codes);
    expected[36_736..36_864]
        .copy_from_slice(&[0xC1, 0xFF, 0x80, 0x7F, 0x00, 0x80, 0x80, 0x3F].repeat(16));
    expected[37_368..37_375].copy_from_slice(&[120, 254, 105, 119, 119, 119, 119]);
    assert_eq!(cache, expected);
}

// ---------------------------------------------------------------------------
// Indexer literal bytes
// ---------------------------------------------------------------------------

#[test]
fn indexer_store_writes_literal_bytes() {
    // Two pages of 8 448 bytes (P = 64). Scale = max(amax, 1e-4)/448 in fp32,
    // inv = fp32(1/scale), code = E4M3FN of fp32(x · inv).
    let g = IndexerGeometry::new(64, E4m3Fn).unwrap();
    let mut cache = vec![POISON; 2 * 8_448];
    // Location 0 (page 0, slot 0: codes 0..128, scale 8 192..8 196):
    // [448, -1, 0.5, 3], amax 448, scale 1.0 exactly (bytes 00 00 80 3F),
    // inv 1: codes 448 = 0x7E, -1 = 0xB8, 0.5 = 0x30, 3 = 1.5·2 = 0x44.
    let a = repeat(&[448.0, -1.0, 0.5, 3.0], 128);
    // Location 64 (page 1, slot 0: codes 8 448..8 576, scale 16 640..16 644):
    // all 2^-20, below the 1e-4 floor: scale = fp32(1e-4)/448 = 0x346FACAD,
    // inv = 4 480 000, 2^-20·inv = 4.2725 -> nearest code 4.5 = 0x49.
    let c = repeat(&[2f32.powi(-20)], 128);
    // Location 127 (page 1, slot 63, the cache's last: codes 16 512..16 640,
    // scale 16 892..16 896): [3, 1, -0.5, 0.25], amax 3, scale 3/448 =
    // 0x3BDB6DB7, inv = 149.33333: 3·inv = 448 = 0x7E; 149.3 -> 144 = 0x71;
    // -74.7 -> -72 = 0xE9; 37.3 -> 36 = 0x61.
    let b = repeat(&[3.0, 1.0, -0.5, 0.25], 128);
    for (loc, key) in [(0, &a), (64, &c), (127, &b)] {
        indexer::store_token(&mut cache, &g, loc, key).unwrap();
    }

    let mut expected = vec![POISON; 2 * 8_448];
    expected[0..128].copy_from_slice(&[0x7E, 0xB8, 0x30, 0x44].repeat(32));
    expected[8_192..8_196].copy_from_slice(&[0x00, 0x00, 0x80, 0x3F]);
    expected[8_448..8_576].copy_from_slice(&[0x49; 128]);
    expected[16_640..16_644].copy_from_slice(&[0xAD, 0xAC, 0x6F, 0x34]);
    expected[16_512..16_640].copy_from_slice(&[0x7E, 0x71, 0xE9, 0x61].repeat(32));
    expected[16_892..16_896].copy_from_slice(&[0xB7, 0x6D, 0xDB, 0x3B]);
    assert_eq!(cache, expected);

    // Dequantized: code value · scale, one fp32 rounding (bits below are the
    // correctly rounded products).
    let got = indexer::dequantize_token(&cache, &g, 0).unwrap();
    assert_eq!(got, a);
    let got = indexer::dequantize_token(&cache, &g, 64).unwrap();
    assert_eq!(got, vec![f32::from_bits(0x3586_D121); 128]); // 4.5 · scale
    let got = indexer::dequantize_token(&cache, &g, 127).unwrap();
    let want = [0x4040_0000, 0x3F76_DB6E, 0xBEF6_DB6E, 0x3E76_DB6E].map(f32::from_bits);
    assert_eq!(got, repeat(&want, 128)); // 3.0, 144·s, -72·s, 36·s
}

#[test]
fn indexer_store_writes_literal_bytes_fnuz() {
    // E4M3FNUZ divides by 240: [240, -1, 0.5, 3] has scale 1.0 exactly and its
    // codes show the bias of 8: 240 = 0x7F (fnuz max), -1 = 0x80|0x40, 0.5 =
    // 0x38, 3 = 1.5·2 = 0x4C. Location 65: page 1, slot 1, codes at 8 448 +
    // 128, scale at 8 448 + 8 192 + 4.
    let g = IndexerGeometry::new(64, E4m3Fnuz).unwrap();
    let mut cache = vec![POISON; 2 * 8_448];
    let key = repeat(&[240.0, -1.0, 0.5, 3.0], 128);
    indexer::store_token(&mut cache, &g, 65, &key).unwrap();
    let mut expected = vec![POISON; 2 * 8_448];
    expected[8_576..8_704].copy_from_slice(&[0x7F, 0xC0, 0x38, 0x4C].repeat(32));
    expected[16_644..16_648].copy_from_slice(&[0x00, 0x00, 0x80, 0x3F]);
    assert_eq!(cache, expected);
    assert_eq!(indexer::dequantize_token(&cache, &g, 65).unwrap(), key);
}

#[test]
fn indexer_codes_come_from_the_reciprocal_product() {
    // Spec §2.3 multiplies by inv = fp32(1/scale) rather than dividing by the
    // scale; the two differ by an fp32 ulp, which decides FP8 ties. Key [1, a,
    // b, -a] with a = 0x3B9B6DB8 and b = 0x3B76DB6E: scale = 1/448 = 0x3B124925,
    // inv = 447.99997.
    // a·inv = 2.125 exactly, halfway between 2 (0x40) and 2.25: ties to even,
    // 0x40 (a/scale = 2.1250002 would give 0x41).
    // b·inv = 1.6874999, below the midpoint 1.6875: 1.625 = 0x3D (b/scale =
    // 1.6875 would tie to even, 1.75 = 0x3E).
    let a = f32::from_bits(0x3B9B_6DB8);
    let b = f32::from_bits(0x3B76_DB6E);
    let g = IndexerGeometry::new(64, E4m3Fn).unwrap();
    let mut cache = vec![POISON; 8_448];
    // Location 5: codes at 5·128 = 640, scale at 8 192 + 20.
    indexer::store_token(&mut cache, &g, 5, &repeat(&[1.0, a, b, -a], 128)).unwrap();
    let mut expected = vec![POISON; 8_448];
    expected[640..768].copy_from_slice(&[0x7E, 0x40, 0x3D, 0xC0].repeat(32));
    expected[8_212..8_216].copy_from_slice(&[0x25, 0x49, 0x12, 0x3B]);
    assert_eq!(cache, expected);
}

#[test]
fn indexer_store_special_values_literal_bytes() {
    let g = IndexerGeometry::new(64, E4m3Fn).unwrap();
    let mut cache = vec![POISON; 8_448];
    // Location 1: [NaN, 2]: amax ignores NaN, scale 2/448 = 0x3B924925, inv
    // 223.99998; NaN -> 0x7F, 2·inv = 447.99997 -> 448 = 0x7E.
    indexer::store_token(&mut cache, &g, 1, &repeat(&[f32::NAN, 2.0], 128)).unwrap();
    // Location 2: [Inf, 1, -1, -Inf]: scale Inf (00 00 80 7F), inv 0, so ±Inf·0
    // = NaN -> 0x7F and ±1·0 = ±0 -> 0x00 / 0x80 (see indexer::store_token).
    let inf = f32::INFINITY;
    indexer::store_token(&mut cache, &g, 2, &repeat(&[inf, 1.0, -1.0, -inf], 128)).unwrap();

    let mut expected = vec![POISON; 8_448];
    expected[128..256].copy_from_slice(&[0x7F, 0x7E].repeat(64));
    expected[8_196..8_200].copy_from_slice(&[0x25, 0x49, 0x92, 0x3B]);
    expected[256..384].copy_from_slice(&[0x7F, 0x00, 0x80, 0x7F].repeat(32));
    expected[8_200..8_204].copy_from_slice(&[0x00, 0x00, 0x80, 0x7F]);
    assert_eq!(cache, expected);
}

// ---------------------------------------------------------------------------
// Skipped and bad input: nothing written
// ---------------------------------------------------------------------------

fn random_bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.random()).collect()
}

fn random_flashmla_row(rng: &mut StdRng) -> Vec<bf16> {
    let mut row = Vec::with_capacity(512);
    for _ in 0..8 {
        // Per-tile magnitudes from 2^-16 (below the amax floor) to 2^12.
        let magnitude = 2f32.powf(rng.random_range(-16.0..12.0));
        row.extend((0..64).map(|_| bf16::from_f32(magnitude * rng.random_range(-1.0..1.0))));
    }
    row
}

fn random_key(rng: &mut StdRng) -> Vec<f32> {
    let magnitude = 2f32.powf(rng.random_range(-16.0..12.0));
    (0..128)
        .map(|_| magnitude * rng.random_range(-1.0f32..1.0))
        .collect()
}

#[test]
fn negative_locations_write_nothing() {
    let (mut rng, _) = seeded("negative_locations_write_nothing");
    let mut checked = 0;
    for p in [2, 64, 256] {
        let g = FlashMlaGeometry::new(p, E4m3Fn).unwrap();
        let mut cache = random_bytes(&mut rng, 2 * g.bytes_per_page() as usize);
        let before = cache.clone();
        for loc in [-1, -2, -(p as i64), i64::MIN] {
            let row = random_flashmla_row(&mut rng);
            flashmla::store_token(&mut cache, &g, loc, &row).unwrap();
            assert_eq!(cache, before, "P = {p}, loc {loc}");
            checked += 1;
        }
    }
    let g = IndexerGeometry::new(64, E4m3Fnuz).unwrap();
    let mut cache = random_bytes(&mut rng, 2 * 8_448);
    let before = cache.clone();
    for loc in [-1, -2, -64, i64::MIN] {
        indexer::store_token(&mut cache, &g, loc, &random_key(&mut rng)).unwrap();
        assert_eq!(cache, before, "loc {loc}");
        checked += 1;
    }
    assert_eq!(checked, 16);
}

/// Asserts an error of the expected kind whose message names `arg`.
#[track_caller]
fn assert_error(result: Result<(), Error>, kind: fn(&Error) -> bool, arg: &str) {
    let e = result.unwrap_err();
    assert!(kind(&e), "unexpected kind: {e:?}");
    assert!(e.to_string().starts_with(arg), "{e} does not name {arg}");
}

fn is_bad_shape(e: &Error) -> bool {
    matches!(e, Error::BadShape(_))
}

fn is_out_of_range(e: &Error) -> bool {
    matches!(e, Error::OutOfRange(_))
}

#[test]
fn flashmla_bad_input_writes_nothing() {
    let (mut rng, _) = seeded("flashmla_bad_input_writes_nothing");
    let g = FlashMlaGeometry::new(64, E4m3Fn).unwrap();
    let page = 37_440;
    let mut cache = random_bytes(&mut rng, 2 * page);
    let before = cache.clone();
    let row = random_flashmla_row(&mut rng);
    let mut checked = 0;

    // Past the last of the 128 token slots.
    for loc in [128, 129, 1 << 40, i64::MAX] {
        let result = flashmla::store_token(&mut cache, &g, loc, &row);
        assert_error(result, is_out_of_range, "location");
        checked += 1;
    }
    // Rows of the wrong length, at valid and skipped locations alike.
    for len in [0, 448, 511, 513] {
        for loc in [0, 127, -1] {
            let result = flashmla::store_token(&mut cache, &g, loc, &row.repeat(2)[..len]);
            assert_error(result, is_bad_shape, "row");
            checked += 1;
        }
    }
    assert_eq!(cache, before);

    // Caches that are not whole pages (checked even for a skipped token).
    for len in [page - 1, page + 1, 2 * page - 576, 576] {
        for loc in [0, -1] {
            let mut short = before[..len].to_vec();
            let result = flashmla::store_token(&mut short, &g, loc, &row);
            assert_error(result, is_bad_shape, "cache");
            assert_eq!(short, before[..len]);
            let read = flashmla::dequantize_token(&short, &g, 0).map(drop);
            assert_error(read, is_bad_shape, "cache");
            checked += 2;
        }
    }
    // Reads: the sentinel and past the end name no token.
    for loc in [-1, 128, i64::MIN, i64::MAX] {
        let read = flashmla::dequantize_token(&cache, &g, loc).map(drop);
        assert_error(read, is_out_of_range, "location");
        checked += 1;
    }
    // An empty cache holds no token.
    let result = flashmla::store_token(&mut [], &g, 0, &row);
    assert_error(result, is_out_of_range, "location");
    flashmla::store_token(&mut [], &g, -1, &row).unwrap();
    assert_eq!(checked, 36);
}

#[test]
fn indexer_bad_input_writes_nothing() {
    let (mut rng, _) = seeded("indexer_bad_input_writes_nothing");
    let g = IndexerGeometry::new(64, E4m3Fn).unwrap();
    let page = 8_448;
    let mut cache = random_bytes(&mut rng, 3 * page);
    let before = cache.clone();
    let key = random_key(&mut rng);
    let mut checked = 0;

    for loc in [192, 193, 1 << 40, i64::MAX] {
        let result = indexer::store_token(&mut cache, &g, loc, &key);
        assert_error(result, is_out_of_range, "location");
        checked += 1;
    }
    for len in [0, 64, 127, 129] {
        for loc in [0, 191, -1] {
            let result = indexer::store_token(&mut cache, &g, loc, &key.repeat(2)[..len]);
            assert_error(result, is_bad_shape, "key");
            checked += 1;
        }
    }
    assert_eq!(cache, before);

    for len in [page - 1, page + 1, 2 * page - 132, 128] {
        for loc in [0, -1] {
            let mut short = before[..len].to_vec();
            let result = indexer::store_token(&mut short, &g, loc, &key);
            assert_error(result, is_bad_shape, "cache");
            assert_eq!(short, before[..len]);
            let read = indexer::dequantize_token(&short, &g, 0).map(drop);
            assert_error(read, is_bad_shape, "cache");
            checked += 2;
        }
    }
    for loc in [-1, 192, i64::MIN, i64::MAX] {
        let read = indexer::dequantize_token(&cache, &g, loc).map(drop);
        assert_error(read, is_out_of_range, "location");
        checked += 1;
    }
    assert_eq!(checked, 36);
}

// ---------------------------------------------------------------------------
// Random round trips against the reference
// ---------------------------------------------------------------------------

/// `count` distinct locations among `pages` pages of `p` slots, always
/// including the first and last slot of every page, shuffled, with a few -1
/// (skipped) entries mixed in.
fn random_locations(rng: &mut StdRng, p: u64, pages: u64, count: usize) -> Vec<i64> {
    let tokens = (p * pages) as i64;
    let mut locs: Vec<i64> = (0..pages as i64)
        .flat_map(|page| [page * p as i64, (page + 1) * p as i64 - 1])
        .collect();
    let mut rest: Vec<i64> = (0..tokens).filter(|l| !locs.contains(l)).collect();
    rest.shuffle(rng);
    let extra = count.saturating_sub(locs.len()).min(rest.len());
    locs.extend(&rest[..extra]);
    locs.extend([-1; 4]);
    locs.shuffle(rng);
    locs
}

/// Spec §8's round-trip tolerance (Triton store test, dequantized vs input):
/// |x' - x| <= 0.05 + 0.15|x|. A floor: the half-step bounds checked first are
/// tighter for every tile amax below ~10^4, which the random rows stay under.
fn within_spec_tolerance(got: f64, x: f64) -> bool {
    (got - x).abs() <= 0.05 + 0.15 * x.abs()
}

#[test]
fn flashmla_random_round_trips() {
    let (mut rng, _) = seeded("flashmla_random_round_trips");
    let mut checked = 0usize;
    for fmt in [E4m3Fn, E4m3Fnuz] {
        let f = Fp8Ref::new(fmt);
        for p in [2u64, 64, 256] {
            let g = FlashMlaGeometry::new(p, fmt).unwrap();
            let pages = 3;
            let mut cache = random_bytes(&mut rng, (pages * g.bytes_per_page()) as usize);
            let mut expected = cache.clone();
            let mut stored = Vec::new();
            for loc in random_locations(&mut rng, p, pages, 40) {
                let row = random_flashmla_row(&mut rng);
                flashmla::store_token(&mut cache, &g, loc, &row).unwrap();
                if loc >= 0 {
                    let (value, scale) = ref_flashmla_offsets(p, loc as u64);
                    let (value_bytes, scale_bytes) = ref_flashmla_token(&row, &f);
                    let (value, scale) = (value as usize, scale as usize);
                    expected[value..value + 576].copy_from_slice(&value_bytes);
                    expected[scale..scale + 7].copy_from_slice(&scale_bytes);
                    stored.push((loc, row));
                }
            }
            // Byte for byte over the whole buffer: the tokens, their
            // neighbours, the scale padding bytes and the page tails.
            assert_eq!(cache, expected, "{fmt:?}, P = {p}");
            for (loc, row) in &stored {
                checked += check_flashmla_token(&cache, &g, &f, *loc, row);
            }
        }
    }
    // Tokens stored per format: all 6 of P = 2, 40 of P = 64 and of P = 256.
    assert_eq!(checked, 2 * (6 + 40 + 40) * 512);
}

/// Dequantizes one stored token and checks every dim: equal to the reference
/// decode (code value times 2^(byte-127)), within half a code step times the
/// scale of the input and within spec §8's tolerance; RoPE dims exact.
fn check_flashmla_token(
    cache: &[u8],
    g: &FlashMlaGeometry,
    f: &Fp8Ref,
    loc: i64,
    row: &[bf16],
) -> usize {
    let got = flashmla::dequantize_token(cache, g, loc).unwrap();
    assert_eq!(got.len(), 512);
    let (value, scale_at) = ref_flashmla_offsets(g.page_size(), loc as u64);
    for (d, (&y, x)) in got.iter().zip(row).enumerate() {
        let x = f64::from(x.to_f32());
        if d >= 448 {
            assert_eq!(y.to_bits(), (x as f32).to_bits(), "loc {loc}, rope dim {d}");
            continue;
        }
        let code = cache[value as usize + d];
        let scale = 2f64.powi(i32::from(cache[scale_at as usize + d / 64]) - 127);
        assert_eq!(f64::from(y), f.value(code) * scale, "loc {loc}, dim {d}");
        let bound = f.half_step(x.abs() / scale) * scale;
        let err = (f64::from(y) - x).abs();
        assert!(err <= bound, "loc {loc}, dim {d}: |{y} - {x}| > {bound}");
        assert!(
            within_spec_tolerance(f64::from(y), x),
            "loc {loc}, dim {d}: {y} vs {x}"
        );
    }
    got.len()
}

#[test]
fn indexer_random_round_trips() {
    let (mut rng, _) = seeded("indexer_random_round_trips");
    let mut checked = 0usize;
    for fmt in [E4m3Fn, E4m3Fnuz] {
        let f = Fp8Ref::new(fmt);
        let g = IndexerGeometry::new(64, fmt).unwrap();
        let pages = 3;
        let mut cache = random_bytes(&mut rng, pages * 8_448);
        let mut expected = cache.clone();
        let mut stored = Vec::new();
        for loc in random_locations(&mut rng, 64, pages as u64, 60) {
            let key = random_key(&mut rng);
            indexer::store_token(&mut cache, &g, loc, &key).unwrap();
            if loc >= 0 {
                let (value, scale_at) = ref_indexer_offsets(64, loc as u64);
                let (codes, scale, _) = ref_indexer_key(&key, &f);
                let (value, scale_at) = (value as usize, scale_at as usize);
                expected[value..value + 128].copy_from_slice(&codes);
                expected[scale_at..scale_at + 4].copy_from_slice(&scale.to_le_bytes());
                stored.push((loc, key));
            }
        }
        assert_eq!(cache, expected, "{fmt:?}");
        for (loc, key) in &stored {
            checked += check_indexer_key(&cache, &g, &f, *loc, key);
        }
    }
    assert_eq!(checked, 2 * 60 * 128);
}

/// Dequantizes one stored key and checks every dim: equal to the reference
/// (fp32 product of code value and scale) and within the error the spec's
/// arithmetic allows: half a code step at x·inv times the scale, plus 2^-22
/// relative for the three fp32 roundings (reciprocal, product, dequantizing
/// product); and within spec §8's tolerance.
fn check_indexer_key(
    cache: &[u8],
    g: &IndexerGeometry,
    f: &Fp8Ref,
    loc: i64,
    key: &[f32],
) -> usize {
    let got = indexer::dequantize_token(cache, g, loc).unwrap();
    assert_eq!(got.len(), 128);
    let (value, _) = ref_indexer_offsets(64, loc as u64);
    let (_, scale, scaled) = ref_indexer_key(key, f);
    let scale = f64::from(scale);
    for (d, ((&y, &x), &xs)) in got.iter().zip(key).zip(&scaled).enumerate() {
        let (y, x) = (f64::from(y), f64::from(x));
        let code = cache[value as usize + d];
        assert_eq!(
            y,
            (f.value(code) * scale) as f32 as f64,
            "loc {loc}, dim {d}"
        );
        let bound = f.half_step(f64::from(xs).abs()) * scale + (x.abs() + y.abs()) * 2f64.powi(-22);
        assert!(
            (y - x).abs() <= bound,
            "loc {loc}, dim {d}: |{y} - {x}| > {bound}"
        );
        assert!(
            within_spec_tolerance(y, x),
            "loc {loc}, dim {d}: {y} vs {x}"
        );
    }
    got.len()
}
