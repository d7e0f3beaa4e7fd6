//! hash_topk's device values: the real-token count, token ids and table
//! entries.

use crate::args::routing::{HashTopkArgs, RealTokens};
use crate::backend::host::{int_values, row};
use crate::error::{ensure, Result};

/// The number of real rows: a device count must lie in `0..=num_tokens`.
/// Reads only integer arguments, so `Validating` runs it on host copies.
pub(crate) fn real_rows(a: &HashTopkArgs) -> Result<usize> {
    match a.real_tokens {
        RealTokens::Host(n) => Ok(n),
        RealTokens::Device(v) => {
            // SAFETY: a host view of at least one element (checked by `ops::routing`).
            let n = unsafe { int_values(&v, 1) }[0];
            ensure!(
                (0..=a.num_tokens as i64).contains(&n),
                OutOfRange,
                "num_real_tokens[0]: {n} is not in 0..={}",
                a.num_tokens
            );
            Ok(n as usize)
        }
    }
}

/// Each real row's K experts, after checking its token id against the table
/// and the experts against the router's E columns.
pub(crate) fn row_experts(a: &HashTopkArgs, real: usize) -> Result<Vec<Vec<i32>>> {
    let vocab = a.tid2eid.shape[0] as i64;
    let experts = a.num_experts() as i32;
    // SAFETY: host view of at least num_tokens ids (checked by `ops::routing`).
    let ids = unsafe { int_values(&a.input_ids, a.num_tokens) };
    ids[..real]
        .iter()
        .enumerate()
        .map(|(n, &id)| {
            ensure!(
                (0..vocab).contains(&id),
                OutOfRange,
                "input_ids[{n}]: token id {id} is not in the table's 0..{vocab}"
            );
            // SAFETY: id < tid2eid.shape[0].
            let table = unsafe { row(&a.tid2eid, id as usize) };
            for (j, &e) in table.iter().enumerate() {
                ensure!(
                    (0..experts).contains(&e),
                    OutOfRange,
                    "tid2eid[{id}][{j}]: expert {e} is not in the router's 0..{experts} (row {n})"
                );
            }
            Ok(table.to_vec())
        })
        .collect()
}
