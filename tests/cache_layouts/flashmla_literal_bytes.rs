//! FlashMLA literal bytes: hand-computed rows, every byte of the buffer checked.

use super::*;

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
