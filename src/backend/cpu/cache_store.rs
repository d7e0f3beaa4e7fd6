//! FlashMLA, indexer and scaled FP8 stores on the host: every location is checked
//! first, then each token is quantized and written by `cache_layouts`, which
//! holds the layout arithmetic (the GPU kernels are tested against it).

use crate::args::cache_store::{FlashMlaStoreArgs, IndexerStoreArgs, ScaledStoreArgs};
use crate::backend::host::{contiguous_mut, put_row, row};
use crate::backend::rules::cache_store::destinations;
use crate::cache_layouts::{flashmla, indexer, scaled};
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

pub fn store_scaled_fp8(a: &ScaledStoreArgs) -> Result<()> {
    let moves = destinations(&a.target)?;
    let mut codes = [0u8; scaled::ROW_DIMS];
    let mut scales = [0f32; scaled::SCALES_PER_ROW];
    for (t, l) in moves {
        // SAFETY: t < num_tokens <= kv rows; l < the rows of both outputs
        // (checked by `destinations`, the scales' rows by `ops::cache_store`).
        unsafe {
            scaled::quantize_row(row(&a.kv, t), a.format, a.divisor, &mut codes, &mut scales);
            put_row(&a.target.cache, l as usize, &codes);
            put_row(&a.scales, l as usize, &scales);
        }
    }
    Ok(())
}
