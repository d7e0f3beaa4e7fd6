//! Random round trips against the reference.

use super::*;

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

/// docs/testing.md §2's round-trip tolerance (Triton store test, dequantized vs input):
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
/// scale of the input and within docs/testing.md §2's tolerance; RoPE dims exact.
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
/// (fp32 product of code value and scale) and within the error the documented
/// arithmetic allows: half a code step at x·inv times the scale, plus 2^-22
/// relative for the three fp32 roundings (reciprocal, product, dequantizing
/// product); and within docs/testing.md §2's tolerance.
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
