//! Streams, CUDA-graph capture and events for the GPU tests and the benchmark,
//! and the C layout of the kernel params structs for tests/param_layout.rs
//! (feature `devtools`). Not part of the C ABI: serving stacks own their
//! streams and graphs.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};

use crate::error::{err, Result};

extern "C" {
    fn unikv_gpu_dev_copy(
        device: c_int,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        stream: *mut c_void,
    ) -> c_int;
    fn unikv_gpu_dev_stream_create(device: c_int, out: *mut *mut c_void) -> c_int;
    fn unikv_gpu_dev_stream_destroy(device: c_int, stream: *mut c_void) -> c_int;
    fn unikv_gpu_dev_capture_begin(device: c_int, stream: *mut c_void) -> c_int;
    fn unikv_gpu_dev_capture_end(
        device: c_int,
        stream: *mut c_void,
        exec: *mut *mut c_void,
    ) -> c_int;
    fn unikv_gpu_dev_graph_launch(device: c_int, exec: *mut c_void, stream: *mut c_void) -> c_int;
    fn unikv_gpu_dev_graph_destroy(device: c_int, exec: *mut c_void) -> c_int;
    fn unikv_gpu_dev_event_create(device: c_int, out: *mut *mut c_void) -> c_int;
    fn unikv_gpu_dev_event_destroy(device: c_int, event: *mut c_void) -> c_int;
    fn unikv_gpu_dev_event_record(device: c_int, event: *mut c_void, stream: *mut c_void) -> c_int;
    fn unikv_gpu_dev_event_elapsed(
        device: c_int,
        start: *mut c_void,
        end: *mut c_void,
        ms: *mut f32,
    ) -> c_int;
    fn unikv_gpu_dev_param_layout(count: *mut usize) -> *const RawParamField;
}

fn check(code: c_int, what: &str) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(err!(Gpu, "{what}: {}", super::last_error()))
    }
}

/// Copies `bytes` (a multiple of 16) of device memory with a plain copy kernel:
/// the bandwidth ceiling the benchmark reports against.
///
/// # Safety
/// Both ranges are device memory of `device`, valid for `bytes`.
pub unsafe fn copy_kernel(
    device: i32,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    stream: &OwnedStream,
) -> Result<()> {
    check(
        unikv_gpu_dev_copy(device, dst, src, bytes, stream.raw),
        "copy kernel",
    )
}

/// A stream owned by the caller of these tools.
pub struct OwnedStream {
    device: c_int,
    pub raw: *mut c_void,
}

impl OwnedStream {
    pub fn new(device: i32) -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(
            unsafe { unikv_gpu_dev_stream_create(device, &mut raw) },
            "stream",
        )?;
        Ok(OwnedStream { device, raw })
    }

    pub fn begin_capture(&self) -> Result<()> {
        // SAFETY: a live stream.
        check(
            unsafe { unikv_gpu_dev_capture_begin(self.device, self.raw) },
            "begin capture",
        )
    }

    pub fn end_capture(&self) -> Result<Graph> {
        let mut exec = std::ptr::null_mut();
        // SAFETY: a live stream in capture mode.
        check(
            unsafe { unikv_gpu_dev_capture_end(self.device, self.raw, &mut exec) },
            "end capture",
        )?;
        Ok(Graph {
            device: self.device,
            exec,
        })
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        // SAFETY: created by `new`.
        let _ = unsafe { unikv_gpu_dev_stream_destroy(self.device, self.raw) };
    }
}

/// An instantiated graph.
pub struct Graph {
    device: c_int,
    exec: *mut c_void,
}

impl Graph {
    pub fn launch(&self, stream: &OwnedStream) -> Result<()> {
        // SAFETY: live graph and stream.
        check(
            unsafe { unikv_gpu_dev_graph_launch(self.device, self.exec, stream.raw) },
            "graph launch",
        )
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: instantiated by `end_capture`.
        let _ = unsafe { unikv_gpu_dev_graph_destroy(self.device, self.exec) };
    }
}

/// A device event for timing.
pub struct Event {
    device: c_int,
    raw: *mut c_void,
}

impl Event {
    pub fn new(device: i32) -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(
            unsafe { unikv_gpu_dev_event_create(device, &mut raw) },
            "event",
        )?;
        Ok(Event { device, raw })
    }

    pub fn record(&self, stream: &OwnedStream) -> Result<()> {
        // SAFETY: live event and stream.
        check(
            unsafe { unikv_gpu_dev_event_record(self.device, self.raw, stream.raw) },
            "event record",
        )
    }

    /// Milliseconds from `self` to `end`, waiting for `end`.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: both events recorded.
        check(
            unsafe { unikv_gpu_dev_event_elapsed(self.device, self.raw, end.raw, &mut ms) },
            "elapsed",
        )?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by `new`.
        let _ = unsafe { unikv_gpu_dev_event_destroy(self.device, self.raw) };
    }
}

/// The `#[repr(C)]` mirrors of kernels/params.h (src/backend/gpu/shim.rs, a
/// crate-private module), for tests/param_layout.rs.
pub mod params {
    pub use super::super::shim::{
        AttentionParams, AttentionPlan, CacheStoreParams, CompressClearParams, CompressParams,
        CsaTailParams, DecodeStreamsParams, Fp8CheckParams, HashTopkParams, IndexerKParams,
        IndexerQParams, IndexerTopkParams, InverseRopeParams, KvSource, MergeParams, PoolRows,
        PrefillStreamsParams, PrepareQkvParams, ScaledStoreParams, StoreCompressedParams,
        StoreSwaParams, StreamOut,
    };
}

/// A row of kernels/devtools/param_layout.cu's table.
#[repr(C)]
struct RawParamField {
    ty: *const c_char,
    field: *const c_char,
    offset: usize,
    size: usize,
    type_size: usize,
}

/// One field of a kernels/params.h struct as the kernels' compiler lays it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamField {
    /// The struct's C name, e.g. `ukv_pool_rows`.
    pub ty: String,
    pub field: String,
    pub offset: usize,
    pub size: usize,
    /// The size of the whole struct.
    pub type_size: usize,
}

/// Every field of every params.h struct, each struct's fields together and
/// in declaration order (host code: no device needed).
pub fn param_layout() -> Vec<ParamField> {
    let mut count = 0usize;
    // SAFETY: returns a static table of `count` rows.
    let rows = unsafe { std::slice::from_raw_parts(unikv_gpu_dev_param_layout(&mut count), count) };
    let text = |p: *const c_char| {
        // SAFETY: the table's names are static NUL-terminated literals.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    };
    rows.iter()
        .map(|r| ParamField {
            ty: text(r.ty),
            field: text(r.field),
            offset: r.offset,
            size: r.size,
            type_size: r.type_size,
        })
        .collect()
}
