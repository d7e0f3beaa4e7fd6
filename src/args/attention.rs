//! Attention's contract: the plan shapes and launch a backend plans from, and
//! the validated decode / prefill call (math: `ops::attention`).

use std::fmt::Debug;

use half::bf16;

use crate::args::LayerRows;
use crate::cache_layouts::flashmla::FlashMlaGeometry;
use crate::dtype::DType;
use crate::error::{ensure, err, Result};
use crate::fp8::Fp8Format;
use crate::geometry::HEAD_DIM;
use crate::tensor::{IndexVector, Matrix, Tensor3, Vector};

/// Largest local head count a plan accepts.
pub const MAX_HEADS: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanKind {
    Decode,
    Prefill,
}

/// Where a key source's rows live (docs/attention.md §6). A plan is made for
/// one layout: its calls' key sources are of that layout, or bf16 rows
/// (prefill's extend rows; a bf16 pool's layer for a bf16 plan).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayout {
    /// unikv's own rows: a pool layer (bf16, or FP8 rows, docs/fp8.md §4).
    Pool,
    /// FlashMLA's paged FP8 cache (docs/fp8.md §5); keys are token ids.
    FlashMla,
    /// Scaled FP8 rows: codes plus fp32 scales (docs/fp8.md §8).
    ScaledFp8,
}

impl KvLayout {
    /// The layout a `unikv_kv_layout` value names; an unknown value is `BadEnum`.
    pub fn from_raw(name: &str, raw: u32) -> Result<Self> {
        match raw {
            0 => Ok(KvLayout::Pool),
            1 => Ok(KvLayout::FlashMla),
            2 => Ok(KvLayout::ScaledFp8),
            _ => Err(err!(BadEnum, "{name}: unknown unikv_kv_layout value {raw}")),
        }
    }

    pub fn to_raw(self) -> u32 {
        match self {
            KvLayout::Pool => 0,
            KvLayout::FlashMla => 1,
            KvLayout::ScaledFp8 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvLayout::Pool => "pool",
            KvLayout::FlashMla => "FlashMLA",
            KvLayout::ScaledFp8 => "scaled FP8",
        }
    }
}

/// The capture-time shapes a plan is made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanShape {
    pub kind: PlanKind,
    pub max_tokens: usize,
    pub num_heads: usize,
    pub head_dim: usize,
    pub q_dtype: DType,
    /// The FP8 flavour (or bf16) of the key sources' rows.
    pub kv_dtype: DType,
    /// The layout of the key sources (`KvLayout`).
    pub kv_layout: KvLayout,
    pub out_dtype: DType,
}

impl PlanShape {
    pub fn check(&self) -> Result<()> {
        ensure!(
            self.max_tokens >= 1 && self.max_tokens <= i32::MAX as usize,
            InvalidArgument,
            "params.max_tokens: {} is outside 1..=2^31-1",
            self.max_tokens
        );
        ensure!(
            (1..=MAX_HEADS).contains(&self.num_heads),
            InvalidArgument,
            "params.num_heads: {} is outside 1..={MAX_HEADS}",
            self.num_heads
        );
        ensure!(
            self.head_dim == HEAD_DIM,
            InvalidArgument,
            "params.head_dim: {} is not supported, expected {HEAD_DIM}",
            self.head_dim
        );
        ensure!(
            self.kv_dtype == DType::Bf16 || self.kv_dtype.fp8_format().is_some(),
            BadDtype,
            "params.kv_dtype: {} is not supported, expected the pool's dtype (bf16, fp8_e4m3fn or fp8_e4m3fnuz)",
            self.kv_dtype.name()
        );
        ensure!(
            self.kv_layout == KvLayout::Pool || self.kv_dtype.fp8_format().is_some(),
            BadDtype,
            "params.kv_dtype: {} rows are not a {} layout, whose codes are fp8_e4m3fn or fp8_e4m3fnuz",
            self.kv_dtype.name(),
            self.kv_layout.name()
        );
        for (name, dtype) in [
            ("params.q_dtype", self.q_dtype),
            ("params.out_dtype", self.out_dtype),
        ] {
            ensure!(
                dtype == DType::Bf16,
                BadDtype,
                "{name}: {} is not supported, expected bf16",
                dtype.name()
            );
        }
        Ok(())
    }
}

/// Backend-specific launch configuration kept in a plan (kernels loaded, split
/// counts chosen). The CPU backend keeps none.
pub trait PlanState: Send + Sync + Debug {
    /// For the backend that made the plan to recover its own type.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// The kernel family a plan launches (what `unikv_*_plan_get_info` reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFamily {
    /// The CPU backend's reference computation.
    CpuReference,
    /// mma.sync tensor-core kernel (any NVIDIA sm_80+).
    Mma,
    /// sm_90a warpgroup-MMA kernel with 64-head blocks on the M side.
    WgmmaHeadsOnM,
    /// sm_90a warpgroup-MMA kernel with 16- or 32-head blocks on the N side.
    WgmmaHeadsOnN,
    /// Portable kernel on CUDA cores (HIP builds; a test hook on NVIDIA).
    PortableScalar,
    /// Portable kernel on matrix cores (HIP builds; a test hook on NVIDIA).
    PortableMatrix,
}

/// How a plan launches, as the backend chose it (introspection and logs only;
/// launches read the backend's own `state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchSummary {
    pub family: KernelFamily,
    /// Heads one block (CPU: one work item) computes.
    pub head_block: usize,
    /// Blocks per token along the heads.
    pub head_blocks: usize,
    /// Most key splits per (token, head block); 1 = no split.
    pub max_splits: usize,
    /// Splits merge inside a thread-block cluster (no workspace, no combine launch).
    pub cluster_merge: bool,
    /// Key-tile pipeline stages (0 on the CPU).
    pub stages: usize,
    /// The combine kernel is launched early (programmatic dependent launch).
    pub dependent_launch: bool,
    /// FP8 plans whose kernel has a raw variant, taken by calls whose every
    /// key source is an e4m3fn pool, or every one an e4m3fn FlashMLA cache.
    pub raw_fp8_variant: bool,
    /// Multiprocessors the plan was sized for (0 on the CPU).
    pub sm_count: usize,
    /// Splits of calls with long key lists, merged by the combine kernel
    /// through the workspace (0: none beyond `max_splits`).
    pub long_splits: usize,
    /// Index capacity per token (summed over the key sources) from which a
    /// call takes `long_splits`; 0 with `long_splits` set: every call.
    pub long_keys: usize,
}

/// What a backend decided for a plan: its workspace needs and private state.
#[derive(Debug)]
pub struct PlannedLaunch {
    pub workspace_bytes: usize,
    pub summary: LaunchSummary,
    pub state: Option<Box<dyn PlanState>>,
}

/// Validated epilogue: dims 448..511 of token t's outputs are rotated by the
/// conjugate of `table` row `positions[t]` before rounding (`rope::inverse_rope_row`).
#[derive(Debug, Clone, Copy)]
pub struct InverseRopeEpilogue {
    pub table: Matrix<f32>,
    pub positions: IndexVector,
}

/// Where a key source's rows live: a layer of the pool or prefill's bf16
/// extend rows (`Layer`), or a caller-owned cache of another layout.
#[derive(Debug, Clone, Copy)]
pub enum KeyRows {
    /// A pool layer's rows (the pool's row kind), or prefill's bf16 extend rows.
    Layer(LayerRows),
    /// FlashMLA's paged cache, `[num_pages, bytes_per_page]` bytes with row
    /// stride exactly `bytes_per_page`: key `i` is token slot `i % page_size`
    /// of page `i / page_size` (docs/fp8.md §5).
    FlashMla {
        cache: Matrix<u8>,
        geometry: FlashMlaGeometry,
    },
    /// Scaled FP8 rows (docs/fp8.md §8): `codes` `[rows, 512]`, `scales`
    /// `[rows, 8]` f32.
    ScaledFp8 {
        codes: Matrix<u8>,
        scales: Matrix<f32>,
        format: Fp8Format,
    },
}

impl KeyRows {
    /// Keys the source holds: valid indices are below it.
    pub fn rows(&self) -> usize {
        match self {
            KeyRows::Layer(rows) => rows.rows(),
            KeyRows::FlashMla { cache, geometry } => {
                crate::cache_layouts::flashmla::token_slots(geometry, cache.shape[0])
            }
            KeyRows::ScaledFp8 { codes, .. } => codes.shape[0],
        }
    }

    /// The FP8 flavour of the source's codes (None for bf16 rows).
    pub fn fp8_format(&self) -> Option<Fp8Format> {
        match self {
            KeyRows::Layer(LayerRows::Bf16(_)) => None,
            KeyRows::Layer(LayerRows::Fp8 { format, .. }) => Some(*format),
            KeyRows::FlashMla { geometry, .. } => Some(geometry.format()),
            KeyRows::ScaledFp8 { format, .. } => Some(*format),
        }
    }
}

/// One key/value source: rows of `kv` named by `indices[indptr[t]..indptr[t+1]]`.
/// `names` are the (indices, indptr) argument names, for messages.
#[derive(Debug, Clone, Copy)]
pub struct KvSource {
    pub kv: KeyRows,
    pub indices: Vector<i32>,
    pub indptr: Vector<i32>,
    pub names: (&'static str, &'static str),
}

/// Caller-provided scratch memory, at least the plan's workspace size.
#[derive(Debug, Clone, Copy)]
pub struct Workspace {
    pub ptr: *mut u8,
    pub bytes: usize,
}

// SAFETY: an address in the context's memory, written only by the launch it is
// passed to.
unsafe impl Send for Workspace {}
unsafe impl Sync for Workspace {}

/// Validated attention call. `skip_negative` is the prefill rule: index -1 is
/// skipped; decode streams must hold only valid rows.
#[derive(Debug)]
pub struct AttentionArgs<'a> {
    /// The plan's launch configuration (the GPU backend's kernels and splits).
    pub launch: &'a PlannedLaunch,
    pub num_tokens: usize,
    pub num_heads: usize,
    pub softmax_scale: f32,
    pub q: Tensor3<bf16>,
    /// Key sources in order; only the first `num_sources` are used (set by
    /// `ops::attention`; backends read them through `sources()`).
    pub(crate) sources: [KvSource; 2],
    pub(crate) num_sources: usize,
    pub skip_negative: bool,
    pub sink: Option<Vector<f32>>,
    pub out: Tensor3<bf16>,
    pub lse: Option<Matrix<f32>>,
    pub workspace: Workspace,
    /// Decode only.
    pub inverse_rope: Option<InverseRopeEpilogue>,
}

impl AttentionArgs<'_> {
    /// The key sources in order: decode's `indices` then `extra_indices`, or
    /// prefill's prefix then extend stream.
    pub fn sources(&self) -> &[KvSource] {
        &self.sources[..self.num_sources]
    }
}
