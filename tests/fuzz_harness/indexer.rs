//! The lightning indexer (prepare_q, prepare_k, topk, topk_from_logits) and
//! hash-routed gating (hash_topk). After a success with values the backend
//! checked (or honest ones): top-k rows are front-packed page indices of the
//! documented count, routing ids lie in their ranges and padding rows are
//! padding.

use std::ptr;

use unikv::ffi::indexer::*;
use unikv::ffi::routing::*;

use super::call::{with_struct, Call, Fill, Role, Spec, BF16, F32, I32, POISON_I32, U8};
use super::stores::{
    absent, count, ctx_of, either, f32_scalar, fp8_dtype, locations, positions, rope_arg,
    rope_positions, scalar, scalar_past, slack, tokens, IDX,
};
use super::streams::pool_of;
use super::{Cursor, World};

const CACHE_PAGE: usize = 132 * 64;

pub fn prepare_q(w: &mut World, c: &mut Cursor) {
    let mut call = w.call("unikv_indexer_prepare_q", true);
    let ctx = ctx_of(w, c, &mut call);
    let args = query_args(w, c, &mut call);
    let s = with_struct(c, &mut call, args, |a| unsafe {
        unikv_indexer_prepare_q(ctx, a, ptr::null_mut())
    });
    call.finish(s);
}

/// An `indexer_prepare_q` argument struct over tensors of `call` (also the
/// second struct of `unikv_prepare_qkv_indexer_q`).
pub fn query_args(w: &World, c: &mut Cursor, call: &mut Call) -> unikv_indexer_prepare_q_args {
    let n = tokens(c);
    let held = n + slack(c);
    let h = c.pick(&[1, 2, 4, 3]);
    let q = call.tensor(
        c,
        Spec::new("q", &[BF16], &[held, h, 128], Role::In, Fill::Floats)
            .pad()
            .align(16),
    );
    let weights = call.tensor(
        c,
        Spec::new("weights", &[BF16], &[held, h], Role::In, Fill::Floats)
            .pad()
            .align(2),
    );
    let rope_table = rope_arg(w, c, call);
    let dt = either(c);
    let pos = rope_positions(c, held);
    let positions = call.tensor(
        c,
        Spec::new("positions", dt, &[held], Role::In, Fill::Ints(pos)),
    );
    let q_fp8 = call.tensor(
        c,
        Spec::new("q_fp8", &[U8], &[held, h, 128], Role::Out, Fill::Poison)
            .pad()
            .align(16),
    );
    let weights_out = call.tensor(
        c,
        Spec::new("weights_out", &[F32], &[held, h], Role::Out, Fill::Poison).pad(),
    );
    unikv_indexer_prepare_q_args {
        struct_size: std::mem::size_of::<unikv_indexer_prepare_q_args>(),
        q,
        weights,
        rope_table,
        positions,
        q_fp8,
        weights_out,
        q_dtype: fp8_dtype(c, call),
        num_tokens: count(c, call, n, held),
        num_heads: scalar_past(c, call, h as u32, &[0, h as u32 + 1], "num_heads vs q"),
        weight_scale: f32_scalar(c, call, 0.044, &[f32::NAN, f32::INFINITY], "weight_scale"),
    }
}

pub fn prepare_k(w: &mut World, c: &mut Cursor) {
    let mut call = w.call("unikv_indexer_prepare_k", true);
    let ctx = ctx_of(w, c, &mut call);
    let n = tokens(c);
    let held = n + slack(c);
    let pages = c.range(1, 2);
    let cache = call.tensor(
        c,
        Spec::new(
            "cache",
            &[U8],
            &[pages, CACHE_PAGE],
            Role::InOut,
            Fill::Bytes,
        )
        .align(16),
    );
    let kdt: &'static [u32] = if c.chance(128) {
        &[F32, BF16]
    } else {
        &[BF16, F32]
    };
    let key = call.tensor(
        c,
        Spec::new("key", kdt, &[held, 128], Role::In, Fill::Floats)
            .pad()
            .align(16),
    );
    let norm_weight = call.tensor(
        c,
        Spec::new("norm_weight", &[BF16], &[128], Role::In, Fill::Floats).align(16),
    );
    let rope_table = rope_arg(w, c, &mut call);
    let dt = either(c);
    let pos = rope_positions(c, held);
    let positions = call.tensor(
        c,
        Spec::new("positions", dt, &[held], Role::In, Fill::Ints(pos)),
    );
    let dt = either(c);
    let locs = locations(c, held, pages * 64);
    let loc = call.tensor(c, Spec::new("loc", dt, &[held], Role::In, Fill::Ints(locs)));
    let args = unikv_indexer_prepare_k_args {
        struct_size: std::mem::size_of::<unikv_indexer_prepare_k_args>(),
        cache,
        key,
        norm_weight,
        rope_table,
        positions,
        loc,
        page_size: scalar(c, &mut call, 64, &[0, 2, 32, 128], "page_size"),
        cache_dtype: fp8_dtype(c, &mut call),
        num_tokens: count(c, &mut call, n, held),
        eps: f32_scalar(
            c,
            &mut call,
            1e-6,
            &[0.0, -1.0, f32::NAN, f32::INFINITY],
            "eps",
        ),
        reserved: scalar(c, &mut call, 0, &[1], "reserved"),
    };
    let s = with_struct(c, &mut call, args, |a| unsafe {
        unikv_indexer_prepare_k(ctx, a, ptr::null_mut())
    });
    call.finish(s);
}

/// `unikv_indexer_topk`, or `unikv_indexer_topk_from_logits` when
/// `from_logits`; now and then, instead of the former,
/// `unikv_indexer_topk_fill_csa` on a pool with a CSA stream laid out for
/// the tokens.
pub fn topk(w: &mut World, c: &mut Cursor, from_logits: bool) {
    let fused = !from_logits && c.chance(64);
    let name = if from_logits {
        "unikv_indexer_topk_from_logits"
    } else if fused {
        "unikv_indexer_topk_fill_csa"
    } else {
        "unikv_indexer_topk"
    };
    let mut call = w.call(name, true);
    call.honest_must_pass = true;
    // The fused call runs on its pool's context.
    let (ctx, pool) = if fused {
        let Some((i, h)) = pool_of(w, c, &mut call) else {
            return;
        };
        (ptr::null(), Some((i, h)))
    } else {
        (ctx_of(w, c, &mut call), None)
    };
    let n = tokens(c);
    let held = n + slack(c);
    let h = c.pick(&[1, 2, 4, 3]);
    let requests = c.range(1, 2);
    // Cache pages; the fused call's honest page ids also hold CSA rows of
    // its pool (at least one page: the 64 padding rows).
    let pages = c.range(1, 2);
    let table_pages = match pool {
        Some((i, _)) => pages.min(w.pools[i].compressed(4) / 64),
        None => pages,
    };
    let max_pages = 2;
    let pos: Vec<i64> = positions(c, held);
    let keys_max = pos.iter().map(|p| (*p as usize + 1) / 4).max().unwrap_or(0);
    let cols = keys_max.max(1) + c.below(3);
    let k = c.range(1, 8);
    let width = k + c.below(2);
    // Score inputs: read by unikv_indexer_topk only.
    let score = |call: &mut super::Call, c: &mut Cursor, spec: Spec| {
        if from_logits {
            if c.chance(128) {
                return absent();
            }
            call.tensor(c, spec.unchecked())
        } else {
            call.tensor(c, spec)
        }
    };
    let q_fp8 = score(
        &mut call,
        c,
        Spec::new("q_fp8", &[U8], &[held, h, 128], Role::In, Fill::Bytes)
            .pad()
            .align(16),
    );
    let weights = score(
        &mut call,
        c,
        Spec::new("weights", &[F32], &[held, h], Role::In, Fill::Floats).pad(),
    );
    let cache = score(
        &mut call,
        c,
        Spec::new("cache", &[U8], &[pages, CACHE_PAGE], Role::In, Fill::Bytes).align(16),
    );
    let table: Vec<i64> = (0..requests * max_pages)
        .map(|_| c.below(table_pages) as i64)
        .collect();
    let pt_arg = call.args.len();
    let page_table = call.tensor(
        c,
        Spec::new(
            "page_table",
            IDX,
            &[requests, max_pages],
            Role::In,
            Fill::Ints(table),
        )
        .pad(),
    );
    let bid: Vec<i64> = (0..held)
        .map(|_| {
            if c.chance(30) {
                -1
            } else {
                c.below(requests) as i64
            }
        })
        .collect();
    let bid_arg = call.args.len();
    let batch_id = call.tensor(
        c,
        Spec::new("batch_id", IDX, &[held], Role::In, Fill::Ints(bid.clone())),
    );
    let dt = either(c);
    let pos_arg = call.args.len();
    let positions = call.tensor(
        c,
        Spec::new("positions", dt, &[held], Role::In, Fill::Ints(pos.clone())),
    );
    let logits = if from_logits {
        call.tensor(
            c,
            Spec::new("logits", &[F32], &[held, cols], Role::In, Fill::Floats).pad(),
        )
    } else {
        call.tensor(
            c,
            Spec::new("logits", &[F32], &[held, cols], Role::Out, Fill::Poison).pad(),
        )
    };
    let out_arg = call.args.len();
    let topk_indices = call.tensor(
        c,
        Spec::new("topk_indices", IDX, &[held, width], Role::Out, Fill::Poison).pad(),
    );
    let topk = scalar_past(
        c,
        &mut call,
        k as u32,
        &[0, width as u32 + 1, 2049, u32::MAX],
        "bad topk",
    );
    let (cache_dtype, num_heads) = if from_logits {
        (c.u8() as u32, c.u8() as u32)
    } else {
        (
            fp8_dtype(c, &mut call),
            scalar_past(c, &mut call, h as u32, &[0, 65, h as u32 + 1], "num_heads"),
        )
    };
    // The fused call's CSA stream: each real token's window (valid rows),
    // then room for the keys its top-k selects (poisoned), and slack.
    let csa = pool.map(|(i, _)| {
        let p = &w.pools[i];
        let (window, swa_rows) = (p.window as i64, p.swa_rows());
        let mut indptr = vec![0i64];
        let mut indices = Vec::new();
        for t in 0..held {
            if bid[t] >= 0 {
                let swa = (pos[t] + 1).min(window);
                indices.extend((0..swa).map(|_| c.below(swa_rows) as i64));
                let tail = ((pos[t] as usize + 1) / 4).min(k);
                indices.resize(indices.len() + tail, POISON_I32 as i64);
            }
            indptr.push(indices.len() as i64);
        }
        indices.resize(indices.len() + c.below(3), POISON_I32 as i64);
        let ip_arg = call.args.len();
        let stream = unikv_csa_stream {
            struct_size: std::mem::size_of::<unikv_csa_stream>(),
            csa_indptr: call.tensor(
                c,
                Spec::new("csa_indptr", IDX, &[held + 1], Role::In, Fill::Ints(indptr)),
            ),
            csa_indices: call.tensor(
                c,
                Spec::new(
                    "csa_indices",
                    IDX,
                    &[indices.len()],
                    Role::InOut,
                    Fill::Ints(indices),
                ),
            ),
        };
        (ip_arg, (window, swa_rows), stream)
    });
    let args = unikv_indexer_topk_args {
        struct_size: std::mem::size_of::<unikv_indexer_topk_args>(),
        q_fp8,
        weights,
        cache,
        page_table,
        batch_id,
        positions,
        logits,
        topk_indices,
        cache_dtype,
        num_tokens: count(c, &mut call, n, held),
        num_heads,
        topk,
    };
    let s = match (pool, &csa) {
        (Some((_, h)), Some((_, _, stream))) => {
            // A hostile struct_size goes to one of the two structs.
            if c.chance(128) {
                with_struct(c, &mut call, *stream, |s| unsafe {
                    unikv_indexer_topk_fill_csa(h, &args, s, ptr::null_mut())
                })
            } else {
                with_struct(c, &mut call, args, |a| unsafe {
                    unikv_indexer_topk_fill_csa(h, a, stream, ptr::null_mut())
                })
            }
        }
        _ => with_struct(c, &mut call, args, |a| unsafe {
            if from_logits {
                unikv_indexer_topk_from_logits(ctx, a, ptr::null_mut())
            } else {
                unikv_indexer_topk(ctx, a, ptr::null_mut())
            }
        }),
    };
    if !call.finish(s) || call.aliased || !call.contents_trusted() {
        return;
    }
    // The values the call saw; rows of topk_indices in logical order.
    let (table, bid, pos) = (
        call.ints_before(pt_arg),
        call.ints_before(bid_arg),
        call.ints_before(pos_arg),
    );
    let out = call.ints_after(out_arg);
    let tw = call.args[out_arg].desc.shape[1] as usize;
    let pw = call.args[pt_arg].desc.shape[1] as usize;
    for t in 0..n {
        let row = &out[t * tw..(t + 1) * tw];
        let want = if bid[t] < 0 {
            0
        } else {
            ((pos[t].max(0) as usize).saturating_add(1) / 4).min(k)
        };
        let got = row.iter().take_while(|v| **v != -1).count();
        assert_eq!(
            got, want,
            "{name}: token {t} selected {got} keys, not {want}: {row:?}"
        );
        assert!(
            row[got..].iter().all(|v| *v == -1),
            "{name}: token {t} not front-packed: {row:?}"
        );
        for &v in &row[..got] {
            let page = v / 64;
            let b = bid[t] as usize;
            assert!(
                v >= 0 && table[b * pw..(b + 1) * pw].contains(&page),
                "{name}: token {t} selected {v}, not on a page of its table row"
            );
        }
    }
    // The fused call's stream: the entries of each real token's slice past
    // its window are the pool rows of its first selected keys; nothing else
    // changed.
    if let Some((ip_arg, (window, swa_rows), _)) = csa {
        let indptr = call.ints_before(ip_arg);
        let mut want = call.ints_before(ip_arg + 1);
        for t in (0..n).filter(|&t| bid[t] >= 0) {
            let row = &out[t * tw..(t + 1) * tw];
            let at = (indptr[t] + (pos[t] + 1).min(window)) as usize;
            let tail = indptr[t + 1] as usize - at;
            for (j, &v) in row[..tail].iter().enumerate() {
                want[at + j] = swa_rows as i64 + v;
            }
        }
        assert_eq!(call.ints_after(ip_arg + 1), want, "{name}: CSA stream");
    }
}

pub fn hash_topk(w: &mut World, c: &mut Cursor) {
    let mut call = w.call("unikv_hash_topk", true);
    call.honest_must_pass = true;
    let ctx = ctx_of(w, c, &mut call);
    let n = tokens(c);
    let held = n + slack(c);
    let experts = c.range(1, 8);
    let routed = c.range(1, 4);
    let shared = c.below(2);
    let vocab = c.range(1, 6);
    let logits_arg = call.args.len();
    let router_logits = call.tensor(
        c,
        Spec::new(
            "router_logits",
            &[F32],
            &[held, experts],
            Role::In,
            Fill::Floats,
        )
        .pad(),
    );
    let dt = either(c);
    let ids: Vec<i64> = (0..held).map(|_| c.below(vocab) as i64).collect();
    let input_ids = call.tensor(
        c,
        Spec::new("input_ids", dt, &[held], Role::In, Fill::Ints(ids)),
    );
    let table: Vec<i64> = (0..vocab * routed)
        .map(|_| c.below(experts) as i64)
        .collect();
    let tid2eid = call.tensor(
        c,
        Spec::new(
            "tid2eid",
            &[I32],
            &[vocab, routed],
            Role::In,
            Fill::Ints(table),
        )
        .pad(),
    );
    let slots = routed + shared;
    let wt_arg = call.args.len();
    let topk_weights = call.tensor(
        c,
        Spec::new(
            "topk_weights",
            &[F32],
            &[held, slots],
            Role::Out,
            Fill::Poison,
        )
        .pad(),
    );
    let topk_ids = call.tensor(
        c,
        Spec::new("topk_ids", &[I32], &[held, slots], Role::Out, Fill::Poison).pad(),
    );
    let real = c.range(0, n);
    let device_count = c.chance(100);
    let num_real_tokens = if device_count {
        let dt = either(c);
        call.tensor(
            c,
            Spec::new(
                "num_real_tokens",
                dt,
                &[1],
                Role::In,
                Fill::Ints(vec![real as i64]),
            )
            .optional(),
        )
    } else {
        absent()
    };
    let host = if device_count {
        c.u8() as u32
    } else {
        real as u32
    };
    let args = unikv_hash_topk_args {
        struct_size: std::mem::size_of::<unikv_hash_topk_args>(),
        router_logits,
        input_ids,
        tid2eid,
        topk_weights,
        topk_ids,
        num_real_tokens,
        num_real_tokens_host: if device_count {
            host
        } else {
            scalar(
                c,
                &mut call,
                host,
                &[n as u32 + 1, u32::MAX],
                "num_real_tokens_host past num_tokens",
            )
        },
        num_tokens: count(c, &mut call, n, held),
        num_shared: scalar(
            c,
            &mut call,
            shared as u32,
            &[33, u32::MAX],
            "too many shared slots",
        ),
        routed_scaling_factor: f32_scalar(
            c,
            &mut call,
            1.5,
            &[0.0, -1.0, f32::NAN, f32::INFINITY],
            "rsf",
        ),
    };
    let s = with_struct(c, &mut call, args, |a| unsafe {
        unikv_hash_topk(ctx, a, ptr::null_mut())
    });
    if !call.finish(s) || call.aliased || !call.contents_trusted() {
        return;
    }
    let ids = call.ints_after(wt_arg + 1);
    // The device count when one was passed, else the host count.
    let real = if !args.num_real_tokens.data.is_null() {
        call.ints_before(call.args.len() - 1)[0] as usize
    } else {
        args.num_real_tokens_host as usize
    };
    let sw = call.args[wt_arg + 1].desc.shape[1] as usize;
    // The experts the call saw: an accepted hostile edit may widen the rows.
    let experts = call.args[logits_arg].desc.shape[1] as usize;
    for t in 0..n {
        let row = &ids[t * sw..t * sw + slots];
        if t < real {
            assert!(
                row.iter()
                    .all(|&e| (0..(experts + shared) as i64).contains(&e)),
                "hash_topk: row {t} ids {row:?} outside 0..{}",
                experts + shared
            );
        } else {
            assert!(
                row.iter().all(|&e| e == -1),
                "hash_topk: padding row {t} ids {row:?}"
            );
        }
    }
}
