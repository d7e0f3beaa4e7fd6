//! The KV compressor (docs/compressor.md): gated pooling of every 4 (CSA) or
//! 128 (HCA) raw tokens into one compressed vector, fused with RMSNorm, RoPE,
//! the indexer's Hadamard transform, quantization and the store; its state
//! lives in the pool (`unikv_pool_params.compressor_state`).

use std::os::raw::c_void;

use crate::args::compressor::CompressMode;
use crate::backend::Stream;
use crate::compressor::{layer_state, Compressor, StateGeometry};
use crate::error::{ensure, err, Result};
use crate::ffi::boundary::{boundary, read_params, write_info, Versioned};
use crate::ffi::pool::{pool_of, unikv_pool, unikv_pool_params};
use crate::ffi::sizes::geometry_of;
use crate::ffi::status::unikv_status;
use crate::ffi::types::unikv_tensor;
use crate::geometry::Geometry;
use crate::ops::compressor::{self, CompressRaw};

/// Which compressor of a compressed layer (docs/compressor.md §1).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum unikv_compressor {
    /// The attention compressor of ratio-4 and ratio-128 layers: 512
    /// channels, stored as latent rows (pool rows or a FlashMLA cache).
    UNIKV_COMPRESSOR_KV = 0,
    /// The indexer compressor of ratio-4 layers: 128 channels, Hadamard
    /// transform, stored as indexer keys.
    UNIKV_COMPRESSOR_INDEXER = 1,
}

/// Arguments of `unikv_compress_decode` and `unikv_compress_prefill`
/// (docs/compressor.md §2). The layer's compress ratio picks the pooling: 4
/// (overlapping windows) or 128. D is 512 for the attention compressor and 128
/// for the indexer's; V = 2 D for ratio 4 and D for ratio 128.
///
/// Every token appends its `kv_score` row to its request's ring (the state
/// keeps each request's last `ring` rows, position-addressed: row `slot *
/// ring + p % ring`). A token at position p with `(p + 1) % ratio == 0`
/// closes group `n = (p + 1) / ratio - 1`, which is pooled per channel d:
///
/// * ratio 4: candidates j = 0..3 are the overlap values of positions
///   `4n - 4 + j` (`kv_overlap`) with logits `score_overlap + ape[j][d]`,
///   masked (weight 0) for n = 0; candidates j = 4..7 are the own values of
///   positions `4n + j - 4` (`kv`) with logits `score + ape[j - 4][D + d]`;
/// * ratio 128: candidates j = 0..127 are positions `128n + j`, logits
///   `score + ape[j][d]`;
/// * `c[d] = sum_j softmax_j(logit_j[d]) value_j[d]`, an independent softmax
///   per channel, computed in f32 in blocks of 8 candidates with a fixed
///   exp (`compressor::pool_channel` in the Rust sources): bit-identical on
///   every backend.
///
/// Then RMSNorm with `norm_weight` and `eps` (the sum of squares in double,
/// the factor rounded to f32 once), RoPE of the last 64 dims at the group's
/// first position `ratio * n`, and:
///
/// * attention compressor: one rounding to bf16, then stored as
///   `unikv_store_compressed` (pool row `swa_rows + loc[t]`, quantized for FP8
///   pools: the same bytes) or, with `cache`, as `unikv_store_flashmla` at
///   location `loc[t]`;
/// * indexer compressor: the 128-point Hadamard transform and FP8 with one
///   f32 scale, into the indexer key cache at `loc[t]` (what
///   `unikv_indexer_prepare_k` stores for the pooled f32 key).
///
/// Backends agree bit for bit on the pooled values; the norm's sum may round
/// differently in rare rows (1 bf16 ulp, 1 FP8 code).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_compress_args {
    /// sizeof(unikv_compress_args).
    pub struct_size: usize,
    /// `[>= num_tokens, 2 V]` f32 or bf16: each token's raw row, the
    /// compressor's `wkv_gate` GEMM output, laid out `| kv_overlap | kv |
    /// score_overlap | score |` (ratio 4) or `| kv | score |` (ratio 128);
    /// rows 16-byte aligned, any row stride.
    pub kv_score: unikv_tensor,
    /// `[ratio, V]` f32: the learned position bias (the checkpoint's `ape`).
    pub ape: unikv_tensor,
    /// `[D]` bf16 or f32: the compressor's RMSNorm weight.
    pub norm_weight: unikv_tensor,
    /// `[max_pos, 64]` f32 RoPE table of the layer (`unikv_rope_table`).
    pub rope_table: unikv_tensor,
    /// `[>= num_tokens]` i32: each token's request; negative = padding
    /// (nothing read or written for it).
    pub batch_id: unikv_tensor,
    /// `[requests]` i32: each request's pool slot (its rings).
    pub req_slots: unikv_tensor,
    /// `[>= num_tokens]` i32 or i64: each token's absolute position.
    pub positions: unikv_tensor,
    /// `[>= num_tokens]` i32 or i64: where the group a token closes is
    /// stored (a compressed page index for the pool, a cache location with
    /// `cache`); negative = not stored; ignored for tokens that close no group.
    pub loc: unikv_tensor,
    /// Optional for the attention compressor (absent: the pool's rows of
    /// `layer`): a FlashMLA cache `[num_pages, bytes_per_page]` UNIKV_DTYPE_U8
    /// (`unikv_store_flashmla_args.cache`). Required for the indexer
    /// compressor: the indexer key cache (`unikv_store_indexer_args.cache`).
    pub cache: unikv_tensor,
    /// Pool layer: its ratio (4 or 128) and its compressor state.
    pub layer: u32,
    /// A `unikv_compressor`; UNIKV_COMPRESSOR_INDEXER only on ratio-4 layers.
    pub compressor: u32,
    /// Tokens of this call.
    pub num_tokens: u32,
    /// With `cache`: UNIKV_DTYPE_FP8_E4M3FN or UNIKV_DTYPE_FP8_E4M3FNUZ;
    /// without: 0.
    pub cache_dtype: u32,
    /// With `cache`: tokens per page (FlashMLA: 256, 64 or 2; indexer: 64);
    /// without: 0.
    pub page_size: u32,
    /// RMSNorm epsilon (`rms_norm_eps`, 1e-6), finite and > 0.
    pub eps: f32,
}

unsafe impl Versioned for unikv_compress_args {
    const NAME: &'static str = "args";
}

fn raw_of(a: &unikv_compress_args) -> CompressRaw {
    CompressRaw {
        kv_score: (&a.kv_score).into(),
        ape: (&a.ape).into(),
        norm_weight: (&a.norm_weight).into(),
        rope_table: (&a.rope_table).into(),
        batch_id: (&a.batch_id).into(),
        req_slots: (&a.req_slots).into(),
        positions: (&a.positions).into(),
        loc: (&a.loc).into(),
        cache: (&a.cache).into(),
        layer: a.layer,
        compressor: a.compressor,
        num_tokens: a.num_tokens as usize,
        cache_dtype: a.cache_dtype,
        page_size: a.page_size,
        eps: a.eps,
    }
}

/// The compressor for decode: at most one token per request (math in
/// `unikv_compress_args`). Each token's raw row goes into its ring, and a
/// token that closes a group pools it from the ring and its own row, then
/// stores it. One kernel launch on GPUs, its configuration from
/// `num_tokens` only, no allocation or host synchronization: capturable in
/// a CUDA graph and replayable with new tensor contents. Tensors are in the
/// context's memory; `args` is host memory read during the call; runs on
/// `stream` (ignored by the CPU backend). The pool needs compressor state
/// (INVALID_STATE otherwise). Device values: the CPU backend (and GPU
/// backends in `validate` mode) checks batch ids against `req_slots`, slots
/// (0..=max_requests, no two requests on one), positions (non-negative; a
/// closing token's group start below the RoPE table's rows), one token per
/// request, and the location of every closing token (below the pool's
/// compressed rows or the cache's slots, none twice): OUT_OF_RANGE or
/// INVALID_ARGUMENT, nothing written. Otherwise GPU backends skip a token
/// whose batch id, slot or position is invalid and the store of a location
/// past the target. The ring must hold the request's earlier rows of the
/// group (and for ratio 4 the previous group's): a request decodes after
/// its prefill. Overlap: no tensor may overlap the pool's compressor state,
/// the target (pool rows or cache) or another output
/// (UNIKV_OVERLAPPING_BUFFERS). Externally synchronized per (pool, layer):
/// calls writing one layer's state must not run concurrently.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_compress_decode(
    pool: *const unikv_pool,
    args: *const unikv_compress_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let pool = pool_of(pool)?;
        let a = read_params(args, std::mem::zeroed())?;
        compressor::compress(pool, &raw_of(&a), CompressMode::Decode, Stream(stream))
    })
}

/// The compressor for prefill and extend: a chunk of tokens per request
/// (math in `unikv_compress_args`), each request's tokens contiguous in the
/// call with consecutive positions, continuing from whatever its rings hold.
/// Every group that closes inside a chunk is stored, including one that
/// started in an earlier chunk (its first rows come from the ring); each
/// request's last `ring` raw rows stay in its ring (the trailing partial
/// group and, for ratio 4, the overlap rows the next group needs).
/// Speculative verify forwards (several tokens per request) use this call
/// too. Two kernel launches on GPUs (pool and store, then the ring writes),
/// graph-safe as `unikv_compress_decode`. Memory, stream, device-value,
/// overlap and thread-safety rules as `unikv_compress_decode`, except that a
/// request may have several tokens, which must be contiguous with
/// consecutive positions (INVALID_ARGUMENT on the CPU backend and in
/// `validate` mode; otherwise GPU backends read a wrong row for such a
/// request, never out of bounds).
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_compress_prefill(
    pool: *const unikv_pool,
    args: *const unikv_compress_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let pool = pool_of(pool)?;
        let a = read_params(args, std::mem::zeroed())?;
        compressor::compress(pool, &raw_of(&a), CompressMode::Prefill, Stream(stream))
    })
}

/// One compressor's state in a layer (`unikv_pool_get_compressor`). The raw
/// row of slot s at position p is the `row_floats` f32 at
/// `state + (s * ring + p % ring) * row_floats * 4` bytes: values first,
/// scores from float `score_offset` on. Empty rows hold values 0 and scores
/// -inf.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_compressor_info {
    /// sizeof(unikv_compressor_info), set by the caller.
    pub struct_size: usize,
    /// The state's first row (device memory for GPU backends): inside the
    /// layer's `state_data`, `offset_bytes` from its start. NULL from
    /// `unikv_pool_params_get_compressor` unless `params` adopts the buffer.
    pub state: *mut c_void,
    /// Offset of this compressor's state in the layer's state buffer (the
    /// indexer state follows the attention one on ratio-4 layers).
    pub offset_bytes: u64,
    /// Bytes of this compressor's state: num_slots * slot_bytes.
    pub bytes: u64,
    /// Bytes of one slot's ring: ring * row_floats * 4.
    pub slot_bytes: u64,
    /// f32 per raw row: 4 D (ratio 4) or 2 D (ratio 128).
    pub row_floats: u32,
    /// Float offset of the scores in a row: 2 D or D.
    pub score_offset: u32,
    /// Rows per slot's ring (8 or 16; 128 or 256).
    pub ring: u32,
    /// Channels D: 512 (attention) or 128 (indexer).
    pub head_dim: u32,
    /// The layer's ratio, 4 or 128.
    pub compress_ratio: u32,
    /// Slots (rings): max_requests + 1, slot 0 included.
    pub num_slots: u32,
    /// Tokens a caller may append and then roll back by length (speculative
    /// decoding, docs/compressor.md §4): ring - 7 (ratio 4) or ring - 127
    /// (ratio 128).
    pub max_rollback: u32,
    /// Written as 0.
    pub reserved: u32,
}

unsafe impl Versioned for unikv_compressor_info {
    const NAME: &'static str = "info";
}

/// A compressor's state geometry in `layer`, failing with a message that
/// says why there is none.
fn state_of(g: &Geometry, layer: u32, compressor: u32) -> Result<(usize, StateGeometry)> {
    let layer = g.check_layer(layer)?;
    let c = Compressor::from_raw(compressor)?;
    ensure!(
        g.config.state.is_some(),
        InvalidState,
        "pool: no compressor state (params.compressor_state = 0)"
    );
    let state = layer_state(g, layer, c).ok_or_else(|| {
        err!(
            InvalidArgument,
            "compressor: layer {layer} (ratio {}) has no {} compressor",
            g.ratio(layer).value(),
            match c {
                Compressor::Kv => "attention",
                Compressor::Indexer => "indexer",
            }
        )
    })?;
    Ok((layer, state))
}

fn compressor_info(s: &StateGeometry, base: *mut u8) -> unikv_compressor_info {
    let offset = s.offset_floats * 4;
    unikv_compressor_info {
        struct_size: 0,
        state: if base.is_null() {
            std::ptr::null_mut()
        } else {
            // SAFETY: the offset lies inside the layer's state buffer.
            unsafe { base.add(offset) as *mut c_void }
        },
        offset_bytes: offset as u64,
        bytes: (s.floats() * 4) as u64,
        slot_bytes: (s.slot_floats() * 4) as u64,
        row_floats: s.row_floats() as u32,
        score_offset: s.value_floats() as u32,
        ring: s.ring as u32,
        head_dim: s.dim() as u32,
        compress_ratio: s.ratio.value() as u32,
        num_slots: s.slots as u32,
        max_rollback: s.max_rollback() as u32,
        reserved: 0,
    }
}

/// Fills `info` (host memory; set `info->struct_size` first) with the state
/// geometry of one compressor (`compressor`, a `unikv_compressor`) of
/// `layer`. OUT_OF_RANGE for a layer past the pool's, UNIKV_BAD_ENUM for an
/// unknown compressor, INVALID_STATE for a pool without compressor state,
/// INVALID_ARGUMENT for a dense layer or the indexer compressor of a
/// ratio-128 layer. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_pool_get_compressor(
    pool: *const unikv_pool,
    layer: u32,
    compressor: u32,
    info: *mut unikv_compressor_info,
) -> unikv_status {
    boundary(|| {
        let p = pool_of(pool)?;
        let (layer, s) = state_of(p.geometry(), layer, compressor)?;
        write_info(info, compressor_info(&s, p.state_buffer(layer)))
    })
}

/// `unikv_pool_get_compressor` for the pool `params` would create, without
/// creating it: `params` is read and checked exactly as `unikv_pool_create`
/// checks it; `state` is inside the caller's `params->state_buffers[layer]`
/// when `params` adopts state buffers, NULL otherwise. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_pool_params_get_compressor(
    params: *const unikv_pool_params,
    layer: u32,
    compressor: u32,
    info: *mut unikv_compressor_info,
) -> unikv_status {
    boundary(|| {
        let (g, request) = geometry_of(params)?;
        let (layer, s) = state_of(&g, layer, compressor)?;
        let base = request
            .adopt_state
            .as_ref()
            .map_or(std::ptr::null_mut(), |b| b[layer]);
        write_info(info, compressor_info(&s, base))
    })
}
