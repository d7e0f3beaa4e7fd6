//! The indexer operations: overlapping outputs refused.

use super::*;

#[test]
fn indexer_ops_refuse_overlapping_outputs() {
    let (mut rng, _) = seeded("indexer_ops_refuse_overlapping_outputs");
    let ctx = Ctx::cpu(1);
    let (heads, keys, topk) = (4, 8, 4);
    let mut r = Regions::default();
    let (q, weights, table, positions) = (
        r.take(T * heads * 128 * 2),
        r.take(T * heads * 2),
        r.take(MAX_POS * 64 * 4),
        r.take(T * 4),
    );
    let (q_fp8, weights_out, cache, key, norm) = (
        r.take(T * heads * 128),
        r.take(T * heads * 4),
        r.take(INDEXER_PAGE),
        r.take(T * 128 * 2),
        r.take(128 * 2),
    );
    let (ints, logits, topk_indices) = (r.take(32), r.take(T * keys * 4), r.take(T * topk * 4));
    let mut a = Arena::new(&r);
    a.write(q, &random_bf16(&mut rng, T * heads * 128));
    a.write(weights, &random_bf16(&mut rng, T * heads));
    a.write(table, &rope_table(10000.0, 0.0, MAX_POS as u32));
    a.write(positions, &[3i32, 7]);
    a.write(key, &random_bf16(&mut rng, T * 128));
    a.write(norm, &vec![bf16::ONE; 128]);
    a.write(ints, &[0i32, 0, 0, 1]); // page_table [1, 1], batch_id x2, loc x2 from 0
    a.write(logits, &(0..T * keys).map(|i| i as f32).collect::<Vec<_>>());

    let prepare_q = unikv_indexer_prepare_q_args {
        struct_size: size_of::<unikv_indexer_prepare_q_args>(),
        q: a.t::<bf16>(q, &[T, heads, 128]),
        weights: a.t::<bf16>(weights, &[T, heads]),
        rope_table: a.t::<f32>(table, &[MAX_POS, 64]),
        positions: a.t::<i32>(positions, &[T]),
        q_fp8: a.t::<u8>(q_fp8, &[T, heads, 128]),
        weights_out: a.t::<f32>(weights_out, &[T, heads]),
        q_dtype: FP8,
        num_tokens: T as u32,
        num_heads: heads as u32,
        weight_scale: 0.25,
    };
    let run_q = |args: unikv_indexer_prepare_q_args| unsafe {
        unikv_indexer_prepare_q(ctx.0, &args, ptr::null_mut())
    };
    let weights_out_in_q = a.t::<f32>(q + 256, &[T, heads]);
    refused_unchanged(
        &a,
        None,
        || {
            run_q(unikv_indexer_prepare_q_args {
                weights_out: weights_out_in_q,
                ..prepare_q
            })
        },
        "weights_out",
        "q (partially",
    );
    ok(run_q(prepare_q));

    let prepare_k = unikv_indexer_prepare_k_args {
        struct_size: size_of::<unikv_indexer_prepare_k_args>(),
        cache: a.t::<u8>(cache, &[1, INDEXER_PAGE]),
        key: a.t::<bf16>(key, &[T, 128]),
        norm_weight: a.t::<bf16>(norm, &[128]),
        rope_table: a.t::<f32>(table, &[MAX_POS, 64]),
        positions: a.t::<i32>(positions, &[T]),
        loc: a.t::<i32>(ints + 8, &[T]),
        page_size: 64,
        cache_dtype: FP8,
        num_tokens: T as u32,
        eps: 1e-6,
        reserved: 0,
    };
    let run_k = |args: unikv_indexer_prepare_k_args| unsafe {
        unikv_indexer_prepare_k(ctx.0, &args, ptr::null_mut())
    };
    let key_in_cache = a.t::<bf16>(cache + 128 * 60, &[T, 128]);
    refused_unchanged(
        &a,
        None,
        || {
            run_k(unikv_indexer_prepare_k_args {
                key: key_in_cache,
                ..prepare_k
            })
        },
        "cache",
        "key",
    );
    ok(run_k(prepare_k));

    let topk_args = unikv_indexer_topk_args {
        struct_size: size_of::<unikv_indexer_topk_args>(),
        q_fp8: a.t::<u8>(q_fp8, &[T, heads, 128]),
        weights: a.t::<f32>(weights_out, &[T, heads]),
        cache: a.t::<u8>(cache, &[1, INDEXER_PAGE]),
        page_table: a.t::<i32>(ints, &[1, 1]),
        batch_id: a.t::<i32>(ints + 4, &[T]),
        positions: a.t::<i32>(positions, &[T]),
        logits: a.t::<f32>(logits, &[T, keys]),
        topk_indices: a.t::<i32>(topk_indices, &[T, topk]),
        cache_dtype: FP8,
        num_tokens: T as u32,
        num_heads: heads as u32,
        topk: topk as u32,
    };
    let indices_in_logits = a.t::<i32>(logits + 16, &[T, topk]);
    let overlapping = unikv_indexer_topk_args {
        topk_indices: indices_in_logits,
        ..topk_args
    };
    refused_unchanged(
        &a,
        None,
        || unsafe { unikv_indexer_topk(ctx.0, &overlapping, ptr::null_mut()) },
        "logits",
        "topk_indices",
    );
    ok(unsafe { unikv_indexer_topk(ctx.0, &topk_args, ptr::null_mut()) });
    refused_unchanged(
        &a,
        None,
        || unsafe { unikv_indexer_topk_from_logits(ctx.0, &overlapping, ptr::null_mut()) },
        "topk_indices",
        "logits",
    );
    ok(unsafe { unikv_indexer_topk_from_logits(ctx.0, &topk_args, ptr::null_mut()) });
}
