//! Stores into the pool: tensors inside the rows they write are refused.

use super::*;

#[test]
fn stores_refuse_tensors_inside_the_rows_they_write() {
    let ctx = Ctx::cpu(1);
    let pool = dense_pool(&ctx, unikv_dtype::UNIKV_DTYPE_BF16);
    let mut r = Regions::default();
    let (kv, ints) = (r.take(D * 2), r.take(64));
    let mut a = Arena::new(&r);
    a.write(kv, &vec![bf16::ONE; D]);
    a.write(ints, &[0i32, 1, 3, 0]); // batch_id, req_slots, positions, loc
    let swa = unikv_store_swa_args {
        struct_size: size_of::<unikv_store_swa_args>(),
        kv: a.t::<bf16>(kv, &[1, D]),
        batch_id: a.t::<i32>(ints, &[1]),
        req_slots: a.t::<i32>(ints + 4, &[1]),
        positions: a.t::<i32>(ints + 8, &[1]),
        final_pos: absent(),
        layer: 0,
        num_tokens: 1,
    };
    let store_swa =
        |args: unikv_store_swa_args| unsafe { unikv_store_swa(pool.0, &args, ptr::null_mut()) };
    let rows = |layer| desc::<bf16>(pool.layer(layer).data, &[1, D], &[D, 1]);
    let written = Some((&pool, 0));
    refused_unchanged(
        &a,
        written,
        || store_swa(unikv_store_swa_args { kv: rows(0), ..swa }),
        "kv",
        "the pool's rows of layer 0, which this operation writes",
    );
    let positions = desc::<i32>(pool.layer(0).data, &[1], &[1]);
    refused_unchanged(
        &a,
        written,
        || store_swa(unikv_store_swa_args { positions, ..swa }),
        "positions",
        "the pool's rows of layer 0",
    );
    // Another layer's rows are just an input.
    ok(store_swa(unikv_store_swa_args { kv: rows(1), ..swa }));

    let compressed = unikv_store_compressed_args {
        struct_size: size_of::<unikv_store_compressed_args>(),
        kv: a.t::<bf16>(kv, &[1, D]),
        loc: a.t::<i32>(ints + 12, &[1]),
        layer: 1,
        num_rows: 1,
    };
    let loc = desc::<i32>(
        pool.layer(1).data.cast::<u8>().wrapping_add(16).cast(),
        &[1],
        &[1],
    );
    refused_unchanged(
        &a,
        Some((&pool, 1)),
        || unsafe {
            unikv_store_compressed(
                pool.0,
                &unikv_store_compressed_args { loc, ..compressed },
                ptr::null_mut(),
            )
        },
        "loc",
        "the pool's rows of layer 1",
    );
    ok(unsafe { unikv_store_compressed(pool.0, &compressed, ptr::null_mut()) });

    // An FP8 layer's rope rows are pool rows too.
    let fp8 = dense_pool(&ctx, unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN);
    let kv_in_rope = desc::<bf16>(fp8.layer(0).rope_data, &[1, D], &[D, 1]);
    let args = unikv_store_swa_args {
        kv: kv_in_rope,
        ..swa
    };
    refused_unchanged(
        &a,
        Some((&fp8, 0)),
        || unsafe { unikv_store_swa(fp8.0, &args, ptr::null_mut()) },
        "kv",
        "the pool's rows of layer 0",
    );
}
