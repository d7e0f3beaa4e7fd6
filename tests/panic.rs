//! A panic inside an entry point comes back as UNIKV_INTERNAL and leaves the
//! context unusable (needs `--features test-hooks`).
#![cfg(feature = "test-hooks")]

mod common;

use std::ptr;

use common::*;
use half::bf16;
use unikv::ffi::pool::unikv_pool_acquire_slot;
use unikv::ffi::store::{unikv_store_swa, unikv_store_swa_args};

#[test]
fn panic_becomes_internal_and_poisons_the_context() {
    let ctx = Ctx::cpu(1);
    let pool = Pool::new(
        &ctx,
        &PoolSpec {
            ratios: vec![0],
            max_requests: 2,
            window: 4,
            spec_extra: 0,
            c128_blocks: 0,
        },
    );
    let kv = vec![bf16::ONE; 512];
    let (batch, slots, pos) = ([0], [1], [0]);
    let args = unikv_store_swa_args {
        struct_size: std::mem::size_of::<unikv_store_swa_args>(),
        kv: tensor(&kv, &[1, 512]),
        batch_id: vec1(&batch),
        req_slots: vec1(&slots),
        positions: vec1(&pos),
        final_pos: absent(),
        layer: 0,
        num_tokens: 1,
    };
    ok(unsafe { unikv_store_swa(pool.0, &args, ptr::null_mut()) });

    unikv::ffi::test_hooks::arm_panic();
    let mut slot = 77;
    fails(
        unsafe { unikv_pool_acquire_slot(pool.0, &mut slot) },
        UNIKV_INTERNAL,
        "panic",
    );
    assert_eq!(slot, 77, "nothing written");

    // The context that was in use is now unusable; handles still destroy cleanly.
    fails(
        unsafe { unikv_store_swa(pool.0, &args, ptr::null_mut()) },
        UNIKV_INVALID_STATE,
        "context",
    );
}
