//! Merge of partial attention results computed over disjoint key sets (e.g. by
//! GPUs holding different parts of the pool): each part p gives, per token and
//! head, its normalized output `out_p` and `lse_p` (natural log, no sink; -inf
//! when it had no keys). The merge is exact, with the sink applied once:
//! `M = max(sink, max_p lse_p)`,
//! `out = sum_p e^(lse_p - M) out_p / (e^(sink - M) + sum_p e^(lse_p - M))`,
//! `lse = M + ln(denominator)`; all parts empty and no sink give zeros and -inf.

use half::bf16;

use crate::args::attention::MAX_HEADS;
use crate::args::merge::MergeArgs;
use crate::backend::Stream;
use crate::context::Context;
use crate::error::{ensure, Result};
use crate::geometry::HEAD_DIM;
use crate::ops::aliasing::{self, input, output};
use crate::ops::tokens;
use crate::tensor::{Extent, RawTensor, View, ROW_ALIGN};

/// Caller arguments of `merge`.
#[derive(Debug, Clone, Copy)]
pub struct MergeRaw {
    pub num_tokens: usize,
    pub parts_out: RawTensor,
    pub parts_lse: RawTensor,
    pub sink: RawTensor,
    pub out: RawTensor,
    pub lse: RawTensor,
}

pub fn merge(ctx: &Context, raw: &MergeRaw, stream: Stream) -> Result<()> {
    ctx.check_usable()?;
    let t = raw.num_tokens;
    let parts_out: View<bf16, 4> = raw.parts_out.view(
        "parts_out",
        [
            Extent::AtLeast(1),
            tokens(t),
            Extent::AtLeast(1),
            Extent::Exact(HEAD_DIM),
        ],
        ROW_ALIGN,
    )?;
    let (p, h) = (parts_out.shape[0], parts_out.shape[2]);
    ensure!(
        h <= MAX_HEADS,
        BadShape,
        "parts_out: {h} heads, at most {MAX_HEADS}"
    );
    let args = MergeArgs {
        num_tokens: t,
        num_parts: p,
        num_heads: h,
        parts_out,
        parts_lse: raw.parts_lse.view(
            "parts_lse",
            [Extent::Exact(p), tokens(t), Extent::Exact(h)],
            4,
        )?,
        sink: raw.sink.optional("sink", [Extent::Exact(h)], 4)?,
        out: raw.out.view(
            "out",
            [tokens(t), Extent::Exact(h), Extent::Exact(HEAD_DIM)],
            ROW_ALIGN,
        )?,
        lse: raw.lse.optional("lse", [tokens(t), Extent::Exact(h)], 4)?,
    };
    // No in-place pairs: `out` and `lse` have another rank than the parts
    // they could replace, so no input can be them exactly.
    aliasing::check(
        &[
            output("out", &args.out),
            output("lse", &args.lse),
            input("parts_out", &args.parts_out),
            input("parts_lse", &args.parts_lse),
            input("sink", &args.sink),
        ],
        &[],
    )?;
    ctx.backend().merge(&args, stream)
}
