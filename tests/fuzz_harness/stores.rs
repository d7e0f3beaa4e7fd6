//! Calls that write pool rows or caches: store_swa, store_compressed,
//! store_flashmla / store_indexer, prepare_qkv, and inverse_rope; plus the
//! small generators the other modules share (token counts, positions,
//! scalar hostility, the pool and layer of a pool call).

use std::ptr;

use unikv::ffi::cache_store::*;
use unikv::ffi::pool::*;
use unikv::ffi::prepare::*;
use unikv::ffi::rope::*;
use unikv::ffi::store::*;
use unikv::ffi::types::unikv_tensor;

use super::call::{with_struct, Call, Fill, Role, Spec, BF16, F32, FP8, FP8UZ, I32, I64, U8};
use super::{Cursor, World, ROPE_ROWS};

pub const IDX: &[u32] = &[I32];
pub const IDX_EITHER: &[u32] = &[I32, I64];
pub const IDX_EITHER64: &[u32] = &[I64, I32];

/// The absent optional tensor.
pub fn absent() -> unikv_tensor {
    unikv_tensor {
        data: ptr::null_mut(),
        dtype: 0,
        ndim: 0,
        shape: [0; 4],
        strides: [0; 4],
    }
}

/// Tokens of a call: 0..=4, mostly 1..=3.
pub fn tokens(c: &mut Cursor) -> usize {
    c.pick(&[1, 2, 3, 1, 4, 0, 2, 1])
}

/// Rows past `num_tokens` in token-indexed buffers (capture-time padding).
pub fn slack(c: &mut Cursor) -> usize {
    c.pick(&[0, 0, 1, 2])
}

/// A position below 300 (the honest RoPE table has 320 rows), near the
/// interesting boundaries of the 4- and 128-token groups.
pub fn position(c: &mut Cursor) -> i64 {
    match c.below(4) {
        0 => c.below(8) as i64,
        1 => 124 + c.below(8) as i64,
        2 => 252 + c.below(8) as i64,
        _ => c.below(300) as i64,
    }
}

pub fn positions(c: &mut Cursor, n: usize) -> Vec<i64> {
    (0..n).map(|_| position(c)).collect()
}

/// Positions of calls that read the RoPE table: rows of the honest table,
/// now and then past it.
pub fn rope_positions(c: &mut Cursor, n: usize) -> Vec<i64> {
    (0..n)
        .map(|_| {
            if c.chance(16) {
                position(c)
            } else {
                c.below(ROPE_ROWS) as i64
            }
        })
        .collect()
}

/// Index dtypes: int32 only, or int32/int64 with either as the honest one.
pub fn either(c: &mut Cursor) -> &'static [u32] {
    if c.chance(64) {
        IDX_EITHER64
    } else {
        IDX_EITHER
    }
}

/// `v`, or now and then one of `bad` (which the call must refuse).
pub fn scalar(c: &mut Cursor, call: &mut Call, v: u32, bad: &[u32], why: &str) -> u32 {
    if !bad.is_empty() && c.chance(12) {
        call.fail_because(why.to_string());
        return c.pick(bad);
    }
    v
}

/// `v`, or now and then one of `bad`, which the call must refuse unless a
/// hostile descriptor grew the extent it is compared with.
pub fn scalar_past(c: &mut Cursor, call: &mut Call, v: u32, bad: &[u32], why: &str) -> u32 {
    if !bad.is_empty() && c.chance(12) {
        call.fail_unless_grown(why.to_string());
        return c.pick(bad);
    }
    v
}

/// A token count for `num_tokens`: honest `t`, or more than the buffers hold.
pub fn count(c: &mut Cursor, call: &mut Call, t: usize, held: usize) -> u32 {
    scalar_past(
        c,
        call,
        t as u32,
        &[held as u32 + 1, u32::MAX, 1 << 31],
        "num_tokens past the buffers",
    )
}

pub fn f32_scalar(c: &mut Cursor, call: &mut Call, v: f32, bad: &[f32], why: &str) -> f32 {
    if c.chance(10) {
        call.fail_because(why.to_string());
        return c.pick(bad);
    }
    v
}

/// The RoPE table argument, `[rows, 64]` f32.
pub fn rope_arg(w: &World, c: &mut Cursor, call: &mut Call) -> unikv_tensor {
    rope_table_arg(w, c, call, false)
}

/// The RoPE table argument, optional (decode's epilogue) or not.
pub fn rope_table_arg(w: &World, c: &mut Cursor, call: &mut Call, optional: bool) -> unikv_tensor {
    let rows = if c.chance(16) {
        c.range(1, 8)
    } else {
        ROPE_ROWS
    };
    let values = w.rope[..rows * 64].to_vec();
    call.tensor(
        c,
        Spec::new(
            "rope_table",
            &[F32],
            &[rows, 64],
            Role::In,
            Fill::F32s(values),
        )
        .pad()
        .align(16)
        .optional_if(optional),
    )
}

/// A pool operation's target: pool index, handle (maybe hostile) and layer
/// (maybe past the pool), preferring a layer of `ratio`.
pub struct Target {
    pub i: usize,
    pub h: *const unikv_pool,
    pub layer: u32,
    pub layer_ok: bool,
}

pub fn target(
    w: &mut World,
    c: &mut Cursor,
    call: &mut Call,
    ratio: Option<u32>,
) -> Option<Target> {
    let i = w.pick_pool(c)?;
    call.validates = w.pools[i].validates;
    let h = w.handle(c, call, w.pools[i].h.cast()).cast_const().cast();
    let p = &w.pools[i];
    let n = p.ratios.len();
    let mut layer = c.below(n);
    if let Some(r) = ratio {
        if let Some(l) = p.ratios.iter().position(|x| *x == r) {
            if c.chance(220) {
                layer = l;
            }
        }
    }
    let mut layer = layer as u32;
    let mut layer_ok = true;
    if c.chance(8) {
        layer = c.pick(&[n as u32, u32::MAX]);
        layer_ok = false;
        call.fail_because("layer past the pool");
    }
    Some(Target {
        i,
        h,
        layer,
        layer_ok,
    })
}

/// Watches the layer's rows (and FP8 rope rows): a failing call leaves them.
pub fn watch_layer(w: &World, call: &mut Call, t: &Target) {
    if !t.layer_ok {
        return;
    }
    let mut li: unikv_pool_layer_info = unsafe { std::mem::zeroed() };
    li.struct_size = std::mem::size_of::<unikv_pool_layer_info>();
    let s = unsafe { unikv_pool_get_layer(w.pools[t.i].h, t.layer, &mut li) };
    assert_eq!(s as u32, 0, "harness get_layer: {}", super::last_error());
    call.watch(
        format!("pool layer {}", t.layer),
        li.data.cast(),
        li.bytes as usize,
    );
    call.watch(
        format!("pool layer {} rope rows", t.layer),
        li.rope_data.cast(),
        li.rope_bytes as usize,
    );
}

/// Slots for `n` requests: acquired ones when there are, else any valid.
pub fn req_slots(w: &World, c: &mut Cursor, pool: usize, n: usize) -> Vec<i64> {
    let p = &w.pools[pool];
    let held: Vec<u32> = p.slots.iter().copied().collect();
    (0..n)
        .map(|_| {
            if !held.is_empty() && c.chance(200) {
                held[c.below(held.len())] as i64
            } else {
                c.range(1, p.max_requests as usize) as i64
            }
        })
        .collect()
}

/// Batch ids of `n` tokens over `requests` requests, a few -1 (padding).
pub fn batch_ids(c: &mut Cursor, n: usize, requests: usize) -> Vec<i64> {
    (0..n)
        .map(|_| {
            if c.chance(24) {
                -1
            } else {
                c.below(requests) as i64
            }
        })
        .collect()
}

pub fn bf16_rows(name: &'static str, n: usize, role: Role) -> Spec {
    let fill = if role == Role::Out {
        Fill::Poison
    } else {
        Fill::Floats
    };
    Spec::new(name, &[BF16], &[n, 512], role, fill)
        .pad()
        .align(16)
}

pub fn store_swa(w: &mut World, c: &mut Cursor) {
    let mut call = w.call("unikv_store_swa", true);
    let Some(t) = target(w, c, &mut call, None) else {
        return;
    };
    let n = tokens(c);
    let held = n + slack(c);
    let requests = c.range(1, 3);
    let slots = req_slots(w, c, t.i, requests);
    let kv = call.tensor(c, bf16_rows("kv", held, Role::In));
    let bid = batch_ids(c, held, requests);
    let batch_id = call.tensor(
        c,
        Spec::new("batch_id", IDX, &[held], Role::In, Fill::Ints(bid)),
    );
    let req_slots = call.tensor(
        c,
        Spec::new("req_slots", IDX, &[requests], Role::In, Fill::Ints(slots)),
    );
    let pos = positions(c, held);
    let last = pos.iter().copied().max().unwrap_or(0);
    let positions = call.tensor(
        c,
        Spec::new("positions", IDX, &[held], Role::In, Fill::Ints(pos)),
    );
    let final_pos = if c.chance(100) {
        let fin: Vec<i64> = (0..requests).map(|_| last + c.below(3) as i64).collect();
        call.tensor(
            c,
            Spec::new("final_pos", IDX, &[requests], Role::In, Fill::Ints(fin)).optional(),
        )
    } else {
        absent()
    };
    let args = unikv_store_swa_args {
        struct_size: std::mem::size_of::<unikv_store_swa_args>(),
        kv,
        batch_id,
        req_slots,
        positions,
        final_pos,
        layer: t.layer,
        num_tokens: count(c, &mut call, n, held),
    };
    watch_layer(w, &mut call, &t);
    let s = with_struct(c, &mut call, args, |a| unsafe {
        unikv_store_swa(t.h, a, ptr::null_mut())
    });
    call.finish(s);
}

pub fn store_compressed(w: &mut World, c: &mut Cursor) {
    let mut call = w.call("unikv_store_compressed", true);
    let ratio = c.pick(&[4, 128]);
    let Some(t) = target(w, c, &mut call, Some(ratio)) else {
        return;
    };
    let p = &w.pools[t.i];
    let rows = if t.layer_ok {
        p.compressed(p.ratios[t.layer as usize])
    } else {
        1
    };
    let n = tokens(c);
    let held = n + slack(c);
    let kv = call.tensor(c, bf16_rows("kv", held, Role::In));
    let locs: Vec<i64> = (0..held)
        .map(|_| {
            if c.chance(30) || rows == 0 {
                -1
            } else {
                c.below(rows) as i64
            }
        })
        .collect();
    let loc = call.tensor(
        c,
        Spec::new("loc", IDX, &[held], Role::In, Fill::Ints(locs)),
    );
    let args = unikv_store_compressed_args {
        struct_size: std::mem::size_of::<unikv_store_compressed_args>(),
        kv,
        loc,
        layer: t.layer,
        num_rows: count(c, &mut call, n, held),
    };
    watch_layer(w, &mut call, &t);
    let s = with_struct(c, &mut call, args, |a| unsafe {
        unikv_store_compressed(t.h, a, ptr::null_mut())
    });
    call.finish(s);
}

/// Distinct locations into `slots` token slots, some negative (skipped).
pub fn locations(c: &mut Cursor, n: usize, slots: usize) -> Vec<i64> {
    let mut used = Vec::new();
    (0..n)
        .map(|_| {
            let l = c.below(slots) as i64;
            if c.chance(30) || used.contains(&l) {
                c.pick(&[-1, -7, i64::from(i32::MIN)])
            } else {
                used.push(l);
                l
            }
        })
        .collect()
}

/// A context call: the context (maybe a hostile handle) and its `validate`.
pub fn ctx_of(
    w: &World,
    c: &mut Cursor,
    call: &mut Call,
) -> *const unikv::ffi::context::unikv_context {
    let x = w.pick_ctx(c);
    call.validates = x.validates;
    let h = x.h;
    w.handle(c, call, h.cast()).cast_const().cast()
}

/// The FP8 dtype of a cache or query, now and then one that is not.
pub fn fp8_dtype(c: &mut Cursor, call: &mut Call) -> u32 {
    let honest = c.pick(&[FP8, FP8UZ]);
    scalar(c, call, honest, &[0, 1, 3, 6, 99], "cache dtype is not FP8")
}

/// `unikv_store_flashmla` (`indexer` false) or `unikv_store_indexer`.
pub fn store_cache(w: &mut World, c: &mut Cursor, indexer: bool) {
    let mut call = w.call(
        if indexer {
            "unikv_store_indexer"
        } else {
            "unikv_store_flashmla"
        },
        true,
    );
    call.honest_must_pass = true;
    let ctx = ctx_of(w, c, &mut call);
    let page_size: usize = if indexer {
        64
    } else {
        c.pick(&[2, 2, 2, 64, 256])
    };
    let bpp = if indexer {
        132 * page_size
    } else {
        (584 * page_size).div_ceil(576) * 576
    };
    let pages = if page_size == 256 { 1 } else { c.range(1, 3) };
    let n = tokens(c);
    let held = n + slack(c);
    let cache = call.tensor(
        c,
        Spec::new("cache", &[U8], &[pages, bpp], Role::InOut, Fill::Bytes).align(16),
    );
    let rows = if indexer {
        let dt: &'static [u32] = if c.chance(128) {
            &[F32, BF16]
        } else {
            &[BF16, F32]
        };
        call.tensor(
            c,
            Spec::new("key", dt, &[held, 128], Role::In, Fill::Floats)
                .pad()
                .align(16),
        )
    } else {
        call.tensor(c, bf16_rows("kv", held, Role::In))
    };
    let dt = either(c);
    let locs = locations(c, held, pages * page_size);
    let loc = call.tensor(c, Spec::new("loc", dt, &[held], Role::In, Fill::Ints(locs)));
    let bad_pages: &[u32] = if indexer {
        &[0, 2, 63, 128, 256]
    } else {
        &[0, 1, 3, 128, 512]
    };
    let page_size = scalar(c, &mut call, page_size as u32, bad_pages, "bad page size");
    let cache_dtype = fp8_dtype(c, &mut call);
    let num_tokens = count(c, &mut call, n, held);
    let reserved = scalar(c, &mut call, 0, &[1, u32::MAX], "reserved");
    let s = if indexer {
        let args = unikv_store_indexer_args {
            struct_size: std::mem::size_of::<unikv_store_indexer_args>(),
            cache,
            key: rows,
            loc,
            page_size,
            cache_dtype,
            num_tokens,
            reserved,
        };
        with_struct(c, &mut call, args, |a| unsafe {
            unikv_store_indexer(ctx, a, ptr::null_mut())
        })
    } else {
        let args = unikv_store_flashmla_args {
            struct_size: std::mem::size_of::<unikv_store_flashmla_args>(),
            cache,
            kv: rows,
            loc,
            page_size,
            cache_dtype,
            num_tokens,
            reserved,
        };
        with_struct(c, &mut call, args, |a| unsafe {
            unikv_store_flashmla(ctx, a, ptr::null_mut())
        })
    };
    call.finish(s);
}

/// `unikv_prepare_qkv`; now and then `unikv_prepare_qkv_indexer_q`, with an
/// indexer query struct of its own tokens and tensors.
pub fn prepare_qkv(w: &mut World, c: &mut Cursor) {
    let fused = c.chance(48);
    let name = if fused {
        "unikv_prepare_qkv_indexer_q"
    } else {
        "unikv_prepare_qkv"
    };
    let mut call = w.call(name, true);
    let Some(t) = target(w, c, &mut call, None) else {
        return;
    };
    let n = tokens(c);
    let held = n + slack(c);
    let h = c.pick(&[1, 2, 3, 1, 16]);
    let q_in = call.tensor(
        c,
        Spec::new("q_in", &[BF16], &[held, h, 512], Role::In, Fill::Floats)
            .pad()
            .align(16),
    );
    let q_out = if c.chance(40) {
        call.in_place(0)
    } else {
        call.tensor(
            c,
            Spec::new("q_out", &[BF16], &[held, h, 512], Role::Out, Fill::Poison)
                .pad()
                .align(16),
        )
    };
    let kv_idx = call.args.len();
    let kv_in = call.tensor(c, bf16_rows("kv_in", held, Role::In));
    let kv_weight = call.tensor(
        c,
        Spec::new("kv_weight", &[BF16], &[512], Role::In, Fill::Floats).align(16),
    );
    let kv_out = match c.below(3) {
        0 => absent(),
        1 => call.in_place(kv_idx),
        _ => call.tensor(c, bf16_rows("kv_out", held, Role::Out).optional()),
    };
    let rope_table = rope_arg(w, c, &mut call);
    let dt = either(c);
    let pos = rope_positions(c, held);
    let positions = call.tensor(
        c,
        Spec::new("positions", dt, &[held], Role::In, Fill::Ints(pos.clone())),
    );
    let rows = if c.chance(200) && t.layer_ok {
        let p = &w.pools[t.i];
        // Ring rows of distinct slots, or -1.
        let slots = req_slots(w, c, t.i, held);
        let r: Vec<i64> = (0..held)
            .map(|k| {
                if c.chance(30) {
                    -1
                } else {
                    (slots[k] as usize * p.ring() + pos[k] as usize % p.ring()) as i64
                }
            })
            .collect();
        let dt = either(c);
        call.tensor(
            c,
            Spec::new("rows", dt, &[held], Role::In, Fill::Ints(r)).optional(),
        )
    } else {
        absent()
    };
    let eps_bad = [0.0, -1e-6, f32::NAN, f32::INFINITY];
    let args = unikv_prepare_qkv_args {
        struct_size: std::mem::size_of::<unikv_prepare_qkv_args>(),
        q_in,
        q_out,
        kv_in,
        kv_weight,
        kv_out,
        rope_table,
        positions,
        rows,
        layer: t.layer,
        num_tokens: count(c, &mut call, n, held),
        num_heads: scalar_past(c, &mut call, h as u32, &[0, h as u32 + 1], "num_heads vs q"),
        q_eps: f32_scalar(c, &mut call, 1e-6, &eps_bad, "q_eps"),
        kv_eps: f32_scalar(c, &mut call, 1e-6, &eps_bad, "kv_eps"),
        reserved: scalar(c, &mut call, 0, &[1], "reserved"),
    };
    let query = fused.then(|| super::indexer::query_args(w, c, &mut call));
    watch_layer(w, &mut call, &t);
    let s = match query {
        // A hostile struct_size goes to one of the two structs.
        Some(q) if c.chance(128) => with_struct(c, &mut call, q, |q| unsafe {
            unikv_prepare_qkv_indexer_q(t.h, &args, q, ptr::null_mut())
        }),
        Some(q) => with_struct(c, &mut call, args, |a| unsafe {
            unikv_prepare_qkv_indexer_q(t.h, a, &q, ptr::null_mut())
        }),
        None => with_struct(c, &mut call, args, |a| unsafe {
            unikv_prepare_qkv(t.h, a, ptr::null_mut())
        }),
    };
    call.finish(s);
}

pub fn inverse_rope(w: &mut World, c: &mut Cursor) {
    let mut call = w.call("unikv_inverse_rope", true);
    let ctx = ctx_of(w, c, &mut call);
    let n = tokens(c);
    let held = n + slack(c);
    let h = c.pick(&[1, 2, 4, 16]);
    let x = call.tensor(
        c,
        Spec::new("x", &[BF16], &[held, h, 512], Role::InOut, Fill::Floats)
            .pad()
            .align(8),
    );
    let dt = either(c);
    let pos = rope_positions(c, held);
    let positions = call.tensor(
        c,
        Spec::new("positions", dt, &[held], Role::In, Fill::Ints(pos)),
    );
    let rope_table = rope_arg(w, c, &mut call);
    let args = unikv_inverse_rope_args {
        struct_size: std::mem::size_of::<unikv_inverse_rope_args>(),
        x,
        positions,
        rope_table,
        num_tokens: count(c, &mut call, n, held),
        num_heads: scalar_past(
            c,
            &mut call,
            h as u32,
            &[0, h as u32 + 1, u32::MAX],
            "num_heads vs x",
        ),
    };
    let s = with_struct(c, &mut call, args, |a| unsafe {
        unikv_inverse_rope(ctx, a, ptr::null_mut())
    });
    call.finish(s);
}
