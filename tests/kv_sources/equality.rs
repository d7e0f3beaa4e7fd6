//! One key source of each layout: decode over the cache is bit for bit decode
//! over a bf16 pool holding its reader values, and both are within the
//! attention bound of the float64 reference over the unrounded values.

use std::ptr;

use rand::Rng;
use unikv::ffi::attention::unikv_kv_cache;

use crate::common::*;
use crate::layouts::*;
use crate::run::*;
use crate::D;

const LENGTHS: [usize; 6] = [0, 1, 5, 64, 130, 300];

/// Decode over `cache` (pool NULL) and over the bf16 pool copy of it.
fn decode_equals_pool(
    cache: &Cache,
    rng: &mut rand::rngs::StdRng,
    ctx: &Ctx,
    heads: usize,
    tag: &str,
) {
    let tokens = 6;
    let lists = random_lists(rng, tokens, cache.rows, &LENGTHS);
    let at = rng.random_range(0..3392 - cache.rows);
    let pool = bf16_pool(ctx, rng, &[(cache, at)]);
    let batch = Batch::new(ctx, rng, tokens, heads);

    let plan = Plan::for_cache(ctx, false, tokens, heads, Some(cache));
    let over_cache = Stream {
        kv: cache.desc(),
        lists: lists.clone(),
    };
    ok(batch.decode(&plan, ptr::null(), 0, &over_cache, None, &|_| {}));
    let got = batch.outputs();
    let keys: Vec<Vec<&[f64]>> = lists
        .iter()
        .map(|l| {
            l.iter()
                .map(|&r| &cache.values[r as usize * D..][..D])
                .collect()
        })
        .collect();
    let nkeys: Vec<usize> = lists.iter().map(Vec::len).collect();
    batch.check(tag, &nkeys, &batch.reference(&keys));

    batch.poison();
    let plan = Plan::for_cache(ctx, false, tokens, heads, None);
    let over_pool = Stream {
        kv: unikv_kv_cache::default(),
        lists: lists
            .iter()
            .map(|l| l.iter().map(|&r| r + at as i32).collect())
            .collect(),
    };
    ok(batch.decode(&plan, pool.0, 1, &over_pool, None, &|_| {}));
    assert_same_bits(tag, &got, &batch.outputs());
}

#[test]
fn flashmla_cache_equals_its_dequantized_bf16_pool() {
    let (mut rng, seed) = seeded("flashmla_cache_equals_its_dequantized_bf16_pool");
    let ctx = Ctx::cpu(2);
    for fmt in Fmt::ALL {
        for (page_size, pages) in [(2, 150), (64, 7), (256, 3)] {
            let cache = flashmla_cache(&ctx, &mut rng, fmt, page_size, pages);
            for heads in [1, 20] {
                let tag = format!("seed {seed} {fmt:?} page_size {page_size} heads {heads}");
                decode_equals_pool(&cache, &mut rng, &ctx, heads, &tag);
            }
        }
    }
}

#[test]
fn scaled_rows_equal_their_dequantized_bf16_pool() {
    let (mut rng, seed) = seeded("scaled_rows_equal_their_dequantized_bf16_pool");
    let ctx = Ctx::cpu(2);
    for fmt in Fmt::ALL {
        let cache = scaled_rows(&ctx, &mut rng, fmt, 700);
        for heads in [1, 20] {
            let tag = format!("seed {seed} {fmt:?} heads {heads}");
            decode_equals_pool(&cache, &mut rng, &ctx, heads, &tag);
        }
    }
}

/// The scaled reader's rounding on values where it matters, in the
/// library's dequantizer and in the test's own model of it: a product that is
/// not a bf16 rounds to nearest, a tie to even, NaN codes stay NaN.
#[test]
fn scaled_reader_values_round_once_to_bf16() {
    use unikv::cache_layouts::scaled::dequantize_row;
    use unikv::fp8::Fp8Format;
    // (fmt, code, scale, value): 1.125 * (1 + 2^-7) = 1.1337890625 lies
    // between the bf16 values 1.1328125 and 1.140625, nearer the first;
    // 1 * (1 + 2^-8) is halfway between 1 and 1.0078125 and goes to the even
    // significand, 1; 1 * (1 + 3 * 2^-8) halfway between 1.0078125 and
    // 1.015625, to 1.015625.
    let cases = [
        (Fmt::Fn, 0x39u8, 1.0078125f32, 1.1328125f64),
        (Fmt::Fn, 0x38, 1.0 + 2f32.powi(-8), 1.0),
        (Fmt::Fn, 0x38, 1.0 + 3.0 * 2f32.powi(-8), 1.015625),
        (Fmt::Fnuz, 0x41, 1.0078125, 1.1328125),
        (Fmt::Fn, 0x7F, 3.0, f64::NAN),
        (Fmt::Fnuz, 0x80, 3.0, f64::NAN),
    ];
    for (fmt, code, scale, want) in cases {
        let format = match fmt {
            Fmt::Fn => Fp8Format::E4m3Fn,
            Fmt::Fnuz => Fp8Format::E4m3Fnuz,
        };
        let model = scaled_value(fmt, code, scale);
        let mut out = [0f32; D];
        dequantize_row(&[code; D], &[scale; 8], format, &mut out);
        for got in [model, f64::from(out[0]), f64::from(out[D - 1])] {
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "{fmt:?} code {code:#x} scale {scale}: {got} vs {want}"
            );
        }
    }
}
