//! Attention plans: launch configuration fixed from capture-time shapes, so every
//! launch through a plan has the same grid and workspace needs whatever the
//! runtime lengths and indices are (CUDA-graph safe).

use std::sync::Arc;

use crate::backend::PlannedLaunch;
use crate::context::Context;
use crate::dtype::DType;
use crate::error::{ensure, Result};
use crate::geometry::HEAD_DIM;

/// Largest local head count a plan accepts.
pub const MAX_HEADS: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanKind {
    Decode,
    Prefill,
}

/// The capture-time shapes a plan is made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanShape {
    pub kind: PlanKind,
    pub max_tokens: usize,
    pub num_heads: usize,
    pub head_dim: usize,
    pub q_dtype: DType,
    pub kv_dtype: DType,
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

#[derive(Debug)]
pub struct AttentionPlan {
    ctx: Arc<Context>,
    shape: PlanShape,
    launch: PlannedLaunch,
}

impl AttentionPlan {
    pub fn new(ctx: Arc<Context>, shape: PlanShape) -> Result<Self> {
        ctx.check_usable()?;
        shape.check()?;
        let launch = ctx.backend().plan_attention(&shape)?;
        Ok(AttentionPlan { ctx, shape, launch })
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub fn shape(&self) -> &PlanShape {
        &self.shape
    }

    pub fn workspace_bytes(&self) -> usize {
        self.launch.workspace_bytes
    }

    pub fn launch(&self) -> &PlannedLaunch {
        &self.launch
    }
}
