//! Benchmark rows "layer" (issue 24): one DeepSeek-V4-Flash attention layer's
//! whole decode chain, captured as one CUDA graph and replayed, in µs per
//! layer. The calls and their order are docs/serving-step.md §2's; the
//! stream and CSA-tail arguments are examples/serving_step.cpp's, the others
//! follow include/unikv.h:
//!
//! - CSA (ratio 4): `unikv_prepare_qkv_indexer_q` (Q/KV norm + RoPE, the KV
//!   row into its ring row, and the indexer queries, in one call) ->
//!   `unikv_indexer_topk_fill_csa` (the top-k and the layer's CSA tail in one
//!   call) -> `unikv_sparse_decode` over the CSA stream with the inverse-RoPE
//!   epilogue; the budget table also times the chain with each fused pair as
//!   its two calls (`unikv_prepare_qkv`, `unikv_indexer_prepare_q`,
//!   `unikv_indexer_topk`, `unikv_fill_csa_tail`);
//! - HCA (ratio 128): `unikv_prepare_qkv` -> `unikv_sparse_decode` over the
//!   HCA stream with the epilogue (the stream is built once per step);
//! - dense (for the step estimate): `unikv_prepare_qkv` ->
//!   `unikv_sparse_decode` over the SWA stream with the epilogue.
//!
//! The compressors (`unikv_compress_decode`, issue 25's rows) are not in the
//! chain: issue 24 names the calls above.
//!
//! Shapes: V4-Flash at TP1 (spec/unified_kv.md §6.1): 64 query heads, 64
//! indexer heads of 128 dims, top-k 512, window 128; T requests with one token
//! each, at the last position of an 8k or a 128k-token context. One graph runs
//! the chain over many layers of one pool, each with its own pool rows,
//! indexer cache and inputs, as a model's layers are: at least 3x L2 of data,
//! so each layer starts cold in L2 as it does after the previous layer's MoE
//! weights.
//!
//! Bytes count what a chain must move at least: the Q and KV inputs read, the
//! KV row stored, the attended rows read with their 4-byte indices (as the
//! decode rows count them), the output written; CSA adds the indexer queries
//! and weights, every visible indexer key (132 bytes) and the page-table row.
//! The intermediates (prepared Q, indexer codes, logits, top-k table) are left
//! out: a fused chain keeps them on chip. FLOPs: the attention (4 * 512 per
//! head and key) and the indexer scores (2 * 128 per indexer head and key).

use std::os::raw::c_void;

use half::bf16;
use rand::seq::SliceRandom;
use unikv::backend::gpu::devtools::OwnedStream;
use unikv::ffi::attention::{unikv_decode_args, unikv_decode_plan_destroy, unikv_sparse_decode};
use unikv::ffi::context::unikv_context;
use unikv::ffi::index::{
    unikv_build_decode_streams, unikv_csa_tail_args, unikv_decode_streams_args, unikv_fill_csa_tail,
};
use unikv::ffi::indexer::{
    unikv_csa_stream, unikv_indexer_prepare_q, unikv_indexer_prepare_q_args, unikv_indexer_topk,
    unikv_indexer_topk_args, unikv_indexer_topk_fill_csa,
};
use unikv::ffi::pool::{unikv_pool_create, unikv_pool_destroy, unikv_pool_params};
use unikv::ffi::prepare::{unikv_prepare_qkv, unikv_prepare_qkv_args, unikv_prepare_qkv_indexer_q};
use unikv::ffi::types::unikv_tensor;

use crate::indexer::random_pages;
use crate::{
    bytes_of, decode_plan, fill_fp8_layer, fill_repeating, fp8_rows, layer_info, ok, per_call_us,
    random_bf16, rope_table, Ceilings, Dev, Row, ABSENT, L2_BYTES,
};

const HEADS: usize = 64;
const INDEXER_HEADS: usize = 64;
const INDEXER_DIM: usize = 128;
const TOPK: usize = 512;
const WINDOW: usize = 128;
/// Tokens per page of the page tables: 64 CSA keys (one indexer cache page),
/// 2 HCA rows (docs/pool.md §5).
const PAGE_TOKENS: usize = 256;
const INDEXER_PAGE_BYTES: usize = 132 * 64;
const CONTEXTS: [usize; 2] = [8 << 10, 128 << 10];
/// RoPE table rows: every position benchmarked.
const MAX_POS: usize = 128 << 10;
/// Most pages a layer's requests hold (T = 4 at 128k): the random indexer
/// pages drawn once, so no key repeats within a layer.
const MAX_PAGES: usize = 4 * (128 << 10) / PAGE_TOKENS;
/// Layers one graph runs per kind, at most (small chains need many for 3x L2).
const MAX_LAYERS: usize = 256;
/// (dense, CSA, HCA) layers of DeepSeek-V4-Flash: 43 layers (spec/unified_kv.md
/// §6.1), layers 0 and 1 dense, then ratio 4 on even and ratio 128 on odd
/// layers (the layer table of the deepseek-ai/DeepSeek-V4-Flash model card on
/// Hugging Face as antirez/ds4's MODEL_CARD.md quotes it; spec/ has no mix).
const FLASH_LAYERS: (usize, usize, usize) = (2, 21, 20);
/// The 61-layer step issue 24 asks for, in the same pattern (an assumption:
/// V4-Flash has 43 layers).
const LAYERS_61: (usize, usize, usize) = (2, 30, 29);
const CSA_TARGET_US: f64 = 15.0;
const HCA_TARGET_US: f64 = 8.0;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Dense,
    Csa,
    Hca,
}

impl Kind {
    fn ratio(self) -> u32 {
        match self {
            Kind::Dense => 0,
            Kind::Csa => 4,
            Kind::Hca => 128,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Dense => "dense",
            Kind::Csa => "csa",
            Kind::Hca => "hca",
        }
    }

    /// Keys a token at the end of `context` attends: its window, then its
    /// top-k or every compressed row.
    fn keys(self, context: usize) -> usize {
        WINDOW
            + match self {
                Kind::Dense => 0,
                Kind::Csa => TOPK.min(context / 4),
                Kind::Hca => context / 128,
            }
    }

    /// Bytes one layer's chain must move (module doc).
    fn bytes(self, t: usize, context: usize, row_bytes: usize) -> usize {
        let attention = HEADS * 1024 * 2 + 1024 + row_bytes + self.keys(context) * (row_bytes + 4);
        let indexer = match self {
            Kind::Csa => {
                INDEXER_HEADS * (INDEXER_DIM + 1) * 2
                    + context / 4 * 132
                    + context / PAGE_TOKENS * 4
            }
            _ => 0,
        };
        t * (attention + indexer)
    }

    fn flops(self, t: usize, context: usize) -> f64 {
        let attention = 4 * HEADS * self.keys(context) * 512;
        let indexer = match self {
            Kind::Csa => 2 * INDEXER_HEADS * INDEXER_DIM * context / 4,
            _ => 0,
        };
        (t * (attention + indexer)) as f64
    }
}

/// What every shape shares: host data drawn once and repeated over the
/// device buffers, and the RoPE table.
struct Shared<'a> {
    ctx: *mut unikv_context,
    stream: &'a OwnedStream,
    c: &'a Ceilings,
    bf16: Vec<bf16>,
    nope: Vec<u8>,
    rope: Vec<bf16>,
    index_pages: Vec<u8>,
    table: Dev,
}

/// µs of one decode step's parts at one shape.
struct Step {
    pool: &'static str,
    t: usize,
    context: usize,
    dense: f64,
    csa: f64,
    hca: f64,
    streams: f64,
    budget: Vec<BudgetRow>,
}

/// One call of a layer's chain: its name and its launch for layer `i` of the
/// kind's layers.
type Call<'a> = (&'static str, &'a dyn Fn(usize, *mut c_void));

/// A chain call's time alone, the chain's time up to and including it, and
/// what the call adds to the chain before it.
struct BudgetRow {
    layer: &'static str,
    call: &'static str,
    alone: f64,
    prefix: f64,
    marginal: f64,
}

impl Step {
    fn estimate(&self, (dense, csa, hca): (usize, usize, usize)) -> f64 {
        dense as f64 * self.dense + csa as f64 * self.csa + hca as f64 * self.hca + self.streams
    }
}

pub fn bench_layer_steps(
    ctx: *mut unikv_context,
    stream: &OwnedStream,
    c: &Ceilings,
    rng: &mut rand::rngs::ThreadRng,
) {
    // DeepSeek-V4's compressed-layer base; the values do not change the time.
    let table = rope_table(40_000.0, MAX_POS);
    let (nope, rope) = fp8_rows(rng, 8192);
    let shared = Shared {
        ctx,
        stream,
        c,
        bf16: random_bf16(rng, 4 << 20),
        nope,
        rope,
        index_pages: random_pages(rng, MAX_PAGES),
        table: Dev::upload(ctx, &table),
    };
    let mut steps = Vec::new();
    for (kv_dtype, pool) in [(1u32, "bf16"), (7, "fp8")] {
        for t in [1usize, 4] {
            for context in CONTEXTS {
                steps.push(bench_step(&shared, rng, kv_dtype, pool, t, context));
            }
        }
    }
    println!(
        "\nDecode step estimated from the layer rows: V4-Flash = {} dense + {} CSA + {} HCA \
         layers, 61 layers = {} + {} + {} (same pattern), each plus the streams once",
        FLASH_LAYERS.0, FLASH_LAYERS.1, FLASH_LAYERS.2, LAYERS_61.0, LAYERS_61.1, LAYERS_61.2
    );
    println!(
        "Issue 24 targets at 8k: CSA layer <= {CSA_TARGET_US} us, HCA layer <= {HCA_TARGET_US} us"
    );
    println!("| pool |     T | context | dense us | CSA us | HCA us | streams us | V4-Flash step us | 61-layer step us | targets at 8k          |");
    println!("|------|-------|---------|----------|--------|--------|------------|------------------|------------------|------------------------|");
    for s in &steps {
        let verdict = |us: f64, target: f64| if us <= target { "met" } else { "missed" };
        let targets = if s.context == CONTEXTS[0] {
            format!(
                "CSA {}, HCA {}",
                verdict(s.csa, CSA_TARGET_US),
                verdict(s.hca, HCA_TARGET_US)
            )
        } else {
            "-".into()
        };
        println!(
            "| {:<4} | {:>5} | {:>6}k | {:>8.2} | {:>6.2} | {:>6.2} | {:>10.2} | {:>16.1} | {:>16.1} | {:<22} |",
            s.pool,
            s.t,
            s.context >> 10,
            s.dense,
            s.csa,
            s.hca,
            s.streams,
            s.estimate(FLASH_LAYERS),
            s.estimate(LAYERS_61),
            targets
        );
    }
    println!(
        "\nLayer chains at 8k, call by call: each call alone in its own graph, the chain up to \
         it, and its marginal cost in the chain (the difference of two prefixes)"
    );
    println!(
        "| pool |     T | layer            | call                  | alone us | chain to it us | marginal us |"
    );
    println!(
        "|------|-------|------------------|-----------------------|----------|----------------|-------------|"
    );
    for s in &steps {
        for b in &s.budget {
            println!(
                "| {:<4} | {:>5} | {:<16} | {:<21} | {:>8.2} | {:>14.2} | {:>11.2} |",
                s.pool, s.t, b.layer, b.call, b.alone, b.prefix, b.marginal
            );
        }
    }
}

/// Block `i` of a buffer holding consecutive `shape` tensors.
fn block(d: &Dev, dtype: u32, elem: usize, shape: &[usize], i: usize) -> unikv_tensor {
    let mut tensor = d.t(dtype, elem, shape);
    let bytes = shape.iter().product::<usize>() * elem;
    assert!((i + 1) * bytes <= d.bytes);
    tensor.data = unsafe { (d.ptr as *mut u8).add(i * bytes) }.cast();
    tensor
}

/// Device memory of `elems` bf16 values repeating `pattern`.
fn repeated(ctx: *mut unikv_context, pattern: &[bf16], elems: usize) -> Dev {
    let d = Dev::new(ctx, elems * 2);
    fill_repeating(ctx, d.ptr, bytes_of(pattern), elems * 2);
    d
}

/// Times the three layer kinds and the stream build at one shape: T requests
/// in slots 1..=T, one token each at position `context - 1`, over a pool of
/// `kv_dtype` rows whose layers are the kinds' layers one after the other.
fn bench_step(
    shared: &Shared,
    rng: &mut rand::rngs::ThreadRng,
    kv_dtype: u32,
    pool_name: &'static str,
    t: usize,
    context: usize,
) -> Step {
    let (ctx, stream, c, table) = (shared.ctx, shared.stream, shared.c, &shared.table);
    let row_bytes = if kv_dtype == 1 { 1024 } else { 640 };
    let kinds = [Kind::Dense, Kind::Csa, Kind::Hca];
    let counts = kinds.map(|k| {
        (3 * L2_BYTES)
            .div_ceil(k.bytes(t, context, row_bytes))
            .clamp(2, MAX_LAYERS)
    });
    let ratios: Vec<u32> = kinds
        .iter()
        .zip(counts)
        .flat_map(|(k, n)| std::iter::repeat(k.ratio()).take(n))
        .collect();
    let layers = ratios.len();
    let pages_per_request = context / PAGE_TOKENS;
    let pages = t * pages_per_request;
    let params = unikv_pool_params {
        struct_size: std::mem::size_of::<unikv_pool_params>(),
        compress_ratios: ratios.as_ptr(),
        layer_buffers: std::ptr::null(),
        num_layers: layers as u32,
        max_requests: t as u32,
        window: WINDOW as u32,
        spec_extra: 0,
        // Two 128-token blocks per page: page ids 0..pages fit (docs/pool.md §6).
        c128_blocks: (2 * pages) as u32,
        kv_dtype,
        rope_buffers: std::ptr::null(),
        compressor_state: 0,
        c4_state_ring: 0,
        c128_state_ring: 0,
        reserved: 0,
        state_buffers: std::ptr::null(),
    };
    let mut pool = std::ptr::null_mut();
    ok(
        unsafe { unikv_pool_create(ctx, &params, &mut pool) },
        "layer pool",
    );
    for l in 0..layers as u32 {
        let layer = layer_info(pool, l);
        if kv_dtype == 1 {
            let bytes = layer.rows as usize * 1024;
            fill_repeating(ctx, layer.data, bytes_of(&shared.bf16), bytes);
        } else {
            fill_fp8_layer(ctx, &layer, &shared.nope, &shared.rope);
        }
    }

    // Each request's pages are a random draw of the page space, as an
    // engine's allocator leaves them.
    let pos = context - 1;
    let mut ids: Vec<i32> = (0..pages as i32).collect();
    ids.shuffle(rng);
    let page_table = Dev::upload(ctx, &ids);
    // The HCA table: every 128-group the token sees, two per page.
    let hca_width = context / 128;
    let c128: Vec<i32> = ids
        .chunks(pages_per_request)
        .flat_map(|req| (0..hca_width).map(move |g| req[g / 2] * 2 + (g % 2) as i32))
        .collect();
    let c128 = Dev::upload(ctx, &c128);
    let batch = Dev::upload(ctx, &(0..t as i32).collect::<Vec<_>>());
    let slots = Dev::upload(ctx, &(1..=t as i32).collect::<Vec<_>>());
    let positions = Dev::upload(ctx, &vec![pos as i32; t]);
    // swa_row(slot, pos) = slot * ring + pos % ring (docs/pool.md §4).
    let ring_rows: Vec<i32> = (1..=t)
        .map(|s| (s * WINDOW + pos % WINDOW) as i32)
        .collect();
    let ring_rows = Dev::upload(ctx, &ring_rows);

    let caps = [t * WINDOW, t * (WINDOW + hca_width), t * (WINDOW + TOPK)];
    let [swa, hca, csa] = caps.map(|n| (Dev::new(ctx, (t + 1) * 4), Dev::new(ctx, n * 4)));
    let streams_args = unikv_decode_streams_args {
        struct_size: std::mem::size_of::<unikv_decode_streams_args>(),
        batch_id: batch.i32s(&[t]),
        req_slots: slots.i32s(&[t]),
        positions: positions.i32s(&[t]),
        c128_page_indices: c128.i32s(&[t, hca_width]),
        swa_indptr: swa.0.i32s(&[t + 1]),
        swa_indices: swa.1.i32s(&[caps[0]]),
        hca_indptr: hca.0.i32s(&[t + 1]),
        hca_indices: hca.1.i32s(&[caps[1]]),
        csa_indptr: csa.0.i32s(&[t + 1]),
        csa_indices: csa.1.i32s(&[caps[2]]),
        num_tokens: t as u32,
        csa_topk: TOPK as u32,
    };
    // Its replays also leave the streams built for the chains below.
    let streams_us = per_call_us(stream, 8, |_, s| {
        ok(
            unsafe { unikv_build_decode_streams(pool, &streams_args, s) },
            "decode streams",
        );
    });

    // Per-layer inputs (as each layer's projections make them); outputs shared.
    let q_in = repeated(ctx, &shared.bf16, layers * t * HEADS * 512);
    let kv_in = repeated(ctx, &shared.bf16, layers * t * 512);
    let index_q = repeated(ctx, &shared.bf16, layers * t * INDEXER_HEADS * INDEXER_DIM);
    let index_w = repeated(ctx, &shared.bf16, layers * t * INDEXER_HEADS);
    let kv_weight = repeated(ctx, &shared.bf16, 512);
    let sink = Dev::upload(ctx, &vec![0.5f32; HEADS]);
    let q = Dev::new(ctx, t * HEADS * 1024);
    let out = Dev::new(ctx, t * HEADS * 1024);
    let q_fp8 = Dev::new(ctx, t * INDEXER_HEADS * INDEXER_DIM);
    let weights = Dev::new(ctx, t * INDEXER_HEADS * 4);
    let visible = context / 4;
    let logits = Dev::new(ctx, t * visible * 4);
    let topk = Dev::new(ctx, t * TOPK * 4);
    // One indexer cache per CSA layer.
    let cache = Dev::new(ctx, counts[1] * pages * INDEXER_PAGE_BYTES);
    fill_repeating(ctx, cache.ptr, &shared.index_pages, cache.bytes);
    let (plan, ws, ws_bytes) = decode_plan(ctx, t, HEADS, kv_dtype);
    let ws_ptr = ws.as_ref().map_or(std::ptr::null_mut(), |w| w.ptr);

    let prepare_args = |l: usize| unikv_prepare_qkv_args {
        struct_size: std::mem::size_of::<unikv_prepare_qkv_args>(),
        q_in: block(&q_in, 1, 2, &[t, HEADS, 512], l),
        q_out: q.bf16s(&[t, HEADS, 512]),
        kv_in: block(&kv_in, 1, 2, &[t, 512], l),
        kv_weight: kv_weight.bf16s(&[512]),
        kv_out: ABSENT,
        rope_table: table.t(3, 4, &[MAX_POS, 64]),
        positions: positions.i32s(&[t]),
        rows: ring_rows.i32s(&[t]),
        layer: l as u32,
        num_tokens: t as u32,
        num_heads: HEADS as u32,
        q_eps: 1e-6,
        kv_eps: 1e-6,
        reserved: 0,
    };
    let index_args = |l: usize| unikv_indexer_prepare_q_args {
        struct_size: std::mem::size_of::<unikv_indexer_prepare_q_args>(),
        q: block(&index_q, 1, 2, &[t, INDEXER_HEADS, INDEXER_DIM], l),
        weights: block(&index_w, 1, 2, &[t, INDEXER_HEADS], l),
        rope_table: table.t(3, 4, &[MAX_POS, 64]),
        positions: positions.i32s(&[t]),
        q_fp8: q_fp8.t(6, 1, &[t, INDEXER_HEADS, INDEXER_DIM]),
        weights_out: weights.t(3, 4, &[t, INDEXER_HEADS]),
        q_dtype: 7,
        num_tokens: t as u32,
        num_heads: INDEXER_HEADS as u32,
        weight_scale: 1.0 / ((INDEXER_DIM * INDEXER_HEADS) as f32).sqrt(),
    };
    let prepare = |l: usize, s: *mut c_void| {
        ok(
            unsafe { unikv_prepare_qkv(pool, &prepare_args(l), s) },
            "prepare_qkv",
        );
    };
    let index_prepare = |l: usize, s: *mut c_void| {
        ok(
            unsafe { unikv_indexer_prepare_q(ctx, &index_args(l), s) },
            "indexer_prepare_q",
        );
    };
    let prepare_both = |l: usize, s: *mut c_void| {
        ok(
            unsafe { unikv_prepare_qkv_indexer_q(pool, &prepare_args(l), &index_args(l), s) },
            "prepare_qkv_indexer_q",
        );
    };
    // `cache_block`: the layer's indexer cache among the CSA layers'.
    let topk_args = |cache_block: usize| unikv_indexer_topk_args {
        struct_size: std::mem::size_of::<unikv_indexer_topk_args>(),
        q_fp8: q_fp8.t(6, 1, &[t, INDEXER_HEADS, INDEXER_DIM]),
        weights: weights.t(3, 4, &[t, INDEXER_HEADS]),
        cache: block(&cache, 6, 1, &[pages, INDEXER_PAGE_BYTES], cache_block),
        page_table: page_table.i32s(&[t, pages_per_request]),
        batch_id: batch.i32s(&[t]),
        positions: positions.i32s(&[t]),
        logits: logits.t(3, 4, &[t, visible]),
        topk_indices: topk.i32s(&[t, TOPK]),
        cache_dtype: 7,
        num_tokens: t as u32,
        num_heads: INDEXER_HEADS as u32,
        topk: TOPK as u32,
    };
    let topk_call = |cache_block: usize, s: *mut c_void| {
        ok(
            unsafe { unikv_indexer_topk(ctx, &topk_args(cache_block), s) },
            "indexer_topk",
        );
    };
    let topk_tail = |cache_block: usize, s: *mut c_void| {
        let stream = unikv_csa_stream {
            struct_size: std::mem::size_of::<unikv_csa_stream>(),
            csa_indptr: csa.0.i32s(&[t + 1]),
            csa_indices: csa.1.i32s(&[caps[2]]),
        };
        ok(
            unsafe { unikv_indexer_topk_fill_csa(pool, &topk_args(cache_block), &stream, s) },
            "indexer_topk_fill_csa",
        );
    };
    let tail = |s: *mut c_void| {
        let args = unikv_csa_tail_args {
            struct_size: std::mem::size_of::<unikv_csa_tail_args>(),
            batch_id: batch.i32s(&[t]),
            positions: positions.i32s(&[t]),
            csa_page_indices: topk.i32s(&[t, TOPK]),
            csa_indptr: csa.0.i32s(&[t + 1]),
            csa_indices: csa.1.i32s(&[caps[2]]),
            num_tokens: t as u32,
            reserved: 0,
        };
        ok(
            unsafe { unikv_fill_csa_tail(pool, &args, s) },
            "fill_csa_tail",
        );
    };
    let attend = |l: usize, (indptr, indices): &(Dev, Dev), cap: usize, s: *mut c_void| {
        let args = unikv_decode_args {
            struct_size: std::mem::size_of::<unikv_decode_args>(),
            q: q.bf16s(&[t, HEADS, 512]),
            indices: indices.i32s(&[cap]),
            indptr: indptr.i32s(&[t + 1]),
            sink: sink.t(3, 4, &[HEADS]),
            out: out.bf16s(&[t, HEADS, 512]),
            lse: ABSENT,
            layer: l as u32,
            num_tokens: t as u32,
            softmax_scale: 0.044194173,
            reserved: 0,
            rope_table: table.t(3, 4, &[MAX_POS, 64]),
            positions: positions.i32s(&[t]),
            kv: Default::default(),
            extra_kv: Default::default(),
            extra_indices: Default::default(),
            extra_indptr: Default::default(),
        };
        ok(
            unsafe { unikv_sparse_decode(plan, pool, &args, ws_ptr, ws_bytes, s) },
            "sparse_decode",
        );
    };

    // The rows' labels follow the decode rows': "fp8" marks the FP8 pool.
    let suffix = if kv_dtype == 1 { "" } else { " fp8" };
    let mut us = [0f64; 3];
    let mut first = 0;
    for (k, kind) in kinds.into_iter().enumerate() {
        let (stream_of, cap) = match kind {
            Kind::Dense => (&swa, caps[0]),
            Kind::Hca => (&hca, caps[1]),
            Kind::Csa => (&csa, caps[2]),
        };
        us[k] = per_call_us(stream, counts[k], |i, s| {
            if kind == Kind::Csa {
                prepare_both(first + i, s);
                topk_tail(i, s);
            } else {
                prepare(first + i, s);
            }
            attend(first + i, stream_of, cap, s);
        });
        first += counts[k];
        Row {
            op: format!("layer {}{suffix} {}k", kind.name(), context >> 10),
            t,
            h: HEADS,
            keys: kind.keys(context),
            us: us[k],
            bytes: kind.bytes(t, context, row_bytes) as f64,
            flops: kind.flops(t, context),
        }
        .print(c);
    }

    // The budget of the chains the targets name (at 8k): each call alone in
    // its own graph over the same layers, and every prefix of the chain, so
    // each call's marginal cost (PDL overlap included) is a difference.
    let mut budget = Vec::new();
    if context == CONTEXTS[0] {
        let (csa0, hca0) = (counts[0], counts[0] + counts[1]);
        let csa_chain: [Call; 3] = [
            ("prepare_qkv_indexer_q", &|i, s| prepare_both(csa0 + i, s)),
            ("indexer_topk_fill_csa", &|i, s| topk_tail(i, s)),
            ("sparse_decode", &|i, s| attend(csa0 + i, &csa, caps[2], s)),
        ];
        // The same chain with each fused pair as its two calls, for comparison.
        let apart_chain: [Call; 5] = [
            ("prepare_qkv", &|i, s| prepare(csa0 + i, s)),
            ("indexer_prepare_q", &|i, s| index_prepare(csa0 + i, s)),
            ("indexer_topk", &|i, s| topk_call(i, s)),
            ("fill_csa_tail", &|_, s| tail(s)),
            ("sparse_decode", &|i, s| attend(csa0 + i, &csa, caps[2], s)),
        ];
        let hca_chain: [Call; 2] = [
            ("prepare_qkv", &|i, s| prepare(hca0 + i, s)),
            ("sparse_decode", &|i, s| attend(hca0 + i, &hca, caps[1], s)),
        ];
        for (layer, chain, layers) in [
            ("csa", &csa_chain[..], counts[1]),
            ("csa, calls apart", &apart_chain[..], counts[1]),
            ("hca", &hca_chain[..], counts[2]),
        ] {
            let mut before = 0.0;
            for n in 1..=chain.len() {
                let (call, f) = chain[n - 1];
                let alone = per_call_us(stream, layers, f);
                let prefix = per_call_us(stream, layers, |i, s| {
                    chain[..n].iter().for_each(|(_, g)| g(i, s))
                });
                budget.push(BudgetRow {
                    layer,
                    call,
                    alone,
                    prefix,
                    marginal: prefix - before,
                });
                before = prefix;
            }
        }
    }
    unsafe {
        unikv_decode_plan_destroy(plan);
        unikv_pool_destroy(pool);
    }
    Step {
        pool: pool_name,
        t,
        context,
        dense: us[0],
        csa: us[1],
        hca: us[2],
        streams: streams_us,
        budget,
    }
}
