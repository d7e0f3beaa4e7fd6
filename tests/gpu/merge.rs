//! Merging attention states against the CPU backend.

use super::*;

#[test]
fn merge_matches_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    for &(p, t, h, with_sink) in &[(3usize, 5usize, 16usize, true), (8, 64, 128, false)] {
        let n = p * t * h;
        let parts_out = random_bf16(&mut rng, n * 512);
        let parts_lse: Vec<f32> = (0..n)
            .map(|i| {
                if i % 7 == 0 {
                    f32::NEG_INFINITY
                } else {
                    rng.random_range(-4.0f32..12.0)
                }
            })
            .collect();
        let sink: Vec<f32> = (0..h).map(|_| rng.random_range(-2.0f32..6.0)).collect();
        let run = |ctx: &Ctx| -> (Vec<bf16>, Vec<f32>) {
            let po = Dev::upload(ctx, &parts_out);
            let pl = Dev::upload(ctx, &parts_lse);
            let sk = Dev::upload(ctx, &sink);
            let out = Dev::zeroed(ctx, t * h * 512 * 2);
            let lse = Dev::zeroed(ctx, t * h * 4);
            out.poison();
            lse.poison();
            let args = unikv_merge_args {
                struct_size: std::mem::size_of::<unikv_merge_args>(),
                parts_out: po.t::<bf16>(&[p, t, h, 512]),
                parts_lse: pl.t::<f32>(&[p, t, h]),
                sink: if with_sink {
                    sk.t::<f32>(&[h])
                } else {
                    absent()
                },
                out: out.t::<bf16>(&[t, h, 512]),
                lse: lse.t::<f32>(&[t, h]),
                num_tokens: t as u32,
                reserved: 0,
            };
            ok(unsafe { unikv_attention_merge(ctx.0, &args, ptr::null_mut()) });
            (out.read::<bf16>(), lse.read::<f32>())
        };
        compare(
            (t, h),
            &run(&s.gpu),
            &run(&s.cpu),
            &format!("merge P={p} T={t} H={h}"),
        );
    }
}
