//! Pool sizes before creation: the geometry `unikv_pool_create` would give,
//! from the parameters alone, so a caller adopting its own buffers can size
//! them without restating the row formula.

use crate::error::Result;
use crate::ffi::boundary::{boundary, write_info};
use crate::ffi::pool::{
    layer_info, pool_info, read_pool_params, unikv_pool_info, unikv_pool_layer_info,
    unikv_pool_params,
};
use crate::ffi::status::unikv_status;
use crate::geometry::Geometry;
use crate::pool::{check_pool, LayerBuffers};

/// Reads and checks `params` exactly as `unikv_pool_create` does.
pub(crate) unsafe fn geometry_of(
    params: *const unikv_pool_params,
) -> Result<(Geometry, crate::ffi::pool::PoolRequest)> {
    let request = read_pool_params(params)?;
    let geometry = check_pool(
        request.config.clone(),
        request.dtype,
        request.adopt.as_deref(),
        request.adopt_state.as_deref(),
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
/// 512 for FP8), `rope_bytes` for `params->rope_buffers[layer]` (rows * 128
/// for FP8 pools, 0 for bf16) and `state_bytes` for
/// `params->state_buffers[layer]` (0 without compressor state). `data`,
/// `rope_data` and `state_data` are the caller's buffers when `params` adopts
/// them, NULL otherwise. No pool is created and
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
        let buffers = request.adopt.as_ref().map_or(
            LayerBuffers {
                data: std::ptr::null_mut(),
                rope: std::ptr::null_mut(),
            },
            |a| a[layer],
        );
        let state = request
            .adopt_state
            .as_ref()
            .map_or(std::ptr::null_mut(), |s| s[layer]);
        write_info(info, layer_info(&g, request.dtype, layer, buffers, state))
    })
}
