//! Decode attention over FP8 pools, and the exactness of the FP8 dequantization.

use super::*;

/// FP8 pools (both flavours) through every kernel: the rows are dequantized in
/// the key tile on the GPU and on gather on the CPU, so both see the same
/// values. The fallback paths gather with cp.async instead of bulk copies.
#[test]
fn decode_over_fp8_pools_matches_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    // T = 140 under UNIKV_GPU_TEST_SMALL: one split per token, so 16-head
    // blocks of more than three tiles take turns at whole tiles; the other
    // sizes also have blocks of a few tiles, which split each tile's dims.
    // There every kernel refills its stages, so the sanitizers see each
    // pipeline (16, 32 and 64 heads, raw and in-place, and the 128-head pair
    // at T = 140) wrap around.
    let (tokens, heads): (&[usize], &[usize]) = if small() {
        (&[3, 140], &[16, 32, 64, 128])
    } else {
        (&[1, 64, 257], &[1, 16, 32, 40, 64, 128])
    };
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
    ] {
        let (pc, pg, rows) = attention_pools_of(&s, &mut rng, dtype);
        for &t in tokens {
            for &h in heads {
                check_decode(&s, &pc, &pg, rows, t, h, &format!("{dtype:?} decode"));
            }
        }
        #[cfg(feature = "test-hooks")]
        {
            unikv::ffi::test_hooks::gpu_plan_fallbacks(true, true);
            for (t, h) in [(3, 16), (16, 64)] {
                check_decode(
                    &s,
                    &pc,
                    &pg,
                    rows,
                    t,
                    h,
                    &format!("{dtype:?} decode (fallback paths)"),
                );
            }
            unikv::ffi::test_hooks::gpu_plan_fallbacks(false, false);
        }
    }
}

/// With one key per token and no sink the output is that key's row exactly, so
/// the GPU's in-tile dequantization is checked bit for bit against the CPU's:
/// raw FP8 rows holding every code (NaN codes included), scale bytes inside
/// and outside the integer path's range (0, 9, 10, 120, 134, 135, 200), both
/// flavours, every kernel (heads 16, 40, 64) and the cp.async gathers of the
/// fallback paths. NaN outputs only need to be NaN on both, zeros equal in value.
#[test]
fn fp8_dequantization_is_exact_on_gpu() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
    ] {
        let (pc, pg, rows) = attention_pools_of(&s, &mut rng, dtype);
        let scales = [0u8, 9, 10, 120, 134, 135, 200];
        let mut nope = vec![0u8; rows * 512];
        for (r, row) in nope.chunks_mut(512).enumerate() {
            for (i, b) in row[..448].iter_mut().enumerate() {
                // Rows 0..4 walk through all 256 codes; the rest are random.
                *b = if r < 4 {
                    ((r * 448 + i) % 256) as u8
                } else {
                    rng.random()
                };
            }
            for k in 0..7 {
                let sb = scales[(r + k) % scales.len()];
                row[448 + 2 * k] = sb;
                row[449 + 2 * k] = sb;
            }
        }
        let rope = random_bf16(&mut rng, rows * 64);
        for (ctx, pool) in [(&s.cpu, &pc), (&s.gpu, &pg)] {
            let info = pool.layer(1);
            upload_to(ctx, info.data, &nope);
            upload_to(ctx, info.rope_data, &bytes_of(&rope));
        }
        let t = 200;
        let order: Vec<i32> = (0..rows as i32).collect::<Vec<_>>();
        for (h, fallback) in [
            (16, false),
            (40, false),
            (64, false),
            (16, true),
            (64, true),
        ] {
            #[cfg(feature = "test-hooks")]
            unikv::ffi::test_hooks::gpu_plan_fallbacks(fallback, fallback);
            #[cfg(not(feature = "test-hooks"))]
            if fallback {
                continue;
            }
            let c = AttnCase {
                t,
                h,
                q: random_bf16(&mut rng, t * h * 512),
                indices: (0..4)
                    .chain(order.choose_multiple(&mut rng, t - 4).copied())
                    .collect(),
                indptr: (0..=t as i32).collect(),
                sink: None,
                scale: 0.04,
                extend_kv: Vec::new(),
                extend_indices: Vec::new(),
                extend_indptr: Vec::new(),
                rope: None,
                in_place: false,
            };
            let want = run_attention(
                &s.cpu,
                &pc,
                1,
                &c,
                &plan_kv(&s.cpu, true, t, h, dtype as u32),
            );
            let got = run_attention(
                &s.gpu,
                &pg,
                1,
                &c,
                &plan_kv(&s.gpu, true, t, h, dtype as u32),
            );
            for (i, (g, w)) in got.0.iter().zip(&want.0).enumerate() {
                // ±0 may differ: the GPU accumulates onto +0.
                assert!(
                    g.to_bits() == w.to_bits()
                        || g.to_f32() == w.to_f32()
                        || (g.is_nan() && w.is_nan()),
                    "{dtype:?} H={h} fallback {fallback}: token {} head {} dim {}: GPU {g} CPU {w}",
                    i / (h * 512),
                    i / 512 % h,
                    i % 512
                );
            }
        }
        #[cfg(feature = "test-hooks")]
        unikv::ffi::test_hooks::gpu_plan_fallbacks(false, false);
    }
}
