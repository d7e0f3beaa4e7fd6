//! hash_topk on the host: the real-token count, every real row's token id and
//! its table entries are checked first, then rows are computed by
//! `crate::routing`, so a rejected call writes nothing.

use crate::args::routing::HashTopkArgs;
use crate::backend::host::{put_row, row};
use crate::backend::rules::routing::{real_rows, row_experts};
use crate::error::Result;
use crate::routing::{hash_topk_row, padded_row};

pub fn hash_topk(a: &HashTopkArgs) -> Result<()> {
    let real = real_rows(a)?;
    let experts = row_experts(a, real)?;
    let slots = a.routed() + a.num_shared;
    let (mut weights, mut ids) = (vec![0f32; slots], vec![0i32; slots]);
    for n in 0..a.num_tokens {
        match experts.get(n) {
            // SAFETY: n < num_tokens <= router_logits rows.
            Some(e) => hash_topk_row(
                unsafe { row(&a.router_logits, n) },
                e,
                a.routed_scaling_factor,
                &mut weights,
                &mut ids,
            ),
            None => padded_row(&mut weights, &mut ids),
        }
        // SAFETY: n < num_tokens <= output rows, each K + S wide.
        unsafe {
            put_row(&a.topk_weights, n, &weights);
            put_row(&a.topk_ids, n, &ids);
        }
    }
    Ok(())
}
