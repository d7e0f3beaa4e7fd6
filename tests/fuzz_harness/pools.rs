//! Pools (allocated and adopted, bf16 and both FP8 flavours, hostile
//! parameters), their accessors, and slots against the shadow model (the
//! lowest free slot first); misuse of a pool right after its destroy.

use std::os::raw::c_void;
use std::ptr;

use unikv::ffi::pool::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::status::unikv_status::*;

use super::call::{with_struct, BF16, FP8, FP8UZ};
use super::lifecycle::{ctx_info, expect, info_call, read, workspace_of, MAX_LIVE};
use super::{Cursor, PoolState, World};

/// Largest pool (all layers) the harness lets the library allocate.
const MAX_POOL_BYTES: u128 = 16 << 20;

pub(super) fn pool_info_of(pool: *const unikv_pool) -> (unikv_status, unikv_pool_info) {
    let mut info: unikv_pool_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<unikv_pool_info>();
    let s = unsafe { unikv_pool_get_info(pool, &mut info) };
    (s, info)
}

fn layer_of(pool: *const unikv_pool, layer: u32) -> (unikv_status, unikv_pool_layer_info) {
    let mut info: unikv_pool_layer_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<unikv_pool_layer_info>();
    let s = unsafe { unikv_pool_get_layer(pool, layer, &mut info) };
    (s, info)
}

/// Rows of each layer, or None when a layer has more than 2^31 - 1 rows.
fn rows_of(ratios: &[u32], r: u32, win: u32, extra: u32, c128: u32) -> Option<Vec<u128>> {
    let swa = (r as u128 + 1) * (win as u128 + extra as u128);
    let rows: Vec<u128> = ratios
        .iter()
        .map(|&ratio| {
            swa + match ratio {
                4 => c128 as u128 * 32 + 64,
                128 => c128 as u128 + 2,
                _ => 0,
            }
        })
        .collect();
    rows.iter().all(|&n| n <= i32::MAX as u128).then_some(rows)
}

pub fn pool_create(w: &mut World, c: &mut Cursor) {
    let mut call = w.call("unikv_pool_create", true);
    call.honest_must_pass = true;
    let ci = c.below(w.ctxs.len());
    let (ctx, validates) = (w.ctxs[ci].h, w.ctxs[ci].validates);
    let h = w.handle(c, &mut call, ctx.cast());
    let layers = c.range(1, 4);
    let mut ratios: Vec<u32> = (0..layers).map(|_| c.pick(&[0, 4, 128])).collect();
    let mut num_layers = layers as u32;
    let (mut r, mut win, mut extra, mut c128) = (
        c.range(1, 4) as u32,
        c.range(1, 8) as u32,
        c.below(3) as u32,
        c.below(5) as u32,
    );
    let mut dtype = c.pick(&[BF16, FP8, FP8UZ]);
    let mut null_ratios = false;
    if c.chance(50) {
        match c.below(8) {
            0 => {
                let i = c.below(layers);
                ratios[i] = c.pick(&[1, 5, 64, u32::MAX]);
                call.fail_because("bad ratio");
            }
            1 => {
                dtype = c.pick(&[0, 9, u32::MAX]);
                call.fail_because("bad dtype enum");
            }
            2 => {
                dtype = c.pick(&[2, 3, 4, 5, 6]);
                call.fail_because("unsupported pool dtype");
            }
            3 => {
                num_layers = 0;
                call.fail_because("no layers");
            }
            4 => {
                null_ratios = true;
                call.fail_because("NULL ratios");
            }
            _ => {
                let v = c.pick(&[0, u32::MAX, u32::MAX - 1, 1 << 31, 1 << 20, 1 << 26]);
                match c.below(4) {
                    0 => r = v,
                    1 => win = v,
                    2 => extra = v,
                    _ => c128 = v,
                }
                if r == 0 || win == 0 {
                    call.fail_because("zero requests or window");
                }
            }
        }
    }
    let rows = rows_of(&ratios, r, win, extra, c128);
    let fp8 = dtype == FP8 || dtype == FP8UZ;
    let row_bytes: u128 = if fp8 { 640 } else { 1024 };
    match &rows {
        None => call.fail_because("layer rows past 2^31"),
        Some(rows)
            if call.must_fail.is_none()
                && rows.iter().sum::<u128>() * row_bytes > MAX_POOL_BYTES =>
        {
            // Addressable but too large to allocate here: keep it small.
            (r, win, extra, c128) = (1, 1, 0, 0);
        }
        _ => {}
    }
    let rows = rows_of(&ratios, r, win, extra, c128).unwrap_or_else(|| vec![0; layers]);
    let adopt = c.chance(90);
    let mut data_ptrs: Vec<*mut c_void> = Vec::new();
    let mut rope_ptrs: Vec<*mut c_void> = Vec::new();
    if adopt {
        for &n in &rows {
            let n = if n * row_bytes > MAX_POOL_BYTES {
                1
            } else {
                n as usize
            };
            let (d, rp) = if fp8 {
                (n * 512, n * 128)
            } else {
                (n * 1024, 0)
            };
            let p = w.mem.alloc(d + 64);
            w.owned.push(p);
            data_ptrs.push(p.cast());
            if fp8 {
                let q = w.mem.alloc(rp + 64);
                w.owned.push(q);
                rope_ptrs.push(q.cast());
            }
        }
        if c.chance(40) {
            let i = c.below(layers);
            match c.below(4) {
                0 => {
                    data_ptrs[i] = ptr::null_mut();
                    call.fail_because("NULL layer buffer");
                }
                1 => {
                    data_ptrs[i] = unsafe { data_ptrs[i].cast::<u8>().add(8) }.cast();
                    call.fail_because("misaligned layer buffer");
                }
                2 if fp8 => {
                    rope_ptrs[i] = ptr::null_mut();
                    call.fail_because("NULL rope buffer");
                }
                _ => {
                    if fp8 {
                        rope_ptrs.clear();
                        call.fail_because("FP8 adoption without rope buffers");
                    } else {
                        rope_ptrs = vec![data_ptrs[0]; layers];
                        call.fail_because("rope buffers for a bf16 pool");
                    }
                }
            }
        }
    } else if fp8 && c.chance(10) {
        rope_ptrs = vec![w.scratch.as_ptr() as *mut c_void; layers];
        call.fail_because("rope buffers without layer buffers");
    }
    let params = unikv_pool_params {
        struct_size: std::mem::size_of::<unikv_pool_params>(),
        compress_ratios: if null_ratios {
            ptr::null()
        } else {
            ratios.as_ptr()
        },
        layer_buffers: if adopt {
            data_ptrs.as_ptr().cast()
        } else {
            ptr::null()
        },
        num_layers,
        max_requests: r,
        window: win,
        spec_extra: extra,
        c128_blocks: c128,
        kv_dtype: dtype,
        rope_buffers: if rope_ptrs.is_empty() {
            ptr::null()
        } else {
            rope_ptrs.as_ptr().cast()
        },
        compressor_state: 0,
        c4_state_ring: 0,
        c128_state_ring: 0,
        reserved: 0,
        state_buffers: ptr::null(),
    };
    let null_out = c.chance(6);
    if null_out {
        call.fail_because("NULL out");
    }
    let sentinel = 0x48 as *mut unikv_pool;
    let mut out = sentinel;
    let outp: *mut *mut unikv_pool = if null_out { ptr::null_mut() } else { &mut out };
    let s = with_struct(c, &mut call, params, |p| unsafe {
        unikv_pool_create(h.cast(), p, outp)
    });
    if !call.finish(s) {
        assert_eq!(out, sentinel, "pool_create failed but wrote out");
        return;
    }
    let (st, info) = pool_info_of(out);
    expect(st, UNIKV_OK, "info of a new pool");
    assert_eq!(
        (
            info.num_layers,
            info.max_requests,
            info.window,
            info.ring,
            info.c128_blocks
        ),
        (layers as u32, r, win, win + extra, c128),
        "pool geometry"
    );
    assert_eq!(
        (info.slots_in_use, info.kv_dtype, info.owns_memory),
        (0, dtype, !adopt as u32)
    );
    assert_eq!(info.row_bytes as u128, row_bytes);
    for (l, &n) in rows.iter().enumerate() {
        let (st, li) = layer_of(out, l as u32);
        expect(st, UNIKV_OK, "layer info");
        assert_eq!(
            (li.rows as u128, li.compress_ratio),
            (n, ratios[l]),
            "layer {l}"
        );
        if adopt {
            assert_eq!(li.data, data_ptrs[l], "adopted buffer");
        }
        assert_eq!(li.rope_data.is_null(), !fp8);
    }
    let state = PoolState {
        h: out,
        validates,
        ctx,
        ratios,
        max_requests: r,
        window: win,
        spec_extra: extra,
        c128_blocks: c128,
        dtype,
        slots: Default::default(),
    };
    if w.pools.len() >= MAX_LIVE {
        unsafe { unikv_pool_destroy(out) };
    } else {
        w.pools.push(state);
    }
}

pub fn pool_destroy(w: &mut World, c: &mut Cursor) {
    match c.below(3) {
        0 if !w.pools.is_empty() => {
            let p = w.pools.remove(c.below(w.pools.len()));
            w.memo = None;
            unsafe { unikv_pool_destroy(p.h) };
            expect(
                pool_info_of(p.h).0,
                UNIKV_INVALID_HANDLE,
                "info of a destroyed pool",
            );
            let mut slot = 77u32;
            let s = unsafe { unikv_pool_acquire_slot(p.h, &mut slot) };
            expect(s, UNIKV_INVALID_HANDLE, "acquire on a destroyed pool");
            assert_eq!(slot, 77);
            let s = unsafe { unikv_pool_release_slot(p.h, 1) };
            expect(s, UNIKV_INVALID_HANDLE, "release on a destroyed pool");
            expect(
                layer_of(p.h, 0).0,
                UNIKV_INVALID_HANDLE,
                "layer of a destroyed pool",
            );
            unsafe { unikv_pool_destroy(p.h) };
            assert!(
                super::last_error().contains("not a live"),
                "{}",
                super::last_error()
            );
        }
        1 => {
            // A context or plan passed to pool_destroy stays alive.
            let x = w.ctxs[c.below(w.ctxs.len())].h;
            unsafe { unikv_pool_destroy(x.cast()) };
            assert!(!super::last_error().is_empty());
            expect(ctx_info(x).0, UNIKV_OK, "a context after pool_destroy(ctx)");
            if let Some(p) = w.plans.first() {
                unsafe { unikv_pool_destroy(p.h.cast()) };
                let mut b = 0usize;
                let s = workspace_of(p.h, p.prefill, &mut b);
                expect(s, UNIKV_OK, "a plan after pool_destroy(plan)");
            }
        }
        _ => unsafe { unikv_pool_destroy(ptr::null_mut()) },
    }
}

pub fn pool_info(w: &mut World, c: &mut Cursor) {
    let Some(i) = w.pick_pool(c) else { return };
    let h0 = w.pools[i].h;
    if c.chance(128) {
        let mut call = w.call("unikv_pool_get_info", true);
        call.honest_must_pass = true;
        let h = w.handle(c, &mut call, h0.cast());
        if let Some(buf) = info_call(c, &mut call, |p| unsafe {
            unikv_pool_get_info(h.cast(), p)
        }) {
            let info: unikv_pool_info = read(&buf);
            let p = &w.pools[i];
            assert_eq!(
                info.slots_in_use as usize,
                p.slots.len(),
                "slots_in_use vs shadow"
            );
            assert_eq!(info.swa_rows as usize, p.swa_rows());
        }
    } else {
        let mut call = w.call("unikv_pool_get_layer", true);
        call.honest_must_pass = true;
        let h = w.handle(c, &mut call, h0.cast());
        let n = w.pools[i].ratios.len() as u32;
        let mut layer = c.below(n as usize) as u32;
        if c.chance(30) {
            layer = c.pick(&[n, n + 1, u32::MAX]);
            call.fail_because("layer past the pool");
        }
        if let Some(buf) = info_call(c, &mut call, |p| unsafe {
            unikv_pool_get_layer(h.cast(), layer, p)
        }) {
            let li: unikv_pool_layer_info = read(&buf);
            let p = &w.pools[i];
            assert_eq!(li.rows as usize, p.rows(layer as usize));
            assert_eq!(
                li.compressed_rows as usize,
                p.compressed(p.ratios[layer as usize])
            );
        }
    }
}

pub fn acquire(w: &mut World, c: &mut Cursor) {
    let Some(i) = w.pick_pool(c) else { return };
    let mut call = w.call("unikv_pool_acquire_slot", true);
    let h = w.handle(c, &mut call, w.pools[i].h.cast());
    let null = c.chance(8);
    if null {
        call.fail_because("NULL slot");
    }
    let mut slot = 0xFFFF_FFFFu32;
    let sp: *mut u32 = if null { ptr::null_mut() } else { &mut slot };
    let s = unsafe { unikv_pool_acquire_slot(h.cast(), sp) };
    let honest = call.must_fail.is_none();
    let ok = call.finish(s);
    let p = &mut w.pools[i];
    let want = (1..=p.max_requests).find(|s| !p.slots.contains(s));
    if !honest {
        assert!(!ok);
        assert_eq!(slot, 0xFFFF_FFFF, "acquire failed but wrote slot");
        return;
    }
    match want {
        Some(want) => {
            expect(s, UNIKV_OK, "acquire with free slots");
            assert_eq!(slot, want, "acquire: not the lowest free slot");
            p.slots.insert(want);
        }
        None => {
            expect(s, UNIKV_CAPACITY_EXCEEDED, "acquire on a full pool");
            assert_eq!(slot, 0xFFFF_FFFF);
        }
    }
}

pub fn release(w: &mut World, c: &mut Cursor) {
    let Some(i) = w.pick_pool(c) else { return };
    let mut call = w.call("unikv_pool_release_slot", true);
    let h = w.handle(c, &mut call, w.pools[i].h.cast());
    let p = &w.pools[i];
    let held: Vec<u32> = p.slots.iter().copied().collect();
    let slot = match c.below(4) {
        0 | 1 if !held.is_empty() => held[c.below(held.len())],
        2 => c.pick(&[0, p.max_requests.wrapping_add(1), u32::MAX]),
        _ => c.range(1, p.max_requests as usize) as u32,
    };
    let s = unsafe { unikv_pool_release_slot(h.cast(), slot) };
    let honest = call.must_fail.is_none();
    call.finish(s);
    if !honest {
        return;
    }
    let p = &mut w.pools[i];
    let want = if slot == 0 || slot > p.max_requests {
        UNIKV_OUT_OF_RANGE
    } else if !p.slots.contains(&slot) {
        UNIKV_INVALID_STATE
    } else {
        UNIKV_OK
    };
    expect(s, want, &format!("release of slot {slot}"));
    p.slots.remove(&slot);
}

/// An honest pool on the harness context (ratios 0, 4, 128; three
/// requests, window 4), for calls that need one when none is alive.
pub fn default_pool(w: &mut World, c: &mut Cursor) {
    let ratios = vec![0u32, 4, 128];
    let dtype = c.pick(&[BF16, BF16, FP8, FP8UZ]);
    let (r, win, extra, c128) = (3, 4, c.below(2) as u32, 2);
    let params = unikv_pool_params {
        struct_size: std::mem::size_of::<unikv_pool_params>(),
        compress_ratios: ratios.as_ptr(),
        layer_buffers: ptr::null(),
        num_layers: 3,
        max_requests: r,
        window: win,
        spec_extra: extra,
        c128_blocks: c128,
        kv_dtype: dtype,
        rope_buffers: ptr::null(),
        compressor_state: 0,
        c4_state_ring: 0,
        c128_state_ring: 0,
        reserved: 0,
        state_buffers: ptr::null(),
    };
    let ctx = w.ctxs[0].h;
    let mut out = ptr::null_mut();
    let s = unsafe { unikv_pool_create(ctx, &params, &mut out) };
    expect(s, UNIKV_OK, "harness default pool");
    w.pools.push(PoolState {
        h: out,
        validates: w.ctxs[0].validates,
        ctx,
        ratios,
        max_requests: r,
        window: win,
        spec_extra: extra,
        c128_blocks: c128,
        dtype,
        slots: Default::default(),
    });
}
