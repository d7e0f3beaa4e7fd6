//! `unikv_hash_topk` on the CPU backend, through the C ABI, against a float64
//! reference written here from docs/routing.md §1: row n's experts are
//! `tid2eid[input_ids[n]]` in table order, weighted `sqrt(ln(1 + e^x))` of
//! their router logit and normalized over the K routed slots; S shared slots
//! follow as `(E + s, 1 / routed_scaling_factor)`; padded rows are (-1, 0).
//!
//! Weights must be within 1e-6 relative of the reference (the op computes in
//! double and rounds once, so it is far tighter in practice). Logits span
//! [-120, 120], past where an f32 `exp(-|x|)` is subnormal. Outputs are
//! poisoned and padded with spare columns, which must stay untouched. Inputs
//! are fresh and random each run; the seed is printed, rerun a failure with
//! `UNIKV_TEST_SEED=<seed>`.

mod common;

use common::routing::Case;
use common::*;
use unikv::ffi::status::unikv_status;

#[test]
fn hash_topk_matches_reference() {
    let (mut rng, _) = seeded("hash_topk_matches_reference");
    let ctx = Ctx::cpu(2);
    // (tokens, E, K, S): DeepSeek-V4 Flash and Pro, a single slot, the 32-slot
    // limit, and E below K (an expert may repeat within a row).
    for &(t, e, k, s) in &[
        (1, 256, 6, 0),
        (37, 256, 6, 1),
        (64, 384, 6, 1),
        (9, 7, 1, 0),
        (5, 64, 31, 1),
        (8, 3, 8, 2),
    ] {
        for _ in 0..3 {
            let case = Case::random(&mut rng, t, e, k, s);
            let (status, weights, ids) = case.run_host(&ctx, |_| {});
            ok(status);
            case.check(&weights, &ids);
        }
    }
}

/// Every argument error: its status, a message naming the argument, and
/// untouched (still poisoned) outputs.
#[test]
fn hash_topk_rejects_bad_input() {
    let (mut rng, _) = seeded("hash_topk_rejects_bad_input");
    let ctx = Ctx::cpu(1);
    let mut case = Case::random(&mut rng, 6, 16, 6, 1);
    case.real_on_device = None;
    case.real = 6;
    let untouched =
        |(status, weights, ids): (unikv_status, Vec<f32>, Vec<i32>), want, arg: &str| {
            fails(status, want, arg);
            assert!(
                bytes_of(&weights).iter().all(|&b| b == POISON_BYTE),
                "{arg}: weights written"
            );
            assert!(
                bytes_of(&ids).iter().all(|&b| b == POISON_BYTE),
                "{arg}: ids written"
            );
        };
    untouched(
        case.run_host(&ctx, |a| a.num_shared = 27),
        UNIKV_INVALID_ARGUMENT,
        "num_shared",
    );
    untouched(
        case.run_host(&ctx, |a| a.routed_scaling_factor = 0.0),
        UNIKV_INVALID_ARGUMENT,
        "routed_scaling_factor",
    );
    untouched(
        case.run_host(&ctx, |a| a.routed_scaling_factor = f32::NAN),
        UNIKV_INVALID_ARGUMENT,
        "routed_scaling_factor",
    );
    untouched(
        case.run_host(&ctx, |a| a.num_real_tokens_host = 7),
        UNIKV_INVALID_ARGUMENT,
        "num_real_tokens_host",
    );
    untouched(
        case.run_host(&ctx, |a| a.num_tokens = 7),
        UNIKV_BAD_SHAPE,
        "router_logits",
    );
    untouched(
        case.run_host(&ctx, |a| a.topk_ids.shape[1] = 6),
        UNIKV_BAD_SHAPE,
        "topk_ids",
    );
    untouched(
        case.run_host(&ctx, |a| {
            a.topk_weights.dtype = unikv::ffi::types::unikv_dtype::UNIKV_DTYPE_I32 as u32
        }),
        UNIKV_BAD_DTYPE,
        "topk_weights",
    );
    untouched(
        case.run_host(&ctx, |a| a.tid2eid.data = std::ptr::null_mut()),
        UNIKV_NULL_ARGUMENT,
        "tid2eid",
    );
    untouched(
        case.run_host(&ctx, |a| a.struct_size = 8),
        UNIKV_BAD_STRUCT_SIZE,
        "args",
    );
    // Device values.
    let mut bad = case.clone();
    bad.ids[3] = case.vocab as i64;
    untouched(
        bad.run_host(&ctx, |_| {}),
        UNIKV_OUT_OF_RANGE,
        "input_ids[3]",
    );
    bad.real = 3; // the bad id is a padded row's: not read
    let (status, weights, ids) = bad.run_host(&ctx, |_| {});
    ok(status);
    bad.check(&weights, &ids);
    let mut table = case.clone();
    table.table[table.ids[2] as usize * table.routed + 1] = table.experts as i32;
    untouched(table.run_host(&ctx, |_| {}), UNIKV_OUT_OF_RANGE, "tid2eid");
    let mut device = case.clone();
    device.real_on_device = Some(true);
    device.real = 7;
    untouched(
        device.run_host(&ctx, |_| {}),
        UNIKV_OUT_OF_RANGE,
        "num_real_tokens[0]",
    );
}
