//! The C ABI builder of the table.

use super::*;

fn c_params(base: f64, yarn: Option<Yarn>) -> unikv_rope_params {
    let yarn = yarn.map_or(
        unikv_rope_yarn {
            factor: 0.0,
            original_max_position: 0,
            beta_fast: 0.0,
            beta_slow: 0.0,
        },
        |y| unikv_rope_yarn {
            factor: y.factor,
            original_max_position: y.original_max_position,
            beta_fast: y.beta_fast,
            beta_slow: y.beta_slow,
        },
    );
    unikv_rope_params {
        struct_size: std::mem::size_of::<unikv_rope_params>(),
        base,
        yarn,
    }
}

/// `unikv_rope_table` fills exactly `max_pos` rows, bit for bit the Rust builder's
/// (itself checked against the float64 reference above), and nothing past them.
#[test]
fn c_abi_table_matches_the_builder() {
    let (mut rng, _) = seeded("c_abi_table_matches_the_builder");
    let mut checked = 0;
    for (base, yarn) in [(10_000.0, None), (40_000.0, Some(v3_yarn()))] {
        let max_pos = rng.random_range(1..600u32);
        let want = build_table(&RopeConfig::new(base, yarn), max_pos as usize).unwrap();
        let mut got = vec![f32::from_bits(0x7FA5_A5A5); want.len() + 7];
        ok(unsafe {
            unikv_rope_table(&c_params(base, yarn), max_pos, got.as_mut_ptr(), got.len())
        });
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "entry {i} of base {base}");
            checked += 1;
        }
        assert!(
            got[want.len()..].iter().all(|v| v.to_bits() == 0x7FA5_A5A5),
            "wrote past max_pos rows"
        );
    }
    assert!(checked >= 2 * 64);
}

/// Every bad argument gets its own status and names the argument; the table is
/// left as it was.
#[test]
fn c_abi_table_rejects_bad_input() {
    let good = c_params(40_000.0, Some(v3_yarn()));
    let mut table = vec![f32::from_bits(0x7FA5_A5A5); 8 * 64 + 1];
    let poison = table.clone();
    let len = table.len();
    let t = table.as_mut_ptr();
    unsafe {
        fails(
            unikv_rope_table(std::ptr::null(), 8, t, len),
            UNIKV_NULL_ARGUMENT,
            "params",
        );
        fails(
            unikv_rope_table(&good, 8, std::ptr::null_mut(), len),
            UNIKV_NULL_ARGUMENT,
            "table",
        );
        fails(
            unikv_rope_table(&good, 8, t.cast::<u8>().add(1).cast(), len - 1),
            UNIKV_BAD_ALIGNMENT,
            "table",
        );
        fails(
            unikv_rope_table(&good, 0, t, len),
            UNIKV_INVALID_ARGUMENT,
            "max_pos",
        );
        fails(
            unikv_rope_table(&good, 9, t, len),
            UNIKV_CAPACITY_EXCEEDED,
            "table_len",
        );
        let small = unikv_rope_params {
            struct_size: 8,
            ..good
        };
        fails(
            unikv_rope_table(&small, 8, t, len),
            UNIKV_BAD_STRUCT_SIZE,
            "params.struct_size",
        );
        let cases = [
            (c_params(1.0, None), "params.base"),
            (c_params(f64::NAN, None), "params.base"),
            (
                c_params(
                    40_000.0,
                    Some(Yarn {
                        factor: -1.0,
                        ..v3_yarn()
                    }),
                ),
                "params.yarn.factor",
            ),
            (
                c_params(
                    40_000.0,
                    Some(Yarn {
                        original_max_position: 0,
                        ..v3_yarn()
                    }),
                ),
                "params.yarn.original_max_position",
            ),
            (
                c_params(
                    40_000.0,
                    Some(Yarn {
                        beta_fast: 0.5,
                        ..v3_yarn()
                    }),
                ),
                "params.yarn.beta_fast",
            ),
        ];
        for (params, arg) in cases {
            fails(
                unikv_rope_table(&params, 8, t, len),
                UNIKV_INVALID_ARGUMENT,
                arg,
            );
        }
    }
    assert!(
        table
            .iter()
            .zip(&poison)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "a failing call wrote"
    );
}
