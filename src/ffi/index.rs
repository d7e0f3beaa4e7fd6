//! Index-stream builder entry points.

use std::os::raw::c_void;

use crate::backend::Stream;
use crate::error::ensure;
use crate::ffi::boundary::{boundary, read_params, Versioned};
use crate::ffi::pool::{pool_of, unikv_pool};
use crate::ffi::status::unikv_status;
use crate::ffi::types::unikv_tensor;
use crate::ops::index::{self, CsaTailRaw, DecodeStreamsRaw, PrefillStreamsRaw};

/// Arguments of `unikv_build_decode_streams` (docs/index-streams.md §3). All tensors
/// are 1-D contiguous i32 unless stated.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_decode_streams_args {
    /// sizeof(unikv_decode_streams_args).
    pub struct_size: usize,
    /// `[>= num_tokens]`: request of each token; negative = CUDA-graph padding.
    pub batch_id: unikv_tensor,
    /// `[requests]`: slot of each request.
    pub req_slots: unikv_tensor,
    /// `[>= num_tokens]`: absolute position of each token (MTP verify tokens of
    /// one request have consecutive positions and each get their own slice).
    pub positions: unikv_tensor,
    /// Optional `[>= num_tokens, W]` (row stride >= W): compressed page index of
    /// each token's c128 entries, -1 after the valid ones.
    pub c128_page_indices: unikv_tensor,
    /// Outputs. indptrs `[>= num_tokens + 1]`; index capacities at least
    /// num_tokens * window (SWA), num_tokens * (window + W) (HCA) and
    /// num_tokens * (window + csa_topk) (CSA). The SWA stream is always
    /// required; the HCA stream only when the pool has ratio-128 layers and
    /// the CSA stream only when it has ratio-4 layers: otherwise both of its
    /// tensors may be absent (NULL data), and `csa_topk` is then ignored.
    pub swa_indptr: unikv_tensor,
    /// SWA stream indices (pool rows of each token's window).
    pub swa_indices: unikv_tensor,
    /// HCA (ratio-128 layers) stream offsets.
    pub hca_indptr: unikv_tensor,
    /// HCA stream indices: the window, then the c128 rows.
    pub hca_indices: unikv_tensor,
    /// CSA (ratio-4 layers) stream offsets, sized for `csa_topk` tail entries.
    pub csa_indptr: unikv_tensor,
    /// CSA stream indices: the window here; `unikv_fill_csa_tail` adds each
    /// layer's top-k rows after it.
    pub csa_indices: unikv_tensor,
    /// Tokens of this forward.
    pub num_tokens: u32,
    /// The indexer's top-k (512 or 1024 in production).
    pub csa_topk: u32,
}

unsafe impl Versioned for unikv_decode_streams_args {
    const NAME: &'static str = "args";
}

/// Arguments of `unikv_fill_csa_tail` (docs/index-streams.md §4).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_csa_tail_args {
    /// sizeof(unikv_csa_tail_args).
    pub struct_size: usize,
    /// `[>= num_tokens]` i32 request of each token; negative = padding.
    pub batch_id: unikv_tensor,
    /// `[>= num_tokens]` i32 absolute position of each token.
    pub positions: unikv_tensor,
    /// `[>= num_tokens, W]`: this layer's top-k compressed page indices,
    /// front-packed, -1 after the valid ones.
    pub csa_page_indices: unikv_tensor,
    /// The CSA stream from `unikv_build_decode_streams`; indices are updated in place.
    pub csa_indptr: unikv_tensor,
    /// CSA indices from `unikv_build_decode_streams`, updated in place.
    pub csa_indices: unikv_tensor,
    /// Tokens of this forward.
    pub num_tokens: u32,
    /// Must be 0.
    pub reserved: u32,
}

unsafe impl Versioned for unikv_csa_tail_args {
    const NAME: &'static str = "args";
}

/// Arguments of `unikv_build_prefill_streams` (docs/index-streams.md §5).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_prefill_streams_args {
    /// sizeof(unikv_prefill_streams_args).
    pub struct_size: usize,
    /// `[>= num_tokens]`: request of each token; negative = padding.
    pub batch_id: unikv_tensor,
    /// `[requests]`: slot of each request.
    pub req_slots: unikv_tensor,
    /// `[>= num_tokens]`: absolute position of each token.
    pub positions: unikv_tensor,
    /// `[requests]`: position of each request's first token in this chunk.
    pub chunk_start: unikv_tensor,
    /// `[requests]`: row of each request's first chunk token in the extend K tensor.
    pub extend_start: unikv_tensor,
    /// `[>= num_tokens, W]` page-index table of the layer's ratio (c128 table
    /// for 128, this layer's top-k table for 4); ignored for ratio 0.
    pub page_indices: unikv_tensor,
    /// Outputs: prefix stream into the pool (capacity num_tokens * (window + W)),
    /// extend stream into the chunk's K rows (capacity num_tokens * window).
    pub prefix_indptr: unikv_tensor,
    /// Prefix stream indices (rows of the pool layer).
    pub prefix_indices: unikv_tensor,
    /// Extend stream offsets `[>= num_tokens + 1]`.
    pub extend_indptr: unikv_tensor,
    /// Extend stream indices (rows of the chunk's K tensor).
    pub extend_indices: unikv_tensor,
    /// Tokens of this chunk.
    pub num_tokens: u32,
    /// 0, 4 or 128: which layer kind the streams are for.
    pub compress_ratio: u32,
}

unsafe impl Versioned for unikv_prefill_streams_args {
    const NAME: &'static str = "args";
}

/// Builds the SWA, HCA and CSA decode streams once per forward: the three
/// indptrs, the SWA and HCA indices, and the SWA part of each CSA slice. Each
/// slice is [window rows oldest to newest | compressed rows in table order];
/// padding tokens get empty slices; no -1 or out-of-range row is ever written.
/// Tensors are in the context's memory; `args` is host memory. Runs on
/// `stream`. Device values: checked on the CPU backend (OUT_OF_RANGE, nothing
/// written); GPU backends clamp. No in-place use: the outputs may not overlap
/// each other or an input (UNIKV_OVERLAPPING_BUFFERS). Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_build_decode_streams(
    pool: *const unikv_pool,
    args: *const unikv_decode_streams_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let pool = pool_of(pool)?;
        let a = read_params(args, std::mem::zeroed())?;
        let raw = DecodeStreamsRaw {
            num_tokens: a.num_tokens as usize,
            csa_topk: a.csa_topk,
            batch_id: (&a.batch_id).into(),
            req_slots: (&a.req_slots).into(),
            positions: (&a.positions).into(),
            c128_page_indices: (&a.c128_page_indices).into(),
            swa_indptr: (&a.swa_indptr).into(),
            swa_indices: (&a.swa_indices).into(),
            hca_indptr: (&a.hca_indptr).into(),
            hca_indices: (&a.hca_indices).into(),
            csa_indptr: (&a.csa_indptr).into(),
            csa_indices: (&a.csa_indices).into(),
        };
        index::build_decode_streams(pool, &raw, Stream(stream))
    })
}

/// Writes one ratio-4 layer's top-k rows into the CSA slices after their SWA
/// entries. Call once per CSA layer after its indexer ran. A -1 inside a
/// token's top-k length, or a page index past the compressed rows, is
/// OUT_OF_RANGE on the CPU backend. Memory and stream as above; `csa_indices`,
/// updated in place, may not overlap the other arguments
/// (UNIKV_OVERLAPPING_BUFFERS). Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_fill_csa_tail(
    pool: *const unikv_pool,
    args: *const unikv_csa_tail_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let pool = pool_of(pool)?;
        let a = read_params(args, std::mem::zeroed())?;
        ensure!(a.reserved == 0, InvalidArgument, "args.reserved: must be 0");
        let raw = CsaTailRaw {
            num_tokens: a.num_tokens as usize,
            batch_id: (&a.batch_id).into(),
            positions: (&a.positions).into(),
            csa_page_indices: (&a.csa_page_indices).into(),
            csa_indptr: (&a.csa_indptr).into(),
            csa_indices: (&a.csa_indices).into(),
        };
        index::fill_csa_tail(pool, &raw, Stream(stream))
    })
}

/// Builds one layer kind's prefill streams: prefix = ring rows of the window
/// part before this chunk then compressed rows; extend = rows of the chunk's own
/// K tensor inside the causal window. Memory, stream, validation and overlap
/// as above. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_build_prefill_streams(
    pool: *const unikv_pool,
    args: *const unikv_prefill_streams_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let pool = pool_of(pool)?;
        let a = read_params(args, std::mem::zeroed())?;
        let raw = PrefillStreamsRaw {
            num_tokens: a.num_tokens as usize,
            compress_ratio: a.compress_ratio,
            batch_id: (&a.batch_id).into(),
            req_slots: (&a.req_slots).into(),
            positions: (&a.positions).into(),
            chunk_start: (&a.chunk_start).into(),
            extend_start: (&a.extend_start).into(),
            page_indices: (&a.page_indices).into(),
            prefix_indptr: (&a.prefix_indptr).into(),
            prefix_indices: (&a.prefix_indices).into(),
            extend_indptr: (&a.extend_indptr).into(),
            extend_indices: (&a.extend_indices).into(),
        };
        index::build_prefill_streams(pool, &raw, Stream(stream))
    })
}
