//! Unified KV pool lifecycle, geometry accessors and request slots.

use std::os::raw::c_void;

use crate::backend::Stream;
use crate::cache_layouts::unified;

use crate::dtype::DType;
use crate::error::{ensure, err, Result};
use crate::ffi::boundary::{
    boundary, enter_context, read_params, write_info, write_out, Versioned,
};
use crate::ffi::context::{context, unikv_context};
use crate::ffi::handles::{destroy_handle, handle, new_handle, Handle};
use crate::ffi::status::unikv_status;
use crate::geometry::{Geometry, PoolConfig, Ratio, StateRings};
use crate::pool::{layer_bytes, state_bytes, LayerBuffers, Pool, ROW_BYTES};

/// Opaque pool handle. Slot acquire/release and all accessors are thread-safe.
/// Operations that write pool rows may run concurrently only on disjoint rows
/// (the usual serving-step discipline: one stream owns a layer at a time).
#[allow(non_camel_case_types)]
pub struct unikv_pool {
    pub(crate) inner: Pool,
}

impl Handle for unikv_pool {
    const KIND: &'static str = "unikv_pool";
}

/// Parameters of `unikv_pool_create` (docs/pool.md §2). Per layer:
/// rows = (max_requests + 1) * (window + spec_extra)
///        + c128_blocks * K(ratio) + 256 / ratio,
/// with K = 32 for ratio 4, 1 for ratio 128, and no compressed rows for ratio 0.
/// A caller adopting its own buffers (`layer_buffers`, `rope_buffers`) need
/// not restate the formula: `unikv_pool_params_get_info` and
/// `unikv_pool_params_get_layer` report, from these parameters alone and
/// before any pool exists, the geometry and each layer's `bytes` and
/// `rope_bytes` to allocate.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_pool_params {
    /// sizeof(unikv_pool_params).
    pub struct_size: usize,
    /// Host array of `num_layers` compress ratios, each 0, 4 or 128; read during the call.
    pub compress_ratios: *const u32,
    /// NULL: the pool allocates zeroed buffers in the context's memory and owns
    /// them. Otherwise a host array of `num_layers` caller-owned buffers (device
    /// memory for GPU backends), 16-byte aligned, that must outlive the pool:
    /// each `rows(layer) * 1024` bytes for bf16 (the `[rows, 512]` rows), or
    /// `rows(layer) * 512` bytes for FP8 (the nope rows; see `rope_buffers`).
    pub layer_buffers: *const *mut c_void,
    /// Number of layers L (> 0): entries of `compress_ratios` and of the buffer
    /// arrays.
    pub num_layers: u32,
    /// Maximum concurrent requests R; slots 1..=R are handed out, slot 0 is reserved.
    pub max_requests: u32,
    /// Sliding window (128 for DeepSeek-V4).
    pub window: u32,
    /// Extra ring rows for speculative decoding (draft tokens - 1), else 0.
    pub spec_extra: u32,
    /// Number of 128-token blocks B of the caller's KV page space.
    pub c128_blocks: u32,
    /// A `unikv_dtype`: UNIKV_DTYPE_BF16, or an FP8 flavour
    /// (UNIKV_DTYPE_FP8_E4M3FN / _FNUZ) for the two-buffer FP8 pool of
    /// docs/fp8.md §4: per row a 512-byte nope row (448 codes, the 7 UE8M0
    /// tile scales each written twice, 50 zero bytes) and a 64-wide bf16 rope
    /// row at the same row id. Stores quantize; attention dequantizes.
    pub kv_dtype: u32,
    /// FP8 pools adopting buffers: a host array of `num_layers` caller-owned
    /// rope buffers, each `rows(layer) * 128` bytes, 16-byte aligned. NULL
    /// otherwise (required NULL for bf16 pools).
    pub rope_buffers: *const *mut c_void,
    /// 1: the pool keeps the KV compressor state of its compressed layers
    /// (docs/compressor.md §3): per request slot and layer a ring of raw fp32
    /// `kv_score` rows for `unikv_compress_decode` / `_prefill`. 0: none,
    /// and the ring and buffer fields below must be 0 / NULL. This field and
    /// the ones below are an extension: a `struct_size` that ends before it
    /// (a caller built against a header without it) is accepted and reads
    /// as 0 / NULL for all of them.
    pub compressor_state: u32,
    /// Rows per slot of each ratio-4 layer's rings: 8, or 16 with speculative
    /// decoding (draft tokens can then be rolled back, docs/compressor.md
    /// §4). Required when the pool has ratio-4 layers; otherwise 0 or one of
    /// those values.
    pub c4_state_ring: u32,
    /// Rows per slot of each ratio-128 layer's ring: 128, or 256 with
    /// speculative decoding. Required when the pool has ratio-128 layers;
    /// otherwise 0 or one of those values.
    pub c128_state_ring: u32,
    /// Must be 0.
    pub reserved: u32,
    /// NULL: the pool allocates the state in the context's memory (with
    /// `compressor_state`). Otherwise a host array of `num_layers`
    /// caller-owned buffers (device memory for GPU backends) that must
    /// outlive the pool: NULL for dense layers, else 16-byte aligned and at
    /// least `state_bytes` of `unikv_pool_params_get_layer`. The pool clears
    /// every row (values 0, scores -inf) when it is created.
    pub state_buffers: *const *mut c_void,
}

unsafe impl Versioned for unikv_pool_params {
    const NAME: &'static str = "params";
    const MIN_SIZE: usize = std::mem::offset_of!(unikv_pool_params, compressor_state);
}

/// Pool-wide geometry (`unikv_pool_get_info`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_pool_info {
    /// sizeof(unikv_pool_info), set by the caller.
    pub struct_size: usize,
    /// Rows of the SWA region (identical in every layer): (max_requests + 1) * ring.
    pub swa_rows: u64,
    /// Bytes a reader moves per row: 1024 for bf16, 640 for FP8 (512-byte
    /// nope row + 128-byte rope row).
    pub row_bytes: u64,
    /// Layers of the pool.
    pub num_layers: u32,
    /// Maximum concurrent requests (slots 1..=max_requests).
    pub max_requests: u32,
    /// Sliding window the pool was created with.
    pub window: u32,
    /// Ring rows per request slot: window + spec_extra.
    pub ring: u32,
    /// 128-token blocks of the caller's KV page space.
    pub c128_blocks: u32,
    /// Slots currently acquired (pool occupancy).
    pub slots_in_use: u32,
    /// A `unikv_dtype`.
    pub kv_dtype: u32,
    /// 1 when the pool allocated (and will free) its buffers, 0 when adopted.
    pub owns_memory: u32,
    /// Ring rows per slot of the ratio-4 compressor states (0 without
    /// compressor state).
    pub c4_state_ring: u32,
    /// Ring rows per slot of the ratio-128 compressor states (0 without
    /// compressor state).
    pub c128_state_ring: u32,
}

unsafe impl Versioned for unikv_pool_info {
    const NAME: &'static str = "info";
}

/// One layer's geometry (`unikv_pool_get_layer`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_pool_layer_info {
    /// sizeof(unikv_pool_layer_info), set by the caller.
    pub struct_size: usize,
    /// The layer's `[rows, 512]` buffer (device memory for GPU backends): bf16
    /// rows, or the FP8 pool's 512-byte nope rows.
    pub data: *mut c_void,
    /// Total rows of the layer.
    pub rows: u64,
    /// Rows of the SWA region; compressed row of page index p is swa_rows + p.
    pub swa_rows: u64,
    /// Compressed rows after the SWA region (0 for dense layers).
    pub compressed_rows: u64,
    /// Bytes of `data`: rows * 1024 (bf16) or rows * 512 (FP8).
    pub bytes: u64,
    /// 0, 4 or 128.
    pub compress_ratio: u32,
    /// Written as 0.
    pub reserved: u32,
    /// FP8 pools: the layer's `[rows, 64]` bf16 rope rows; NULL for bf16.
    pub rope_data: *mut c_void,
    /// Bytes of `rope_data`: rows * 128 (FP8) or 0.
    pub rope_bytes: u64,
    /// The layer's compressor state buffer (device memory for GPU backends):
    /// NULL for dense layers and pools without state (and, from
    /// `unikv_pool_params_get_layer`, unless `params` adopts one).
    /// `unikv_pool_get_compressor` describes its parts.
    pub state_data: *mut c_void,
    /// Bytes of the layer's compressor state (what an adopted
    /// `state_buffers[layer]` needs): 0 for dense layers and pools without
    /// state.
    pub state_bytes: u64,
}

unsafe impl Versioned for unikv_pool_layer_info {
    const NAME: &'static str = "info";
}

/// Pool of a handle, recording its context for the panic boundary.
///
/// # Safety
/// A non-NULL `pool` is a live handle.
pub(crate) unsafe fn pool_of<'a>(pool: *const unikv_pool) -> Result<&'a Pool> {
    let pool = &handle("pool", pool)?.inner;
    enter_context(pool.context());
    Ok(pool)
}

/// An empty per-layer table with room for `layers` entries: `num_layers` is
/// the caller's, so its allocation must fail as OUT_OF_MEMORY, not abort.
fn table_for<T>(layers: usize) -> Result<Vec<T>> {
    let mut table = Vec::new();
    table.try_reserve_exact(layers).map_err(|_| {
        err!(
            OutOfMemory,
            "params.num_layers: cannot allocate a table of {layers} layers"
        )
    })?;
    Ok(table)
}

/// Creates a unified KV pool on `ctx`. `params` and the arrays it points to are
/// host memory read during the call. `*out` receives a handle owned by the
/// caller (free with `unikv_pool_destroy`). Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_pool_create(
    ctx: *const unikv_context,
    params: *const unikv_pool_params,
    out: *mut *mut unikv_pool,
) -> unikv_status {
    boundary(|| {
        let ctx = context(ctx)?;
        ensure!(!out.is_null(), NullArgument, "out");
        let r = read_pool_params(params)?;
        let inner = Pool::new(
            ctx.clone(),
            r.config,
            r.dtype,
            r.adopt.as_deref(),
            r.adopt_state.as_deref(),
        )?;
        out.write(new_handle(unikv_pool { inner }));
        Ok(())
    })
}

/// Destroys a pool, freeing its buffers if it allocated them. NULL is accepted;
/// a pointer that is not a live pool is ignored (the thread's last error says
/// so). Externally synchronized: no other call may use this handle
/// concurrently, and work queued on streams must no longer need the buffers.
#[no_mangle]
pub unsafe extern "C" fn unikv_pool_destroy(pool: *mut unikv_pool) {
    let _ = boundary(|| destroy_handle("pool", pool));
}

/// Fills `info` (host memory; set `info->struct_size` first) with the pool's
/// geometry and occupancy. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_pool_get_info(
    pool: *const unikv_pool,
    info: *mut unikv_pool_info,
) -> unikv_status {
    boundary(|| {
        let p = pool_of(pool)?;
        write_info(
            info,
            pool_info(p.geometry(), p.dtype(), p.slots().in_use(), p.owns_memory()),
        )
    })
}

/// What `unikv_pool_get_info` reports for a pool of geometry `g` and `dtype`
/// (also `unikv_pool_params_get_info`, for the pool parameters would make).
pub(crate) fn pool_info(
    g: &Geometry,
    dtype: DType,
    slots_in_use: usize,
    owns_memory: bool,
) -> unikv_pool_info {
    unikv_pool_info {
        struct_size: 0,
        swa_rows: g.swa_rows as u64,
        row_bytes: match dtype.fp8_format() {
            None => ROW_BYTES,
            Some(_) => unified::ROW_BYTES,
        } as u64,
        num_layers: g.num_layers() as u32,
        max_requests: g.config.max_requests as u32,
        window: g.config.window as u32,
        ring: g.ring as u32,
        c128_blocks: g.config.c128_blocks as u32,
        slots_in_use: slots_in_use as u32,
        kv_dtype: dtype.to_raw(),
        owns_memory: owns_memory as u32,
        c4_state_ring: g.config.state.map_or(0, |r| r.c4) as u32,
        c128_state_ring: g.config.state.map_or(0, |r| r.c128) as u32,
    }
}

/// What `unikv_pool_get_layer` reports for layer `layer` of geometry `g`,
/// with the buffers given.
pub(crate) fn layer_info(
    g: &Geometry,
    dtype: DType,
    layer: usize,
    buffers: LayerBuffers,
    state: *mut u8,
) -> unikv_pool_layer_info {
    let rows = g.rows(layer);
    let (bytes, rope_bytes) = layer_bytes(dtype, rows);
    unikv_pool_layer_info {
        struct_size: 0,
        data: buffers.data as *mut c_void,
        rows: rows as u64,
        swa_rows: g.swa_rows as u64,
        compressed_rows: g.compressed_rows(g.ratio(layer)) as u64,
        bytes: bytes as u64,
        compress_ratio: g.ratio(layer).value() as u32,
        reserved: 0,
        rope_data: buffers.rope as *mut c_void,
        rope_bytes: rope_bytes as u64,
        state_data: state as *mut c_void,
        state_bytes: state_bytes(g, layer) as u64,
    }
}

/// Fills `info` (host memory; set `info->struct_size` first) with one layer's
/// geometry and buffer pointer. OUT_OF_RANGE for a layer past the pool's.
/// Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_pool_get_layer(
    pool: *const unikv_pool,
    layer: u32,
    info: *mut unikv_pool_layer_info,
) -> unikv_status {
    boundary(|| {
        let p = pool_of(pool)?;
        let g = p.geometry();
        let layer = g.check_layer(layer)?;
        write_info(
            info,
            layer_info(
                g,
                p.dtype(),
                layer,
                p.layer_buffers(layer),
                p.state_buffer(layer),
            ),
        )
    })
}

/// Acquires a free request slot (1..=max_requests, lowest first) into `*slot`.
/// CAPACITY_EXCEEDED when all are in use. Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_pool_acquire_slot(
    pool: *const unikv_pool,
    slot: *mut u32,
) -> unikv_status {
    boundary(|| {
        let p = pool_of(pool)?;
        ensure!(!slot.is_null(), NullArgument, "slot");
        write_out("slot", slot, p.slots().acquire()?)
    })
}

/// Releases an acquired slot. OUT_OF_RANGE for 0 or a slot past max_requests,
/// INVALID_STATE for a slot that is not acquired. The slot's SWA ring rows are
/// not cleared. A pool with compressor state clears the slot's compressor
/// rings in every layer (values 0, scores -inf) before the slot is released:
/// on the CPU backend at once; on GPU backends by a launch on the legacy
/// default stream (NULL) that this call waits for (host-synchronous; serving
/// loops on other streams use `unikv_pool_release_slot_async`). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn unikv_pool_release_slot(
    pool: *const unikv_pool,
    slot: u32,
) -> unikv_status {
    boundary(|| pool_of(pool)?.release_slot(slot, Stream(std::ptr::null_mut()), true))
}

/// `unikv_pool_release_slot` for pools with compressor state on a stream:
/// the clearing of the slot's compressor rings is queued on `stream` and the
/// call returns without waiting; work that later uses the slot (it may be
/// acquired again at once) must run on `stream` or after it. The same as
/// `unikv_pool_release_slot` for pools without compressor state (nothing is
/// queued). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn unikv_pool_release_slot_async(
    pool: *const unikv_pool,
    slot: u32,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| pool_of(pool)?.release_slot(slot, Stream(stream), false))
}

/// A pool's parameters read from the caller's struct: `unikv_pool_create` and
/// the size queries (`ffi::sizes`) read them the same way.
pub(crate) struct PoolRequest {
    pub config: PoolConfig,
    pub dtype: DType,
    /// The caller's buffers when it adopts them.
    pub adopt: Option<Vec<LayerBuffers>>,
    /// The caller's compressor state buffers when it adopts them.
    pub adopt_state: Option<Vec<*mut u8>>,
}

/// Reads and checks `unikv_pool_params` up to the geometry (which
/// `pool::check_pool` derives).
///
/// # Safety
/// A non-NULL `params` is valid for its `struct_size` bytes, and its arrays
/// for `num_layers` entries.
pub(crate) unsafe fn read_pool_params(params: *const unikv_pool_params) -> Result<PoolRequest> {
    let defaults = unikv_pool_params {
        struct_size: 0,
        compress_ratios: std::ptr::null(),
        layer_buffers: std::ptr::null(),
        num_layers: 0,
        max_requests: 0,
        window: 0,
        spec_extra: 0,
        c128_blocks: 0,
        kv_dtype: 0,
        rope_buffers: std::ptr::null(),
        compressor_state: 0,
        c4_state_ring: 0,
        c128_state_ring: 0,
        reserved: 0,
        state_buffers: std::ptr::null(),
    };
    let p = read_params(params, defaults)?;
    let dtype = DType::from_raw("params.kv_dtype", p.kv_dtype)?;
    ensure!(
        p.num_layers >= 1,
        InvalidArgument,
        "params.num_layers: must be at least 1"
    );
    ensure!(
        !p.compress_ratios.is_null(),
        NullArgument,
        "params.compress_ratios"
    );
    let layers = p.num_layers as usize;
    let raw_ratios = std::slice::from_raw_parts(p.compress_ratios, layers);
    let mut ratios = table_for(layers)?;
    for (i, r) in raw_ratios.iter().enumerate() {
        ratios.push(Ratio::from_raw(
            &format!("params.compress_ratios[{i}]"),
            *r,
        )?);
    }
    let fp8 = dtype.fp8_format().is_some();
    ensure!(
        p.rope_buffers.is_null() || (fp8 && !p.layer_buffers.is_null()),
        InvalidArgument,
        "params.rope_buffers: only for FP8 pools that adopt layer_buffers"
    );
    ensure!(
        p.layer_buffers.is_null() || !fp8 || !p.rope_buffers.is_null(),
        NullArgument,
        "params.rope_buffers: an FP8 pool adopting layer_buffers needs its rope buffers"
    );
    let adopt = if p.layer_buffers.is_null() {
        None
    } else {
        let data = std::slice::from_raw_parts(p.layer_buffers as *const *mut u8, layers);
        let mut adopt = table_for(layers)?;
        adopt.extend((0..layers).map(|l| LayerBuffers {
            data: data[l],
            rope: if fp8 {
                *(p.rope_buffers as *const *mut u8).add(l)
            } else {
                std::ptr::null_mut()
            },
        }));
        Some(adopt)
    };
    ensure!(
        p.reserved == 0,
        InvalidArgument,
        "params.reserved: must be 0"
    );
    let state = match p.compressor_state {
        0 => {
            for (name, value) in [
                ("c4_state_ring", p.c4_state_ring),
                ("c128_state_ring", p.c128_state_ring),
            ] {
                ensure!(
                    value == 0,
                    InvalidArgument,
                    "params.{name}: must be 0 without compressor_state"
                );
            }
            ensure!(
                p.state_buffers.is_null(),
                InvalidArgument,
                "params.state_buffers: must be NULL without compressor_state"
            );
            None
        }
        1 => Some(StateRings {
            c4: p.c4_state_ring as usize,
            c128: p.c128_state_ring as usize,
        }),
        v => {
            return Err(err!(
                BadEnum,
                "params.compressor_state: {v}, expected 0 (none) or 1 (kept by the pool)"
            ))
        }
    };
    let adopt_state = if p.state_buffers.is_null() {
        None
    } else {
        let buffers = std::slice::from_raw_parts(p.state_buffers as *const *mut u8, layers);
        let mut table = table_for(layers)?;
        table.extend_from_slice(buffers);
        Some(table)
    };
    let config = PoolConfig {
        ratios,
        max_requests: p.max_requests as usize,
        window: p.window as usize,
        spec_extra: p.spec_extra as usize,
        c128_blocks: p.c128_blocks as usize,
        state,
    };
    Ok(PoolRequest {
        config,
        dtype,
        adopt,
        adopt_state,
    })
}
