//! The CPU backend: host memory, synchronous execution on a per-context thread
//! pool, f32 accumulation. It checks every index value (`backend::rules`)
//! before writing anything, and is the oracle GPU backends are tested against.

mod attention;
mod cache_store;
mod compressor;
mod index;
mod indexer;
mod memory;
mod merge;
mod prepare;
mod rope;
mod routing;
mod store;

use crate::args::attention::{AttentionArgs, PlanShape, PlannedLaunch};
use crate::args::cache_store::{FlashMlaStoreArgs, IndexerStoreArgs, ScaledStoreArgs};
use crate::args::compressor::{CompressArgs, StateView};
use crate::args::index::{CsaTailArgs, DecodeStreamsArgs, PrefillStreamsArgs};
use crate::args::indexer::{IndexerKeyArgs, IndexerQueryArgs, IndexerTopkArgs};
use crate::args::merge::MergeArgs;
use crate::args::prepare::PrepareQkvArgs;
use crate::args::rope::InverseRopeArgs;
use crate::args::routing::HashTopkArgs;
use crate::args::store::{StoreCompressedArgs, StoreSwaArgs};
use crate::backend::{Backend, BackendKind, CopyKind, Stream};
use crate::error::{ensure, err, Result};

/// The most worker threads a context may ask for: more than the logical cores
/// of today's largest hosts, few enough that creating them takes seconds, not
/// minutes.
pub const MAX_THREADS: usize = 1024;

#[derive(Debug)]
pub struct CpuBackend {
    threads: rayon::ThreadPool,
    memory: memory::HostAllocations,
}

impl CpuBackend {
    /// `threads == 0` uses one worker per available core.
    pub fn new(threads: usize) -> Result<Self> {
        ensure!(
            threads <= MAX_THREADS,
            InvalidArgument,
            "options.cpu_threads: {threads} exceeds the limit of {MAX_THREADS}"
        );
        let threads = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("unikv-cpu-{i}"))
            .build()
            .map_err(|e| {
                err!(
                    OutOfMemory,
                    "options.cpu_threads: cannot start {threads} worker threads: {e}"
                )
            })?;
        Ok(CpuBackend {
            threads,
            memory: memory::HostAllocations::default(),
        })
    }
}

impl Backend for CpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn worker_threads(&self) -> usize {
        self.threads.current_num_threads()
    }

    fn alloc(&self, bytes: usize) -> Result<*mut u8> {
        self.memory.alloc(bytes)
    }

    unsafe fn free(&self, ptr: *mut u8) -> Result<()> {
        self.memory.free(ptr)
    }

    unsafe fn memset(&self, ptr: *mut u8, value: u8, bytes: usize, _stream: Stream) -> Result<()> {
        std::ptr::write_bytes(ptr, value, bytes);
        Ok(())
    }

    unsafe fn copy(
        &self,
        dst: *mut u8,
        src: *const u8,
        bytes: usize,
        _kind: CopyKind,
        _stream: Stream,
    ) -> Result<()> {
        // Host and "device" memory are the same address space here; ranges may overlap.
        std::ptr::copy(src, dst, bytes);
        Ok(())
    }

    fn synchronize(&self, _stream: Stream) -> Result<()> {
        Ok(())
    }

    fn plan_attention(&self, shape: &PlanShape) -> Result<PlannedLaunch> {
        Ok(PlannedLaunch {
            workspace_bytes: 0,
            summary: attention::summary(shape),
            state: None,
        })
    }

    fn store_swa(&self, args: &StoreSwaArgs, _stream: Stream) -> Result<()> {
        store::store_swa(args)
    }

    fn store_compressed(&self, args: &StoreCompressedArgs, _stream: Stream) -> Result<()> {
        store::store_compressed(args)
    }

    fn store_flashmla(&self, args: &FlashMlaStoreArgs, _stream: Stream) -> Result<()> {
        cache_store::store_flashmla(args)
    }

    fn store_indexer(&self, args: &IndexerStoreArgs, _stream: Stream) -> Result<()> {
        cache_store::store_indexer(args)
    }

    fn store_scaled_fp8(&self, args: &ScaledStoreArgs, _stream: Stream) -> Result<()> {
        cache_store::store_scaled_fp8(args)
    }

    fn prepare_qkv(
        &self,
        args: &PrepareQkvArgs,
        indexer: Option<&IndexerQueryArgs>,
        _stream: Stream,
    ) -> Result<()> {
        match indexer {
            None => prepare::prepare_qkv(&self.threads, args),
            Some(q) => {
                // The query's checks first: prepare_qkv checks before it writes.
                let positions = indexer::check_query(q)?;
                prepare::prepare_qkv(&self.threads, args)?;
                // SAFETY: `positions` came from `check_query(q)`.
                unsafe { indexer::run_query(&self.threads, q, &positions) };
                Ok(())
            }
        }
    }

    fn build_decode_streams(&self, args: &DecodeStreamsArgs, _stream: Stream) -> Result<()> {
        index::build_decode_streams(args)
    }

    fn fill_csa_tail(&self, args: &CsaTailArgs, _stream: Stream) -> Result<()> {
        index::fill_csa_tail(args)
    }

    fn build_prefill_streams(&self, args: &PrefillStreamsArgs, _stream: Stream) -> Result<()> {
        index::build_prefill_streams(args)
    }

    fn attention(&self, args: &AttentionArgs, _stream: Stream) -> Result<()> {
        attention::attention(&self.threads, args)
    }

    fn merge(&self, args: &MergeArgs, _stream: Stream) -> Result<()> {
        merge::merge(&self.threads, args);
        Ok(())
    }

    fn inverse_rope(&self, args: &InverseRopeArgs, _stream: Stream) -> Result<()> {
        rope::inverse_rope(&self.threads, args)
    }

    fn indexer_prepare_q(&self, args: &IndexerQueryArgs, _stream: Stream) -> Result<()> {
        indexer::indexer_prepare_q(&self.threads, args)
    }

    fn indexer_prepare_k(&self, args: &IndexerKeyArgs, _stream: Stream) -> Result<()> {
        indexer::indexer_prepare_k(args)
    }

    fn indexer_topk(&self, args: &IndexerTopkArgs, _stream: Stream) -> Result<()> {
        indexer::indexer_topk(&self.threads, args)
    }

    fn hash_topk(&self, args: &HashTopkArgs, _stream: Stream) -> Result<()> {
        routing::hash_topk(args)
    }

    fn clear_state(&self, state: &StateView, slot: Option<usize>, _stream: Stream) -> Result<()> {
        compressor::clear_state(state, slot);
        Ok(())
    }

    fn compress(&self, args: &CompressArgs, _stream: Stream) -> Result<()> {
        compressor::compress(&self.threads, args)
    }
}
