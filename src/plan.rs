//! Attention plans: launch configuration fixed from capture-time shapes, so every
//! launch through a plan has the same grid and workspace needs whatever the
//! runtime lengths and indices are (CUDA-graph safe).

use std::sync::Arc;

use crate::args::attention::{PlanShape, PlannedLaunch};
use crate::context::Context;
use crate::error::Result;

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
