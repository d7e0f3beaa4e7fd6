//! What a caller can ask the library: pool sizes before creation, the build's
//! capabilities, a required GPU, plan introspection and the log callback, and
//! decode streams without the HCA / CSA outputs a pool does not need.

mod common;

use std::ffi::CStr;
use std::os::raw::{c_char, c_void};
use std::ptr;
use std::sync::Mutex;

use common::*;
use unikv::ffi::attention::*;
use unikv::ffi::capabilities::*;
use unikv::ffi::context::*;
use unikv::ffi::index::*;
use unikv::ffi::introspect::*;
use unikv::ffi::log::*;
use unikv::ffi::pool::*;
use unikv::ffi::sizes::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::types::{unikv_backend, unikv_dtype};

const DTYPES: [unikv_dtype; 3] = [
    unikv_dtype::UNIKV_DTYPE_BF16,
    unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
    unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
];

fn specs() -> Vec<PoolSpec> {
    vec![
        PoolSpec {
            ratios: vec![0, 4, 128],
            max_requests: 3,
            window: 128,
            spec_extra: 0,
            c128_blocks: 10,
        },
        PoolSpec {
            ratios: vec![128, 0, 4, 4, 128],
            max_requests: 7,
            window: 8,
            spec_extra: 3,
            c128_blocks: 1,
        },
        PoolSpec {
            ratios: vec![0],
            max_requests: 1,
            window: 1,
            spec_extra: 0,
            c128_blocks: 0,
        },
        PoolSpec {
            ratios: vec![4],
            max_requests: 64,
            window: 128,
            spec_extra: 1,
            c128_blocks: 333,
        },
    ]
}

fn params_info(params: &unikv_pool_params) -> (unikv_status, unikv_pool_info) {
    let mut info: unikv_pool_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<unikv_pool_info>();
    let status = unsafe { unikv_pool_params_get_info(params, &mut info) };
    (status, info)
}

fn params_layer(params: &unikv_pool_params, layer: u32) -> (unikv_status, unikv_pool_layer_info) {
    let mut info: unikv_pool_layer_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<unikv_pool_layer_info>();
    let status = unsafe { unikv_pool_params_get_layer(params, layer, &mut info) };
    (status, info)
}

#[test]
fn sizes_before_creation_equal_a_created_pools() {
    let ctx = Ctx::cpu(1);
    for spec in specs() {
        for dtype in DTYPES {
            let params = spec.params_of(dtype);
            let (status, info) = params_info(&params);
            ok(status);
            let pool = Pool::of(&ctx, &spec, dtype);
            let real = pool.info();
            assert_eq!(info.swa_rows, real.swa_rows, "{spec:?} {dtype:?}");
            assert_eq!(info.row_bytes, real.row_bytes);
            assert_eq!(info.num_layers, real.num_layers);
            assert_eq!(info.max_requests, real.max_requests);
            assert_eq!(info.window, real.window);
            assert_eq!(info.ring, real.ring);
            assert_eq!(info.c128_blocks, real.c128_blocks);
            assert_eq!(info.kv_dtype, real.kv_dtype);
            assert_eq!(info.owns_memory, 1);
            assert_eq!(info.slots_in_use, 0);
            for layer in 0..spec.ratios.len() as u32 {
                let (status, l) = params_layer(&params, layer);
                ok(status);
                let r = pool.layer(layer);
                assert_eq!(l.rows, r.rows, "layer {layer} of {spec:?} {dtype:?}");
                assert_eq!(l.swa_rows, r.swa_rows);
                assert_eq!(l.compressed_rows, r.compressed_rows);
                assert_eq!(l.bytes, r.bytes);
                assert_eq!(l.rope_bytes, r.rope_bytes);
                assert_eq!(l.compress_ratio, r.compress_ratio);
                assert!(l.data.is_null() && l.rope_data.is_null());
                // The formula, restated: bf16 rows are 1024 bytes; FP8 rows a
                // 512-byte nope row plus a 128-byte rope row.
                let fp8 = dtype != unikv_dtype::UNIKV_DTYPE_BF16;
                assert_eq!(l.bytes, l.rows * if fp8 { 512 } else { 1024 });
                assert_eq!(l.rope_bytes, if fp8 { l.rows * 128 } else { 0 });
            }
            let (status, _) = params_layer(&params, spec.ratios.len() as u32);
            fails(status, UNIKV_OUT_OF_RANGE, "layer");
        }
    }
}

/// Buffers of exactly the reported sizes are what an adopting pool accepts.
#[test]
fn reported_sizes_are_what_an_adopting_pool_needs() {
    let ctx = Ctx::cpu(1);
    let spec = &specs()[1];
    for dtype in DTYPES {
        let fp8 = dtype != unikv_dtype::UNIKV_DTYPE_BF16;
        let sizing = spec.params_of(dtype);
        let layers: Vec<_> = (0..spec.ratios.len() as u32)
            .map(|l| params_layer(&sizing, l).1)
            .collect();
        let data: Vec<Dev> = layers
            .iter()
            .map(|l| Dev::zeroed(&ctx, l.bytes as usize))
            .collect();
        let rope: Vec<Dev> = layers
            .iter()
            .filter(|_| fp8)
            .map(|l| Dev::zeroed(&ctx, l.rope_bytes as usize))
            .collect();
        let data_ptrs: Vec<*mut c_void> = data.iter().map(|d| d.ptr).collect();
        let rope_ptrs: Vec<*mut c_void> = rope.iter().map(|d| d.ptr).collect();
        let mut params = spec.params_of(dtype);
        params.layer_buffers = data_ptrs.as_ptr();
        if fp8 {
            params.rope_buffers = rope_ptrs.as_ptr();
        }
        let (status, info) = params_info(&params);
        ok(status);
        assert_eq!(info.owns_memory, 0);
        for (i, l) in layers.iter().enumerate() {
            let (status, adopted) = params_layer(&params, i as u32);
            ok(status);
            assert_eq!(adopted.data, data_ptrs[i]);
            assert_eq!(adopted.rows, l.rows);
            if fp8 {
                assert_eq!(adopted.rope_data, rope_ptrs[i]);
            }
        }
        let mut pool = ptr::null_mut();
        ok(unsafe { unikv_pool_create(ctx.0, &params, &mut pool) });
        let pool = Pool(pool);
        assert_eq!(pool.info().owns_memory, 0);
        for (i, l) in layers.iter().enumerate() {
            let real = pool.layer(i as u32);
            assert_eq!((real.data, real.bytes), (data_ptrs[i], l.bytes));
            assert_eq!(real.rope_bytes, l.rope_bytes);
        }
        drop(pool);
    }
}

/// Every invalid parameter set gets the same status and message from the
/// size queries as from `unikv_pool_create`.
#[test]
fn sizes_validate_exactly_like_pool_create() {
    let ctx = Ctx::cpu(1);
    let base = PoolSpec {
        ratios: vec![0, 4, 128],
        max_requests: 2,
        window: 4,
        spec_extra: 0,
        c128_blocks: 1,
    };
    let bad_ratios = [0u32, 3, 128];
    let misaligned = [8usize as *mut c_void; 3];
    let aligned = [64usize as *mut c_void; 3];
    let mut cases: Vec<(&str, unikv_pool_params)> = Vec::new();
    let mut p = base.params();
    p.compress_ratios = bad_ratios.as_ptr();
    cases.push(("params.compress_ratios[1]", p));
    let mut p = base.params();
    p.num_layers = 0;
    cases.push(("params.num_layers", p));
    let mut p = base.params();
    p.compress_ratios = ptr::null();
    cases.push(("params.compress_ratios", p));
    let mut p = base.params();
    p.window = 0;
    cases.push(("params.window", p));
    let mut p = base.params();
    p.max_requests = 0;
    cases.push(("params.max_requests", p));
    let mut p = base.params_of(unikv_dtype::UNIKV_DTYPE_F32);
    p.struct_size = std::mem::size_of::<unikv_pool_params>();
    cases.push(("params.kv_dtype", p));
    let mut p = base.params();
    p.kv_dtype = 99;
    cases.push(("params.kv_dtype", p));
    let mut p = base.params();
    p.c128_blocks = u32::MAX;
    cases.push(("params.c128_blocks", p));
    let mut p = base.params();
    p.max_requests = 1 << 30;
    p.window = 1 << 20;
    cases.push(("params.max_requests", p));
    let mut p = base.params();
    p.struct_size = 8;
    cases.push(("params.struct_size", p));
    let mut p = base.params();
    p.rope_buffers = aligned.as_ptr();
    cases.push(("params.rope_buffers", p));
    let mut p = base.params();
    p.layer_buffers = misaligned.as_ptr();
    cases.push(("params.layer_buffers[0]", p));
    let mut p = base.params_of(unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN);
    p.layer_buffers = aligned.as_ptr();
    cases.push(("params.rope_buffers", p));
    for (arg, params) in &cases {
        let mut pool = ptr::null_mut();
        let created = unsafe { unikv_pool_create(ctx.0, params, &mut pool) };
        assert!(pool.is_null(), "{arg}: created");
        let created_msg = last_error();
        assert!(created_msg.contains(arg), "{created_msg:?} names {arg}");
        let (status, _) = params_info(params);
        assert_eq!(status, created, "{arg}");
        assert_eq!(last_error(), created_msg, "{arg}");
        let (status, _) = params_layer(params, 0);
        assert_eq!(status, created, "{arg}");
        assert_eq!(last_error(), created_msg, "{arg}");
    }
    let good = base.params();
    fails(
        unsafe { unikv_pool_params_get_info(ptr::null(), &mut std::mem::zeroed()) },
        UNIKV_NULL_ARGUMENT,
        "params",
    );
    fails(
        unsafe { unikv_pool_params_get_info(&good, ptr::null_mut()) },
        UNIKV_NULL_ARGUMENT,
        "info",
    );
    fails(
        unsafe { unikv_pool_params_get_layer(&good, 0, ptr::null_mut()) },
        UNIKV_NULL_ARGUMENT,
        "info",
    );
    // A caller's older, smaller info struct gets only its own fields.
    let mut info: unikv_pool_layer_info = unsafe { std::mem::zeroed() };
    info.struct_size = 24;
    info.swa_rows = 0xdead;
    ok(unsafe { unikv_pool_params_get_layer(&good, 2, &mut info) });
    assert_eq!(info.rows, 3 * 4 + 1 + 2);
    assert_eq!(info.swa_rows, 0xdead);
}

/// Decode stream outputs, poisoned.
struct Streams {
    indptr: [Vec<i32>; 3],
    indices: [Vec<i32>; 3],
}

fn streams(t: usize, win: usize, width: usize, topk: usize) -> Streams {
    Streams {
        indptr: [poisoned(t + 1), poisoned(t + 1), poisoned(t + 1)],
        indices: [
            poisoned(t * win),
            poisoned(t * (win + width)),
            poisoned(t * (win + topk)),
        ],
    }
}

/// `present[k]`: whether stream k (SWA, HCA, CSA) is passed.
fn decode_args(
    out: &Streams,
    present: [bool; 3],
    inputs: &[Vec<i32>; 4],
) -> unikv_decode_streams_args {
    let t = inputs[0].len();
    let pick = |k: usize, v: &Vec<i32>| if present[k] { vec1(v) } else { absent() };
    unikv_decode_streams_args {
        struct_size: std::mem::size_of::<unikv_decode_streams_args>(),
        batch_id: vec1(&inputs[0]),
        req_slots: vec1(&inputs[1]),
        positions: vec1(&inputs[2]),
        c128_page_indices: tensor(&inputs[3], &[t, 2]),
        swa_indptr: pick(0, &out.indptr[0]),
        swa_indices: pick(0, &out.indices[0]),
        hca_indptr: pick(1, &out.indptr[1]),
        hca_indices: pick(1, &out.indices[1]),
        csa_indptr: pick(2, &out.indptr[2]),
        csa_indices: pick(2, &out.indices[2]),
        num_tokens: t as u32,
        csa_topk: 4,
    }
}

#[test]
fn decode_streams_for_absent_layer_kinds_are_optional() {
    let ctx = Ctx::cpu(1);
    let inputs = [
        vec![0, 1, -1, 1],
        vec![2, 1],
        vec![300, 7, 5, 8],
        vec![0, 1, -1, -1, 0, 0, 0, 0],
    ];
    let (t, win) = (4, 8);
    for ratios in [vec![0], vec![0, 128], vec![0, 4], vec![4, 128, 0]] {
        let spec = PoolSpec {
            ratios: ratios.clone(),
            max_requests: 3,
            window: win as u32,
            spec_extra: 0,
            c128_blocks: 4,
        };
        let pool = Pool::new(&ctx, &spec);
        // Every stream passed: the reference.
        let full = streams(t, win, 2, 4);
        let args = decode_args(&full, [true; 3], &inputs);
        ok(unsafe { unikv_build_decode_streams(pool.0, &args, ptr::null_mut()) });
        let has = [true, ratios.contains(&128), ratios.contains(&4)];
        for (k, name) in [(1, "hca_indptr"), (2, "csa_indptr")] {
            let mut present = [true; 3];
            present[k] = false;
            let out = streams(t, win, 2, 4);
            let args = decode_args(&out, present, &inputs);
            let status = unsafe { unikv_build_decode_streams(pool.0, &args, ptr::null_mut()) };
            if has[k] {
                fails(status, UNIKV_NULL_ARGUMENT, name);
                assert!(last_error().contains("required"), "{}", last_error());
                assert!(out.indptr[0].iter().all(|&v| v == poisoned::<i32>(1)[0]));
                continue;
            }
            ok(status);
            for s in 0..3 {
                if s == k {
                    continue;
                }
                assert_eq!(out.indptr[s], full.indptr[s], "{ratios:?} stream {s}");
                assert_eq!(out.indices[s], full.indices[s], "{ratios:?} stream {s}");
            }
        }
        // Both compressed streams left out (and the CSA capacity with them).
        let out = streams(t, win, 2, 4);
        let mut args = decode_args(&out, [true, false, false], &inputs);
        args.csa_topk = u32::MAX;
        let status = unsafe { unikv_build_decode_streams(pool.0, &args, ptr::null_mut()) };
        if has[1] || has[2] {
            check(status, UNIKV_NULL_ARGUMENT);
        } else {
            ok(status);
            assert_eq!(out.indptr[0], full.indptr[0]);
            assert_eq!(out.indices[0], full.indices[0]);
        }
        // Only one tensor of a stream left out: that tensor is named.
        let out = streams(t, win, 2, 4);
        let mut args = decode_args(&out, [true; 3], &inputs);
        args.hca_indices = absent();
        fails(
            unsafe { unikv_build_decode_streams(pool.0, &args, ptr::null_mut()) },
            UNIKV_NULL_ARGUMENT,
            "hca_indices",
        );
        // The SWA stream is always required.
        let out = streams(t, win, 2, 4);
        let args = decode_args(&out, [false, true, true], &inputs);
        fails(
            unsafe { unikv_build_decode_streams(pool.0, &args, ptr::null_mut()) },
            UNIKV_NULL_ARGUMENT,
            "swa_indptr",
        );
    }
}

#[test]
fn capabilities_describe_this_build() {
    let caps = get_capabilities();
    let bit = |v: u32| 1u32 << v;
    assert_ne!(
        caps.backends & bit(unikv_backend::UNIKV_BACKEND_CPU as u32),
        0
    );
    assert_ne!(
        caps.backends & bit(unikv_backend::UNIKV_BACKEND_AUTO as u32),
        0
    );
    let gpu = cfg!(feature = "cuda") || cfg!(feature = "rocm");
    assert_eq!(
        caps.backends & bit(unikv_backend::UNIKV_BACKEND_CUDA as u32) != 0,
        cfg!(feature = "cuda")
    );
    assert_eq!(
        caps.backends & bit(unikv_backend::UNIKV_BACKEND_GPU as u32) != 0,
        gpu
    );
    let archs = unsafe { CStr::from_ptr(caps.gpu_archs) }.to_str().unwrap();
    if gpu {
        assert!(!archs.is_empty());
    } else {
        assert_eq!(archs, "");
        assert_eq!(caps.gpu_devices, 0);
    }
    // PTX rides along with every portable CUDA target (the default sm_80).
    let ptx =
        cfg!(feature = "cuda") && archs.split(';').any(|a| !a.is_empty() && !a.ends_with('a'));
    assert_eq!(caps.ptx_embedded, u32::from(ptx));
    for dtype in DTYPES {
        assert_ne!(caps.kv_dtypes & bit(dtype as u32), 0, "{dtype:?}");
    }
    assert_eq!(caps.kv_dtypes & bit(unikv_dtype::UNIKV_DTYPE_F32 as u32), 0);
    assert_eq!(
        caps.fp8_formats,
        bit(unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN as u32)
            | bit(unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ as u32)
    );
    assert_eq!(
        (caps.head_dim, caps.nope_dim, caps.rope_dim),
        (512, 448, 64)
    );
    assert_eq!(caps.max_heads, 128);
    assert_eq!(caps.max_tensor_dims, 4);
    assert_eq!(caps.page_tokens, 256);
    assert_eq!(caps.max_tokens, i32::MAX as u32);
    assert_eq!(caps.indexer_head_dim, 128);
    assert!(caps.max_indexer_topk >= 1024 && caps.max_indexer_heads >= 64);

    // The limits are the ones plan creation checks.
    let ctx = Ctx::cpu(1);
    let mut params = plan_params(caps.max_heads, unikv_dtype::UNIKV_DTYPE_BF16);
    let mut plan = ptr::null_mut();
    ok(unsafe { unikv_decode_plan_create(ctx.0, &params, &mut plan) });
    unsafe { unikv_decode_plan_destroy(plan) };
    params.num_heads = caps.max_heads + 1;
    fails(
        unsafe { unikv_decode_plan_create(ctx.0, &params, &mut plan) },
        UNIKV_INVALID_ARGUMENT,
        "params.num_heads",
    );

    // An older caller's smaller struct: only the fields it has are written.
    let mut old: unikv_capabilities = unsafe { std::mem::zeroed() };
    old.struct_size = 16;
    old.kv_dtypes = 0xdead;
    ok(unsafe { unikv_get_capabilities(&mut old) });
    assert_eq!(old.backends, caps.backends);
    assert_eq!(old.kv_dtypes, 0xdead);
    fails(
        unsafe { unikv_get_capabilities(ptr::null_mut()) },
        UNIKV_NULL_ARGUMENT,
        "caps",
    );
}

fn context_with(backend: u32) -> (unikv_status, Option<Ctx>) {
    let options = unikv_context_options {
        struct_size: std::mem::size_of::<unikv_context_options>(),
        backend,
        device: 0,
        cpu_threads: 1,
        validate: 0,
    };
    let mut ctx = ptr::null_mut();
    let status = unsafe { unikv_context_create(&options, &mut ctx) };
    (status, (!ctx.is_null()).then_some(Ctx(ctx)))
}

#[test]
fn a_required_gpu_fails_instead_of_falling_back() {
    if get_capabilities().gpu_devices > 0 {
        return; // A GPU machine: covered by the GPU tests.
    }
    let (status, ctx) = context_with(unikv_backend::UNIKV_BACKEND_GPU as u32);
    assert!(ctx.is_none());
    fails(status, UNIKV_BACKEND_UNAVAILABLE, "options.backend");
    assert!(
        last_error().contains("UNIKV_BACKEND_GPU"),
        "{}",
        last_error()
    );
    // AUTO keeps falling back to the CPU backend.
    let (status, ctx) = context_with(unikv_backend::UNIKV_BACKEND_AUTO as u32);
    ok(status);
    let mut info: unikv_context_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<unikv_context_info>();
    ok(unsafe { unikv_context_get_info(ctx.as_ref().unwrap().0, &mut info) });
    assert_eq!(info.backend, unikv_backend::UNIKV_BACKEND_CPU as u32);
    // The next value is still rejected.
    let (status, _) = context_with(5);
    fails(status, UNIKV_BAD_ENUM, "options.backend");
}

fn plan_params(num_heads: u32, kv_dtype: unikv_dtype) -> unikv_attention_plan_params {
    unikv_attention_plan_params {
        struct_size: std::mem::size_of::<unikv_attention_plan_params>(),
        max_tokens: 64,
        num_heads,
        head_dim: 512,
        q_dtype: unikv_dtype::UNIKV_DTYPE_BF16 as u32,
        kv_dtype: kv_dtype as u32,
        out_dtype: unikv_dtype::UNIKV_DTYPE_BF16 as u32,
        kv_layout: 0,
        reserved: 0,
    }
}

fn describe_decode(plan: *const unikv_decode_plan) -> String {
    let mut length = 0usize;
    ok(unsafe { unikv_decode_plan_describe(plan, ptr::null_mut(), 0, &mut length) });
    let mut buf = vec![0x7f as c_char; length + 1];
    ok(unsafe { unikv_decode_plan_describe(plan, buf.as_mut_ptr(), buf.len(), ptr::null_mut()) });
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(text.len(), length);
    text
}

#[test]
fn plans_report_their_launch_configuration() {
    let ctx = Ctx::cpu(2);
    for (heads, dtype) in [
        (64, unikv_dtype::UNIKV_DTYPE_BF16),
        (16, unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN),
        (5, unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ),
    ] {
        let params = plan_params(heads, dtype);
        let mut plan = ptr::null_mut();
        ok(unsafe { unikv_decode_plan_create(ctx.0, &params, &mut plan) });
        let mut info: unikv_plan_info = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of::<unikv_plan_info>();
        ok(unsafe { unikv_decode_plan_get_info(plan, &mut info) });
        assert_eq!(info.kind, unikv_plan_kind::UNIKV_PLAN_DECODE as u32);
        assert_eq!(info.backend, unikv_backend::UNIKV_BACKEND_CPU as u32);
        assert_eq!(
            info.kernel_family,
            unikv_kernel_family::UNIKV_KERNEL_CPU_REFERENCE as u32
        );
        assert_eq!((info.max_tokens, info.num_heads), (64, heads));
        assert_eq!(info.kv_dtype, dtype as u32);
        assert_eq!(info.head_block, 16);
        assert_eq!(info.head_blocks, heads.div_ceil(16));
        assert_eq!(
            (info.max_splits, info.cluster_merge, info.stages),
            (1, 0, 0)
        );
        assert_eq!((info.dependent_launch, info.raw_fp8_variant), (0, 0));
        let mut ws = 0usize;
        ok(unsafe { unikv_decode_plan_workspace_size(plan, &mut ws) });
        assert_eq!(info.workspace_bytes, ws as u64);

        let text = describe_decode(plan);
        assert!(
            text.starts_with("decode plan: cpu, cpu-reference kernel"),
            "{text}"
        );
        assert!(text.contains(&format!("({heads} heads)")), "{text}");
        assert!(!text.contains('\n'));
        // snprintf-like truncation.
        let mut small = [0x7f as c_char; 8];
        let mut length = 0usize;
        ok(unsafe { unikv_decode_plan_describe(plan, small.as_mut_ptr(), 8, &mut length) });
        assert_eq!(length, text.len());
        let cut = unsafe { CStr::from_ptr(small.as_ptr()) }.to_str().unwrap();
        assert_eq!(cut, &text[..7]);
        fails(
            unsafe { unikv_decode_plan_describe(plan, ptr::null_mut(), 8, &mut length) },
            UNIKV_NULL_ARGUMENT,
            "buf",
        );
        fails(
            unsafe { unikv_decode_plan_get_info(plan, ptr::null_mut()) },
            UNIKV_NULL_ARGUMENT,
            "info",
        );
        // A decode plan is not a prefill plan.
        fails(
            unsafe { unikv_prefill_plan_get_info(plan.cast(), &mut info) },
            UNIKV_INVALID_HANDLE,
            "plan",
        );
        unsafe { unikv_decode_plan_destroy(plan) };
        fails(
            unsafe { unikv_decode_plan_get_info(plan, &mut info) },
            UNIKV_INVALID_HANDLE,
            "plan",
        );
    }
    let params = plan_params(128, unikv_dtype::UNIKV_DTYPE_BF16);
    let mut plan = ptr::null_mut();
    ok(unsafe { unikv_prefill_plan_create(ctx.0, &params, &mut plan) });
    let mut info: unikv_plan_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<unikv_plan_info>();
    ok(unsafe { unikv_prefill_plan_get_info(plan, &mut info) });
    assert_eq!(info.kind, unikv_plan_kind::UNIKV_PLAN_PREFILL as u32);
    assert_eq!(info.head_blocks, 8);
    let mut buf = [0 as c_char; 256];
    ok(unsafe { unikv_prefill_plan_describe(plan, buf.as_mut_ptr(), buf.len(), ptr::null_mut()) });
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
    assert!(text.starts_with("prefill plan: cpu"), "{text}");
    unsafe { unikv_prefill_plan_destroy(plan) };
}

/// Messages the callback received, with the thread they came from (other
/// tests of this binary run concurrently and log too).
static LOG: Mutex<Vec<(std::thread::ThreadId, u32, String)>> = Mutex::new(Vec::new());

unsafe extern "C" fn record(user: *mut c_void, level: u32, message: *const c_char) {
    assert_eq!(user as usize, 0x1234);
    let text = CStr::from_ptr(message).to_string_lossy().into_owned();
    LOG.lock()
        .unwrap()
        .push((std::thread::current().id(), level, text));
}

fn mine() -> Vec<(u32, String)> {
    let me = std::thread::current().id();
    LOG.lock()
        .unwrap()
        .iter()
        .filter(|(t, _, _)| *t == me)
        .map(|(_, l, m)| (*l, m.clone()))
        .collect()
}

#[test]
fn the_log_callback_sees_plans_and_errors() {
    let ctx = Ctx::cpu(1);
    ok(unsafe { unikv_set_log_callback(Some(record), 0x1234 as *mut c_void) });
    let params = plan_params(32, unikv_dtype::UNIKV_DTYPE_BF16);
    let mut plan = ptr::null_mut();
    ok(unsafe { unikv_decode_plan_create(ctx.0, &params, &mut plan) });
    let described = describe_decode(plan);
    let mut bad = params;
    bad.head_dim = 256;
    let mut other = ptr::null_mut();
    let status = unsafe { unikv_decode_plan_create(ctx.0, &bad, &mut other) };
    check(status, UNIKV_INVALID_ARGUMENT);
    let message = last_error();
    ok(unsafe { unikv_set_log_callback(None, ptr::null_mut()) });
    // Nothing after the callback is removed.
    check(
        unsafe { unikv_decode_plan_create(ctx.0, &bad, &mut other) },
        UNIKV_INVALID_ARGUMENT,
    );
    unsafe { unikv_decode_plan_destroy(plan) };
    let got = mine();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0], (unikv_log_level::UNIKV_LOG_INFO as u32, described));
    assert_eq!(got[1].0, unikv_log_level::UNIKV_LOG_ERROR as u32);
    assert!(got[1].1.ends_with(&message), "{got:?}");
    assert!(got[1].1.contains("params.head_dim"));
}
