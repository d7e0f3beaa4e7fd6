//! Hash-routed MoE gating (docs/routing.md §1): per row, the K experts the
//! table names for the row's token, weighted from the router logits, plus S
//! fused shared-expert slots. The math is `crate::routing`.

use crate::args::routing::{HashTopkArgs, RealTokens};
use crate::backend::Stream;
use crate::context::Context;
use crate::error::{ensure, Result};
use crate::ops::aliasing::{self, input, output};
use crate::ops::tokens;
use crate::routing::MAX_SLOTS;
use crate::tensor::{Extent, Matrix, RawTensor};

/// Caller arguments of `hash_topk`.
#[derive(Debug, Clone, Copy)]
pub struct HashTopkRaw {
    pub router_logits: RawTensor,
    pub input_ids: RawTensor,
    pub tid2eid: RawTensor,
    pub topk_weights: RawTensor,
    pub topk_ids: RawTensor,
    pub num_real_tokens: RawTensor,
    pub num_real_tokens_host: u32,
    pub num_tokens: usize,
    pub num_shared: u32,
    pub routed_scaling_factor: f32,
}

pub fn hash_topk(ctx: &Context, raw: &HashTopkRaw, stream: Stream) -> Result<()> {
    ctx.check_usable()?;
    let args = validate(raw)?;
    let real_tokens = match args.real_tokens {
        RealTokens::Device(v) => Some(v),
        RealTokens::Host(_) => None,
    };
    aliasing::check(
        &[
            output("topk_weights", &args.topk_weights),
            output("topk_ids", &args.topk_ids),
            input("router_logits", &args.router_logits),
            input("input_ids", &args.input_ids),
            input("tid2eid", &args.tid2eid),
            input("num_real_tokens", &real_tokens),
        ],
        &[],
    )?;
    ctx.backend().hash_topk(&args, stream)
}

fn validate(raw: &HashTopkRaw) -> Result<HashTopkArgs> {
    let n = raw.num_tokens;
    // Kernels index rows with 32-bit integers.
    ensure!(
        n <= i32::MAX as usize,
        InvalidArgument,
        "num_tokens: {n} exceeds 2^31 - 1"
    );
    let tid2eid: Matrix<i32> =
        raw.tid2eid
            .view("tid2eid", [Extent::AtLeast(1), Extent::AtLeast(1)], 4)?;
    let (k, s) = (tid2eid.shape[1], raw.num_shared as usize);
    ensure!(
        k + s <= MAX_SLOTS,
        InvalidArgument,
        "num_shared: K + S = {k} + {s} exceeds {MAX_SLOTS} slots per row (K = tid2eid.shape[1])"
    );
    let router_logits: Matrix<f32> =
        raw.router_logits
            .view("router_logits", [tokens(n), Extent::AtLeast(1)], 4)?;
    let experts = router_logits.shape[1];
    ensure!(
        experts + s <= i32::MAX as usize,
        BadShape,
        "router_logits: {experts} experts leave no int32 ids for {s} shared slots"
    );
    let rsf = raw.routed_scaling_factor;
    ensure!(
        rsf.is_finite() && rsf > 0.0,
        InvalidArgument,
        "routed_scaling_factor: {rsf} is not a finite positive number"
    );
    let slots = [tokens(n), Extent::Exact(k + s)];
    let real_tokens = match raw
        .num_real_tokens
        .optional_index_vector("num_real_tokens", Extent::AtLeast(1))?
    {
        Some(v) => RealTokens::Device(v),
        None => {
            let host = raw.num_real_tokens_host as usize;
            ensure!(
                host <= n,
                InvalidArgument,
                "num_real_tokens_host: {host} exceeds num_tokens {n}"
            );
            RealTokens::Host(host)
        }
    };
    Ok(HashTopkArgs {
        router_logits,
        input_ids: raw.input_ids.index_vector("input_ids", tokens(n))?,
        tid2eid,
        topk_weights: raw.topk_weights.view("topk_weights", slots, 4)?,
        topk_ids: raw.topk_ids.view("topk_ids", slots, 4)?,
        real_tokens,
        num_tokens: n,
        num_shared: s,
        routed_scaling_factor: rsf,
    })
}
