//! Store path on the host: every destination row is computed and checked first,
//! then the rows are copied, so a rejected call writes nothing.

use crate::args::store::{StoreCompressedArgs, StoreSwaArgs};
use crate::backend::host::{put_layer_row, row, slice};
use crate::backend::rules::store::{check_locations, swa_moves};
use crate::error::Result;

pub fn store_swa(a: &StoreSwaArgs) -> Result<()> {
    for (t, dst) in swa_moves(a)? {
        // SAFETY: `dst` < swa_rows <= pool rows; `t` < n <= kv rows.
        unsafe { put_layer_row(&a.pool_layer, dst, row(&a.kv, t)) };
    }
    Ok(())
}

pub fn store_compressed(a: &StoreCompressedArgs) -> Result<()> {
    check_locations(a)?;
    // SAFETY: host view with extent checked by `ops::store`.
    let loc = unsafe { slice(&a.loc, a.num_rows) };
    for (i, &l) in loc.iter().enumerate() {
        if l >= 0 {
            let dst = a.geometry.compressed_row(l as usize);
            // SAFETY: dst < swa_rows + compressed_rows = pool rows; i < kv rows.
            unsafe { put_layer_row(&a.pool_layer, dst, row(&a.kv, i)) };
        }
    }
    Ok(())
}
