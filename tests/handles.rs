//! Handles are checked against the registry of live ones (issue 21): use
//! after destroy, double destroy, a handle of another kind and a pointer the
//! library never returned are INVALID_HANDLE, never a crash or a call on freed
//! memory. One test in its own binary: no other test creates handles
//! meanwhile, so a destroyed handle's address cannot be handed out again
//! between its destroy and its misuse.

mod common;

use std::ptr;

use common::*;
use unikv::ffi::attention::*;
use unikv::ffi::context::*;
use unikv::ffi::pool::*;
use unikv::ffi::types::unikv_dtype;

fn plan_params() -> unikv_attention_plan_params {
    unikv_attention_plan_params {
        struct_size: std::mem::size_of::<unikv_attention_plan_params>(),
        max_tokens: 4,
        num_heads: 16,
        head_dim: 512,
        q_dtype: unikv_dtype::UNIKV_DTYPE_BF16 as u32,
        kv_dtype: unikv_dtype::UNIKV_DTYPE_BF16 as u32,
        out_dtype: unikv_dtype::UNIKV_DTYPE_BF16 as u32,
        kv_layout: 0,
        reserved: 0,
    }
}

#[test]
fn dead_foreign_and_garbage_handles_are_reported() {
    let spec = PoolSpec {
        ratios: vec![0],
        max_requests: 2,
        window: 4,
        spec_extra: 0,
        c128_blocks: 0,
    };
    let ctx = Ctx::cpu(1);
    let mut pool = ptr::null_mut();
    ok(unsafe { unikv_pool_create(ctx.0, &spec.params(), &mut pool) });
    let mut plan = ptr::null_mut();
    ok(unsafe { unikv_decode_plan_create(ctx.0, &plan_params(), &mut plan) });
    let mut prefill = ptr::null_mut();
    ok(unsafe { unikv_prefill_plan_create(ctx.0, &plan_params(), &mut prefill) });

    // A handle of another kind, and pointers unikv never returned.
    let mut garbage = [0u64; 64];
    let foreign: [(*const unikv_pool, &str); 4] = [
        (ctx.0 as *const unikv_pool, "is a unikv_context"),
        (plan as *const unikv_pool, "is a unikv_decode_plan"),
        (
            garbage.as_mut_ptr() as *const unikv_pool,
            "not a live unikv_pool",
        ),
        (0x10 as *const unikv_pool, "not a live unikv_pool"),
    ];
    for (handle, says) in foreign {
        let mut slot = 0;
        fails(
            unsafe { unikv_pool_acquire_slot(handle, &mut slot) },
            UNIKV_INVALID_HANDLE,
            says,
        );
        assert_eq!(slot, 0, "nothing written");
    }
    let mut bytes = 7;
    fails(
        unsafe { unikv_decode_plan_workspace_size(prefill as *const _, &mut bytes) },
        UNIKV_INVALID_HANDLE,
        "is a unikv_prefill_plan",
    );
    assert_eq!(bytes, 7);
    // Destroying a foreign pointer leaves it alone and says why.
    unsafe { unikv_pool_destroy(garbage.as_mut_ptr().cast()) };
    assert!(
        last_error().contains("not a live unikv_pool"),
        "{}",
        last_error()
    );
    unsafe { unikv_context_destroy(pool.cast()) };
    assert!(last_error().contains("is a unikv_pool"), "{}", last_error());
    assert!(garbage.iter().all(|w| *w == 0));

    // The pool still works, then is used after destroy: it used to return OK
    // and hand out the reserved slot 0.
    let mut slot = 0;
    ok(unsafe { unikv_pool_acquire_slot(pool, &mut slot) });
    assert_eq!(slot, 1);
    unsafe { unikv_pool_destroy(pool) };
    let mut slot = 99;
    fails(
        unsafe { unikv_pool_acquire_slot(pool, &mut slot) },
        UNIKV_INVALID_HANDLE,
        "pool: ",
    );
    assert_eq!(slot, 99);
    fails(
        unsafe { unikv_pool_release_slot(pool, 1) },
        UNIKV_INVALID_HANDLE,
        "not a live unikv_pool",
    );
    // Double destroys are ignored and reported.
    unsafe { unikv_pool_destroy(pool) };
    assert!(
        last_error().contains("not a live unikv_pool"),
        "{}",
        last_error()
    );
    unsafe { unikv_decode_plan_destroy(plan) };
    unsafe { unikv_decode_plan_destroy(plan) };
    assert!(last_error().contains("not a live unikv_decode_plan"));
    fails(
        unsafe { unikv_decode_plan_workspace_size(plan, &mut bytes) },
        UNIKV_INVALID_HANDLE,
        "plan: ",
    );
    unsafe { unikv_prefill_plan_destroy(prefill) };

    // A context after destroy, and twice destroyed.
    let dead = ctx.0;
    drop(ctx);
    let mut info: unikv_context_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<unikv_context_info>();
    fails(
        unsafe { unikv_context_get_info(dead, &mut info) },
        UNIKV_INVALID_HANDLE,
        "ctx: ",
    );
    let mut pool = ptr::null_mut();
    fails(
        unsafe { unikv_pool_create(dead, &spec.params(), &mut pool) },
        UNIKV_INVALID_HANDLE,
        "not a live unikv_context",
    );
    assert!(pool.is_null());
    unsafe { unikv_context_destroy(dead) };
    assert!(last_error().contains("not a live unikv_context"));
}
