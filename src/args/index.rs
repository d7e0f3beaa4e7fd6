//! The index-stream builders' contract (slice order: `ops::index`).

use crate::geometry::{Geometry, Ratio};
use crate::tensor::{Matrix, Vector};

/// One ragged stream: `indptr[T+1]` and the index buffer it points into.
#[derive(Debug, Clone, Copy)]
pub struct StreamOut {
    pub indptr: Vector<i32>,
    pub indices: Vector<i32>,
}

/// Validated `build_decode_streams`. Per non-padding token t of request b:
/// `swa_len = min(pos + 1, window)`; `hca_len` = leading entries >= 0 of
/// `c128_page_indices[t]` within `min((pos + 1) / 128, width)`;
/// `csa_len = min((pos + 1) / 4, csa_topk)` (its tail is written per layer by
/// `fill_csa_tail`). The HCA and CSA streams are None when the caller left
/// them out (allowed only for a pool without layers of that ratio).
#[derive(Debug)]
pub struct DecodeStreamsArgs<'a> {
    pub geometry: &'a Geometry,
    pub num_tokens: usize,
    pub csa_topk: usize,
    pub batch_id: Vector<i32>,
    pub req_slots: Vector<i32>,
    pub positions: Vector<i32>,
    pub c128_page_indices: Option<Matrix<i32>>,
    pub swa: StreamOut,
    pub hca: Option<StreamOut>,
    pub csa: Option<StreamOut>,
}

/// Validated `fill_csa_tail`: for each non-padding token, the slice tail after
/// its `min(pos + 1, window)` SWA entries receives `swa_rows + page_indices[t, j]`.
#[derive(Debug)]
pub struct CsaTailArgs<'a> {
    pub geometry: &'a Geometry,
    pub num_tokens: usize,
    pub batch_id: Vector<i32>,
    pub positions: Vector<i32>,
    pub csa_page_indices: Matrix<i32>,
    pub csa: StreamOut,
}

/// Validated `build_prefill_streams` (docs/index-streams.md §5). Per non-padding token:
/// prefix = ring rows of the window part before the chunk, then compressed rows
/// (leading valid entries of the table within the token's visible groups);
/// extend = rows of the chunk's own K tensor inside the window.
#[derive(Debug)]
pub struct PrefillStreamsArgs<'a> {
    pub geometry: &'a Geometry,
    pub num_tokens: usize,
    pub ratio: Ratio,
    pub batch_id: Vector<i32>,
    pub req_slots: Vector<i32>,
    pub positions: Vector<i32>,
    pub chunk_start: Vector<i32>,
    pub extend_start: Vector<i32>,
    pub page_indices: Option<Matrix<i32>>,
    pub prefix: StreamOut,
    pub extend: StreamOut,
}
