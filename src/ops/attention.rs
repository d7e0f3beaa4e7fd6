//! Sparse decode and prefill attention (docs/attention.md §1, §2).
//!
//! For token t and head h over its key set K_t, with the sink `z = sink[h]` as a
//! virtual key of value zero (z = -inf when no sink is given):
//! `out = sum_j e^(s_j - M) k_j / (e^(z - M) + sum_j e^(s_j - M))`,
//! `s_j = scale * <q, k_j>`, `M = max(z, max_j s_j)`; an empty key set gives
//! zeros; `lse = M + ln(denominator)` (natural log, sink included).

use std::sync::Arc;

use half::bf16;

use crate::args::attention::{
    AttentionArgs, InverseRopeEpilogue, KeyRows, KvLayout, KvSource, PlanKind, PlanShape, Workspace,
};
use crate::args::LayerRows;
use crate::backend::Stream;
use crate::cache_layouts::flashmla::FlashMlaGeometry;
use crate::cache_layouts::scaled;
use crate::error::{ensure, err, Result};
use crate::geometry::HEAD_DIM;
use crate::ops::aliasing::{self, input, output, pool_input, scratch, Operand};
use crate::ops::cache_store::{fp8_format, page_cache};
use crate::ops::rope;
use crate::ops::tokens;
use crate::plan::AttentionPlan;
use crate::pool::Pool;
use crate::tensor::{Extent, Matrix, RawTensor, ROW_ALIGN};

/// Caller arguments shared by decode and prefill; prefill adds the extend source.
#[derive(Debug, Clone, Copy)]
pub struct AttentionRaw {
    pub layer: u32,
    pub num_tokens: usize,
    pub softmax_scale: f32,
    pub q: RawTensor,
    pub indices: RawTensor,
    pub indptr: RawTensor,
    pub sink: RawTensor,
    pub out: RawTensor,
    pub lse: RawTensor,
    /// Where `indices` point: the default (zeroed) names the pool's `layer`.
    pub kv: KvCacheRaw,
}

/// A caller's key-source descriptor (`unikv_kv_cache`). All zero: the
/// argument's default source (the pool layer, or prefill's `extend_kv`).
#[derive(Debug, Clone, Copy)]
pub struct KvCacheRaw {
    pub layout: u32,
    pub fp8_dtype: u32,
    pub page_size: u32,
    pub reserved: u32,
    pub data: RawTensor,
    pub scales: RawTensor,
}

/// Caller arguments of decode's optional inverse-RoPE epilogue (both absent:
/// none).
#[derive(Debug, Clone, Copy)]
pub struct InverseRopeRaw {
    pub rope_table: RawTensor,
    pub positions: RawTensor,
}

/// Prefill's extend source: `extend_kv`'s bf16 rows unless `cache` names
/// another one.
#[derive(Debug, Clone, Copy)]
pub struct ExtendRaw {
    pub kv: RawTensor,
    pub indices: RawTensor,
    pub indptr: RawTensor,
    pub cache: KvCacheRaw,
}

/// Decode's optional second key source (`extra_kv`, `extra_indices`,
/// `extra_indptr`): absent when `indices` has no data.
#[derive(Debug, Clone, Copy)]
pub struct ExtraRaw {
    pub cache: KvCacheRaw,
    pub indices: RawTensor,
    pub indptr: RawTensor,
}

/// The argument names of one key source (static: aliasing names and
/// `KvSource::names` need no formatting on the launch path).
struct Names {
    cache: &'static str,
    layout: &'static str,
    fp8_dtype: &'static str,
    page_size: &'static str,
    data: &'static str,
    scales: &'static str,
    indices: &'static str,
    indptr: &'static str,
}

const PRIMARY: Names = Names {
    cache: "kv",
    layout: "kv.layout",
    fp8_dtype: "kv.fp8_dtype",
    page_size: "kv.page_size",
    data: "kv.data",
    scales: "kv.scales",
    indices: "indices",
    indptr: "indptr",
};
const EXTRA: Names = Names {
    cache: "extra_kv",
    layout: "extra_kv.layout",
    fp8_dtype: "extra_kv.fp8_dtype",
    page_size: "extra_kv.page_size",
    data: "extra_kv.data",
    scales: "extra_kv.scales",
    indices: "extra_indices",
    indptr: "extra_indptr",
};
const EXTEND: Names = Names {
    cache: "extend_cache",
    layout: "extend_cache.layout",
    fp8_dtype: "extend_cache.fp8_dtype",
    page_size: "extend_cache.page_size",
    data: "extend_cache.data",
    scales: "extend_cache.scales",
    indices: "extend_indices",
    indptr: "extend_indptr",
};

/// What a source with the default (all-zero) descriptor reads.
#[derive(Clone, Copy)]
enum DefaultRows<'p> {
    /// Layer `layer` of the call's pool (which may be absent: then NULL).
    Pool(Option<&'p Pool>, u32),
    /// Prefill's `extend_kv` bf16 rows.
    Extend(&'p RawTensor),
}

/// A validated source's rows and what the overlap check calls them.
struct SourceRows {
    rows: KeyRows,
    /// The pool layer the rows belong to (None: a caller's tensor).
    pool_layer: Option<u32>,
}

/// The rows a source descriptor names, checked against the plan's layout and
/// FP8 flavour.
fn key_rows(
    shape: &PlanShape,
    names: &Names,
    raw: &KvCacheRaw,
    default: DefaultRows,
) -> Result<SourceRows> {
    let layout = KvLayout::from_raw(names.layout, raw.layout)?;
    ensure!(
        raw.reserved == 0,
        InvalidArgument,
        "{}.reserved: must be 0",
        names.cache
    );
    if layout == KvLayout::Pool {
        for (field, set) in [
            (names.fp8_dtype, raw.fp8_dtype != 0),
            (names.page_size, raw.page_size != 0),
            (names.data, !raw.data.data.is_null()),
            (names.scales, !raw.scales.data.is_null()),
        ] {
            ensure!(
                !set,
                InvalidArgument,
                "{field}: set while {} is UNIKV_KV_LAYOUT_POOL (0); set the layout of the cache it describes",
                names.layout
            );
        }
        return match default {
            DefaultRows::Extend(kv) => {
                let kv: Matrix<bf16> = kv.view(
                    "extend_kv",
                    [Extent::AtLeast(0), Extent::Exact(HEAD_DIM)],
                    ROW_ALIGN,
                )?;
                Ok(SourceRows {
                    rows: KeyRows::Layer(LayerRows::Bf16(kv)),
                    pool_layer: None,
                })
            }
            DefaultRows::Pool(pool, layer) => {
                ensure!(
                    shape.kv_layout == KvLayout::Pool,
                    InvalidArgument,
                    "{}: names the pool's layer, the plan was made for {} key sources",
                    names.layout,
                    shape.kv_layout.name()
                );
                let pool = pool.ok_or_else(|| {
                    err!(
                        NullArgument,
                        "pool (the key source {} is the pool's layer)",
                        names.indices
                    )
                })?;
                ensure!(
                    shape.kv_dtype == pool.dtype(),
                    BadDtype,
                    "plan: made for {} KV rows, the pool holds {}",
                    shape.kv_dtype.name(),
                    pool.dtype().name()
                );
                let index = pool.geometry().check_layer(layer)?;
                Ok(SourceRows {
                    rows: KeyRows::Layer(pool.layer_rows(index)),
                    pool_layer: Some(layer),
                })
            }
        };
    }
    ensure!(
        shape.kv_layout == layout,
        InvalidArgument,
        "{}: a {} cache, the plan was made for {} key sources",
        names.layout,
        layout.name(),
        shape.kv_layout.name()
    );
    let format = fp8_format(names.fp8_dtype, raw.fp8_dtype)?;
    ensure!(
        shape.kv_dtype.fp8_format() == Some(format),
        BadDtype,
        "{}: the cache holds {format:?} codes, the plan was made for {}",
        names.fp8_dtype,
        shape.kv_dtype.name()
    );
    let rows = match layout {
        KvLayout::Pool => unreachable!("handled above"),
        KvLayout::FlashMla => {
            let geometry = FlashMlaGeometry::new(raw.page_size.into(), format)
                .map_err(|e| err!(InvalidArgument, "{}: {e}", names.page_size))?;
            ensure!(
                raw.scales.data.is_null(),
                InvalidArgument,
                "{}: a FlashMLA cache keeps its scales in its pages; pass no scales tensor",
                names.scales
            );
            let cache = page_cache(names.data, raw.data, geometry.bytes_per_page() as usize)?;
            KeyRows::FlashMla { cache, geometry }
        }
        KvLayout::ScaledFp8 => {
            ensure!(
                raw.page_size == 0,
                InvalidArgument,
                "{}: {} is not 0 (scaled FP8 rows are not paged)",
                names.page_size,
                raw.page_size
            );
            let codes: Matrix<u8> = raw.data.view(
                names.data,
                [Extent::AtLeast(0), Extent::Exact(scaled::ROW_DIMS)],
                ROW_ALIGN,
            )?;
            let scales: Matrix<f32> = raw.scales.view(
                names.scales,
                [
                    Extent::Exact(codes.shape[0]),
                    Extent::Exact(scaled::SCALES_PER_ROW),
                ],
                ROW_ALIGN,
            )?;
            KeyRows::ScaledFp8 {
                codes,
                scales,
                format,
            }
        }
    };
    Ok(SourceRows {
        rows,
        pool_layer: None,
    })
}

/// What the overlap check calls a validated source's arguments.
#[derive(Clone, Copy)]
struct Origin {
    names: &'static Names,
    /// The pool layer the rows belong to (None: a caller's tensor).
    pool_layer: Option<u32>,
}

/// One validated key source.
fn source(
    shape: &PlanShape,
    names: &'static Names,
    cache: &KvCacheRaw,
    default: DefaultRows,
    (indices, indptr): (&RawTensor, &RawTensor),
    t: usize,
) -> Result<(KvSource, Origin)> {
    let rows = key_rows(shape, names, cache, default)?;
    Ok((
        KvSource {
            kv: rows.rows,
            indices: indices.view(names.indices, [Extent::AtLeast(0)], 4)?,
            indptr: indptr.view(names.indptr, [Extent::AtLeast(t + 1)], 4)?,
            names: (names.indices, names.indptr),
        },
        Origin {
            names,
            pool_layer: rows.pool_layer,
        },
    ))
}

/// The call's second key source: decode's optional extra source or prefill's
/// extend source.
enum Second<'r> {
    Extra(&'r ExtraRaw),
    Extend(&'r ExtendRaw),
}

/// Validates a call: `second` is prefill's extend source or decode's extra
/// one, `epilogue_raw` decode's inverse-RoPE epilogue.
fn validate<'a>(
    plan: &'a AttentionPlan,
    pool: Option<&Pool>,
    raw: &AttentionRaw,
    second: Second,
    epilogue_raw: Option<&InverseRopeRaw>,
    workspace: Workspace,
) -> Result<AttentionArgs<'a>> {
    if let Some(pool) = pool {
        ensure!(
            Arc::ptr_eq(plan.context(), pool.context()),
            InvalidArgument,
            "pool: belongs to a different context than the plan"
        );
    }
    plan.context().check_usable()?;
    let shape = plan.shape();
    let t = raw.num_tokens;
    let h = shape.num_heads;
    ensure!(
        t <= shape.max_tokens,
        CapacityExceeded,
        "num_tokens: {t} exceeds the plan's max_tokens {}",
        shape.max_tokens
    );
    ensure!(
        raw.softmax_scale.is_finite(),
        InvalidArgument,
        "softmax_scale: {} is not finite",
        raw.softmax_scale
    );
    ensure!(
        workspace.bytes >= plan.workspace_bytes(),
        CapacityExceeded,
        "workspace_bytes: {} is less than the plan's {}",
        workspace.bytes,
        plan.workspace_bytes()
    );
    ensure!(
        plan.workspace_bytes() == 0 || !workspace.ptr.is_null(),
        NullArgument,
        "workspace"
    );
    let pool_rows = DefaultRows::Pool(pool, raw.layer);
    let first = source(
        shape,
        &PRIMARY,
        &raw.kv,
        pool_rows,
        (&raw.indices, &raw.indptr),
        t,
    )?;
    let second = match second {
        Second::Extend(ext) => {
            if ext.cache.layout != KvLayout::Pool.to_raw() {
                ensure!(
                    ext.kv.data.is_null(),
                    InvalidArgument,
                    "extend_kv: must be absent when {} names the extend source",
                    EXTEND.layout
                );
            }
            let rows = DefaultRows::Extend(&ext.kv);
            Some(source(
                shape,
                &EXTEND,
                &ext.cache,
                rows,
                (&ext.indices, &ext.indptr),
                t,
            )?)
        }
        Second::Extra(extra) if extra.indices.data.is_null() => {
            for (field, set) in [
                (EXTRA.indptr, !extra.indptr.data.is_null()),
                (EXTRA.layout, extra.cache.layout != 0),
                (EXTRA.data, !extra.cache.data.data.is_null()),
                (EXTRA.scales, !extra.cache.scales.data.is_null()),
            ] {
                ensure!(
                    !set,
                    InvalidArgument,
                    "{field}: set without extra_indices (no second key source)"
                );
            }
            None
        }
        Second::Extra(extra) => Some(source(
            shape,
            &EXTRA,
            &extra.cache,
            pool_rows,
            (&extra.indices, &extra.indptr),
            t,
        )?),
    };
    let mut sources = [first.0, first.0];
    let mut origins = [first.1, first.1];
    if let Some((src, origin)) = second {
        sources[1] = src;
        origins[1] = origin;
    }
    let row = [tokens(t), Extent::Exact(h), Extent::Exact(HEAD_DIM)];
    let args = AttentionArgs {
        launch: plan.launch(),
        num_tokens: t,
        num_heads: h,
        softmax_scale: raw.softmax_scale,
        q: raw.q.view("q", row, ROW_ALIGN)?,
        sources,
        num_sources: 1 + second.is_some() as usize,
        skip_negative: shape.kind == PlanKind::Prefill,
        sink: raw.sink.optional("sink", [Extent::Exact(h)], 4)?,
        out: raw.out.view("out", row, ROW_ALIGN)?,
        lse: raw.lse.optional("lse", [tokens(t), Extent::Exact(h)], 4)?,
        workspace,
        inverse_rope: match epilogue_raw {
            Some(e) => epilogue(e, t)?,
            None => None,
        },
    };
    check_overlaps(&args, origins)?;
    Ok(args)
}

/// `out` may be `q` itself: on every backend all reads of a (token, head)'s
/// query come before the output row that replaces it is written. The CPU
/// backend copies each head's query out before computing its row
/// (`backend::cpu::attention`); each kernel of kernels/attention/ (the
/// portable ones included) loads its block's query rows into shared memory
/// once, before its first key tile, and outputs are written after the last
/// one: by the block itself (an unsplit token), by the cluster merge after a
/// cluster barrier all of the token's splits reach, or by `combine_kernel`
/// after it waits for the attention grid to finish (PDL).
const IN_PLACE: &[(&str, &str)] = &[("out", "q")];

/// Outputs `out`, `lse` and the workspace (GPU scratch) against every input,
/// every key source's rows included (pool layers by their layer number).
fn check_overlaps(args: &AttentionArgs, origins: [Origin; 2]) -> Result<()> {
    let epilogue = args.inverse_rope;
    let workspace_bytes = args.launch.workspace_bytes;
    let mut operands = vec![
        output("out", &args.out),
        output("lse", &args.lse),
        scratch("workspace", args.workspace.ptr, workspace_bytes),
        input("q", &args.q),
        input("sink", &args.sink),
        input("rope_table", &epilogue.map(|e| e.table)),
        input("positions", &epilogue.map(|e| e.positions)),
    ];
    for (src, origin) in args.sources().iter().zip(origins) {
        let names = origin.names;
        operands.push(input(names.indices, &src.indices));
        operands.push(input(names.indptr, &src.indptr));
        operands.extend(rows_operands(names, &src.kv, origin.pool_layer));
    }
    aliasing::check(&operands, IN_PLACE)
}

/// The operands of a source's rows: a pool layer, `extend_kv`, or a cache's
/// tensors.
fn rows_operands(names: &Names, rows: &KeyRows, layer: Option<u32>) -> Vec<Operand> {
    match (rows, layer) {
        (KeyRows::Layer(rows), Some(layer)) => vec![pool_input(layer, rows)],
        (KeyRows::Layer(rows), None) => vec![input("extend_kv", rows)],
        (KeyRows::FlashMla { cache, .. }, _) => vec![input(names.data, cache)],
        (KeyRows::ScaledFp8 { codes, scales, .. }, _) => {
            vec![input(names.data, codes), input(names.scales, scales)]
        }
    }
}

fn epilogue(raw: &InverseRopeRaw, t: usize) -> Result<Option<InverseRopeEpilogue>> {
    let (table, positions) = (&raw.rope_table, &raw.positions);
    match (table.data.is_null(), positions.data.is_null()) {
        (true, true) => Ok(None),
        (false, true) => Err(err!(
            NullArgument,
            "positions: the inverse-RoPE epilogue needs positions with rope_table"
        )),
        (true, false) => Err(err!(
            NullArgument,
            "rope_table: the inverse-RoPE epilogue needs rope_table with positions"
        )),
        (false, false) => Ok(Some(InverseRopeEpilogue {
            table: rope::rope_table(table)?,
            positions: positions.index_vector("positions", Extent::AtLeast(t))?,
        })),
    }
}

fn expect_kind(plan: &AttentionPlan, kind: PlanKind) -> Result<()> {
    ensure!(
        plan.shape().kind == kind,
        InvalidArgument,
        "plan: made for {:?}, used for {kind:?}",
        plan.shape().kind
    );
    Ok(())
}

/// Decode attention; `pool` may be absent when no key source is a pool layer.
pub fn decode(
    plan: &AttentionPlan,
    pool: Option<&Pool>,
    raw: &AttentionRaw,
    extra: &ExtraRaw,
    epilogue_raw: &InverseRopeRaw,
    workspace: Workspace,
    stream: Stream,
) -> Result<()> {
    expect_kind(plan, PlanKind::Decode)?;
    let second = Second::Extra(extra);
    let args = validate(plan, pool, raw, second, Some(epilogue_raw), workspace)?;
    plan.context().backend().attention(&args, stream)
}

/// Prefill attention; `pool` may be absent when no key source is a pool layer.
pub fn prefill(
    plan: &AttentionPlan,
    pool: Option<&Pool>,
    raw: &AttentionRaw,
    extend: &ExtendRaw,
    workspace: Workspace,
    stream: Stream,
) -> Result<()> {
    expect_kind(plan, PlanKind::Prefill)?;
    let args = validate(plan, pool, raw, Second::Extend(extend), None, workspace)?;
    plan.context().backend().attention(&args, stream)
}
