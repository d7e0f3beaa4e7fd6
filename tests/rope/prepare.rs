//! Q and KV rows (prepare_q, prepare_kv) against the reference.

use super::*;

/// Q per token `[H, 512]`. Reference: `n = rms(x)` exact; nope dims are bf16(n),
/// accepted within `E_n = 2.01u|n|` (factor and product roundings), i.e. exactly
/// 1 ulp. The rope dims rotate one of the accepted bf16 values of each `n_k`
/// (candidates of the first rounding) and round again; the rotation's fp32 error is
/// `2u` times the products' magnitudes.
#[test]
fn prepare_q_matches_reference() {
    let (mut rng, _) = seeded("prepare_q_matches_reference");
    let heads = [1, 2, 7, 16, 64, 128];
    let tokens = 6;
    let mut nope = Tally::default();
    let mut rope = Tally::default();
    for &h in &heads {
        for _ in 0..tokens {
            let (p, cs) = random_table_row(&mut rng);
            // Per-head scales differ, as the norm is per head.
            let x: Vec<f32> = (0..h).flat_map(|_| random_bf16_row(&mut rng, D)).collect();
            let mut got = x.clone();
            prepare_q_row(&mut got, EPS, &cs);
            for (head, (x, got)) in x.chunks(D).zip(got.chunks(D)).enumerate() {
                let n = ref_rms_norm(x, None, EPS);
                let first: Vec<Accept> = n
                    .iter()
                    .map(|&v| Accept::new(v, 2.01 * U * v.abs()))
                    .collect();
                for k in 0..NOPE {
                    assert!(first[k].width() <= 1);
                    assert!(
                        first[k].contains(got[k]),
                        "H {h}, head {head}, dim {k}: {} vs {}",
                        got[k],
                        n[k]
                    );
                    nope.add(&first[k]);
                }
                for i in 0..R / 2 {
                    let d = NOPE + 2 * i;
                    let (c, s) = (f64::from(cs[2 * i]), f64::from(cs[2 * i + 1]));
                    for k in 0..2 {
                        let mut accept: Option<Accept> = None;
                        for n0 in first[d].values() {
                            for n1 in first[d + 1].values() {
                                let rotated = ref_rotate(n0, n1, c, s);
                                let err = 2.0 * U * (1.0 + 1e-6) * rotated.magnitude[k];
                                let a = Accept::new(rotated.exact[k], err);
                                accept = Some(accept.map_or(a, |acc| acc.union(a)));
                            }
                        }
                        let accept = accept.unwrap();
                        assert!(
                            accept.contains(got[d + k]),
                            "H {h}, head {head}, position {p}, dim {}: {} not in {accept:?}",
                            d + k,
                            got[d + k]
                        );
                        rope.add(&accept);
                    }
                }
            }
        }
    }
    let total_heads: usize = heads.iter().sum::<usize>() * tokens;
    assert_eq!(nope.checked, total_heads * NOPE);
    assert_eq!(nope.wide, 0);
    assert_eq!(rope.checked, total_heads * R);
    rope.assert_rare_wide("Q rope dims");
}

/// KV rows. Reference: `k = rms(x) * w` exact, with the implementation's fp32 error
/// `E_k = 3.01u|k|`. Nope dims: bf16(k) within `E_k` (1 ulp). Rope dims: bf16 of
/// the exact rotation of the unrounded `k`, within the propagated `|c| E_k0 + |s| E_k1`
/// (real part; `|s| E_k0 + |c| E_k1` for the imaginary part) plus the rotation's
/// `2u` times the same magnitudes (`|k0 c| + |k1 s|` for the real part):
/// `5.02u` times the magnitudes.
#[test]
fn prepare_kv_matches_reference() {
    let (mut rng, _) = seeded("prepare_kv_matches_reference");
    let tokens = 3000;
    let weight: Vec<f32> = (0..D).map(|_| random_bf16(&mut rng, 0)).collect();
    let mut nope = Tally::default();
    let mut rope = Tally::default();
    for t in 0..tokens {
        let (p, cs) = random_table_row(&mut rng);
        let x = random_bf16_row(&mut rng, D);
        let mut got = x.clone();
        prepare_kv_row(&mut got, &weight, EPS, &cs);
        let k = ref_rms_norm(&x, Some(&weight), EPS);
        for d in 0..NOPE {
            let accept = Accept::new(k[d], 3.01 * U * k[d].abs());
            assert!(accept.width() <= 1);
            assert!(
                accept.contains(got[d]),
                "token {t}, dim {d}: {} vs {}",
                got[d],
                k[d]
            );
            nope.add(&accept);
        }
        for i in 0..R / 2 {
            let d = NOPE + 2 * i;
            let (c, s) = (f64::from(cs[2 * i]), f64::from(cs[2 * i + 1]));
            let (k0, k1) = (k[d], k[d + 1]);
            let rotated = ref_rotate(k0, k1, c, s);
            for j in 0..2 {
                let exact = rotated.exact[j];
                let accept = Accept::new(exact, 5.02 * U * rotated.magnitude[j]);
                assert!(
                    accept.contains(got[d + j]),
                    "token {t}, position {p}, dim {}: {} vs {exact} ({accept:?})",
                    d + j,
                    got[d + j]
                );
                rope.add(&accept);
            }
        }
    }
    assert_eq!(nope.checked, tokens * NOPE);
    assert_eq!(nope.wide, 0);
    assert_eq!(rope.checked, tokens * R);
    rope.assert_rare_wide("KV rope dims");
}
