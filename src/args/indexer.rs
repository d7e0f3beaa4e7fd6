//! The lightning indexer's contract (math: `crate::indexer`).

use half::bf16;

use crate::args::cache_store::CacheTarget;
use crate::args::index::StreamOut;
use crate::cache_layouts::indexer::IndexerGeometry;
use crate::fp8::Fp8Format;
use crate::tensor::{FloatRows, IndexVector, Matrix, Tensor3, Vector};

/// Validated `indexer_prepare_q`: token t's heads use table row
/// `positions[t]` (a device value, not checked here).
#[derive(Debug, Clone, Copy)]
pub struct IndexerQueryArgs {
    pub q: Tensor3<bf16>,
    pub weights: Matrix<bf16>,
    pub rope_table: Matrix<f32>,
    pub positions: IndexVector,
    pub q_fp8: Tensor3<u8>,
    pub weights_out: Matrix<f32>,
    pub fmt: Fp8Format,
    pub num_tokens: usize,
    pub num_heads: usize,
    pub weight_scale: f32,
}

/// Validated `indexer_prepare_k`: key t uses table row `positions[t]` and is
/// stored at `loc[t]` (device values, not checked here).
#[derive(Debug, Clone, Copy)]
pub struct IndexerKeyArgs {
    pub geometry: IndexerGeometry,
    pub target: CacheTarget,
    pub key: FloatRows,
    pub norm_weight: Vector<bf16>,
    pub rope_table: Matrix<f32>,
    pub positions: IndexVector,
    pub eps: f32,
}

/// Validated selection: token t (request `batch_id[t]`, negative = padding)
/// ranks the first `(positions[t] + 1) / 4` columns of its `logits` row and
/// writes the page indices of the best `topk` (or of all, when fewer) to its
/// `topk_indices` row, front-packed, -1 after. Device values are not checked
/// here.
#[derive(Debug, Clone, Copy)]
pub struct TopkSelect {
    pub page_table: Matrix<i32>,
    pub batch_id: Vector<i32>,
    pub positions: IndexVector,
    pub logits: Matrix<f32>,
    pub topk_indices: Matrix<i32>,
    pub num_tokens: usize,
    pub topk: usize,
}

/// Validated scoring (the fused op): `logits[t][s]` = key s's score for token
/// t, read from the indexer cache through the token's page-table row.
#[derive(Debug, Clone, Copy)]
pub struct TopkScore {
    pub q_fp8: Tensor3<u8>,
    pub weights: Matrix<f32>,
    pub cache: Matrix<u8>,
    pub geometry: IndexerGeometry,
    pub num_heads: usize,
}

/// The CSA tail `indexer_topk_fill_csa` writes beside the top-k: for each
/// real token, the entries of its CSA slice after its `min(pos + 1, window)`
/// SWA entries receive `row_base + topk_indices[t][j]` (what `fill_csa_tail`
/// writes from the same table). Device values are not checked here.
#[derive(Debug, Clone, Copy)]
pub struct TopkCsaTail {
    pub stream: StreamOut,
    pub window: usize,
    /// Pool row of CSA page index 0 (the pool's SWA rows).
    pub row_base: usize,
    /// The pool's CSA rows: page indices must be below this.
    pub csa_rows: usize,
}

/// Validated `indexer_topk` (with `score`), `indexer_topk_fill_csa` (with
/// `score` and `csa`) or `indexer_topk_from_logits`.
#[derive(Debug, Clone, Copy)]
pub struct IndexerTopkArgs {
    pub select: TopkSelect,
    pub score: Option<TopkScore>,
    pub csa: Option<TopkCsaTail>,
}
