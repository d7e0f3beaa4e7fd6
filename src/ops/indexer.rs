//! Lightning indexer query and key preparation (spec store_fused §4.1, §4.2):
//! RoPE + Hadamard + FP8 of every query head with its folded weight, and
//! RMSNorm + RoPE + Hadamard + FP8 of compressed keys into the indexer key
//! cache. The math is `crate::indexer`.

use half::bf16;

use crate::backend::Stream;
use crate::cache_layouts::indexer::{IndexerGeometry, KEY_DIMS};
use crate::context::Context;
use crate::error::{ensure, Result};
use crate::fp8::Fp8Format;
use crate::ops::cache_store::{cache_format, fp8_format, target, CacheTarget};
use crate::ops::tokens;
use crate::rope::ROPE_DIM;
use crate::tensor::{
    Extent, FloatRows, IndexVector, Matrix, RawTensor, Tensor3, Vector, ROW_ALIGN,
};

/// Caller arguments of `indexer_prepare_q`.
#[derive(Debug, Clone, Copy)]
pub struct IndexerQueryRaw {
    pub q: RawTensor,
    pub weights: RawTensor,
    pub rope_table: RawTensor,
    pub positions: RawTensor,
    pub q_fp8: RawTensor,
    pub weights_out: RawTensor,
    pub q_dtype: u32,
    pub num_tokens: usize,
    pub num_heads: usize,
    pub weight_scale: f32,
}

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

/// Caller arguments of `indexer_prepare_k`.
#[derive(Debug, Clone, Copy)]
pub struct IndexerKeyRaw {
    pub cache: RawTensor,
    pub key: RawTensor,
    pub norm_weight: RawTensor,
    pub rope_table: RawTensor,
    pub positions: RawTensor,
    pub loc: RawTensor,
    pub page_size: u32,
    pub cache_dtype: u32,
    pub num_tokens: usize,
    pub eps: f32,
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

fn rope_table(raw: &RawTensor) -> Result<Matrix<f32>> {
    raw.view(
        "rope_table",
        [Extent::AtLeast(1), Extent::Exact(ROPE_DIM)],
        ROW_ALIGN,
    )
}

pub fn indexer_prepare_q(ctx: &Context, raw: &IndexerQueryRaw, stream: Stream) -> Result<()> {
    ctx.check_usable()?;
    let (t, h) = (raw.num_tokens, raw.num_heads);
    ensure!(h > 0, InvalidArgument, "num_heads: must be positive");
    // Kernels index (token, head) items with 32-bit integers.
    ensure!(
        t.checked_mul(h).is_some_and(|n| n <= i32::MAX as usize),
        InvalidArgument,
        "num_heads: {t} tokens x {h} heads exceed 2^31 - 1 (token, head) pairs"
    );
    ensure!(
        raw.weight_scale.is_finite(),
        InvalidArgument,
        "weight_scale: {} is not finite",
        raw.weight_scale
    );
    let heads = [tokens(t), Extent::Exact(h), Extent::Exact(KEY_DIMS)];
    let per_head = [tokens(t), Extent::Exact(h)];
    let args = IndexerQueryArgs {
        q: raw.q.view("q", heads, ROW_ALIGN)?,
        weights: raw.weights.view("weights", per_head, 2)?,
        rope_table: rope_table(&raw.rope_table)?,
        positions: raw.positions.index_vector("positions", tokens(t))?,
        q_fp8: raw.q_fp8.view("q_fp8", heads, ROW_ALIGN)?,
        weights_out: raw.weights_out.view("weights_out", per_head, 4)?,
        fmt: fp8_format("q_dtype", raw.q_dtype)?,
        num_tokens: t,
        num_heads: h,
        weight_scale: raw.weight_scale,
    };
    ctx.backend().indexer_prepare_q(&args, stream)
}

pub fn indexer_prepare_k(ctx: &Context, raw: &IndexerKeyRaw, stream: Stream) -> Result<()> {
    ctx.check_usable()?;
    let n = raw.num_tokens;
    ensure!(
        n <= i32::MAX as usize,
        InvalidArgument,
        "num_tokens: {n} exceeds 2^31 - 1"
    );
    // eps keeps an all-zero key finite: rsqrt(0 + eps).
    ensure!(
        raw.eps.is_finite() && raw.eps > 0.0,
        InvalidArgument,
        "eps: {} is not a finite positive number",
        raw.eps
    );
    let geometry = IndexerGeometry::new(raw.page_size.into(), cache_format(raw.cache_dtype)?)?;
    let args = IndexerKeyArgs {
        target: target(
            raw.cache,
            raw.loc,
            n,
            (geometry.bytes_per_page(), geometry.page_size()),
        )?,
        key: raw
            .key
            .float_rows("key", [tokens(n), Extent::Exact(KEY_DIMS)], ROW_ALIGN)?,
        norm_weight: raw
            .norm_weight
            .view("norm_weight", [Extent::Exact(KEY_DIMS)], ROW_ALIGN)?,
        rope_table: rope_table(&raw.rope_table)?,
        positions: raw.positions.index_vector("positions", tokens(n))?,
        eps: raw.eps,
        geometry,
    };
    ctx.backend().indexer_prepare_k(&args, stream)
}
