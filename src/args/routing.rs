//! hash_topk's contract (math: `crate::routing`).

use crate::tensor::{IndexVector, Matrix};

/// How many leading rows are real tokens (the rest are padding).
#[derive(Debug, Clone, Copy)]
pub enum RealTokens {
    /// Known on the host at launch.
    Host(usize),
    /// Element 0 of a device vector (int32 or int64), read by the kernel.
    Device(IndexVector),
}

/// Validated `hash_topk`: K = `tid2eid.shape[1]`, E = `router_logits.shape[1]`,
/// slots K + S. Device values (token ids, table entries, the device count of
/// real tokens) are not checked here.
#[derive(Debug, Clone, Copy)]
pub struct HashTopkArgs {
    pub router_logits: Matrix<f32>,
    pub input_ids: IndexVector,
    pub tid2eid: Matrix<i32>,
    pub topk_weights: Matrix<f32>,
    pub topk_ids: Matrix<i32>,
    pub real_tokens: RealTokens,
    pub num_tokens: usize,
    pub num_shared: usize,
    pub routed_scaling_factor: f32,
}

impl HashTopkArgs {
    /// Routed experts per row (K).
    pub fn routed(&self) -> usize {
        self.tid2eid.shape[1]
    }

    /// Experts the router scores (E): shared slots are numbered from here.
    pub fn num_experts(&self) -> usize {
        self.router_logits.shape[1]
    }
}
