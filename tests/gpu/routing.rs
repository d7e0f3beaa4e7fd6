//! hash_topk on the GPU against the CPU backend and the float64 reference of
//! tests/common/routing.rs: the same ids, weights within 1 f32 ulp (both
//! compute in double and round once; only the normalizer's summation order
//! differs). A bad token id or table entry makes its row padding on the GPU
//! and fails with OUT_OF_RANGE, nothing written, under `validate`.

use super::*;
use common::routing::{Case, Pointers};
use unikv::ffi::routing::unikv_hash_topk;
use unikv::ffi::status::unikv_status;

/// Runs `case` with its buffers in `ctx`'s memory; outputs poisoned first.
fn hash_topk_on(ctx: &Ctx, case: &Case) -> (unikv_status, Vec<f32>, Vec<i32>) {
    let logits = Dev::upload(ctx, &case.logits);
    let ids = Dev::upload(ctx, &case.id_bytes());
    let table = Dev::upload(ctx, &case.table);
    let real = Dev::upload(ctx, &case.real_bytes().unwrap_or(vec![0; 8]));
    let weights = Dev::zeroed(ctx, case.out_len() * 4);
    let topk_ids = Dev::zeroed(ctx, case.out_len() * 4);
    weights.poison();
    topk_ids.poison();
    let args = case.args(&Pointers {
        logits: logits.ptr,
        ids: ids.ptr,
        table: table.ptr,
        weights: weights.ptr,
        topk_ids: topk_ids.ptr,
        real: real.ptr,
    });
    let status = unsafe { unikv_hash_topk(ctx.0, &args, ptr::null_mut()) };
    (status, weights.read(), topk_ids.read())
}

#[test]
fn hash_topk_matches_cpu() {
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("hash_topk_matches_cpu");
    let big = if small() { 100 } else { 4096 };
    for &(t, e, k, sh) in &[
        (1, 256, 6, 0),
        (64, 256, 6, 1),
        (big, 384, 6, 1),
        (33, 64, 31, 1),
        (9, 3, 8, 2),
    ] {
        for _ in 0..3 {
            let case = Case::random(&mut rng, t, e, k, sh);
            let what = format!(
                "T={t} E={e} K={k} S={sh} real {} on device {:?}",
                case.real, case.real_on_device
            );
            let (status, want_w, want_i) = hash_topk_on(&s.cpu, &case);
            ok(status);
            let (status, got_w, got_i) = hash_topk_on(&s.gpu, &case);
            ok(status);
            case.check(&got_w, &got_i);
            assert_eq!(got_i, want_i, "{what}: ids");
            for (j, (g, w)) in got_w.iter().zip(&want_w).enumerate() {
                let ulps = (g.to_bits() as i64 - w.to_bits() as i64).abs();
                assert!(ulps <= 1, "{what}: weight {j}: GPU {g}, CPU {w}");
            }
        }
    }
    // Device values the GPU must not trust: the other rows are bit for bit
    // what the GPU gives without them.
    let strict = validating_gpu();
    let mut case = Case::random(&mut rng, 40, 256, 6, 1);
    case.real = 40;
    let (_, want_w, want_i) = hash_topk_on(&s.gpu, &case);
    let mut bad = case.clone();
    bad.ids[5] = bad.vocab as i64;
    bad.ids[9] = -3;
    let row = bad.ids[17] as usize * bad.routed + 2;
    bad.table[row] = bad.experts as i32;
    let rows_of_17: Vec<usize> = (0..40).filter(|&n| bad.ids[n] == bad.ids[17]).collect();
    let (status, got_w, got_i) = hash_topk_on(&s.gpu, &bad);
    ok(status);
    for n in 0..40 {
        let r = n * case.out_stride()..n * case.out_stride() + case.slots();
        if n == 5 || n == 9 || rows_of_17.contains(&n) {
            assert!(got_i[r.clone()].iter().all(|&i| i == -1), "row {n}: ids");
            assert!(got_w[r].iter().all(|&w| w == 0.0), "row {n}: weights");
        } else {
            assert_eq!(got_i[r.clone()], want_i[r.clone()], "row {n}: ids");
            assert_eq!(got_w[r.clone()], want_w[r], "row {n}: weights");
        }
    }
    let (status, got_w, got_i) = hash_topk_on(&strict, &bad);
    // The first bad row in row order is reported: row 5's id, or an earlier
    // row sharing row 17's token (its table entry).
    check(status, UNIKV_OUT_OF_RANGE);
    let msg = last_error();
    assert!(
        msg.contains("input_ids[5]") || msg.contains(&format!("tid2eid[{}][2]", bad.ids[17])),
        "validate: {msg}"
    );
    assert!(
        bytes_of(&got_w).iter().all(|&b| b == POISON_BYTE),
        "validate: weights written"
    );
    assert!(
        bytes_of(&got_i).iter().all(|&b| b == POISON_BYTE),
        "validate: ids written"
    );
}
