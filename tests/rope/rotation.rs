//! RoPE rows: forward against the reference, identity at position 0, and the
//! inverse.

use super::*;

/// Rotates random rows forward and back and checks both against the reference:
/// the nope dims are untouched (bit for bit) and each rope output is within
/// `2u` times its products' magnitudes (`|re c| + |im s|` for the real part: two
/// rounded products and their rounded sum) of the exact rotation by the table
/// row's f32 values.
#[test]
fn rope_matches_reference() {
    let (mut rng, _) = seeded("rope_matches_reference");
    let rows = 2000;
    let mut checked = 0;
    for _ in 0..rows {
        let (p, cs) = random_table_row(&mut rng);
        let scale = rng.random_range(-20..=20);
        let x: Vec<f32> = (0..D).map(|_| random_f32(&mut rng, scale)).collect();
        for inverse in [false, true] {
            let mut row = x.clone();
            if inverse {
                inverse_rope_row(&mut row, &cs);
            } else {
                rope_row(&mut row, &cs);
            }
            assert_eq!(
                row[..NOPE].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                x[..NOPE].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "nope dims changed"
            );
            checked += NOPE;
            for i in 0..R / 2 {
                let (re, im) = (f64::from(x[NOPE + 2 * i]), f64::from(x[NOPE + 2 * i + 1]));
                let c = f64::from(cs[2 * i]);
                let s = f64::from(cs[2 * i + 1]) * if inverse { -1.0 } else { 1.0 };
                let want = ref_rotate(re, im, c, s);
                for k in 0..2 {
                    let exact = want.exact[k];
                    let tol = 2.0 * U * (1.0 + 1e-6) * want.magnitude[k];
                    let got = f64::from(row[NOPE + 2 * i + k]);
                    assert!(
                        (got - exact).abs() <= tol,
                        "inverse {inverse}, position {p}, dim {}: {got} vs {exact}",
                        NOPE + 2 * i + k
                    );
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, rows * 2 * D);
}

/// Row 0 of every table is `cos 0 = 1, sin 0 = 0`, so RoPE and its inverse at
/// position 0 are the identity, bit for bit.
#[test]
fn rope_at_position_zero_is_identity() {
    let (mut rng, _) = seeded("rope_at_position_zero_is_identity");
    let mut checked = 0;
    let configs = [
        RopeConfig::new(10_000.0, None),
        RopeConfig::new(40_000.0, Some(v3_yarn())),
    ];
    for cfg in &configs {
        let table = build_table(cfg, 4).unwrap();
        let row0 = table_row(&table, R, 0).unwrap();
        let unit: Vec<f32> = (0..R).map(|k| if k % 2 == 0 { 1.0 } else { 0.0 }).collect();
        assert_eq!(row0, &unit[..]);
        for _ in 0..100 {
            let x = random_bf16_row(&mut rng, D);
            for inverse in [false, true] {
                let mut row = x.clone();
                if inverse {
                    inverse_rope_row(&mut row, row0);
                } else {
                    rope_row(&mut row, row0);
                }
                for (got, want) in row.iter().zip(&x) {
                    assert_eq!(got.to_bits(), want.to_bits());
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 2 * 100 * 2 * D);
}

/// `inverse(bf16(rope(x)))` gives back the bf16 input `x` up to the bf16 rounding
/// of the rotated values: with `y = bf16(rope(x)) = rope(x) + e`, `R^T y` is
/// `x + R^T e`, so component 0 is off by `|c| e0 + |s| e1` and component 1 by
/// `|s| e0 + |c| e1`, where `|e_k| <= ulp_bf16(y_k)/2` plus the forward fp32 error
/// (`2u` times the magnitudes); add the inverse's own fp32 error and `2u|x_k|`
/// for `c^2 + s^2` of the f32 table being 1 only to within 2u.
#[test]
fn inverse_undoes_rope_within_bf16_rounding() {
    let (mut rng, _) = seeded("inverse_undoes_rope_within_bf16_rounding");
    let rows = 2000;
    let mut checked = 0;
    for _ in 0..rows {
        let (p, cs) = random_table_row(&mut rng);
        let x = random_bf16_row(&mut rng, D);
        let mut y = x.clone();
        rope_row(&mut y, &cs);
        y.iter_mut().for_each(|v| *v = bf16::from_f32(*v).to_f32());
        let mut z = y.clone();
        inverse_rope_row(&mut z, &cs);
        assert_eq!(&z[..NOPE], &x[..NOPE]);
        checked += NOPE;
        for i in 0..R / 2 {
            let (c, s) = (f64::from(cs[2 * i]), f64::from(cs[2 * i + 1]));
            let (x0, x1) = (f64::from(x[NOPE + 2 * i]), f64::from(x[NOPE + 2 * i + 1]));
            let (y0, y1) = (f64::from(y[NOPE + 2 * i]), f64::from(y[NOPE + 2 * i + 1]));
            let forward = ref_rotate(x0, x1, c, s).magnitude;
            let e0 = bf16_ulp(y0) / 2.0 + 2.0 * U * forward[0];
            let e1 = bf16_ulp(y1) / 2.0 + 2.0 * U * forward[1];
            let back = ref_rotate(y0, y1, c, -s).magnitude;
            let propagated = [c.abs() * e0 + s.abs() * e1, s.abs() * e0 + c.abs() * e1];
            for (k, xk) in [x0, x1].into_iter().enumerate() {
                let fp32 = 2.0 * U * (back[k] + xk.abs());
                let tol = (propagated[k] + fp32) * (1.0 + 1e-6);
                let got = f64::from(z[NOPE + 2 * i + k]);
                assert!(
                    (got - xk).abs() <= tol,
                    "position {p}, dim {}: {got} vs {xk} (tol {tol:e})",
                    NOPE + 2 * i + k
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, rows * D);
}
