//! The unified KV pool: per layer either one `[rows, 512]` bf16 buffer or, for
//! FP8 pools, a `[rows, 512]` byte buffer of nope rows plus a `[rows, 64]` bf16
//! buffer of rope rows (docs/fp8.md §4); and the request-slot
//! allocator. Buffers live in the context's backend memory and are either
//! allocated here (zeroed) or adopted from the caller.

use std::sync::Arc;

use half::bf16;

use crate::args::compressor::StateView;
use crate::args::LayerRows;
use crate::backend::Stream;
use crate::cache_layouts::unified::{NOPE_ROW_BYTES, ROPE_DIMS};
use crate::compressor::{self, Compressor};
use crate::context::Context;
use crate::dtype::DType;
use crate::error::{ensure, err, Error, Result};
use crate::geometry::{Geometry, PoolConfig, HEAD_DIM};
use crate::slots::SlotAllocator;
use crate::tensor::{Matrix, ROW_ALIGN};

/// Bytes of one bf16 latent row.
pub const ROW_BYTES: usize = HEAD_DIM * 2;

/// A layer's buffers: `data` holds bf16 rows or FP8 nope rows; `rope` is null
/// for bf16 pools.
#[derive(Debug, Clone, Copy)]
pub struct LayerBuffers {
    pub data: *mut u8,
    pub rope: *mut u8,
}

/// Bytes of a layer's (data, rope) buffers for `rows` rows of `dtype`.
pub fn layer_bytes(dtype: DType, rows: usize) -> (usize, usize) {
    match dtype.fp8_format() {
        None => (rows * ROW_BYTES, 0),
        Some(_) => (rows * NOPE_ROW_BYTES, rows * ROPE_DIMS * 2),
    }
}

/// Bytes of a layer's compressor state buffer (0 for dense layers and pools
/// without state).
pub fn state_bytes(geometry: &Geometry, layer: usize) -> usize {
    compressor::state_floats(geometry, layer).expect("checked by check_pool") * 4
}

/// Checks a pool's parameters exactly as `Pool::new` does (same statuses and
/// messages) without a context or any memory, and returns the geometry such a
/// pool has: `unikv_pool_create` and the size queries share it. `adopt_state`
/// holds the caller's compressor state buffers, one per layer.
pub fn check_pool(
    config: PoolConfig,
    dtype: DType,
    adopt: Option<&[LayerBuffers]>,
    adopt_state: Option<&[*mut u8]>,
) -> Result<Geometry> {
    ensure!(
        dtype == DType::Bf16 || dtype.fp8_format().is_some(),
        BadDtype,
        "params.kv_dtype: {} pools are not supported, expected bf16, fp8_e4m3fn or fp8_e4m3fnuz",
        dtype.name()
    );
    let geometry = Geometry::new(config)?;
    for layer in 0..geometry.num_layers() {
        let culprit = geometry.size_culprit(i32::MAX as usize);
        ensure!(
            geometry.rows(layer) <= i32::MAX as usize,
            InvalidArgument,
            "{culprit}: layer {layer} has {} rows ((max_requests + 1) * (window + spec_extra) = {} SWA rows), more than 32-bit row ids address",
            geometry.rows(layer),
            geometry.swa_rows
        );
    }
    for layer in 0..geometry.num_layers() {
        ensure!(
            compressor::state_floats(&geometry, layer).is_some_and(|f| f <= isize::MAX as usize / 4),
            InvalidArgument,
            "params.max_requests: layer {layer}'s compressor state ((max_requests + 1) rings) would exceed the address space"
        );
    }
    u32::try_from(geometry.config.max_requests).map_err(|_| {
        err!(
            InvalidArgument,
            "params.max_requests: {} exceeds 2^32 - 1",
            geometry.config.max_requests
        )
    })?;
    if let Some(state) = adopt_state {
        check_state_buffers(&geometry, state)?;
    }
    let Some(buffers) = adopt else {
        return Ok(geometry);
    };
    ensure!(
        buffers.len() == geometry.num_layers(),
        BadShape,
        "params.layer_buffers: {} buffers for {} layers",
        buffers.len(),
        geometry.num_layers()
    );
    let fp8 = dtype.fp8_format().is_some();
    for (layer, b) in buffers.iter().enumerate() {
        for (name, ptr, wanted) in [
            ("layer_buffers", b.data, true),
            ("rope_buffers", b.rope, fp8),
        ] {
            if !wanted {
                ensure!(
                    ptr.is_null(),
                    InvalidArgument,
                    "params.rope_buffers: must be NULL for a bf16 pool"
                );
                continue;
            }
            ensure!(!ptr.is_null(), NullArgument, "params.{name}[{layer}]");
            ensure!(
                (ptr as usize) % ROW_ALIGN == 0,
                BadAlignment,
                "params.{name}[{layer}] {ptr:p} is not {ROW_ALIGN}-byte aligned"
            );
        }
    }
    Ok(geometry)
}

/// Adopted state buffers: one per layer, NULL exactly for the layers without
/// state, 16-byte aligned.
fn check_state_buffers(geometry: &Geometry, state: &[*mut u8]) -> Result<()> {
    ensure!(
        geometry.config.state.is_some(),
        InvalidArgument,
        "params.state_buffers: only for pools with compressor_state"
    );
    ensure!(
        state.len() == geometry.num_layers(),
        BadShape,
        "params.state_buffers: {} buffers for {} layers",
        state.len(),
        geometry.num_layers()
    );
    for (layer, &ptr) in state.iter().enumerate() {
        if state_bytes(geometry, layer) == 0 {
            ensure!(
                ptr.is_null(),
                InvalidArgument,
                "params.state_buffers[{layer}]: must be NULL for a dense (ratio 0) layer"
            );
            continue;
        }
        ensure!(
            !ptr.is_null(),
            NullArgument,
            "params.state_buffers[{layer}]"
        );
        ensure!(
            (ptr as usize) % ROW_ALIGN == 0,
            BadAlignment,
            "params.state_buffers[{layer}] {ptr:p} is not {ROW_ALIGN}-byte aligned"
        );
    }
    Ok(())
}

#[derive(Debug)]
pub struct Pool {
    ctx: Arc<Context>,
    geometry: Geometry,
    dtype: DType,
    layers: Vec<LayerBuffers>,
    owned: bool,
    /// Per layer its compressor state buffer (null without one).
    state: Vec<*mut u8>,
    state_owned: bool,
    slots: SlotAllocator,
}

// SAFETY: the layer pointers are addresses of backend memory; the pool never
// dereferences them outside operations whose callers synchronise access.
unsafe impl Send for Pool {}
unsafe impl Sync for Pool {}

impl Pool {
    /// Creates a pool of `dtype` rows (bf16 or an FP8 flavour); `adopt` holds
    /// caller-owned buffers per layer (`rope` null for bf16), or is None to
    /// allocate zeroed buffers through the backend; `adopt_state` likewise
    /// for the compressor state, which is cleared (every row empty) before
    /// the pool is returned.
    pub fn new(
        ctx: Arc<Context>,
        config: PoolConfig,
        dtype: DType,
        adopt: Option<&[LayerBuffers]>,
        adopt_state: Option<&[*mut u8]>,
    ) -> Result<Self> {
        ctx.check_usable()?;
        let geometry = check_pool(config, dtype, adopt, adopt_state)?;
        let max_requests = geometry.config.max_requests as u32;
        let slots = SlotAllocator::new(max_requests);
        let mut layers = Vec::new();
        layers
            .try_reserve_exact(geometry.num_layers())
            .map_err(|_| {
                err!(
                    OutOfMemory,
                    "params.num_layers: cannot allocate the layer table"
                )
            })?;
        let mut pool = Pool {
            ctx,
            geometry,
            dtype,
            layers,
            owned: adopt.is_none(),
            state: Vec::new(),
            state_owned: adopt_state.is_none(),
            slots,
        };
        if let Some(buffers) = adopt {
            pool.layers.extend_from_slice(buffers);
        } else {
            for layer in 0..pool.geometry.num_layers() {
                let (data, rope) = layer_bytes(dtype, pool.geometry.rows(layer));
                // On failure `pool` drops and frees the buffers allocated so far.
                let data = pool.alloc_layer(layer, data)?;
                pool.layers.push(LayerBuffers {
                    data,
                    rope: std::ptr::null_mut(),
                });
                if rope > 0 {
                    pool.layers[layer].rope = pool.alloc_layer(layer, rope)?;
                }
            }
        }
        if pool.geometry.config.state.is_some() {
            pool.state = table_of(pool.geometry.num_layers())?;
            for layer in 0..pool.geometry.num_layers() {
                let bytes = state_bytes(&pool.geometry, layer);
                let ptr = match adopt_state {
                    Some(buffers) => buffers[layer],
                    None if bytes > 0 => pool.alloc_state(layer, bytes)?,
                    None => std::ptr::null_mut(),
                };
                pool.state.push(ptr);
            }
            // Host-synchronous, as the allocation itself: the first call on
            // any stream sees empty rings.
            let stream = Stream(std::ptr::null_mut());
            for layer in 0..pool.geometry.num_layers() {
                for view in pool.state_views(layer) {
                    pool.ctx.backend().clear_state(&view, None, stream)?;
                }
            }
            pool.ctx.backend().synchronize(stream)?;
        }
        Ok(pool)
    }

    /// A layer's compressor state buffer; an allocation failure names the
    /// pool's parameters.
    fn alloc_state(&self, layer: usize, bytes: usize) -> Result<*mut u8> {
        self.ctx.backend().alloc(bytes).map_err(|e| match e {
            Error::OutOfMemory(_) => err!(
                OutOfMemory,
                "params: cannot allocate the {bytes} bytes of layer {layer}'s compressor state"
            ),
            e => e,
        })
    }

    /// A compressor's state as operations see it, or None (see
    /// `Geometry::state`).
    pub fn state_view(&self, layer: usize, compressor: Compressor) -> Option<StateView> {
        let geometry = compressor::layer_state(&self.geometry, layer, compressor)?;
        let base = *self.state.get(layer)? as *mut f32;
        // SAFETY: the offset lies inside the layer's state buffer (its size
        // is the sum of its compressors' states).
        let data = unsafe { base.add(geometry.offset_floats) };
        Some(StateView { data, geometry })
    }

    /// Every compressor state of a layer (none, one or two).
    fn state_views(&self, layer: usize) -> impl Iterator<Item = StateView> + '_ {
        [Compressor::Kv, Compressor::Indexer]
            .into_iter()
            .filter_map(move |c| self.state_view(layer, c))
    }

    /// A layer's compressor state buffer (null without one).
    pub fn state_buffer(&self, layer: usize) -> *mut u8 {
        self.state
            .get(layer)
            .copied()
            .unwrap_or(std::ptr::null_mut())
    }

    /// Whether the pool keeps compressor state.
    pub fn has_state(&self) -> bool {
        self.geometry.config.state.is_some()
    }

    /// Releases an acquired slot; a pool with compressor state first clears
    /// the slot's rings in every layer on `stream` and, with `wait`,
    /// synchronizes it. A slot that is not acquired fails before anything
    /// is written.
    pub fn release_slot(&self, slot: u32, stream: Stream, wait: bool) -> Result<()> {
        if self.has_state() {
            self.ctx.check_usable()?;
            self.slots.check_acquired(slot)?;
            for layer in 0..self.geometry.num_layers() {
                for view in self.state_views(layer) {
                    self.ctx
                        .backend()
                        .clear_state(&view, Some(slot as usize), stream)?;
                }
            }
            if wait {
                self.ctx.backend().synchronize(stream)?;
            }
        }
        self.slots.release(slot)
    }

    /// One of a layer's buffers; an allocation failure names the pool's
    /// parameters, not the allocator's argument.
    fn alloc_layer(&self, layer: usize, bytes: usize) -> Result<*mut u8> {
        self.ctx.backend().alloc(bytes).map_err(|e| match e {
            Error::OutOfMemory(_) => err!(
                OutOfMemory,
                "params: cannot allocate the {bytes} bytes of layer {layer} ({} rows)",
                self.geometry.rows(layer)
            ),
            e => e,
        })
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn slots(&self) -> &SlotAllocator {
        &self.slots
    }

    pub fn owns_memory(&self) -> bool {
        self.owned
    }

    /// bf16, fp8_e4m3fn or fp8_e4m3fnuz.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn layer_buffers(&self, layer: usize) -> LayerBuffers {
        self.layers[layer]
    }

    /// The rows of one layer.
    pub fn layer_rows(&self, layer: usize) -> LayerRows {
        let rows = self.geometry.rows(layer);
        let b = self.layers[layer];
        match self.dtype.fp8_format() {
            None => LayerRows::Bf16(Matrix::from_parts(b.data as *mut bf16, [rows, HEAD_DIM])),
            Some(format) => LayerRows::Fp8 {
                nope: Matrix::from_parts(b.data, [rows, NOPE_ROW_BYTES]),
                rope: Matrix::from_parts(b.rope as *mut bf16, [rows, ROPE_DIMS]),
                format,
            },
        }
    }
}

/// An empty per-layer table with room for `layers` entries (OUT_OF_MEMORY,
/// not an abort, when the caller's layer count cannot be met).
fn table_of<T>(layers: usize) -> Result<Vec<T>> {
    let mut table = Vec::new();
    table.try_reserve_exact(layers).map_err(|_| {
        err!(
            OutOfMemory,
            "params.num_layers: cannot allocate the layer table"
        )
    })?;
    Ok(table)
}

impl Drop for Pool {
    fn drop(&mut self) {
        let mut owned: Vec<*mut u8> = Vec::new();
        if self.owned {
            owned.extend(self.layers.drain(..).flat_map(|b| [b.data, b.rope]));
        }
        if self.state_owned {
            owned.append(&mut self.state);
        }
        for ptr in owned.into_iter().filter(|p| !p.is_null()) {
            // SAFETY: allocated by this backend in `new` and never handed
            // out as owned. A failing free has nowhere to report to in drop.
            let _ = unsafe { self.ctx.backend().free(ptr) };
        }
    }
}
