//! Indexer query and key preparation on the host: positions (and key
//! locations) are checked first, then tokens run in parallel, each writing
//! only its own outputs, so a rejected call writes nothing.

use rayon::prelude::*;

use crate::backend::cpu::cache_store::destinations;
use crate::backend::cpu::host::{contiguous_mut, put_row3, row, row3, slice};
use crate::backend::cpu::rope::checked_positions;
use crate::cache_layouts::indexer::{store_token, KEY_DIMS};
use crate::error::Result;
use crate::indexer::{prepare_key, prepare_query, query_weight};
use crate::ops::indexer::{IndexerKeyArgs, IndexerQueryArgs};
use crate::tensor::FloatRows;

pub fn indexer_prepare_q(threads: &rayon::ThreadPool, a: &IndexerQueryArgs) -> Result<()> {
    // SAFETY: host view with extent checked by `ops::indexer`.
    let positions =
        unsafe { checked_positions(&a.positions, a.num_tokens, a.rope_table.shape[0])? };
    threads.install(|| {
        positions.par_iter().enumerate().for_each(|(t, &p)| {
            // SAFETY: `p` was checked against the table; token t's outputs are
            // its own rows.
            unsafe {
                let table = row(&a.rope_table, p as usize);
                let weights = row(&a.weights, t);
                let weights_out = a.weights_out.as_ptr().add(a.weights_out.offset([t, 0]));
                for (h, w) in weights.iter().enumerate() {
                    let mut x: Vec<f32> = row3(&a.q, t, h).iter().map(|v| v.to_f32()).collect();
                    let (codes, scale) = prepare_query(&mut x, table, a.fmt);
                    put_row3(&a.q_fp8, t, h, &codes);
                    weights_out
                        .add(h)
                        .write(query_weight(w.to_f32(), a.weight_scale, scale));
                }
            }
        })
    });
    Ok(())
}

pub fn indexer_prepare_k(a: &IndexerKeyArgs) -> Result<()> {
    let n = a.target.num_tokens;
    // SAFETY: host view with extent checked by `ops::indexer`.
    let positions = unsafe { checked_positions(&a.positions, n, a.rope_table.shape[0])? };
    let moves = destinations(&a.target)?;
    // SAFETY: host views; the norm weight has exactly KEY_DIMS values and the
    // cache is whole pages (both checked by `ops`).
    let (weight, cache): (Vec<f32>, _) = unsafe {
        (
            slice(&a.norm_weight, KEY_DIMS)
                .iter()
                .map(|w| w.to_f32())
                .collect(),
            contiguous_mut(&a.target.cache),
        )
    };
    for (t, loc) in moves {
        // SAFETY: t < num_tokens <= key rows; its position was checked.
        let mut x: Vec<f32> = unsafe {
            match &a.key {
                FloatRows::Bf16(m) => row(m, t).iter().map(|v| v.to_f32()).collect(),
                FloatRows::F32(m) => row(m, t).to_vec(),
            }
        };
        let table = unsafe { row(&a.rope_table, positions[t] as usize) };
        prepare_key(&mut x, &weight, a.eps, table);
        store_token(cache, &a.geometry, loc, &x)?;
    }
    Ok(())
}
