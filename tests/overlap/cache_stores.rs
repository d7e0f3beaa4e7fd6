//! The FlashMLA and indexer cache stores: rows inside the cache refused.

use super::*;

#[test]
fn cache_stores_refuse_rows_inside_the_cache() {
    let (mut rng, _) = seeded("cache_stores_refuse_rows_inside_the_cache");
    let ctx = Ctx::cpu(1);
    let mut r = Regions::default();
    let (flashmla, indexer) = (r.take(FLASHMLA_PAGE), r.take(INDEXER_PAGE));
    let (kv, key, loc) = (r.take(D * 2), r.take(128 * 2), r.take(16));
    let mut a = Arena::new(&r);
    a.write(kv, &random_bf16(&mut rng, D));
    a.write(key, &random_bf16(&mut rng, 128));
    a.write(loc, &[5i32]);
    let store = unikv_store_flashmla_args {
        struct_size: size_of::<unikv_store_flashmla_args>(),
        cache: a.t::<u8>(flashmla, &[1, FLASHMLA_PAGE]),
        kv: a.t::<bf16>(kv, &[1, D]),
        loc: a.t::<i32>(loc, &[1]),
        page_size: 64,
        cache_dtype: FP8,
        num_tokens: 1,
        reserved: 0,
    };
    let inside = a.t::<bf16>(flashmla + 4096, &[1, D]);
    refused_unchanged(
        &a,
        None,
        || unsafe {
            unikv_store_flashmla(
                ctx.0,
                &unikv_store_flashmla_args {
                    kv: inside,
                    ..store
                },
                ptr::null_mut(),
            )
        },
        "cache",
        "kv",
    );
    ok(unsafe { unikv_store_flashmla(ctx.0, &store, ptr::null_mut()) });

    let store = unikv_store_indexer_args {
        struct_size: size_of::<unikv_store_indexer_args>(),
        cache: a.t::<u8>(indexer, &[1, INDEXER_PAGE]),
        key: a.t::<bf16>(key, &[1, 128]),
        loc: a.t::<i32>(loc, &[1]),
        page_size: 64,
        cache_dtype: FP8,
        num_tokens: 1,
        reserved: 0,
    };
    let inside = a.t::<i32>(indexer + INDEXER_PAGE - 4, &[1]);
    refused_unchanged(
        &a,
        None,
        || unsafe {
            unikv_store_indexer(
                ctx.0,
                &unikv_store_indexer_args {
                    loc: inside,
                    ..store
                },
                ptr::null_mut(),
            )
        },
        "cache",
        "loc",
    );
    ok(unsafe { unikv_store_indexer(ctx.0, &store, ptr::null_mut()) });
}
