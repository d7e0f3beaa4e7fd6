//! The unified KV pool: per layer either one `[rows, 512]` bf16 buffer or, for
//! FP8 pools, a `[rows, 512]` byte buffer of nope rows plus a `[rows, 64]` bf16
//! buffer of rope rows (docs/fp8.md §4); and the request-slot
//! allocator. Buffers live in the context's backend memory and are either
//! allocated here (zeroed) or adopted from the caller.

use std::sync::Arc;

use half::bf16;

use crate::args::LayerRows;
use crate::cache_layouts::unified::{NOPE_ROW_BYTES, ROPE_DIMS};
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

/// Checks a pool's parameters exactly as `Pool::new` does (same statuses and
/// messages) without a context or any memory, and returns the geometry such a
/// pool has: `unikv_pool_create` and the size queries share it.
pub fn check_pool(
    config: PoolConfig,
    dtype: DType,
    adopt: Option<&[LayerBuffers]>,
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
    u32::try_from(geometry.config.max_requests).map_err(|_| {
        err!(
            InvalidArgument,
            "params.max_requests: {} exceeds 2^32 - 1",
            geometry.config.max_requests
        )
    })?;
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

#[derive(Debug)]
pub struct Pool {
    ctx: Arc<Context>,
    geometry: Geometry,
    dtype: DType,
    layers: Vec<LayerBuffers>,
    owned: bool,
    slots: SlotAllocator,
}

// SAFETY: the layer pointers are addresses of backend memory; the pool never
// dereferences them outside operations whose callers synchronise access.
unsafe impl Send for Pool {}
unsafe impl Sync for Pool {}

impl Pool {
    /// Creates a pool of `dtype` rows (bf16 or an FP8 flavour); `adopt` holds
    /// caller-owned buffers per layer (`rope` null for bf16), or is None to
    /// allocate zeroed buffers through the backend.
    pub fn new(
        ctx: Arc<Context>,
        config: PoolConfig,
        dtype: DType,
        adopt: Option<&[LayerBuffers]>,
    ) -> Result<Self> {
        ctx.check_usable()?;
        let geometry = check_pool(config, dtype, adopt)?;
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
        let Some(buffers) = adopt else {
            let mut pool = Pool {
                ctx,
                geometry,
                dtype,
                layers,
                owned: true,
                slots,
            };
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
            return Ok(pool);
        };
        layers.extend_from_slice(buffers);
        Ok(Pool {
            ctx,
            geometry,
            dtype,
            layers,
            owned: false,
            slots,
        })
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

impl Drop for Pool {
    fn drop(&mut self) {
        if self.owned {
            for b in self.layers.drain(..) {
                for ptr in [b.data, b.rope].into_iter().filter(|p| !p.is_null()) {
                    // SAFETY: allocated by this backend in `new` and never handed
                    // out as owned. A failing free has nowhere to report to in drop.
                    let _ = unsafe { self.ctx.backend().free(ptr) };
                }
            }
        }
    }
}
