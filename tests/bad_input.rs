//! Bad input through the C ABI: each case starts from a valid call, breaks one
//! thing, and asserts the exact status, that the message names the argument, and
//! that every output buffer is byte-identical to its poison afterwards.

mod common;

use std::ptr;

use common::*;
use half::bf16;
use unikv::ffi::context::*;
use unikv::ffi::index::*;
use unikv::ffi::pool::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::store::*;

fn small_pool(ctx: &Ctx) -> Pool {
    Pool::new(
        ctx,
        &PoolSpec {
            ratios: vec![0, 4, 128],
            max_requests: 3,
            window: 4,
            spec_extra: 0,
            c128_blocks: 4,
        },
    )
}

/// Inputs and poisoned outputs of a 3-token decode-stream build.
struct DecodeCase {
    batch_id: Vec<i32>,
    req_slots: Vec<i32>,
    positions: Vec<i32>,
    c128: Vec<i32>,
    outs: Vec<Vec<i32>>,
}

impl DecodeCase {
    fn new() -> Self {
        DecodeCase {
            batch_id: vec![0, 1, -1],
            req_slots: vec![1, 3],
            positions: vec![300, 7, 0],
            c128: vec![0, 1, 2, 3, 4, 5],
            // swa/hca/csa indptr and indices (window 4, c128 width 2, topk 8).
            outs: vec![
                poisoned(4),
                poisoned(12),
                poisoned(4),
                poisoned(18),
                poisoned(4),
                poisoned(36),
            ],
        }
    }

    fn args(&self) -> unikv_decode_streams_args {
        unikv_decode_streams_args {
            struct_size: std::mem::size_of::<unikv_decode_streams_args>(),
            batch_id: vec1(&self.batch_id),
            req_slots: vec1(&self.req_slots),
            positions: vec1(&self.positions),
            c128_page_indices: tensor(&self.c128, &[3, 2]),
            swa_indptr: vec1(&self.outs[0]),
            swa_indices: vec1(&self.outs[1]),
            hca_indptr: vec1(&self.outs[2]),
            hca_indices: vec1(&self.outs[3]),
            csa_indptr: vec1(&self.outs[4]),
            csa_indices: vec1(&self.outs[5]),
            num_tokens: 3,
            csa_topk: 8,
        }
    }

    fn outputs(&self) -> Vec<u8> {
        self.outs.iter().flat_map(|o| bytes_of(o)).collect()
    }
}

#[test]
fn decode_stream_builder_rejects_bad_input() {
    let ctx = Ctx::cpu(1);
    let pool = small_pool(&ctx);
    type Mutation = fn(&mut DecodeCase, &mut unikv_decode_streams_args);
    let cases: Vec<(&str, Mutation, unikv_status, &str)> = vec![
        (
            "struct_size 0",
            |_, a| a.struct_size = 0,
            UNIKV_BAD_STRUCT_SIZE,
            "args.struct_size",
        ),
        (
            "unknown dtype",
            |_, a| a.positions.dtype = 77,
            UNIKV_BAD_ENUM,
            "positions.dtype",
        ),
        (
            "f32 positions",
            |_, a| a.positions.dtype = 3,
            UNIKV_BAD_DTYPE,
            "positions",
        ),
        (
            "2-D batch_id",
            |_, a| a.batch_id.ndim = 2,
            UNIKV_BAD_SHAPE,
            "batch_id",
        ),
        (
            "short positions",
            |_, a| a.positions.shape[0] = 2,
            UNIKV_BAD_SHAPE,
            "positions",
        ),
        (
            "null positions",
            |_, a| a.positions.data = ptr::null_mut(),
            UNIKV_NULL_ARGUMENT,
            "positions.data",
        ),
        (
            "strided batch_id",
            |_, a| a.batch_id.strides[0] = 2,
            UNIKV_BAD_STRIDE,
            "batch_id",
        ),
        (
            "misaligned indptr",
            |_, a| a.swa_indptr.data = unsafe { a.swa_indptr.data.cast::<u8>().add(2).cast() },
            UNIKV_BAD_ALIGNMENT,
            "swa_indptr",
        ),
        (
            "small swa capacity",
            |_, a| a.swa_indices.shape[0] = 11,
            UNIKV_CAPACITY_EXCEEDED,
            "swa_indices",
        ),
        (
            "small csa capacity",
            |_, a| a.csa_topk = 9,
            UNIKV_CAPACITY_EXCEEDED,
            "csa_indices",
        ),
        (
            "short indptr",
            |_, a| a.hca_indptr.shape[0] = 3,
            UNIKV_BAD_SHAPE,
            "hca_indptr",
        ),
        (
            "batch id past requests",
            |c, _| c.batch_id[1] = 2,
            UNIKV_OUT_OF_RANGE,
            "batch_id[1]",
        ),
        (
            "slot past the pool",
            |c, _| c.req_slots[1] = 4,
            UNIKV_OUT_OF_RANGE,
            "req_slots[1]",
        ),
        (
            "negative position",
            |c, _| c.positions[0] = -5,
            UNIKV_OUT_OF_RANGE,
            "positions[0]",
        ),
        (
            "c128 page past rows",
            |c, _| c.c128[1] = 6,
            UNIKV_OUT_OF_RANGE,
            "c128_page_indices[0][1]",
        ),
    ];
    for (what, mutate, status, arg) in cases {
        let mut case = DecodeCase::new();
        let mut args = case.args();
        mutate(&mut case, &mut args);
        let before = case.outputs();
        let got = unsafe { unikv_build_decode_streams(pool.0, &args, ptr::null_mut()) };
        check(got, status);
        assert!(
            last_error().contains(arg),
            "{what}: {:?} does not name {arg}",
            last_error()
        );
        assert_eq!(case.outputs(), before, "{what}: outputs changed");
    }
    // Null handle and null args.
    let case = DecodeCase::new();
    fails(
        unsafe { unikv_build_decode_streams(ptr::null(), &case.args(), ptr::null_mut()) },
        UNIKV_NULL_ARGUMENT,
        "pool",
    );
    fails(
        unsafe { unikv_build_decode_streams(pool.0, ptr::null(), ptr::null_mut()) },
        UNIKV_NULL_ARGUMENT,
        "args",
    );
    // Larger struct_size with unknown non-zero trailing bytes is refused; zero bytes accepted.
    #[repr(C)]
    struct Newer {
        args: unikv_decode_streams_args,
        extra: u64,
    }
    let mut newer = Newer {
        args: case.args(),
        extra: 1,
    };
    newer.args.struct_size = std::mem::size_of::<Newer>();
    fails(
        unsafe { unikv_build_decode_streams(pool.0, &newer.args, ptr::null_mut()) },
        UNIKV_BAD_STRUCT_SIZE,
        "args.struct_size",
    );
    newer.extra = 0;
    ok(unsafe { unikv_build_decode_streams(pool.0, &newer.args, ptr::null_mut()) });
}

#[test]
fn csa_tail_rejects_bad_tables_and_indptrs() {
    let ctx = Ctx::cpu(1);
    let pool = small_pool(&ctx);
    let case = DecodeCase::new();
    ok(unsafe { unikv_build_decode_streams(pool.0, &case.args(), ptr::null_mut()) });
    // Token 0 (pos 300) has min(75, 8) = 8 top-k entries, token 1 (pos 7) 2.
    let valid_table: Vec<i32> = (0..24).map(|i| if i % 8 < 8 { i } else { -1 }).collect();
    type Mutation = fn(&mut Vec<i32>, &mut Vec<i32>);
    let cases: Vec<(&str, Mutation, unikv_status, &str)> = vec![
        (
            "-1 inside the top-k length",
            |table, _| table[3] = -1,
            UNIKV_OUT_OF_RANGE,
            "csa_page_indices[0][3]",
        ),
        (
            "page index past the CSA rows",
            |table, _| table[9] = 4 * 32 + 64,
            UNIKV_OUT_OF_RANGE,
            "csa_page_indices[1][1]",
        ),
        (
            "decreasing indptr",
            |_, indptr| indptr[2] = indptr[1] - 1,
            UNIKV_OUT_OF_RANGE,
            "csa_indptr[2]",
        ),
        (
            "indptr past the buffer",
            |_, indptr| indptr[3] = 1000,
            UNIKV_OUT_OF_RANGE,
            "csa_indptr[3]",
        ),
    ];
    for (what, mutate, status, arg) in cases {
        let mut table = valid_table.clone();
        let mut indptr = case.outs[4].clone();
        let indices = case.outs[5].clone();
        mutate(&mut table, &mut indptr);
        let args = unikv_csa_tail_args {
            struct_size: std::mem::size_of::<unikv_csa_tail_args>(),
            batch_id: vec1(&case.batch_id),
            positions: vec1(&case.positions),
            csa_page_indices: tensor(&table, &[3, 8]),
            csa_indptr: vec1(&indptr),
            csa_indices: vec1(&indices),
            num_tokens: 3,
            reserved: 0,
        };
        let before = bytes_of(&indices);
        let got = unsafe { unikv_fill_csa_tail(pool.0, &args, ptr::null_mut()) };
        check(got, status);
        assert!(
            last_error().contains(arg),
            "{what}: {:?} does not name {arg}",
            last_error()
        );
        assert_eq!(bytes_of(&indices), before, "{what}: indices changed");
    }
}

#[test]
fn prefill_stream_builder_rejects_bad_input() {
    let ctx = Ctx::cpu(1);
    let pool = small_pool(&ctx);
    let batch_id = [0, 0];
    let req_slots = [2];
    let positions = [10, 11];
    let table = [0, 1, 0, 1];
    let outs: Vec<Vec<i32>> = vec![poisoned(3), poisoned(12), poisoned(3), poisoned(8)];
    let far_table = [0, 1, 4 * 32 + 64, 1];
    let base = |chunk_start: &[i32], extend_start: &[i32], ratio: u32, table: &[i32]| {
        unikv_prefill_streams_args {
            struct_size: std::mem::size_of::<unikv_prefill_streams_args>(),
            batch_id: vec1(&batch_id),
            req_slots: vec1(&req_slots),
            positions: vec1(&positions),
            chunk_start: vec1(chunk_start),
            extend_start: vec1(extend_start),
            page_indices: tensor(table, &[2, 2]),
            prefix_indptr: vec1(&outs[0]),
            prefix_indices: vec1(&outs[1]),
            extend_indptr: vec1(&outs[2]),
            extend_indices: vec1(&outs[3]),
            num_tokens: 2,
            compress_ratio: ratio,
        }
    };
    let before: Vec<u8> = outs.iter().flat_map(|o| bytes_of(o)).collect();
    let after = || -> Vec<u8> { outs.iter().flat_map(|o| bytes_of(o)).collect() };
    let cases = [
        (
            base(&[10], &[0], 5, &table),
            UNIKV_BAD_ENUM,
            "compress_ratio",
        ),
        (
            base(&[12], &[0], 4, &table),
            UNIKV_OUT_OF_RANGE,
            "chunk_start[0]",
        ),
        (
            base(&[10], &[-1], 4, &table),
            UNIKV_OUT_OF_RANGE,
            "extend_start[0]",
        ),
        (
            base(&[10], &[0], 4, &far_table),
            UNIKV_OUT_OF_RANGE,
            "page_indices[1][0]",
        ),
    ];
    for (args, status, arg) in cases {
        fails(
            unsafe { unikv_build_prefill_streams(pool.0, &args, ptr::null_mut()) },
            status,
            arg,
        );
        assert_eq!(after(), before);
    }
    // Ratio 128 sees no group before position 127, so the far entry is never read.
    ok(unsafe {
        unikv_build_prefill_streams(pool.0, &base(&[10], &[0], 128, &far_table), ptr::null_mut())
    });
}

#[test]
fn store_rejects_bad_input() {
    let mut rng = rand::rng();
    let ctx = Ctx::cpu(1);
    let pool = small_pool(&ctx);
    let kv = random_bf16(&mut rng, 2 * 512);
    let batch_id = [0, 1];
    let req_slots = [1, 2];
    let positions = [3, 4];
    let base = unikv_store_swa_args {
        struct_size: std::mem::size_of::<unikv_store_swa_args>(),
        kv: tensor(&kv, &[2, 512]),
        batch_id: vec1(&batch_id),
        req_slots: vec1(&req_slots),
        positions: vec1(&positions),
        final_pos: absent(),
        layer: 0,
        num_tokens: 2,
    };
    let bad_slots = [1, 9];
    let bad_pos = [3, -4];
    let wide_kv = vec![bf16::ZERO; 2 * 520];
    let cases = [
        (
            unikv_store_swa_args { layer: 3, ..base },
            UNIKV_OUT_OF_RANGE,
            "layer",
        ),
        (
            unikv_store_swa_args {
                req_slots: vec1(&bad_slots),
                ..base
            },
            UNIKV_OUT_OF_RANGE,
            "req_slots[1]",
        ),
        (
            unikv_store_swa_args {
                positions: vec1(&bad_pos),
                ..base
            },
            UNIKV_OUT_OF_RANGE,
            "positions[1]",
        ),
        (
            unikv_store_swa_args {
                kv: tensor(&wide_kv, &[2, 520]),
                ..base
            },
            UNIKV_BAD_SHAPE,
            "kv",
        ),
        (
            unikv_store_swa_args {
                num_tokens: 3,
                ..base
            },
            UNIKV_BAD_SHAPE,
            "kv",
        ),
        (
            unikv_store_swa_args {
                kv: tensor(&positions, &[2]),
                ..base
            },
            UNIKV_BAD_DTYPE,
            "kv",
        ),
    ];
    for (args, status, arg) in cases {
        let before = bytes_of(pool.rows_mut(0));
        fails(
            unsafe { unikv_store_swa(pool.0, &args, ptr::null_mut()) },
            status,
            arg,
        );
        assert_eq!(bytes_of(pool.rows_mut(0)), before);
    }
    ok(unsafe { unikv_store_swa(pool.0, &base, ptr::null_mut()) });
}

#[test]
fn creation_rejects_bad_parameters() {
    let ctx = Ctx::cpu(1);
    let good = PoolSpec {
        ratios: vec![0, 4],
        max_requests: 2,
        window: 4,
        spec_extra: 0,
        c128_blocks: 1,
    };
    let mut pool = ptr::null_mut();
    let ratios = [0u32, 5];
    let bad_ratio = unikv_pool_params {
        compress_ratios: ratios.as_ptr(),
        ..good.params()
    };
    let cases = [
        (
            unikv_pool_params {
                struct_size: 8,
                ..good.params()
            },
            UNIKV_BAD_STRUCT_SIZE,
            "params.struct_size",
        ),
        (bad_ratio, UNIKV_BAD_ENUM, "params.compress_ratios[1]"),
        (
            unikv_pool_params {
                kv_dtype: 3,
                ..good.params()
            },
            UNIKV_BAD_DTYPE,
            "params.kv_dtype",
        ),
        (
            unikv_pool_params {
                kv_dtype: 0,
                ..good.params()
            },
            UNIKV_BAD_ENUM,
            "params.kv_dtype",
        ),
        (
            unikv_pool_params {
                window: 0,
                ..good.params()
            },
            UNIKV_INVALID_ARGUMENT,
            "window",
        ),
        (
            unikv_pool_params {
                max_requests: 0,
                ..good.params()
            },
            UNIKV_INVALID_ARGUMENT,
            "max_requests",
        ),
        (
            unikv_pool_params {
                num_layers: 0,
                ..good.params()
            },
            UNIKV_INVALID_ARGUMENT,
            "num_layers",
        ),
        (
            unikv_pool_params {
                compress_ratios: ptr::null(),
                ..good.params()
            },
            UNIKV_NULL_ARGUMENT,
            "params.compress_ratios",
        ),
        (
            unikv_pool_params {
                c128_blocks: u32::MAX,
                ..good.params()
            },
            UNIKV_INVALID_ARGUMENT,
            "c128_blocks",
        ),
    ];
    for (params, status, arg) in cases {
        fails(
            unsafe { unikv_pool_create(ctx.0, &params, &mut pool) },
            status,
            arg,
        );
        assert!(pool.is_null(), "nothing written on error");
    }
    fails(
        unsafe { unikv_pool_create(ptr::null(), &good.params(), &mut pool) },
        UNIKV_NULL_ARGUMENT,
        "ctx",
    );
    fails(
        unsafe { unikv_pool_create(ctx.0, &good.params(), ptr::null_mut()) },
        UNIKV_NULL_ARGUMENT,
        "out",
    );
    let options = unikv_context_options {
        struct_size: std::mem::size_of::<unikv_context_options>(),
        backend: 9,
        device: 0,
        cpu_threads: 0,
        validate: 0,
    };
    let mut c = ptr::null_mut();
    fails(
        unsafe { unikv_context_create(&options, &mut c) },
        UNIKV_BAD_ENUM,
        "options.backend",
    );
    let options = unikv_context_options {
        backend: 1,
        device: -1,
        ..options
    };
    fails(
        unsafe { unikv_context_create(&options, &mut c) },
        UNIKV_OUT_OF_RANGE,
        "device",
    );
    assert!(c.is_null());
    // Destroy accepts NULL for every handle type.
    unsafe {
        unikv_context_destroy(ptr::null_mut());
        unikv_pool_destroy(ptr::null_mut());
        unikv::ffi::attention::unikv_decode_plan_destroy(ptr::null_mut());
        unikv::ffi::attention::unikv_prefill_plan_destroy(ptr::null_mut());
    }
}

#[test]
fn every_status_has_a_description() {
    use std::ffi::CStr;
    for status in unikv_status::ALL {
        let s = unsafe { CStr::from_ptr(unikv::ffi::unikv_status_string(status as u32)) };
        assert!(!s.to_bytes().is_empty());
    }
    let unknown = unsafe { CStr::from_ptr(unikv::ffi::unikv_status_string(12345)) };
    assert_eq!(unknown.to_str().unwrap(), "unknown status");
}
