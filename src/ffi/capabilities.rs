//! What this build of the library supports, asked at run time: backends,
//! compiled GPU targets, dtypes and FP8 formats, shape limits.

use std::os::raw::c_char;

use crate::args::attention::MAX_HEADS;
use crate::backend::cpu::MAX_THREADS;
use crate::cache_layouts::flashmla::NOPE_DIMS;
use crate::cache_layouts::indexer::KEY_DIMS;
use crate::dtype::DType;
use crate::ffi::boundary::{boundary, write_info, Versioned};
use crate::ffi::status::unikv_status;
use crate::ffi::types::unikv_backend;
use crate::geometry::{HEAD_DIM, PAGE_TOKENS};
use crate::ops::indexer::{MAX_SCORE_HEADS, MAX_TOPK};
use crate::rope::ROPE_DIM;
use crate::routing::MAX_SLOTS;
use crate::tensor::MAX_DIMS;

/// The GPU targets the kernels were compiled for, from the build's
/// `UNIKV_CUDA_ARCHS` / `UNIKV_HIP_ARCHS` (empty without a GPU backend).
const GPU_ARCHS: &str = concat!(env!("UNIKV_BUILD_GPU_ARCHS"), "\0");

/// What this build supports (`unikv_get_capabilities`). Bit masks are indexed
/// by enum value: bit `(1u << v)` is set for each supported value `v`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_capabilities {
    /// sizeof(unikv_capabilities), set by the caller.
    pub struct_size: usize,
    /// `unikv_backend` values compiled into this build: UNIKV_BACKEND_CPU
    /// always; UNIKV_BACKEND_CUDA (cargo feature `cuda`) or UNIKV_BACKEND_ROCM
    /// (`rocm`), each with UNIKV_BACKEND_GPU; UNIKV_BACKEND_AUTO always.
    pub backends: u32,
    /// GPU devices the driver reports at the time of the call; 0 without a
    /// GPU backend, a driver or a device (then AUTO gives the CPU backend
    /// and UNIKV_BACKEND_GPU fails with UNIKV_BACKEND_UNAVAILABLE).
    pub gpu_devices: u32,
    /// `unikv_dtype` values a pool's and a plan's `kv_dtype` accept: BF16,
    /// FP8_E4M3FN and FP8_E4M3FNUZ.
    pub kv_dtypes: u32,
    /// `unikv_dtype` values of the FP8 formats the library encodes and
    /// decodes (pools, FlashMLA and indexer caches): FP8_E4M3FN and
    /// FP8_E4M3FNUZ, on every backend.
    pub fp8_formats: u32,
    /// 1 when the CUDA kernels also carry PTX (a CUDA build whose `gpu_archs`
    /// name a portable target such as sm_80, the default), so the driver
    /// compiles them for a GPU newer than every compiled target; such a GPU
    /// then runs the portable kernels, without the sm_90a ones' tensor-core
    /// paths. 0 otherwise: machine code only, and a GPU must be covered by one
    /// of `gpu_archs` (sm_80 code runs on compute capability 8.x and newer
    /// only through PTX; sm_90a code on 9.0 only).
    pub ptx_embedded: u32,
    /// Most local query heads of an attention plan (`num_heads` 1..=this).
    pub max_heads: u32,
    /// The latent row width, the only `head_dim` plans accept (512).
    pub head_dim: u32,
    /// Leading "nope" dims of a latent row (448), quantized in FP8 pools.
    pub nope_dim: u32,
    /// Trailing RoPE dims of a latent row (64), kept in bf16.
    pub rope_dim: u32,
    /// Most entries of a tensor descriptor's shape (`unikv_tensor.ndim`).
    pub max_tensor_dims: u32,
    /// Tokens per page of the caller's page tables (256).
    pub page_tokens: u32,
    /// Most keys `unikv_indexer_topk` selects per token.
    pub max_indexer_topk: u32,
    /// Most indexer heads `unikv_indexer_topk` scores.
    pub max_indexer_heads: u32,
    /// Width of an indexer key / query head (128).
    pub indexer_head_dim: u32,
    /// Most slots (routed + shared) per row of `unikv_hash_topk`.
    pub max_routing_slots: u32,
    /// Most CPU backend worker threads (`unikv_context_options.cpu_threads`).
    pub max_cpu_threads: u32,
    /// Most tokens of a plan (`max_tokens`): 2^31 - 1.
    pub max_tokens: u32,
    /// Zero.
    pub reserved: u32,
    /// Static NUL-terminated, `;`-separated list of the GPU targets the
    /// kernels were compiled for (e.g. "sm_90a;sm_80" or "gfx942;gfx950"),
    /// "" without a GPU backend. Never NULL; do not free.
    pub gpu_archs: *const c_char,
}

unsafe impl Versioned for unikv_capabilities {
    const NAME: &'static str = "caps";
}

fn bit(v: u32) -> u32 {
    1 << v
}

fn backends() -> u32 {
    let mut mask = bit(unikv_backend::UNIKV_BACKEND_AUTO as u32)
        | bit(unikv_backend::UNIKV_BACKEND_CPU as u32);
    if cfg!(feature = "cuda") {
        mask |= bit(unikv_backend::UNIKV_BACKEND_CUDA as u32)
            | bit(unikv_backend::UNIKV_BACKEND_GPU as u32);
    }
    if cfg!(feature = "rocm") {
        mask |= bit(unikv_backend::UNIKV_BACKEND_ROCM as u32)
            | bit(unikv_backend::UNIKV_BACKEND_GPU as u32);
    }
    mask
}

#[cfg(unikv_gpu)]
fn gpu_devices() -> u32 {
    crate::backend::gpu::device_count()
}

#[cfg(not(unikv_gpu))]
fn gpu_devices() -> u32 {
    0
}

/// The capabilities of this build, as `unikv_get_capabilities` reports them.
pub fn capabilities() -> unikv_capabilities {
    let fp8 = bit(DType::Fp8E4m3fn.to_raw()) | bit(DType::Fp8E4m3fnuz.to_raw());
    unikv_capabilities {
        struct_size: std::mem::size_of::<unikv_capabilities>(),
        backends: backends(),
        gpu_devices: gpu_devices(),
        kv_dtypes: bit(DType::Bf16.to_raw()) | fp8,
        fp8_formats: fp8,
        ptx_embedded: u32::from(env!("UNIKV_BUILD_PTX") == "1"),
        max_heads: MAX_HEADS as u32,
        head_dim: HEAD_DIM as u32,
        nope_dim: NOPE_DIMS as u32,
        rope_dim: ROPE_DIM as u32,
        max_tensor_dims: MAX_DIMS as u32,
        page_tokens: PAGE_TOKENS as u32,
        max_indexer_topk: MAX_TOPK as u32,
        max_indexer_heads: MAX_SCORE_HEADS as u32,
        indexer_head_dim: KEY_DIMS as u32,
        max_routing_slots: MAX_SLOTS as u32,
        max_cpu_threads: MAX_THREADS as u32,
        max_tokens: i32::MAX as u32,
        reserved: 0,
        gpu_archs: GPU_ARCHS.as_ptr() as *const c_char,
    }
}

/// Fills `caps` (host memory; set `caps->struct_size` first, as with every
/// info struct: an older, smaller struct gets only the fields it has) with
/// what this build of the library supports: the backends compiled in, the GPU
/// devices present now, the compiled GPU targets, the KV dtypes and FP8
/// formats, and the shape limits the entry points check. Needs no context;
/// may be called before any other function. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_get_capabilities(caps: *mut unikv_capabilities) -> unikv_status {
    boundary(|| write_info(caps, capabilities()))
}
