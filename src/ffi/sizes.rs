//! Pool sizes before creation: the geometry `unikv_pool_create` would give,
//! from the parameters alone, so a caller adopting its own buffers can size
//! them without restating the row formula.

use std::os::raw::c_void;

use crate::error::Result;
use crate::ffi::boundary::{boundary, write_info};
use crate::ffi::pool::{
    pool_info, read_pool_params, unikv_pool_info, unikv_pool_layer_info, unikv_pool_params,
};
use crate::ffi::status::unikv_status;
use crate::geometry::Geometry;
use crate::pool::{check_pool, layer_bytes};

/// Reads and checks `params` exactly as `unikv_pool_create` does.
unsafe fn geometry_of(
    params: *const unikv_pool_params,
) -> Result<(Geometry, crate::ffi::pool::PoolRequest)> {
    let request = read_pool_params(params)?;
    let geometry = check_pool(
        request.config.clone(),
        request.dtype,
        request.adopt.as_deref(),
    )?;
    Ok((geometry, request))
}

/// Fills `info` (host memory; set `info->struct_size` first) with the
/// pool-wide geometry a pool created from `params` would report through
/// `unikv_pool_get_info` (`slots_in_use` is 0; `owns_memory` is 1 when
/// `params->layer_buffers` is NULL), without creating a pool, allocating or
/// needing a context. `params` and its arrays are host memory read during
/// the call and are checked exactly as `unikv_pool_create` checks them (the
/// same statuses and messages, e.g. UNIKV_BAD_ENUM for a compress ratio other
/// than 0, 4 or 128; adopted buffer pointers, when given, are checked for NULL
/// and alignment but never dereferenced). Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_pool_params_get_info(
    params: *const unikv_pool_params,
    info: *mut unikv_pool_info,
) -> unikv_status {
    boundary(|| {
        let (g, request) = geometry_of(params)?;
        write_info(
            info,
            pool_info(&g, request.dtype, 0, request.adopt.is_none()),
        )
    })
}

/// Fills `info` (host memory; set `info->struct_size` first) with one layer's
/// geometry as a pool created from `params` would report it through
/// `unikv_pool_get_layer`: its row count, SWA and compressed rows, and the
/// sizes of every buffer a caller adopting its own memory must supply —
/// `bytes` for `params->layer_buffers[layer]` (rows * 1024 for bf16, rows *
/// 512 for FP8) and `rope_bytes` for `params->rope_buffers[layer]` (rows * 128
/// for FP8 pools, 0 for bf16). `data` and `rope_data` are the caller's
/// buffers when `params` adopts them, NULL otherwise. No pool is created and
/// nothing is allocated. `params` is checked exactly as `unikv_pool_create`
/// checks it; then OUT_OF_RANGE for a `layer` past `params->num_layers`.
/// Thread-safe.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_pool_params_get_layer(
    params: *const unikv_pool_params,
    layer: u32,
    info: *mut unikv_pool_layer_info,
) -> unikv_status {
    boundary(|| {
        let (g, request) = geometry_of(params)?;
        let layer = g.check_layer(layer)?;
        let rows = g.rows(layer);
        let (bytes, rope_bytes) = layer_bytes(request.dtype, rows);
        let (data, rope) = request
            .adopt
            .as_ref()
            .map_or((std::ptr::null_mut(), std::ptr::null_mut()), |a| {
                (a[layer].data, a[layer].rope)
            });
        write_info(
            info,
            unikv_pool_layer_info {
                struct_size: 0,
                data: data as *mut c_void,
                rows: rows as u64,
                swa_rows: g.swa_rows as u64,
                compressed_rows: g.compressed_rows(g.ratio(layer)) as u64,
                bytes: bytes as u64,
                compress_ratio: g.ratio(layer).value() as u32,
                reserved: 0,
                rope_data: rope as *mut c_void,
                rope_bytes: rope_bytes as u64,
            },
        )
    })
}
