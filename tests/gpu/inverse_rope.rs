//! Inverse RoPE on the GPU against the CPU backend, exactly.

use super::*;

/// Inverse RoPE on the GPU equals the CPU backend bit for bit (both evaluate the
/// same unfused fp32 expressions and round once), with int32 and int64
/// positions, contiguous and head-padded `x`. A position past the table leaves
/// its token alone on the GPU, and fails with OUT_OF_RANGE, nothing written,
/// under `validate`.
#[test]
fn inverse_rope_matches_cpu_exactly() {
    use unikv::ffi::rope::*;
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let max_pos = 1u32 << 16;
    let table = rope_table(40_000.0, 40.0, max_pos);
    let strict = validating_gpu();
    // (tokens, heads, elements per head in the buffer)
    let shapes: &[(usize, usize, usize)] = if small() {
        &[(3, 16, 576)]
    } else {
        &[(1, 1, 512), (7, 16, 576), (130, 64, 512), (300, 128, 520)]
    };
    for &(t, h, head_stride) in shapes {
        let x = random_bf16(&mut rng, t * h * head_stride);
        let valid: Vec<i64> = (0..t)
            .map(|_| rng.random_range(0..i64::from(max_pos)))
            .collect();
        let mut invalid = valid.clone();
        let bad = rng.random_range(0..t);
        invalid[bad] = if rng.random_bool(0.5) {
            -1
        } else {
            i64::from(max_pos)
        };
        for wide in [false, true] {
            let run = |ctx: &Ctx, positions: &[i64]| {
                let xd = Dev::upload(ctx, &x);
                let tb = Dev::upload(ctx, &table);
                let narrow: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
                let (_pd, pt) = if wide {
                    let d = Dev::upload(ctx, positions);
                    let desc = d.t::<i64>(&[t]);
                    (d, desc)
                } else {
                    let d = Dev::upload(ctx, &narrow);
                    let desc = d.t::<i32>(&[t]);
                    (d, desc)
                };
                let mut xt = xd.t::<bf16>(&[t, h, head_stride]);
                xt.shape[2] = 512;
                let args = unikv_inverse_rope_args {
                    struct_size: std::mem::size_of::<unikv_inverse_rope_args>(),
                    x: xt,
                    positions: pt,
                    rope_table: tb.t::<f32>(&[max_pos as usize, 64]),
                    num_tokens: t as u32,
                    num_heads: h as u32,
                };
                let status = unsafe { unikv_inverse_rope(ctx.0, &args, ptr::null_mut()) };
                (status, xd.read::<bf16>())
            };
            let what = format!("T={t} H={h} head stride {head_stride} int64 {wide}");
            let first_diff = |a: &[bf16], b: &[bf16]| {
                a.iter()
                    .zip(b)
                    .position(|(x, y)| x.to_bits() != y.to_bits())
            };
            let (status, want) = run(&s.cpu, &valid);
            ok(status);
            let (status, got) = run(&s.gpu, &valid);
            ok(status);
            assert_eq!(first_diff(&got, &want), None, "{what}");
            assert_ne!(first_diff(&got, &x), None, "{what}: nothing rotated");

            let (status, got) = run(&s.gpu, &invalid);
            ok(status);
            let mut want_skip = want.clone();
            let row = bad * h * head_stride;
            want_skip[row..row + h * head_stride].copy_from_slice(&x[row..row + h * head_stride]);
            assert_eq!(
                first_diff(&got, &want_skip),
                None,
                "{what}: token {bad} skipped"
            );

            let (status, got) = run(&strict, &invalid);
            fails(status, UNIKV_OUT_OF_RANGE, &format!("positions[{bad}]"));
            assert_eq!(
                first_diff(&got, &x),
                None,
                "{what}: validate writes nothing"
            );
        }
    }
}
