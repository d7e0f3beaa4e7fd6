//! The index builders' shim params: decode and prefill streams and the CSA
//! tail, each a view of the caller's stream buffers.

use super::{i32_of, shim};
use crate::args::index::{CsaTailArgs, DecodeStreamsArgs, PrefillStreamsArgs, StreamOut};
use crate::error::Result;
use crate::geometry::Ratio;

/// A stream the caller left out: the kernels skip a NULL indptr.
fn absent_stream() -> shim::StreamOut {
    shim::StreamOut {
        indptr: std::ptr::null_mut(),
        indices: std::ptr::null_mut(),
        capacity: 0,
    }
}

fn stream_out(s: &StreamOut) -> shim::StreamOut {
    shim::StreamOut {
        indptr: s.indptr.as_ptr(),
        indices: s.indices.as_ptr(),
        capacity: s.indices.shape[0] as i64,
    }
}

/// The decode streams' params: SWA, HCA and CSA index streams of each token.
pub(super) fn decode_streams_params(a: &DecodeStreamsArgs) -> Result<shim::DecodeStreamsParams> {
    let g = a.geometry;
    Ok(shim::DecodeStreamsParams {
        batch_id: a.batch_id.as_ptr(),
        req_slots: a.req_slots.as_ptr(),
        positions: a.positions.as_ptr(),
        c128: a
            .c128_page_indices
            .map_or(std::ptr::null(), |m| m.as_ptr() as *const i32),
        swa: stream_out(&a.swa),
        hca: a.hca.as_ref().map_or_else(absent_stream, stream_out),
        csa: a.csa.as_ref().map_or_else(absent_stream, stream_out),
        c128_stride: a.c128_page_indices.map_or(0, |m| m.strides[0] as i64),
        c128_width: i32_of("c128_width", a.c128_page_indices.map_or(0, |m| m.shape[1]))?,
        num_tokens: i32_of("num_tokens", a.num_tokens)?,
        num_requests: i32_of("num_requests", a.req_slots.shape[0])?,
        window: i32_of("window", g.config.window)?,
        ring: i32_of("ring", g.ring)?,
        num_slots: i32_of("num_slots", g.num_slots)?,
        swa_rows: i32_of("swa_rows", g.swa_rows)?,
        hca_rows: i32_of("hca_rows", g.compressed_rows(Ratio::Hca))?,
        csa_topk: a.csa_topk.min(i32::MAX as usize) as i32,
        reserved: 0,
    })
}

/// The CSA tail fill's params: the window and top-k part of each token's CSA stream.
pub(super) fn csa_tail_params(a: &CsaTailArgs) -> Result<shim::CsaTailParams> {
    let g = a.geometry;
    Ok(shim::CsaTailParams {
        batch_id: a.batch_id.as_ptr(),
        positions: a.positions.as_ptr(),
        table: a.csa_page_indices.as_ptr(),
        indptr: a.csa.indptr.as_ptr(),
        indices: a.csa.indices.as_ptr(),
        table_stride: a.csa_page_indices.strides[0] as i64,
        capacity: a.csa.indices.shape[0] as i64,
        width: i32_of("width", a.csa_page_indices.shape[1])?,
        num_tokens: i32_of("num_tokens", a.num_tokens)?,
        window: i32_of("window", g.config.window)?,
        swa_rows: i32_of("swa_rows", g.swa_rows)?,
        csa_rows: i32_of("csa_rows", g.compressed_rows(Ratio::Csa))?,
        reserved: 0,
    })
}

/// The prefill streams' params: each token's prefix and extend streams.
pub(super) fn prefill_streams_params(a: &PrefillStreamsArgs) -> Result<shim::PrefillStreamsParams> {
    let g = a.geometry;
    Ok(shim::PrefillStreamsParams {
        batch_id: a.batch_id.as_ptr(),
        req_slots: a.req_slots.as_ptr(),
        positions: a.positions.as_ptr(),
        chunk_start: a.chunk_start.as_ptr(),
        extend_start: a.extend_start.as_ptr(),
        table: a
            .page_indices
            .map_or(std::ptr::null(), |m| m.as_ptr() as *const i32),
        prefix: stream_out(&a.prefix),
        extend: stream_out(&a.extend),
        table_stride: a.page_indices.map_or(0, |m| m.strides[0] as i64),
        width: i32_of("width", a.page_indices.map_or(0, |m| m.shape[1]))?,
        ratio: i32_of("ratio", a.ratio.value())?,
        num_tokens: i32_of("num_tokens", a.num_tokens)?,
        num_requests: i32_of("num_requests", a.req_slots.shape[0])?,
        window: i32_of("window", g.config.window)?,
        ring: i32_of("ring", g.ring)?,
        num_slots: i32_of("num_slots", g.num_slots)?,
        swa_rows: i32_of("swa_rows", g.swa_rows)?,
        compressed_rows: i32_of("compressed_rows", g.compressed_rows(a.ratio))?,
        reserved: 0,
    })
}
