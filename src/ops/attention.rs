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
    AttentionArgs, InverseRopeEpilogue, KvSource, PlanKind, Workspace, SOURCE_NAMES,
};
use crate::args::LayerRows;
use crate::backend::Stream;
use crate::error::{ensure, err, Result};
use crate::geometry::HEAD_DIM;
use crate::ops::aliasing::{self, input, output, pool_input, scratch};
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
}

/// Caller arguments of decode's optional inverse-RoPE epilogue (both absent:
/// none).
#[derive(Debug, Clone, Copy)]
pub struct InverseRopeRaw {
    pub rope_table: RawTensor,
    pub positions: RawTensor,
}

#[derive(Debug, Clone, Copy)]
pub struct ExtendRaw {
    pub kv: RawTensor,
    pub indices: RawTensor,
    pub indptr: RawTensor,
}

fn source(
    which: usize,
    kv: LayerRows,
    indices: &RawTensor,
    indptr: &RawTensor,
    t: usize,
) -> Result<KvSource> {
    let (indices_name, indptr_name) = SOURCE_NAMES[which];
    Ok(KvSource {
        kv,
        indices: indices.view(indices_name, [Extent::AtLeast(0)], 4)?,
        indptr: indptr.view(indptr_name, [Extent::AtLeast(t + 1)], 4)?,
    })
}

/// Validates a call: `extend` for prefill, `epilogue_raw` for decode.
fn validate<'a>(
    plan: &'a AttentionPlan,
    pool: &Pool,
    raw: &AttentionRaw,
    extend: Option<&ExtendRaw>,
    epilogue_raw: Option<&InverseRopeRaw>,
    workspace: Workspace,
) -> Result<AttentionArgs<'a>> {
    ensure!(
        Arc::ptr_eq(plan.context(), pool.context()),
        InvalidArgument,
        "pool: belongs to a different context than the plan"
    );
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
    ensure!(
        shape.kv_dtype == pool.dtype(),
        BadDtype,
        "plan: made for {} KV rows, the pool holds {}",
        shape.kv_dtype.name(),
        pool.dtype().name()
    );
    let layer = pool.geometry().check_layer(raw.layer)?;
    let pool_source = source(0, pool.layer_rows(layer), &raw.indices, &raw.indptr, t)?;
    let mut sources = [pool_source, pool_source];
    if let Some(ext) = extend {
        let kv: Matrix<bf16> = ext.kv.view(
            "extend_kv",
            [Extent::AtLeast(0), Extent::Exact(HEAD_DIM)],
            ROW_ALIGN,
        )?;
        sources[1] = source(1, LayerRows::Bf16(kv), &ext.indices, &ext.indptr, t)?;
    }
    let row = [tokens(t), Extent::Exact(h), Extent::Exact(HEAD_DIM)];
    let args = AttentionArgs {
        launch: plan.launch(),
        num_tokens: t,
        num_heads: h,
        softmax_scale: raw.softmax_scale,
        q: raw.q.view("q", row, ROW_ALIGN)?,
        sources,
        num_sources: 1 + extend.is_some() as usize,
        skip_negative: extend.is_some(),
        sink: raw.sink.optional("sink", [Extent::Exact(h)], 4)?,
        out: raw.out.view("out", row, ROW_ALIGN)?,
        lse: raw.lse.optional("lse", [tokens(t), Extent::Exact(h)], 4)?,
        workspace,
        inverse_rope: match epilogue_raw {
            Some(e) => epilogue(e, t)?,
            None => None,
        },
    };
    check_overlaps(&args, raw.layer)?;
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
/// the pool layer included.
fn check_overlaps(args: &AttentionArgs, layer: u32) -> Result<()> {
    let keys = &args.sources[0];
    let extend = args.sources().get(1);
    let epilogue = args.inverse_rope;
    let workspace_bytes = args.launch.workspace_bytes;
    aliasing::check(
        &[
            output("out", &args.out),
            output("lse", &args.lse),
            scratch("workspace", args.workspace.ptr, workspace_bytes),
            input("q", &args.q),
            input("sink", &args.sink),
            pool_input(layer, &keys.kv),
            input(SOURCE_NAMES[0].0, &keys.indices),
            input(SOURCE_NAMES[0].1, &keys.indptr),
            input("extend_kv", &extend.map(|s| s.kv)),
            input(SOURCE_NAMES[1].0, &extend.map(|s| s.indices)),
            input(SOURCE_NAMES[1].1, &extend.map(|s| s.indptr)),
            input("rope_table", &epilogue.map(|e| e.table)),
            input("positions", &epilogue.map(|e| e.positions)),
        ],
        IN_PLACE,
    )
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

pub fn decode(
    plan: &AttentionPlan,
    pool: &Pool,
    raw: &AttentionRaw,
    epilogue_raw: &InverseRopeRaw,
    workspace: Workspace,
    stream: Stream,
) -> Result<()> {
    expect_kind(plan, PlanKind::Decode)?;
    let args = validate(plan, pool, raw, None, Some(epilogue_raw), workspace)?;
    plan.context().backend().attention(&args, stream)
}

pub fn prefill(
    plan: &AttentionPlan,
    pool: &Pool,
    raw: &AttentionRaw,
    extend: &ExtendRaw,
    workspace: Workspace,
    stream: Stream,
) -> Result<()> {
    expect_kind(plan, PlanKind::Prefill)?;
    let args = validate(plan, pool, raw, Some(extend), None, workspace)?;
    plan.context().backend().attention(&args, stream)
}
