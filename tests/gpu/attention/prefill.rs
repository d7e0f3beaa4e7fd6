//! Prefill attention against the CPU backend.

use super::*;

/// bf16 pools, and FP8 pools whose tiles mix FP8 pool rows with the bf16
/// extend rows of the chunk.
#[test]
fn prefill_matches_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let cases: &[(usize, usize)] = if small() {
        &[(3, 8)]
    } else {
        &[(64, 8), (64, 32), (257, 64), (64, 128)]
    };
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_BF16,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
    ] {
        let (pc, pg, rows) = attention_pools_of(&s, &mut rng, dtype);
        for &(t, h) in cases {
            let what = format!("{dtype:?} prefill T={t} H={h}");
            check_prefill(&s, (&pc, &pg, rows), dtype, t, h, &what);
        }
    }
}
