//! Inverse RoPE of an attention output (docs/attention.md §4, docs/prepare.md §3):
//! the attention output is the latent `[T, H, 512]` including the rope dims, and
//! the model rotates dims 448..511 of every head of token t by the conjugate of
//! the rotation at `positions[t]` before `wo_a`. Dims 0..447 are not touched.

use crate::args::rope::InverseRopeArgs;
use crate::backend::Stream;
use crate::context::Context;
use crate::error::{ensure, Result};
use crate::geometry::HEAD_DIM;
use crate::ops::aliasing::{self, input, output};
use crate::ops::tokens;
use crate::rope::ROPE_DIM;
use crate::tensor::{Extent, Matrix, RawTensor, ROW_ALIGN};

/// Caller arguments of `inverse_rope`.
#[derive(Debug, Clone, Copy)]
pub struct InverseRopeRaw {
    pub num_tokens: usize,
    pub num_heads: usize,
    pub x: RawTensor,
    pub positions: RawTensor,
    pub rope_table: RawTensor,
}

/// Alignment of `x`: the kernels move the rope dims in 8-byte vectors (two
/// pairs), which the nope offset (896 bytes) keeps aligned.
const X_ALIGN: usize = 8;

/// Validates a `[max_pos, 64]` f32 rope table (`rope::build_table`). 16-byte
/// rows: a GPU thread reads two (cos, sin) pairs as one vector.
pub fn rope_table(raw: &RawTensor) -> Result<Matrix<f32>> {
    raw.view(
        "rope_table",
        [Extent::AtLeast(1), Extent::Exact(ROPE_DIM)],
        ROW_ALIGN,
    )
}

pub fn inverse_rope(ctx: &Context, raw: &InverseRopeRaw, stream: Stream) -> Result<()> {
    ctx.check_usable()?;
    let (t, h) = (raw.num_tokens, raw.num_heads);
    ensure!(h > 0, InvalidArgument, "num_heads: must be positive");
    let args = InverseRopeArgs {
        num_tokens: t,
        num_heads: h,
        x: raw.x.view(
            "x",
            [tokens(t), Extent::Exact(h), Extent::Exact(HEAD_DIM)],
            X_ALIGN,
        )?,
        positions: raw
            .positions
            .index_vector("positions", Extent::AtLeast(t))?,
        table: rope_table(&raw.rope_table)?,
    };
    // `x` is rotated in place by design: the one output.
    aliasing::check(
        &[
            output("x", &args.x),
            input("positions", &args.positions),
            input("rope_table", &args.table),
        ],
        &[],
    )?;
    ctx.backend().inverse_rope(&args, stream)
}
