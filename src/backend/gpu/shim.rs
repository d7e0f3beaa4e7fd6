//! `extern "C"` declarations of the kernel shim (kernels/shim.cu and friends)
//! and `#[repr(C)]` mirrors of kernels/params.h. Sizes are checked against the
//! C side when the backend starts, every field's offset by tests/param_layout.rs.

use std::os::raw::{c_char, c_int, c_void};

pub const SHIM_OK: c_int = 0;
pub const SHIM_FATAL: c_int = 2;
pub const SHIM_OUT_OF_MEMORY: c_int = 3;
pub const SHIM_UNAVAILABLE: c_int = 4;
pub const SHIM_INVALID: c_int = 5;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PoolRows {
    pub data: *mut c_void,
    pub rope: *mut c_void,
    pub fp8: i32,
    pub fp8_format: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StoreSwaParams {
    pub kv: *const c_void,
    pub batch_id: *const i32,
    pub req_slots: *const i32,
    pub positions: *const i32,
    pub final_pos: *const i32,
    pub pool: PoolRows,
    pub kv_stride: i64,
    pub pool_rows: i64,
    pub num_tokens: i32,
    pub num_requests: i32,
    pub window: i32,
    pub ring: i32,
    pub num_slots: i32,
    pub reserved: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StoreCompressedParams {
    pub kv: *const c_void,
    pub loc: *const i32,
    pub pool: PoolRows,
    pub kv_stride: i64,
    pub swa_rows: i64,
    pub compressed_rows: i64,
    pub num_rows: i32,
    pub reserved: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CacheStoreParams {
    pub rows: *const c_void,
    pub loc: *const c_void,
    pub cache: *mut u8,
    pub row_stride: i64,
    pub bytes_per_page: i64,
    pub token_slots: i64,
    pub num_tokens: i64,
    pub page_shift: i32,
    pub format: u32,
    pub loc_i64: i32,
    pub rows_f32: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ScaledStoreParams {
    pub rows: *const c_void,
    pub loc: *const c_void,
    pub codes: *mut u8,
    pub scales: *mut f32,
    pub row_stride: i64,
    pub codes_stride: i64,
    pub scales_stride: i64,
    pub num_rows: i64,
    pub num_tokens: i64,
    pub divisor: f32,
    pub format: u32,
    pub loc_i64: i32,
    pub reserved: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PrepareQkvParams {
    pub q_in: *const c_void,
    pub q_out: *mut c_void,
    pub kv_in: *const c_void,
    pub kv_weight: *const c_void,
    pub kv_out: *mut c_void,
    pub rope_table: *const f32,
    pub positions: *const c_void,
    pub rows: *const c_void,
    pub pool: PoolRows,
    pub q_in_stride_token: i64,
    pub q_in_stride_head: i64,
    pub q_out_stride_token: i64,
    pub q_out_stride_head: i64,
    pub kv_in_stride: i64,
    pub kv_out_stride: i64,
    pub table_stride: i64,
    pub max_pos: i64,
    pub pool_rows: i64,
    pub num_tokens: i32,
    pub num_heads: i32,
    pub q_eps: f32,
    pub kv_eps: f32,
    pub positions_i64: i32,
    pub rows_i64: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StreamOut {
    pub indptr: *mut i32,
    pub indices: *mut i32,
    pub capacity: i64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DecodeStreamsParams {
    pub batch_id: *const i32,
    pub req_slots: *const i32,
    pub positions: *const i32,
    pub c128: *const i32,
    pub swa: StreamOut,
    pub hca: StreamOut,
    pub csa: StreamOut,
    pub c128_stride: i64,
    pub c128_width: i32,
    pub num_tokens: i32,
    pub num_requests: i32,
    pub window: i32,
    pub ring: i32,
    pub num_slots: i32,
    pub swa_rows: i32,
    pub hca_rows: i32,
    pub csa_topk: i32,
    pub reserved: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CsaTailParams {
    pub batch_id: *const i32,
    pub positions: *const i32,
    pub table: *const i32,
    pub indptr: *const i32,
    pub indices: *mut i32,
    pub table_stride: i64,
    pub capacity: i64,
    pub width: i32,
    pub num_tokens: i32,
    pub window: i32,
    pub swa_rows: i32,
    pub csa_rows: i32,
    pub reserved: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PrefillStreamsParams {
    pub batch_id: *const i32,
    pub req_slots: *const i32,
    pub positions: *const i32,
    pub chunk_start: *const i32,
    pub extend_start: *const i32,
    pub table: *const i32,
    pub prefix: StreamOut,
    pub extend: StreamOut,
    pub table_stride: i64,
    pub width: i32,
    pub ratio: i32,
    pub num_tokens: i32,
    pub num_requests: i32,
    pub window: i32,
    pub ring: i32,
    pub num_slots: i32,
    pub swa_rows: i32,
    pub compressed_rows: i32,
    pub reserved: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvSource {
    pub kv: PoolRows,
    pub indices: *const i32,
    pub indptr: *const i32,
    pub kv_stride: i64,
    pub rows: i64,
    pub capacity: i64,
    pub scales: *const f32,
    pub scales_stride: i64,
    pub layout: i32,
    pub page_shift: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AttentionParams {
    pub q: *const c_void,
    pub out: *mut c_void,
    pub lse: *mut f32,
    pub sink: *const f32,
    pub workspace: *mut c_void,
    pub src: [KvSource; 2],
    pub q_stride_token: i64,
    pub q_stride_head: i64,
    pub out_stride_token: i64,
    pub out_stride_head: i64,
    pub lse_stride_token: i64,
    pub workspace_bytes: i64,
    pub num_sources: i32,
    pub num_tokens: i32,
    pub num_heads: i32,
    pub skip_negative: i32,
    pub softmax_scale: f32,
    pub reserved: i32,
    pub rope_table: *const f32,
    pub positions: *const c_void,
    pub rope_rows: i64,
    pub positions_i64: i32,
    pub reserved2: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MergeParams {
    pub parts_out: *const c_void,
    pub parts_lse: *const f32,
    pub sink: *const f32,
    pub out: *mut c_void,
    pub lse: *mut f32,
    pub part_stride_out: i64,
    pub part_stride_lse: i64,
    pub out_stride_token: i64,
    pub out_stride_head: i64,
    pub in_stride_token: i64,
    pub in_stride_head: i64,
    pub lse_stride_token: i64,
    pub in_lse_stride_token: i64,
    pub num_parts: i32,
    pub num_tokens: i32,
    pub num_heads: i32,
    pub reserved: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionPlan {
    pub max_tokens: i32,
    pub num_heads: i32,
    pub head_blocks: i32,
    pub block_m_tiles: i32,
    pub sm_count: i32,
    pub max_splits: i32,
    pub workspace_bytes: i64,
    pub dependent_launch: i32,
    pub stages: i32,
    pub wgmma: i32,
    pub cluster: i32,
    pub kv_fp8: i32,
    pub portable: i32,
    pub pair: i32,
    pub long_splits: i32,
    pub long_keys: i32,
    pub reserved: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Fp8CheckParams {
    pub x: *const f32,
    pub sw: *mut u8,
    pub hw: *mut u8,
    pub scale: *mut u8,
    pub decoded: *mut f32,
    pub n: i64,
    pub format: u32,
    pub reserved: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct InverseRopeParams {
    pub x: *mut c_void,
    pub positions: *const c_void,
    pub table: *const f32,
    pub x_stride_token: i64,
    pub x_stride_head: i64,
    pub table_stride: i64,
    pub max_pos: i64,
    pub num_tokens: i64,
    pub num_heads: i64,
    pub positions_i64: i32,
    pub reserved: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HashTopkParams {
    pub logits: *const f32,
    pub input_ids: *const c_void,
    pub tid2eid: *const i32,
    pub weights: *mut f32,
    pub ids: *mut i32,
    pub num_real: *const c_void,
    pub logits_stride: i64,
    pub table_stride: i64,
    pub weights_stride: i64,
    pub ids_stride: i64,
    pub vocab: i64,
    pub num_tokens: i32,
    pub num_experts: i32,
    pub routed: i32,
    pub shared: i32,
    pub num_real_host: i32,
    pub input_ids_i64: i32,
    pub num_real_i64: i32,
    pub routed_scaling_factor: f32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IndexerQParams {
    pub q: *const c_void,
    pub weights: *const c_void,
    pub table: *const f32,
    pub positions: *const c_void,
    pub q_fp8: *mut u8,
    pub weights_out: *mut f32,
    pub q_stride_token: i64,
    pub q_stride_head: i64,
    pub out_stride_token: i64,
    pub out_stride_head: i64,
    pub weights_stride: i64,
    pub weights_out_stride: i64,
    pub table_stride: i64,
    pub max_pos: i64,
    pub num_tokens: i32,
    pub num_heads: i32,
    pub positions_i64: i32,
    pub format: u32,
    pub weight_scale: f32,
    pub reserved: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IndexerKParams {
    pub key: *const c_void,
    pub norm_weight: *const c_void,
    pub table: *const f32,
    pub positions: *const c_void,
    pub loc: *const c_void,
    pub cache: *mut u8,
    pub key_stride: i64,
    pub table_stride: i64,
    pub max_pos: i64,
    pub bytes_per_page: i64,
    pub token_slots: i64,
    pub page_shift: i32,
    pub num_tokens: i32,
    pub key_f32: i32,
    pub positions_i64: i32,
    pub loc_i64: i32,
    pub format: u32,
    pub eps: f32,
    pub reserved: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IndexerTopkParams {
    pub q_fp8: *const u8,
    pub weights: *const f32,
    pub cache: *const u8,
    pub page_table: *const i32,
    pub batch_id: *const i32,
    pub positions: *const c_void,
    pub logits: *mut f32,
    pub topk_indices: *mut i32,
    pub q_stride_token: i64,
    pub q_stride_head: i64,
    pub weights_stride: i64,
    pub page_table_stride: i64,
    pub logits_stride: i64,
    pub topk_stride: i64,
    pub bytes_per_page: i64,
    pub cache_pages: i64,
    pub requests: i32,
    pub max_pages: i32,
    pub logits_width: i32,
    pub topk_width: i32,
    pub num_tokens: i32,
    pub num_heads: i32,
    pub topk: i32,
    pub positions_i64: i32,
    pub format: u32,
    pub score: i32,
    pub csa_indices: *mut i32,
    pub csa_indptr: *const i32,
    pub csa_capacity: i64,
    pub csa_window: i32,
    pub csa_row_base: i32,
    pub csa_rows: i32,
    pub csa_reserved: i32,
}

/// (index passed to `unikv_gpu_params_size`, Rust size) of every mirrored struct.
pub const MIRRORS: &[(c_int, usize, &str)] = &[
    (0, std::mem::size_of::<StoreSwaParams>(), "StoreSwaParams"),
    (
        1,
        std::mem::size_of::<StoreCompressedParams>(),
        "StoreCompressedParams",
    ),
    (
        2,
        std::mem::size_of::<DecodeStreamsParams>(),
        "DecodeStreamsParams",
    ),
    (3, std::mem::size_of::<CsaTailParams>(), "CsaTailParams"),
    (
        4,
        std::mem::size_of::<PrefillStreamsParams>(),
        "PrefillStreamsParams",
    ),
    (5, std::mem::size_of::<AttentionParams>(), "AttentionParams"),
    (6, std::mem::size_of::<MergeParams>(), "MergeParams"),
    (7, std::mem::size_of::<AttentionPlan>(), "AttentionPlan"),
    (8, std::mem::size_of::<Fp8CheckParams>(), "Fp8CheckParams"),
    (
        9,
        std::mem::size_of::<InverseRopeParams>(),
        "InverseRopeParams",
    ),
    (
        10,
        std::mem::size_of::<CacheStoreParams>(),
        "CacheStoreParams",
    ),
    (
        11,
        std::mem::size_of::<PrepareQkvParams>(),
        "PrepareQkvParams",
    ),
    (12, std::mem::size_of::<HashTopkParams>(), "HashTopkParams"),
    (13, std::mem::size_of::<IndexerQParams>(), "IndexerQParams"),
    (14, std::mem::size_of::<IndexerKParams>(), "IndexerKParams"),
    (
        15,
        std::mem::size_of::<IndexerTopkParams>(),
        "IndexerTopkParams",
    ),
    (
        16,
        std::mem::size_of::<ScaledStoreParams>(),
        "ScaledStoreParams",
    ),
    (17, std::mem::size_of::<CompressParams>(), "CompressParams"),
    (
        18,
        std::mem::size_of::<CompressClearParams>(),
        "CompressClearParams",
    ),
];

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CompressParams {
    pub kv_score: *const c_void,
    pub ape: *const f32,
    pub norm_weight: *const c_void,
    pub rope_table: *const f32,
    pub batch_id: *const i32,
    pub req_slots: *const i32,
    pub positions: *const c_void,
    pub loc: *const c_void,
    pub state: *mut f32,
    pub cache: *mut u8,
    pub pool: PoolRows,
    pub kv_stride: i64,
    pub ape_stride: i64,
    pub table_stride: i64,
    pub max_pos: i64,
    pub capacity: i64,
    pub swa_rows: i64,
    pub bytes_per_page: i64,
    pub page_shift: i32,
    pub num_tokens: i32,
    pub num_requests: i32,
    pub num_slots: i32,
    pub ring: i32,
    pub ratio: i32,
    pub dim: i32,
    pub target: i32,
    pub prefill: i32,
    pub kv_f32: i32,
    pub weight_f32: i32,
    pub positions_i64: i32,
    pub loc_i64: i32,
    pub format: u32,
    pub eps: f32,
    pub reserved: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CompressClearParams {
    pub rows: *mut f32,
    pub num_rows: i64,
    pub row_floats: i32,
    pub reserved: i32,
}

extern "C" {
    pub fn unikv_gpu_last_error() -> *const c_char;
    pub fn unikv_gpu_params_size(which: c_int) -> usize;
    pub fn unikv_gpu_device_count(count: *mut c_int) -> c_int;
    /// Reads what launch paths ask about the device, before any capture.
    pub fn unikv_gpu_open_device(device: c_int) -> c_int;
    pub fn unikv_gpu_malloc(device: c_int, bytes: usize, out: *mut *mut c_void) -> c_int;
    pub fn unikv_gpu_free(device: c_int, ptr: *mut c_void) -> c_int;
    pub fn unikv_gpu_memcpy_async(
        device: c_int,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: c_int,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_memset_async(
        device: c_int,
        ptr: *mut c_void,
        value: c_int,
        bytes: usize,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_stream_synchronize(device: c_int, stream: *mut c_void) -> c_int;
    pub fn unikv_gpu_store_swa(
        device: c_int,
        p: *const StoreSwaParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_store_compressed(
        device: c_int,
        p: *const StoreCompressedParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_store_flashmla(
        device: c_int,
        p: *const CacheStoreParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_store_scaled_fp8(
        device: c_int,
        p: *const ScaledStoreParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_store_indexer(
        device: c_int,
        p: *const CacheStoreParams,
        stream: *mut c_void,
    ) -> c_int;
    /// `iq`: the indexer query preparation run in the same launch, or NULL.
    pub fn unikv_gpu_prepare_qkv(
        device: c_int,
        p: *const PrepareQkvParams,
        iq: *const IndexerQParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_indexer_prepare_q(
        device: c_int,
        p: *const IndexerQParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_indexer_prepare_k(
        device: c_int,
        p: *const IndexerKParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_compress(
        device: c_int,
        p: *const CompressParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_compress_clear(
        device: c_int,
        p: *const CompressClearParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_indexer_topk(
        device: c_int,
        p: *const IndexerTopkParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_hash_topk(
        device: c_int,
        p: *const HashTopkParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_build_decode_streams(
        device: c_int,
        p: *const DecodeStreamsParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_fill_csa_tail(
        device: c_int,
        p: *const CsaTailParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_build_prefill_streams(
        device: c_int,
        p: *const PrefillStreamsParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_attention_plan(
        device: c_int,
        max_tokens: c_int,
        num_heads: c_int,
        kv_fp8: c_int,
        plan: *mut AttentionPlan,
    ) -> c_int;
    pub fn unikv_gpu_merge(device: c_int, p: *const MergeParams, stream: *mut c_void) -> c_int;
    pub fn unikv_gpu_inverse_rope(
        device: c_int,
        p: *const InverseRopeParams,
        stream: *mut c_void,
    ) -> c_int;
    /// Plans created afterwards on the calling thread skip the cluster merge
    /// and/or the wgmma kernel (test hook; see ffi::test_hooks).
    #[cfg(feature = "test-hooks")]
    pub fn unikv_gpu_test_plan_fallbacks(no_cluster: c_int, no_wgmma: c_int);
    /// Plans created afterwards on the calling thread use the portable
    /// kernel's scalar (1) or matrix (2) variant, or their own choice (0)
    /// (test hook; see ffi::test_hooks).
    #[cfg(feature = "test-hooks")]
    pub fn unikv_gpu_test_plan_portable(variant: c_int);
    /// The indexer score kernel on this thread: the launch's own choice (0),
    /// CUDA cores (1) or f16 mma.sync (2) (test hook; see ffi::test_hooks).
    #[cfg(feature = "test-hooks")]
    pub fn unikv_gpu_test_indexer_score_kernel(kernel: c_int);
    /// The device FP8 codec on `p.n` values (test hook; see ffi::test_hooks).
    #[cfg(feature = "test-hooks")]
    pub fn unikv_gpu_fp8_check(
        device: c_int,
        p: *const Fp8CheckParams,
        stream: *mut c_void,
    ) -> c_int;
    pub fn unikv_gpu_attention(
        device: c_int,
        plan: *const AttentionPlan,
        p: *const AttentionParams,
        stream: *mut c_void,
    ) -> c_int;
}
