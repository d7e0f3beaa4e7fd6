//! The portable (HIP) attention kernels, forced on CUDA through a test hook.

use super::*;

/// The portable kernel's two variants (the HIP build's attention kernels:
/// scalar, and matrix, here on the software model of CDNA's MFMA), forced on
/// this thread's plans: decode over bf16 and both FP8 pools, prefill with its
/// two sources, splits through the workspace and combine kernel, and the
/// inverse-RoPE epilogue.
#[cfg(feature = "test-hooks")]
#[test]
fn portable_kernels_match_cpu() {
    use unikv::ffi::test_hooks::{gpu_plan_portable, PortableKernel};
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    // Under the sanitizers (small) the matrix variant's software MFMA model,
    // 64 block barriers per key chunk, would take minutes at the larger sizes.
    type Cases = &'static [(usize, usize)];
    let (decode_cases, prefill_cases, rope_cases): (Cases, Cases, Cases) = if small() {
        (&[(1, 16), (3, 40)], &[(3, 16)], &[(1, 16)])
    } else {
        (
            &[(1, 16), (3, 40), (16, 8), (64, 128)],
            &[(3, 16), (40, 64)],
            &[(1, 16), (9, 64)],
        )
    };
    for kernel in [PortableKernel::Scalar, PortableKernel::Matrix] {
        gpu_plan_portable(kernel);
        for dtype in [
            unikv_dtype::UNIKV_DTYPE_BF16,
            unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
            unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
        ] {
            let (pc, pg, rows) = attention_pools_of(&s, &mut rng, dtype);
            for &(t, h) in decode_cases {
                let what = format!("{dtype:?} decode ({kernel:?})");
                check_decode(&s, &pc, &pg, rows, t, h, &what);
            }
            for &(t, h) in prefill_cases {
                let what = format!("{dtype:?} prefill T={t} H={h} ({kernel:?})");
                check_prefill(&s, (&pc, &pg, rows), dtype, t, h, &what);
            }
        }
        let (pc, pg, rows) = attention_pools(&s, &mut rng);
        let max_pos = 4096u32;
        let table = rope_table(10_000.0, 0.0, max_pos);
        for &(t, h) in rope_cases {
            let what = format!("inverse-RoPE epilogue T={t} H={h} ({kernel:?})");
            check_rope_epilogue(&s, (&pc, &pg, rows), t, h, (&table, max_pos), &what);
        }
    }
    gpu_plan_portable(PortableKernel::Off);
}
