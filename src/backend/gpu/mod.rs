//! The NVIDIA GPU backend: turns validated views into the shim's params structs
//! and launches on the caller's stream. Rust never calls the CUDA runtime
//! directly; kernels/shim.cu owns launches, memory and error reporting.
//! Device-resident values are not read here: in validate mode the context
//! wraps this backend in `backend::validating::Validating`.

mod compressor;
#[cfg(feature = "devtools")]
pub mod devtools;
mod index;
pub(crate) mod shim;

use std::collections::HashSet;
use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::args::attention::{
    AttentionArgs, KernelFamily, KeyRows, KvLayout, KvSource, LaunchSummary, PlanShape, PlanState,
    PlannedLaunch,
};
use crate::args::cache_store::{CacheTarget, FlashMlaStoreArgs, IndexerStoreArgs, ScaledStoreArgs};
use crate::args::compressor::{CompressArgs, StateView};
use crate::args::index::{CsaTailArgs, DecodeStreamsArgs, PrefillStreamsArgs};
use crate::args::indexer::{IndexerKeyArgs, IndexerQueryArgs, IndexerTopkArgs};
use crate::args::merge::MergeArgs;
use crate::args::prepare::PrepareQkvArgs;
use crate::args::rope::InverseRopeArgs;
use crate::args::routing::{HashTopkArgs, RealTokens};
use crate::args::store::{StoreCompressedArgs, StoreSwaArgs};
use crate::args::LayerRows;
use crate::backend::{Backend, BackendKind, CopyKind, Stream};
use crate::error::{err, Error, Result};
use crate::fp8::Fp8Format;
use crate::geometry::HEAD_DIM;

#[derive(Debug)]
pub struct GpuBackend {
    device: c_int,
    /// Set after a sticky device error: the CUDA context is unusable.
    fatal: AtomicBool,
    /// Live allocations, so `free` rejects foreign pointers and the context
    /// releases what callers left behind.
    live: Mutex<HashSet<usize>>,
}

#[derive(Debug)]
struct GpuPlan(shim::AttentionPlan);

impl PlanState for GpuPlan {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// What a plan chose, read back from the shim's plan struct.
fn summary(plan: &shim::AttentionPlan) -> LaunchSummary {
    let family = match (plan.portable, plan.wgmma) {
        (1, _) => KernelFamily::PortableScalar,
        (2, _) => KernelFamily::PortableMatrix,
        (_, 64) => KernelFamily::WgmmaHeadsOnM,
        (_, 16 | 32) => KernelFamily::WgmmaHeadsOnN,
        _ => KernelFamily::Mma,
    };
    let count = |v: i32| v.max(0) as usize;
    LaunchSummary {
        family,
        head_block: 16 * count(plan.block_m_tiles),
        head_blocks: count(plan.head_blocks),
        max_splits: count(plan.max_splits).max(1),
        cluster_merge: plan.cluster != 0,
        stages: count(plan.stages),
        dependent_launch: plan.dependent_launch != 0,
        raw_fp8_variant: plan.kv_fp8 != 0 && family == KernelFamily::WgmmaHeadsOnN,
        sm_count: count(plan.sm_count),
        long_splits: count(plan.long_splits),
        long_keys: count(plan.long_keys),
    }
}

fn last_error() -> String {
    // SAFETY: the shim returns a valid NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(shim::unikv_gpu_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// GPU devices the driver reports now; 0 without a driver or device.
pub fn device_count() -> u32 {
    let mut count: c_int = 0;
    // SAFETY: writes one int.
    let code = unsafe { shim::unikv_gpu_device_count(&mut count) };
    if code == shim::SHIM_OK {
        count.max(0) as u32
    } else {
        0
    }
}

impl GpuBackend {
    /// Opens `device`, or says why the GPU backend is unavailable here.
    pub fn open(device: i32) -> Result<Self> {
        for &(which, rust_size, name) in shim::MIRRORS {
            // SAFETY: a pure query of the shim.
            let c_size = unsafe { shim::unikv_gpu_params_size(which) };
            if c_size != rust_size {
                return Err(err!(
                    Internal,
                    "kernel shim mismatch: {name} is {c_size} bytes in C, {rust_size} in Rust"
                ));
            }
        }
        let mut count: c_int = 0;
        // SAFETY: writes one int.
        let code = unsafe { shim::unikv_gpu_device_count(&mut count) };
        if code != shim::SHIM_OK || count == 0 {
            let why = if code == shim::SHIM_OK {
                "no CUDA device present".to_string()
            } else {
                last_error()
            };
            return Err(err!(BackendUnavailable, "backend: CUDA unavailable: {why}"));
        }
        if device >= count {
            return Err(err!(
                OutOfRange,
                "device: {device} but only {count} CUDA devices are present"
            ));
        }
        // SAFETY: a query of the device, writing nothing the caller owns.
        let code = unsafe { shim::unikv_gpu_open_device(device) };
        if code != shim::SHIM_OK {
            return Err(err!(
                BackendUnavailable,
                "backend: CUDA device {device} unusable: {}",
                last_error()
            ));
        }
        Ok(GpuBackend {
            device,
            fatal: AtomicBool::new(false),
            live: Mutex::new(HashSet::new()),
        })
    }

    fn check(&self, code: c_int, what: &str) -> Result<()> {
        match code {
            shim::SHIM_OK => Ok(()),
            shim::SHIM_OUT_OF_MEMORY => Err(err!(OutOfMemory, "{what}: {}", last_error())),
            shim::SHIM_UNAVAILABLE => Err(err!(BackendUnavailable, "{what}: {}", last_error())),
            shim::SHIM_INVALID => Err(err!(InvalidArgument, "{what}: {}", last_error())),
            shim::SHIM_FATAL => {
                self.fatal.store(true, Ordering::SeqCst);
                Err(err!(
                    Gpu,
                    "{what}: fatal device error, the context is unusable: {}",
                    last_error()
                ))
            }
            // SHIM_ERROR and anything unexpected: a recoverable runtime error.
            _ => Err(err!(Gpu, "{what}: {}", last_error())),
        }
    }
}

/// A count the kernels index with 32-bit integers. Validation bounds most of
/// them already; this keeps a caller value past 2^31 - 1 (a huge token count
/// over tensors whose extents claim that much) from wrapping into a negative
/// launch parameter.
fn i32_of(name: &str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| {
        err!(
            InvalidArgument,
            "{name}: {value} exceeds the GPU kernels' 32-bit limit of 2^31 - 1"
        )
    })
}

/// A layer's rows as the kernels take them, with the bf16 row stride.
fn pool_rows(rows: &LayerRows) -> (shim::PoolRows, i64) {
    match rows {
        LayerRows::Bf16(m) => (
            shim::PoolRows {
                data: m.as_ptr() as *mut c_void,
                rope: std::ptr::null_mut(),
                fp8: 0,
                fp8_format: 0,
            },
            m.strides[0] as i64,
        ),
        LayerRows::Fp8 { nope, rope, format } => (
            shim::PoolRows {
                data: nope.as_ptr() as *mut c_void,
                rope: rope.as_ptr() as *mut c_void,
                fp8: 1,
                // ukv_fp8_format of kernels/fp8.cuh.
                fp8_format: match format {
                    Fp8Format::E4m3Fn => 0,
                    Fp8Format::E4m3Fnuz => 1,
                },
            },
            HEAD_DIM as i64,
        ),
    }
}

/// A key source as the kernels take it (kernels/params.h `ukv_kv_source`);
/// `format` is the call's FP8 flavour, which every source carries (the
/// kernels read it from the first).
fn kv_source(s: &KvSource, format: Option<Fp8Format>) -> shim::KvSource {
    let fp8_rows = |data: *mut c_void| shim::PoolRows {
        data,
        rope: std::ptr::null_mut(),
        fp8: 1,
        fp8_format: format.map_or(0, format_code),
    };
    let mut src = shim::KvSource {
        kv: fp8_rows(std::ptr::null_mut()),
        indices: s.indices.as_ptr(),
        indptr: s.indptr.as_ptr(),
        kv_stride: 0,
        rows: s.kv.rows() as i64,
        capacity: s.indices.shape[0] as i64,
        scales: std::ptr::null(),
        scales_stride: 0,
        layout: 0,
        page_shift: 0,
    };
    match &s.kv {
        KeyRows::Layer(rows) => {
            (src.kv, src.kv_stride) = pool_rows(rows);
            src.kv.fp8_format = format.map_or(0, format_code);
        }
        KeyRows::FlashMla { cache, geometry } => {
            src.kv = fp8_rows(cache.as_ptr() as *mut c_void);
            src.kv_stride = geometry.bytes_per_page() as i64;
            src.layout = 1;
            src.page_shift = geometry.page_size().trailing_zeros() as i32;
        }
        KeyRows::ScaledFp8 { codes, scales, .. } => {
            src.kv = fp8_rows(codes.as_ptr() as *mut c_void);
            src.kv_stride = codes.strides[0] as i64;
            src.scales = scales.as_ptr();
            src.scales_stride = scales.strides[0] as i64;
            src.layout = 2;
        }
    }
    src
}

/// The params of either cache store; `rows` is the kv or key tensor.
/// `ukv_fp8_format` of kernels/fp8.cuh.
fn format_code(fmt: Fp8Format) -> u32 {
    match fmt {
        Fp8Format::E4m3Fn => 0,
        Fp8Format::E4m3Fnuz => 1,
    }
}

fn cache_store_params(
    target: &CacheTarget,
    (rows, row_stride, rows_f32): (*const c_void, usize, bool),
    bytes_per_page: u64,
    fmt: Fp8Format,
) -> shim::CacheStoreParams {
    debug_assert!(target.page_size.is_power_of_two());
    shim::CacheStoreParams {
        rows,
        loc: target.loc.as_ptr() as *const c_void,
        cache: target.cache.as_ptr(),
        row_stride: row_stride as i64,
        bytes_per_page: bytes_per_page as i64,
        token_slots: target.token_slots() as i64,
        num_tokens: target.num_tokens as i64,
        page_shift: target.page_size.trailing_zeros() as i32,
        format: format_code(fmt),
        loc_i64: target.loc.is_i64() as i32,
        rows_f32: rows_f32 as i32,
    }
}

fn null_source() -> shim::KvSource {
    shim::KvSource {
        kv: shim::PoolRows {
            data: std::ptr::null_mut(),
            rope: std::ptr::null_mut(),
            fp8: 0,
            fp8_format: 0,
        },
        indices: std::ptr::null(),
        indptr: std::ptr::null(),
        kv_stride: 0,
        rows: 0,
        capacity: 0,
        scales: std::ptr::null(),
        scales_stride: 0,
        layout: 0,
        page_shift: 0,
    }
}

impl Drop for GpuBackend {
    fn drop(&mut self) {
        for ptr in self.live.get_mut().drain() {
            // SAFETY: allocated by this backend; its context is going away. A
            // failure (e.g. after a fatal error) has nowhere to be reported.
            let _ = unsafe { shim::unikv_gpu_free(self.device, ptr as *mut c_void) };
        }
    }
}

impl Backend for GpuBackend {
    fn kind(&self) -> BackendKind {
        if cfg!(feature = "rocm") {
            BackendKind::Rocm
        } else {
            BackendKind::Cuda
        }
    }

    fn healthy(&self) -> bool {
        !self.fatal.load(Ordering::SeqCst)
    }

    fn alloc(&self, bytes: usize) -> Result<*mut u8> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        self.check(
            unsafe { shim::unikv_gpu_malloc(self.device, bytes, &mut ptr) },
            "bytes",
        )?;
        self.live.lock().insert(ptr as usize);
        Ok(ptr as *mut u8)
    }

    unsafe fn free(&self, ptr: *mut u8) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        if !self.live.lock().remove(&(ptr as usize)) {
            return Err(err!(
                InvalidArgument,
                "ptr: {ptr:p} was not allocated by this context"
            ));
        }
        self.check(shim::unikv_gpu_free(self.device, ptr as *mut c_void), "ptr")
    }

    unsafe fn memset(&self, ptr: *mut u8, value: u8, bytes: usize, stream: Stream) -> Result<()> {
        let code = shim::unikv_gpu_memset_async(
            self.device,
            ptr as *mut c_void,
            value as c_int,
            bytes,
            stream.0,
        );
        self.check(code, "ptr")
    }

    unsafe fn copy(
        &self,
        dst: *mut u8,
        src: *const u8,
        bytes: usize,
        kind: CopyKind,
        stream: Stream,
    ) -> Result<()> {
        let kind = match kind {
            CopyKind::HostToDevice => 0,
            CopyKind::DeviceToHost => 1,
            CopyKind::DeviceToDevice => 2,
        };
        let code = shim::unikv_gpu_memcpy_async(
            self.device,
            dst as *mut c_void,
            src as *const c_void,
            bytes,
            kind,
            stream.0,
        );
        self.check(code, "copy")
    }

    fn synchronize(&self, stream: Stream) -> Result<()> {
        // SAFETY: the stream handle comes from the caller.
        self.check(
            unsafe { shim::unikv_gpu_stream_synchronize(self.device, stream.0) },
            "stream",
        )
    }

    fn plan_attention(&self, shape: &PlanShape) -> Result<PlannedLaunch> {
        let mut plan = shim::AttentionPlan::default();
        // SAFETY: writes one plan struct.
        let code = unsafe {
            shim::unikv_gpu_attention_plan(
                self.device,
                shape.max_tokens as c_int,
                shape.num_heads as c_int,
                // 0 bf16, 1 FP8 pool rows, 2 FlashMLA tokens, 3 scaled FP8
                // rows (whose 64-head blocks take the mma.sync kernel).
                match (shape.kv_dtype.fp8_format().is_some(), shape.kv_layout) {
                    (false, _) => 0,
                    (true, KvLayout::Pool) => 1,
                    (true, KvLayout::FlashMla) => 2,
                    (true, KvLayout::ScaledFp8) => 3,
                },
                &mut plan,
            )
        };
        self.check(code, "plan")?;
        let mut summary = summary(&plan);
        // The raw variant reads pool rows and FlashMLA tokens (raw_variant in
        // kernels/attention/plan.cu).
        summary.raw_fp8_variant &= shape.kv_layout != KvLayout::ScaledFp8;
        Ok(PlannedLaunch {
            workspace_bytes: plan.workspace_bytes as usize,
            summary,
            state: Some(Box::new(GpuPlan(plan))),
        })
    }

    fn store_swa(&self, a: &StoreSwaArgs, stream: Stream) -> Result<()> {
        let g = a.geometry;
        let p = shim::StoreSwaParams {
            kv: a.kv.as_ptr() as *const c_void,
            batch_id: a.batch_id.as_ptr(),
            req_slots: a.req_slots.as_ptr(),
            positions: a.positions.as_ptr(),
            final_pos: a
                .final_pos
                .map_or(std::ptr::null(), |v| v.as_ptr() as *const i32),
            pool: pool_rows(&a.pool_layer).0,
            kv_stride: a.kv.strides[0] as i64,
            pool_rows: a.pool_layer.rows() as i64,
            num_tokens: i32_of("num_tokens", a.num_tokens)?,
            num_requests: i32_of("num_requests", a.req_slots.shape[0])?,
            window: i32_of("window", g.config.window)?,
            ring: i32_of("ring", g.ring)?,
            num_slots: i32_of("num_slots", g.num_slots)?,
            reserved: 0,
        };
        // SAFETY: pointers validated by `ops::store`; device memory by contract.
        self.check(
            unsafe { shim::unikv_gpu_store_swa(self.device, &p, stream.0) },
            "store_swa",
        )
    }

    fn store_compressed(&self, a: &StoreCompressedArgs, stream: Stream) -> Result<()> {
        let p = shim::StoreCompressedParams {
            kv: a.kv.as_ptr() as *const c_void,
            loc: a.loc.as_ptr(),
            pool: pool_rows(&a.pool_layer).0,
            kv_stride: a.kv.strides[0] as i64,
            swa_rows: a.geometry.swa_rows as i64,
            compressed_rows: a.compressed_rows as i64,
            num_rows: i32_of("num_rows", a.num_rows)?,
            reserved: 0,
        };
        // SAFETY: as above.
        self.check(
            unsafe { shim::unikv_gpu_store_compressed(self.device, &p, stream.0) },
            "store_compressed",
        )
    }

    fn store_flashmla(&self, a: &FlashMlaStoreArgs, stream: Stream) -> Result<()> {
        let rows = (a.kv.as_ptr() as *const c_void, a.kv.strides[0], false);
        let g = &a.geometry;
        let p = cache_store_params(&a.target, rows, g.bytes_per_page(), g.format());
        // SAFETY: views validated by `ops::cache_store`; device memory by contract.
        self.check(
            unsafe { shim::unikv_gpu_store_flashmla(self.device, &p, stream.0) },
            "store_flashmla",
        )
    }

    fn store_scaled_fp8(&self, a: &ScaledStoreArgs, stream: Stream) -> Result<()> {
        let t = &a.target;
        let p = shim::ScaledStoreParams {
            rows: a.kv.as_ptr() as *const c_void,
            loc: t.loc.as_ptr() as *const c_void,
            codes: t.cache.as_ptr(),
            scales: a.scales.as_ptr(),
            row_stride: a.kv.strides[0] as i64,
            codes_stride: t.cache.strides[0] as i64,
            scales_stride: a.scales.strides[0] as i64,
            num_rows: t.cache.shape[0] as i64,
            num_tokens: t.num_tokens as i64,
            divisor: a.divisor,
            format: format_code(a.format),
            loc_i64: t.loc.is_i64() as i32,
            reserved: 0,
        };
        // SAFETY: views validated by `ops::cache_store`; device memory by contract.
        self.check(
            unsafe { shim::unikv_gpu_store_scaled_fp8(self.device, &p, stream.0) },
            "store_scaled_fp8",
        )
    }

    fn store_indexer(&self, a: &IndexerStoreArgs, stream: Stream) -> Result<()> {
        let rows = (
            a.key.as_ptr() as *const c_void,
            a.key.row_stride(),
            a.key.is_f32(),
        );
        let g = &a.geometry;
        let p = cache_store_params(&a.target, rows, g.bytes_per_page(), g.format());
        // SAFETY: as above.
        self.check(
            unsafe { shim::unikv_gpu_store_indexer(self.device, &p, stream.0) },
            "store_indexer",
        )
    }

    fn prepare_qkv(
        &self,
        a: &PrepareQkvArgs,
        indexer: Option<&IndexerQueryArgs>,
        stream: Stream,
    ) -> Result<()> {
        let iq = indexer.map(indexer_q_params).transpose()?;
        let p = shim::PrepareQkvParams {
            q_in: a.q_in.as_ptr() as *const c_void,
            q_out: a.q_out.as_ptr() as *mut c_void,
            kv_in: a.kv_in.as_ptr() as *const c_void,
            kv_weight: a.kv_weight.as_ptr() as *const c_void,
            kv_out: a
                .kv_out
                .map_or(std::ptr::null_mut(), |m| m.as_ptr() as *mut c_void),
            rope_table: a.rope_table.as_ptr(),
            positions: a.positions.as_ptr() as *const c_void,
            rows: a
                .rows
                .map_or(std::ptr::null(), |r| r.as_ptr() as *const c_void),
            pool: pool_rows(&a.pool_layer).0,
            q_in_stride_token: a.q_in.strides[0] as i64,
            q_in_stride_head: a.q_in.strides[1] as i64,
            q_out_stride_token: a.q_out.strides[0] as i64,
            q_out_stride_head: a.q_out.strides[1] as i64,
            kv_in_stride: a.kv_in.strides[0] as i64,
            kv_out_stride: a.kv_out.map_or(0, |m| m.strides[0] as i64),
            table_stride: a.rope_table.strides[0] as i64,
            max_pos: a.rope_table.shape[0] as i64,
            pool_rows: a.pool_layer.rows() as i64,
            num_tokens: i32_of("num_tokens", a.num_tokens)?,
            num_heads: i32_of("num_heads", a.num_heads)?,
            q_eps: a.q_eps,
            kv_eps: a.kv_eps,
            positions_i64: a.positions.is_i64() as i32,
            rows_i64: a.rows.is_some_and(|r| r.is_i64()) as i32,
        };
        // SAFETY: views validated by `ops::prepare`; device memory by contract.
        self.check(
            unsafe {
                shim::unikv_gpu_prepare_qkv(
                    self.device,
                    &p,
                    iq.as_ref().map_or(std::ptr::null(), |q| q as *const _),
                    stream.0,
                )
            },
            "prepare_qkv",
        )
    }

    fn build_decode_streams(&self, a: &DecodeStreamsArgs, stream: Stream) -> Result<()> {
        let p = index::decode_streams_params(a)?;
        // SAFETY: as above.
        self.check(
            unsafe { shim::unikv_gpu_build_decode_streams(self.device, &p, stream.0) },
            "build_decode_streams",
        )
    }

    fn fill_csa_tail(&self, a: &CsaTailArgs, stream: Stream) -> Result<()> {
        let p = index::csa_tail_params(a)?;
        // SAFETY: as above.
        self.check(
            unsafe { shim::unikv_gpu_fill_csa_tail(self.device, &p, stream.0) },
            "fill_csa_tail",
        )
    }

    fn build_prefill_streams(&self, a: &PrefillStreamsArgs, stream: Stream) -> Result<()> {
        let p = index::prefill_streams_params(a)?;
        // SAFETY: as above.
        self.check(
            unsafe { shim::unikv_gpu_build_prefill_streams(self.device, &p, stream.0) },
            "build_prefill_streams",
        )
    }

    fn attention(&self, a: &AttentionArgs, stream: Stream) -> Result<()> {
        let plan = a
            .launch
            .state
            .as_ref()
            .and_then(|s| s.as_any().downcast_ref::<GpuPlan>())
            .ok_or_else(|| Error::InvalidArgument("plan: not made by the CUDA backend".into()))?;
        // Every FP8 source of a call has the plan's flavour (`ops::attention`).
        let format = a.sources().iter().find_map(|s| s.kv.fp8_format());
        let mut src = [null_source(), null_source()];
        for (slot, s) in src.iter_mut().zip(a.sources()) {
            *slot = kv_source(s, format);
        }
        debug_assert_eq!(a.q.shape[2], HEAD_DIM);
        let p = shim::AttentionParams {
            q: a.q.as_ptr() as *const c_void,
            out: a.out.as_ptr() as *mut c_void,
            lse: a.lse.map_or(std::ptr::null_mut(), |l| l.as_ptr()),
            sink: a
                .sink
                .map_or(std::ptr::null(), |s| s.as_ptr() as *const f32),
            workspace: a.workspace.ptr as *mut c_void,
            src,
            q_stride_token: a.q.strides[0] as i64,
            q_stride_head: a.q.strides[1] as i64,
            out_stride_token: a.out.strides[0] as i64,
            out_stride_head: a.out.strides[1] as i64,
            lse_stride_token: a.lse.map_or(0, |l| l.strides[0] as i64),
            workspace_bytes: a.workspace.bytes as i64,
            num_sources: i32_of("num_sources", a.sources().len())?,
            num_tokens: i32_of("num_tokens", a.num_tokens)?,
            num_heads: i32_of("num_heads", a.num_heads)?,
            skip_negative: a.skip_negative as i32,
            softmax_scale: a.softmax_scale,
            reserved: 0,
            rope_table: a
                .inverse_rope
                .map_or(std::ptr::null(), |e| e.table.as_ptr() as *const f32),
            positions: a
                .inverse_rope
                .map_or(std::ptr::null(), |e| e.positions.as_ptr() as *const c_void),
            rope_rows: a.inverse_rope.map_or(0, |e| e.table.shape[0] as i64),
            positions_i64: a.inverse_rope.is_some_and(|e| e.positions.is_i64()) as i32,
            reserved2: 0,
        };
        // SAFETY: as above; the workspace holds at least the plan's bytes.
        self.check(
            unsafe { shim::unikv_gpu_attention(self.device, &plan.0, &p, stream.0) },
            "attention",
        )
    }

    fn merge(&self, a: &MergeArgs, stream: Stream) -> Result<()> {
        let p = shim::MergeParams {
            parts_out: a.parts_out.as_ptr() as *const c_void,
            parts_lse: a.parts_lse.as_ptr(),
            sink: a
                .sink
                .map_or(std::ptr::null(), |s| s.as_ptr() as *const f32),
            out: a.out.as_ptr() as *mut c_void,
            lse: a.lse.map_or(std::ptr::null_mut(), |l| l.as_ptr()),
            part_stride_out: a.parts_out.strides[0] as i64,
            part_stride_lse: a.parts_lse.strides[0] as i64,
            out_stride_token: a.out.strides[0] as i64,
            out_stride_head: a.out.strides[1] as i64,
            in_stride_token: a.parts_out.strides[1] as i64,
            in_stride_head: a.parts_out.strides[2] as i64,
            lse_stride_token: a.lse.map_or(0, |l| l.strides[0] as i64),
            in_lse_stride_token: a.parts_lse.strides[1] as i64,
            num_parts: i32_of("num_parts", a.num_parts)?,
            num_tokens: i32_of("num_tokens", a.num_tokens)?,
            num_heads: i32_of("num_heads", a.num_heads)?,
            reserved: 0,
        };
        // SAFETY: views validated by `ops::merge`; device memory by contract.
        self.check(
            unsafe { shim::unikv_gpu_merge(self.device, &p, stream.0) },
            "merge",
        )
    }

    fn inverse_rope(&self, a: &InverseRopeArgs, stream: Stream) -> Result<()> {
        let p = shim::InverseRopeParams {
            x: a.x.as_ptr() as *mut c_void,
            positions: a.positions.as_ptr() as *const c_void,
            table: a.table.as_ptr(),
            x_stride_token: a.x.strides[0] as i64,
            x_stride_head: a.x.strides[1] as i64,
            table_stride: a.table.strides[0] as i64,
            max_pos: a.table.shape[0] as i64,
            num_tokens: a.num_tokens as i64,
            num_heads: a.num_heads as i64,
            positions_i64: i32::from(a.positions.is_i64()),
            reserved: 0,
        };
        // SAFETY: views validated by `ops::rope`; device memory by contract.
        self.check(
            unsafe { shim::unikv_gpu_inverse_rope(self.device, &p, stream.0) },
            "inverse_rope",
        )
    }

    fn indexer_prepare_q(&self, a: &IndexerQueryArgs, stream: Stream) -> Result<()> {
        let p = indexer_q_params(a)?;
        // SAFETY: views validated by `ops::indexer`; device memory by contract.
        self.check(
            unsafe { shim::unikv_gpu_indexer_prepare_q(self.device, &p, stream.0) },
            "indexer_prepare_q",
        )
    }

    fn indexer_prepare_k(&self, a: &IndexerKeyArgs, stream: Stream) -> Result<()> {
        let n = a.target.num_tokens;
        let p = shim::IndexerKParams {
            key: a.key.as_ptr() as *const c_void,
            norm_weight: a.norm_weight.as_ptr() as *const c_void,
            table: a.rope_table.as_ptr(),
            positions: a.positions.as_ptr() as *const c_void,
            loc: a.target.loc.as_ptr() as *const c_void,
            cache: a.target.cache.as_ptr(),
            key_stride: a.key.row_stride() as i64,
            table_stride: a.rope_table.strides[0] as i64,
            max_pos: a.rope_table.shape[0] as i64,
            bytes_per_page: a.geometry.bytes_per_page() as i64,
            token_slots: a.target.token_slots() as i64,
            page_shift: a.target.page_size.trailing_zeros() as i32,
            num_tokens: i32_of("num_tokens", n)?,
            key_f32: i32::from(a.key.is_f32()),
            positions_i64: i32::from(a.positions.is_i64()),
            loc_i64: i32::from(a.target.loc.is_i64()),
            format: format_code(a.geometry.format()),
            eps: a.eps,
            reserved: 0,
        };
        // SAFETY: views validated by `ops::indexer`; device memory by contract.
        self.check(
            unsafe { shim::unikv_gpu_indexer_prepare_k(self.device, &p, stream.0) },
            "indexer_prepare_k",
        )
    }

    fn indexer_topk(&self, a: &IndexerTopkArgs, stream: Stream) -> Result<()> {
        let s = &a.select;
        let sc = a.score.as_ref();
        let csa = a.csa.as_ref();
        let p = shim::IndexerTopkParams {
            q_fp8: sc.map_or(std::ptr::null(), |c| c.q_fp8.as_ptr()),
            weights: sc.map_or(std::ptr::null(), |c| c.weights.as_ptr()),
            cache: sc.map_or(std::ptr::null(), |c| c.cache.as_ptr()),
            page_table: s.page_table.as_ptr(),
            batch_id: s.batch_id.as_ptr(),
            positions: s.positions.as_ptr() as *const c_void,
            logits: s.logits.as_ptr(),
            topk_indices: s.topk_indices.as_ptr(),
            q_stride_token: sc.map_or(0, |c| c.q_fp8.strides[0] as i64),
            q_stride_head: sc.map_or(0, |c| c.q_fp8.strides[1] as i64),
            weights_stride: sc.map_or(0, |c| c.weights.strides[0] as i64),
            page_table_stride: s.page_table.strides[0] as i64,
            logits_stride: s.logits.strides[0] as i64,
            topk_stride: s.topk_indices.strides[0] as i64,
            bytes_per_page: sc.map_or(0, |c| c.geometry.bytes_per_page() as i64),
            cache_pages: sc.map_or(0, |c| c.cache.shape[0] as i64),
            requests: s.page_table.shape[0].min(i32::MAX as usize) as i32,
            max_pages: s.page_table.shape[1].min(i32::MAX as usize) as i32,
            logits_width: i32_of("logits_width", s.logits.shape[1])?,
            topk_width: s.topk_indices.shape[1].min(i32::MAX as usize) as i32,
            num_tokens: i32_of("num_tokens", s.num_tokens)?,
            num_heads: i32_of("num_heads", sc.map_or(0, |c| c.num_heads))?,
            topk: i32_of("topk", s.topk)?,
            positions_i64: i32::from(s.positions.is_i64()),
            format: sc.map_or(0, |c| format_code(c.geometry.format())),
            score: i32::from(sc.is_some()),
            csa_indices: csa.map_or(std::ptr::null_mut(), |c| c.stream.indices.as_ptr()),
            csa_indptr: csa.map_or(std::ptr::null(), |c| c.stream.indptr.as_ptr() as *const i32),
            csa_capacity: csa.map_or(0, |c| c.stream.indices.shape[0] as i64),
            csa_window: i32_of("window", csa.map_or(0, |c| c.window))?,
            csa_row_base: i32_of("swa_rows", csa.map_or(0, |c| c.row_base))?,
            csa_rows: i32_of("csa_rows", csa.map_or(0, |c| c.csa_rows))?,
            csa_reserved: 0,
        };
        // SAFETY: views validated by `ops::indexer`; device memory by contract.
        self.check(
            unsafe { shim::unikv_gpu_indexer_topk(self.device, &p, stream.0) },
            "indexer_topk",
        )
    }

    fn hash_topk(&self, a: &HashTopkArgs, stream: Stream) -> Result<()> {
        let num_real = match &a.real_tokens {
            RealTokens::Host(_) => None,
            RealTokens::Device(v) => Some(v),
        };
        let p = shim::HashTopkParams {
            logits: a.router_logits.as_ptr(),
            input_ids: a.input_ids.as_ptr() as *const c_void,
            tid2eid: a.tid2eid.as_ptr(),
            weights: a.topk_weights.as_ptr(),
            ids: a.topk_ids.as_ptr(),
            num_real: num_real.map_or(std::ptr::null(), |v| v.as_ptr() as *const c_void),
            logits_stride: a.router_logits.strides[0] as i64,
            table_stride: a.tid2eid.strides[0] as i64,
            weights_stride: a.topk_weights.strides[0] as i64,
            ids_stride: a.topk_ids.strides[0] as i64,
            vocab: a.tid2eid.shape[0] as i64,
            num_tokens: i32_of("num_tokens", a.num_tokens)?,
            num_experts: i32_of("num_experts", a.num_experts())?,
            routed: i32_of("routed", a.routed())?,
            shared: i32_of("shared", a.num_shared)?,
            num_real_host: match a.real_tokens {
                RealTokens::Host(n) => i32_of("num_tokens", n)?,
                RealTokens::Device(_) => 0,
            },
            input_ids_i64: i32::from(a.input_ids.is_i64()),
            num_real_i64: i32::from(num_real.is_some_and(|v| v.is_i64())),
            routed_scaling_factor: a.routed_scaling_factor,
        };
        // SAFETY: views validated by `ops::routing`; device memory by contract.
        self.check(
            unsafe { shim::unikv_gpu_hash_topk(self.device, &p, stream.0) },
            "hash_topk",
        )
    }

    fn clear_state(&self, state: &StateView, slot: Option<usize>, stream: Stream) -> Result<()> {
        let p = compressor::clear_params(state, slot)?;
        // SAFETY: device memory of the pool's state.
        self.check(
            unsafe { shim::unikv_gpu_compress_clear(self.device, &p, stream.0) },
            "clear_state",
        )
    }

    fn compress(&self, a: &CompressArgs, stream: Stream) -> Result<()> {
        let p = compressor::params(a)?;
        // SAFETY: views validated by `ops::compressor`; device memory by contract.
        self.check(
            unsafe { shim::unikv_gpu_compress(self.device, &p, stream.0) },
            "compress",
        )
    }
}

/// The indexer query preparation's shim params (also run beside `prepare_qkv`).
fn indexer_q_params(a: &IndexerQueryArgs) -> Result<shim::IndexerQParams> {
    Ok(shim::IndexerQParams {
        q: a.q.as_ptr() as *const c_void,
        weights: a.weights.as_ptr() as *const c_void,
        table: a.rope_table.as_ptr(),
        positions: a.positions.as_ptr() as *const c_void,
        q_fp8: a.q_fp8.as_ptr(),
        weights_out: a.weights_out.as_ptr(),
        q_stride_token: a.q.strides[0] as i64,
        q_stride_head: a.q.strides[1] as i64,
        out_stride_token: a.q_fp8.strides[0] as i64,
        out_stride_head: a.q_fp8.strides[1] as i64,
        weights_stride: a.weights.strides[0] as i64,
        weights_out_stride: a.weights_out.strides[0] as i64,
        table_stride: a.rope_table.strides[0] as i64,
        max_pos: a.rope_table.shape[0] as i64,
        num_tokens: i32_of("num_tokens", a.num_tokens)?,
        num_heads: i32_of("num_heads", a.num_heads)?,
        positions_i64: i32::from(a.positions.is_i64()),
        format: format_code(a.fmt),
        weight_scale: a.weight_scale,
        reserved: 0,
    })
}
