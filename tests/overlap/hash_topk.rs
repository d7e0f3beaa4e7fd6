//! Routing (hash_topk): overlapping outputs refused.

use super::*;

#[test]
fn hash_topk_refuses_overlapping_outputs() {
    let ctx = Ctx::cpu(1);
    let (experts, k, vocab) = (8, 2, 4);
    let slots = k + 1;
    let mut r = Regions::default();
    let (logits, ids, table) = (
        r.take(T * experts * 4),
        r.take(T * 4),
        r.take(vocab * k * 4),
    );
    let (weights, topk_ids, real) = (r.take(T * slots * 4), r.take(T * slots * 4), r.take(4));
    let mut a = Arena::new(&r);
    a.write(
        logits,
        &(0..T * experts).map(|i| i as f32 / 8.0).collect::<Vec<_>>(),
    );
    a.write(ids, &[1i32, 3]);
    a.write(
        table,
        &(0..(vocab * k) as i32)
            .map(|i| i % experts as i32)
            .collect::<Vec<_>>(),
    );
    a.write(real, &[T as i32]);
    let args = unikv_hash_topk_args {
        struct_size: size_of::<unikv_hash_topk_args>(),
        router_logits: a.t::<f32>(logits, &[T, experts]),
        input_ids: a.t::<i32>(ids, &[T]),
        tid2eid: a.t::<i32>(table, &[vocab, k]),
        topk_weights: a.t::<f32>(weights, &[T, slots]),
        topk_ids: a.t::<i32>(topk_ids, &[T, slots]),
        num_real_tokens: a.t::<i32>(real, &[1]),
        num_real_tokens_host: 0,
        num_tokens: T as u32,
        num_shared: 1,
        routed_scaling_factor: 1.5,
    };
    let run =
        |args: unikv_hash_topk_args| unsafe { unikv_hash_topk(ctx.0, &args, ptr::null_mut()) };
    let ids_in_logits = a.t::<i32>(logits + 8, &[T, slots]);
    refused_unchanged(
        &a,
        None,
        || {
            run(unikv_hash_topk_args {
                topk_ids: ids_in_logits,
                ..args
            })
        },
        "topk_ids",
        "router_logits",
    );
    let real_in_weights = a.t::<i32>(weights + 4, &[1]);
    refused_unchanged(
        &a,
        None,
        || {
            run(unikv_hash_topk_args {
                num_real_tokens: real_in_weights,
                ..args
            })
        },
        "topk_weights",
        "num_real_tokens",
    );
    ok(run(args));
}
