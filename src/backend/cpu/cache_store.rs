//! FlashMLA and indexer cache stores on the host: every location is checked
//! first, then each token is quantized and written by `cache_layouts`, which
//! holds the layout arithmetic (the GPU kernels are tested against it).

use crate::args::cache_store::{FlashMlaStoreArgs, IndexerStoreArgs};
use crate::backend::host::{contiguous_mut, row};
use crate::backend::rules::cache_store::destinations;
use crate::cache_layouts::{flashmla, indexer};
use crate::error::Result;
use crate::tensor::FloatRows;

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
