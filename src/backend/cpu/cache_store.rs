//! FlashMLA and indexer cache stores on the host: every location is checked
//! first, then each token is quantized and written by `cache_layouts`, which
//! holds the layout arithmetic (the GPU kernels are tested against it).

use std::collections::HashMap;

use crate::backend::cpu::host::{contiguous_mut, row, slice};
use crate::cache_layouts::{flashmla, indexer};
use crate::error::{ensure, err, Result};
use crate::ops::cache_store::{CacheTarget, FlashMlaStoreArgs, IndexerStoreArgs};
use crate::tensor::{FloatRows, IndexVector};

/// The (token, location) pairs a store writes, after checking every location:
/// negative ones are skipped, one at or past the cache's token slots is
/// `OutOfRange`, and two tokens aimed at one location (a race on a GPU) are
/// `InvalidArgument`. Reads only the locations, so the GPU backend's validate
/// mode runs it on a host copy.
pub(crate) fn destinations(target: &CacheTarget) -> Result<Vec<(usize, i64)>> {
    let n = target.num_tokens;
    // SAFETY: host views with extents checked by `ops::cache_store`.
    let locations: Vec<i64> = unsafe {
        match &target.loc {
            IndexVector::I32(v) => slice(v, n).iter().map(|&l| l.into()).collect(),
            IndexVector::I64(v) => slice(v, n).to_vec(),
        }
    };
    let slots = target.token_slots();
    let mut owner = HashMap::with_capacity(n);
    let mut moves = Vec::with_capacity(n);
    for (t, &l) in locations.iter().enumerate() {
        if l < 0 {
            continue;
        }
        ensure!(
            (l as u64) < slots,
            OutOfRange,
            "loc[{t}]: {l} is past the cache's {slots} token slots ({} pages of {})",
            target.cache.shape[0],
            target.page_size
        );
        if let Some(first) = owner.insert(l, t) {
            return Err(err!(
                InvalidArgument,
                "loc[{t}]: tokens {first} and {t} both store to location {l}"
            ));
        }
        moves.push((t, l));
    }
    Ok(moves)
}

pub fn store_flashmla(a: &FlashMlaStoreArgs) -> Result<()> {
    let moves = destinations(&a.target)?;
    // SAFETY: host view of whole pages (row stride checked by `ops::cache_store`).
    let cache = unsafe { contiguous_mut(&a.target.cache) };
    for (t, l) in moves {
        // SAFETY: t < num_tokens <= kv rows.
        flashmla::store_token(cache, &a.geometry, l, unsafe { row(&a.kv, t) })?;
    }
    Ok(())
}

pub fn store_indexer(a: &IndexerStoreArgs) -> Result<()> {
    let moves = destinations(&a.target)?;
    // SAFETY: as above.
    let cache = unsafe { contiguous_mut(&a.target.cache) };
    for (t, l) in moves {
        // SAFETY: t < num_tokens <= key rows. bf16 keys widen exactly.
        let key: Vec<f32> = unsafe {
            match &a.key {
                FloatRows::Bf16(m) => row(m, t).iter().map(|x| x.to_f32()).collect(),
                FloatRows::F32(m) => row(m, t).to_vec(),
            }
        };
        indexer::store_token(cache, &a.geometry, l, &key)?;
    }
    Ok(())
}
