//! prepare_qkv's device values: positions and pool rows.

use std::collections::HashMap;

use crate::args::prepare::PrepareQkvArgs;
use crate::backend::host::int_values;
use crate::backend::rules::rope::checked_positions;
use crate::error::{ensure, err, Result};

/// Token t's table row and its pool row (None: no store).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Destination {
    pub position: usize,
    pub row: Option<usize>,
}

/// Checks every position against the table, every non-negative row against
/// the layer, and that no two tokens store into one row (they would race on a
/// GPU). Reads only the integer arguments, so `Validating` runs it on host
/// copies.
pub(crate) fn destinations(a: &PrepareQkvArgs) -> Result<Vec<Destination>> {
    let n = a.num_tokens;
    let max_pos = a.rope_table.shape[0];
    let layer_rows = a.pool_layer.rows();
    // SAFETY: host views with extents checked by `ops::prepare`.
    let positions = unsafe { checked_positions(&a.positions, n, max_pos)? };
    // SAFETY: as above.
    let rows = a.rows.map(|r| unsafe { int_values(&r, n) });
    let mut owner = HashMap::new();
    let mut out = Vec::with_capacity(n);
    for (t, &p) in positions.iter().enumerate() {
        let row = match rows.as_ref().map(|r| r[t]) {
            Some(r) if r >= 0 => {
                ensure!(
                    r < layer_rows as i64,
                    OutOfRange,
                    "rows[{t}]: {r} is not below the layer's {layer_rows} rows"
                );
                if let Some(first) = owner.insert(r, t) {
                    return Err(err!(
                        InvalidArgument,
                        "rows[{t}]: token {t} and token {first} both store into pool row {r}"
                    ));
                }
                Some(r as usize)
            }
            _ => None,
        };
        out.push(Destination {
            position: p as usize,
            row,
        });
    }
    Ok(out)
}
