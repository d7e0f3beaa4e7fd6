//! `unikv_indexer_prepare_q` and `unikv_indexer_prepare_k` on the CPU backend,
//! through the C ABI, against float64 references written in
//! tests/common/indexer/ from docs/indexer.md §1, §2: RoPE of dims
//! 64..127, the Hadamard transform as the explicit Sylvester matrix, FP8 with
//! an fp32 scale `max(amax, 1e-4) / fp8_max`; keys first get RMSNorm with the
//! weight. Queries: codes within half an FP8 step of the exact values, the
//! folded weights within 1e-5. Keys: the stored scale within 1e-5 of the
//! exact one and every byte the op must not write still poisoned.
//!
//! Inputs are fresh and random each run (magnitudes from below the 1e-4 amax
//! floor to thousands, strided heads and weights, int32 and int64 indices);
//! the seed is printed, rerun a failure with `UNIKV_TEST_SEED=<seed>`.

mod common;

use common::indexer::{
    csa_pool, hadamard_ref, run_topk_csa, CsaStream, KeyCase, QueryCase, ScoreTol, TopkCase, DIM,
};
use common::*;
use unikv::ffi::types::unikv_dtype;
use unikv::fp8::Fp8Format;

const FORMATS: [Fp8Format; 2] = [Fp8Format::E4m3Fn, Fp8Format::E4m3Fnuz];

#[test]
fn hadamard_is_the_normalized_sylvester_matrix() {
    let (mut rng, _) = seeded("hadamard_is_the_normalized_sylvester_matrix");
    assert_eq!(
        unikv::indexer::HADAMARD_SCALE.to_bits(),
        ((1.0 / 128f64.sqrt()) as f32).to_bits()
    );
    for _ in 0..20 {
        use rand::Rng;
        let x: Vec<f32> = (0..DIM).map(|_| rng.random_range(-10.0f32..10.0)).collect();
        let want = hadamard_ref(&x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
        let mut got = x.clone();
        unikv::indexer::hadamard(&mut got);
        let norm = want.iter().map(|v| v * v).sum::<f64>().sqrt();
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            // Seven fp32 butterfly stages: each adds at most one rounding of
            // a partial sum bounded by the vector's norm.
            assert!(
                (f64::from(g) - w).abs() <= 8.0 * norm * f64::from(f32::EPSILON),
                "dim {i}: {g} vs {w}"
            );
        }
    }
}

#[test]
fn indexer_queries_match_reference() {
    let (mut rng, _) = seeded("indexer_queries_match_reference");
    let ctx = Ctx::cpu(2);
    for fmt in FORMATS {
        for &(t, h) in &[(1, 64), (5, 3), (33, 64), (2, 1)] {
            let case = QueryCase::random(&mut rng, t, h, fmt);
            let (status, q_fp8, weights_out) = case.run_host(&ctx, |_| {});
            ok(status);
            case.check(&q_fp8, &weights_out);
        }
    }
}

#[test]
fn indexer_keys_match_reference() {
    let (mut rng, _) = seeded("indexer_keys_match_reference");
    let ctx = Ctx::cpu(1);
    for fmt in FORMATS {
        for &n in &[1, 7, 64, 150] {
            let case = KeyCase::random(&mut rng, n, fmt);
            let (status, cache) = case.run_host(&ctx, |_| {});
            ok(status);
            case.check(&cache);
        }
    }
}

/// Every argument error: its status, a message naming the argument, and
/// untouched (still poisoned) outputs.
#[test]
fn indexer_prep_rejects_bad_input() {
    let (mut rng, _) = seeded("indexer_prep_rejects_bad_input");
    let ctx = Ctx::cpu(1);
    let case = QueryCase::random(&mut rng, 4, 8, Fp8Format::E4m3Fn);
    let query = |edit: &dyn Fn(&mut unikv::ffi::indexer::unikv_indexer_prepare_q_args),
                 c: &QueryCase,
                 want,
                 arg: &str| {
        let (status, q_fp8, w) = c.run_host(&ctx, |a| edit(a));
        fails(status, want, arg);
        assert!(
            q_fp8.iter().all(|&b| b == POISON_BYTE),
            "{arg}: q_fp8 written"
        );
        assert!(
            bytes_of(&w).iter().all(|&b| b == POISON_BYTE),
            "{arg}: weights_out written"
        );
    };
    query(
        &|a| a.q_dtype = unikv_dtype::UNIKV_DTYPE_BF16 as u32,
        &case,
        UNIKV_BAD_DTYPE,
        "q_dtype",
    );
    query(&|a| a.q_dtype = 999, &case, UNIKV_BAD_ENUM, "q_dtype");
    query(
        &|a| a.num_heads = 0,
        &case,
        UNIKV_INVALID_ARGUMENT,
        "num_heads",
    );
    query(&|a| a.num_heads = 9, &case, UNIKV_BAD_SHAPE, "q");
    query(&|a| a.q.shape[2] = 64, &case, UNIKV_BAD_SHAPE, "q");
    query(
        &|a| a.weight_scale = f32::INFINITY,
        &case,
        UNIKV_INVALID_ARGUMENT,
        "weight_scale",
    );
    query(
        &|a| a.weights_out.dtype = unikv_dtype::UNIKV_DTYPE_BF16 as u32,
        &case,
        UNIKV_BAD_DTYPE,
        "weights_out",
    );
    query(
        &|a| a.q_fp8.strides[1] = 136,
        &case,
        UNIKV_BAD_ALIGNMENT,
        "q_fp8",
    );
    query(
        &|a| a.q_fp8.strides[1] = 112,
        &case,
        UNIKV_BAD_STRIDE,
        "q_fp8",
    );
    query(
        &|a| a.rope_table.shape[1] = 32,
        &case,
        UNIKV_BAD_SHAPE,
        "rope_table",
    );
    query(&|a| a.struct_size = 4, &case, UNIKV_BAD_STRUCT_SIZE, "args");
    let mut bad = case.clone();
    bad.positions[2] = bad.max_pos as i64;
    query(&|_| {}, &bad, UNIKV_OUT_OF_RANGE, "positions[2]");
    bad.positions[2] = -1;
    query(&|_| {}, &bad, UNIKV_OUT_OF_RANGE, "positions[2]");

    let keys = KeyCase::random(&mut rng, 20, Fp8Format::E4m3Fnuz);
    let key = |edit: &dyn Fn(&mut unikv::ffi::indexer::unikv_indexer_prepare_k_args),
               c: &KeyCase,
               want,
               arg: &str| {
        let (status, cache) = c.run_host(&ctx, |a| edit(a));
        fails(status, want, arg);
        assert!(
            cache.iter().all(|&b| b == POISON_BYTE),
            "{arg}: cache written"
        );
    };
    key(
        &|a| a.page_size = 32,
        &keys,
        UNIKV_INVALID_ARGUMENT,
        "page_size",
    );
    key(
        &|a| a.cache_dtype = unikv_dtype::UNIKV_DTYPE_U8 as u32,
        &keys,
        UNIKV_BAD_DTYPE,
        "cache_dtype",
    );
    key(&|a| a.eps = 0.0, &keys, UNIKV_INVALID_ARGUMENT, "eps");
    key(
        &|a| a.reserved = 1,
        &keys,
        UNIKV_INVALID_ARGUMENT,
        "reserved",
    );
    key(
        &|a| a.norm_weight.shape[0] = 64,
        &keys,
        UNIKV_BAD_SHAPE,
        "norm_weight",
    );
    key(
        &|a| a.key.dtype = unikv_dtype::UNIKV_DTYPE_I32 as u32,
        &keys,
        UNIKV_BAD_DTYPE,
        "key",
    );
    key(
        &|a| a.cache.strides[0] += 16,
        &keys,
        UNIKV_BAD_STRIDE,
        "cache",
    );
    let mut bad = keys.clone();
    bad.positions[3] = bad.max_pos as i64;
    key(&|_| {}, &bad, UNIKV_OUT_OF_RANGE, "positions[3]");
    let mut bad = keys.clone();
    bad.locations[0] = (bad.pages * 64) as i64;
    key(&|_| {}, &bad, UNIKV_OUT_OF_RANGE, "loc[0]");
    let mut bad = keys.clone();
    let first = bad.locations[0];
    bad.locations[5] = first;
    key(&|_| {}, &bad, UNIKV_INVALID_ARGUMENT, "loc[5]");
}

#[test]
fn indexer_topk_selects_from_logits() {
    let (mut rng, _) = seeded("indexer_topk_selects_from_logits");
    let ctx = Ctx::cpu(2);
    for &(t, requests, max_keys, topk) in &[
        (5, 2, 300, 64),
        (9, 3, 2100, 512),
        (1, 1, 40, 64),
        (4, 2, 130, 1),
    ] {
        let mut case =
            TopkCase::random(&mut rng, t, requests, max_keys, topk, 1, Fp8Format::E4m3Fn);
        for zeros in [false, true] {
            if zeros {
                // The threshold among signed zeros: -0 and +0 tie.
                use rand::Rng;
                for x in case.logits.iter_mut() {
                    *x = [0.0, -0.0, 0.0, -0.0, 1.0][rng.random_range(0..5)];
                }
            }
            let (status, logits, table) = case.run_host(&ctx, false, |_| {});
            ok(status);
            assert_eq!(bytes_of(&logits), bytes_of(&case.logits), "logits changed");
            case.check_selection(&case.logits, &table);
        }
    }
}

#[test]
fn indexer_topk_scores_match_reference() {
    let (mut rng, _) = seeded("indexer_topk_scores_match_reference");
    let ctx = Ctx::cpu(2);
    for fmt in FORMATS {
        for &(t, requests, max_keys, topk, heads) in
            &[(3, 2, 200, 64, 64), (6, 3, 700, 512, 8), (2, 1, 64, 16, 1)]
        {
            let case = TopkCase::random(&mut rng, t, requests, max_keys, topk, heads, fmt);
            let (status, logits, table) = case.run_host(&ctx, true, |_| {});
            ok(status);
            case.check_logits(&logits, ScoreTol::EXACT);
            case.check_selection(&logits, &table);
        }
    }
}

#[test]
fn indexer_topk_rejects_bad_input() {
    let (mut rng, _) = seeded("indexer_topk_rejects_bad_input");
    let ctx = Ctx::cpu(1);
    let case = TopkCase::random(&mut rng, 4, 2, 200, 64, 4, Fp8Format::E4m3Fn);
    let run = |c: &TopkCase,
               score: bool,
               edit: &dyn Fn(&mut unikv::ffi::indexer::unikv_indexer_topk_args),
               want,
               arg: &str| {
        let (status, logits, table) = c.run_host(&ctx, score, |a| edit(a));
        fails(status, want, arg);
        assert!(
            bytes_of(&table).iter().all(|&b| b == POISON_BYTE),
            "{arg}: table written"
        );
        if score {
            assert!(
                bytes_of(&logits).iter().all(|&b| b == POISON_BYTE),
                "{arg}: logits written"
            );
        }
    };
    run(&case, true, &|a| a.topk = 0, UNIKV_INVALID_ARGUMENT, "topk");
    run(
        &case,
        false,
        &|a| a.topk = 4096,
        UNIKV_INVALID_ARGUMENT,
        "topk",
    );
    run(
        &case,
        true,
        &|a| a.num_heads = 65,
        UNIKV_INVALID_ARGUMENT,
        "num_heads",
    );
    run(
        &case,
        true,
        &|a| a.cache_dtype = 999,
        UNIKV_BAD_ENUM,
        "cache_dtype",
    );
    run(
        &case,
        true,
        &|a| a.topk_indices.shape[1] = 63,
        UNIKV_BAD_SHAPE,
        "topk_indices",
    );
    run(
        &case,
        true,
        &|a| a.cache.shape[1] = 8192,
        UNIKV_BAD_SHAPE,
        "cache",
    );
    run(
        &case,
        false,
        &|a| a.batch_id.dtype = unikv_dtype::UNIKV_DTYPE_I64 as u32,
        UNIKV_BAD_DTYPE,
        "batch_id",
    );
    run(
        &case,
        true,
        &|a| a.q_fp8.shape[2] = 64,
        UNIKV_BAD_SHAPE,
        "q_fp8",
    );
    let mut bad = case.clone();
    bad.batch_id[0] = 2;
    run(&bad, true, &|_| {}, UNIKV_OUT_OF_RANGE, "batch_id[0]");
    let mut bad = case.clone();
    bad.batch_id[1] = 0;
    bad.positions[1] = -2;
    run(&bad, false, &|_| {}, UNIKV_OUT_OF_RANGE, "positions[1]");
    bad.positions[1] = (4 * bad.logits_width + 3) as i64;
    run(&bad, false, &|_| {}, UNIKV_OUT_OF_RANGE, "positions[1]");
    let mut bad = case.clone();
    bad.positions = vec![799; 4];
    bad.page_table[0] = bad.cache_pages as i32;
    bad.page_table[bad.max_pages] = bad.cache_pages as i32;
    run(&bad, true, &|_| {}, UNIKV_OUT_OF_RANGE, "page_table");
}

/// `unikv_indexer_topk_fill_csa` writes what `unikv_indexer_topk` then
/// `unikv_fill_csa_tail` write, bit for bit (logits, table, CSA stream), and
/// its tails are the pool rows of the table's leading entries, the window
/// entries and the entries past the stream untouched: int32 and int64
/// positions, tails as long as the selection and shorter.
#[test]
fn indexer_topk_fill_csa_equals_the_two_calls() {
    let (mut rng, _) = seeded("indexer_topk_fill_csa_equals_the_two_calls");
    let ctx = Ctx::cpu(2);
    for &(t, requests, max_keys, topk, heads) in
        &[(5, 2, 300, 64, 8), (9, 3, 700, 512, 4), (3, 1, 40, 64, 1)]
    {
        for (shorten, i64_positions) in [(false, false), (true, false), (false, true)] {
            let what =
                format!("T={t} keys {max_keys} topk {topk} shorten {shorten} i64 {i64_positions}");
            let mut case = TopkCase::random(
                &mut rng,
                t,
                requests,
                max_keys,
                topk,
                heads,
                Fp8Format::E4m3Fn,
            );
            case.positions_i64 = i64_positions;
            let stream = CsaStream::for_case(&mut rng, &case, shorten);
            let pool = csa_pool(&ctx, &case, case.cache_pages);
            let row_base = pool.layer(0).swa_rows as i32;
            let (status, logits, table, got) =
                run_topk_csa(&ctx, &pool, &case, &stream, true, |_, _| {});
            ok(status);
            case.check_logits(&logits, ScoreTol::EXACT);
            case.check_selection(&logits, &table);
            stream.check(&got, &table, case.width, row_base, &what);
            if !i64_positions {
                let (status, pair_logits, pair_table, pair_got) =
                    run_topk_csa(&ctx, &pool, &case, &stream, false, |_, _| {});
                ok(status);
                assert_eq!(bytes_of(&pair_logits), bytes_of(&logits), "{what}: logits");
                assert_eq!(pair_table, table, "{what}: table");
                assert_eq!(pair_got, got, "{what}: CSA stream");
            }
        }
    }
}

#[test]
fn indexer_topk_fill_csa_rejects_bad_input() {
    use unikv::ffi::indexer::unikv_indexer_topk_fill_csa;
    let (mut rng, _) = seeded("indexer_topk_fill_csa_rejects_bad_input");
    let ctx = Ctx::cpu(1);
    let mut case = TopkCase::random(&mut rng, 4, 2, 200, 64, 4, Fp8Format::E4m3Fn);
    // Every real token sees more than 8 keys, and each request's first page
    // lies past the two CSA pages of the small pool below.
    for p in case.positions.iter_mut() {
        *p = (*p).max(40);
    }
    let mp = case.max_pages;
    for b in 0..case.requests() {
        if case.page_table[b * mp] < 2 {
            let j = (0..case.page_table.len())
                .find(|&j| j % mp != 0 && case.page_table[j] >= 2)
                .unwrap();
            case.page_table.swap(b * mp, j);
        }
    }
    let stream = CsaStream::for_case(&mut rng, &case, false);
    let pool = csa_pool(&ctx, &case, case.cache_pages);
    type Edit<'e> = &'e dyn Fn(
        &mut unikv::ffi::indexer::unikv_indexer_topk_args,
        &mut unikv::ffi::indexer::unikv_csa_stream,
    );
    let run = |pool: &Pool, stream: &CsaStream, edit: Edit, want, arg: &str| {
        let (status, logits, table, got) = run_topk_csa(&ctx, pool, &case, stream, true, edit);
        fails(status, want, arg);
        assert!(
            bytes_of(&table).iter().all(|&b| b == POISON_BYTE),
            "{arg}: table written"
        );
        assert!(
            bytes_of(&logits).iter().all(|&b| b == POISON_BYTE),
            "{arg}: logits written"
        );
        assert_eq!(got, stream.indices, "{arg}: CSA stream written");
    };
    // The top-k's own checks come first.
    run(
        &pool,
        &stream,
        &|a, _| a.topk = 0,
        UNIKV_INVALID_ARGUMENT,
        "topk",
    );
    // Tails sized for top-64 past what a top-8 selects.
    run(
        &pool,
        &stream,
        &|a, _| a.topk = 8,
        UNIKV_OUT_OF_RANGE,
        "csa_indptr[",
    );
    // A slice shorter than its token's window.
    let mut short = stream.clone();
    for e in short.indptr.iter_mut().skip(1) {
        *e = 0;
    }
    short.tails.iter_mut().for_each(|t| *t = (0, 0));
    run(&pool, &short, &|_, _| {}, UNIKV_OUT_OF_RANGE, "csa_indptr[");
    // Page ids past the pool's CSA rows (two pages of them: one asked for,
    // and the padding rows).
    let small = csa_pool(&ctx, &case, 1);
    run(
        &small,
        &stream,
        &|_, _| {},
        UNIKV_OUT_OF_RANGE,
        "page_table[",
    );
    // A pool without ratio-4 layers whose CSA row ids would pass 2^31 - 1
    // (refused as `unikv_fill_csa_tail` refuses it, tests/hardening.rs).
    let wide = Pool::new(
        &ctx,
        &PoolSpec {
            ratios: vec![0],
            max_requests: 2,
            window: 8,
            spec_extra: 0,
            c128_blocks: 1 << 26,
        },
    );
    run(
        &wide,
        &stream,
        &|_, _| {},
        UNIKV_INVALID_ARGUMENT,
        "pool: its ratio-4 row ids",
    );
    run(
        &pool,
        &stream,
        &|_, c| c.csa_indptr.shape[0] -= 1,
        UNIKV_BAD_SHAPE,
        "csa_indptr",
    );
    run(
        &pool,
        &stream,
        &|_, c| c.csa_indices.dtype = unikv_dtype::UNIKV_DTYPE_F32 as u32,
        UNIKV_BAD_DTYPE,
        "csa_indices",
    );
    run(
        &pool,
        &stream,
        &|a, c| c.csa_indices.data = a.topk_indices.data,
        UNIKV_OVERLAPPING_BUFFERS,
        "csa_indices",
    );
    run(
        &pool,
        &stream,
        &|_, c| c.struct_size = 4,
        UNIKV_BAD_STRUCT_SIZE,
        "csa.struct_size",
    );
    let status = unsafe {
        unikv_indexer_topk_fill_csa(
            pool.0,
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null_mut(),
        )
    };
    fails(status, UNIKV_NULL_ARGUMENT, "args");
}
