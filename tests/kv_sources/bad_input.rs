//! Every new argument class refused with its status and a message naming the
//! argument, and nothing written: the poisoned outputs (and the cache an
//! overlapping output would have hit) are unchanged.

use std::ptr;

use half::bf16;
use unikv::ffi::attention::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::status::unikv_status::*;

use crate::common::*;
use crate::layouts::*;
use crate::run::*;
use crate::D;

/// Runs `call` and asserts its failure and that the outputs kept the poison.
#[track_caller]
fn refused(
    batch: &Batch,
    what: &str,
    want: unikv_status,
    names: &str,
    call: impl FnOnce() -> unikv_status,
) {
    batch.poison();
    let before = batch.outputs();
    let status = call();
    assert_eq!(status, want, "{what}: last error {}", last_error());
    let msg = last_error();
    assert!(
        msg.contains(names),
        "{what}: message {msg:?} does not name {names:?}"
    );
    assert_same_bits(what, &before, &batch.outputs());
}

type Edit = Box<dyn Fn(&mut unikv_decode_args)>;

#[test]
fn bad_key_sources_are_refused_before_any_write() {
    let (mut rng, _seed) = seeded("bad_key_sources_are_refused_before_any_write");
    let ctx = Ctx::cpu(2);
    let (tokens, heads) = (3, 4);
    let flashmla = flashmla_cache(&ctx, &mut rng, Fmt::Fn, 64, 3);
    let scaled = scaled_rows(&ctx, &mut rng, Fmt::Fn, 100);
    let batch = Batch::new(&ctx, &mut rng, tokens, heads);
    let pool = bf16_pool(&ctx, &mut rng, &[]);
    let lists = random_lists(&mut rng, tokens, 100, &[1, 9]);
    let flash = Stream {
        kv: flashmla.desc(),
        lists: lists.clone(),
    };
    let rows = Stream {
        kv: scaled.desc(),
        lists: lists.clone(),
    };
    let flash_plan = Plan::for_cache(&ctx, false, tokens, heads, Some(&flashmla));
    let scaled_plan = Plan::for_cache(&ctx, false, tokens, heads, Some(&scaled));
    let bpp = bytes_per_page(64) as i64;
    let data = flashmla.desc().data;
    let fnuz = Fmt::Fnuz.dtype();
    let scales = scaled.desc().scales;
    let extra = scaled.desc();
    let extra_lists = StreamBufs::new(&ctx, &lists);
    let (ei, ep) = (extra_lists.indices(), extra_lists.indptr());
    // Index buffers naming rows past the sources (owned here, so none leaks).
    let (mut past_cache_idx, mut negative_idx, mut past_rows_idx) =
        (vec![192i32; 256], vec![-1i32; 256], vec![100i32; 256]);
    let past_cache = past_cache_idx.as_mut_ptr();
    let negative = negative_idx.as_mut_ptr();
    let past_rows = past_rows_idx.as_mut_ptr();

    // (what, plan, source, status, name, edit)
    let cases: Vec<(&str, &Plan, &Stream, unikv_status, &str, Edit)> = vec![
        (
            "unknown layout",
            &flash_plan,
            &flash,
            UNIKV_BAD_ENUM,
            "kv.layout",
            Box::new(|a| a.kv.layout = 9),
        ),
        (
            "reserved",
            &flash_plan,
            &flash,
            UNIKV_INVALID_ARGUMENT,
            "kv.reserved",
            Box::new(|a| a.kv.reserved = 1),
        ),
        (
            "page size 3",
            &flash_plan,
            &flash,
            UNIKV_INVALID_ARGUMENT,
            "kv.page_size",
            Box::new(|a| a.kv.page_size = 3),
        ),
        (
            "page size 256 over 64-token pages",
            &flash_plan,
            &flash,
            UNIKV_BAD_SHAPE,
            "kv.data",
            Box::new(|a| a.kv.page_size = 256),
        ),
        (
            "fnuz codes, fn plan",
            &flash_plan,
            &flash,
            UNIKV_BAD_DTYPE,
            "kv.fp8_dtype",
            Box::new(move |a| a.kv.fp8_dtype = fnuz),
        ),
        (
            "bf16 codes",
            &flash_plan,
            &flash,
            UNIKV_BAD_DTYPE,
            "kv.fp8_dtype",
            Box::new(|a| a.kv.fp8_dtype = 1),
        ),
        (
            "unknown dtype",
            &flash_plan,
            &flash,
            UNIKV_BAD_ENUM,
            "kv.fp8_dtype",
            Box::new(|a| a.kv.fp8_dtype = 99),
        ),
        (
            "NULL cache",
            &flash_plan,
            &flash,
            UNIKV_NULL_ARGUMENT,
            "kv.data",
            Box::new(|a| a.kv.data.data = ptr::null_mut()),
        ),
        (
            "f32 cache",
            &flash_plan,
            &flash,
            UNIKV_BAD_DTYPE,
            "kv.data",
            Box::new(|a| a.kv.data.dtype = 3),
        ),
        (
            "short pages",
            &flash_plan,
            &flash,
            UNIKV_BAD_SHAPE,
            "kv.data",
            Box::new(move |a| a.kv.data.shape[1] = bpp - 576),
        ),
        (
            "no pages",
            &flash_plan,
            &flash,
            UNIKV_BAD_SHAPE,
            "kv.data",
            Box::new(|a| a.kv.data.shape[0] = 0),
        ),
        (
            "page stride",
            &flash_plan,
            &flash,
            UNIKV_BAD_STRIDE,
            "kv.data",
            Box::new(move |a| {
                a.kv.data.shape[0] = 1;
                a.kv.data.strides[0] = 2 * bpp;
            }),
        ),
        (
            "unaligned cache",
            &flash_plan,
            &flash,
            UNIKV_BAD_ALIGNMENT,
            "kv.data",
            Box::new(move |a| {
                a.kv.data.data = unsafe { data.data.cast::<u8>().add(8) }.cast();
                a.kv.data.shape[0] = 1;
            }),
        ),
        (
            "scales with a FlashMLA cache",
            &flash_plan,
            &flash,
            UNIKV_INVALID_ARGUMENT,
            "kv.scales",
            Box::new(move |a| a.kv.scales = scales),
        ),
        (
            "scaled rows, FlashMLA plan",
            &flash_plan,
            &rows,
            UNIKV_INVALID_ARGUMENT,
            "kv.layout",
            Box::new(|_| {}),
        ),
        (
            "pool layer, FlashMLA plan",
            &flash_plan,
            &flash,
            UNIKV_INVALID_ARGUMENT,
            "kv.layout",
            Box::new(|a| a.kv = Default::default()),
        ),
        (
            "pool fields set",
            &flash_plan,
            &flash,
            UNIKV_INVALID_ARGUMENT,
            "kv.fp8_dtype",
            Box::new(|a| a.kv.layout = 0),
        ),
        (
            "token id past the pages",
            &flash_plan,
            &flash,
            UNIKV_OUT_OF_RANGE,
            "indices[",
            Box::new(move |a| a.indices.data = past_cache.cast()),
        ),
        (
            "-1 in decode",
            &flash_plan,
            &flash,
            UNIKV_OUT_OF_RANGE,
            "indices[",
            Box::new(move |a| a.indices.data = negative.cast()),
        ),
        (
            "extra indices without indptr",
            &scaled_plan,
            &rows,
            UNIKV_NULL_ARGUMENT,
            "extra_indptr",
            Box::new(move |a| {
                (a.extra_kv, a.extra_indices) = (extra, ei);
            }),
        ),
        (
            "extra indptr without indices",
            &flash_plan,
            &flash,
            UNIKV_INVALID_ARGUMENT,
            "extra_indptr",
            Box::new(move |a| a.extra_indptr = ep),
        ),
        (
            "extra cache without indices",
            &flash_plan,
            &flash,
            UNIKV_INVALID_ARGUMENT,
            "extra_kv.layout",
            Box::new(move |a| a.extra_kv = extra),
        ),
        (
            "extra scaled rows, FlashMLA plan",
            &flash_plan,
            &flash,
            UNIKV_INVALID_ARGUMENT,
            "extra_kv.layout",
            Box::new(move |a| {
                (a.extra_kv, a.extra_indices, a.extra_indptr) = (extra, ei, ep);
            }),
        ),
        (
            "extra row past the rows",
            &scaled_plan,
            &rows,
            UNIKV_OUT_OF_RANGE,
            "extra_indices[",
            Box::new(move |a| {
                (a.extra_kv, a.extra_indices, a.extra_indptr) = (extra, ei, ep);
                a.extra_indices.data = past_rows.cast();
            }),
        ),
        (
            "scaled: no scales",
            &scaled_plan,
            &rows,
            UNIKV_NULL_ARGUMENT,
            "kv.scales",
            Box::new(|a| a.kv.scales = absent()),
        ),
        (
            "scaled: scale rows",
            &scaled_plan,
            &rows,
            UNIKV_BAD_SHAPE,
            "kv.scales",
            Box::new(|a| a.kv.scales.shape[0] = 99),
        ),
        (
            "scaled: 7 scales",
            &scaled_plan,
            &rows,
            UNIKV_BAD_SHAPE,
            "kv.scales",
            Box::new(|a| a.kv.scales.shape[1] = 7),
        ),
        (
            "scaled: scale stride",
            &scaled_plan,
            &rows,
            UNIKV_BAD_ALIGNMENT,
            "kv.scales",
            Box::new(|a| {
                a.kv.scales.shape[0] = 1;
                a.kv.data.shape[0] = 1;
                a.kv.scales.strides[0] = 9;
            }),
        ),
        (
            "scaled: 448 codes",
            &scaled_plan,
            &rows,
            UNIKV_BAD_SHAPE,
            "kv.data",
            Box::new(|a| a.kv.data.shape[1] = 448),
        ),
        (
            "scaled: page size",
            &scaled_plan,
            &rows,
            UNIKV_INVALID_ARGUMENT,
            "kv.page_size",
            Box::new(|a| a.kv.page_size = 64),
        ),
        (
            "scaled: f32 codes",
            &scaled_plan,
            &rows,
            UNIKV_BAD_DTYPE,
            "kv.data",
            Box::new(|a| a.kv.data.dtype = 3),
        ),
    ];
    for (what, plan, source, status, name, edit) in &cases {
        refused(&batch, what, *status, name, || {
            batch.decode(plan, ptr::null(), 0, source, None, edit.as_ref())
        });
    }
    // A pool layer needs the pool.
    let pool_plan = Plan::for_cache(&ctx, false, tokens, heads, None);
    let layer = Stream {
        kv: Default::default(),
        lists: lists.clone(),
    };
    refused(
        &batch,
        "pool layer, pool NULL",
        UNIKV_NULL_ARGUMENT,
        "pool",
        || batch.decode(&pool_plan, ptr::null(), 1, &layer, None, &|_| {}),
    );
    // Sanity: the unedited calls succeed.
    ok(batch.decode(&flash_plan, ptr::null(), 0, &flash, None, &|_| {}));
    ok(batch.decode(&scaled_plan, pool.0, 0, &rows, None, &|_| {}));

    // An output inside the cache: refused, and the cache is unchanged.
    let cache_before: Vec<u8> = flashmla.data.read();
    refused(
        &batch,
        "out inside the cache",
        UNIKV_OVERLAPPING_BUFFERS,
        "kv.data",
        || {
            batch.decode(&flash_plan, ptr::null(), 0, &flash, None, &|a| {
                a.out.data = data.data
            })
        },
    );
    assert_eq!(cache_before, flashmla.data.read(), "the cache was written");
}

#[test]
fn bad_plan_parameters_and_prefill_sources_are_refused() {
    let (mut rng, _seed) = seeded("bad_plan_parameters_and_prefill_sources_are_refused");
    let ctx = Ctx::cpu(2);
    let fmt = Fmt::Fn;
    let flash = unikv_kv_layout::UNIKV_KV_LAYOUT_FLASHMLA;
    type ParamsEdit = Box<dyn Fn(&mut unikv_attention_plan_params)>;
    let cases: Vec<(&str, ParamsEdit, unikv_status, &str)> = vec![
        (
            "unknown layout",
            Box::new(|p| p.kv_layout = 3),
            UNIKV_BAD_ENUM,
            "params.kv_layout",
        ),
        (
            "reserved",
            Box::new(|p| p.reserved = 1),
            UNIKV_INVALID_ARGUMENT,
            "params.reserved",
        ),
        (
            "bf16 FlashMLA",
            Box::new(|p| p.kv_dtype = 1),
            UNIKV_BAD_DTYPE,
            "params.kv_dtype",
        ),
        (
            "bf16 scaled rows",
            Box::new(|p| {
                p.kv_dtype = 1;
                p.kv_layout = unikv_kv_layout::UNIKV_KV_LAYOUT_SCALED_FP8 as u32;
            }),
            UNIKV_BAD_DTYPE,
            "params.kv_dtype",
        ),
    ];
    for (what, edit, status, name) in cases {
        let mut p = plan_params(4, 4, fmt.dtype(), flash);
        edit(&mut p);
        let mut plan = ptr::null_mut();
        let status_got = unsafe { unikv_decode_plan_create(ctx.0, &p, &mut plan) };
        assert_eq!(status_got, status, "{what}: {}", last_error());
        assert!(last_error().contains(name), "{what}: {}", last_error());
        assert!(plan.is_null(), "{what}: a plan was returned");
    }

    let (tokens, heads) = (2, 3);
    let cache = flashmla_cache(&ctx, &mut rng, fmt, 2, 30);
    let batch = Batch::new(&ctx, &mut rng, tokens, heads);
    let plan = Plan::for_cache(&ctx, true, tokens, heads, Some(&cache));
    let prefix = Stream {
        kv: cache.desc(),
        lists: vec![vec![0, -1, 59], vec![]],
    };
    let ext_rows = Dev::upload(&ctx, &random_bf16(&mut rng, 8 * D));
    let extend_kv = ext_rows.t::<bf16>(&[8, D]);
    let bf16_ext = Stream {
        kv: Default::default(),
        lists: vec![vec![7, -1], vec![0]],
    };
    let cache_ext = Stream {
        kv: cache.desc(),
        lists: vec![vec![-1], vec![3]],
    };
    // The valid calls: -1 is skipped in both streams.
    ok(batch.prefill(
        &plan,
        ptr::null(),
        0,
        &prefix,
        &bf16_ext,
        extend_kv,
        &|_| {},
    ));
    ok(batch.prefill(
        &plan,
        ptr::null(),
        0,
        &prefix,
        &cache_ext,
        absent(),
        &|_| {},
    ));
    refused(
        &batch,
        "extend_kv and extend_cache",
        UNIKV_INVALID_ARGUMENT,
        "extend_kv",
        || {
            batch.prefill(
                &plan,
                ptr::null(),
                0,
                &prefix,
                &cache_ext,
                extend_kv,
                &|_| {},
            )
        },
    );
    refused(
        &batch,
        "extend layout",
        UNIKV_BAD_ENUM,
        "extend_cache.layout",
        || {
            batch.prefill(&plan, ptr::null(), 0, &prefix, &cache_ext, absent(), &|a| {
                a.extend_cache.layout = 7
            })
        },
    );
    let past = Stream {
        kv: cache.desc(),
        lists: vec![vec![60], vec![]],
    };
    refused(
        &batch,
        "extend token id past the pages",
        UNIKV_OUT_OF_RANGE,
        "extend_indices[",
        || batch.prefill(&plan, ptr::null(), 0, &prefix, &past, absent(), &|_| {}),
    );
    refused(
        &batch,
        "prefix token id past the pages",
        UNIKV_OUT_OF_RANGE,
        "indices[",
        || batch.prefill(&plan, ptr::null(), 0, &past, &cache_ext, absent(), &|_| {}),
    );
    refused(
        &batch,
        "bf16 extend without extend_kv",
        UNIKV_NULL_ARGUMENT,
        "extend_kv",
        || batch.prefill(&plan, ptr::null(), 0, &prefix, &bf16_ext, absent(), &|_| {}),
    );
}
