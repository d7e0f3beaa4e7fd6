//! Index-stream builders (docs/index-streams.md §3, §5).
//!
//! Slice order inside one token's decode slice: the SWA window first (oldest to
//! newest), then the compressed entries in table order. Padding tokens
//! (`batch_id < 0`) get zero-length slices. Index buffers are sized for the
//! worst case so a launch never depends on the values it is given.

use crate::args::index::{CsaTailArgs, DecodeStreamsArgs, PrefillStreamsArgs, StreamOut};
use crate::backend::Stream;
use crate::error::{ensure, Result};
use crate::geometry::Ratio;
use crate::ops::aliasing::{self, input, output};
use crate::ops::tokens;
use crate::pool::Pool;
use crate::tensor::{checked_mul, Extent, RawTensor};

/// Caller arguments of `build_decode_streams`.
#[derive(Debug, Clone, Copy)]
pub struct DecodeStreamsRaw {
    pub num_tokens: usize,
    pub csa_topk: u32,
    pub batch_id: RawTensor,
    pub req_slots: RawTensor,
    pub positions: RawTensor,
    pub c128_page_indices: RawTensor,
    pub swa_indptr: RawTensor,
    pub swa_indices: RawTensor,
    pub hca_indptr: RawTensor,
    pub hca_indices: RawTensor,
    pub csa_indptr: RawTensor,
    pub csa_indices: RawTensor,
}

/// Caller arguments of `fill_csa_tail`.
#[derive(Debug, Clone, Copy)]
pub struct CsaTailRaw {
    pub num_tokens: usize,
    pub batch_id: RawTensor,
    pub positions: RawTensor,
    pub csa_page_indices: RawTensor,
    pub csa_indptr: RawTensor,
    pub csa_indices: RawTensor,
}

/// Caller arguments of `build_prefill_streams`.
#[derive(Debug, Clone, Copy)]
pub struct PrefillStreamsRaw {
    pub num_tokens: usize,
    pub compress_ratio: u32,
    pub batch_id: RawTensor,
    pub req_slots: RawTensor,
    pub positions: RawTensor,
    pub chunk_start: RawTensor,
    pub extend_start: RawTensor,
    pub page_indices: RawTensor,
    pub prefix_indptr: RawTensor,
    pub prefix_indices: RawTensor,
    pub extend_indptr: RawTensor,
    pub extend_indices: RawTensor,
}

/// Argument names of one output stream (static: no formatting on the launch path).
struct StreamNames {
    indptr: &'static str,
    indices: &'static str,
}

fn stream_out(
    names: StreamNames,
    indptr: &RawTensor,
    indices: &RawTensor,
    num_tokens: usize,
    per_token: usize,
) -> Result<StreamOut> {
    let indices_name = names.indices;
    let capacity = checked_mul(indices_name, num_tokens, per_token)?;
    ensure!(
        capacity <= i32::MAX as usize,
        CapacityExceeded,
        "{indices_name}: {capacity} entries do not fit 32-bit offsets"
    );
    let out = StreamOut {
        indptr: indptr.view(names.indptr, [Extent::AtLeast(num_tokens + 1)], 4)?,
        indices: indices.view(indices_name, [Extent::AtLeast(0)], 4)?,
    };
    ensure!(
        out.indices.shape[0] >= capacity,
        CapacityExceeded,
        "{indices_name}: holds {} entries, the worst case for {num_tokens} tokens is {capacity}",
        out.indices.shape[0]
    );
    Ok(out)
}

/// A compressed stream of `build_decode_streams`: required when the pool has
/// a layer of `ratio`, optional (both tensors absent) otherwise.
fn compressed_stream_out(
    pool: &Pool,
    ratio: Ratio,
    names: StreamNames,
    indptr: &RawTensor,
    indices: &RawTensor,
    num_tokens: usize,
    per_token: usize,
) -> Result<Option<StreamOut>> {
    let absent = indptr.data.is_null() && indices.data.is_null();
    let needed = pool.geometry().config.ratios.contains(&ratio);
    if absent && !needed {
        return Ok(None);
    }
    ensure!(
        !absent,
        NullArgument,
        "{} (the pool has ratio-{} layers, so their stream is required)",
        names.indptr,
        ratio.value()
    );
    stream_out(names, indptr, indices, num_tokens, per_token).map(Some)
}

pub fn build_decode_streams(pool: &Pool, raw: &DecodeStreamsRaw, stream: Stream) -> Result<()> {
    pool.context().check_usable()?;
    let geometry = pool.geometry();
    let t = raw.num_tokens;
    let win = geometry.config.window;
    let c128_page_indices =
        raw.c128_page_indices
            .optional("c128_page_indices", [tokens(t), Extent::AtLeast(0)], 4)?;
    let c128_width = c128_page_indices.map_or(0, |m| m.shape[1]);
    let csa_topk = raw.csa_topk as usize;
    let hca = compressed_stream_out(
        pool,
        Ratio::Hca,
        StreamNames {
            indptr: "hca_indptr",
            indices: "hca_indices",
        },
        &raw.hca_indptr,
        &raw.hca_indices,
        t,
        win.saturating_add(c128_width),
    )?;
    let csa = compressed_stream_out(
        pool,
        Ratio::Csa,
        StreamNames {
            indptr: "csa_indptr",
            indices: "csa_indices",
        },
        &raw.csa_indptr,
        &raw.csa_indices,
        t,
        win.saturating_add(csa_topk),
    )?;
    // Row ids of the largest stream built must fit int32 (CSA rows are the
    // most of any ratio, then HCA's, then the SWA region alone).
    geometry.check_row_ids(match (&csa, &hca) {
        (Some(_), _) => Ratio::Csa,
        (None, Some(_)) => Ratio::Hca,
        (None, None) => Ratio::Dense,
    })?;
    let args = DecodeStreamsArgs {
        geometry,
        num_tokens: t,
        csa_topk,
        batch_id: raw.batch_id.view("batch_id", [tokens(t)], 4)?,
        req_slots: raw.req_slots.view("req_slots", [Extent::AtLeast(1)], 4)?,
        positions: raw.positions.view("positions", [tokens(t)], 4)?,
        c128_page_indices,
        swa: stream_out(
            StreamNames {
                indptr: "swa_indptr",
                indices: "swa_indices",
            },
            &raw.swa_indptr,
            &raw.swa_indices,
            t,
            win,
        )?,
        hca,
        csa,
    };
    aliasing::check(
        &[
            output("swa_indptr", &args.swa.indptr),
            output("swa_indices", &args.swa.indices),
            output("hca_indptr", &args.hca.map(|s| s.indptr)),
            output("hca_indices", &args.hca.map(|s| s.indices)),
            output("csa_indptr", &args.csa.map(|s| s.indptr)),
            output("csa_indices", &args.csa.map(|s| s.indices)),
            input("batch_id", &args.batch_id),
            input("req_slots", &args.req_slots),
            input("positions", &args.positions),
            input("c128_page_indices", &args.c128_page_indices),
        ],
        &[],
    )?;
    pool.context().backend().build_decode_streams(&args, stream)
}

pub fn fill_csa_tail(pool: &Pool, raw: &CsaTailRaw, stream: Stream) -> Result<()> {
    pool.context().check_usable()?;
    pool.geometry().check_row_ids(Ratio::Csa)?;
    let t = raw.num_tokens;
    let args = CsaTailArgs {
        geometry: pool.geometry(),
        num_tokens: t,
        batch_id: raw.batch_id.view("batch_id", [tokens(t)], 4)?,
        positions: raw.positions.view("positions", [tokens(t)], 4)?,
        csa_page_indices: raw.csa_page_indices.view(
            "csa_page_indices",
            [tokens(t), Extent::AtLeast(0)],
            4,
        )?,
        csa: StreamOut {
            indptr: raw
                .csa_indptr
                .view("csa_indptr", [Extent::AtLeast(t + 1)], 4)?,
            indices: raw
                .csa_indices
                .view("csa_indices", [Extent::AtLeast(0)], 4)?,
        },
    };
    // csa_indices is updated in place by design: the one output.
    aliasing::check(
        &[
            output("csa_indices", &args.csa.indices),
            input("batch_id", &args.batch_id),
            input("positions", &args.positions),
            input("csa_page_indices", &args.csa_page_indices),
            input("csa_indptr", &args.csa.indptr),
        ],
        &[],
    )?;
    pool.context().backend().fill_csa_tail(&args, stream)
}

pub fn build_prefill_streams(pool: &Pool, raw: &PrefillStreamsRaw, stream: Stream) -> Result<()> {
    pool.context().check_usable()?;
    let geometry = pool.geometry();
    let t = raw.num_tokens;
    let win = geometry.config.window;
    let ratio = Ratio::from_raw("compress_ratio", raw.compress_ratio)?;
    geometry.check_row_ids(ratio)?;
    let page_indices = match ratio {
        Ratio::Dense => None,
        _ => Some(
            raw.page_indices
                .view("page_indices", [tokens(t), Extent::AtLeast(0)], 4)?,
        ),
    };
    let width = page_indices.map_or(0, |m| m.shape[1]);
    let req_slots = raw.req_slots.view("req_slots", [Extent::AtLeast(1)], 4)?;
    let requests = req_slots.shape[0];
    let args = PrefillStreamsArgs {
        geometry,
        num_tokens: t,
        ratio,
        batch_id: raw.batch_id.view("batch_id", [tokens(t)], 4)?,
        req_slots,
        positions: raw.positions.view("positions", [tokens(t)], 4)?,
        chunk_start: raw
            .chunk_start
            .view("chunk_start", [Extent::AtLeast(requests)], 4)?,
        extend_start: raw
            .extend_start
            .view("extend_start", [Extent::AtLeast(requests)], 4)?,
        page_indices,
        prefix: stream_out(
            StreamNames {
                indptr: "prefix_indptr",
                indices: "prefix_indices",
            },
            &raw.prefix_indptr,
            &raw.prefix_indices,
            t,
            win.saturating_add(width),
        )?,
        extend: stream_out(
            StreamNames {
                indptr: "extend_indptr",
                indices: "extend_indices",
            },
            &raw.extend_indptr,
            &raw.extend_indices,
            t,
            win,
        )?,
    };
    aliasing::check(
        &[
            output("prefix_indptr", &args.prefix.indptr),
            output("prefix_indices", &args.prefix.indices),
            output("extend_indptr", &args.extend.indptr),
            output("extend_indices", &args.extend.indices),
            input("batch_id", &args.batch_id),
            input("req_slots", &args.req_slots),
            input("positions", &args.positions),
            input("chunk_start", &args.chunk_start),
            input("extend_start", &args.extend_start),
            input("page_indices", &args.page_indices),
        ],
        &[],
    )?;
    pool.context()
        .backend()
        .build_prefill_streams(&args, stream)
}
