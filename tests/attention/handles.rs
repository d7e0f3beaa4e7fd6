//! The handles the tests run on: decode and prefill plans, and the KV pool.

use super::*;

pub(crate) fn plan_params(max_tokens: usize, heads: usize) -> unikv_attention_plan_params {
    let bf = unikv_dtype::UNIKV_DTYPE_BF16 as u32;
    unikv_attention_plan_params {
        struct_size: std::mem::size_of::<unikv_attention_plan_params>(),
        max_tokens: max_tokens as u32,
        num_heads: heads as u32,
        head_dim: D as u32,
        q_dtype: bf,
        kv_dtype: bf,
        out_dtype: bf,
        kv_layout: 0,
        reserved: 0,
    }
}

pub(crate) struct DecodePlan(pub(crate) *mut unikv_decode_plan);

impl DecodePlan {
    pub(crate) fn new(ctx: &Ctx, max_tokens: usize, heads: usize) -> Self {
        let mut plan = ptr::null_mut();
        ok(unsafe { unikv_decode_plan_create(ctx.0, &plan_params(max_tokens, heads), &mut plan) });
        DecodePlan(plan)
    }
}

impl Drop for DecodePlan {
    fn drop(&mut self) {
        unsafe { unikv_decode_plan_destroy(self.0) };
    }
}

pub(crate) struct PrefillPlan(pub(crate) *mut unikv_prefill_plan);

impl PrefillPlan {
    pub(crate) fn new(ctx: &Ctx, max_tokens: usize, heads: usize) -> Self {
        let mut plan = ptr::null_mut();
        ok(unsafe { unikv_prefill_plan_create(ctx.0, &plan_params(max_tokens, heads), &mut plan) });
        PrefillPlan(plan)
    }
}

impl Drop for PrefillPlan {
    fn drop(&mut self) {
        unsafe { unikv_prefill_plan_destroy(self.0) };
    }
}

/// Two layers (ratios 0 and 4); the attended layer 1 has 3392 rows.
pub(crate) fn pool_spec() -> PoolSpec {
    PoolSpec {
        ratios: vec![0, 4],
        max_requests: 1,
        window: 128,
        spec_extra: 0,
        c128_blocks: 96,
    }
}

/// A pool whose every row holds random bf16 (written through `rows_mut`), and
/// a host snapshot of the attended layer for the reference.
pub(crate) struct KvPool {
    pub(crate) pool: Pool,
    /// Copy of layer `LAYER`, `[rows, 512]`.
    pub(crate) rows: Vec<bf16>,
}

impl KvPool {
    pub(crate) fn new(ctx: &Ctx, rng: &mut StdRng) -> Self {
        let pool = Pool::new(ctx, &pool_spec());
        for layer in 0..pool.info().num_layers {
            let dst = pool.rows_mut(layer);
            let src = random_bf16(rng, dst.len());
            dst.copy_from_slice(&src);
        }
        let rows = pool.rows_mut(LAYER).to_vec();
        KvPool { pool, rows }
    }

    /// Another pool (maybe on another context) with the same layer contents.
    pub(crate) fn clone_on(&self, ctx: &Ctx) -> Self {
        let pool = Pool::new(ctx, &pool_spec());
        for layer in 0..pool.info().num_layers {
            pool.rows_mut(layer)
                .copy_from_slice(self.pool.rows_mut(layer));
        }
        KvPool {
            pool,
            rows: self.rows.clone(),
        }
    }

    pub(crate) fn num_rows(&self) -> usize {
        self.rows.len() / D
    }

    pub(crate) fn row(&self, r: i32) -> &[bf16] {
        let r = r as usize;
        &self.rows[r * D..(r + 1) * D]
    }
}
