//! Context lifecycle and device memory helpers.

use std::os::raw::c_void;
use std::sync::Arc;

use crate::backend::{BackendKind, CopyKind, Stream};
use crate::context::{BackendChoice, Context, ContextOptions};
use crate::error::{ensure, err, Result};
use crate::ffi::boundary::{
    boundary, enter_context, read_params, write_info, write_out, Versioned,
};
use crate::ffi::handles::{destroy_handle, handle, new_handle, Handle};
use crate::ffi::status::unikv_status;
use crate::ffi::types::unikv_backend;

/// Opaque context handle: one backend bound to one device. Thread-safe: any
/// number of threads may use one context (and the pools and plans made from it)
/// concurrently.
#[allow(non_camel_case_types)]
pub struct unikv_context {
    pub(crate) inner: Arc<Context>,
}

impl Handle for unikv_context {
    const KIND: &'static str = "unikv_context";
}

/// Options of `unikv_context_create`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_context_options {
    /// sizeof(unikv_context_options).
    pub struct_size: usize,
    /// A `unikv_backend` value; AUTO picks the GPU backend when one is compiled in
    /// and a device is present, the CPU backend otherwise.
    pub backend: u32,
    /// Device ordinal of GPU backends (ignored by the CPU backend, must be >= 0).
    pub device: i32,
    /// CPU backend worker threads; 0 = one per available core. At most 1024
    /// (INVALID_ARGUMENT above); OUT_OF_MEMORY when the system cannot start them.
    pub cpu_threads: u32,
    /// Non-zero: before each GPU launch, synchronize and check every value that
    /// lives in device memory (indices, positions, slots), returning a precise
    /// status instead of skipping invalid entries (a debugging mode: launches
    /// then synchronize, so they cannot be captured in a CUDA graph). The CPU
    /// backend always checks.
    pub validate: u32,
}

unsafe impl Versioned for unikv_context_options {
    const NAME: &'static str = "options";
}

/// What a context runs on (`unikv_context_get_info`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_context_info {
    /// sizeof(unikv_context_info), set by the caller.
    pub struct_size: usize,
    /// The `unikv_backend` the context chose and runs on: CPU, CUDA or ROCM,
    /// never AUTO or GPU (which are requests, resolved at creation).
    pub backend: u32,
    /// Device ordinal of a GPU backend (as in the options; 0 on the CPU).
    pub device: i32,
    /// Worker threads of the CPU backend (0 for GPU backends).
    pub cpu_threads: u32,
    /// 1 when the context validates device values before launches, else 0.
    pub validate: u32,
}

unsafe impl Versioned for unikv_context_info {
    const NAME: &'static str = "info";
}

fn backend_choice(raw: u32) -> Result<BackendChoice> {
    Ok(match raw {
        0 => BackendChoice::Auto,
        1 => BackendChoice::Cpu,
        2 => BackendChoice::Cuda,
        3 => BackendChoice::Rocm,
        4 => BackendChoice::Gpu,
        _ => {
            return Err(err!(
                BadEnum,
                "options.backend: unknown backend value {raw}"
            ))
        }
    })
}

pub(crate) fn backend_value(kind: BackendKind) -> unikv_backend {
    match kind {
        BackendKind::Cpu => unikv_backend::UNIKV_BACKEND_CPU,
        BackendKind::Cuda => unikv_backend::UNIKV_BACKEND_CUDA,
        BackendKind::Rocm => unikv_backend::UNIKV_BACKEND_ROCM,
    }
}

/// Context of a handle, recorded so a panic in this call marks it unusable.
///
/// # Safety
/// A non-NULL `ctx` is a live handle.
pub(crate) unsafe fn context<'a>(ctx: *const unikv_context) -> Result<&'a Arc<Context>> {
    let ctx = &handle("ctx", ctx)?.inner;
    enter_context(ctx);
    Ok(ctx)
}

/// Creates a context. `options` is host memory read during the call; `*out`
/// receives a new handle owned by the caller (free with `unikv_context_destroy`).
/// Returns BACKEND_UNAVAILABLE when an explicitly requested backend is not
/// compiled in or has no device. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_context_create(
    options: *const unikv_context_options,
    out: *mut *mut unikv_context,
) -> unikv_status {
    boundary(|| {
        ensure!(!out.is_null(), NullArgument, "out");
        let defaults = unikv_context_options {
            struct_size: 0,
            backend: 0,
            device: 0,
            cpu_threads: 0,
            validate: 0,
        };
        let o = read_params(options, defaults)?;
        let inner = Context::new(&ContextOptions {
            backend: backend_choice(o.backend)?,
            device: o.device,
            cpu_threads: o.cpu_threads as usize,
            validate: o.validate != 0,
        })?;
        out.write(new_handle(unikv_context { inner }));
        Ok(())
    })
}

/// Releases the caller's reference to a context. Pools and plans made from it
/// keep it alive until they are destroyed. NULL is accepted and ignored; a
/// pointer that is not a live context (destroyed already, another kind of
/// handle) is ignored too, and the thread's last error says so. Externally
/// synchronized: no other call may use this handle concurrently.
#[no_mangle]
pub unsafe extern "C" fn unikv_context_destroy(ctx: *mut unikv_context) {
    let _ = boundary(|| destroy_handle("ctx", ctx));
}

/// Reports the backend a context got, its device, worker threads and whether
/// validation is on. `info` is host memory; set `info->struct_size` first.
/// Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_context_get_info(
    ctx: *const unikv_context,
    info: *mut unikv_context_info,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        let cpu_threads = match ctx.kind() {
            BackendKind::Cpu => ctx.backend().worker_threads() as u32,
            _ => 0,
        };
        write_info(
            info,
            unikv_context_info {
                struct_size: 0,
                backend: backend_value(ctx.kind()) as u32,
                device: ctx.device(),
                cpu_threads,
                validate: ctx.validate() as u32,
            },
        )
    })
}

/// Allocates `bytes` of zeroed memory in the context's memory space (device
/// memory for GPU backends, host memory for the CPU backend), aligned to 256
/// bytes (`bytes == 0` still returns a unique pointer). `*out` receives the
/// pointer, owned by the caller; free it with `unikv_memory_free` on the same
/// context. Allocations still live when the context is finally released (after
/// its last pool and plan) are freed with it. Synchronous. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_memory_alloc(
    ctx: *const unikv_context,
    bytes: usize,
    out: *mut *mut c_void,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        ensure!(!out.is_null(), NullArgument, "out");
        ctx.check_usable()?;
        let ptr = ctx.backend().alloc(bytes)?;
        write_out("out", out, ptr as *mut c_void)
    })
}

/// Frees memory from `unikv_memory_alloc` of the same context. NULL is accepted.
/// Returns INVALID_ARGUMENT for a pointer this context did not allocate.
/// Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn unikv_memory_free(
    ctx: *const unikv_context,
    ptr: *mut c_void,
) -> unikv_status {
    boundary(|| context(ctx)?.backend().free(ptr as *mut u8))
}

/// Copies `bytes` between host and context memory in the direction `kind` (a
/// `unikv_copy_kind`), ordered on `stream` (a cudaStream_t/hipStream_t, NULL =
/// the default stream; ignored by the CPU backend, which copies at once). Host
/// buffers must stay valid until the stream reaches the copy. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_memory_copy(
    ctx: *const unikv_context,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: u32,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        ctx.check_usable()?;
        let kind = match kind {
            0 => CopyKind::HostToDevice,
            1 => CopyKind::DeviceToHost,
            2 => CopyKind::DeviceToDevice,
            _ => return Err(err!(BadEnum, "kind: unknown copy kind {kind}")),
        };
        if bytes == 0 {
            return Ok(());
        }
        ensure!(!dst.is_null(), NullArgument, "dst");
        ensure!(!src.is_null(), NullArgument, "src");
        ctx.backend().copy(
            dst as *mut u8,
            src as *const u8,
            bytes,
            kind,
            Stream(stream),
        )
    })
}

/// Sets `bytes` of context memory at `ptr` to `value`, ordered on `stream`.
/// Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_memory_set(
    ctx: *const unikv_context,
    ptr: *mut c_void,
    value: u8,
    bytes: usize,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        ctx.check_usable()?;
        if bytes == 0 {
            return Ok(());
        }
        ensure!(!ptr.is_null(), NullArgument, "ptr");
        ctx.backend()
            .memset(ptr as *mut u8, value, bytes, Stream(stream))
    })
}

/// Blocks until all work the library queued on `stream` is done (a no-op on the
/// CPU backend). The only call that waits; launches never synchronize.
/// Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_stream_synchronize(
    ctx: *const unikv_context,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| context(ctx)?.backend().synchronize(Stream(stream)))
}
