//! unikv: DeepSeek-V4 sparse attention over a unified KV pool.
//!
//! Layers, top to bottom; a module uses its own layer and those below, never
//! one above (tests/layering.rs checks it from the imports):
//! - `ffi`: the C ABI;
//! - `ops`: validation of caller descriptors into the typed argument contract;
//! - `context`, `pool`, `plan`: the objects that hold a backend and what it
//!   allocated or planned;
//! - `backend`: the `Backend` trait, the CPU backend, the CUDA/ROCm backend,
//!   the device-value rules both apply, and the validate-mode wrapper;
//! - `args`: the contract between `ops` and the backends (`*Args`,
//!   `PlanShape`, `LayerRows`);
//! - domain types and math: `geometry`, `tensor`, `dtype`, `error`, `slots`,
//!   `overlap`, `cache_layouts`, `compressor`, `rope`, `indexer`, `routing`,
//!   and `fp8`, the bit-exact FP8/UE8M0 codec the GPU codec must match.
//!
//! See ARCHITECTURE.md.

pub mod args;
pub mod backend;
/// FlashMLA FP8 KV cache and indexer key cache byte layouts (docs/fp8.md §5, §6).
pub mod cache_layouts;
/// The KV compressor: state geometry and gated pooling (docs/compressor.md).
pub mod compressor;
pub mod context;
pub mod dtype;
pub mod error;
pub mod ffi;
pub mod fp8;
pub mod geometry;
/// Lightning indexer query and key preparation math (docs/indexer.md §1, §2).
pub mod indexer;
pub mod ops;
/// Byte footprints of views and the exact overlap test (issue 21).
pub mod overlap;
pub mod plan;
pub mod pool;
/// RoPE tables and the reference Q/KV norm + RoPE row math (docs/prepare.md §4).
pub mod rope;
/// Hash-routed MoE gating math (docs/routing.md §1).
pub mod routing;
pub mod slots;
pub mod tensor;
