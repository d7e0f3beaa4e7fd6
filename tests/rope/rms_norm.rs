//! RMSNorm against the reference.

use super::*;

/// Bound: the norm factor is rounded to f32 once from an exact-to-f64 value
/// (`u`), then `x * factor` (`u`) and `* w` (`u`): `|got - exact| <= 3.01u |exact|`.
#[test]
fn rms_norm_matches_reference() {
    let (mut rng, _) = seeded("rms_norm_matches_reference");
    let rows = 3000;
    let mut checked = 0;
    let mut expected = 0;
    for r in 0..rows {
        let len = [D, 128, 64, 7][r % 4];
        let x = random_bf16_row(&mut rng, len);
        let w: Vec<f32> = (0..len).map(|_| random_bf16(&mut rng, 0)).collect();
        let weight = (r % 3 != 0).then_some(&w[..]);
        let want = ref_rms_norm(&x, weight, EPS);
        let mut got = x.clone();
        rms_norm(&mut got, weight, EPS);
        for (k, (g, e)) in got.iter().zip(&want).enumerate() {
            let tol = 3.01 * U * e.abs();
            assert!(
                (f64::from(*g) - e).abs() <= tol,
                "row {r} (len {len}, weight {}), dim {k}: {g} vs {e}",
                weight.is_some()
            );
            checked += 1;
        }
        expected += len;
    }
    assert_eq!(checked, expected);
    assert_eq!(expected, rows / 4 * (D + 128 + 64 + 7));
}
