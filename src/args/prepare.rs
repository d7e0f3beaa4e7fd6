//! prepare_qkv's contract (math and rounding points: `crate::rope`).

use half::bf16;

use crate::args::LayerRows;
use crate::tensor::{IndexVector, Matrix, Tensor3, Vector};

/// Validated `prepare_qkv`. Token t uses table row `positions[t]`; its KV row
/// goes to pool row `rows[t]` of the layer unless that is negative or `rows`
/// is absent. Device values (positions, rows) are not checked here.
#[derive(Debug)]
pub struct PrepareQkvArgs {
    pub pool_layer: LayerRows,
    pub num_tokens: usize,
    pub num_heads: usize,
    pub q_eps: f32,
    pub kv_eps: f32,
    pub q_in: Tensor3<bf16>,
    pub q_out: Tensor3<bf16>,
    pub kv_in: Matrix<bf16>,
    pub kv_weight: Vector<bf16>,
    pub kv_out: Option<Matrix<bf16>>,
    /// `[max_pos, 64]` f32, 16-byte aligned rows.
    pub rope_table: Matrix<f32>,
    pub positions: IndexVector,
    pub rows: Option<IndexVector>,
}
