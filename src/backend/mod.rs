//! The backend seam. Every operation validates its arguments into the typed
//! views of `crate::args` (in `crate::ops`) and then calls one method of
//! [`Backend`]. The CPU backend is always compiled; the GPU backend implements
//! the same trait over the kernel shim. Values in backend memory are checked by
//! `rules`, which the CPU backend runs on its arguments and `validating` (a
//! GPU context's validate mode) on host copies; neither backend uses the other.

pub mod cpu;
#[cfg(unikv_gpu)]
pub mod gpu;
pub(crate) mod host;
pub(crate) mod rules;
#[cfg(unikv_gpu)]
pub mod validating;

use std::ffi::c_void;
use std::fmt::Debug;

use crate::args::attention::{AttentionArgs, PlanShape, PlannedLaunch};
use crate::args::cache_store::{FlashMlaStoreArgs, IndexerStoreArgs, ScaledStoreArgs};
use crate::args::compressor::{CompressArgs, StateView};
use crate::args::index::{CsaTailArgs, DecodeStreamsArgs, PrefillStreamsArgs};
use crate::args::indexer::{IndexerKeyArgs, IndexerQueryArgs, IndexerTopkArgs};
use crate::args::merge::MergeArgs;
use crate::args::rope::InverseRopeArgs;
use crate::error::Result;

use crate::args::prepare::PrepareQkvArgs;
use crate::args::routing::HashTopkArgs;
use crate::args::store::{StoreCompressedArgs, StoreSwaArgs};

/// Which implementation a context runs on. Values are part of the C ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Cuda,
    Rocm,
}

/// A caller's stream handle (`cudaStream_t` / `hipStream_t`), passed through opaque.
/// The CPU backend runs synchronously and ignores it.
#[derive(Debug, Clone, Copy)]
pub struct Stream(pub *mut c_void);

// SAFETY: a stream handle is an opaque token; the runtime that owns it is thread-safe.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

/// Direction of a memory copy between host and backend memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

/// One implementation of every operation. Methods receive validated views; the
/// pointers are in the backend's memory space (host memory for the CPU backend).
pub trait Backend: Send + Sync + Debug {
    fn kind(&self) -> BackendKind;

    /// False after a fatal device error; the context then refuses all work.
    fn healthy(&self) -> bool {
        true
    }

    /// Host worker threads the backend computes with (0 when it runs on a device).
    fn worker_threads(&self) -> usize {
        0
    }

    /// Allocates `bytes` of zeroed backend memory, aligned to at least 256 bytes.
    fn alloc(&self, bytes: usize) -> Result<*mut u8>;
    /// Frees memory returned by [`Backend::alloc`].
    ///
    /// # Safety
    /// `ptr` came from `alloc` of this backend and is not used afterwards.
    unsafe fn free(&self, ptr: *mut u8) -> Result<()>;
    /// # Safety
    /// `ptr..ptr+bytes` is backend memory the caller may write.
    unsafe fn memset(&self, ptr: *mut u8, value: u8, bytes: usize, stream: Stream) -> Result<()>;
    /// # Safety
    /// Both ranges are valid for `bytes` in the memory spaces `kind` names.
    unsafe fn copy(
        &self,
        dst: *mut u8,
        src: *const u8,
        bytes: usize,
        kind: CopyKind,
        stream: Stream,
    ) -> Result<()>;
    fn synchronize(&self, stream: Stream) -> Result<()>;

    fn plan_attention(&self, shape: &PlanShape) -> Result<PlannedLaunch>;

    fn store_swa(&self, args: &StoreSwaArgs, stream: Stream) -> Result<()>;
    fn store_compressed(&self, args: &StoreCompressedArgs, stream: Stream) -> Result<()>;
    /// Quantizes latent rows into a FlashMLA FP8 KV cache (docs/fp8.md §5).
    fn store_flashmla(&self, args: &FlashMlaStoreArgs, stream: Stream) -> Result<()>;
    /// Quantizes keys into an indexer key cache (docs/fp8.md §6).
    fn store_indexer(&self, args: &IndexerStoreArgs, stream: Stream) -> Result<()>;
    /// Quantizes latent rows into scaled FP8 rows (docs/fp8.md §8).
    fn store_scaled_fp8(&self, args: &ScaledStoreArgs, stream: Stream) -> Result<()>;

    /// Fused Q/KV RMSNorm + RoPE, with the KV row stored into the pool; with
    /// `indexer`, also `indexer_prepare_q` of it (nothing written unless
    /// both pass their checks).
    fn prepare_qkv(
        &self,
        args: &PrepareQkvArgs,
        indexer: Option<&IndexerQueryArgs>,
        stream: Stream,
    ) -> Result<()>;
    fn build_decode_streams(&self, args: &DecodeStreamsArgs, stream: Stream) -> Result<()>;
    fn fill_csa_tail(&self, args: &CsaTailArgs, stream: Stream) -> Result<()>;
    fn build_prefill_streams(&self, args: &PrefillStreamsArgs, stream: Stream) -> Result<()>;
    /// Decode (no extend source) and prefill (two sources) sparse attention.
    fn attention(&self, args: &AttentionArgs, stream: Stream) -> Result<()>;
    /// Exact merge of partial results over disjoint key sets, sink applied once.
    fn merge(&self, args: &MergeArgs, stream: Stream) -> Result<()>;
    /// Rotates the rope dims of an attention output back, in place.
    fn inverse_rope(&self, args: &InverseRopeArgs, stream: Stream) -> Result<()>;
    /// Indexer query RoPE + Hadamard + FP8 and folded weights (docs/indexer.md §1).
    fn indexer_prepare_q(&self, args: &IndexerQueryArgs, stream: Stream) -> Result<()>;
    /// Indexer key RMSNorm + RoPE + Hadamard + FP8 into the indexer cache (docs/indexer.md §2).
    fn indexer_prepare_k(&self, args: &IndexerKeyArgs, stream: Stream) -> Result<()>;
    /// Indexer scores (when `args.score` is set) and top-k selection into a
    /// CSA page-index table (docs/indexer.md §3).
    fn indexer_topk(&self, args: &IndexerTopkArgs, stream: Stream) -> Result<()>;
    /// Hash-routed MoE gating (docs/routing.md §1).
    fn hash_topk(&self, args: &HashTopkArgs, stream: Stream) -> Result<()>;
    /// Sets compressor state rows to empty (values 0, scores -inf): slot
    /// `slot`'s ring, or every row (docs/compressor.md §3).
    fn clear_state(&self, state: &StateView, slot: Option<usize>, stream: Stream) -> Result<()>;
    /// The KV compressor (docs/compressor.md §2): pools every group a token
    /// of the call closes into its target and keeps each request's last raw
    /// rows in the state.
    fn compress(&self, args: &CompressArgs, stream: Stream) -> Result<()>;
}
