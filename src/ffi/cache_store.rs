//! Cache store entry points: quantize-and-store into the FlashMLA FP8 KV
//! cache and the indexer key cache (docs/fp8.md §2, §5, §6), and into scaled
//! FP8 rows (docs/fp8.md §8). The caches are caller-owned buffers, not pool
//! layers.

use std::os::raw::c_void;

use crate::backend::Stream;
use crate::error::ensure;
use crate::ffi::boundary::{boundary, read_params, Versioned};
use crate::ffi::context::{context, unikv_context};
use crate::ffi::status::unikv_status;
use crate::ffi::types::unikv_tensor;
use crate::ops::cache_store::{self, CacheStoreRaw, ScaledStoreRaw};

/// Arguments of `unikv_store_flashmla`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_store_flashmla_args {
    /// sizeof(unikv_store_flashmla_args).
    pub struct_size: usize,
    /// The cache, `[num_pages, bytes_per_page]` UNIKV_DTYPE_U8, 16-byte aligned,
    /// row stride exactly bytes_per_page = ceil(584 * page_size / 576) * 576
    /// (1 728, 37 440 or 149 760 bytes for page sizes 2, 64, 256). A page holds
    /// page_size value slots of 576 bytes (448 FP8 codes of dims 0..448, then
    /// dims 448..512 as bf16), then page_size scale slots of 8 bytes (one UE8M0
    /// byte per 64-dim tile, then a padding byte that is never written), then
    /// padding that is never written.
    pub cache: unikv_tensor,
    /// Final (normed, rotated) latent rows `[>= num_tokens, 512]` bf16, rows
    /// 16-byte aligned.
    pub kv: unikv_tensor,
    /// `[>= num_tokens]` int32 or int64: the flat location of each row
    /// (page = loc / page_size, slot = loc % page_size); negative = skip.
    pub loc: unikv_tensor,
    /// Tokens per page: 2, 64 or 256.
    pub page_size: u32,
    /// UNIKV_DTYPE_FP8_E4M3FN or UNIKV_DTYPE_FP8_E4M3FNUZ: the codes' flavour
    /// (the reader must use the same). Each tile's scale is the smallest power
    /// of two not below max(amax, 1e-4) / 448 (fn) or / 240 (fnuz).
    pub cache_dtype: u32,
    /// Rows to store.
    pub num_tokens: u32,
    /// Must be 0.
    pub reserved: u32,
}

unsafe impl Versioned for unikv_store_flashmla_args {
    const NAME: &'static str = "args";
}

/// Arguments of `unikv_store_indexer`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_store_indexer_args {
    /// sizeof(unikv_store_indexer_args).
    pub struct_size: usize,
    /// The cache, `[num_pages, 132 * page_size]` UNIKV_DTYPE_U8, 16-byte
    /// aligned, row stride exactly 132 * page_size bytes: page_size keys of 128
    /// FP8 codes, then page_size fp32 scales (little-endian).
    pub cache: unikv_tensor,
    /// Indexer keys `[>= num_tokens, 128]`, bf16 or f32 (quantized from f32
    /// either way; bf16 widens exactly), rows 16-byte aligned.
    pub key: unikv_tensor,
    /// `[>= num_tokens]` int32 or int64: the flat location of each key;
    /// negative = skip.
    pub loc: unikv_tensor,
    /// Keys per page: 64.
    pub page_size: u32,
    /// UNIKV_DTYPE_FP8_E4M3FN or UNIKV_DTYPE_FP8_E4M3FNUZ. The scale is
    /// max(amax, 1e-4) / 448 (fn) or / 240 (fnuz), codes are x * (1 / scale).
    pub cache_dtype: u32,
    /// Keys to store.
    pub num_tokens: u32,
    /// Must be 0.
    pub reserved: u32,
}

unsafe impl Versioned for unikv_store_indexer_args {
    const NAME: &'static str = "args";
}

/// Quantizes row t of `kv` into the FlashMLA FP8 KV cache at location
/// `loc[t]` (docs/fp8.md §2, §5): 7 tiles of 64 dims as FP8 codes with
/// one UE8M0 scale each, rounded to nearest even with saturation (NaN stays
/// NaN), the 64 RoPE dims copied as bf16. Byte offsets are 64-bit (caches
/// may exceed 4 GiB). Tensors are in the context's memory; `args` is host
/// memory read during the call. Runs on `stream` (ignored by the CPU backend).
/// Device values: the CPU backend (and GPU backends in `validate` mode) checks
/// every location: OUT_OF_RANGE past the cache's num_pages * page_size slots,
/// INVALID_ARGUMENT for two tokens aimed at one location, nothing written.
/// Otherwise GPU backends skip a location past the cache, and two tokens at one
/// location leave that slot's bytes unspecified. No in-place use: `kv` and
/// `loc` may not overlap the cache (UNIKV_OVERLAPPING_BUFFERS). Thread-safe
/// for stores to disjoint locations.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_store_flashmla(
    ctx: *const unikv_context,
    args: *const unikv_store_flashmla_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        let a = read_params(args, std::mem::zeroed())?;
        ensure!(a.reserved == 0, InvalidArgument, "args.reserved: must be 0");
        let raw = CacheStoreRaw {
            cache: (&a.cache).into(),
            rows: (&a.kv).into(),
            loc: (&a.loc).into(),
            page_size: a.page_size,
            cache_dtype: a.cache_dtype,
            num_tokens: a.num_tokens as usize,
        };
        cache_store::store_flashmla(ctx, &raw, Stream(stream))
    })
}

/// Quantizes key t into the indexer key cache at location `loc[t]` (see
/// docs/fp8.md §3, §6): 128 FP8 codes and one fp32 scale per key. Memory,
/// stream, device-value, overlap and thread-safety rules as
/// `unikv_store_flashmla`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_store_indexer(
    ctx: *const unikv_context,
    args: *const unikv_store_indexer_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        let a = read_params(args, std::mem::zeroed())?;
        ensure!(a.reserved == 0, InvalidArgument, "args.reserved: must be 0");
        let raw = CacheStoreRaw {
            cache: (&a.cache).into(),
            rows: (&a.key).into(),
            loc: (&a.loc).into(),
            page_size: a.page_size,
            cache_dtype: a.cache_dtype,
            num_tokens: a.num_tokens as usize,
        };
        cache_store::store_indexer(ctx, &raw, Stream(stream))
    })
}

/// Arguments of `unikv_store_scaled_fp8`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_store_scaled_fp8_args {
    /// sizeof(unikv_store_scaled_fp8_args).
    pub struct_size: usize,
    /// The codes, `[rows, 512]` UNIKV_DTYPE_U8, 16-byte aligned rows: dim d
    /// of a row as an FP8 code of `cache_dtype`.
    pub codes: unikv_tensor,
    /// The scales, `[rows, 8]` UNIKV_DTYPE_F32 (the rows of `codes`), 16-byte
    /// aligned rows: scale k of a row multiplies its dims 64k..64k+63.
    pub scales: unikv_tensor,
    /// Final (normed, rotated) latent rows `[>= num_tokens, 512]` bf16, rows
    /// 16-byte aligned.
    pub kv: unikv_tensor,
    /// `[>= num_tokens]` int32 or int64: the row each latent is stored to;
    /// negative = skip.
    pub loc: unikv_tensor,
    /// UNIKV_DTYPE_FP8_E4M3FN or UNIKV_DTYPE_FP8_E4M3FNUZ: the codes' flavour.
    pub cache_dtype: u32,
    /// The FP8 maximum each tile's amax is divided by: 0 for the flavour's
    /// own (448 for e4m3fn, 240 for e4m3fnuz), or 448, 240 or 224 (what
    /// sglang's HIP C++ kernels use for e4m3fnuz) up to that maximum; other
    /// values are UNIKV_INVALID_ARGUMENT.
    pub scale_divisor: u32,
    /// Rows to store.
    pub num_tokens: u32,
    /// Must be 0.
    pub reserved: u32,
}

unsafe impl Versioned for unikv_store_scaled_fp8_args {
    const NAME: &'static str = "args";
}

/// Quantizes row t of `kv` into scaled FP8 rows at row `loc[t]`
/// (docs/fp8.md §8), the layout `UNIKV_KV_LAYOUT_SCALED_FP8` attention reads:
/// per 64-dim tile k, `scale_k = max(amax, 1e-4) / scale_divisor` (fp32
/// division, amax ignoring NaN) is stored in `scales`, and each dim's code is
/// `encode(x * (1 / scale_k))`, rounded to nearest even with saturation (NaN
/// stays NaN; an infinite dim makes its tile's scale Inf, its own code NaN and
/// the others zero). Tensors are in the context's memory; `args` is host
/// memory read during the call. Runs on `stream` (ignored by the CPU backend).
/// Device values: the CPU backend (and GPU backends in `validate` mode)
/// checks every row: OUT_OF_RANGE past the rows of `codes`, INVALID_ARGUMENT
/// for two latents aimed at one row, nothing written. Otherwise GPU backends
/// skip a row past the end, and two latents at one row leave its bytes
/// unspecified. No in-place use: `kv` and `loc` may not overlap `codes` or
/// `scales`, nor those each other (UNIKV_OVERLAPPING_BUFFERS). Thread-safe
/// for stores to disjoint rows.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_store_scaled_fp8(
    ctx: *const unikv_context,
    args: *const unikv_store_scaled_fp8_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        let a = read_params(args, std::mem::zeroed())?;
        ensure!(a.reserved == 0, InvalidArgument, "args.reserved: must be 0");
        let raw = ScaledStoreRaw {
            codes: (&a.codes).into(),
            scales: (&a.scales).into(),
            rows: (&a.kv).into(),
            loc: (&a.loc).into(),
            cache_dtype: a.cache_dtype,
            scale_divisor: a.scale_divisor,
            num_tokens: a.num_tokens as usize,
        };
        cache_store::store_scaled_fp8(ctx, &raw, Stream(stream))
    })
}
