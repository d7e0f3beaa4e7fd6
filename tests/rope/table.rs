//! Tables: `build_table` against the reference, bad configs, row selection.

use super::*;

/// Compares every entry of a `build_table` table with the reference and returns
/// the number of entries checked.
///
/// Bound: the entry is the f32 rounding (1/2 f32 ulp) of an f64 cos/sin whose
/// angle differs from the reference's by a few f64 ulps of `w` times p (the two
/// compute `w` differently), so `|got - exact| <= ulp/2 + p w 2^-48 + 2^-60`.
fn check_table(cfg: &RopeConfig, max_pos: usize) -> usize {
    let table = build_table(cfg, max_pos).expect("valid config");
    assert_eq!(table.len(), max_pos * R, "{cfg:?}: table shape");
    let omega = ref_omegas(cfg);
    let mut checked = 0;
    for p in 0..max_pos {
        for i in 0..R / 2 {
            let (c, s) = ref_cos_sin(&omega, p, i);
            let angle_err = p as f64 * omega[i] * 2f64.powi(-48) + 2f64.powi(-60);
            for (k, exact) in [c, s].into_iter().enumerate() {
                let got = f64::from(table[p * R + 2 * i + k]);
                let tol = 0.5 * f32_ulp(exact) + angle_err;
                assert!(
                    (got - exact).abs() <= tol,
                    "{cfg:?}: table[{p}][{}] = {got}, reference {exact} (tol {tol:e})",
                    2 * i + k
                );
                checked += 1;
            }
        }
    }
    checked
}

#[test]
fn table_matches_reference() {
    let (mut rng, _) = seeded("table_matches_reference");
    // The V3 values put the ramp strictly inside the 32 pairs: some pairs keep
    // their frequency, some ramp, some are divided by the factor.
    let (low, high) = ref_yarn_range(40_000.0, &v3_yarn());
    assert!(0.0 < low && low < high && high < 31.0, "ramp {low}..{high}");
    // L0 = 2 puts both ends of the ramp at 0 (the `high += 0.001` case).
    let degenerate = Yarn {
        factor: rng.random_range(2.0..64.0),
        original_max_position: 2,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    assert_eq!(ref_yarn_range(40_000.0, &degenerate), (0.0, 0.0));
    // A random YaRN whose ramp ends are inside the pairs and land where floor and
    // ceil differ from rounding to nearest (fractions above / below one half).
    let random_base = rng.random_range(1e3..1e6);
    let random_yarn = loop {
        let yarn = Yarn {
            factor: rng.random_range(1.5..64.0),
            original_max_position: rng.random_range(256..=1 << 17),
            beta_fast: rng.random_range(8.0..64.0),
            beta_slow: rng.random_range(0.25..4.0),
        };
        let (fast, slow) = ref_correction_dims(random_base, &yarn);
        if 1.0 < fast && fast.fract() > 0.5 && slow < 30.0 && slow.fract() < 0.5 {
            break yarn;
        }
    };
    let long = (1 << 17) + rng.random_range(1..1000);
    let short = rng.random_range(1000..5000);
    let cases = [
        (RopeConfig::new(10_000.0, None), long),
        (RopeConfig::new(40_000.0, Some(v3_yarn())), long),
        (RopeConfig::new(40_000.0, Some(degenerate)), short),
        (RopeConfig::new(random_base, Some(random_yarn)), short),
    ];
    let mut checked = 0;
    for (cfg, max_pos) in &cases {
        checked += check_table(cfg, *max_pos);
    }
    assert_eq!(checked, (2 * long + 2 * short) * R);
}

#[test]
fn table_rejects_bad_configs() {
    let good = RopeConfig::new(10_000.0, Some(v3_yarn()));
    let with_yarn = |edit: fn(&mut Yarn)| {
        let mut cfg = good;
        edit(cfg.yarn.as_mut().unwrap());
        cfg
    };
    let cases: Vec<(RopeConfig, usize, &str)> = vec![
        (RopeConfig { base: 1.0, ..good }, 8, "base"),
        (
            RopeConfig {
                base: f64::NAN,
                ..good
            },
            8,
            "base",
        ),
        (
            RopeConfig {
                rotary_dim: 0,
                ..good
            },
            8,
            "rotary_dim",
        ),
        (
            RopeConfig {
                rotary_dim: 63,
                ..good
            },
            8,
            "rotary_dim",
        ),
        (good, 0, "max_pos"),
        (good, usize::MAX / 2, "max_pos"),
        (with_yarn(|y| y.factor = 0.0), 8, "yarn.factor"),
        (with_yarn(|y| y.factor = f64::INFINITY), 8, "yarn.factor"),
        (
            with_yarn(|y| y.original_max_position = 0),
            8,
            "yarn.original_max_position",
        ),
        (with_yarn(|y| y.beta_slow = 0.0), 8, "yarn.beta_slow"),
        (with_yarn(|y| y.beta_fast = 0.5), 8, "yarn.beta_fast"),
    ];
    let mut checked = 0;
    for (cfg, max_pos, name) in &cases {
        match build_table(cfg, *max_pos) {
            Err(Error::InvalidArgument(msg)) => {
                assert!(
                    msg.starts_with(name),
                    "{cfg:?}: message {msg:?} names {name}"
                )
            }
            other => panic!("{cfg:?}, max_pos {max_pos}: expected an error, got {other:?}"),
        }
        checked += 1;
    }
    assert_eq!(checked, 11);
    assert!(build_table(&good, 8).is_ok());
}

#[test]
fn table_row_selects_positions() {
    let (mut rng, _) = seeded("table_row_selects_positions");
    let max_pos = rng.random_range(100..300);
    let table = build_table(&RopeConfig::new(10_000.0, None), max_pos).unwrap();
    let mut checked = 0;
    for p in [-1, i64::MIN, max_pos as i64, i64::MAX, i64::from(i32::MIN)] {
        assert_eq!(table_row(&table, R, p), None, "position {p}");
        checked += 1;
    }
    let mut positions = vec![0, max_pos - 1];
    positions.extend((0..20).map(|_| rng.random_range(0..max_pos)));
    for p in positions {
        // Positions arrive as int32 or int64; both widen to the same row.
        let from_i32 = table_row(&table, R, i64::from(p as i32)).unwrap();
        let from_i64 = table_row(&table, R, p as i64).unwrap();
        assert_eq!(from_i32, &table[p * R..(p + 1) * R]);
        assert!(std::ptr::eq(from_i32, from_i64));
        checked += 1;
    }
    assert_eq!(checked, 5 + 22);
}
