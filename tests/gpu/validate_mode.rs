//! The `validate` context option on the GPU: bad device values reported.

use super::*;

/// With `validate`, the CUDA backend synchronizes and checks device-resident
/// values exactly like the CPU backend: precise status, nothing written. Without
/// it, invalid values are skipped and nothing outside the buffers is touched.
#[test]
fn validate_mode_reports_bad_device_values() {
    if gpu().is_none() {
        return;
    }
    let strict = validating_gpu();
    let lenient = gpu().unwrap();
    let mut rng = rand::rng();
    let spec = PoolSpec {
        ratios: vec![0],
        max_requests: 2,
        window: 8,
        spec_extra: 0,
        c128_blocks: 0,
    };
    for (ctx, validate) in [(&strict, true), (&lenient, false)] {
        let pool = Pool::new(ctx, &spec);
        let rows = pool.layer(0).rows as usize;
        fill_layer(ctx, &pool, 0, &random_bf16(&mut rng, rows * 512));
        let before = read_layer(ctx, &pool, 0);
        // Decode with one index past the pool.
        let (t, h) = (2usize, 16usize);
        let p = plan(ctx, true, t, h);
        let q = Dev::upload(ctx, &random_bf16(&mut rng, t * h * 512));
        let idx = Dev::upload(ctx, &[0i32, 1, 2, rows as i32 + 5]);
        let indptr = Dev::upload(ctx, &[0i32, 2, 4]);
        let out = Dev::zeroed(ctx, t * h * 512 * 2);
        out.poison();
        let args = unikv_decode_args {
            struct_size: std::mem::size_of::<unikv_decode_args>(),
            q: q.t::<bf16>(&[t, h, 512]),
            indices: idx.t::<i32>(&[4]),
            indptr: indptr.t::<i32>(&[t + 1]),
            sink: absent(),
            out: out.t::<bf16>(&[t, h, 512]),
            lse: absent(),
            layer: 0,
            num_tokens: t as u32,
            softmax_scale: 0.05,
            reserved: 0,
            rope_table: absent(),
            positions: absent(),
            kv: Default::default(),
            extra_kv: Default::default(),
            extra_indices: Default::default(),
            extra_indptr: Default::default(),
        };
        let status = unsafe {
            unikv_sparse_decode(
                p.handle.cast(),
                pool.0,
                &args,
                p.ws_ptr(),
                p.bytes,
                ptr::null_mut(),
            )
        };
        if validate {
            fails(status, UNIKV_OUT_OF_RANGE, "indices[3]");
            assert!(
                out.read::<u8>().iter().all(|&b| b == POISON_BYTE),
                "nothing written"
            );
        } else {
            ok(status);
        }
        // A store with a slot past the pool.
        let kv = Dev::upload(ctx, &random_bf16(&mut rng, 2 * 512));
        let batch = Dev::upload(ctx, &[0i32, 1]);
        let slots = Dev::upload(ctx, &[1i32, 9]);
        let pos = Dev::upload(ctx, &[3i32, 4]);
        let st = unikv_store_swa_args {
            struct_size: std::mem::size_of::<unikv_store_swa_args>(),
            kv: kv.t::<bf16>(&[2, 512]),
            batch_id: batch.t::<i32>(&[2]),
            req_slots: slots.t::<i32>(&[2]),
            positions: pos.t::<i32>(&[2]),
            final_pos: absent(),
            layer: 0,
            num_tokens: 2,
        };
        let status = unsafe { unikv_store_swa(pool.0, &st, ptr::null_mut()) };
        if validate {
            fails(status, UNIKV_OUT_OF_RANGE, "req_slots[1]");
            assert_eq!(
                bytes_of(&read_layer(ctx, &pool, 0)),
                bytes_of(&before),
                "nothing written"
            );
        } else {
            ok(status);
            // Only the valid row (slot 1, position 3) was written.
            let after = read_layer(ctx, &pool, 0);
            let changed: Vec<usize> = (0..rows)
                .filter(|r| after[r * 1024..][..1024] != before[r * 1024..][..1024])
                .collect();
            assert_eq!(changed, vec![8 + 3]);
        }
    }
}
