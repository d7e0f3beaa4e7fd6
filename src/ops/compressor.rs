//! The KV compressor (docs/compressor.md): validation of a decode or prefill
//! call into `CompressArgs`. The layer's compress ratio picks the state and
//! the pooling (4: overlapping windows of 8 raw rows, 128: windows of 128);
//! the compressor picks the channels (attention 512, indexer 128) and what
//! follows the pooling (`crate::compressor`'s module docs).

use crate::args::compressor::{CompressArgs, CompressMode, CompressTarget, NormWeight};
use crate::backend::Stream;
use crate::cache_layouts::flashmla::FlashMlaGeometry;
use crate::cache_layouts::indexer::IndexerGeometry;
use crate::compressor::Compressor;
use crate::dtype::DType;
use crate::error::{ensure, err, Result};
use crate::geometry::Ratio;
use crate::ops::aliasing::{self, input, output, pool_output, scratch};
use crate::ops::cache_store::{cache_format, page_cache};
use crate::ops::rope::rope_table;
use crate::ops::tokens;
use crate::pool::Pool;
use crate::tensor::{Extent, RawTensor, ROW_ALIGN};

/// Caller arguments of `compress_decode` / `compress_prefill`.
#[derive(Debug, Clone, Copy)]
pub struct CompressRaw {
    pub kv_score: RawTensor,
    pub ape: RawTensor,
    pub norm_weight: RawTensor,
    pub rope_table: RawTensor,
    pub batch_id: RawTensor,
    pub req_slots: RawTensor,
    pub positions: RawTensor,
    pub loc: RawTensor,
    pub cache: RawTensor,
    pub layer: u32,
    pub compressor: u32,
    pub num_tokens: usize,
    pub cache_dtype: u32,
    pub page_size: u32,
    pub eps: f32,
}

/// The norm weight: `[dim]` bf16 or f32.
fn norm_weight(raw: &RawTensor, dim: usize) -> Result<NormWeight> {
    let extent = [Extent::Exact(dim)];
    ensure!(!raw.data.is_null(), NullArgument, "norm_weight.data");
    let dtype = DType::from_raw("norm_weight", raw.dtype)?;
    match dtype {
        DType::F32 => raw
            .view("norm_weight", extent, ROW_ALIGN)
            .map(NormWeight::F32),
        DType::Bf16 => raw
            .view("norm_weight", extent, ROW_ALIGN)
            .map(NormWeight::Bf16),
        d => Err(err!(
            BadDtype,
            "norm_weight: dtype is {}, expected bf16 or f32",
            d.name()
        )),
    }
}

/// The target: the pool layer's compressed rows without a cache (attention
/// compressor), else a FlashMLA cache (attention) or the indexer key cache
/// (indexer, which always needs one).
fn target(
    pool: &Pool,
    layer: usize,
    compressor: Compressor,
    raw: &CompressRaw,
) -> Result<CompressTarget> {
    if raw.cache.data.is_null() {
        ensure!(
            compressor == Compressor::Kv,
            NullArgument,
            "cache: the indexer compressor stores into an indexer key cache"
        );
        ensure!(
            raw.page_size == 0 && raw.cache_dtype == 0,
            InvalidArgument,
            "page_size, cache_dtype: must be 0 without a cache (the pool's rows are the target)"
        );
        let g = pool.geometry();
        return Ok(CompressTarget::Pool {
            rows: pool.layer_rows(layer),
            swa_rows: g.swa_rows,
            compressed_rows: g.compressed_rows(g.ratio(layer)),
        });
    }
    let fmt = cache_format(raw.cache_dtype)?;
    let page_size = u64::from(raw.page_size);
    Ok(match compressor {
        Compressor::Kv => {
            let geometry = FlashMlaGeometry::new(page_size, fmt)?;
            CompressTarget::FlashMla {
                cache: page_cache("cache", raw.cache, geometry.bytes_per_page() as usize)?,
                geometry,
                page_size,
            }
        }
        Compressor::Indexer => {
            let geometry = IndexerGeometry::new(page_size, fmt)?;
            CompressTarget::Indexer {
                cache: page_cache("cache", raw.cache, geometry.bytes_per_page() as usize)?,
                geometry,
                page_size,
            }
        }
    })
}

pub fn compress(pool: &Pool, raw: &CompressRaw, mode: CompressMode, stream: Stream) -> Result<()> {
    pool.context().check_usable()?;
    let layer = pool.geometry().check_layer(raw.layer)?;
    let ratio = pool.geometry().ratio(layer);
    ensure!(
        ratio != Ratio::Dense,
        InvalidArgument,
        "layer: layer {layer} is dense (compress ratio 0) and has no compressor"
    );
    let compressor = Compressor::from_raw(raw.compressor)?;
    ensure!(
        compressor == Compressor::Kv || ratio == Ratio::Csa,
        InvalidArgument,
        "compressor: the indexer compressor exists only on ratio-4 layers, layer {layer} has ratio {}",
        ratio.value()
    );
    let state = pool.state_view(layer, compressor).ok_or_else(|| {
        err!(
            InvalidState,
            "pool: created without compressor state (params.compressor_state = 0)"
        )
    })?;
    let t = raw.num_tokens;
    ensure!(
        t <= i32::MAX as usize,
        InvalidArgument,
        "num_tokens: {t} exceeds 2^31 - 1"
    );
    // eps keeps an all-zero vector finite: rsqrt(0 + eps).
    ensure!(
        raw.eps.is_finite() && raw.eps > 0.0,
        InvalidArgument,
        "eps: {} is not a finite positive number",
        raw.eps
    );
    let g = state.geometry;
    let args = CompressArgs {
        mode,
        state,
        target: target(pool, layer, compressor, raw)?,
        kv_score: raw.kv_score.float_rows(
            "kv_score",
            [tokens(t), Extent::Exact(g.row_floats())],
            ROW_ALIGN,
        )?,
        ape: raw.ape.view(
            "ape",
            [
                Extent::Exact(ratio.value()),
                Extent::Exact(g.value_floats()),
            ],
            ROW_ALIGN,
        )?,
        norm_weight: norm_weight(&raw.norm_weight, g.dim())?,
        rope_table: rope_table(&raw.rope_table)?,
        batch_id: raw.batch_id.view("batch_id", [tokens(t)], 4)?,
        req_slots: raw.req_slots.view("req_slots", [Extent::AtLeast(1)], 4)?,
        positions: raw.positions.index_vector("positions", tokens(t))?,
        loc: raw.loc.index_vector("loc", tokens(t))?,
        num_tokens: t,
        eps: raw.eps,
    };
    let (pool_rows, cache) = match &args.target {
        CompressTarget::Pool { rows, .. } => (Some(*rows), None),
        CompressTarget::FlashMla { cache, .. } | CompressTarget::Indexer { cache, .. } => {
            (None, Some(*cache))
        }
    };
    let weight = match &args.norm_weight {
        NormWeight::Bf16(w) => input("norm_weight", w),
        NormWeight::F32(w) => input("norm_weight", w),
    };
    aliasing::check(
        &[
            scratch(
                "the pool's compressor state",
                state.data as *const u8,
                g.floats() * 4,
            ),
            pool_output(raw.layer, pool_rows),
            output("cache", &cache),
            input("kv_score", &args.kv_score),
            input("ape", &args.ape),
            weight,
            input("rope_table", &args.rope_table),
            input("batch_id", &args.batch_id),
            input("req_slots", &args.req_slots),
            input("positions", &args.positions),
            input("loc", &args.loc),
        ],
        &[],
    )?;
    pool.context().backend().compress(&args, stream)
}
