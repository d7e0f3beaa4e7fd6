//! `unikv_indexer_prepare_q` and `unikv_indexer_prepare_k` on the CPU backend,
//! through the C ABI, against float64 references written in
//! tests/common/indexer.rs from spec store_fused §4.1, §4.2: RoPE of dims
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

use common::indexer::{hadamard_ref, KeyCase, QueryCase, DIM};
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
