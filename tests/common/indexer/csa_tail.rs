//! The fused top-k and CSA tail (`unikv_indexer_topk_fill_csa`): a pool and
//! a CSA stream laid out for a `TopkCase` the way `unikv_build_decode_streams`
//! lays them out, the fused call (or the two calls it replaces) on any
//! context, and the check of the stream it completes.

use rand::seq::SliceRandom;
use unikv::ffi::index::{unikv_csa_tail_args, unikv_fill_csa_tail};
use unikv::ffi::indexer::{
    unikv_csa_stream, unikv_indexer_topk, unikv_indexer_topk_args, unikv_indexer_topk_fill_csa,
};
use unikv::ffi::status::unikv_status;

use super::*;

/// The pool's SWA window.
const CSA_WINDOW: u32 = 8;
/// Entries past the stream's last slice: the fill must leave them alone.
const SLACK: usize = 5;
const POISON_I32: i32 = i32::from_le_bytes([POISON_BYTE; 4]);

/// A pool of one ratio-4 layer for `case`: one request slot per page-table
/// row, CSA rows for `pages` pages of 64 (at least every page id of `case`
/// for a valid call).
pub fn csa_pool(ctx: &Ctx, case: &TopkCase, pages: usize) -> Pool {
    let spec = PoolSpec {
        ratios: vec![4],
        max_requests: case.requests() as u32,
        window: CSA_WINDOW,
        spec_extra: 0,
        // 32 CSA rows a block (plus padding rows).
        c128_blocks: (pages * PAGE).div_ceil(32) as u32,
    };
    Pool::new(ctx, &spec)
}

/// One step's CSA stream before the layer's tail: per real token its
/// `min(pos + 1, window)` window entries (distinct random rows here, which
/// the tail fill must keep), then its top-k entries, poisoned.
#[derive(Debug, Clone)]
pub struct CsaStream {
    pub indptr: Vec<i32>,
    pub indices: Vec<i32>,
    /// (first tail entry, tail length) of each token.
    pub tails: Vec<(usize, usize)>,
}

impl CsaStream {
    /// `build_decode_streams` with `csa_topk = case.topk`: each tail holds the
    /// `min(keys, topk)` keys the token's top-k selects; with `shorten`, some
    /// tails are shorter (a stream sized for a smaller top-k).
    pub fn for_case(rng: &mut StdRng, case: &TopkCase, shorten: bool) -> Self {
        let mut indptr = vec![0i32];
        let mut indices = Vec::new();
        let mut tails = Vec::new();
        for t in 0..case.tokens {
            let Some(keys) = case.keys(t) else {
                tails.push((indices.len(), 0));
                indptr.push(indices.len() as i32);
                continue;
            };
            let swa = (case.positions[t] as usize + 1).min(CSA_WINDOW as usize);
            let mut window: Vec<i32> = (0..1000).collect();
            window.shuffle(rng);
            indices.extend_from_slice(&window[..swa]);
            let mut tail = keys.min(case.topk);
            if shorten && tail > 0 && rng.random_bool(0.5) {
                tail = rng.random_range(0..tail);
            }
            tails.push((indices.len(), tail));
            indices.resize(indices.len() + tail, POISON_I32);
            indptr.push(indices.len() as i32);
        }
        indices.resize(indices.len() + SLACK, POISON_I32);
        CsaStream {
            indptr,
            indices,
            tails,
        }
    }

    /// `got` is this stream with each tail filled from the token's row of
    /// `table` (`width` columns): entry j = `row_base + table[t][j]`, or
    /// where that is -1 (a tail past the selection, which only a GPU backend
    /// outside `validate` accepts) the token's newest window row.
    pub fn check(&self, got: &[i32], table: &[i32], width: usize, row_base: i32, what: &str) {
        let mut want = self.indices.clone();
        for (t, &(at, len)) in self.tails.iter().enumerate() {
            for j in 0..len {
                let page = table[t * width + j];
                want[at + j] = if page >= 0 {
                    row_base + page
                } else {
                    want[at - 1]
                };
            }
        }
        assert_eq!(got, want, "{what}: CSA stream");
    }
}

/// Outputs of one run: the status, the logits, the index table and the CSA
/// stream's indices.
pub type CsaRun = (unikv_status, Vec<f32>, Vec<i32>, Vec<i32>);

/// Runs `case` through `unikv_indexer_topk_fill_csa` (`fused`) or through
/// `unikv_indexer_topk` then `unikv_fill_csa_tail` (i32 positions only) on
/// `ctx`, after `edit` adjusts the arguments.
pub fn run_topk_csa(
    ctx: &Ctx,
    pool: &Pool,
    case: &TopkCase,
    stream: &CsaStream,
    fused: bool,
    edit: impl FnOnce(&mut unikv_indexer_topk_args, &mut unikv_csa_stream),
) -> CsaRun {
    let inputs = [
        Dev::upload(ctx, &case.q),
        Dev::upload(ctx, &case.weights),
        Dev::upload(ctx, &case.cache),
        Dev::upload(ctx, &case.page_table),
        Dev::upload(ctx, &case.batch_id),
        Dev::upload(ctx, &case.positions_bytes()),
    ];
    let (logits, table) = (
        Dev::zeroed(ctx, case.logits.len() * 4),
        Dev::zeroed(ctx, case.tokens * case.width * 4),
    );
    logits.poison();
    table.poison();
    let (indptr, indices) = (
        Dev::upload(ctx, &stream.indptr),
        Dev::upload(ctx, &stream.indices),
    );
    let pointers = TopkPointers {
        q: inputs[0].ptr,
        weights: inputs[1].ptr,
        cache: inputs[2].ptr,
        page_table: inputs[3].ptr,
        batch_id: inputs[4].ptr,
        positions: inputs[5].ptr,
        logits: logits.ptr,
        topk_indices: table.ptr,
    };
    let mut args = case.args(&pointers);
    let mut csa = unikv_csa_stream {
        struct_size: std::mem::size_of::<unikv_csa_stream>(),
        csa_indptr: indptr.t::<i32>(&[case.tokens + 1]),
        csa_indices: indices.t::<i32>(&[stream.indices.len()]),
    };
    edit(&mut args, &mut csa);
    let status = unsafe {
        if fused {
            unikv_indexer_topk_fill_csa(pool.0, &args, &csa, ptr::null_mut())
        } else {
            assert!(
                !case.positions_i64,
                "unikv_fill_csa_tail takes i32 positions"
            );
            let status = unikv_indexer_topk(ctx.0, &args, ptr::null_mut());
            if status != unikv_status::UNIKV_OK {
                status
            } else {
                let tail = unikv_csa_tail_args {
                    struct_size: std::mem::size_of::<unikv_csa_tail_args>(),
                    batch_id: args.batch_id,
                    positions: args.positions,
                    csa_page_indices: args.topk_indices,
                    csa_indptr: csa.csa_indptr,
                    csa_indices: csa.csa_indices,
                    num_tokens: args.num_tokens,
                    reserved: 0,
                };
                unikv_fill_csa_tail(pool.0, &tail, ptr::null_mut())
            }
        }
    };
    (status, logits.read(), table.read(), indices.read())
}
