//! Lifecycle calls: contexts, memory helpers, plans, the RoPE table builder,
//! static strings; and handle misuse right after each destroy. Pools and
//! slots are in pools.rs.

use std::ffi::CStr;
use std::os::raw::c_void;
use std::ptr;

use unikv::ffi::attention::*;
use unikv::ffi::context::*;
use unikv::ffi::rope::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::status::unikv_status::*;

use super::call::{with_struct, BF16, FP8, FP8UZ, POISON};
use super::pools::pool_info_of;
use super::{Cursor, PlanState, World};

/// Pools and plans kept alive at most (a new one past this is destroyed at once).
pub(super) const MAX_LIVE: usize = 4;

#[track_caller]
pub(super) fn expect(got: unikv_status, want: unikv_status, what: &str) {
    assert_eq!(got, want, "{what}: {}", super::last_error());
}

pub fn honest_rope_table(rows: u32) -> Vec<f32> {
    let params = unikv_rope_params {
        struct_size: std::mem::size_of::<unikv_rope_params>(),
        base: 10000.0,
        yarn: unikv_rope_yarn {
            factor: 0.0,
            original_max_position: 0,
            beta_fast: 0.0,
            beta_slow: 0.0,
        },
    };
    let mut table = vec![0f32; rows as usize * 64];
    let s = unsafe { unikv_rope_table(&params, rows, table.as_mut_ptr(), table.len()) };
    expect(s, UNIKV_OK, "harness rope table");
    table
}

pub(super) fn ctx_info(ctx: *const unikv_context) -> (unikv_status, unikv_context_info) {
    let mut info: unikv_context_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<unikv_context_info>();
    let s = unsafe { unikv_context_get_info(ctx, &mut info) };
    (s, info)
}

pub fn context_create(w: &mut World, c: &mut Cursor) {
    let mut call = w.call("unikv_context_create", true);
    call.honest_must_pass = true;
    let mut o = unikv_context_options {
        struct_size: std::mem::size_of::<unikv_context_options>(),
        backend: w.cfg.backend,
        device: 0,
        cpu_threads: 1,
        validate: c.u8() as u32 & 1,
    };
    if c.chance(60) {
        match c.below(6) {
            0 => {
                // 4 is UNIKV_BACKEND_GPU (it fails only where no GPU is found).
                o.backend = c.pick(&[5, 9, u32::MAX]);
                call.fail_because("bad backend");
            }
            1 => {
                o.backend = 3;
                call.fail_because("ROCm backend is not built");
            }
            2 => {
                o.device = c.pick(&[-1, i32::MIN]);
                call.fail_because("negative device");
            }
            3 => {
                o.cpu_threads = c.pick(&[1025, 5000, u32::MAX]);
                // The bound is the CPU backend's; GPU contexts ignore the field.
                if o.backend == 1 {
                    call.fail_because("too many threads");
                }
            }
            4 => o.cpu_threads = c.pick(&[0, 2]),
            _ => o.backend = c.pick(&[0, 1]),
        }
    }
    let null_out = c.chance(8);
    if null_out {
        call.fail_because("NULL out");
    }
    let sentinel = 0x18 as *mut unikv_context;
    let mut out = sentinel;
    let outp: *mut *mut unikv_context = if null_out { ptr::null_mut() } else { &mut out };
    let s = with_struct(c, &mut call, o, |p| unsafe {
        unikv_context_create(p, outp)
    });
    if !call.finish(s) {
        assert_eq!(out, sentinel, "context_create failed but wrote out");
        return;
    }
    let (st, info) = ctx_info(out);
    expect(st, UNIKV_OK, "get_info of a new context");
    assert!(
        info.backend == 1 || info.backend == 2,
        "backend {}",
        info.backend
    );
    if info.backend == 1 && o.cpu_threads > 0 {
        assert_eq!(info.cpu_threads, o.cpu_threads, "cpu_threads");
    }
    assert_eq!(info.validate, (o.validate != 0) as u32, "validate");
    // Harness buffers live in the memory of the configured backend: a
    // context of another backend (a CPU one in a CUDA run) could only be
    // handed memory it cannot reach.
    if w.ctxs.len() >= 3 || info.backend != w.cfg.backend {
        unsafe { unikv_context_destroy(out) };
        return;
    }
    let validates = info.backend == 1 || o.validate != 0;
    w.ctxs.push(super::CtxState { h: out, validates });
}

pub fn context_destroy(w: &mut World, c: &mut Cursor) {
    match c.below(3) {
        0 if w.ctxs.len() > 1 => {
            let x = w.ctxs.remove(c.range(1, w.ctxs.len() - 1));
            unsafe { unikv_context_destroy(x.h) };
            // Use right after destroy, before anything new is created.
            let (s, _) = ctx_info(x.h);
            expect(s, UNIKV_INVALID_HANDLE, "get_info of a destroyed context");
            let mut p = 0x28 as *mut c_void;
            let s = unsafe { unikv_memory_alloc(x.h, 16, &mut p) };
            expect(s, UNIKV_INVALID_HANDLE, "alloc on a destroyed context");
            assert_eq!(p, 0x28 as *mut c_void);
            let s = unsafe { unikv_stream_synchronize(x.h, ptr::null_mut()) };
            expect(
                s,
                UNIKV_INVALID_HANDLE,
                "synchronize on a destroyed context",
            );
            unsafe { unikv_context_destroy(x.h) };
            assert!(
                super::last_error().contains("not a live"),
                "{}",
                super::last_error()
            );
        }
        1 => {
            // Destroying something that is not a context leaves it alone.
            if let Some(p) = w.pools.first() {
                unsafe { unikv_context_destroy(p.h.cast()) };
                assert!(!super::last_error().is_empty());
                expect(
                    pool_info_of(p.h).0,
                    UNIKV_OK,
                    "a pool after context_destroy(pool)",
                );
            } else {
                unsafe { unikv_context_destroy(w.scratch.as_ptr() as *mut _) };
                assert!(w.scratch.iter().all(|x| *x == 0));
            }
        }
        _ => unsafe { unikv_context_destroy(ptr::null_mut()) },
    }
}

pub fn context_info(w: &mut World, c: &mut Cursor) {
    let mut call = w.call("unikv_context_get_info", true);
    call.honest_must_pass = true;
    let x = w.pick_ctx(c).h;
    let h = w.handle(c, &mut call, x.cast());
    info_call(c, &mut call, |p| unsafe {
        unikv_context_get_info(h.cast(), p)
    });
}

/// An info-struct call: the struct sits in a poisoned buffer 4096 bytes
/// longer than it, with an honest or odd `struct_size`; the library writes
/// at most min(struct_size, its size) bytes and nothing on error.
pub(super) fn info_call<T>(
    c: &mut Cursor,
    call: &mut super::Call,
    f: impl FnOnce(*mut T) -> unikv_status,
) -> Option<Vec<u8>> {
    let ours = std::mem::size_of::<T>();
    let mut buf = vec![POISON; ours + 4096];
    let mut size = ours;
    if c.chance(20) {
        size = c.pick(&[
            0,
            4,
            7,
            8,
            12,
            ours - 4,
            ours + 8,
            ours + 4096,
            ours + 5000,
            usize::MAX,
        ]);
    }
    if size < 8 {
        call.fail_because(format!("info.struct_size {size}"));
    }
    buf[..8].copy_from_slice(&size.to_ne_bytes());
    let null = c.chance(6);
    if null {
        call.fail_because("NULL info");
    }
    let before = buf.clone();
    let p: *mut T = if null {
        ptr::null_mut()
    } else {
        buf.as_mut_ptr().cast()
    };
    let s = f(p);
    if !call.finish(s) {
        assert!(buf == before, "{}: failed but wrote info", call.name);
        return None;
    }
    let n = size.min(ours);
    assert!(
        buf[n..] == before[n..],
        "{}: wrote past struct_size {size}",
        call.name
    );
    (size >= ours).then_some(buf)
}

pub(super) fn read<T: Copy>(buf: &[u8]) -> T {
    unsafe { ptr::read_unaligned(buf.as_ptr().cast()) }
}

pub fn memory(w: &mut World, c: &mut Cursor) {
    let ctx = w.pick_ctx(c).h;
    let mem = w.mem;
    match c.below(6) {
        0 | 1 => {
            let mut call = w.call("unikv_memory_alloc", true);
            call.honest_must_pass = true;
            let h = w.handle(c, &mut call, ctx.cast());
            let mut bytes = c.below(4097);
            if c.chance(40) {
                bytes = c.pick(&[
                    usize::MAX,
                    isize::MAX as usize,
                    isize::MAX as usize + 1,
                    usize::MAX - 255,
                ]);
                call.fail_because("allocation past the address space");
            }
            let null = c.chance(10);
            if null {
                call.fail_because("NULL out");
            }
            let mut out = 0x38 as *mut c_void;
            let outp: *mut *mut c_void = if null { ptr::null_mut() } else { &mut out };
            let s = unsafe { unikv_memory_alloc(h.cast(), bytes, outp) };
            if !call.finish(s) {
                assert_eq!(out, 0x38 as *mut c_void, "alloc failed but wrote out");
                return;
            }
            assert_eq!(out as usize % 256, 0, "allocation not 256-byte aligned");
            let zeros = mem.download(out.cast(), bytes);
            assert!(zeros.iter().all(|b| *b == 0), "allocation not zeroed");
            // Interior and double frees are refused; the real free works once.
            let s = unsafe { unikv_memory_free(h.cast(), out.cast::<u8>().add(16).cast()) };
            assert_ne!(s, UNIKV_OK, "free of an interior pointer");
            expect(
                unsafe { unikv_memory_free(h.cast(), out) },
                UNIKV_OK,
                "free",
            );
            let s = unsafe { unikv_memory_free(h.cast(), out) };
            assert_ne!(s, UNIKV_OK, "double free");
        }
        2 => {
            let mut call = w.call("unikv_memory_free", true);
            let h = w.handle(c, &mut call, ctx.cast());
            let p: *mut c_void = match c.below(3) {
                0 => ptr::null_mut(),
                1 => {
                    call.fail_because("host pointer");
                    w.scratch.as_ptr() as *mut c_void
                }
                _ => {
                    call.fail_because("garbage pointer");
                    0x1000 as *mut c_void
                }
            };
            let s = unsafe { unikv_memory_free(h.cast(), p) };
            call.finish(s);
        }
        3 => {
            let mut call = w.call("unikv_memory_copy", true);
            call.honest_must_pass = true;
            let h = w.handle(c, &mut call, ctx.cast());
            let n = c.range(1, 256);
            let a = mem.alloc(n);
            let b = mem.alloc(n);
            let src: Vec<u8> = (0..n).map(|i| (i as u8) ^ 0x5A).collect();
            let mut host = vec![POISON; n];
            let mut kind = c.below(3) as u32;
            let mut bytes = c.range(0, n);
            let (mut dst, mut srcp): (*mut c_void, *const c_void) = match kind {
                0 => (a.cast(), src.as_ptr().cast()),
                1 => (host.as_mut_ptr().cast(), a.cast_const().cast()),
                _ => (b.cast(), a.cast_const().cast()),
            };
            if c.chance(50) {
                match c.below(3) {
                    0 => {
                        kind = c.pick(&[3, 7, u32::MAX]);
                        call.fail_because("bad copy kind");
                    }
                    1 if bytes > 0 => {
                        dst = ptr::null_mut();
                        call.fail_because("NULL dst");
                    }
                    2 if bytes > 0 => {
                        srcp = ptr::null();
                        call.fail_because("NULL src");
                    }
                    _ => bytes = 0,
                }
            }
            let s = unsafe { unikv_memory_copy(h.cast(), dst, srcp, bytes, kind, ptr::null_mut()) };
            let ok = call.finish(s);
            if ok && kind == 0 {
                assert!(mem.download(a, n)[..bytes] == src[..bytes], "H2D copy");
            }
            if ok && kind == 1 {
                let _ = unsafe { unikv_stream_synchronize(w.mem.ctx, ptr::null_mut()) };
                assert!(
                    host[..bytes].iter().all(|x| *x == 0)
                        && host[bytes..].iter().all(|x| *x == POISON),
                    "D2H copy"
                );
            }
            mem.free(a);
            mem.free(b);
        }
        4 => {
            let mut call = w.call("unikv_memory_set", true);
            call.honest_must_pass = true;
            let h = w.handle(c, &mut call, ctx.cast());
            let n = c.range(1, 256);
            let a = mem.alloc(n);
            let bytes = c.range(0, n);
            let value = c.u8();
            let mut p = a;
            if c.chance(40) && bytes > 0 {
                p = ptr::null_mut();
                call.fail_because("NULL ptr");
            }
            let s = unsafe { unikv_memory_set(h.cast(), p.cast(), value, bytes, ptr::null_mut()) };
            if call.finish(s) {
                let got = mem.download(a, n);
                assert!(
                    got[..bytes].iter().all(|x| *x == value)
                        && got[bytes..].iter().all(|x| *x == 0),
                    "memset"
                );
            }
            mem.free(a);
        }
        _ => {
            let mut call = w.call("unikv_stream_synchronize", true);
            call.honest_must_pass = true;
            let h = w.handle(c, &mut call, ctx.cast());
            let s = unsafe { unikv_stream_synchronize(h.cast(), ptr::null_mut()) };
            call.finish(s);
        }
    }
}

pub fn plan_create(w: &mut World, c: &mut Cursor) {
    let prefill = c.chance(128);
    let mut call = w.call(
        if prefill {
            "unikv_prefill_plan_create"
        } else {
            "unikv_decode_plan_create"
        },
        true,
    );
    call.honest_must_pass = true;
    let ci = c.below(w.ctxs.len());
    let ctx = w.ctxs[ci].h;
    let h = w.handle(c, &mut call, ctx.cast());
    let pool_dtype = w.pools.first().map_or(BF16, |p| p.dtype);
    let mut pp = unikv_attention_plan_params {
        struct_size: std::mem::size_of::<unikv_attention_plan_params>(),
        max_tokens: c.range(1, 6) as u32,
        num_heads: c.pick(&[1, 2, 3, 4, 8, 16]),
        head_dim: 512,
        q_dtype: BF16,
        kv_dtype: if c.chance(200) {
            pool_dtype
        } else {
            c.pick(&[BF16, FP8, FP8UZ])
        },
        out_dtype: BF16,
        kv_layout: 0,
        reserved: 0,
    };
    if c.chance(50) {
        match c.below(6) {
            0 => pp.max_tokens = 0,
            1 => pp.num_heads = c.pick(&[0, 129, u32::MAX]),
            2 => pp.head_dim = c.pick(&[0, 128, 256, 513]),
            3 => pp.q_dtype = c.pick(&[0, 2, 3, 7, 99]),
            4 => pp.kv_dtype = c.pick(&[0, 2, 3, 4, 6, 99]),
            _ => pp.out_dtype = c.pick(&[0, 2, 3, 99]),
        }
        call.fail_because("bad plan params");
    }
    let null_out = c.chance(6);
    if null_out {
        call.fail_because("NULL out");
    }
    let sentinel = 0x58 as *mut c_void;
    let mut out = sentinel;
    let outp: *mut *mut c_void = if null_out { ptr::null_mut() } else { &mut out };
    let s = with_struct(c, &mut call, pp, |p| unsafe {
        if prefill {
            unikv_prefill_plan_create(h.cast(), p, outp.cast())
        } else {
            unikv_decode_plan_create(h.cast(), p, outp.cast())
        }
    });
    if !call.finish(s) {
        assert_eq!(out, sentinel, "plan_create failed but wrote out");
        return;
    }
    let mut ws = usize::MAX;
    let s = unsafe {
        if prefill {
            unikv_prefill_plan_workspace_size(out.cast(), &mut ws)
        } else {
            unikv_decode_plan_workspace_size(out.cast(), &mut ws)
        }
    };
    expect(s, UNIKV_OK, "workspace size of a new plan");
    assert!(ws < 1 << 30, "workspace of {ws} bytes");
    let plan = PlanState {
        h: out,
        prefill,
        ctx,
        max_tokens: pp.max_tokens,
        heads: pp.num_heads,
        kv_dtype: pp.kv_dtype,
        workspace: if ws > 0 {
            w.mem.alloc(ws)
        } else {
            ptr::null_mut()
        },
        ws_bytes: ws,
    };
    if !plan.workspace.is_null() {
        w.owned.push(plan.workspace);
    }
    if w.plans.len() >= MAX_LIVE {
        destroy_plan(&plan);
    } else {
        w.plans.push(plan);
    }
}

fn destroy_plan(p: &PlanState) {
    unsafe {
        if p.prefill {
            unikv_prefill_plan_destroy(p.h.cast());
        } else {
            unikv_decode_plan_destroy(p.h.cast());
        }
    }
}

pub(super) fn workspace_of(p: *mut c_void, prefill: bool, out: *mut usize) -> unikv_status {
    unsafe {
        if prefill {
            unikv_prefill_plan_workspace_size(p.cast(), out)
        } else {
            unikv_decode_plan_workspace_size(p.cast(), out)
        }
    }
}

pub fn plan_destroy(w: &mut World, c: &mut Cursor) {
    if w.plans.is_empty() {
        unsafe { unikv_decode_plan_destroy(ptr::null_mut()) };
        unsafe { unikv_prefill_plan_destroy(ptr::null_mut()) };
        return;
    }
    let i = c.below(w.plans.len());
    if c.chance(80) {
        // The other kind's destroy leaves the plan alone.
        let p = &w.plans[i];
        unsafe {
            if p.prefill {
                unikv_decode_plan_destroy(p.h.cast());
            } else {
                unikv_prefill_plan_destroy(p.h.cast());
            }
        }
        let mut b = 0;
        expect(
            workspace_of(p.h, p.prefill, &mut b),
            UNIKV_OK,
            "plan after the wrong destroy",
        );
        return;
    }
    let p = w.plans.remove(i);
    destroy_plan(&p);
    let mut b = 99usize;
    expect(
        workspace_of(p.h, p.prefill, &mut b),
        UNIKV_INVALID_HANDLE,
        "workspace of a destroyed plan",
    );
    assert_eq!(b, 99);
    destroy_plan(&p);
    assert!(
        super::last_error().contains("not a live"),
        "{}",
        super::last_error()
    );
}

pub fn workspace_size(w: &mut World, c: &mut Cursor) {
    if w.plans.is_empty() {
        c.u8();
        return;
    }
    let i = c.below(w.plans.len());
    let (h0, prefill) = (w.plans[i].h, w.plans[i].prefill);
    let mut call = w.call("unikv_plan_workspace_size", true);
    call.honest_must_pass = true;
    let h = w.handle(c, &mut call, h0);
    let wrong_kind = c.chance(20);
    // Valid exactly when `h` is a live plan of the function's kind (a
    // substituted handle of the other kind meets the other function).
    let kind = prefill ^ wrong_kind;
    let target = w.plans.iter().find(|p| p.h == h && p.prefill == kind);
    call.must_fail = None;
    if target.is_none() {
        call.fail_because("not a live plan of the function's kind");
    }
    let ws = target.map_or(0, |p| p.ws_bytes);
    let null = c.chance(10);
    if null {
        call.fail_because("NULL bytes");
    }
    let mut b = 0x5555usize;
    let bp: *mut usize = if null { ptr::null_mut() } else { &mut b };
    let s = workspace_of(h, kind, bp);
    if call.finish(s) {
        assert_eq!(b, ws, "workspace size changed");
    } else {
        assert_eq!(b, 0x5555);
    }
}

pub fn rope_table(w: &mut World, c: &mut Cursor) {
    let mut call = w.call("unikv_rope_table", true);
    call.honest_must_pass = true;
    let yarn = c.chance(128);
    let mut p = unikv_rope_params {
        struct_size: std::mem::size_of::<unikv_rope_params>(),
        base: c.pick(&[10000.0, 40000.0, 1.5]),
        yarn: unikv_rope_yarn {
            factor: if yarn { c.pick(&[4.0, 16.0, 0.5]) } else { 0.0 },
            original_max_position: c.pick(&[64, 4096]),
            beta_fast: 32.0,
            beta_slow: 1.0,
        },
    };
    let mut max_pos = c.range(1, 64) as u32;
    let mut len = max_pos as usize * 64 + c.below(3) * 8;
    if c.chance(60) {
        match c.below(7) {
            0 => p.base = c.pick(&[f64::NAN, 1.0, 0.0, -5.0, f64::INFINITY]),
            1 => p.yarn.factor = c.pick(&[-1.0, f64::NAN, f64::INFINITY]),
            2 if yarn => p.yarn.original_max_position = 0,
            3 if yarn => (p.yarn.beta_fast, p.yarn.beta_slow) = (1.0, 32.0),
            4 if yarn => p.yarn.beta_slow = c.pick(&[0.0, -1.0, f64::NAN]),
            5 => max_pos = 0,
            _ => {
                len = c.below(max_pos as usize * 64);
                if c.chance(60) {
                    max_pos = u32::MAX;
                }
            }
        }
        call.fail_because("bad rope parameters");
    }
    let mut table = vec![f32::from_bits(0xA5A5_A5A5); len + 1];
    let mut tp = table.as_mut_ptr();
    match c.below(12) {
        0 => {
            tp = ptr::null_mut();
            call.fail_because("NULL table");
        }
        1 => {
            tp = unsafe { tp.cast::<u8>().add(2) }.cast();
            call.fail_because("misaligned table");
        }
        _ => {}
    }
    let before = table.clone();
    let s = with_struct(c, &mut call, p, |pp| unsafe {
        unikv_rope_table(pp, max_pos, tp, len)
    });
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    if !call.finish(s) {
        assert!(
            same(&table, &before),
            "rope_table failed but wrote the table"
        );
        return;
    }
    let n = max_pos as usize * 64;
    assert!(
        table[..n].iter().all(|v| v.is_finite()),
        "non-finite rope table entry"
    );
    assert!(
        same(&table[n..], &before[n..]),
        "rope_table wrote past max_pos rows"
    );
}

pub fn misc(_w: &mut World, c: &mut Cursor) {
    let code = if c.chance(128) {
        c.below(20) as u32
    } else {
        c.u32()
    };
    let s = unsafe { CStr::from_ptr(unikv::ffi::unikv_status_string(code)) };
    assert!(!s.to_bytes().is_empty(), "empty status string for {code}");
    assert_eq!(unikv::ffi::version::unikv_version(), 1000);
    let v = unsafe { CStr::from_ptr(unikv::ffi::version::unikv_version_string()) };
    assert_eq!(v.to_bytes(), b"0.1.0");
    let _ = super::last_error();
}

/// An honest plan of `ctx` for pools of `kv_dtype`.
pub fn honest_plan(
    w: &mut World,
    c: &mut Cursor,
    ctx: *mut unikv_context,
    prefill: bool,
    kv_dtype: u32,
) {
    let pp = unikv_attention_plan_params {
        struct_size: std::mem::size_of::<unikv_attention_plan_params>(),
        max_tokens: c.range(1, 4) as u32,
        num_heads: c.pick(&[1, 2, 16, 3]),
        head_dim: 512,
        q_dtype: BF16,
        kv_dtype,
        out_dtype: BF16,
        kv_layout: 0,
        reserved: 0,
    };
    let mut out: *mut c_void = ptr::null_mut();
    let outp: *mut *mut c_void = &mut out;
    let s = unsafe {
        if prefill {
            unikv_prefill_plan_create(ctx, &pp, outp.cast())
        } else {
            unikv_decode_plan_create(ctx, &pp, outp.cast())
        }
    };
    expect(s, UNIKV_OK, "harness plan");
    let mut ws = 0usize;
    expect(
        workspace_of(out, prefill, &mut ws),
        UNIKV_OK,
        "harness plan workspace",
    );
    let workspace = if ws > 0 {
        w.mem.alloc(ws)
    } else {
        ptr::null_mut()
    };
    if !workspace.is_null() {
        w.owned.push(workspace);
    }
    w.plans.push(PlanState {
        h: out,
        prefill,
        ctx,
        max_tokens: pp.max_tokens,
        heads: pp.num_heads,
        kv_dtype,
        workspace,
        ws_bytes: ws,
    });
}
