//! Skipped and bad input: nothing written.

use super::*;

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
