//! Positions into a RoPE table, shared by inverse RoPE, decode's epilogue,
//! prepare_qkv and the indexer's preparation.

use crate::backend::host;
use crate::error::{ensure, Result};
use crate::tensor::IndexVector;

/// The first `len` positions, widened to i64, each checked against the
/// table's `max_pos` rows (inverse RoPE, decode's epilogue, prepare_qkv).
/// `Validating` runs it on a host copy.
///
/// # Safety
/// `positions` is a host view of at least `len` entries.
pub(crate) unsafe fn checked_positions(
    positions: &IndexVector,
    len: usize,
    max_pos: usize,
) -> Result<Vec<i64>> {
    let values = host::int_values(positions, len);
    for (t, &p) in values.iter().enumerate() {
        ensure!(p >= 0, OutOfRange, "positions[{t}]: {p} is negative");
        ensure!(
            (p as u64) < max_pos as u64,
            OutOfRange,
            "positions[{t}]: {p} is not below the {max_pos} rows of rope_table"
        );
    }
    Ok(values)
}
