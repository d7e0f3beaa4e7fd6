//! Attention: sparse_decode (with and without the inverse-RoPE epilogue),
//! sparse_prefill (pool and extend sources, -1 skipped) and attention_merge.

use std::os::raw::c_void;
use std::ptr;

use unikv::ffi::attention::*;
use unikv::ffi::types::unikv_tensor;

use super::call::{with_struct, Call, Fill, Role, Spec, BF16, F32};
use super::stores::{
    absent, count, ctx_of, either, f32_scalar, positions, rope_positions, rope_table_arg, scalar,
    slack, tokens, IDX,
};
use super::{Cursor, World};

/// A ragged stream over `rows` rows: indptr `[held + 1]` and indices, each
/// of the first `n` tokens taking 0..=4 entries (-1 now and then when
/// `skip`).
fn stream(
    call: &mut Call,
    c: &mut Cursor,
    names: (&'static str, &'static str),
    n: usize,
    held: usize,
    rows: usize,
    skip: bool,
) -> (unikv_tensor, unikv_tensor) {
    let mut indptr = vec![0i64];
    let mut indices = Vec::new();
    for t in 0..held {
        if t < n {
            for _ in 0..c.below(5) {
                let v = if rows == 0 || (skip && c.chance(30)) {
                    -1
                } else {
                    c.below(rows) as i64
                };
                indices.push(v);
            }
        }
        indptr.push(indices.len() as i64);
    }
    let cap = indices.len() + c.below(3);
    let idx = call.tensor(
        c,
        Spec::new(names.0, IDX, &[cap], Role::In, Fill::Ints(indices)),
    );
    let ip = call.tensor(
        c,
        Spec::new(names.1, IDX, &[held + 1], Role::In, Fill::Ints(indptr)),
    );
    (idx, ip)
}

fn optional_f32(
    call: &mut Call,
    c: &mut Cursor,
    name: &'static str,
    shape: &[usize],
    role: Role,
) -> unikv_tensor {
    if c.chance(100) {
        return absent();
    }
    let fill = if role == Role::Out {
        Fill::Poison
    } else {
        Fill::Floats
    };
    call.tensor(
        c,
        Spec::new(name, &[F32], shape, role, fill).pad().optional(),
    )
}

pub fn attention(w: &mut World, c: &mut Cursor) {
    let prefill = c.chance(100);
    let mut call = w.call(
        if prefill {
            "unikv_sparse_prefill"
        } else {
            "unikv_sparse_decode"
        },
        true,
    );
    let Some(pi) = w.pick_pool(c) else { return };
    let (pctx, pdtype) = (w.pools[pi].ctx, w.pools[pi].dtype);
    let fitting = |w: &World| {
        w.plans
            .iter()
            .any(|q| q.prefill == prefill && q.ctx == pctx && q.kv_dtype == pdtype)
    };
    if !fitting(w)
        && w.ctxs.iter().any(|x| x.h == pctx)
        && w.plans.len() < super::lifecycle::MAX_LIVE
    {
        super::lifecycle::honest_plan(w, c, pctx, prefill, pdtype);
    }
    if w.plans.is_empty() {
        return;
    }
    let p = &w.pools[pi];
    // A plan of the right kind on the pool's context for its dtype, if any.
    let fits: Vec<usize> = (0..w.plans.len())
        .filter(|&k| {
            let q = &w.plans[k];
            q.prefill == prefill && q.ctx == p.ctx && q.kv_dtype == p.dtype
        })
        .collect();
    let ki = if !fits.is_empty() && c.chance(230) {
        fits[c.below(fits.len())]
    } else {
        c.below(w.plans.len())
    };
    call.validates = p.validates;
    let plan_h = w.handle(c, &mut call, w.plans[ki].h);
    // Judge the plan actually passed (a substituted handle may be a fitting
    // plan, or one of the other kind).
    call.must_fail = None;
    let plan = match w.plans.iter().find(|q| q.h == plan_h) {
        Some(q) => q,
        None => {
            call.fail_because("not a live plan");
            &w.plans[ki]
        }
    };
    if plan.prefill != prefill {
        call.fail_because("plan of the other kind");
    } else if plan.ctx != p.ctx {
        call.fail_because("plan and pool of different contexts");
    } else if plan.kv_dtype != p.dtype {
        call.fail_because("plan made for another KV dtype");
    }
    let pool_h = w.handle(c, &mut call, p.h.cast());
    let (max_tokens, h, ws, ws_bytes) = (
        plan.max_tokens as usize,
        plan.heads as usize,
        plan.workspace,
        plan.ws_bytes,
    );
    let n = tokens(c).min(max_tokens);
    let held = n + slack(c);
    let nl = p.ratios.len();
    let mut layer = c.below(nl) as u32;
    if c.chance(8) {
        layer = c.pick(&[nl as u32, u32::MAX]);
        call.fail_because("layer past the pool");
    }
    let rows = p.rows((layer as usize).min(nl - 1));
    let q = call.tensor(
        c,
        Spec::new("q", &[BF16], &[held, h, 512], Role::In, Fill::Floats)
            .pad()
            .align(16),
    );
    let (indices, indptr) = stream(&mut call, c, ("indices", "indptr"), n, held, rows, prefill);
    let sink = optional_f32(&mut call, c, "sink", &[h], Role::In);
    let out = call.tensor(
        c,
        Spec::new("out", &[BF16], &[held, h, 512], Role::Out, Fill::Poison)
            .pad()
            .align(16),
    );
    let lse = optional_f32(&mut call, c, "lse", &[held, h], Role::Out);
    let softmax_scale = f32_scalar(
        c,
        &mut call,
        0.044,
        &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY],
        "softmax_scale",
    );
    let reserved = scalar(c, &mut call, 0, &[1, u32::MAX], "reserved");
    let num_tokens = scalar(
        c,
        &mut call,
        n as u32,
        &[max_tokens as u32 + 1, u32::MAX],
        "num_tokens past the plan",
    );
    let (mut wsp, mut wsb) = (ws as *mut c_void, ws_bytes);
    if c.chance(12) {
        if ws_bytes > 0 {
            match c.below(2) {
                0 => wsp = ptr::null_mut(),
                _ => wsb = ws_bytes - 1,
            }
            call.fail_because("workspace smaller than the plan's");
        } else {
            (wsp, wsb) = (ptr::null_mut(), 0);
        }
    }
    let s = if prefill {
        let ext_rows = c.range(0, 6);
        let extend_kv = call.tensor(c, super::stores::bf16_rows("extend_kv", ext_rows, Role::In));
        let (extend_indices, extend_indptr) = stream(
            &mut call,
            c,
            ("extend_indices", "extend_indptr"),
            n,
            held,
            ext_rows,
            true,
        );
        let args = unikv_prefill_args {
            struct_size: std::mem::size_of::<unikv_prefill_args>(),
            q,
            indices,
            indptr,
            sink,
            out,
            lse,
            extend_kv,
            extend_indices,
            extend_indptr,
            layer,
            num_tokens,
            softmax_scale,
            reserved,
            kv: Default::default(),
            extend_cache: Default::default(),
        };
        with_struct(c, &mut call, args, |a| unsafe {
            unikv_sparse_prefill(plan_h.cast(), pool_h.cast(), a, wsp, wsb, ptr::null_mut())
        })
    } else {
        let (rope_table, positions) = match c.below(6) {
            0 | 1 => {
                let t = rope_table_arg(w, c, &mut call, true);
                let dt = either(c);
                let pos = rope_positions(c, held);
                (
                    t,
                    call.tensor(
                        c,
                        Spec::new("positions", dt, &[held], Role::In, Fill::Ints(pos)).optional(),
                    ),
                )
            }
            2 if c.chance(128) => (rope_table_arg(w, c, &mut call, true), absent()),
            2 => {
                let pos = positions(c, held);
                (
                    absent(),
                    call.tensor(
                        c,
                        Spec::new("positions", IDX, &[held], Role::In, Fill::Ints(pos)).optional(),
                    ),
                )
            }
            _ => (absent(), absent()),
        };
        if rope_table.data.is_null() != positions.data.is_null() {
            call.fail_because("an epilogue tensor without the other");
        }
        let args = unikv_decode_args {
            struct_size: std::mem::size_of::<unikv_decode_args>(),
            q,
            indices,
            indptr,
            sink,
            out,
            lse,
            layer,
            num_tokens,
            softmax_scale,
            reserved,
            rope_table,
            positions,
            kv: Default::default(),
            extra_kv: Default::default(),
            extra_indices: Default::default(),
            extra_indptr: Default::default(),
        };
        with_struct(c, &mut call, args, |a| unsafe {
            unikv_sparse_decode(plan_h.cast(), pool_h.cast(), a, wsp, wsb, ptr::null_mut())
        })
    };
    call.finish(s);
}

pub fn merge(w: &mut World, c: &mut Cursor) {
    let mut call = w.call("unikv_attention_merge", true);
    call.honest_must_pass = true;
    let ctx = ctx_of(w, c, &mut call);
    let n = tokens(c);
    let held = n + slack(c);
    let parts = c.range(1, 3);
    let h = c.pick(&[1, 2, 3, 16]);
    let parts_out = call.tensor(
        c,
        Spec::new(
            "parts_out",
            &[BF16],
            &[parts, held, h, 512],
            Role::In,
            Fill::Floats,
        )
        .pad()
        .align(16),
    );
    let mut lse_values: Vec<f32> = Vec::new();
    for _ in 0..parts * held * h {
        lse_values.push(if c.chance(30) {
            f32::NEG_INFINITY
        } else {
            c.small_f32()
        });
    }
    let parts_lse = call.tensor(
        c,
        Spec::new(
            "parts_lse",
            &[F32],
            &[parts, held, h],
            Role::In,
            Fill::F32s(lse_values),
        )
        .pad(),
    );
    let sink = optional_f32(&mut call, c, "sink", &[h], Role::In);
    let out = call.tensor(
        c,
        Spec::new("out", &[BF16], &[held, h, 512], Role::Out, Fill::Poison)
            .pad()
            .align(16),
    );
    let lse = optional_f32(&mut call, c, "lse", &[held, h], Role::Out);
    let args = unikv_merge_args {
        struct_size: std::mem::size_of::<unikv_merge_args>(),
        parts_out,
        parts_lse,
        sink,
        out,
        lse,
        num_tokens: count(c, &mut call, n, held),
        reserved: scalar(c, &mut call, 0, &[1], "reserved"),
    };
    let s = with_struct(c, &mut call, args, |a| unsafe {
        unikv_attention_merge(ctx, a, ptr::null_mut())
    });
    call.finish(s);
}
