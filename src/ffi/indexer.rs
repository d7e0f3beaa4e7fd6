//! Lightning indexer entry points (docs/indexer.md §1): query preparation
//! (RoPE + Hadamard + FP8 and the folded head weights) and compressed-key
//! preparation into the indexer key cache.

use std::os::raw::c_void;

use crate::backend::Stream;
use crate::error::ensure;
use crate::ffi::boundary::{boundary, read_params, Versioned};
use crate::ffi::context::{context, unikv_context};
use crate::ffi::pool::{pool_of, unikv_pool};
use crate::ffi::status::unikv_status;
use crate::ffi::types::unikv_tensor;
use crate::ops::indexer::{self, CsaStreamRaw, IndexerKeyRaw, IndexerQueryRaw, IndexerTopkRaw};

/// Arguments of `unikv_indexer_prepare_q`.
///
/// Math per token t and head h, on the head's 128 values widened to f32 and
/// never rounded in between: GPT-J RoPE of dims 64..127 with `(c_i, s_i)` =
/// `rope_table[positions[t], 2i..2i+2]` (`re' = re*c - im*s`,
/// `im' = re*s + im*c`); the 128-point Walsh-Hadamard transform in natural
/// order, as seven butterfly stages of strides 1..64 (lower `a + b`, upper
/// `a - b`), times f32(1/sqrt(128)); `scale = max(amax, 1e-4) / fp8_max`
/// (fp8_max 448 for fn, 240 for fnuz), codes `encode(y * (1 / scale))` rounded to nearest even with saturation;
/// `weights_out[t][h] = (weights[t][h] * weight_scale) * scale`. Each step is
/// one f32 operation, never fused: backends agree bit for bit.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_indexer_prepare_q_args {
    /// sizeof(unikv_indexer_prepare_q_args).
    pub struct_size: usize,
    /// `[>= num_tokens, num_heads, 128]` bf16 indexer queries (`wq_b`
    /// output; any token and head strides, rows 16-byte aligned).
    pub q: unikv_tensor,
    /// `[>= num_tokens, num_heads]` bf16 head weights (`weights_proj`
    /// output; any token stride, e.g. a slice of a fused projection).
    pub weights: unikv_tensor,
    /// `[max_pos, 64]` f32 RoPE table (`unikv_rope_table`).
    pub rope_table: unikv_tensor,
    /// `[>= num_tokens]` i32 or i64 absolute positions: table rows.
    pub positions: unikv_tensor,
    /// `[>= num_tokens, num_heads, 128]` UNIKV_DTYPE_U8 output codes (rows
    /// 16-byte aligned).
    pub q_fp8: unikv_tensor,
    /// `[>= num_tokens, num_heads]` f32 output: the folded weights.
    pub weights_out: unikv_tensor,
    /// UNIKV_DTYPE_FP8_E4M3FN or UNIKV_DTYPE_FP8_E4M3FNUZ: the codes' format.
    pub q_dtype: u32,
    /// Tokens of this forward.
    pub num_tokens: u32,
    /// Indexer heads (64 in DeepSeek-V4); num_tokens * num_heads < 2^31.
    pub num_heads: u32,
    /// `1 / sqrt(128 * num_heads)` in DeepSeek-V4; finite.
    pub weight_scale: f32,
}

unsafe impl Versioned for unikv_indexer_prepare_q_args {
    const NAME: &'static str = "args";
}

/// Arguments of `unikv_indexer_prepare_k`. The cache layout is
/// `unikv_store_indexer`'s.
///
/// Math per key t, in f32 with no rounding in between: RMSNorm
/// `x * f * norm_weight` with `f = 1 / sqrt(sum(x^2) / 128 + eps)` (the sum
/// in double, f rounded to f32 once); RoPE of dims 64..127 at
/// `positions[t]` (the first position of the key's 4-token group); the
/// Hadamard transform and FP8 quantization of `unikv_indexer_prepare_q_args`;
/// codes and scale stored at location `loc[t]`. Backends agree within 1 FP8
/// code and 1 f32 ulp of the scale (the norm's sum may round differently).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_indexer_prepare_k_args {
    /// sizeof(unikv_indexer_prepare_k_args).
    pub struct_size: usize,
    /// The indexer key cache `[num_pages, 132 * page_size]` UNIKV_DTYPE_U8
    /// (see `unikv_store_indexer_args.cache`).
    pub cache: unikv_tensor,
    /// `[>= num_tokens, 128]` bf16 or f32 compressed keys (compressor
    /// output), rows 16-byte aligned.
    pub key: unikv_tensor,
    /// `[128]` bf16 RMSNorm weight of the indexer compressor.
    pub norm_weight: unikv_tensor,
    /// `[max_pos, 64]` f32 RoPE table (`unikv_rope_table`).
    pub rope_table: unikv_tensor,
    /// `[>= num_tokens]` i32 or i64 positions: table rows.
    pub positions: unikv_tensor,
    /// `[>= num_tokens]` i32 or i64 cache locations; negative = skip.
    pub loc: unikv_tensor,
    /// Keys per page: 64.
    pub page_size: u32,
    /// UNIKV_DTYPE_FP8_E4M3FN or UNIKV_DTYPE_FP8_E4M3FNUZ.
    pub cache_dtype: u32,
    /// Keys to prepare and store.
    pub num_tokens: u32,
    /// RMSNorm epsilon (1e-6), finite and > 0.
    pub eps: f32,
    /// Must be 0.
    pub reserved: u32,
}

unsafe impl Versioned for unikv_indexer_prepare_k_args {
    const NAME: &'static str = "args";
}

/// Prepares a forward's indexer queries (math in
/// `unikv_indexer_prepare_q_args`): writes `q_fp8` and `weights_out`.
/// Tensors are in the context's memory; `args` is host memory read during
/// the call. Runs on `stream` (ignored by the CPU backend). Device values: the
/// CPU backend (and GPU backends in `validate` mode) checks every position
/// (OUT_OF_RANGE outside the table), nothing written; otherwise GPU backends
/// skip a token whose position is outside the table. No in-place use: the
/// outputs may not overlap each other or an input (UNIKV_OVERLAPPING_BUFFERS).
/// Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_indexer_prepare_q(
    ctx: *const unikv_context,
    args: *const unikv_indexer_prepare_q_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        let a = read_params(args, std::mem::zeroed())?;
        indexer::indexer_prepare_q(ctx, &query_raw(&a), Stream(stream))
    })
}

pub(crate) fn query_raw(a: &unikv_indexer_prepare_q_args) -> IndexerQueryRaw {
    IndexerQueryRaw {
        q: (&a.q).into(),
        weights: (&a.weights).into(),
        rope_table: (&a.rope_table).into(),
        positions: (&a.positions).into(),
        q_fp8: (&a.q_fp8).into(),
        weights_out: (&a.weights_out).into(),
        q_dtype: a.q_dtype,
        num_tokens: a.num_tokens as usize,
        num_heads: a.num_heads as usize,
        weight_scale: a.weight_scale,
    }
}

/// Prepares compressed indexer keys and stores them into the indexer key
/// cache (math in `unikv_indexer_prepare_k_args`). Memory, stream, overlap
/// (no input may overlap the cache) and thread-safety rules as
/// `unikv_store_indexer`. Device values: the CPU
/// backend (and GPU backends in `validate` mode) checks every position
/// (OUT_OF_RANGE) and location as `unikv_store_indexer` does, nothing
/// written; otherwise GPU backends skip a key whose position is outside the
/// table or whose location is past the cache.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_indexer_prepare_k(
    ctx: *const unikv_context,
    args: *const unikv_indexer_prepare_k_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        let a = read_params(args, std::mem::zeroed())?;
        ensure!(a.reserved == 0, InvalidArgument, "args.reserved: must be 0");
        let raw = IndexerKeyRaw {
            cache: (&a.cache).into(),
            key: (&a.key).into(),
            norm_weight: (&a.norm_weight).into(),
            rope_table: (&a.rope_table).into(),
            positions: (&a.positions).into(),
            loc: (&a.loc).into(),
            page_size: a.page_size,
            cache_dtype: a.cache_dtype,
            num_tokens: a.num_tokens as usize,
            eps: a.eps,
        };
        indexer::indexer_prepare_k(ctx, &raw, Stream(stream))
    })
}

/// Arguments of `unikv_indexer_topk` and `unikv_indexer_topk_from_logits`
/// (docs/indexer.md §3). The indexer key cache and the page table use
/// pages of 64 compressed keys (256 raw tokens): compressed key i of a
/// request lives at location `page_table[request][i / 64] * 64 + i % 64`,
/// which is also its CSA page index.
///
/// Per token t of request `b = batch_id[t]` at position p, the visible keys
/// are the first `n = (p + 1) / 4` of the request (complete 4-token groups).
/// Key i's score is `k_scale[i] * sum_h weights[t][h] * relu(q_fp8[t][h] .
/// k[i])`, each dot product exact, the head sum in double, rounded to f32
/// once on the CPU backend. GPU backends differ: f32 sums of the exact
/// products in the last bits, and on Hopper (sm_90a, e4m3fn) the dot
/// products run on FP8 tensor cores, whose sums keep about 13 mantissa bits,
/// so a score may differ by up to ~2^-7 of its dot products' term magnitudes
/// and keys that close to the threshold may be selected differently than on
/// the CPU backend. The selected set is the n keys when `n <= topk`, else the
/// `topk` best by score, ties broken by the lower key index (-0 equals +0,
/// NaN ranks below every number): identical on every backend for identical
/// scores. `topk_indices[t]` receives their page indices in ascending key
/// order, then -1 up to its last column; a padding token (negative
/// `batch_id`) gets a row of -1.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_indexer_topk_args {
    /// sizeof(unikv_indexer_topk_args).
    pub struct_size: usize,
    /// `unikv_indexer_topk` only: `[>= num_tokens, num_heads, 128]`
    /// UNIKV_DTYPE_U8 query codes from `unikv_indexer_prepare_q` (rows
    /// 16-byte aligned).
    pub q_fp8: unikv_tensor,
    /// `unikv_indexer_topk` only: `[>= num_tokens, num_heads]` f32 folded
    /// weights from `unikv_indexer_prepare_q`.
    pub weights: unikv_tensor,
    /// `unikv_indexer_topk` only: the indexer key cache `[num_pages, 8448]`
    /// UNIKV_DTYPE_U8 (`unikv_store_indexer_args.cache`, page size 64).
    pub cache: unikv_tensor,
    /// `[requests, max_pages]` i32: page ids of each request's compressed
    /// keys (any row stride).
    pub page_table: unikv_tensor,
    /// `[>= num_tokens]` i32: each token's row of `page_table`; negative =
    /// padding.
    pub batch_id: unikv_tensor,
    /// `[>= num_tokens]` i32 or i64 absolute positions.
    pub positions: unikv_tensor,
    /// `[>= num_tokens, L]` f32 (any row stride), L at least the most keys a
    /// token sees: `unikv_indexer_topk` writes the visible keys' scores here
    /// (columns past them are untouched); `unikv_indexer_topk_from_logits`
    /// reads them.
    pub logits: unikv_tensor,
    /// `[>= num_tokens, W]` i32 output, W >= topk: the CSA page-index table
    /// for `unikv_fill_csa_tail`.
    pub topk_indices: unikv_tensor,
    /// `unikv_indexer_topk` only: UNIKV_DTYPE_FP8_E4M3FN or
    /// UNIKV_DTYPE_FP8_E4M3FNUZ, the format of the queries and the cache.
    pub cache_dtype: u32,
    /// Tokens of this forward.
    pub num_tokens: u32,
    /// `unikv_indexer_topk` only: indexer heads (64 in DeepSeek-V4).
    pub num_heads: u32,
    /// Keys to select, 1..=2048 (512 or 1024 in production).
    pub topk: u32,
}

unsafe impl Versioned for unikv_indexer_topk_args {
    const NAME: &'static str = "args";
}

fn topk_raw(a: &unikv_indexer_topk_args) -> IndexerTopkRaw {
    IndexerTopkRaw {
        q_fp8: (&a.q_fp8).into(),
        weights: (&a.weights).into(),
        cache: (&a.cache).into(),
        page_table: (&a.page_table).into(),
        batch_id: (&a.batch_id).into(),
        positions: (&a.positions).into(),
        logits: (&a.logits).into(),
        topk_indices: (&a.topk_indices).into(),
        cache_dtype: a.cache_dtype,
        num_tokens: a.num_tokens as usize,
        num_heads: a.num_heads as usize,
        topk: a.topk as usize,
    }
}

/// Scores every visible indexer key of every token and writes each token's
/// top-k page indices (math in `unikv_indexer_topk_args`): one call for all
/// tokens of a forward, launch configuration from the tensor shapes only, no
/// host synchronization (graph-safe). Tensors are in the context's memory;
/// `args` is host memory read during the call. Runs on `stream` (ignored by
/// the CPU backend). Device values: the CPU backend (and GPU backends in
/// `validate` mode) checks batch ids against the page table, positions
/// (non-negative; `(p + 1) / 4` keys within `logits` and the page-table row)
/// and every page id a token reads against the cache (OUT_OF_RANGE), nothing
/// written. Otherwise GPU backends treat a token whose batch id is past the
/// page table as padding, clamp its keys to `logits` and the page-table row,
/// and score a key on a page outside the cache as -inf. No in-place use:
/// `logits` and `topk_indices` may not overlap each other or an input
/// (UNIKV_OVERLAPPING_BUFFERS). Thread-safe for disjoint outputs.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_indexer_topk(
    ctx: *const unikv_context,
    args: *const unikv_indexer_topk_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        let a = read_params(args, std::mem::zeroed())?;
        indexer::indexer_topk(ctx, &topk_raw(&a), Stream(stream))
    })
}

/// The CSA stream `unikv_indexer_topk_fill_csa` completes (docs/index-streams.md §4).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_csa_stream {
    /// sizeof(unikv_csa_stream).
    pub struct_size: usize,
    /// `[>= num_tokens + 1]` i32 CSA stream offsets from
    /// `unikv_build_decode_streams`.
    pub csa_indptr: unikv_tensor,
    /// CSA stream indices from `unikv_build_decode_streams`, updated in place.
    pub csa_indices: unikv_tensor,
}

unsafe impl Versioned for unikv_csa_stream {
    const NAME: &'static str = "csa";
}

/// `unikv_indexer_topk` on the pool's context, then `unikv_fill_csa_tail`
/// of the same ratio-4 layer with `args`' batch ids, positions (i32 or i64)
/// and `topk_indices` as its table, in one call: GPU backends write the CSA
/// tail from the selection's own launch (a CSA layer's chain 1.8 us shorter
/// at batch 1 on an H200 than with the two calls). Results equal the two
/// calls'. Checks are
/// both calls', except that a token's tail may hold at most the
/// `min((p + 1) / 4, topk)` keys its top-k selects, and, since which keys
/// those are is known only after scoring, every key a token with a tail
/// sees must have a page index below the pool's CSA rows (OUT_OF_RANGE on
/// the CPU backend and in `validate`, nothing written). `csa_indices`,
/// updated in place, may not overlap another argument
/// (UNIKV_OVERLAPPING_BUFFERS). Graph-safe; thread-safe for disjoint
/// outputs.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_indexer_topk_fill_csa(
    pool: *const unikv_pool,
    args: *const unikv_indexer_topk_args,
    csa: *const unikv_csa_stream,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let pool = pool_of(pool)?;
        let a = read_params(args, std::mem::zeroed())?;
        let c = read_params(csa, std::mem::zeroed())?;
        let stream_raw = CsaStreamRaw {
            csa_indptr: (&c.csa_indptr).into(),
            csa_indices: (&c.csa_indices).into(),
        };
        indexer::indexer_topk_fill_csa(pool, &topk_raw(&a), &stream_raw, Stream(stream))
    })
}

/// `unikv_indexer_topk` without the scoring: selects from the caller's
/// `logits` (e.g. from its own paged MQA logits kernel); `q_fp8`, `weights`,
/// `cache`, `cache_dtype` and `num_heads` are ignored. Page ids are checked
/// (CPU backend, `validate`) to be non-negative and below 2^31 / 64.
/// `topk_indices` may not overlap an input, `logits` included
/// (UNIKV_OVERLAPPING_BUFFERS).
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_indexer_topk_from_logits(
    ctx: *const unikv_context,
    args: *const unikv_indexer_topk_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        let a = read_params(args, std::mem::zeroed())?;
        indexer::indexer_topk_from_logits(ctx, &topk_raw(&a), Stream(stream))
    })
}
