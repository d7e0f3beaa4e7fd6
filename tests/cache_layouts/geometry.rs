//! Geometry: page strides, offsets at page boundaries, 64-bit offsets, and
//! unsupported page sizes.

use super::*;

#[test]
fn flashmla_page_stride_is_rounded_up_to_576() {
    // docs/fp8.md §5 table: 584·P rounded up to a multiple of 576, and the padding.
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
    // docs/fp8.md §5: a per-layer cache passes 2 GiB (~3.68 M tokens); 32-bit byte
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
