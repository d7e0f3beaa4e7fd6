//! The pool stores' device values: requests, slots, positions and locations.

use crate::args::store::{StoreCompressedArgs, StoreSwaArgs};
use crate::backend::host::slice;
use crate::error::{ensure, err, Result};

/// Checks a request index and returns its slot.
pub(super) fn request_slot(t: usize, b: i32, req_slots: &[i32], num_slots: usize) -> Result<usize> {
    ensure!(
        (b as usize) < req_slots.len(),
        OutOfRange,
        "batch_id[{t}]: {b} is not below the number of requests {}",
        req_slots.len()
    );
    let slot = req_slots[b as usize];
    ensure!(
        slot >= 0 && (slot as usize) < num_slots,
        OutOfRange,
        "req_slots[{b}]: {slot} is not a slot of this pool (0..{num_slots})"
    );
    Ok(slot as usize)
}

/// Checks a position value.
pub(super) fn position(t: usize, pos: i32) -> Result<usize> {
    ensure!(pos >= 0, OutOfRange, "positions[{t}]: {pos} is negative");
    Ok(pos as usize)
}

/// Checks every row's request, slot and position and returns the (row, ring
/// row) moves. Reads only the integer arguments, so `Validating` runs it on host
/// copies.
pub(crate) fn swa_moves(a: &StoreSwaArgs) -> Result<Vec<(usize, usize)>> {
    let g = a.geometry;
    let n = a.num_tokens;
    // SAFETY: host views with extents checked by `ops::store`.
    let (batch, slots, positions) = unsafe {
        (
            slice(&a.batch_id, n),
            slice(&a.req_slots, a.req_slots.shape[0]),
            slice(&a.positions, n),
        )
    };
    let final_pos = a
        .final_pos
        // SAFETY: as above.
        .map(|v| unsafe { slice(&v, slots.len()) });
    let mut moves = Vec::with_capacity(n);
    for t in 0..n {
        let b = batch[t];
        if b < 0 {
            continue;
        }
        let slot = request_slot(t, b, slots, g.num_slots)?;
        let pos = position(t, positions[t])?;
        if let Some(last) = final_pos {
            // Outside the final window: a later token of the chunk owns this row.
            if (pos as i64) <= last[b as usize] as i64 - g.config.window as i64 {
                continue;
            }
        }
        moves.push((t, g.swa_row(slot, pos)));
    }
    // Two rows aimed at one ring row would race on a GPU; refuse them here too.
    let mut owner = std::collections::HashMap::with_capacity(moves.len());
    for &(t, dst) in &moves {
        if let Some(first) = owner.insert(dst, t) {
            return Err(err!(
                InvalidArgument,
                "positions[{t}]: token {t} and token {first} both map to ring row {dst}; a request's rows \
                 must span at most `ring` positions (pass final_pos for prefill chunks)"
            ));
        }
    }
    Ok(moves)
}

/// Checks every compressed location (see `swa_moves` on host copies).
pub(crate) fn check_locations(a: &StoreCompressedArgs) -> Result<()> {
    // SAFETY: host view with extent checked by `ops::store`.
    let loc = unsafe { slice(&a.loc, a.num_rows) };
    for (i, &l) in loc.iter().enumerate() {
        ensure!(
            l < 0 || (l as usize) < a.compressed_rows,
            OutOfRange,
            "loc[{i}]: {l} is not below the layer's {} compressed rows",
            a.compressed_rows
        );
    }
    Ok(())
}
