//! The unified KV pool: one `[rows, 512]` bf16 buffer per layer plus the
//! request-slot allocator. Buffers live in the context's backend memory and are
//! either allocated here (zeroed) or adopted from the caller.

use std::sync::Arc;

use half::bf16;

use crate::context::Context;
use crate::error::{ensure, Result};
use crate::geometry::{Geometry, PoolConfig, HEAD_DIM};
use crate::slots::SlotAllocator;
use crate::tensor::{Matrix, ROW_ALIGN};

/// Bytes of one bf16 latent row.
pub const ROW_BYTES: usize = HEAD_DIM * 2;

#[derive(Debug)]
pub struct Pool {
    ctx: Arc<Context>,
    geometry: Geometry,
    layers: Vec<*mut u8>,
    owned: bool,
    slots: SlotAllocator,
}

// SAFETY: the layer pointers are addresses of backend memory; the pool never
// dereferences them outside operations whose callers synchronise access.
unsafe impl Send for Pool {}
unsafe impl Sync for Pool {}

impl Pool {
    /// Creates a pool; `adopt` holds one caller-owned buffer per layer, or is None
    /// to allocate zeroed buffers through the backend.
    pub fn new(ctx: Arc<Context>, config: PoolConfig, adopt: Option<&[*mut u8]>) -> Result<Self> {
        ctx.check_usable()?;
        let geometry = Geometry::new(config)?;
        for layer in 0..geometry.num_layers() {
            ensure!(
                geometry.rows(layer) <= i32::MAX as usize,
                InvalidArgument,
                "params.c128_blocks: layer {layer} has {} rows, more than 32-bit row ids address",
                geometry.rows(layer)
            );
        }
        let slots = SlotAllocator::new(geometry.config.max_requests);
        let Some(buffers) = adopt else {
            let mut pool = Pool {
                ctx,
                geometry,
                layers: Vec::new(),
                owned: true,
                slots,
            };
            for layer in 0..pool.geometry.num_layers() {
                let bytes = pool.geometry.rows(layer) * ROW_BYTES;
                // On failure `pool` drops and frees the layers allocated so far.
                let ptr = pool.ctx.backend().alloc(bytes)?;
                pool.layers.push(ptr);
            }
            return Ok(pool);
        };
        ensure!(
            buffers.len() == geometry.num_layers(),
            BadShape,
            "params.layer_buffers: {} buffers for {} layers",
            buffers.len(),
            geometry.num_layers()
        );
        for (layer, ptr) in buffers.iter().enumerate() {
            ensure!(
                !ptr.is_null(),
                NullArgument,
                "params.layer_buffers[{layer}]"
            );
            ensure!(
                (*ptr as usize) % ROW_ALIGN == 0,
                BadAlignment,
                "params.layer_buffers[{layer}] {ptr:p} is not {ROW_ALIGN}-byte aligned"
            );
        }
        Ok(Pool {
            ctx,
            geometry,
            layers: buffers.to_vec(),
            owned: false,
            slots,
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

    pub fn layer_ptr(&self, layer: usize) -> *mut u8 {
        self.layers[layer]
    }

    /// The `[rows, 512]` view of one layer's buffer.
    pub fn layer_view(&self, layer: usize) -> Matrix<bf16> {
        Matrix::from_parts(
            self.layers[layer] as *mut bf16,
            [self.geometry.rows(layer), HEAD_DIM],
        )
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.owned {
            for ptr in self.layers.drain(..) {
                // SAFETY: allocated by this backend in `new` and never handed out
                // as owned. A failing free has nowhere to report to in drop.
                let _ = unsafe { self.ctx.backend().free(ptr) };
            }
        }
    }
}
