//! The CSA path of one decode step end to end, through the C ABI, on any
//! context (tests/csa_pipeline.rs runs it on the CPU backend,
//! tests/gpu/indexer.rs on the GPU): compressed indexer keys stored with
//! `unikv_indexer_prepare_k`, the tokens' indexer queries from
//! `unikv_indexer_prepare_q`, their top-k from `unikv_indexer_topk`, the CSA
//! stream from `unikv_build_decode_streams` and `unikv_fill_csa_tail` (or
//! both in `unikv_indexer_topk_fill_csa`), and `unikv_sparse_decode` over it.
//!
//! Checked against float64 computed here: every visible key's score from the
//! stored codes (`k_scale * sum_h w_h * relu(q_h . k)`), the op's set is a
//! top-k of those exact scores (up to keys whose score and the threshold's are
//! within the op's error of each other, which it may order either way: 1e-6
//! relative for f32 sums, plus `dot_eps` of the dot products' terms for a
//! tensor core's narrower sums), and the decode output equals
//! float64 attention over the token's SWA window plus exactly that set (max
//! relative L2 1e-2 per (token, head), the bf16 rounding of P and of the
//! output).

use std::ptr;

use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;
use unikv::ffi::attention::*;
use unikv::ffi::context::unikv_memory_copy;
use unikv::ffi::index::*;
use unikv::ffi::indexer::*;
use unikv::ffi::types::unikv_dtype;
use unikv::fp8::Fp8Format;

use super::indexer::{random_table, score_of, RefScore, ScoreTol, DIM, PAGE, PAGE_BYTES};
use super::*;

const WINDOW: u32 = 8;
const HEADS: usize = 16; // attention heads
const D: usize = 512;
const INDEXER_HEADS: usize = 8;
const TOPK: usize = 32;

/// (request, position) of each token: request 0's token sees 100 keys;
/// request 1 has two tokens, seeing 128 keys and 20 (fewer than topk: all).
const TOKENS: [(i32, i32); 3] = [(0, 4 * 100 + 1), (1, 4 * 128 - 1), (1, 4 * 20 + 2)];
/// Page ids (64 compressed keys each) of the two requests.
const PAGE_TABLE: [[i32; 2]; 2] = [[2, 0], [3, 1]];

/// A buffer of `bytes` in `ctx`'s memory, poisoned.
fn poisoned_buf(ctx: &Ctx, bytes: usize) -> Dev<'_> {
    let d = Dev::zeroed(ctx, bytes);
    d.poison();
    d
}

/// Runs the pipeline on `ctx` with fresh random inputs and checks it;
/// `dot_eps`: the score kernel's error per dot product relative to its terms
/// (0 for exact products summed in f32 or wider); `fused`: the top-k and the
/// CSA tail in one call (`unikv_indexer_topk_fill_csa`, after the streams).
pub fn run(ctx: &Ctx, rng: &mut StdRng, dot_eps: f64, fused: bool) {
    let spec = PoolSpec {
        ratios: vec![4],
        max_requests: 2,
        window: WINDOW,
        spec_extra: 0,
        c128_blocks: 8, // 256 compressed rows: pages 0..3 of 64
    };
    let pool = Pool::new(ctx, &spec);
    let layer = pool.layer(0);
    let rows: Vec<bf16> = (0..layer.rows as usize * D)
        .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
        .collect();
    ok(unsafe {
        unikv_memory_copy(
            ctx.0,
            layer.data,
            rows.as_ptr().cast(),
            std::mem::size_of_val(rows.as_slice()),
            0,
            ptr::null_mut(),
        )
    });
    let fmt = Fp8Format::E4m3Fn;
    let fp8 = unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN as u32;
    let max_pos = 1024usize;
    let table = Dev::upload(ctx, &random_table(rng, max_pos));

    // Every compressed key of both requests into the indexer cache.
    let keys_per_request = 128usize;
    let n_keys = 2 * keys_per_request;
    let cache = poisoned_buf(ctx, 4 * PAGE_BYTES);
    let raw_keys: Vec<bf16> = (0..n_keys * DIM)
        .map(|_| bf16::from_f32(rng.random_range(-3.0f32..3.0)))
        .collect();
    let locations: Vec<i32> = (0..n_keys)
        .map(|k| {
            let (b, i) = (k / keys_per_request, k % keys_per_request);
            PAGE_TABLE[b][i / PAGE] * PAGE as i32 + (i % PAGE) as i32
        })
        .collect();
    let group_positions: Vec<i32> = (0..n_keys)
        .map(|k| 4 * (k % keys_per_request) as i32)
        .collect();
    let norm: Vec<bf16> = (0..DIM)
        .map(|_| bf16::from_f32(rng.random_range(0.5f32..1.5)))
        .collect();
    let (key_buf, norm_buf, loc_buf, gpos_buf) = (
        Dev::upload(ctx, &raw_keys),
        Dev::upload(ctx, &norm),
        Dev::upload(ctx, &locations),
        Dev::upload(ctx, &group_positions),
    );
    let k_args = unikv_indexer_prepare_k_args {
        struct_size: std::mem::size_of::<unikv_indexer_prepare_k_args>(),
        cache: cache.t::<u8>(&[4, PAGE_BYTES]),
        key: key_buf.t::<bf16>(&[n_keys, DIM]),
        norm_weight: norm_buf.t::<bf16>(&[DIM]),
        rope_table: table.t::<f32>(&[max_pos, 64]),
        positions: gpos_buf.t::<i32>(&[n_keys]),
        loc: loc_buf.t::<i32>(&[n_keys]),
        page_size: PAGE as u32,
        cache_dtype: fp8,
        num_tokens: n_keys as u32,
        eps: 1e-6,
        reserved: 0,
    };
    ok(unsafe { unikv_indexer_prepare_k(ctx.0, &k_args, ptr::null_mut()) });

    // The tokens' indexer queries.
    let t = TOKENS.len();
    let batch_id: Vec<i32> = TOKENS.iter().map(|x| x.0).collect();
    let positions: Vec<i32> = TOKENS.iter().map(|x| x.1).collect();
    let q_in: Vec<bf16> = (0..t * INDEXER_HEADS * DIM)
        .map(|_| bf16::from_f32(rng.random_range(-2.0f32..2.0)))
        .collect();
    let w_in: Vec<bf16> = (0..t * INDEXER_HEADS)
        .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
        .collect();
    let (q_buf, w_buf, pos_buf, batch_buf) = (
        Dev::upload(ctx, &q_in),
        Dev::upload(ctx, &w_in),
        Dev::upload(ctx, &positions),
        Dev::upload(ctx, &batch_id),
    );
    let q_fp8 = poisoned_buf(ctx, t * INDEXER_HEADS * DIM);
    let weights = poisoned_buf(ctx, t * INDEXER_HEADS * 4);
    let q_args = unikv_indexer_prepare_q_args {
        struct_size: std::mem::size_of::<unikv_indexer_prepare_q_args>(),
        q: q_buf.t::<bf16>(&[t, INDEXER_HEADS, DIM]),
        weights: w_buf.t::<bf16>(&[t, INDEXER_HEADS]),
        rope_table: table.t::<f32>(&[max_pos, 64]),
        positions: pos_buf.t::<i32>(&[t]),
        q_fp8: q_fp8.t::<u8>(&[t, INDEXER_HEADS, DIM]),
        weights_out: weights.t::<f32>(&[t, INDEXER_HEADS]),
        q_dtype: fp8,
        num_tokens: t as u32,
        num_heads: INDEXER_HEADS as u32,
        weight_scale: 1.0 / (128.0f32 * INDEXER_HEADS as f32).sqrt(),
    };
    ok(unsafe { unikv_indexer_prepare_q(ctx.0, &q_args, ptr::null_mut()) });

    // Scores + top-k into the CSA page-index table.
    let page_table: Vec<i32> = PAGE_TABLE.iter().flatten().copied().collect();
    let pt_buf = Dev::upload(ctx, &page_table);
    let logits = poisoned_buf(ctx, t * keys_per_request * 4);
    let csa_table = poisoned_buf(ctx, t * TOPK * 4);
    let topk_args = unikv_indexer_topk_args {
        struct_size: std::mem::size_of::<unikv_indexer_topk_args>(),
        q_fp8: q_args.q_fp8,
        weights: q_args.weights_out,
        cache: k_args.cache,
        page_table: pt_buf.t::<i32>(&[2, 2]),
        batch_id: batch_buf.t::<i32>(&[t]),
        positions: pos_buf.t::<i32>(&[t]),
        logits: logits.t::<f32>(&[t, keys_per_request]),
        topk_indices: csa_table.t::<i32>(&[t, TOPK]),
        cache_dtype: fp8,
        num_tokens: t as u32,
        num_heads: INDEXER_HEADS as u32,
        topk: TOPK as u32,
    };
    if !fused {
        ok(unsafe { unikv_indexer_topk(ctx.0, &topk_args, ptr::null_mut()) });
    }

    // The CSA stream of the step, with this layer's tail.
    let slots = Dev::upload(ctx, &[1i32, 2]);
    let (csa_indptr, csa) = (
        poisoned_buf(ctx, (t + 1) * 4),
        poisoned_buf(ctx, t * (WINDOW as usize + TOPK) * 4),
    );
    let (swa_indptr, swa) = (
        poisoned_buf(ctx, (t + 1) * 4),
        poisoned_buf(ctx, t * WINDOW as usize * 4),
    );
    let (hca_indptr, hca) = (
        poisoned_buf(ctx, (t + 1) * 4),
        poisoned_buf(ctx, t * WINDOW as usize * 4),
    );
    let streams = unikv_decode_streams_args {
        struct_size: std::mem::size_of::<unikv_decode_streams_args>(),
        batch_id: batch_buf.t::<i32>(&[t]),
        req_slots: slots.t::<i32>(&[2]),
        positions: pos_buf.t::<i32>(&[t]),
        c128_page_indices: absent(),
        swa_indptr: swa_indptr.t::<i32>(&[t + 1]),
        swa_indices: swa.t::<i32>(&[t * WINDOW as usize]),
        hca_indptr: hca_indptr.t::<i32>(&[t + 1]),
        hca_indices: hca.t::<i32>(&[t * WINDOW as usize]),
        csa_indptr: csa_indptr.t::<i32>(&[t + 1]),
        csa_indices: csa.t::<i32>(&[t * (WINDOW as usize + TOPK)]),
        num_tokens: t as u32,
        csa_topk: TOPK as u32,
    };
    ok(unsafe { unikv_build_decode_streams(pool.0, &streams, ptr::null_mut()) });
    if fused {
        let csa_stream = unikv_csa_stream {
            struct_size: std::mem::size_of::<unikv_csa_stream>(),
            csa_indptr: streams.csa_indptr,
            csa_indices: streams.csa_indices,
        };
        ok(unsafe {
            unikv_indexer_topk_fill_csa(pool.0, &topk_args, &csa_stream, ptr::null_mut())
        });
    } else {
        let tail = unikv_csa_tail_args {
            struct_size: std::mem::size_of::<unikv_csa_tail_args>(),
            batch_id: batch_buf.t::<i32>(&[t]),
            positions: pos_buf.t::<i32>(&[t]),
            csa_page_indices: csa_table.t::<i32>(&[t, TOPK]),
            csa_indptr: streams.csa_indptr,
            csa_indices: streams.csa_indices,
            num_tokens: t as u32,
            reserved: 0,
        };
        ok(unsafe { unikv_fill_csa_tail(pool.0, &tail, ptr::null_mut()) });
    }

    // Decode attention over it.
    let q: Vec<bf16> = (0..t * HEADS * D)
        .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
        .collect();
    let q_att = Dev::upload(ctx, &q);
    let out_buf = poisoned_buf(ctx, t * HEADS * D * 2);
    let scale = 1.0 / (D as f32).sqrt();
    let bf = unikv_dtype::UNIKV_DTYPE_BF16 as u32;
    let plan_params = unikv_attention_plan_params {
        struct_size: std::mem::size_of::<unikv_attention_plan_params>(),
        max_tokens: t as u32,
        num_heads: HEADS as u32,
        head_dim: D as u32,
        q_dtype: bf,
        kv_dtype: bf,
        out_dtype: bf,
        kv_layout: 0,
        reserved: 0,
    };
    let mut plan = ptr::null_mut();
    ok(unsafe { unikv_decode_plan_create(ctx.0, &plan_params, &mut plan) });
    let mut ws_bytes = 0;
    ok(unsafe { unikv_decode_plan_workspace_size(plan, &mut ws_bytes) });
    let ws = (ws_bytes > 0).then(|| poisoned_buf(ctx, ws_bytes));
    let d_args = unikv_decode_args {
        struct_size: std::mem::size_of::<unikv_decode_args>(),
        q: q_att.t::<bf16>(&[t, HEADS, D]),
        indices: streams.csa_indices,
        indptr: streams.csa_indptr,
        sink: absent(),
        out: out_buf.t::<bf16>(&[t, HEADS, D]),
        lse: absent(),
        layer: 0,
        num_tokens: t as u32,
        softmax_scale: scale,
        reserved: 0,
        rope_table: absent(),
        positions: absent(),
        kv: Default::default(),
        extra_kv: Default::default(),
        extra_indices: Default::default(),
        extra_indptr: Default::default(),
    };
    let ws_ptr = ws.as_ref().map_or(ptr::null_mut(), |w| w.ptr);
    ok(unsafe { unikv_sparse_decode(plan, pool.0, &d_args, ws_ptr, ws_bytes, ptr::null_mut()) });
    unsafe { unikv_decode_plan_destroy(plan) };

    check(
        &layer,
        &rows,
        (
            &cache.read::<u8>(),
            &q_fp8.read::<u8>(),
            &weights.read::<f32>(),
        ),
        &csa_table.read::<i32>(),
        (&q, &out_buf.read::<bf16>(), scale),
        fmt,
        dot_eps,
    );
}

/// The float64 checks of `run` on host copies of its buffers.
fn check(
    layer: &unikv::ffi::pool::unikv_pool_layer_info,
    rows: &[bf16],
    (cache, q_codes, w_out): (&[u8], &[u8], &[f32]),
    table: &[i32],
    (q, out, scale): (&[bf16], &[bf16], f32),
    fmt: Fp8Format,
    dot_eps: f64,
) {
    let ring = layer.swa_rows as usize / 3; // 2 requests + the reserved slot 0
    for (tok, &(b, pos)) in TOKENS.iter().enumerate() {
        let visible = (pos as usize + 1) / 4;
        let page_index = |i: usize| PAGE_TABLE[b as usize][i / PAGE] as usize * PAGE + i % PAGE;
        let scores: Vec<RefScore> = (0..visible)
            .map(|i| {
                let loc = page_index(i);
                let (page, slot) = (loc / PAGE, loc % PAGE);
                let key = &cache[page * PAGE_BYTES + slot * DIM..][..DIM];
                let at = page * PAGE_BYTES + PAGE * DIM + slot * 4;
                let k_scale = f64::from(f32::from_le_bytes(cache[at..at + 4].try_into().unwrap()));
                let q_tok = &q_codes[tok * INDEXER_HEADS * DIM..][..INDEXER_HEADS * DIM];
                let w_tok = &w_out[tok * INDEXER_HEADS..][..INDEXER_HEADS];
                score_of(q_tok, w_tok, key, k_scale, fmt)
            })
            .collect();
        // The op's set, translated back to key indices.
        let row = &table[tok * TOPK..][..TOPK];
        let count = visible.min(TOPK);
        assert!(
            row[count..].iter().all(|&v| v == -1),
            "token {tok}: tail {row:?}"
        );
        let chosen: Vec<usize> = row[..count]
            .iter()
            .map(|&v| {
                (0..visible)
                    .find(|&i| page_index(i) as i32 == v)
                    .expect("a visible key's page index")
            })
            .collect();
        if visible > TOPK {
            let tol = ScoreTol { rel: 1e-6, dot_eps };
            let mut sorted = scores.clone();
            sorted.sort_by(|a, b| b.value.partial_cmp(&a.value).unwrap());
            let at = sorted[TOPK - 1];
            let (threshold, slack) = (at.value, at.tolerance(tol));
            for (i, score) in scores.iter().enumerate() {
                let kept = chosen.contains(&i);
                let margin = slack + score.tolerance(tol);
                let value = score.value;
                if value > threshold + margin {
                    assert!(kept, "token {tok}: key {i} (score {value}) above the threshold {threshold} was dropped");
                } else if value < threshold - margin {
                    assert!(!kept, "token {tok}: key {i} (score {value}) below the threshold {threshold} was kept");
                }
            }
        }
        // float64 attention over the SWA window plus the chosen compressed rows.
        let slot = b as usize + 1;
        let first = (pos + 1 - WINDOW as i32).max(0);
        let mut keys: Vec<usize> = (first..=pos)
            .map(|p| slot * ring + p as usize % ring)
            .collect();
        keys.extend(
            chosen
                .iter()
                .map(|&i| layer.swa_rows as usize + page_index(i)),
        );
        for h in 0..HEADS {
            let qh = &q[(tok * HEADS + h) * D..][..D];
            let logits: Vec<f64> = keys
                .iter()
                .map(|&r| {
                    let kr = &rows[r * D..][..D];
                    let dot: f64 = qh
                        .iter()
                        .zip(kr)
                        .map(|(a, b)| f64::from(a.to_f32()) * f64::from(b.to_f32()))
                        .sum();
                    f64::from(scale) * dot
                })
                .collect();
            let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
            let z: f64 = e.iter().sum();
            let want: Vec<f64> = (0..D)
                .map(|d| {
                    keys.iter()
                        .zip(&e)
                        .map(|(&r, p)| p * f64::from(rows[r * D + d].to_f32()))
                        .sum::<f64>()
                        / z
                })
                .collect();
            let got = &out[(tok * HEADS + h) * D..][..D];
            let err: f64 = got
                .iter()
                .zip(&want)
                .map(|(g, w)| (f64::from(g.to_f32()) - w).powi(2))
                .sum::<f64>()
                .sqrt();
            let norm: f64 = want.iter().map(|w| w * w).sum::<f64>().sqrt();
            assert!(
                err <= 1e-2 * norm,
                "token {tok} head {h}: relative L2 {}",
                err / norm
            );
        }
    }
}
