//! Benchmark rows of the KV compressor (issue 25): decode at T = 1..64 tokens
//! (one per request, every token closing a group: the worst case, each pools
//! a whole window), decode of 64 tokens of which one closes a group ("dec1":
//! a decode step's usual call, a request closing a group every 4 or 128
//! tokens) and a prefill of 8192 tokens of one request from position 0, for
//! each compressor type (ratio 4 attention, ratio 4 indexer, ratio 128
//! attention). Bytes count what must move once per call: the raw rows read
//! (the call's `kv_score` rows and, for decode, the window's ring rows), the
//! ring rows written, the stored rows (pool row 1024 bytes, indexer key 132),
//! and `ape` once. Raw rows are f32.

use rand::Rng;
use unikv::ffi::compressor::{unikv_compress_args, unikv_compress_decode, unikv_compress_prefill};
use unikv::ffi::context::unikv_context;
use unikv::ffi::pool::{unikv_pool_create, unikv_pool_destroy, unikv_pool_params};

use crate::{ok, per_call_us, Ceilings, Dev, Row, ABSENT};

const DIM: usize = 512;
const INDEXER_DIM: usize = 128;
const MAX_POS: usize = 16384;
const PAGE: usize = 64;
const INDEXER_PAGE_BYTES: usize = 132 * PAGE;

/// (name, layer, compressor, ratio, channels)
const KINDS: [(&str, u32, u32, usize, usize); 3] = [
    ("compress_c4", 0, 0, 4, DIM),
    ("compress_c4_idx", 0, 1, 4, INDEXER_DIM),
    ("compress_c128", 1, 0, 128, DIM),
];

pub fn bench_compressor(
    ctx: *mut unikv_context,
    stream: &unikv::backend::gpu::devtools::OwnedStream,
    c: &Ceilings,
    rng: &mut rand::rngs::ThreadRng,
) {
    let ratios = [4u32, 128];
    let params = unikv_pool_params {
        struct_size: std::mem::size_of::<unikv_pool_params>(),
        compress_ratios: ratios.as_ptr(),
        layer_buffers: std::ptr::null(),
        num_layers: 2,
        max_requests: 64,
        window: 128,
        spec_extra: 0,
        c128_blocks: 512,
        kv_dtype: 1,
        rope_buffers: std::ptr::null(),
        compressor_state: 1,
        c4_state_ring: 8,
        c128_state_ring: 128,
        reserved: 0,
        state_buffers: std::ptr::null(),
    };
    let mut pool = std::ptr::null_mut();
    ok(
        unsafe { unikv_pool_create(ctx, &params, &mut pool) },
        "pool",
    );
    let table: Vec<f32> = (0..MAX_POS * 64)
        .map(|i| if i % 2 == 0 { 1.0 } else { 0.0 })
        .collect();
    let table = Dev::upload(ctx, &table);
    let cache = Dev::new(ctx, 40 * INDEXER_PAGE_BYTES);
    let slots: Vec<i32> = (1..=64).collect();
    let slots = Dev::upload(ctx, &slots);
    for (name, layer, compressor, ratio, dim) in KINDS {
        let values = if ratio == 4 { 2 * dim } else { dim };
        let row = 2 * values;
        let window = if ratio == 4 { 8 } else { ratio };
        let ape: Vec<f32> = (0..ratio * values)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let ape = Dev::upload(ctx, &ape);
        let norm: Vec<f32> = (0..dim).map(|_| rng.random_range(0.5..1.5)).collect();
        let norm = Dev::upload(ctx, &norm);
        let (cache_t, cache_dtype, page_size, out_bytes) = if compressor == 1 {
            (
                cache.t(6, 1, &[40, INDEXER_PAGE_BYTES]),
                7,
                PAGE as u32,
                132,
            )
        } else {
            (ABSENT, 0, 0, 1024)
        };
        let args = |kv: &Dev, batch: &Dev, pos: &Dev, loc: &Dev, t: usize| unikv_compress_args {
            struct_size: std::mem::size_of::<unikv_compress_args>(),
            kv_score: kv.t(3, 4, &[t, row]),
            ape: ape.t(3, 4, &[ratio, values]),
            norm_weight: norm.t(3, 4, &[dim]),
            rope_table: table.t(3, 4, &[MAX_POS, 64]),
            batch_id: batch.i32s(&[t]),
            req_slots: slots.i32s(&[64]),
            positions: pos.i32s(&[t]),
            loc: loc.i32s(&[t]),
            cache: cache_t,
            layer,
            compressor,
            num_tokens: t as u32,
            cache_dtype,
            page_size,
            eps: 1e-6,
        };
        for (t, closing) in [(1usize, 1usize), (8, 8), (32, 32), (64, 64), (64, 1)] {
            // Request b in slot b + 1 at the last position of its group 4 + b
            // (b < closing) or the one before it.
            let kv: Vec<f32> = (0..t * row).map(|_| rng.random_range(-2.0..2.0)).collect();
            let kv = Dev::upload(ctx, &kv);
            let batch = Dev::upload(ctx, &(0..t as i32).collect::<Vec<_>>());
            let pos: Vec<i32> = (0..t)
                .map(|b| ((5 + b) * ratio - if b < closing { 1 } else { 2 }) as i32)
                .collect();
            let pos = Dev::upload(ctx, &pos);
            let loc = Dev::upload(ctx, &(0..t as i32).collect::<Vec<_>>());
            let a = args(&kv, &batch, &pos, &loc, t);
            let us = per_call_us(stream, 20, |_, s| {
                ok(unsafe { unikv_compress_decode(pool, &a, s) }, name);
            });
            let bytes =
                closing * ((window - 1) * row * 4 + out_bytes) + t * 2 * row * 4 + ape.bytes;
            Row {
                op: format!("{name} dec{}", if closing < t { "1" } else { "" }),
                t,
                h: 0,
                keys: 0,
                us,
                bytes: bytes as f64,
                flops: 0.0,
            }
            .print(c);
        }
        // Prefill: 8192 tokens of request 0 from position 0.
        let t = 8192;
        let kv: Vec<f32> = (0..t * row).map(|_| rng.random_range(-2.0..2.0)).collect();
        let kv = Dev::upload(ctx, &kv);
        let batch = Dev::upload(ctx, &vec![0i32; t]);
        let pos = Dev::upload(ctx, &(0..t as i32).collect::<Vec<_>>());
        let groups = t / ratio;
        // Group n to location n (the indexer cache holds 2560 keys: wrap).
        let loc: Vec<i32> = (0..t)
            .map(|p| {
                if (p + 1) % ratio == 0 {
                    (((p + 1) / ratio - 1) % (40 * PAGE)) as i32
                } else {
                    -1
                }
            })
            .collect();
        let loc = Dev::upload(ctx, &loc);
        let a = args(&kv, &batch, &pos, &loc, t);
        let us = per_call_us(stream, 4, |_, s| {
            ok(unsafe { unikv_compress_prefill(pool, &a, s) }, name);
        });
        let ring = if ratio == 4 { 8 } else { 128 };
        let bytes = t * row * 4 + ring * row * 4 + groups * out_bytes + ape.bytes;
        Row {
            op: format!("{name} pre"),
            t,
            h: 0,
            keys: 0,
            us,
            bytes: bytes as f64,
            flops: 0.0,
        }
        .print(c);
    }
    unsafe { unikv_pool_destroy(pool) };
}
