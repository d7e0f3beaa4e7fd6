//! The CSA path of one decode step end to end on the CPU backend, through the
//! C ABI: compressed indexer keys stored with `unikv_indexer_prepare_k`, the
//! tokens' indexer queries from `unikv_indexer_prepare_q`, their top-k from
//! `unikv_indexer_topk`, the CSA stream from `unikv_build_decode_streams` and
//! `unikv_fill_csa_tail`, and `unikv_sparse_decode` over it.
//!
//! Checked against float64 computed here: every visible key's score from the
//! stored codes (`k_scale * sum_h w_h * relu(q_h . k)`), the op's set is a
//! top-k of those exact scores (up to keys within 1e-6 of the threshold, which
//! the op's f32 scores may order either way), and the decode output equals
//! float64 attention over the token's SWA window plus exactly that set (max
//! relative L2 1e-2 per (token, head), the bf16 rounding of P and of the
//! output). Inputs are fresh and random each run; the seed is printed, rerun a
//! failure with `UNIKV_TEST_SEED=<seed>`.

mod common;

use std::ptr;

use common::indexer::{aligned, random_table, DIM, PAGE, PAGE_BYTES};
use common::*;
use half::bf16;
use rand::Rng;
use unikv::ffi::attention::*;
use unikv::ffi::index::*;
use unikv::ffi::indexer::*;
use unikv::ffi::types::unikv_dtype;
use unikv::fp8::{decode, Fp8Format};

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

fn host_desc<T: Dt>(data: *const T, shape: &[usize]) -> unikv::ffi::types::unikv_tensor {
    let mut t = absent();
    t.data = data as *mut _;
    t.dtype = T::DTYPE as u32;
    t.ndim = shape.len() as u32;
    let mut stride = 1i64;
    for axis in (0..shape.len()).rev() {
        t.shape[axis] = shape[axis] as i64;
        t.strides[axis] = stride;
        stride *= shape[axis] as i64;
    }
    t
}

#[test]
fn indexer_topk_feeds_csa_decode() {
    let (mut rng, _) = seeded("indexer_topk_feeds_csa_decode");
    let ctx = Ctx::cpu(2);
    let spec = PoolSpec {
        ratios: vec![4],
        max_requests: 2,
        window: WINDOW,
        spec_extra: 0,
        c128_blocks: 8, // 256 compressed rows: pages 0..3 of 64
    };
    let pool = Pool::new(&ctx, &spec);
    for v in pool.rows_mut(0).iter_mut() {
        *v = bf16::from_f32(rng.random_range(-1.0f32..1.0));
    }
    let layer = pool.layer(0);
    let fmt = Fp8Format::E4m3Fn;
    let max_pos = 1024usize;
    let table = aligned(&random_table(&mut rng, max_pos));

    // Every compressed key of both requests into the indexer cache.
    let cache = cache_store::HostBytes::poisoned(4 * PAGE_BYTES);
    let keys_per_request = 128usize;
    let raw_keys: Vec<bf16> = (0..2 * keys_per_request * DIM)
        .map(|_| bf16::from_f32(rng.random_range(-3.0f32..3.0)))
        .collect();
    let locations: Vec<i32> = (0..2 * keys_per_request)
        .map(|k| {
            let (b, i) = (k / keys_per_request, k % keys_per_request);
            PAGE_TABLE[b][i / PAGE] * PAGE as i32 + (i % PAGE) as i32
        })
        .collect();
    let group_positions: Vec<i32> = (0..2 * keys_per_request)
        .map(|k| 4 * (k % keys_per_request) as i32)
        .collect();
    let norm: Vec<bf16> = (0..DIM)
        .map(|_| bf16::from_f32(rng.random_range(0.5f32..1.5)))
        .collect();
    let (key_buf, norm_buf, loc_buf, gpos_buf) = (
        aligned(&raw_keys),
        aligned(&norm),
        aligned(&locations),
        aligned(&group_positions),
    );
    let n_keys = 2 * keys_per_request;
    let k_args = unikv_indexer_prepare_k_args {
        struct_size: std::mem::size_of::<unikv_indexer_prepare_k_args>(),
        cache: host_desc(cache.ptr() as *const u8, &[4, PAGE_BYTES]),
        key: host_desc(key_buf.ptr() as *const bf16, &[n_keys, DIM]),
        norm_weight: host_desc(norm_buf.ptr() as *const bf16, &[DIM]),
        rope_table: host_desc(table.ptr() as *const f32, &[max_pos, 64]),
        positions: host_desc(gpos_buf.ptr() as *const i32, &[n_keys]),
        loc: host_desc(loc_buf.ptr() as *const i32, &[n_keys]),
        page_size: PAGE as u32,
        cache_dtype: unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN as u32,
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
        aligned(&q_in),
        aligned(&w_in),
        aligned(&positions),
        aligned(&batch_id),
    );
    let q_fp8 = cache_store::HostBytes::poisoned(t * INDEXER_HEADS * DIM);
    let weights = cache_store::HostBytes::poisoned(t * INDEXER_HEADS * 4);
    let q_args = unikv_indexer_prepare_q_args {
        struct_size: std::mem::size_of::<unikv_indexer_prepare_q_args>(),
        q: host_desc(q_buf.ptr() as *const bf16, &[t, INDEXER_HEADS, DIM]),
        weights: host_desc(w_buf.ptr() as *const bf16, &[t, INDEXER_HEADS]),
        rope_table: host_desc(table.ptr() as *const f32, &[max_pos, 64]),
        positions: host_desc(pos_buf.ptr() as *const i32, &[t]),
        q_fp8: host_desc(q_fp8.ptr() as *const u8, &[t, INDEXER_HEADS, DIM]),
        weights_out: host_desc(weights.ptr() as *const f32, &[t, INDEXER_HEADS]),
        q_dtype: unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN as u32,
        num_tokens: t as u32,
        num_heads: INDEXER_HEADS as u32,
        weight_scale: 1.0 / (128.0f32 * INDEXER_HEADS as f32).sqrt(),
    };
    ok(unsafe { unikv_indexer_prepare_q(ctx.0, &q_args, ptr::null_mut()) });

    // Scores + top-k into the CSA page-index table.
    let page_table: Vec<i32> = PAGE_TABLE.iter().flatten().copied().collect();
    let pt_buf = aligned(&page_table);
    let logits = cache_store::HostBytes::poisoned(t * keys_per_request * 4);
    let csa_table = cache_store::HostBytes::poisoned(t * TOPK * 4);
    let topk_args = unikv_indexer_topk_args {
        struct_size: std::mem::size_of::<unikv_indexer_topk_args>(),
        q_fp8: q_args.q_fp8,
        weights: q_args.weights_out,
        cache: k_args.cache,
        page_table: host_desc(pt_buf.ptr() as *const i32, &[2, 2]),
        batch_id: host_desc(batch_buf.ptr() as *const i32, &[t]),
        positions: host_desc(pos_buf.ptr() as *const i32, &[t]),
        logits: host_desc(logits.ptr() as *const f32, &[t, keys_per_request]),
        topk_indices: host_desc(csa_table.ptr() as *const i32, &[t, TOPK]),
        cache_dtype: unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN as u32,
        num_tokens: t as u32,
        num_heads: INDEXER_HEADS as u32,
        topk: TOPK as u32,
    };
    ok(unsafe { unikv_indexer_topk(ctx.0, &topk_args, ptr::null_mut()) });
    let table_out: Vec<i32> = csa_table
        .bytes()
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
        .collect();

    // The CSA stream of the step, with this layer's tail.
    let req_slots = [1i32, 2];
    let csa_indptr: Vec<i32> = poisoned(t + 1);
    let csa: Vec<i32> = poisoned(t * (WINDOW as usize + TOPK));
    let (swa_indptr, swa, hca_indptr, hca): (Vec<i32>, Vec<i32>, Vec<i32>, Vec<i32>) = (
        poisoned(t + 1),
        poisoned(t * WINDOW as usize),
        poisoned(t + 1),
        poisoned(t * WINDOW as usize),
    );
    let streams = unikv_decode_streams_args {
        struct_size: std::mem::size_of::<unikv_decode_streams_args>(),
        batch_id: vec1(&batch_id),
        req_slots: vec1(&req_slots),
        positions: vec1(&positions),
        c128_page_indices: absent(),
        swa_indptr: vec1(&swa_indptr),
        swa_indices: vec1(&swa),
        hca_indptr: vec1(&hca_indptr),
        hca_indices: vec1(&hca),
        csa_indptr: vec1(&csa_indptr),
        csa_indices: vec1(&csa),
        num_tokens: t as u32,
        csa_topk: TOPK as u32,
    };
    ok(unsafe { unikv_build_decode_streams(pool.0, &streams, ptr::null_mut()) });
    let tail = unikv_csa_tail_args {
        struct_size: std::mem::size_of::<unikv_csa_tail_args>(),
        batch_id: vec1(&batch_id),
        positions: vec1(&positions),
        csa_page_indices: tensor(&table_out, &[t, TOPK]),
        csa_indptr: vec1(&csa_indptr),
        csa_indices: vec1(&csa),
        num_tokens: t as u32,
        reserved: 0,
    };
    ok(unsafe { unikv_fill_csa_tail(pool.0, &tail, ptr::null_mut()) });

    // Decode attention over it.
    let q: Vec<bf16> = (0..t * HEADS * D)
        .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
        .collect();
    let out: Vec<bf16> = poisoned(t * HEADS * D);
    let scale = 1.0 / (D as f32).sqrt();
    let plan_params = unikv_attention_plan_params {
        struct_size: std::mem::size_of::<unikv_attention_plan_params>(),
        max_tokens: t as u32,
        num_heads: HEADS as u32,
        head_dim: D as u32,
        q_dtype: unikv_dtype::UNIKV_DTYPE_BF16 as u32,
        kv_dtype: unikv_dtype::UNIKV_DTYPE_BF16 as u32,
        out_dtype: unikv_dtype::UNIKV_DTYPE_BF16 as u32,
    };
    let mut plan = ptr::null_mut();
    ok(unsafe { unikv_decode_plan_create(ctx.0, &plan_params, &mut plan) });
    let d_args = unikv_decode_args {
        struct_size: std::mem::size_of::<unikv_decode_args>(),
        q: tensor(&q, &[t, HEADS, D]),
        indices: vec1(&csa),
        indptr: vec1(&csa_indptr),
        sink: absent(),
        out: tensor(&out, &[t, HEADS, D]),
        lse: absent(),
        layer: 0,
        num_tokens: t as u32,
        softmax_scale: scale,
        reserved: 0,
        rope_table: absent(),
        positions: absent(),
    };
    ok(unsafe { unikv_sparse_decode(plan, pool.0, &d_args, ptr::null_mut(), 0, ptr::null_mut()) });
    unsafe { unikv_decode_plan_destroy(plan) };

    // float64 scores of every visible key from the stored codes.
    let cache_bytes = cache.bytes();
    let q_codes = q_fp8.bytes();
    let w_out: Vec<f64> = weights
        .bytes()
        .chunks_exact(4)
        .map(|c| f64::from(f32::from_ne_bytes(c.try_into().unwrap())))
        .collect();
    let rows = pool.rows_mut(0);
    let ring = layer.swa_rows as usize / (spec.max_requests as usize + 1);
    for (tok, &(b, pos)) in TOKENS.iter().enumerate() {
        let visible = (pos as usize + 1) / 4;
        let page_index = |i: usize| PAGE_TABLE[b as usize][i / PAGE] as usize * PAGE + i % PAGE;
        let scores: Vec<f64> = (0..visible)
            .map(|i| {
                let loc = page_index(i);
                let (page, slot) = (loc / PAGE, loc % PAGE);
                let key = &cache_bytes[page * PAGE_BYTES + slot * DIM..][..DIM];
                let at = page * PAGE_BYTES + PAGE * DIM + slot * 4;
                let k_scale = f64::from(f32::from_le_bytes(
                    cache_bytes[at..at + 4].try_into().unwrap(),
                ));
                let sum: f64 = (0..INDEXER_HEADS)
                    .map(|h| {
                        let qh = &q_codes[(tok * INDEXER_HEADS + h) * DIM..][..DIM];
                        let dot: f64 = qh
                            .iter()
                            .zip(key)
                            .map(|(&a, &c)| f64::from(decode(a, fmt)) * f64::from(decode(c, fmt)))
                            .sum();
                        w_out[tok * INDEXER_HEADS + h] * dot.max(0.0)
                    })
                    .sum();
                k_scale * sum
            })
            .collect();
        // The op's set: translated back to key indices.
        let row = &table_out[tok * TOPK..][..TOPK];
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
            let mut sorted = scores.clone();
            sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
            let threshold = sorted[TOPK - 1];
            let tol = 1e-6 * threshold.abs().max(1e-30);
            for (i, &score) in scores.iter().enumerate() {
                let kept = chosen.contains(&i);
                if score > threshold + tol {
                    assert!(kept, "token {tok}: key {i} (score {score}) above the threshold {threshold} was dropped");
                } else if score < threshold - tol {
                    assert!(!kept, "token {tok}: key {i} (score {score}) below the threshold {threshold} was kept");
                }
            }
        }
        // float64 attention over the SWA window plus the chosen compressed rows.
        let slot = req_slots[b as usize] as usize;
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
                    f64::from(scale)
                        * qh.iter()
                            .zip(kr)
                            .map(|(a, b)| f64::from(a.to_f32()) * f64::from(b.to_f32()))
                            .sum::<f64>()
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
