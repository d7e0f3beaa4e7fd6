//! Pool geometry, the slot allocator, adopted memory, and the store path.

mod common;

use std::ptr;

use common::*;
use half::bf16;
use unikv::ffi::context::*;
use unikv::ffi::pool::*;
use unikv::ffi::store::*;

/// rows(layer) = (R + 1) * ring + B * K(ratio) + 256 / ratio, restated here.
fn expected_rows(spec: &PoolSpec, ratio: u32) -> u64 {
    let ring = (spec.window + spec.spec_extra) as u64;
    let swa = (spec.max_requests as u64 + 1) * ring;
    let b = spec.c128_blocks as u64;
    swa + match ratio {
        0 => 0,
        4 => b * 32 + 64,
        128 => b + 2,
        _ => unreachable!(),
    }
}

#[test]
fn geometry_follows_the_sizing_formula() {
    let ctx = Ctx::cpu(1);
    let spec = PoolSpec {
        ratios: vec![0, 4, 128, 4],
        max_requests: 7,
        window: 128,
        spec_extra: 3,
        c128_blocks: 100,
    };
    let pool = Pool::new(&ctx, &spec);
    let info = pool.info();
    assert_eq!(info.ring, 131);
    assert_eq!(info.swa_rows, 8 * 131);
    assert_eq!(info.row_bytes, 1024);
    assert_eq!(info.num_layers, 4);
    assert_eq!(info.owns_memory, 1);
    for (layer, &ratio) in spec.ratios.iter().enumerate() {
        let l = pool.layer(layer as u32);
        assert_eq!(l.rows, expected_rows(&spec, ratio), "layer {layer}");
        assert_eq!(l.compressed_rows, l.rows - info.swa_rows);
        assert_eq!(l.bytes, l.rows * 1024);
        assert_eq!(l.compress_ratio, ratio);
        assert_eq!(l.data as usize % 256, 0);
        // Allocated pools start zeroed.
        assert!(pool.rows_mut(layer as u32).iter().all(|x| x.to_bits() == 0));
    }
}

#[test]
fn info_structs_honour_a_smaller_struct_size() {
    let ctx = Ctx::cpu(1);
    let spec = PoolSpec {
        ratios: vec![0],
        max_requests: 2,
        window: 4,
        spec_extra: 0,
        c128_blocks: 1,
    };
    let pool = Pool::new(&ctx, &spec);
    // An older caller that only knows the first two fields.
    let mut info: unikv_pool_info = unsafe { std::mem::zeroed() };
    info.struct_size = 16;
    info.row_bytes = 0xdead;
    ok(unsafe { unikv_pool_get_info(pool.0, &mut info) });
    assert_eq!(info.struct_size, 16);
    assert_eq!(info.swa_rows, 12);
    assert_eq!(info.row_bytes, 0xdead, "bytes past struct_size untouched");
}

#[test]
fn slots_are_handed_out_once_and_slot_zero_is_reserved() {
    let ctx = Ctx::cpu(1);
    let spec = PoolSpec {
        ratios: vec![0],
        max_requests: 3,
        window: 4,
        spec_extra: 0,
        c128_blocks: 1,
    };
    let pool = Pool::new(&ctx, &spec);
    let mut got = vec![];
    for _ in 0..3 {
        let mut slot = 0;
        ok(unsafe { unikv_pool_acquire_slot(pool.0, &mut slot) });
        got.push(slot);
    }
    assert_eq!(got, [1, 2, 3]);
    assert_eq!(pool.info().slots_in_use, 3);
    let mut slot = 99;
    fails(
        unsafe { unikv_pool_acquire_slot(pool.0, &mut slot) },
        UNIKV_CAPACITY_EXCEEDED,
        "pool",
    );
    assert_eq!(slot, 99, "nothing written on error");
    ok(unsafe { unikv_pool_release_slot(pool.0, 2) });
    fails(
        unsafe { unikv_pool_release_slot(pool.0, 2) },
        UNIKV_INVALID_STATE,
        "slot",
    );
    fails(
        unsafe { unikv_pool_release_slot(pool.0, 0) },
        UNIKV_OUT_OF_RANGE,
        "slot",
    );
    fails(
        unsafe { unikv_pool_release_slot(pool.0, 4) },
        UNIKV_OUT_OF_RANGE,
        "slot",
    );
    ok(unsafe { unikv_pool_acquire_slot(pool.0, &mut slot) });
    assert_eq!(slot, 2);
}

#[test]
fn slot_allocator_is_thread_safe() {
    let ctx = Ctx::cpu(1);
    let spec = PoolSpec {
        ratios: vec![0],
        max_requests: 64,
        window: 1,
        spec_extra: 0,
        c128_blocks: 0,
    };
    let pool = Pool::new(&ctx, &spec);
    let handle = pool.0 as usize;
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let mut mine = vec![];
                for _ in 0..16 {
                    let mut slot = 0;
                    ok(unsafe { unikv_pool_acquire_slot(handle as *const unikv_pool, &mut slot) });
                    mine.push(slot);
                }
                mine
            })
        })
        .collect();
    let mut all: Vec<u32> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    all.sort_unstable();
    assert_eq!(all, (1..=64).collect::<Vec<_>>());
}

#[test]
fn adopted_buffers_are_used_in_place_and_not_freed() {
    let ctx = Ctx::cpu(1);
    let spec = PoolSpec {
        ratios: vec![128, 0],
        max_requests: 2,
        window: 8,
        spec_extra: 0,
        c128_blocks: 4,
    };
    let rows: Vec<u64> = spec
        .ratios
        .iter()
        .map(|&r| expected_rows(&spec, r))
        .collect();
    let mut buffers: Vec<*mut std::os::raw::c_void> = vec![];
    for r in &rows {
        let mut p = ptr::null_mut();
        ok(unsafe { unikv_memory_alloc(ctx.0, (*r * 1024) as usize, &mut p) });
        buffers.push(p);
    }
    let mut params = spec.params();
    params.layer_buffers = buffers.as_ptr();
    let mut handle = ptr::null_mut();
    ok(unsafe { unikv_pool_create(ctx.0, &params, &mut handle) });
    let pool = Pool(handle);
    assert_eq!(pool.info().owns_memory, 0);
    for (layer, b) in buffers.iter().enumerate() {
        assert_eq!(pool.layer(layer as u32).data, *b);
    }
    drop(pool);
    // Still ours: freeing succeeds exactly once.
    for b in buffers {
        ok(unsafe { unikv_memory_free(ctx.0, b) });
        fails(
            unsafe { unikv_memory_free(ctx.0, b) },
            UNIKV_INVALID_ARGUMENT,
            "ptr",
        );
    }
}

fn store_swa(
    pool: &Pool,
    layer: u32,
    kv: &[bf16],
    batch: &[i32],
    slots: &[i32],
    pos: &[i32],
    final_pos: Option<&[i32]>,
) {
    let args = unikv_store_swa_args {
        struct_size: std::mem::size_of::<unikv_store_swa_args>(),
        kv: tensor(kv, &[batch.len(), 512]),
        batch_id: vec1(batch),
        req_slots: vec1(slots),
        positions: vec1(pos),
        final_pos: final_pos.map_or(absent(), vec1),
        layer,
        num_tokens: batch.len() as u32,
    };
    ok(unsafe { unikv_store_swa(pool.0, &args, ptr::null_mut()) });
}

#[test]
fn store_swa_writes_the_final_window_only() {
    let mut rng = rand::rng();
    let ctx = Ctx::cpu(1);
    let spec = PoolSpec {
        ratios: vec![0, 0],
        max_requests: 2,
        window: 4,
        spec_extra: 1,
        c128_blocks: 0,
    };
    let pool = Pool::new(&ctx, &spec);
    let ring = 5usize;
    // Request 0 (slot 2): a 9-token chunk at positions 3..=11, final_pos 11.
    // Request 1 (slot 1): 2 tokens at 0, 1. A padding token at the end.
    let n = 12;
    let kv = random_bf16(&mut rng, n * 512);
    let batch: Vec<i32> = [vec![0; 9], vec![1, 1, -1]].concat();
    let pos: Vec<i32> = (3..=11).chain([0, 1, 7]).collect();
    for x in pool.rows_mut(1).iter_mut() {
        *x = bf16::from_bits(0x7fc1);
    }
    store_swa(&pool, 1, &kv, &batch, &[2, 1], &pos, Some(&[11, 1]));
    let rows = pool.rows_mut(1);
    let row = |r: usize| &rows[r * 512..(r + 1) * 512];
    let mut written = std::collections::HashSet::new();
    for (t, &p) in pos.iter().enumerate() {
        let (slot, last) = match batch[t] {
            0 => (2, 11),
            1 => (1, 1),
            _ => continue,
        };
        if p <= last - 4 {
            continue;
        }
        let r = slot * ring + p as usize % ring;
        assert_eq!(row(r), &kv[t * 512..(t + 1) * 512], "token {t}");
        written.insert(r);
    }
    assert_eq!(written.len(), 6);
    for r in 0..rows.len() / 512 {
        if !written.contains(&r) {
            assert!(
                row(r).iter().all(|x| x.to_bits() == 0x7fc1),
                "row {r} touched"
            );
        }
    }
    // Layer 0 untouched (still zero).
    assert!(pool.rows_mut(0).iter().all(|x| x.to_bits() == 0));
}

#[test]
fn store_compressed_skips_negative_locations() {
    let mut rng = rand::rng();
    let ctx = Ctx::cpu(1);
    let spec = PoolSpec {
        ratios: vec![4],
        max_requests: 1,
        window: 2,
        spec_extra: 0,
        c128_blocks: 1,
    };
    let pool = Pool::new(&ctx, &spec);
    let swa = pool.info().swa_rows as usize;
    let kv = random_bf16(&mut rng, 4 * 512);
    let loc = [3, -1, 95, 0];
    let args = unikv_store_compressed_args {
        struct_size: std::mem::size_of::<unikv_store_compressed_args>(),
        kv: tensor(&kv, &[4, 512]),
        loc: vec1(&loc),
        layer: 0,
        num_rows: 4,
    };
    ok(unsafe { unikv_store_compressed(pool.0, &args, ptr::null_mut()) });
    let rows = pool.rows_mut(0);
    for (i, &l) in loc.iter().enumerate() {
        if l >= 0 {
            let r = swa + l as usize;
            assert_eq!(&rows[r * 512..(r + 1) * 512], &kv[i * 512..(i + 1) * 512]);
        }
    }
    let nonzero_rows = rows
        .chunks(512)
        .filter(|r| r.iter().any(|x| x.to_bits() != 0))
        .count();
    assert_eq!(nonzero_rows, 3);
    // Row 96 is past the 32 + 64 compressed rows of a ratio-4 layer with one block.
    let loc = [96, 0, 0, 0];
    let args = unikv_store_compressed_args {
        loc: vec1(&loc),
        ..args
    };
    let before = bytes_of(rows);
    fails(
        unsafe { unikv_store_compressed(pool.0, &args, ptr::null_mut()) },
        UNIKV_OUT_OF_RANGE,
        "loc[0]",
    );
    assert_eq!(bytes_of(pool.rows_mut(0)), before);
}

#[test]
fn context_reports_its_backend() {
    for backend in [0, 1] {
        let options = unikv_context_options {
            struct_size: std::mem::size_of::<unikv_context_options>(),
            backend,
            device: 0,
            cpu_threads: 3,
            validate: 1,
        };
        let mut ctx = ptr::null_mut();
        ok(unsafe { unikv_context_create(&options, &mut ctx) });
        let mut info: unikv_context_info = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of::<unikv_context_info>();
        ok(unsafe { unikv_context_get_info(ctx, &mut info) });
        assert_eq!(info.backend, 1, "auto without a GPU backend is the CPU");
        assert_eq!(info.cpu_threads, 3);
        assert_eq!(info.validate, 1);
        unsafe { unikv_context_destroy(ctx) };
    }
    let options = unikv_context_options {
        struct_size: std::mem::size_of::<unikv_context_options>(),
        backend: 2,
        device: 0,
        cpu_threads: 0,
        validate: 0,
    };
    let mut ctx = ptr::null_mut();
    fails(
        unsafe { unikv_context_create(&options, &mut ctx) },
        UNIKV_BACKEND_UNAVAILABLE,
        "backend",
    );
    assert!(ctx.is_null());
}

#[test]
fn memory_helpers_copy_and_set() {
    let ctx = Ctx::cpu(1);
    let mut p = ptr::null_mut();
    ok(unsafe { unikv_memory_alloc(ctx.0, 64, &mut p) });
    let src: Vec<u8> = (0..64).collect();
    ok(unsafe { unikv_memory_copy(ctx.0, p, src.as_ptr().cast(), 64, 0, ptr::null_mut()) });
    ok(unsafe { unikv_memory_set(ctx.0, p.cast::<u8>().add(8).cast(), 7, 8, ptr::null_mut()) });
    let mut back = vec![0u8; 64];
    ok(unsafe { unikv_memory_copy(ctx.0, back.as_mut_ptr().cast(), p, 64, 1, ptr::null_mut()) });
    ok(unsafe { unikv_stream_synchronize(ctx.0, ptr::null_mut()) });
    let mut want = src.clone();
    want[8..16].fill(7);
    assert_eq!(back, want);
    fails(
        unsafe { unikv_memory_copy(ctx.0, back.as_mut_ptr().cast(), p, 64, 9, ptr::null_mut()) },
        UNIKV_BAD_ENUM,
        "kind",
    );
    ok(unsafe { unikv_memory_free(ctx.0, p) });
    ok(unsafe { unikv_memory_free(ctx.0, ptr::null_mut()) });
}

#[test]
fn store_swa_refuses_rows_that_alias_in_the_ring() {
    let mut rng = rand::rng();
    let ctx = Ctx::cpu(1);
    let spec = PoolSpec {
        ratios: vec![0],
        max_requests: 1,
        window: 4,
        spec_extra: 0,
        c128_blocks: 0,
    };
    let pool = Pool::new(&ctx, &spec);
    let kv = random_bf16(&mut rng, 8 * 512);
    let batch = [0; 8];
    let pos: Vec<i32> = (0..8).collect();
    let args = unikv_store_swa_args {
        struct_size: std::mem::size_of::<unikv_store_swa_args>(),
        kv: tensor(&kv, &[8, 512]),
        batch_id: vec1(&batch),
        req_slots: vec1(&[1]),
        positions: vec1(&pos),
        final_pos: absent(),
        layer: 0,
        num_tokens: 8,
    };
    let before = bytes_of(pool.rows_mut(0));
    fails(
        unsafe { unikv_store_swa(pool.0, &args, ptr::null_mut()) },
        UNIKV_INVALID_ARGUMENT,
        "positions[4]",
    );
    assert_eq!(bytes_of(pool.rows_mut(0)), before);
    // With the final window filter only positions 4..7 are written.
    let last = [7];
    let args = unikv_store_swa_args {
        final_pos: vec1(&last),
        ..args
    };
    ok(unsafe { unikv_store_swa(pool.0, &args, ptr::null_mut()) });
}
