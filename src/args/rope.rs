//! Inverse RoPE's contract (math: `rope::inverse_rope_row`).

use half::bf16;

use crate::tensor::{IndexVector, Matrix, Tensor3};

/// Validated inverse RoPE: dims `448..512` of `x[t, h]` for `t < num_tokens`
/// are rotated in place by the conjugate of table row `positions[t]`.
#[derive(Debug)]
pub struct InverseRopeArgs {
    pub num_tokens: usize,
    pub num_heads: usize,
    pub x: Tensor3<bf16>,
    pub positions: IndexVector,
    /// `[max_pos, 64]` interleaved (cos, sin) pairs (`rope::build_table`).
    pub table: Matrix<f32>,
}
