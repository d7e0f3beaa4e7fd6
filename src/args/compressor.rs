//! The compressor's contract (math: `crate::compressor`, docs/compressor.md).

use half::bf16;

use crate::args::cache_store::CacheTarget;
use crate::args::LayerRows;
use crate::cache_layouts::flashmla::FlashMlaGeometry;
use crate::cache_layouts::indexer::IndexerGeometry;
use crate::compressor::StateGeometry;
use crate::tensor::{FloatRows, IndexVector, Matrix, Vector};

/// One compressor's state: `geometry.floats()` f32 in backend memory.
#[derive(Debug, Clone, Copy)]
pub struct StateView {
    pub data: *mut f32,
    pub geometry: StateGeometry,
}

// SAFETY: an address plus extents into backend memory; operations that write
// the state are serialized by their callers (one stream per layer).
unsafe impl Send for StateView {}
unsafe impl Sync for StateView {}

impl StateView {
    /// The state as one `[slots * ring, row_floats]` matrix.
    pub fn rows(&self) -> Matrix<f32> {
        let g = &self.geometry;
        Matrix::from_parts(self.data, [g.slots * g.ring, g.row_floats()])
    }
}

/// Decode (at most one token per request; one launch on GPUs) or prefill
/// (each request's tokens contiguous with consecutive positions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompressMode {
    Decode,
    Prefill,
}

/// Where the compressed vectors go.
#[derive(Debug, Clone, Copy)]
pub enum CompressTarget {
    /// The pool layer's compressed rows: group of token t to row
    /// `swa_rows + loc[t]`, `loc[t] < compressed_rows`.
    Pool {
        rows: LayerRows,
        swa_rows: usize,
        compressed_rows: usize,
    },
    /// A FlashMLA FP8 cache (attention compressor).
    FlashMla {
        geometry: FlashMlaGeometry,
        cache: Matrix<u8>,
        page_size: u64,
    },
    /// An indexer key cache (indexer compressor).
    Indexer {
        geometry: IndexerGeometry,
        cache: Matrix<u8>,
        page_size: u64,
    },
}

impl CompressTarget {
    /// Locations the target holds: a location at or past it is out of range.
    pub fn capacity(&self) -> u64 {
        match self {
            CompressTarget::Pool {
                compressed_rows, ..
            } => *compressed_rows as u64,
            CompressTarget::FlashMla {
                cache, page_size, ..
            }
            | CompressTarget::Indexer {
                cache, page_size, ..
            } => cache.shape[0] as u64 * page_size,
        }
    }

    /// A cache target as the cache stores see it (None for the pool).
    pub fn cache_target(&self, loc: IndexVector, num_tokens: usize) -> Option<CacheTarget> {
        match self {
            CompressTarget::Pool { .. } => None,
            CompressTarget::FlashMla {
                cache, page_size, ..
            }
            | CompressTarget::Indexer {
                cache, page_size, ..
            } => Some(CacheTarget {
                cache: *cache,
                loc,
                num_tokens,
                page_size: *page_size,
            }),
        }
    }
}

/// The compressor's norm weight, bf16 or f32 (`[dim]`).
#[derive(Debug, Clone, Copy)]
pub enum NormWeight {
    Bf16(Vector<bf16>),
    F32(Vector<f32>),
}

/// Validated `compress_decode` / `compress_prefill`. Token t belongs to
/// request `batch_id[t]` (negative = padding: nothing read or written) whose
/// state lives in slot `req_slots[batch_id[t]]`, at absolute position
/// `positions[t]`; `kv_score` row t is its raw row. A token whose position
/// closes a group (`(p + 1) % ratio == 0`) emits that group to `loc[t]`
/// (negative = not stored). Device values are not checked here
/// (`backend::rules::compressor`).
#[derive(Debug, Clone, Copy)]
pub struct CompressArgs {
    pub mode: CompressMode,
    pub state: StateView,
    pub target: CompressTarget,
    /// `[>= num_tokens, row_floats]` bf16 or f32, rows 16-byte aligned.
    pub kv_score: FloatRows,
    /// `[ratio, value_floats]` f32.
    pub ape: Matrix<f32>,
    pub norm_weight: NormWeight,
    /// `[max_pos, 64]` f32.
    pub rope_table: Matrix<f32>,
    pub batch_id: Vector<i32>,
    pub req_slots: Vector<i32>,
    pub positions: IndexVector,
    pub loc: IndexVector,
    pub num_tokens: usize,
    pub eps: f32,
}
