//! unikv: DeepSeek-V4 sparse attention over a unified KV pool.
//!
//! Layers, top to bottom (nothing calls upward): `ffi` (the C ABI) -> `ops`
//! (argument validation into typed views) -> `backend` (CPU now; GPU backends
//! plug into the same trait). `geometry`, `pool`, `plan`, `tensor` hold the
//! domain types; `fp8` is the bit-exact FP8/UE8M0 codec the GPU codec must
//! match. See ARCHITECTURE.md.

pub mod backend;
/// FlashMLA FP8 KV cache and indexer key cache byte layouts (spec store_fused §1.1, §1.2).
pub mod cache_layouts;
pub mod context;
pub mod dtype;
pub mod error;
pub mod ffi;
pub mod fp8;
pub mod geometry;
/// Lightning indexer query and key preparation math (spec store_fused §4.1, §4.2).
pub mod indexer;
pub mod ops;
/// Byte footprints of views and the exact overlap test (issue 21).
pub mod overlap;
pub mod plan;
pub mod pool;
/// RoPE tables and the reference Q/KV norm + RoPE row math (spec store_fused §3).
pub mod rope;
/// Hash-routed MoE gating math (spec store_fused §5).
pub mod routing;
pub mod slots;
pub mod tensor;
