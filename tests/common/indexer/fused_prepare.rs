//! The Q/KV preparation and the indexer's query preparation in one call
//! (`unikv_prepare_qkv_indexer_q`) against the two calls it replaces, on any
//! context: random inputs of both, each call's outputs (Q, KV rows, the pool
//! layer's bytes, query codes, folded weights) poisoned before and read back
//! after.

use unikv::ffi::indexer::{unikv_indexer_prepare_q, unikv_indexer_prepare_q_args};
use unikv::ffi::prepare::{unikv_prepare_qkv, unikv_prepare_qkv_args, unikv_prepare_qkv_indexer_q};
use unikv::ffi::status::unikv_status;

use super::*;

const D: usize = 512;

/// One call's inputs: the indexer query case (its table also serves the
/// Q/KV preparation), Q heads and KV rows, their positions (a buffer of their
/// own) and distinct pool rows.
#[derive(Clone)]
pub struct FusedPrepare {
    pub query: QueryCase,
    pub heads: usize,
    pub q_in: Vec<bf16>,
    pub kv_in: Vec<bf16>,
    pub kv_weight: Vec<bf16>,
    pub positions: Vec<i32>,
    pub rows: Vec<i32>,
}

/// Everything a run may write, as bytes: q_out, kv_out, the pool layer,
/// q_fp8, weights_out.
pub type FusedOutputs = [Vec<u8>; 5];

impl FusedPrepare {
    pub fn random(
        rng: &mut StdRng,
        tokens: usize,
        heads: usize,
        indexer_heads: usize,
        pool_rows: usize,
    ) -> Self {
        use rand::seq::SliceRandom;
        let query = QueryCase::random(rng, tokens, indexer_heads, Fp8Format::E4m3Fn);
        let mut rows: Vec<i32> = (0..pool_rows as i32).collect();
        rows.shuffle(rng);
        rows.truncate(tokens);
        FusedPrepare {
            positions: (0..tokens)
                .map(|_| rng.random_range(0..query.max_pos as i32))
                .collect(),
            query,
            heads,
            q_in: random_bf16(rng, tokens * heads * D),
            kv_in: random_bf16(rng, tokens * D),
            kv_weight: random_bf16(rng, D),
            rows,
        }
    }

    /// Runs `unikv_prepare_qkv_indexer_q` (`fused`) or the two calls on
    /// `ctx` into layer 0 of `pool` after `edit`; returns the status and the
    /// outputs.
    pub fn run(
        &self,
        ctx: &Ctx,
        pool: &Pool,
        fused: bool,
        edit: impl FnOnce(&mut unikv_prepare_qkv_args, &mut unikv_indexer_prepare_q_args),
    ) -> (unikv_status, FusedOutputs) {
        let (t, h, q) = (self.query.tokens, self.heads, &self.query);
        let inputs = [
            Dev::upload(ctx, &self.q_in),
            Dev::upload(ctx, &self.kv_in),
            Dev::upload(ctx, &self.kv_weight),
            Dev::upload(ctx, &q.table),
            Dev::upload(ctx, &self.positions),
            Dev::upload(ctx, &self.rows),
            Dev::upload(ctx, &q.q),
            Dev::upload(ctx, &q.weights),
            Dev::upload(ctx, &q.positions_bytes()),
        ];
        let outputs = [
            Dev::zeroed(ctx, t * h * D * 2),
            Dev::zeroed(ctx, t * D * 2),
            Dev::zeroed(ctx, q.q_fp8_len()),
            Dev::zeroed(ctx, q.weights_out_len() * 4),
        ];
        outputs.iter().for_each(Dev::poison);
        poison_layer(ctx, pool, 0, POISON_BYTE);
        let mut args = unikv_prepare_qkv_args {
            struct_size: std::mem::size_of::<unikv_prepare_qkv_args>(),
            q_in: inputs[0].t::<bf16>(&[t, h, D]),
            q_out: outputs[0].t::<bf16>(&[t, h, D]),
            kv_in: inputs[1].t::<bf16>(&[t, D]),
            kv_weight: inputs[2].t::<bf16>(&[D]),
            kv_out: outputs[1].t::<bf16>(&[t, D]),
            rope_table: inputs[3].t::<f32>(&[q.max_pos, 64]),
            positions: inputs[4].t::<i32>(&[t]),
            rows: inputs[5].t::<i32>(&[t]),
            layer: 0,
            num_tokens: t as u32,
            num_heads: h as u32,
            q_eps: 1e-6,
            kv_eps: 1e-6,
            reserved: 0,
        };
        let mut query = q.args(&QueryPointers {
            q: inputs[6].ptr,
            weights: inputs[7].ptr,
            table: inputs[3].ptr,
            positions: inputs[8].ptr,
            q_fp8: outputs[2].ptr,
            weights_out: outputs[3].ptr,
        });
        edit(&mut args, &mut query);
        let status = unsafe {
            if fused {
                unikv_prepare_qkv_indexer_q(pool.0, &args, &query, std::ptr::null_mut())
            } else {
                match unikv_prepare_qkv(pool.0, &args, std::ptr::null_mut()) {
                    unikv_status::UNIKV_OK => {
                        unikv_indexer_prepare_q(ctx.0, &query, std::ptr::null_mut())
                    }
                    failed => failed,
                }
            }
        };
        let pool_out = read_layer(ctx, pool, 0);
        let [q_out, kv_out, q_fp8, weights_out] = outputs.map(|d| d.read::<u8>());
        (status, [q_out, kv_out, pool_out, q_fp8, weights_out])
    }
}

/// Every output still poisoned (a refused call wrote nothing).
pub fn untouched(out: &FusedOutputs) -> bool {
    out.iter().flatten().all(|&b| b == POISON_BYTE)
}
