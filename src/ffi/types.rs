//! Plain C types shared by all entry points: tensor descriptors and enums.

use std::os::raw::c_void;

use crate::dtype::DType;
use crate::tensor::{RawTensor, MAX_DIMS};

/// Element types (`unikv_tensor.dtype`, plan and pool dtypes). 0 is not a dtype,
/// so a zero-initialised descriptor is rejected.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum unikv_dtype {
    /// bfloat16 (8 exponent bits, 7 mantissa bits): activations, pool rows,
    /// attention outputs.
    UNIKV_DTYPE_BF16 = 1,
    /// IEEE half precision.
    UNIKV_DTYPE_F16 = 2,
    /// IEEE single precision: sinks, LSEs, RoPE tables, scores.
    UNIKV_DTYPE_F32 = 3,
    /// 32-bit signed integer: indices, indptrs, slots, positions.
    UNIKV_DTYPE_I32 = 4,
    /// 64-bit signed integer: positions and locations where accepted.
    UNIKV_DTYPE_I64 = 5,
    /// Raw bytes: FP8 caches and FP8 code tensors.
    UNIKV_DTYPE_U8 = 6,
    /// OCP FP8 E4M3FN (max 448, NaN 0x7F/0xFF): FP8 pools and caches.
    UNIKV_DTYPE_FP8_E4M3FN = 7,
    /// FP8 E4M3FNUZ (max 240, bias 8, NaN 0x80, no -0; AMD gfx942). Encoded
    /// with 240 as clip bound and scale divisor, so FNUZ pools are not
    /// byte-compatible with those written by sglang's HIP C++ kernels, which
    /// divide by 224.
    UNIKV_DTYPE_FP8_E4M3FNUZ = 8,
}

/// Backends (`unikv_context_options.backend`, `unikv_context_info.backend`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum unikv_backend {
    /// GPU when compiled in and a device is present, else CPU (options only).
    UNIKV_BACKEND_AUTO = 0,
    /// The CPU reference backend (always compiled in).
    UNIKV_BACKEND_CPU = 1,
    /// NVIDIA GPUs through CUDA (the `cuda` build feature).
    UNIKV_BACKEND_CUDA = 2,
    /// AMD GPUs through HIP (the `rocm` build feature).
    UNIKV_BACKEND_ROCM = 3,
    /// Options only: the GPU backend compiled into this build (CUDA or ROCm)
    /// on `device`, required. Unlike AUTO it never falls back to the CPU
    /// backend: `unikv_context_create` returns UNIKV_BACKEND_UNAVAILABLE, with
    /// a message naming `options.backend`, when no GPU backend is compiled in
    /// or no driver or device is present.
    UNIKV_BACKEND_GPU = 4,
}

/// Direction of `unikv_memory_copy`.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum unikv_copy_kind {
    /// From host memory to the context's memory.
    UNIKV_COPY_HOST_TO_DEVICE = 0,
    /// From the context's memory to host memory.
    UNIKV_COPY_DEVICE_TO_HOST = 1,
    /// Within the context's memory.
    UNIKV_COPY_DEVICE_TO_DEVICE = 2,
}

/// A tensor argument: data pointer, element type, rank, and per-axis extents and
/// strides (in elements, not bytes). Layout must be row-major with innermost
/// stride 1; outer strides may include padding. `data` is host memory for the
/// CPU backend and device memory for GPU backends. An optional argument is
/// absent when `data` is NULL.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_tensor {
    /// First element (the context's memory); NULL marks an absent optional
    /// argument.
    pub data: *mut c_void,
    /// A `unikv_dtype` value.
    pub dtype: u32,
    /// Number of used entries in `shape` and `strides` (1..=4).
    pub ndim: u32,
    /// Extent of each of the first `ndim` axes (>= 0); later entries ignored.
    pub shape: [i64; 4],
    /// Stride of each of the first `ndim` axes, in elements: row-major, the
    /// last used one 1 (outer strides may include padding).
    pub strides: [i64; 4],
}

impl Default for unikv_tensor {
    /// An absent optional argument: NULL data, everything else zero.
    fn default() -> Self {
        unikv_tensor {
            data: std::ptr::null_mut(),
            dtype: 0,
            ndim: 0,
            shape: [0; 4],
            strides: [0; 4],
        }
    }
}

impl From<&unikv_tensor> for RawTensor {
    fn from(t: &unikv_tensor) -> Self {
        RawTensor {
            data: t.data as *mut u8,
            dtype: t.dtype,
            ndim: t.ndim,
            shape: t.shape,
            strides: t.strides,
        }
    }
}

const _: () = assert!(MAX_DIMS == 4);
const _: () = assert!(unikv_dtype::UNIKV_DTYPE_BF16 as u32 == DType::Bf16.to_raw());
const _: () = assert!(unikv_dtype::UNIKV_DTYPE_U8 as u32 == DType::U8.to_raw());
const _: () = assert!(unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN as u32 == DType::Fp8E4m3fn.to_raw());
const _: () = assert!(unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ as u32 == DType::Fp8E4m3fnuz.to_raw());
