//! The cache stores' contract (layouts: `cache_layouts`).

use half::bf16;

use crate::cache_layouts::flashmla::FlashMlaGeometry;
use crate::cache_layouts::indexer::IndexerGeometry;
use crate::fp8::Fp8Format;
use crate::tensor::{FloatRows, IndexVector, Matrix};

/// Where a validated store writes: a `[num_pages, bytes_per_page]` byte cache
/// (row stride exactly `bytes_per_page`, so pages are contiguous and byte
/// offsets are the layout's) and one location per token.
#[derive(Debug, Clone, Copy)]
pub struct CacheTarget {
    pub cache: Matrix<u8>,
    pub loc: IndexVector,
    pub num_tokens: usize,
    pub page_size: u64,
}

impl CacheTarget {
    /// Token slots the cache holds: locations at or past this are out of range.
    pub fn token_slots(&self) -> u64 {
        self.cache.shape[0] as u64 * self.page_size
    }
}

/// Validated `store_flashmla`: row t of `kv` (512 bf16) is quantized to
/// location `loc[t]`.
#[derive(Debug, Clone, Copy)]
pub struct FlashMlaStoreArgs {
    pub geometry: FlashMlaGeometry,
    pub target: CacheTarget,
    pub kv: Matrix<bf16>,
}

/// Validated `store_indexer`: row t of `key` (128 bf16 or f32) is quantized to
/// location `loc[t]`.
#[derive(Debug, Clone, Copy)]
pub struct IndexerStoreArgs {
    pub geometry: IndexerGeometry,
    pub target: CacheTarget,
    pub key: FloatRows,
}

/// Validated `store_scaled_fp8`: row t of `kv` (512 bf16) is quantized to row
/// `loc[t]` of the codes (`target.cache`, `[rows, 512]` bytes, any 16-byte
/// multiple row stride; `target.page_size` is 1) and of `scales` (`[rows, 8]`
/// f32).
#[derive(Debug, Clone, Copy)]
pub struct ScaledStoreArgs {
    pub target: CacheTarget,
    pub scales: Matrix<f32>,
    pub kv: Matrix<bf16>,
    pub format: Fp8Format,
    /// The FP8 maximum each tile's amax is divided by (448, 240 or 224).
    pub divisor: f32,
}
