//! Indexer literal bytes: hand-computed keys, every byte of the buffer checked.

use super::*;

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
    // docs/fp8.md §3 multiplies by inv = fp32(1/scale) rather than dividing by the
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
