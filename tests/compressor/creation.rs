//! The state's geometry queries and the parameters pool creation refuses.

use super::*;
use unikv::ffi::status::unikv_status;

fn get_info(
    params: &unikv_pool_params,
    layer: u32,
    c: u32,
) -> (unikv_status, unikv_compressor_info) {
    let mut info: unikv_compressor_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of_val(&info);
    let s = unsafe { unikv_pool_params_get_compressor(params, layer, c, &mut info) };
    (s, info)
}

#[test]
fn state_geometry_is_reported_before_and_after_creation() {
    let s = spec();
    for rings in [(8u32, 128u32), (16, 256)] {
        let params = state_params(&s, BF16, rings);
        let setup = Setup::new(BF16, rings);
        let mut total = [0u64; 3];
        for kind in KINDS {
            let (status, before) = get_info(&params, kind.layer, kind.compressor);
            ok(status);
            let after = setup.compressor(kind);
            let ring = if kind.ratio() == 4 { rings.0 } else { rings.1 };
            assert_eq!(after.ring, ring);
            assert_eq!(after.row_floats as usize, kind.row());
            assert_eq!(after.score_offset as usize, kind.values());
            assert_eq!(after.head_dim as usize, kind.dim());
            assert_eq!(after.compress_ratio as usize, kind.ratio());
            assert_eq!(after.num_slots, 4);
            assert_eq!(after.slot_bytes, ring as u64 * kind.row() as u64 * 4);
            assert_eq!(after.bytes, 4 * after.slot_bytes);
            assert_eq!(
                after.offset_bytes,
                if kind == CSA_INDEXER { total[1] } else { 0 }
            );
            total[kind.layer as usize] += after.bytes;
            let layer = setup.pool.layer(kind.layer);
            assert_eq!(
                after.state as usize,
                layer.state_data as usize + after.offset_bytes as usize
            );
            assert!(before.state.is_null());
            assert_eq!(
                (
                    before.offset_bytes,
                    before.bytes,
                    before.slot_bytes,
                    before.ring,
                    before.row_floats
                ),
                (
                    after.offset_bytes,
                    after.bytes,
                    after.slot_bytes,
                    after.ring,
                    after.row_floats
                )
            );
        }
        for layer in 0..3u32 {
            let mut from_params: unikv_pool_layer_info = unsafe { std::mem::zeroed() };
            from_params.struct_size = std::mem::size_of_val(&from_params);
            ok(unsafe { unikv_pool_params_get_layer(&params, layer, &mut from_params) });
            assert_eq!(from_params.state_bytes, total[layer as usize]);
            assert!(from_params.state_data.is_null());
            let created = setup.pool.layer(layer);
            assert_eq!(created.state_bytes, total[layer as usize]);
            assert_eq!(created.state_data.is_null(), layer == 0);
        }
        let info = setup.pool.info();
        assert_eq!((info.c4_state_ring, info.c128_state_ring), rings);
        fails(
            get_info(&params, 0, 0).0,
            UNIKV_INVALID_ARGUMENT,
            "compressor",
        );
        fails(
            get_info(&params, HCA, 1).0,
            UNIKV_INVALID_ARGUMENT,
            "compressor",
        );
        fails(get_info(&params, 3, 0).0, UNIKV_OUT_OF_RANGE, "layer");
        fails(get_info(&params, CSA, 2).0, UNIKV_BAD_ENUM, "compressor");
    }
    // Without state: nothing reported, and an old caller's struct_size
    // (before the compressor fields) still creates a pool.
    let plain = s.params();
    fails(
        get_info(&plain, CSA, 0).0,
        UNIKV_INVALID_STATE,
        "compressor_state",
    );
    let old = unikv_pool_params {
        struct_size: std::mem::offset_of!(unikv_pool_params, compressor_state),
        compressor_state: 7,
        ..plain
    };
    let ctx = Ctx::cpu(1);
    let mut pool = ptr::null_mut();
    ok(unsafe { unikv_pool_create(ctx.0, &old, &mut pool) });
    let pool = Pool(pool);
    assert_eq!(pool.layer(CSA).state_bytes, 0);
    assert_eq!(pool.info().c4_state_ring, 0);
}

#[test]
fn invalid_state_parameters_are_refused_at_creation() {
    let s = spec();
    let good = state_params(&s, BF16, (8, 128));
    let ctx = Ctx::cpu(1);
    let dense_only = PoolSpec {
        ratios: vec![0, 4],
        ..spec()
    };
    let ratios4 = dense_only.ratios.clone();
    let cases: Vec<(unikv_pool_params, unikv_status, &str)> = vec![
        (
            unikv_pool_params {
                c4_state_ring: 0,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "params.c4_state_ring",
        ),
        (
            unikv_pool_params {
                c4_state_ring: 12,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "params.c4_state_ring",
        ),
        (
            unikv_pool_params {
                c128_state_ring: 0,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "params.c128_state_ring",
        ),
        (
            unikv_pool_params {
                c128_state_ring: 64,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "params.c128_state_ring",
        ),
        (
            unikv_pool_params {
                compress_ratios: ratios4.as_ptr(),
                num_layers: 2,
                c128_state_ring: 100,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "params.c128_state_ring",
        ),
        (
            unikv_pool_params {
                compressor_state: 2,
                ..good
            },
            UNIKV_BAD_ENUM,
            "params.compressor_state",
        ),
        (
            unikv_pool_params {
                reserved: 1,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "params.reserved",
        ),
        (
            unikv_pool_params {
                compressor_state: 0,
                ..good
            },
            UNIKV_INVALID_ARGUMENT,
            "params.c4_state_ring",
        ),
    ];
    for (params, status, arg) in cases {
        let mut pool = ptr::null_mut();
        fails(
            unsafe { unikv_pool_create(ctx.0, &params, &mut pool) },
            status,
            arg,
        );
        assert!(pool.is_null());
        let mut info: unikv_pool_info = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of_val(&info);
        fails(
            unsafe { unikv_pool_params_get_info(&params, &mut info) },
            status,
            arg,
        );
    }
    // A pool of dense and ratio-4 layers needs no ratio-128 ring.
    let mut pool = ptr::null_mut();
    let p = unikv_pool_params {
        compress_ratios: ratios4.as_ptr(),
        num_layers: 2,
        c128_state_ring: 0,
        ..good
    };
    ok(unsafe { unikv_pool_create(ctx.0, &p, &mut pool) });
    unsafe { unikv_pool_destroy(pool) };

    // Adopted buffers: sized by the query, NULL exactly for the dense layer.
    let sizes: Vec<usize> = (0..3)
        .map(|l| {
            let mut info: unikv_pool_layer_info = unsafe { std::mem::zeroed() };
            info.struct_size = std::mem::size_of_val(&info);
            ok(unsafe { unikv_pool_params_get_layer(&good, l, &mut info) });
            info.state_bytes as usize
        })
        .collect();
    let mut bufs: Vec<Vec<u128>> = sizes.iter().map(|&b| vec![u128::MAX; b / 16]).collect();
    let mut ptrs: Vec<*mut std::ffi::c_void> =
        bufs.iter_mut().map(|b| b.as_mut_ptr().cast()).collect();
    ptrs[0] = ptr::null_mut();
    let misaligned = unsafe { (ptrs[1] as *mut u8).add(4) }.cast();
    let bad: Vec<(Vec<*mut std::ffi::c_void>, unikv_status, &str)> = vec![
        (
            vec![ptrs[1], ptrs[1], ptrs[2]],
            UNIKV_INVALID_ARGUMENT,
            "params.state_buffers[0]",
        ),
        (
            vec![ptr::null_mut(), ptr::null_mut(), ptrs[2]],
            UNIKV_NULL_ARGUMENT,
            "params.state_buffers[1]",
        ),
        (
            vec![ptr::null_mut(), misaligned, ptrs[2]],
            UNIKV_BAD_ALIGNMENT,
            "params.state_buffers[1]",
        ),
    ];
    for (table, status, arg) in bad {
        let p = unikv_pool_params {
            state_buffers: table.as_ptr(),
            ..good
        };
        let mut pool = ptr::null_mut();
        fails(
            unsafe { unikv_pool_create(ctx.0, &p, &mut pool) },
            status,
            arg,
        );
    }
    let p = unikv_pool_params {
        state_buffers: ptrs.as_ptr(),
        ..good
    };
    let mut info: unikv_compressor_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of_val(&info);
    ok(unsafe { unikv_pool_params_get_compressor(&p, CSA, 1, &mut info) });
    assert_eq!(
        info.state as usize,
        ptrs[1] as usize + info.offset_bytes as usize
    );
    let mut pool = ptr::null_mut();
    ok(unsafe { unikv_pool_create(ctx.0, &p, &mut pool) });
    let pool = Pool(pool);
    assert_eq!(pool.info().owns_memory, 1);
    assert_eq!(pool.layer(CSA).state_data, ptrs[1]);
    // Adopted memory is cleared at creation.
    for (l, b) in bufs.iter().enumerate().skip(1) {
        let floats: &[f32] = unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), b.len() * 4) };
        let row = if l == 1 { 2048 } else { 1024 };
        let kv_floats = if l == 1 { 4 * 8 * 2048 } else { floats.len() };
        for (i, x) in floats.iter().enumerate() {
            let (r, off) = if i < kv_floats {
                (row, i)
            } else {
                (512, i - kv_floats)
            };
            let want = if off % r >= r / 2 {
                f32::NEG_INFINITY
            } else {
                0.0
            };
            assert_eq!(*x, want, "layer {l} float {i}");
        }
    }
    drop(pool);
}
