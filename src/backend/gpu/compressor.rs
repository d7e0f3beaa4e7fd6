//! The compressor's shim params: the state rows a clear covers, and a
//! compress call's views, target and flags.

use std::os::raw::c_void;

use super::{format_code, i32_of, pool_rows, shim};
use crate::args::compressor::{CompressArgs, CompressMode, CompressTarget, NormWeight, StateView};
use crate::error::Result;
use crate::fp8::Fp8Format;

/// The ring rows of one slot (or of every slot) of a compressor state.
pub(super) fn clear_params(
    state: &StateView,
    slot: Option<usize>,
) -> Result<shim::CompressClearParams> {
    let g = &state.geometry;
    let (first, rows) = match slot {
        Some(s) => (s * g.ring, g.ring),
        None => (0, g.slots * g.ring),
    };
    Ok(shim::CompressClearParams {
        // SAFETY: the rows lie inside the state (first + rows <= slots * ring).
        rows: unsafe { state.data.add(first * g.row_floats()) },
        num_rows: rows as i64,
        row_floats: i32_of("row_floats", g.row_floats())?,
        reserved: 0,
    })
}

/// Where a compress call stores its groups, as the params encode it.
struct Target {
    /// 0 pool rows, 1 FlashMLA cache, 2 indexer cache.
    kind: i32,
    pool: shim::PoolRows,
    swa_rows: i64,
    cache: *mut u8,
    bytes_per_page: i64,
    page_size: u64,
    format: u32,
}

impl Target {
    fn of(target: &CompressTarget) -> Target {
        let cache_target =
            |kind, cache: *mut u8, bytes_per_page: u64, page_size: u64, format: Fp8Format| Target {
                kind,
                pool: shim::PoolRows {
                    data: std::ptr::null_mut(),
                    rope: std::ptr::null_mut(),
                    fp8: 0,
                    fp8_format: 0,
                },
                swa_rows: 0,
                cache,
                bytes_per_page: bytes_per_page as i64,
                page_size,
                format: format_code(format),
            };
        match target {
            CompressTarget::Pool { rows, swa_rows, .. } => Target {
                kind: 0,
                pool: pool_rows(rows).0,
                swa_rows: *swa_rows as i64,
                cache: std::ptr::null_mut(),
                bytes_per_page: 0,
                page_size: 1,
                format: 0,
            },
            CompressTarget::FlashMla {
                geometry,
                cache,
                page_size,
            } => cache_target(
                1,
                cache.as_ptr(),
                geometry.bytes_per_page(),
                *page_size,
                geometry.format(),
            ),
            CompressTarget::Indexer {
                geometry,
                cache,
                page_size,
            } => cache_target(
                2,
                cache.as_ptr(),
                geometry.bytes_per_page(),
                *page_size,
                geometry.format(),
            ),
        }
    }
}

/// A compress call's params (views validated by `ops::compressor`).
pub(super) fn params(a: &CompressArgs) -> Result<shim::CompressParams> {
    let g = &a.state.geometry;
    let t = Target::of(&a.target);
    debug_assert!(t.page_size.is_power_of_two());
    let (norm_weight, weight_f32) = match &a.norm_weight {
        NormWeight::Bf16(w) => (w.as_ptr() as *const c_void, 0),
        NormWeight::F32(w) => (w.as_ptr() as *const c_void, 1),
    };
    Ok(shim::CompressParams {
        kv_score: a.kv_score.as_ptr() as *const c_void,
        ape: a.ape.as_ptr(),
        norm_weight,
        rope_table: a.rope_table.as_ptr(),
        batch_id: a.batch_id.as_ptr(),
        req_slots: a.req_slots.as_ptr(),
        positions: a.positions.as_ptr() as *const c_void,
        loc: a.loc.as_ptr() as *const c_void,
        state: a.state.data,
        cache: t.cache,
        pool: t.pool,
        kv_stride: a.kv_score.row_stride() as i64,
        ape_stride: a.ape.strides[0] as i64,
        table_stride: a.rope_table.strides[0] as i64,
        max_pos: a.rope_table.shape[0] as i64,
        capacity: a.target.capacity() as i64,
        swa_rows: t.swa_rows,
        bytes_per_page: t.bytes_per_page,
        page_shift: t.page_size.trailing_zeros() as i32,
        num_tokens: i32_of("num_tokens", a.num_tokens)?,
        num_requests: a.req_slots.shape[0].min(i32::MAX as usize) as i32,
        num_slots: i32_of("num_slots", g.slots)?,
        ring: i32_of("ring", g.ring)?,
        ratio: i32_of("ratio", g.ratio.value())?,
        dim: i32_of("dim", g.dim())?,
        target: t.kind,
        prefill: i32::from(a.mode == CompressMode::Prefill),
        kv_f32: i32::from(a.kv_score.is_f32()),
        weight_f32,
        positions_i64: i32::from(a.positions.is_i64()),
        loc_i64: i32::from(a.loc.is_i64()),
        format: t.format,
        eps: a.eps,
        reserved: 0,
    })
}
