//! The merge's contract (math: `ops::merge`).

use half::bf16;

use crate::tensor::{Matrix, Tensor3, Vector, View};

/// Validated merge: `parts_out [P, >= T, H, 512]`, `parts_lse [P, >= T, H]`.
#[derive(Debug)]
pub struct MergeArgs {
    pub num_tokens: usize,
    pub num_parts: usize,
    pub num_heads: usize,
    pub parts_out: View<bf16, 4>,
    pub parts_lse: Tensor3<f32>,
    pub sink: Option<Vector<f32>>,
    pub out: Tensor3<bf16>,
    pub lse: Option<Matrix<f32>>,
}
