//! unikv_store_scaled_fp8 on the GPU against the CPU backend: whole code and
//! scale buffers byte for byte, for every flavour and divisor, int32 and
//! int64 rows, edge-case tiles, rows past the end skipped, and validate mode.

use super::*;

use common::scaled_store::{ScaledCase, FLAVOURS};

/// The (codes, scales) bytes a store leaves on `ctx`, poisoned before.
fn store_on(ctx: &Ctx, case: &ScaledCase) -> (Vec<u8>, Vec<u8>) {
    let (codes, scales) = case.outputs(ctx);
    ok(case.run(ctx, &codes, &scales));
    (codes.read::<u8>(), scales.read::<u8>())
}

#[test]
fn scaled_store_matches_cpu_exactly() {
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("scaled_store_matches_cpu_exactly");
    let tokens = if small() { 40 } else { 900 };
    for (dtype, divisor) in FLAVOURS {
        for loc_i64 in [false, true] {
            let mut case = ScaledCase::random(&mut rng, dtype, divisor, tokens).with_specials();
            case.loc_i64 = loc_i64;
            let what = format!("{dtype:?} divisor {divisor} i64 rows {loc_i64}");
            let want = store_on(&s.cpu, &case);
            assert!(
                want.0.iter().any(|&b| b != POISON_BYTE),
                "{what}: nothing stored"
            );
            assert!(
                store_on(&s.gpu, &case) == want,
                "{what}: GPU bytes differ from the CPU's"
            );

            // On the GPU a row past the end is skipped, like a negative one
            // on the CPU.
            let (mut past, mut skipped) = (case.clone(), case.clone());
            for t in (0..case.tokens()).step_by(3) {
                past.locations[t] = (case.num_rows + t) as i64;
                skipped.locations[t] = -1;
            }
            let want = store_on(&s.cpu, &skipped);
            assert!(store_on(&s.gpu, &past) == want, "{what}: rows past the end");
        }
    }
}

#[test]
fn scaled_store_validate_mode_reports_bad_rows() {
    if gpu().is_none() {
        return;
    }
    let strict = validating_gpu();
    let (mut rng, _) = seeded("scaled_store_validate_mode_reports_bad_rows");
    let mut case = ScaledCase::random(&mut rng, FLAVOURS[0].0, 0, 50);
    let bad = case.tokens() / 2;
    case.locations[bad] = case.num_rows as i64;
    let (codes, scales) = case.outputs(&strict);
    fails(
        case.run(&strict, &codes, &scales),
        UNIKV_OUT_OF_RANGE,
        &format!("loc[{bad}]"),
    );
    assert!(
        codes.read::<u8>().iter().all(|&b| b == POISON_BYTE),
        "codes written"
    );
    assert!(
        scales.read::<u8>().iter().all(|&b| b == POISON_BYTE),
        "scales written"
    );
}
