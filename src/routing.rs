//! Hash-routed MoE gating (docs/routing.md §1), the reference the CPU backend
//! computes with and the GPU kernel follows.
//!
//! The first MoE layers of DeepSeek-V4 do not select experts from the router:
//! a checkpoint table `tid2eid[token_id]` names them, and the router logits
//! only weigh them. For a row with experts `e_j` (table order, j < K):
//!
//! ```text
//! w_j = sqrt(softplus(logit[e_j]))        softplus(x) = max(x, 0) + log1p(exp(-|x|))
//! out_j = (e_j, w_j / sum_j w_j)
//! ```
//!
//! then S fused shared-expert slots `(E + s, 1 / routed_scaling_factor)`.
//! Everything is computed in f64 and rounded to f32 once per weight, so a
//! weight is within half an f32 ulp of the exact value (up to the f64
//! library's own error) for any logits, including ones far below zero where
//! an f32 `exp(-|x|)` would be subnormal.

/// Most slots per row (routed + shared): one warp lane each on the GPU.
pub const MAX_SLOTS: usize = 32;

/// `max(x, 0) + log1p(exp(-|x|))`, the overflow-free form of `ln(1 + e^x)`.
pub fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// One row's outputs. `logits` is the row of router logits (E values),
/// `experts` the K table entries for the row's token, already checked to be
/// below E; `weights` and `ids` have K + S slots.
pub fn hash_topk_row(
    logits: &[f32],
    experts: &[i32],
    routed_scaling_factor: f32,
    weights: &mut [f32],
    ids: &mut [i32],
) {
    let k = experts.len();
    assert!(
        weights.len() == ids.len() && weights.len() >= k,
        "K + S output slots"
    );
    let w: Vec<f64> = experts
        .iter()
        .map(|&e| softplus(f64::from(logits[e as usize])).sqrt())
        .collect();
    let sum: f64 = w.iter().sum();
    for j in 0..k {
        ids[j] = experts[j];
        weights[j] = (w[j] / sum) as f32;
    }
    let shared = (1.0 / f64::from(routed_scaling_factor)) as f32;
    for (s, j) in (k..ids.len()).enumerate() {
        ids[j] = (logits.len() + s) as i32;
        weights[j] = shared;
    }
}

/// A padded row (index at or past the number of real tokens): no experts.
pub fn padded_row(weights: &mut [f32], ids: &mut [i32]) {
    weights.fill(0.0);
    ids.fill(-1);
}
