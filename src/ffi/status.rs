//! Status codes of the C ABI: one stable enum, mapped from core errors in one place.

use crate::error::Error;

/// Result of every fallible call. Values are stable and never reused.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum unikv_status {
    /// Success.
    UNIKV_OK = 0,
    /// A required pointer argument is NULL.
    UNIKV_NULL_ARGUMENT = 1,
    /// A parameter struct's `struct_size` is too small, or unknown trailing fields are set.
    UNIKV_BAD_STRUCT_SIZE = 2,
    /// An enum argument (dtype, backend, ratio, copy kind) has an unknown value.
    UNIKV_BAD_ENUM = 3,
    /// A tensor has the wrong element type.
    UNIKV_BAD_DTYPE = 4,
    /// A tensor has the wrong rank or extents.
    UNIKV_BAD_SHAPE = 5,
    /// A tensor's strides are not row-major with unit innermost stride.
    UNIKV_BAD_STRIDE = 6,
    /// A pointer or stride is not aligned as required.
    UNIKV_BAD_ALIGNMENT = 7,
    /// A buffer, plan, workspace or slot allocator is too small for the request.
    UNIKV_CAPACITY_EXCEEDED = 8,
    /// A value (index, position, slot, layer, indptr entry) is outside its valid range.
    UNIKV_OUT_OF_RANGE = 9,
    /// The object is not in a state that allows the call (slot not acquired,
    /// context unusable after a fatal error).
    UNIKV_INVALID_STATE = 10,
    /// The requested backend is not compiled in or no device is present.
    UNIKV_BACKEND_UNAVAILABLE = 11,
    /// An allocation failed.
    UNIKV_OUT_OF_MEMORY = 12,
    /// The GPU runtime reported an error.
    UNIKV_GPU_ERROR = 13,
    /// An internal error (a caught panic); the context involved becomes unusable.
    UNIKV_INTERNAL = 14,
    /// A scalar argument has an invalid value (zero sizes, non-finite scale, ...).
    UNIKV_INVALID_ARGUMENT = 15,
    /// A handle argument is not a live handle of the expected kind: already
    /// destroyed, a handle of another kind, or a pointer this library never
    /// returned (see "Handles" at the top of the header for what is detected).
    UNIKV_INVALID_HANDLE = 16,
    /// An output buffer overlaps another argument's memory or the pool rows
    /// the call reads or writes (exact in-place use is allowed only where a
    /// function says so).
    UNIKV_OVERLAPPING_BUFFERS = 17,
}

use unikv_status::*;

impl unikv_status {
    /// Every status value in ascending order, as a brace initializer:
    /// `static const uint32_t all[] = UNIKV_STATUS_ALL;` (the header renames
    /// cbindgen's `unikv_status_ALL`, tests/header.rs).
    pub const ALL: [unikv_status; 18] = [
        UNIKV_OK,
        UNIKV_NULL_ARGUMENT,
        UNIKV_BAD_STRUCT_SIZE,
        UNIKV_BAD_ENUM,
        UNIKV_BAD_DTYPE,
        UNIKV_BAD_SHAPE,
        UNIKV_BAD_STRIDE,
        UNIKV_BAD_ALIGNMENT,
        UNIKV_CAPACITY_EXCEEDED,
        UNIKV_OUT_OF_RANGE,
        UNIKV_INVALID_STATE,
        UNIKV_BACKEND_UNAVAILABLE,
        UNIKV_OUT_OF_MEMORY,
        UNIKV_GPU_ERROR,
        UNIKV_INTERNAL,
        UNIKV_INVALID_ARGUMENT,
        UNIKV_INVALID_HANDLE,
        UNIKV_OVERLAPPING_BUFFERS,
    ];

    /// A static, NUL-terminated description.
    pub fn description(self) -> &'static [u8] {
        match self {
            UNIKV_OK => b"ok\0",
            UNIKV_NULL_ARGUMENT => b"null argument\0",
            UNIKV_BAD_STRUCT_SIZE => b"bad struct size\0",
            UNIKV_BAD_ENUM => b"bad enum value\0",
            UNIKV_BAD_DTYPE => b"bad dtype\0",
            UNIKV_BAD_SHAPE => b"bad shape\0",
            UNIKV_BAD_STRIDE => b"bad stride\0",
            UNIKV_BAD_ALIGNMENT => b"bad alignment\0",
            UNIKV_CAPACITY_EXCEEDED => b"capacity exceeded\0",
            UNIKV_OUT_OF_RANGE => b"value out of range\0",
            UNIKV_INVALID_STATE => b"invalid state\0",
            UNIKV_BACKEND_UNAVAILABLE => b"backend unavailable\0",
            UNIKV_OUT_OF_MEMORY => b"out of memory\0",
            UNIKV_GPU_ERROR => b"GPU error\0",
            UNIKV_INTERNAL => b"internal error\0",
            UNIKV_INVALID_ARGUMENT => b"invalid argument\0",
            UNIKV_INVALID_HANDLE => b"invalid handle\0",
            UNIKV_OVERLAPPING_BUFFERS => b"overlapping buffers\0",
        }
    }
}

impl From<&Error> for unikv_status {
    fn from(e: &Error) -> Self {
        match e {
            Error::NullArgument(_) => UNIKV_NULL_ARGUMENT,
            Error::BadStructSize(_) => UNIKV_BAD_STRUCT_SIZE,
            Error::BadEnum(_) => UNIKV_BAD_ENUM,
            Error::BadDtype(_) => UNIKV_BAD_DTYPE,
            Error::BadShape(_) => UNIKV_BAD_SHAPE,
            Error::BadStride(_) => UNIKV_BAD_STRIDE,
            Error::BadAlignment(_) => UNIKV_BAD_ALIGNMENT,
            Error::CapacityExceeded(_) => UNIKV_CAPACITY_EXCEEDED,
            Error::OutOfRange(_) => UNIKV_OUT_OF_RANGE,
            Error::InvalidState(_) => UNIKV_INVALID_STATE,
            Error::InvalidArgument(_) => UNIKV_INVALID_ARGUMENT,
            Error::BackendUnavailable(_) => UNIKV_BACKEND_UNAVAILABLE,
            Error::OutOfMemory(_) => UNIKV_OUT_OF_MEMORY,
            Error::Gpu(_) => UNIKV_GPU_ERROR,
            Error::Internal(_) => UNIKV_INTERNAL,
            Error::InvalidHandle(_) => UNIKV_INVALID_HANDLE,
            Error::Overlap(_) => UNIKV_OVERLAPPING_BUFFERS,
        }
    }
}
