//! What a caller can ask on the GPU: a required GPU, the build's capabilities,
//! the launch configuration plans report, and decode streams without the
//! outputs a pool does not need (against the CPU backend, exactly).

use std::ffi::CStr;
use std::os::raw::c_char;

use super::*;
use unikv::ffi::introspect::*;

#[test]
fn a_required_gpu_is_the_cuda_backend_or_unavailable() {
    let caps = get_capabilities();
    let archs = unsafe { CStr::from_ptr(caps.gpu_archs) }.to_str().unwrap();
    assert!(archs.starts_with("sm_"), "{archs:?}");
    assert_ne!(caps.backends & (1 << 4), 0, "UNIKV_BACKEND_GPU compiled in");
    let required = context(4);
    let message = last_error();
    match (required, context(2)) {
        (Ok(required), Ok(_)) => {
            assert_eq!(backend_of(&required), 2);
            assert!(caps.gpu_devices > 0);
        }
        (Err(status), Err(_)) => {
            assert_eq!(status, UNIKV_BACKEND_UNAVAILABLE);
            assert!(message.contains("options.backend"), "{message}");
            assert!(message.contains("UNIKV_BACKEND_GPU"), "{message}");
            assert_eq!(caps.gpu_devices, 0);
        }
        _ => panic!("UNIKV_BACKEND_GPU and UNIKV_BACKEND_CUDA disagree"),
    }
}

#[test]
fn plans_report_their_kernels_splits_and_workspace() {
    let Some(gpu) = gpu() else { return };
    use unikv_kernel_family::*;
    for &heads in &[1usize, 16, 32, 48, 64, 128] {
        for &max_tokens in &[1usize, 64, 2048] {
            for kv_dtype in [1u32, 7, 8] {
                let p = plan_kv(&gpu, true, max_tokens, heads, kv_dtype);
                let info = p.info();
                let what = format!("H={heads} T={max_tokens} kv={kv_dtype}: {info:?}");
                assert_eq!(info.backend, 2, "{what}");
                assert!(
                    [
                        UNIKV_KERNEL_MMA as u32,
                        UNIKV_KERNEL_WGMMA_HEADS_ON_M as u32,
                        UNIKV_KERNEL_WGMMA_HEADS_ON_N as u32,
                    ]
                    .contains(&info.kernel_family),
                    "{what}"
                );
                assert!(info.head_block % 16 == 0 && info.head_block <= 64, "{what}");
                assert!(
                    (info.head_block * info.head_blocks) as usize >= heads,
                    "{what}"
                );
                assert!(info.max_splits >= 1 && info.stages >= 1, "{what}");
                assert!(info.sm_count > 0, "{what}");
                assert_eq!(info.workspace_bytes, p.bytes as u64, "{what}");
                // Partial records of every split that merges through the
                // workspace: the long splits' where the plan has them.
                let ws_splits = if info.long_key_splits > 0 {
                    assert!(info.long_key_splits > info.max_splits, "{what}");
                    assert_eq!(info.cluster_merge, 1, "{what}");
                    info.long_key_splits
                } else if info.cluster_merge != 0 || info.max_splits == 1 {
                    assert_eq!(info.long_keys, 0, "{what}");
                    0
                } else {
                    info.max_splits
                };
                let records = (max_tokens as u64) * info.head_blocks as u64 * ws_splits as u64;
                let per_record = (info.head_block as u64) * (2 + 512) * 4;
                assert_eq!(info.workspace_bytes, records * per_record, "{what}");
                if info.raw_fp8_variant != 0 {
                    assert_ne!(kv_dtype, 1, "{what}");
                    assert_eq!(info.kernel_family, UNIKV_KERNEL_WGMMA_HEADS_ON_N as u32);
                }
                let mut buf = [0 as c_char; 512];
                ok(unsafe {
                    unikv_decode_plan_describe(
                        p.handle.cast(),
                        buf.as_mut_ptr(),
                        buf.len(),
                        ptr::null_mut(),
                    )
                });
                let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
                assert!(text.starts_with("decode plan: cuda, "), "{text}");
                eprintln!("{text}");
            }
        }
    }
}

/// SWA and (when `hca`) HCA streams of one decode build, the CSA stream left out.
fn without_csa(ctx: &Ctx, pool: &Pool, hca: bool, t: usize) -> Vec<Vec<i32>> {
    let win = 32;
    let width = 3;
    let batch: Vec<i32> = (0..t as i32)
        .map(|i| if i % 5 == 4 { -1 } else { i % 6 })
        .collect();
    let slots: Vec<i32> = (1..=6).collect();
    let pos: Vec<i32> = (0..t as i32).map(|i| (i * 977) % 5000).collect();
    let c128: Vec<i32> = (0..(t * width) as i32).map(|i| i % 40).collect();
    let b = Dev::upload(ctx, &batch);
    let sl = Dev::upload(ctx, &slots);
    let p = Dev::upload(ctx, &pos);
    let c = Dev::upload(ctx, &c128);
    let caps = [t * win, t * (win + width)];
    let outs: Vec<(Dev, Dev)> = caps
        .iter()
        .map(|&cap| (Dev::zeroed(ctx, (t + 1) * 4), Dev::zeroed(ctx, cap * 4)))
        .collect();
    for (a, b) in &outs {
        a.poison();
        b.poison();
    }
    let absent: unikv_tensor = unsafe { std::mem::zeroed() };
    let args = unikv_decode_streams_args {
        struct_size: std::mem::size_of::<unikv_decode_streams_args>(),
        batch_id: b.t::<i32>(&[t]),
        req_slots: sl.t::<i32>(&[slots.len()]),
        positions: p.t::<i32>(&[t]),
        c128_page_indices: c.t::<i32>(&[t, width]),
        swa_indptr: outs[0].0.t::<i32>(&[t + 1]),
        swa_indices: outs[0].1.t::<i32>(&[caps[0]]),
        hca_indptr: if hca {
            outs[1].0.t::<i32>(&[t + 1])
        } else {
            absent
        },
        hca_indices: if hca {
            outs[1].1.t::<i32>(&[caps[1]])
        } else {
            absent
        },
        csa_indptr: absent,
        csa_indices: absent,
        num_tokens: t as u32,
        csa_topk: 0,
    };
    ok(unsafe { unikv_build_decode_streams(pool.0, &args, ptr::null_mut()) });
    let mut result = vec![];
    for (indptr, indices) in outs.iter().take(if hca { 2 } else { 1 }) {
        let ip = indptr.read::<i32>();
        let n = ip[t] as usize;
        result.push(indices.read::<i32>()[..n].to_vec());
        result.push(ip);
    }
    if !hca {
        // Untouched: still the poison pattern.
        assert!(outs[1].0.read::<u8>().iter().all(|&x| x == POISON_BYTE));
    }
    result
}

#[test]
fn decode_streams_without_compressed_outputs_match_cpu() {
    let Some(s) = setup() else { return };
    for (ratios, hca) in [(vec![0u32], false), (vec![0, 128], true)] {
        let spec = PoolSpec {
            ratios,
            max_requests: 6,
            window: 32,
            spec_extra: 3,
            c128_blocks: 64,
        };
        let pc = Pool::of(&s.cpu, &spec, unikv_dtype::UNIKV_DTYPE_BF16);
        let pg = Pool::of(&s.gpu, &spec, unikv_dtype::UNIKV_DTYPE_BF16);
        for t in [1usize, 7, 300] {
            let want = without_csa(&s.cpu, &pc, hca, t);
            let got = without_csa(&s.gpu, &pg, hca, t);
            assert_eq!(got, want, "T={t} hca={hca}");
        }
    }
}
