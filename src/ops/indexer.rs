//! Lightning indexer query and key preparation (docs/indexer.md §1, §2):
//! RoPE + Hadamard + FP8 of every query head with its folded weight, and
//! RMSNorm + RoPE + Hadamard + FP8 of compressed keys into the indexer key
//! cache. The math is `crate::indexer`.

use crate::args::index::StreamOut;
use crate::args::indexer::{
    IndexerKeyArgs, IndexerQueryArgs, IndexerTopkArgs, TopkCsaTail, TopkScore, TopkSelect,
};
use crate::backend::Stream;
use crate::cache_layouts::indexer::{IndexerGeometry, KEY_DIMS};
use crate::context::Context;
use crate::error::{ensure, Result};
use crate::geometry::Ratio;
use crate::ops::aliasing::{self, input, output, Operand};
use crate::ops::cache_store::{cache_format, fp8_format, page_cache, target};
use crate::ops::rope::rope_table;
use crate::ops::tokens;
use crate::pool::Pool;
use crate::tensor::{Extent, Matrix, RawTensor, ROW_ALIGN};

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

pub fn indexer_prepare_q(ctx: &Context, raw: &IndexerQueryRaw, stream: Stream) -> Result<()> {
    ctx.check_usable()?;
    let args = query_args(raw)?;
    aliasing::check(&query_operands(&args), &[])?;
    ctx.backend().indexer_prepare_q(&args, stream)
}

/// The validated `indexer_prepare_q` arguments (also `prepare_qkv_indexer_q`'s).
pub(crate) fn query_args(raw: &IndexerQueryRaw) -> Result<IndexerQueryArgs> {
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
    Ok(IndexerQueryArgs {
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
    })
}

/// Their overlap operands.
pub(crate) fn query_operands(args: &IndexerQueryArgs) -> [Operand; 6] {
    [
        output("q_fp8", &args.q_fp8),
        output("weights_out", &args.weights_out),
        input("q", &args.q),
        input("weights", &args.weights),
        input("rope_table", &args.rope_table),
        input("positions", &args.positions),
    ]
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
    aliasing::check(
        &[
            output("cache", &args.target.cache),
            input("key", &args.key),
            input("norm_weight", &args.norm_weight),
            input("rope_table", &args.rope_table),
            input("positions", &args.positions),
            input("loc", &args.target.loc),
        ],
        &[],
    )?;
    ctx.backend().indexer_prepare_k(&args, stream)
}

/// Caller arguments of the two top-k ops; `q_fp8`, `weights` and `cache` are
/// read only by the fused one (scores computed here, not passed in).
#[derive(Debug, Clone, Copy)]
pub struct IndexerTopkRaw {
    pub q_fp8: RawTensor,
    pub weights: RawTensor,
    pub cache: RawTensor,
    pub page_table: RawTensor,
    pub batch_id: RawTensor,
    pub positions: RawTensor,
    pub logits: RawTensor,
    pub topk_indices: RawTensor,
    pub cache_dtype: u32,
    pub num_tokens: usize,
    pub num_heads: usize,
    pub topk: usize,
}

/// Most keys a top-k may select (docs/indexer.md §3: 512 and 1024 in production).
pub const MAX_TOPK: usize = 2048;
/// Most indexer heads the fused scoring takes (DeepSeek-V4 has 64).
pub const MAX_SCORE_HEADS: usize = 64;

fn topk_select(raw: &IndexerTopkRaw) -> Result<TopkSelect> {
    let (t, k) = (raw.num_tokens, raw.topk);
    ensure!(
        t <= i32::MAX as usize,
        InvalidArgument,
        "num_tokens: {t} exceeds 2^31 - 1"
    );
    ensure!(
        (1..=MAX_TOPK).contains(&k),
        InvalidArgument,
        "topk: {k} is not in 1..={MAX_TOPK}"
    );
    let page_table: Matrix<i32> =
        raw.page_table
            .view("page_table", [Extent::AtLeast(1), Extent::AtLeast(1)], 4)?;
    let logits: Matrix<f32> = raw
        .logits
        .view("logits", [tokens(t), Extent::AtLeast(1)], 4)?;
    // Kernels index a row's keys with 32-bit integers.
    ensure!(
        logits.shape[1] <= i32::MAX as usize,
        BadShape,
        "logits: {} columns exceed 2^31 - 1",
        logits.shape[1]
    );
    Ok(TopkSelect {
        page_table,
        batch_id: raw.batch_id.view("batch_id", [tokens(t)], 4)?,
        positions: raw.positions.index_vector("positions", tokens(t))?,
        logits,
        topk_indices: raw
            .topk_indices
            .view("topk_indices", [tokens(t), Extent::AtLeast(k)], 4)?,
        num_tokens: t,
        topk: k,
    })
}

/// Scores every visible key of every token into `logits`, then selects
/// (docs/indexer.md §3).
pub fn indexer_topk(ctx: &Context, raw: &IndexerTopkRaw, stream: Stream) -> Result<()> {
    scored_topk(ctx, raw, None, stream)
}

/// The CSA stream `indexer_topk_fill_csa` completes: indptr and indices from
/// `build_decode_streams`.
#[derive(Debug, Clone, Copy)]
pub struct CsaStreamRaw {
    pub csa_indptr: RawTensor,
    pub csa_indices: RawTensor,
}

/// `indexer_topk`, then `fill_csa_tail` of the same layer from its table
/// (docs/index-streams.md §4): one launch fewer on a GPU backend.
pub fn indexer_topk_fill_csa(
    pool: &Pool,
    raw: &IndexerTopkRaw,
    csa: &CsaStreamRaw,
    stream: Stream,
) -> Result<()> {
    let g = pool.geometry();
    g.check_row_ids(Ratio::Csa)?;
    let tail = TopkCsaTail {
        stream: StreamOut {
            indptr: csa.csa_indptr.view(
                "csa_indptr",
                [Extent::AtLeast(raw.num_tokens.saturating_add(1))],
                4,
            )?,
            indices: csa
                .csa_indices
                .view("csa_indices", [Extent::AtLeast(0)], 4)?,
        },
        window: g.config.window,
        row_base: g.swa_rows,
        csa_rows: g.compressed_rows(Ratio::Csa),
    };
    scored_topk(pool.context(), raw, Some(tail), stream)
}

fn scored_topk(
    ctx: &Context,
    raw: &IndexerTopkRaw,
    csa: Option<TopkCsaTail>,
    stream: Stream,
) -> Result<()> {
    ctx.check_usable()?;
    let select = topk_select(raw)?;
    let (t, h) = (raw.num_tokens, raw.num_heads);
    // The GPU score kernels cover at most 64 heads (the tensor-core kernel's
    // fragments, the CUDA-core kernel's 48 KB of shared memory).
    ensure!(
        (1..=MAX_SCORE_HEADS).contains(&h),
        InvalidArgument,
        "num_heads: {h} is not in 1..={MAX_SCORE_HEADS}"
    );
    let geometry = IndexerGeometry::new(
        crate::cache_layouts::indexer::PAGE_SIZES[0],
        cache_format(raw.cache_dtype)?,
    )?;
    let cache = page_cache("cache", raw.cache, geometry.bytes_per_page() as usize)?;
    let score = TopkScore {
        q_fp8: raw.q_fp8.view(
            "q_fp8",
            [tokens(t), Extent::Exact(h), Extent::Exact(KEY_DIMS)],
            ROW_ALIGN,
        )?,
        weights: raw
            .weights
            .view("weights", [tokens(t), Extent::Exact(h)], 4)?,
        cache,
        geometry,
        num_heads: h,
    };
    // csa_indices is updated in place by design (its SWA entries stay).
    aliasing::check(
        &[
            output("logits", &select.logits),
            output("topk_indices", &select.topk_indices),
            output("csa_indices", &csa.map(|c| c.stream.indices)),
            input("q_fp8", &score.q_fp8),
            input("weights", &score.weights),
            input("cache", &score.cache),
            input("page_table", &select.page_table),
            input("batch_id", &select.batch_id),
            input("positions", &select.positions),
            input("csa_indptr", &csa.map(|c| c.stream.indptr)),
        ],
        &[],
    )?;
    ctx.backend().indexer_topk(
        &IndexerTopkArgs {
            select,
            score: Some(score),
            csa,
        },
        stream,
    )
}

/// Selects from caller-computed `logits` (docs/indexer.md §3's top-k transform).
pub fn indexer_topk_from_logits(ctx: &Context, raw: &IndexerTopkRaw, stream: Stream) -> Result<()> {
    ctx.check_usable()?;
    let select = topk_select(raw)?;
    aliasing::check(
        &[
            output("topk_indices", &select.topk_indices),
            input("logits", &select.logits),
            input("page_table", &select.page_table),
            input("batch_id", &select.batch_id),
            input("positions", &select.positions),
        ],
        &[],
    )?;
    ctx.backend().indexer_topk(
        &IndexerTopkArgs {
            select,
            score: None,
            csa: None,
        },
        stream,
    )
}
