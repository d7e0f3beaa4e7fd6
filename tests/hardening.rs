//! The boundary under hostile input (issue 21): descriptors whose stride
//! products wrap, pools too large to allocate, struct sizes past any real
//! struct, worker-thread counts past the limit, slot order, and messages that
//! name the argument at fault. Each case failed before its fix.

mod common;

use std::os::raw::c_void;
use std::process::Command;
use std::ptr;

use common::routing::{Case, Pointers};
use common::*;
use unikv::ffi::context::*;
use unikv::ffi::pool::*;
use unikv::ffi::routing::{unikv_hash_topk, unikv_hash_topk_args};

/// hash_topk with `topk_ids` rows `i64::MAX` elements apart: row t would land
/// 4t bytes before the buffer. The call must fail and leave the whole guard
/// region around both outputs untouched.
#[test]
fn a_stride_that_wraps_is_rejected_before_any_write() {
    let (mut rng, _) = seeded("a_stride_that_wraps_is_rejected_before_any_write");
    let ctx = Ctx::cpu(1);
    let case = Case::random(&mut rng, 3, 8, 2, 1);
    const GUARD: usize = 64;
    let weights: Vec<f32> = poisoned(case.out_len() + 2 * GUARD);
    let topk_ids: Vec<i32> = poisoned(case.out_len() + 2 * GUARD);
    let ids = case.id_bytes();
    let real = case.real_bytes().unwrap_or_default();
    let base = Pointers {
        logits: case.logits.as_ptr() as *mut c_void,
        ids: ids.as_ptr() as *mut c_void,
        table: case.table.as_ptr() as *mut c_void,
        weights: weights[GUARD..].as_ptr() as *mut c_void,
        topk_ids: topk_ids[GUARD..].as_ptr() as *mut c_void,
        real: real.as_ptr() as *mut c_void,
    };
    type Edit = fn(&mut unikv_hash_topk_args);
    let hostile: [(&str, Edit); 4] = [
        ("topk_ids", |a| a.topk_ids.strides[0] = i64::MAX),
        ("topk_weights", |a| a.topk_weights.strides[0] = i64::MAX),
        ("router_logits", |a| a.router_logits.strides[0] = i64::MAX),
        // 2^33 + 1 rows of stride 2^31 wrapped to a small span.
        ("topk_ids", |a| {
            a.topk_ids.shape[0] = (1 << 33) + 1;
            a.topk_ids.strides[0] = 1 << 31;
        }),
    ];
    for (arg, edit) in hostile {
        let mut args = case.args(&base);
        edit(&mut args);
        let status = unsafe { unikv_hash_topk(ctx.0, &args, ptr::null_mut()) };
        assert_ne!(status, UNIKV_OK, "{arg}: accepted");
        assert!(last_error().contains(arg), "{arg}: {}", last_error());
        assert_eq!(
            bytes_of(&weights),
            bytes_of(&poisoned::<f32>(weights.len()))
        );
        assert_eq!(
            bytes_of(&topk_ids),
            bytes_of(&poisoned::<i32>(topk_ids.len()))
        );
    }
    // The honest call over the same buffers still works.
    let status = unsafe { unikv_hash_topk(ctx.0, &case.args(&base), ptr::null_mut()) };
    ok(status);
    let n = case.out_len();
    case.check(&weights[GUARD..GUARD + n], &topk_ids[GUARD..GUARD + n]);
}

fn create_pool(ctx: &Ctx, spec: &PoolSpec) -> (unikv::ffi::status::unikv_status, *mut unikv_pool) {
    let mut pool = ptr::null_mut();
    let status = unsafe { unikv_pool_create(ctx.0, &spec.params(), &mut pool) };
    (status, pool)
}

/// Runs this test binary's test `name` in a child process whose address
/// space is limited to `limit_kib`, with `UNIKV_TEST_CHILD` set.
fn run_limited_child(name: &str, limit_kib: u64) {
    let exe = std::env::current_exe().unwrap();
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {limit_kib} && exec \"$0\" --exact {name} --test-threads=1 --nocapture"
        ))
        .arg(exe)
        .env("UNIKV_TEST_CHILD", "1")
        .status()
        .unwrap();
    assert!(
        status.success(),
        "child {name} under {limit_kib} KiB: {status}"
    );
}

/// A pool too large for memory is OUT_OF_MEMORY (or INVALID_ARGUMENT when it
/// cannot be addressed), never an abort, even when the process may map only
/// 1 GiB: the slot allocator no longer reserves memory per request.
#[test]
fn huge_pools_fail_cleanly_under_a_memory_limit() {
    if std::env::var_os("UNIKV_TEST_CHILD").is_none() {
        return run_limited_child("huge_pools_fail_cleanly_under_a_memory_limit", 1 << 20);
    }
    let ctx = Ctx::cpu(1);
    for (max_requests, window, status, arg) in [
        // 2^28 + 1 SWA rows (256 GiB): addressable, not allocatable.
        (1u32 << 28, 1u32, UNIKV_OUT_OF_MEMORY, "params"),
        (
            u32::MAX - 1,
            1,
            UNIKV_INVALID_ARGUMENT,
            "params.max_requests",
        ),
        ((1 << 31) - 2, 1, UNIKV_OUT_OF_MEMORY, "params"),
        (1, u32::MAX, UNIKV_INVALID_ARGUMENT, "params.window"),
    ] {
        let spec = PoolSpec {
            ratios: vec![0],
            max_requests,
            window,
            spec_extra: 0,
            c128_blocks: 0,
        };
        let (got, pool) = create_pool(&ctx, &spec);
        fails(got, status, arg);
        assert!(pool.is_null());
    }
}

#[test]
fn rows_past_32_bits_name_the_field_that_grew() {
    let ctx = Ctx::cpu(1);
    let spec = |max_requests, window, spec_extra, c128_blocks| PoolSpec {
        ratios: vec![4],
        max_requests,
        window,
        spec_extra,
        c128_blocks,
    };
    for (spec, arg) in [
        (spec(1 << 24, 128, 0, 0), "params.max_requests"),
        (spec(3, 1 << 30, 0, 0), "params.window"),
        (spec(3, 1, u32::MAX - 1, 0), "params.spec_extra"),
        (spec(3, 128, 0, 1 << 26), "params.c128_blocks"),
    ] {
        let (status, pool) = create_pool(&ctx, &spec);
        fails(status, UNIKV_INVALID_ARGUMENT, arg);
        assert!(pool.is_null());
    }
}

/// The header promises the lowest free slot; the free list used to be LIFO.
#[test]
fn slots_come_out_lowest_first() {
    let ctx = Ctx::cpu(1);
    let pool = Pool::new(
        &ctx,
        &PoolSpec {
            ratios: vec![0],
            max_requests: 4,
            window: 4,
            spec_extra: 0,
            c128_blocks: 0,
        },
    );
    let acquire = || {
        let mut slot = 0;
        ok(unsafe { unikv_pool_acquire_slot(pool.0, &mut slot) });
        slot
    };
    assert_eq!((acquire(), acquire(), acquire()), (1, 2, 3));
    for s in [1, 3, 2] {
        ok(unsafe { unikv_pool_release_slot(pool.0, s) });
    }
    assert_eq!((acquire(), acquire()), (1, 2));
    assert_eq!(pool.info().slots_in_use, 2);
}

/// A struct_size far past the library's struct is refused without reading
/// the caller's memory that far; up to 4096 extra zero bytes are accepted.
#[test]
fn struct_size_is_bounded() {
    let ours = std::mem::size_of::<unikv_context_options>();
    let mut buf = vec![0u8; ours + 8192];
    let options = unikv_context_options {
        struct_size: 0,
        backend: 1,
        device: 0,
        cpu_threads: 1,
        validate: 0,
    };
    for (size, want) in [
        (ours + 4096, UNIKV_OK),
        (ours + 4097, UNIKV_BAD_STRUCT_SIZE),
        (ours + 8192, UNIKV_BAD_STRUCT_SIZE),
        (usize::MAX, UNIKV_BAD_STRUCT_SIZE),
    ] {
        // SAFETY: `buf` holds the whole struct; only its prefix is set.
        unsafe {
            ptr::copy_nonoverlapping(
                &unikv_context_options {
                    struct_size: size,
                    ..options
                } as *const _ as *const u8,
                buf.as_mut_ptr(),
                ours,
            )
        };
        let mut ctx = ptr::null_mut();
        let status = unsafe { unikv_context_create(buf.as_ptr().cast(), &mut ctx) };
        check(status, want);
        if want == UNIKV_OK {
            unsafe { unikv_context_destroy(ctx) };
        } else {
            assert!(last_error().contains("struct_size"), "{}", last_error());
            assert!(ctx.is_null());
        }
    }
}

#[test]
fn cpu_threads_are_bounded() {
    let mut ctx = ptr::null_mut();
    let options = unikv_context_options {
        struct_size: std::mem::size_of::<unikv_context_options>(),
        backend: 1,
        device: 0,
        cpu_threads: 5000,
        validate: 0,
    };
    fails(
        unsafe { unikv_context_create(&options, &mut ctx) },
        UNIKV_INVALID_ARGUMENT,
        "options.cpu_threads",
    );
    assert!(ctx.is_null());
}

/// A pool without ratio-4 layers is not checked for CSA row ids at creation;
/// filling CSA tails over it used to truncate row ids past 2^31 - 1 on the
/// CPU backend (found by the fuzzer). The call is refused instead.
#[test]
fn csa_row_ids_past_32_bits_are_refused() {
    use unikv::ffi::index::{unikv_csa_tail_args, unikv_fill_csa_tail};
    let ctx = Ctx::cpu(1);
    let pool = Pool::new(
        &ctx,
        &PoolSpec {
            ratios: vec![0],
            max_requests: 1,
            window: 4,
            spec_extra: 0,
            c128_blocks: 1 << 26,
        },
    );
    let batch = [0i32];
    let positions = [7i32];
    let table = [i32::MAX - 8];
    let indptr = [0i32, 5];
    let indices: Vec<i32> = poisoned(5);
    let args = unikv_csa_tail_args {
        struct_size: std::mem::size_of::<unikv_csa_tail_args>(),
        batch_id: vec1(&batch),
        positions: vec1(&positions),
        csa_page_indices: tensor(&table, &[1, 1]),
        csa_indptr: vec1(&indptr),
        csa_indices: vec1(&indices),
        num_tokens: 1,
        reserved: 0,
    };
    fails(
        unsafe { unikv_fill_csa_tail(pool.0, &args, ptr::null_mut()) },
        UNIKV_INVALID_ARGUMENT,
        "pool: its ratio-4 row ids",
    );
    assert_eq!(bytes_of(&indices), bytes_of(&poisoned::<i32>(5)));
}
