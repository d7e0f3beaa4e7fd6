//! Store entry points: SWA ring scatter and compressed-row scatter.

use std::os::raw::c_void;

use crate::backend::Stream;
use crate::ffi::boundary::{boundary, read_params, Versioned};
use crate::ffi::pool::{pool_of, unikv_pool};
use crate::ffi::status::unikv_status;
use crate::ffi::types::unikv_tensor;
use crate::ops::store::{self, StoreCompressedRaw, StoreSwaRaw};

/// Arguments of `unikv_store_swa` (docs/pool.md §9). Integer tensors are
/// 1-D contiguous i32.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_store_swa_args {
    /// sizeof(unikv_store_swa_args).
    pub struct_size: usize,
    /// Final (normed, rotated) latent rows `[>= num_tokens, 512]` bf16.
    pub kv: unikv_tensor,
    /// `[>= num_tokens]`: request of each row; negative = padding, skipped.
    pub batch_id: unikv_tensor,
    /// `[requests]`: slot of each request (0..=max_requests).
    pub req_slots: unikv_tensor,
    /// `[>= num_tokens]`: absolute position of each row.
    pub positions: unikv_tensor,
    /// Optional `[requests]`: last position of each request after this forward.
    /// Rows at `pos <= final_pos - window` are skipped, so a prefill chunk longer
    /// than the ring writes only its final window, race-free. Absent (NULL data):
    /// every row is written; a request's rows must then span at most `ring`
    /// positions (decode and verify).
    pub final_pos: unikv_tensor,
    /// Pool layer written.
    pub layer: u32,
    /// Rows of `kv` to consider.
    pub num_tokens: u32,
}

unsafe impl Versioned for unikv_store_swa_args {
    const NAME: &'static str = "args";
}

/// Arguments of `unikv_store_compressed` (docs/pool.md §9).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct unikv_store_compressed_args {
    /// sizeof(unikv_store_compressed_args).
    pub struct_size: usize,
    /// Compressed rows `[>= num_rows, 512]` bf16.
    pub kv: unikv_tensor,
    /// `[>= num_rows]` i32: compressed page index of each row; negative = skip.
    pub loc: unikv_tensor,
    /// Pool layer written.
    pub layer: u32,
    /// Rows of `kv` to consider.
    pub num_rows: u32,
}

unsafe impl Versioned for unikv_store_compressed_args {
    const NAME: &'static str = "args";
}

/// Writes each non-padding row of `kv` into its request's SWA ring at row
/// `slot * ring + pos % ring` of `layer`. Tensors are in the context's memory;
/// `args` is host memory read during the call. Runs on `stream` (ignored by the
/// CPU backend). Device values: the CPU backend checks every slot, position and
/// batch id (OUT_OF_RANGE, nothing written) and refuses two rows aimed at the
/// same ring row (INVALID_ARGUMENT); GPU backends skip invalid rows. No
/// argument may overlap the layer's pool rows (UNIKV_OVERLAPPING_BUFFERS).
/// Thread-safe for writes to disjoint rows.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_store_swa(
    pool: *const unikv_pool,
    args: *const unikv_store_swa_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let pool = pool_of(pool)?;
        let a = read_params(args, std::mem::zeroed())?;
        let raw = StoreSwaRaw {
            layer: a.layer,
            num_tokens: a.num_tokens as usize,
            kv: (&a.kv).into(),
            batch_id: (&a.batch_id).into(),
            req_slots: (&a.req_slots).into(),
            positions: (&a.positions).into(),
            final_pos: (&a.final_pos).into(),
        };
        store::store_swa(pool, &raw, Stream(stream))
    })
}

/// Writes row i of `kv` to pool row `swa_rows + loc[i]` of `layer`, skipping
/// negative locations. Memory, stream, validation and overlap rules as
/// `unikv_store_swa`; a location at or past the layer's compressed rows is
/// OUT_OF_RANGE on the CPU.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn unikv_store_compressed(
    pool: *const unikv_pool,
    args: *const unikv_store_compressed_args,
    stream: *mut c_void,
) -> unikv_status {
    boundary(|| {
        let pool = pool_of(pool)?;
        let a = read_params(args, std::mem::zeroed())?;
        let raw = StoreCompressedRaw {
            layer: a.layer,
            num_rows: a.num_rows as usize,
            kv: (&a.kv).into(),
            loc: (&a.loc).into(),
        };
        store::store_compressed(pool, &raw, Stream(stream))
    })
}
