//! Benchmark rows of the lightning indexer's scores + top-k and of hash_topk
//! (issue 6). Bytes count what must move once per call: the indexer cache of
//! each request (132 bytes per compressed key), the queries and weights, the
//! logits written and read back, the index table; FLOPs are the logits'
//! multiply-adds (2 per code pair), measured against the bf16 matmul ceiling.

use rand::seq::SliceRandom;
use rand::Rng;
use unikv::ffi::context::unikv_context;
use unikv::ffi::indexer::{
    unikv_indexer_topk, unikv_indexer_topk_args, unikv_indexer_topk_from_logits,
};
use unikv::ffi::routing::{unikv_hash_topk, unikv_hash_topk_args};

use crate::{ok, per_call_us, Ceilings, Dev, Row, ABSENT, L2_BYTES};

const HEADS: usize = 64;
const DIM: usize = 128;
const PAGE: usize = 64;
const PAGE_BYTES: usize = 132 * PAGE;
/// DeepSeek-V4-Flash's top-k (Pro selects 1024).
const TOPK: usize = 512;

/// `pages` indexer cache pages of random finite codes (below 0x70: no NaN)
/// and scales in [0.01, 1).
pub fn random_pages(rng: &mut impl Rng, pages: usize) -> Vec<u8> {
    let mut cache = vec![0u8; pages * PAGE_BYTES];
    for page in cache.chunks_exact_mut(PAGE_BYTES) {
        page[..PAGE * DIM]
            .iter_mut()
            .for_each(|b| *b = rng.random_range(0u8..0x70) | (rng.random::<u8>() & 0x80));
        for s in 0..PAGE {
            page[PAGE * DIM + 4 * s..][..4]
                .copy_from_slice(&rng.random_range(0.01f32..1.0).to_le_bytes());
        }
    }
    cache
}

/// One `unikv_indexer_topk` shape: `tokens` query tokens over `requests`
/// requests with `keys` compressed keys each, selecting `topk`; decode tokens
/// see all of them, a prefill chunk's tokens the causal prefix ending at their
/// position.
struct TopkCase<'a> {
    op: &'a str,
    tokens: usize,
    requests: usize,
    keys: usize,
    topk: usize,
    /// Every cache page drawn on its own; otherwise one random page repeated,
    /// so each score recurs once per page (the rows before issue 24).
    distinct_pages: bool,
}

/// Times `case`'s scores + top-k, then its selection alone.
fn bench_topk_case(
    ctx: *mut unikv_context,
    stream: &unikv::backend::gpu::devtools::OwnedStream,
    c: &Ceilings,
    rng: &mut rand::rngs::ThreadRng,
    case: TopkCase,
) {
    let TopkCase {
        op,
        tokens,
        requests,
        keys,
        topk,
        distinct_pages,
    } = case;
    let pages_per_request = keys.div_ceil(PAGE);
    let cache_bytes_per_set = requests * pages_per_request * PAGE_BYTES;
    let sets = (3 * L2_BYTES).div_ceil(cache_bytes_per_set).clamp(1, 16);
    let cache_pages = sets * requests * pages_per_request;
    let pattern = random_pages(rng, if distinct_pages { cache_pages } else { 1 });
    let cache = Dev::new(ctx, cache_pages * PAGE_BYTES);
    crate::fill_repeating(ctx, cache.ptr, &pattern, cache_pages * PAGE_BYTES);
    let mut ids: Vec<i32> = (0..cache_pages as i32).collect();
    ids.shuffle(rng);
    let tables: Vec<Dev> = ids
        .chunks(requests * pages_per_request)
        .map(|c| Dev::upload(ctx, c))
        .collect();
    let batch: Vec<i32> = (0..tokens)
        .map(|t| (t * requests / tokens) as i32)
        .collect();
    let positions: Vec<i32> = (0..tokens)
        .map(|t| {
            if tokens == requests {
                (4 * keys - 1) as i32
            } else {
                // A prefill chunk at the end of the context.
                (4 * keys - tokens + t) as i32
            }
        })
        .collect();
    let scored: usize = positions.iter().map(|&p| (p as usize + 1) / 4).sum();
    let q: Vec<u8> = (0..tokens * HEADS * DIM)
        .map(|_| rng.random_range(0u8..0x70))
        .collect();
    let w: Vec<f32> = (0..tokens * HEADS)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let (qd, wd, bd, pd) = (
        Dev::upload(ctx, &q),
        Dev::upload(ctx, &w),
        Dev::upload(ctx, &batch),
        Dev::upload(ctx, &positions),
    );
    let logits = Dev::new(ctx, tokens * keys * 4);
    let out = Dev::new(ctx, tokens * topk * 4);
    let args_of = |i: usize| unikv_indexer_topk_args {
        struct_size: std::mem::size_of::<unikv_indexer_topk_args>(),
        q_fp8: qd.t(6, 1, &[tokens, HEADS, DIM]),
        weights: wd.t(3, 4, &[tokens, HEADS]),
        cache: cache.t(6, 1, &[cache_pages, PAGE_BYTES]),
        page_table: tables[i].i32s(&[requests, pages_per_request]),
        batch_id: bd.i32s(&[tokens]),
        positions: pd.i32s(&[tokens]),
        logits: logits.t(3, 4, &[tokens, keys]),
        topk_indices: out.i32s(&[tokens, topk]),
        cache_dtype: 7,
        num_tokens: tokens as u32,
        num_heads: HEADS as u32,
        topk: topk as u32,
    };
    let us = per_call_us(stream, sets, |i, s| {
        ok(unsafe { unikv_indexer_topk(ctx, &args_of(i), s) }, op);
    });
    Row {
        op: op.into(),
        t: tokens,
        h: HEADS,
        keys,
        us,
        bytes: (requests * keys * 132
            + tokens * HEADS * (DIM + 4)
            + 2 * scored * 4
            + tokens * topk * 4) as f64,
        flops: (2 * scored * HEADS * DIM) as f64,
    }
    .print(c);
    // The selection alone, from the logits the last call left.
    let us = per_call_us(stream, sets, |i, s| {
        ok(
            unsafe { unikv_indexer_topk_from_logits(ctx, &args_of(i), s) },
            "select",
        );
    });
    Row {
        op: "  select only".into(),
        t: tokens,
        h: 0,
        keys,
        us,
        bytes: (scored * 4 + tokens * topk * 4) as f64,
        flops: 0.0,
    }
    .print(c);
}

pub fn bench_indexer_topk(
    ctx: *mut unikv_context,
    stream: &unikv::backend::gpu::devtools::OwnedStream,
    c: &Ceilings,
    rng: &mut rand::rngs::ThreadRng,
) {
    for &keys in &[1024usize, 8192, 32768] {
        for &t in &[1usize, 64, 256] {
            let case = TopkCase {
                op: "indexer_topk",
                tokens: t,
                requests: t,
                keys,
                topk: TOPK,
                distinct_pages: false,
            };
            bench_topk_case(ctx, stream, c, rng, case);
        }
    }
    let prefill = TopkCase {
        op: "indexer_topk pf",
        tokens: 4096,
        requests: 1,
        keys: 8192,
        topk: TOPK,
        distinct_pages: false,
    };
    bench_topk_case(ctx, stream, c, rng, prefill);
    // The latency shape (issue 24): decode at T <= 4 with DeepSeek-V4's two
    // top-k sizes, up to N = 131072 keys (a 512k-token context), over
    // distinct random keys as a real cache holds.
    for topk in [512usize, 1024] {
        let op = format!("indexer_topk k{topk}");
        for keys in [1024usize, 8192, 32768, 131072] {
            for t in [1usize, 4] {
                let case = TopkCase {
                    op: &op,
                    tokens: t,
                    requests: t,
                    keys,
                    topk,
                    distinct_pages: true,
                };
                bench_topk_case(ctx, stream, c, rng, case);
            }
        }
    }
}

/// hash_topk with DeepSeek-V4 Flash's routing (E = 256, K = 6, one shared
/// slot). Bytes: ids, the K table entries and the K logits (one 32-byte sector
/// each), the outputs.
pub fn bench_hash_topk(
    ctx: *mut unikv_context,
    stream: &unikv::backend::gpu::devtools::OwnedStream,
    c: &Ceilings,
    rng: &mut rand::rngs::ThreadRng,
) {
    const E: usize = 256;
    const K: usize = 6;
    const VOCAB: usize = 129_280;
    let table: Vec<i32> = (0..VOCAB * K)
        .map(|_| rng.random_range(0..E as i32))
        .collect();
    let table_d = Dev::upload(ctx, &table);
    for &n in &[1usize, 64, 4096] {
        let sets = 8;
        let logits: Vec<f32> = (0..sets * n * E)
            .map(|_| rng.random_range(-8.0f32..8.0))
            .collect();
        let ids: Vec<i32> = (0..sets * n)
            .map(|_| rng.random_range(0..VOCAB as i32))
            .collect();
        let (ld, id) = (Dev::upload(ctx, &logits), Dev::upload(ctx, &ids));
        let (wd, od) = (
            Dev::new(ctx, n * (K + 1) * 4),
            Dev::new(ctx, n * (K + 1) * 4),
        );
        let us = per_call_us(stream, sets, |i, s| {
            let mut lt = ld.t(3, 4, &[n, E]);
            lt.data = unsafe { (ld.ptr as *mut f32).add(i * n * E) }.cast();
            let mut it = id.i32s(&[n]);
            it.data = unsafe { (id.ptr as *mut i32).add(i * n) }.cast();
            let args = unikv_hash_topk_args {
                struct_size: std::mem::size_of::<unikv_hash_topk_args>(),
                router_logits: lt,
                input_ids: it,
                tid2eid: table_d.i32s(&[VOCAB, K]),
                topk_weights: wd.t(3, 4, &[n, K + 1]),
                topk_ids: od.i32s(&[n, K + 1]),
                num_real_tokens: ABSENT,
                num_real_tokens_host: n as u32,
                num_tokens: n as u32,
                num_shared: 1,
                routed_scaling_factor: 1.5,
            };
            ok(unsafe { unikv_hash_topk(ctx, &args, s) }, "hash_topk");
        });
        Row {
            op: "hash_topk".into(),
            t: n,
            h: 0,
            keys: 0,
            us,
            bytes: (n * (4 + K * 4 + K * 32 + (K + 1) * 8)) as f64,
            flops: 0.0,
        }
        .print(c);
    }
}
