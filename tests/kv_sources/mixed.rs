//! Two key sources in one call: FlashMLA's two-cache decode (the SWA window
//! in one cache, the compressed rows in another), two sets of scaled rows,
//! and prefill with a cache as the prefix and bf16 rows or a cache as the
//! extend source; each against the same keys in one bf16 pool source (bit
//! for bit) and the float64 reference. Also: callers built against the
//! structs before the key sources existed keep working.

use std::ptr;

use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;
use unikv::ffi::attention::*;

use crate::common::*;
use crate::layouts::*;
use crate::run::*;
use crate::D;

/// Token t's window of up to 128 recent token ids of a `rows`-token cache,
/// and its top-k list of up to `topk` rows of another.
fn window_and_topk(
    rng: &mut StdRng,
    tokens: usize,
    rows: (usize, usize),
    topk: usize,
) -> [Vec<Vec<i32>>; 2] {
    let window = (0..tokens)
        .map(|_| {
            let end = rng.random_range(0..=rows.0);
            let len = rng.random_range(0..=128.min(end));
            (end - len..end).map(|x| x as i32).collect()
        })
        .collect();
    let top = random_lists(rng, tokens, rows.1, &[0, 1, 3, topk]);
    [window, top]
}

/// Decode over `a` then `b` (two sources, pool NULL) equals decode over one
/// pool source holding both, and the reference.
fn two_source_decode(ctx: &Ctx, rng: &mut StdRng, a: &Cache, b: &Cache, heads: usize, tag: &str) {
    let tokens = 5;
    let [la, lb] = window_and_topk(rng, tokens, (a.rows, b.rows), 200);
    let batch = Batch::new(ctx, rng, tokens, heads);
    let plan = Plan::for_cache(ctx, false, tokens, heads, Some(a));
    let sa = Stream {
        kv: a.desc(),
        lists: la.clone(),
    };
    let sb = Stream {
        kv: b.desc(),
        lists: lb.clone(),
    };
    ok(batch.decode(&plan, ptr::null(), 0, &sa, Some(&sb), &|_| {}));
    let got = batch.outputs();
    let keys: Vec<Vec<&[f64]>> = (0..tokens)
        .map(|t| {
            let ka = la[t].iter().map(|&r| &a.values[r as usize * D..][..D]);
            ka.chain(lb[t].iter().map(|&r| &b.values[r as usize * D..][..D]))
                .collect()
        })
        .collect();
    let nkeys: Vec<usize> = (0..tokens).map(|t| la[t].len() + lb[t].len()).collect();
    batch.check(tag, &nkeys, &batch.reference(&keys));

    // The pool: a at row 0, b after it; one list per token, a's keys first.
    let pool = bf16_pool(ctx, rng, &[(a, 0), (b, a.rows)]);
    let joined: Vec<Vec<i32>> = (0..tokens)
        .map(|t| {
            let mut l = la[t].clone();
            l.extend(lb[t].iter().map(|&r| r + a.rows as i32));
            l
        })
        .collect();
    batch.poison();
    let plan = Plan::for_cache(ctx, false, tokens, heads, None);
    let one = Stream {
        kv: Default::default(),
        lists: joined,
    };
    ok(batch.decode(&plan, pool.0, 1, &one, None, &|_| {}));
    assert_same_bits(tag, &got, &batch.outputs());
}

#[test]
fn flashmla_two_cache_decode() {
    let (mut rng, seed) = seeded("flashmla_two_cache_decode");
    let ctx = Ctx::cpu(2);
    for fmt in Fmt::ALL {
        let window = flashmla_cache(&ctx, &mut rng, fmt, 256, 2);
        let compressed = flashmla_cache(&ctx, &mut rng, fmt, 64, 9);
        let tag = format!("seed {seed} {fmt:?}");
        two_source_decode(&ctx, &mut rng, &window, &compressed, 17, &tag);
    }
}

#[test]
fn scaled_rows_two_source_decode() {
    let (mut rng, seed) = seeded("scaled_rows_two_source_decode");
    let ctx = Ctx::cpu(2);
    for fmt in Fmt::ALL {
        let window = scaled_rows(&ctx, &mut rng, fmt, 300);
        let compressed = scaled_rows(&ctx, &mut rng, fmt, 500);
        let tag = format!("seed {seed} {fmt:?}");
        two_source_decode(&ctx, &mut rng, &window, &compressed, 3, &tag);
    }
}

/// Prefix lists over `rows` rows with -1 entries (skipped by prefill).
fn with_skips(rng: &mut StdRng, tokens: usize, rows: usize) -> Vec<Vec<i32>> {
    let mut lists = random_lists(rng, tokens, rows, &[0, 2, 40, 150]);
    for l in &mut lists {
        for x in l.iter_mut() {
            if rng.random_bool(0.2) {
                *x = -1;
            }
        }
    }
    lists
}

/// Prefill over a cache prefix and, per `extend_cache`, either bf16
/// `extend_kv` rows or a second cache, against a pool prefix with bf16 extend
/// rows holding the same values.
fn prefill_case(
    ctx: &Ctx,
    rng: &mut StdRng,
    prefix: &Cache,
    extend_cache: Option<&Cache>,
    tag: &str,
) {
    let (tokens, heads) = (4, 9);
    let extend_rows = extend_cache.map_or(200, |c| c.rows);
    let lp = with_skips(rng, tokens, prefix.rows);
    let le = with_skips(rng, tokens, extend_rows);
    // The extend rows' values as bf16 (the cache's reader values, or random).
    let extend_bf16: Vec<bf16> = match extend_cache {
        Some(c) => (0..c.rows).flat_map(|r| c.bf16_row(r)).collect(),
        None => random_bf16(rng, extend_rows * D),
    };
    let extend_dev = Dev::upload(ctx, &extend_bf16);
    let extend_kv = extend_dev.t::<bf16>(&[extend_rows, D]);
    let batch = Batch::new(ctx, rng, tokens, heads);

    let plan = Plan::for_cache(ctx, true, tokens, heads, Some(prefix));
    let sp = Stream {
        kv: prefix.desc(),
        lists: lp.clone(),
    };
    let se = Stream {
        kv: extend_cache.map_or_else(Default::default, Cache::desc),
        lists: le.clone(),
    };
    let ext_arg = if extend_cache.is_some() {
        absent()
    } else {
        extend_kv
    };
    ok(batch.prefill(&plan, ptr::null(), 0, &sp, &se, ext_arg, &|_| {}));
    let got = batch.outputs();
    let ext64: Vec<f64> = match extend_cache {
        Some(c) => c.values.clone(),
        None => extend_bf16.iter().map(|x| x.to_f64()).collect(),
    };
    let keys: Vec<Vec<&[f64]>> = (0..tokens)
        .map(|t| {
            let kp = lp[t]
                .iter()
                .filter(|&&r| r >= 0)
                .map(|&r| &prefix.values[r as usize * D..][..D]);
            kp.chain(
                le[t]
                    .iter()
                    .filter(|&&r| r >= 0)
                    .map(|&r| &ext64[r as usize * D..][..D]),
            )
            .collect()
        })
        .collect();
    let nkeys: Vec<usize> = keys.iter().map(Vec::len).collect();
    batch.check(tag, &nkeys, &batch.reference(&keys));

    let at = rng.random_range(0..3392 - prefix.rows);
    let pool = bf16_pool(ctx, rng, &[(prefix, at)]);
    let shifted = lp
        .iter()
        .map(|l| {
            l.iter()
                .map(|&r| if r < 0 { r } else { r + at as i32 })
                .collect()
        })
        .collect();
    batch.poison();
    let plan = Plan::for_cache(ctx, true, tokens, heads, None);
    let sp = Stream {
        kv: Default::default(),
        lists: shifted,
    };
    let se = Stream {
        kv: Default::default(),
        lists: le,
    };
    ok(batch.prefill(&plan, pool.0, 1, &sp, &se, extend_kv, &|_| {}));
    assert_same_bits(tag, &got, &batch.outputs());
}

#[test]
fn prefill_over_caches() {
    let (mut rng, seed) = seeded("prefill_over_caches");
    let ctx = Ctx::cpu(2);
    for fmt in Fmt::ALL {
        let flashmla = flashmla_cache(&ctx, &mut rng, fmt, 64, 5);
        prefill_case(
            &ctx,
            &mut rng,
            &flashmla,
            None,
            &format!("seed {seed} {fmt:?} FlashMLA + bf16"),
        );
        let second = flashmla_cache(&ctx, &mut rng, fmt, 2, 90);
        let tag = format!("seed {seed} {fmt:?} FlashMLA + FlashMLA");
        prefill_case(&ctx, &mut rng, &flashmla, Some(&second), &tag);
        let scaled = scaled_rows(&ctx, &mut rng, fmt, 333);
        let extend = scaled_rows(&ctx, &mut rng, fmt, 120);
        let tag = format!("seed {seed} {fmt:?} scaled + scaled");
        prefill_case(&ctx, &mut rng, &scaled, Some(&extend), &tag);
    }
}

/// A decode args struct of the size before the key sources (up to
/// `positions`), and plan parameters of the size before `kv_layout`, still
/// work and mean a pool layer; decode's extra source may also be the pool's
/// layer.
#[test]
fn callers_from_before_the_key_sources_keep_working() {
    let (mut rng, seed) = seeded("callers_from_before_the_key_sources_keep_working");
    let ctx = Ctx::cpu(2);
    let (tokens, heads) = (3, 5);
    let pool = bf16_pool(&ctx, &mut rng, &[]);
    let lists = random_lists(&mut rng, tokens, 3392, &[0, 7, 90]);
    let batch = Batch::new(&ctx, &mut rng, tokens, heads);
    let mut params = plan_params(tokens, heads, 1, unikv_kv_layout::UNIKV_KV_LAYOUT_POOL);
    params.struct_size = std::mem::offset_of!(unikv_attention_plan_params, kv_layout);
    params.kv_layout = 0x5555; // past the caller's struct: never read
    let plan = Plan::decode(&ctx, &params);
    let one = Stream {
        kv: Default::default(),
        lists: lists.clone(),
    };
    ok(batch.decode(&plan, pool.0, 1, &one, None, &|_| {}));
    let full = batch.outputs();
    batch.poison();
    ok(batch.decode(&plan, pool.0, 1, &one, None, &|a| {
        a.struct_size = std::mem::offset_of!(unikv_decode_args, kv);
        a.kv.layout = 0x5555; // past the caller's struct: never read
    }));
    assert_same_bits(
        &format!("seed {seed} old struct size"),
        &full,
        &batch.outputs(),
    );

    // The same keys as two pool sources (split at a random point).
    let split: Vec<(Vec<i32>, Vec<i32>)> = lists
        .iter()
        .map(|l| {
            let k = rng.random_range(0..=l.len());
            (l[..k].to_vec(), l[k..].to_vec())
        })
        .collect();
    let first = Stream {
        kv: Default::default(),
        lists: split.iter().map(|s| s.0.clone()).collect(),
    };
    let second = Stream {
        kv: Default::default(),
        lists: split.iter().map(|s| s.1.clone()).collect(),
    };
    batch.poison();
    ok(batch.decode(&plan, pool.0, 1, &first, Some(&second), &|_| {}));
    assert_same_bits(&format!("seed {seed} pool + pool"), &full, &batch.outputs());
}
