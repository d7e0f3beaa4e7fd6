//! Validate mode, implemented once for every device backend: before each
//! operation, the device-resident values it reads are copied to the host on
//! the caller's stream (after the work that wrote them), the stream is
//! synchronized, and the same `backend::rules` the CPU backend applies run on
//! the copies; only then does the wrapped backend launch. The context wraps
//! its backend in `Validating` when created with `validate` set.

use crate::args::attention::{AttentionArgs, KvSource, PlanShape, PlannedLaunch};
use crate::args::cache_store::{CacheTarget, FlashMlaStoreArgs, IndexerStoreArgs, ScaledStoreArgs};
use crate::args::compressor::{CompressArgs, StateView};
use crate::args::index::{CsaTailArgs, DecodeStreamsArgs, PrefillStreamsArgs, StreamOut};
use crate::args::indexer::{
    IndexerKeyArgs, IndexerQueryArgs, IndexerTopkArgs, TopkCsaTail, TopkSelect,
};
use crate::args::merge::MergeArgs;
use crate::args::prepare::PrepareQkvArgs;
use crate::args::rope::InverseRopeArgs;
use crate::args::routing::{HashTopkArgs, RealTokens};
use crate::args::store::{StoreCompressedArgs, StoreSwaArgs};
use crate::backend::{rules, Backend, BackendKind, CopyKind, Stream};
use crate::error::Result;
use crate::tensor::{IndexVector, View};

/// A backend whose every operation first checks its device values on host
/// copies.
#[derive(Debug)]
pub struct Validating<B> {
    inner: B,
}

impl<B: Backend> Validating<B> {
    pub fn new(inner: B) -> Self {
        Validating { inner }
    }

    /// Host copy of a view's span, queued on `stream` after the work that wrote
    /// it, and the view rebased onto it. Read it only after synchronizing the
    /// stream once for all the copies of a call.
    fn mirror<T: Copy + Default, const N: usize>(
        &self,
        v: &View<T, N>,
        stream: Stream,
    ) -> Result<(Vec<T>, View<T, N>)> {
        let mut host = vec![T::default(); v.span_elems()];
        let bytes = std::mem::size_of_val(host.as_slice());
        // SAFETY: the view spans `bytes` of device memory (checked by `ops`).
        unsafe {
            self.inner.copy(
                host.as_mut_ptr() as *mut u8,
                v.as_ptr() as *const u8,
                bytes,
                CopyKind::DeviceToHost,
                stream,
            )?
        };
        let view = v.rebased(host.as_mut_ptr());
        Ok((host, view))
    }

    fn mirror_opt<T: Copy + Default, const N: usize>(
        &self,
        v: &Option<View<T, N>>,
        stream: Stream,
    ) -> Result<(Vec<T>, Option<View<T, N>>)> {
        match v {
            Some(v) => self.mirror(v, stream).map(|(h, v)| (h, Some(v))),
            None => Ok((Vec::new(), None)),
        }
    }

    /// `mirror` of an i32-or-i64 vector; the first value owns the host copy.
    fn mirror_ints(
        &self,
        v: &IndexVector,
        stream: Stream,
    ) -> Result<(Box<dyn std::any::Any>, IndexVector)> {
        Ok(match v {
            IndexVector::I32(v) => {
                let (host, v) = self.mirror(v, stream)?;
                (Box::new(host), IndexVector::I32(v))
            }
            IndexVector::I64(v) => {
                let (host, v) = self.mirror(v, stream)?;
                (Box::new(host), IndexVector::I64(v))
            }
        })
    }

    /// `len` positions against a table of `max_pos` rows.
    fn check_positions(
        &self,
        p: &IndexVector,
        len: usize,
        max_pos: usize,
        stream: Stream,
    ) -> Result<()> {
        let (_h, host) = self.mirror_ints(p, stream)?;
        self.inner.synchronize(stream)?;
        // SAFETY: `host` is a host copy of the validated view.
        unsafe { rules::rope::checked_positions(&host, len, max_pos) }.map(drop)
    }

    /// A cache store's locations.
    fn check_cache_locations(&self, target: &CacheTarget, stream: Stream) -> Result<()> {
        let (_l, loc) = self.mirror_ints(&target.loc, stream)?;
        self.inner.synchronize(stream)?;
        rules::cache_store::destinations(&CacheTarget { loc, ..*target }).map(drop)
    }
}

impl<B: Backend> Backend for Validating<B> {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }

    fn healthy(&self) -> bool {
        self.inner.healthy()
    }

    fn worker_threads(&self) -> usize {
        self.inner.worker_threads()
    }

    fn alloc(&self, bytes: usize) -> Result<*mut u8> {
        self.inner.alloc(bytes)
    }

    unsafe fn free(&self, ptr: *mut u8) -> Result<()> {
        self.inner.free(ptr)
    }

    unsafe fn memset(&self, ptr: *mut u8, value: u8, bytes: usize, stream: Stream) -> Result<()> {
        self.inner.memset(ptr, value, bytes, stream)
    }

    unsafe fn copy(
        &self,
        dst: *mut u8,
        src: *const u8,
        bytes: usize,
        kind: CopyKind,
        stream: Stream,
    ) -> Result<()> {
        self.inner.copy(dst, src, bytes, kind, stream)
    }

    fn synchronize(&self, stream: Stream) -> Result<()> {
        self.inner.synchronize(stream)
    }

    fn plan_attention(&self, shape: &PlanShape) -> Result<PlannedLaunch> {
        self.inner.plan_attention(shape)
    }

    fn store_swa(&self, a: &StoreSwaArgs, stream: Stream) -> Result<()> {
        let (_b, batch_id) = self.mirror(&a.batch_id, stream)?;
        let (_s, req_slots) = self.mirror(&a.req_slots, stream)?;
        let (_p, positions) = self.mirror(&a.positions, stream)?;
        let (_f, final_pos) = self.mirror_opt(&a.final_pos, stream)?;
        let host = StoreSwaArgs {
            batch_id,
            req_slots,
            positions,
            final_pos,
            ..*a
        };
        self.inner.synchronize(stream)?;
        rules::store::swa_moves(&host)?;
        self.inner.store_swa(a, stream)
    }

    fn store_compressed(&self, a: &StoreCompressedArgs, stream: Stream) -> Result<()> {
        let (_l, loc) = self.mirror(&a.loc, stream)?;
        self.inner.synchronize(stream)?;
        rules::store::check_locations(&StoreCompressedArgs { loc, ..*a })?;
        self.inner.store_compressed(a, stream)
    }

    fn store_flashmla(&self, a: &FlashMlaStoreArgs, stream: Stream) -> Result<()> {
        self.check_cache_locations(&a.target, stream)?;
        self.inner.store_flashmla(a, stream)
    }

    fn store_indexer(&self, a: &IndexerStoreArgs, stream: Stream) -> Result<()> {
        self.check_cache_locations(&a.target, stream)?;
        self.inner.store_indexer(a, stream)
    }

    fn store_scaled_fp8(&self, a: &ScaledStoreArgs, stream: Stream) -> Result<()> {
        self.check_cache_locations(&a.target, stream)?;
        self.inner.store_scaled_fp8(a, stream)
    }

    fn prepare_qkv(
        &self,
        a: &PrepareQkvArgs,
        indexer: Option<&IndexerQueryArgs>,
        stream: Stream,
    ) -> Result<()> {
        if let Some(q) = indexer {
            self.check_positions(&q.positions, q.num_tokens, q.rope_table.shape[0], stream)?;
        }
        let (_p, positions) = self.mirror_ints(&a.positions, stream)?;
        let (_r, rows) = match &a.rows {
            Some(r) => {
                let (host, r) = self.mirror_ints(r, stream)?;
                (Some(host), Some(r))
            }
            None => (None, None),
        };
        self.inner.synchronize(stream)?;
        rules::prepare::destinations(&PrepareQkvArgs {
            positions,
            rows,
            ..*a
        })?;
        self.inner.prepare_qkv(a, indexer, stream)
    }

    fn build_decode_streams(&self, a: &DecodeStreamsArgs, stream: Stream) -> Result<()> {
        let (_b, batch_id) = self.mirror(&a.batch_id, stream)?;
        let (_s, req_slots) = self.mirror(&a.req_slots, stream)?;
        let (_p, positions) = self.mirror(&a.positions, stream)?;
        let (_c, c128_page_indices) = self.mirror_opt(&a.c128_page_indices, stream)?;
        let host = DecodeStreamsArgs {
            batch_id,
            req_slots,
            positions,
            c128_page_indices,
            ..*a
        };
        self.inner.synchronize(stream)?;
        rules::index::decode_plan(&host)?;
        self.inner.build_decode_streams(a, stream)
    }

    fn fill_csa_tail(&self, a: &CsaTailArgs, stream: Stream) -> Result<()> {
        let (_b, batch_id) = self.mirror(&a.batch_id, stream)?;
        let (_p, positions) = self.mirror(&a.positions, stream)?;
        let (_t, csa_page_indices) = self.mirror(&a.csa_page_indices, stream)?;
        let (_i, indptr) = self.mirror(&a.csa.indptr, stream)?;
        let csa = StreamOut { indptr, ..a.csa };
        let host = CsaTailArgs {
            batch_id,
            positions,
            csa_page_indices,
            csa,
            ..*a
        };
        self.inner.synchronize(stream)?;
        rules::index::csa_tails(&host)?;
        self.inner.fill_csa_tail(a, stream)
    }

    fn build_prefill_streams(&self, a: &PrefillStreamsArgs, stream: Stream) -> Result<()> {
        let (_b, batch_id) = self.mirror(&a.batch_id, stream)?;
        let (_s, req_slots) = self.mirror(&a.req_slots, stream)?;
        let (_p, positions) = self.mirror(&a.positions, stream)?;
        let (_c, chunk_start) = self.mirror(&a.chunk_start, stream)?;
        let (_e, extend_start) = self.mirror(&a.extend_start, stream)?;
        let (_t, page_indices) = self.mirror_opt(&a.page_indices, stream)?;
        let host = PrefillStreamsArgs {
            batch_id,
            req_slots,
            positions,
            chunk_start,
            extend_start,
            page_indices,
            ..*a
        };
        self.inner.synchronize(stream)?;
        rules::index::prefill_plan(&host)?;
        self.inner.build_prefill_streams(a, stream)
    }

    fn attention(&self, a: &AttentionArgs, stream: Stream) -> Result<()> {
        for src in a.sources() {
            let (_p, indptr) = self.mirror(&src.indptr, stream)?;
            let (_i, indices) = self.mirror(&src.indices, stream)?;
            let host = KvSource {
                indptr,
                indices,
                ..*src
            };
            self.inner.synchronize(stream)?;
            rules::attention::check_source(&host, a.num_tokens, a.skip_negative)?;
        }
        if let Some(e) = &a.inverse_rope {
            self.check_positions(&e.positions, a.num_tokens, e.table.shape[0], stream)?;
        }
        self.inner.attention(a, stream)
    }

    fn merge(&self, a: &MergeArgs, stream: Stream) -> Result<()> {
        self.inner.merge(a, stream)
    }

    fn inverse_rope(&self, a: &InverseRopeArgs, stream: Stream) -> Result<()> {
        self.check_positions(&a.positions, a.num_tokens, a.table.shape[0], stream)?;
        self.inner.inverse_rope(a, stream)
    }

    fn indexer_prepare_q(&self, a: &IndexerQueryArgs, stream: Stream) -> Result<()> {
        self.check_positions(&a.positions, a.num_tokens, a.rope_table.shape[0], stream)?;
        self.inner.indexer_prepare_q(a, stream)
    }

    fn indexer_prepare_k(&self, a: &IndexerKeyArgs, stream: Stream) -> Result<()> {
        let n = a.target.num_tokens;
        self.check_positions(&a.positions, n, a.rope_table.shape[0], stream)?;
        self.check_cache_locations(&a.target, stream)?;
        self.inner.indexer_prepare_k(a, stream)
    }

    fn indexer_topk(&self, a: &IndexerTopkArgs, stream: Stream) -> Result<()> {
        let s = &a.select;
        let (_b, batch_id) = self.mirror(&s.batch_id, stream)?;
        let (_p, positions) = self.mirror_ints(&s.positions, stream)?;
        let (_t, page_table) = self.mirror(&s.page_table, stream)?;
        let (_i, indptr) = match &a.csa {
            Some(c) => {
                let (host, v) = self.mirror(&c.stream.indptr, stream)?;
                (Some(host), Some(v))
            }
            None => (None, None),
        };
        self.inner.synchronize(stream)?;
        let select = TopkSelect {
            batch_id,
            positions,
            page_table,
            ..*s
        };
        let host = IndexerTopkArgs { select, ..*a };
        let rows = rules::indexer::topk_rows(&host)?;
        if let (Some(c), Some(indptr)) = (&a.csa, indptr) {
            let stream = StreamOut { indptr, ..c.stream };
            rules::indexer::topk_csa_tails(&host, &rows, &TopkCsaTail { stream, ..*c })?;
        }
        self.inner.indexer_topk(a, stream)
    }

    fn hash_topk(&self, a: &HashTopkArgs, stream: Stream) -> Result<()> {
        let (_i, input_ids) = self.mirror_ints(&a.input_ids, stream)?;
        let (_t, tid2eid) = self.mirror(&a.tid2eid, stream)?;
        let (_r, real_tokens) = match &a.real_tokens {
            RealTokens::Device(v) => {
                let (host, v) = self.mirror_ints(v, stream)?;
                (Some(host), RealTokens::Device(v))
            }
            RealTokens::Host(_) => (None, a.real_tokens),
        };
        self.inner.synchronize(stream)?;
        let host = HashTopkArgs {
            input_ids,
            tid2eid,
            real_tokens,
            ..*a
        };
        rules::routing::row_experts(&host, rules::routing::real_rows(&host)?)?;
        self.inner.hash_topk(a, stream)
    }

    fn clear_state(&self, state: &StateView, slot: Option<usize>, stream: Stream) -> Result<()> {
        self.inner.clear_state(state, slot, stream)
    }

    fn compress(&self, a: &CompressArgs, stream: Stream) -> Result<()> {
        let (_b, batch_id) = self.mirror(&a.batch_id, stream)?;
        let (_s, req_slots) = self.mirror(&a.req_slots, stream)?;
        let (_p, positions) = self.mirror_ints(&a.positions, stream)?;
        let (_l, loc) = self.mirror_ints(&a.loc, stream)?;
        self.inner.synchronize(stream)?;
        rules::compressor::compress_plan(&CompressArgs {
            batch_id,
            req_slots,
            positions,
            loc,
            ..*a
        })?;
        self.inner.compress(a, stream)
    }
}
