//! Quantize-and-store into the two caches of FlashMLA-based stacks (see
//! docs/fp8.md §2, §5, §6), the FlashMLA FP8 KV cache and the indexer key
//! cache, addressed by flat token locations, and into scaled FP8 rows
//! (docs/fp8.md §8), addressed by row (negative = skip).

use crate::args::cache_store::{CacheTarget, FlashMlaStoreArgs, IndexerStoreArgs, ScaledStoreArgs};
use crate::backend::Stream;
use crate::cache_layouts::flashmla::{self, FlashMlaGeometry};
use crate::cache_layouts::indexer::{self, IndexerGeometry};
use crate::cache_layouts::scaled;
use crate::context::Context;
use crate::dtype::DType;
use crate::error::{ensure, err, Result};
use crate::fp8::Fp8Format;
use crate::ops::aliasing::{self, input, output};
use crate::ops::tokens;
use crate::tensor::{Extent, Matrix, RawTensor, ROW_ALIGN};

/// Caller arguments of both cache stores: `rows` is the FlashMLA latent or the
/// indexer key.
#[derive(Debug, Clone, Copy)]
pub struct CacheStoreRaw {
    pub cache: RawTensor,
    pub rows: RawTensor,
    pub loc: RawTensor,
    pub page_size: u32,
    pub cache_dtype: u32,
    pub num_tokens: usize,
}

pub fn store_flashmla(ctx: &Context, raw: &CacheStoreRaw, stream: Stream) -> Result<()> {
    ctx.check_usable()?;
    let fmt = cache_format(raw.cache_dtype)?;
    let geometry = FlashMlaGeometry::new(raw.page_size.into(), fmt)?;
    let args = FlashMlaStoreArgs {
        target: target(
            raw.cache,
            raw.loc,
            raw.num_tokens,
            (geometry.bytes_per_page(), geometry.page_size()),
        )?,
        kv: raw.rows.view(
            "kv",
            [tokens(raw.num_tokens), Extent::Exact(flashmla::TOKEN_DIMS)],
            ROW_ALIGN,
        )?,
        geometry,
    };
    aliasing::check(
        &[
            output("cache", &args.target.cache),
            input("kv", &args.kv),
            input("loc", &args.target.loc),
        ],
        &[],
    )?;
    ctx.backend().store_flashmla(&args, stream)
}

pub fn store_indexer(ctx: &Context, raw: &CacheStoreRaw, stream: Stream) -> Result<()> {
    ctx.check_usable()?;
    let fmt = cache_format(raw.cache_dtype)?;
    let geometry = IndexerGeometry::new(raw.page_size.into(), fmt)?;
    let args = IndexerStoreArgs {
        target: target(
            raw.cache,
            raw.loc,
            raw.num_tokens,
            (geometry.bytes_per_page(), geometry.page_size()),
        )?,
        key: raw.rows.float_rows(
            "key",
            [tokens(raw.num_tokens), Extent::Exact(indexer::KEY_DIMS)],
            ROW_ALIGN,
        )?,
        geometry,
    };
    aliasing::check(
        &[
            output("cache", &args.target.cache),
            input("key", &args.key),
            input("loc", &args.target.loc),
        ],
        &[],
    )?;
    ctx.backend().store_indexer(&args, stream)
}

/// Caller arguments of `store_scaled_fp8`.
#[derive(Debug, Clone, Copy)]
pub struct ScaledStoreRaw {
    pub codes: RawTensor,
    pub scales: RawTensor,
    pub rows: RawTensor,
    pub loc: RawTensor,
    pub cache_dtype: u32,
    pub scale_divisor: u32,
    pub num_tokens: usize,
}

pub fn store_scaled_fp8(ctx: &Context, raw: &ScaledStoreRaw, stream: Stream) -> Result<()> {
    ctx.check_usable()?;
    let format = cache_format(raw.cache_dtype)?;
    let divisor = scaled::scale_divisor("scale_divisor", raw.scale_divisor, format)?;
    let codes: Matrix<u8> = raw.codes.view(
        "codes",
        [Extent::AtLeast(0), Extent::Exact(scaled::ROW_DIMS)],
        ROW_ALIGN,
    )?;
    let scales: Matrix<f32> = raw.scales.view(
        "scales",
        [
            Extent::Exact(codes.shape[0]),
            Extent::Exact(scaled::SCALES_PER_ROW),
        ],
        ROW_ALIGN,
    )?;
    let args = ScaledStoreArgs {
        target: CacheTarget {
            cache: codes,
            loc: raw.loc.index_vector("loc", tokens(raw.num_tokens))?,
            num_tokens: raw.num_tokens,
            page_size: 1,
        },
        scales,
        kv: raw.rows.view(
            "kv",
            [tokens(raw.num_tokens), Extent::Exact(scaled::ROW_DIMS)],
            ROW_ALIGN,
        )?,
        format,
        divisor,
    };
    aliasing::check(
        &[
            output("codes", &args.target.cache),
            output("scales", &args.scales),
            input("kv", &args.kv),
            input("loc", &args.target.loc),
        ],
        &[],
    )?;
    ctx.backend().store_scaled_fp8(&args, stream)
}

/// The FP8 flavour named by `cache_dtype`: an unknown value is `BadEnum`, a
/// dtype that is not FP8 `BadDtype`.
pub(crate) fn cache_format(raw: u32) -> Result<Fp8Format> {
    fp8_format("cache_dtype", raw)
}

/// The FP8 flavour a dtype argument `name` names (see `cache_format`).
pub(crate) fn fp8_format(name: &str, raw: u32) -> Result<Fp8Format> {
    let dtype = DType::ALL
        .into_iter()
        .find(|d| d.to_raw() == raw)
        .ok_or_else(|| err!(BadEnum, "{name}: unknown dtype value {raw}"))?;
    dtype.fp8_format().ok_or_else(|| {
        err!(
            BadDtype,
            "{name}: {} is not an FP8 dtype (fp8_e4m3fn or fp8_e4m3fnuz)",
            dtype.name()
        )
    })
}

/// A `[num_pages, bytes_per_page]` byte cache. The kernels compute byte
/// offsets as `page * bytes_per_page`, so the row stride must be exactly the
/// page stride; 16-byte alignment lets them move 16-byte vectors.
pub(crate) fn page_cache(
    name: &str,
    cache: RawTensor,
    bytes_per_page: usize,
) -> Result<Matrix<u8>> {
    let cache: Matrix<u8> = cache.view(
        name,
        [Extent::AtLeast(1), Extent::Exact(bytes_per_page)],
        ROW_ALIGN,
    )?;
    ensure!(
        cache.strides[0] == bytes_per_page,
        BadStride,
        "{name}: row stride is {} bytes, expected exactly the page stride {bytes_per_page}",
        cache.strides[0]
    );
    Ok(cache)
}

/// The cache (`page_cache`) and one location per token.
pub(crate) fn target(
    cache: RawTensor,
    loc: RawTensor,
    num_tokens: usize,
    (bytes_per_page, page_size): (u64, u64),
) -> Result<CacheTarget> {
    let cache = page_cache("cache", cache, bytes_per_page as usize)?;
    Ok(CacheTarget {
        cache,
        loc: loc.index_vector("loc", tokens(num_tokens))?,
        num_tokens,
        page_size,
    })
}
