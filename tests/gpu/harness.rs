//! Helpers every operation's tests share: contexts, device memory and pools on
//! either backend, attention plans, and the comparison of attention outputs.

use super::*;

pub(crate) fn small() -> bool {
    std::env::var_os("UNIKV_GPU_TEST_SMALL").is_some()
}

pub(crate) fn context(backend: u32) -> Result<Ctx, unikv::ffi::status::unikv_status> {
    let options = unikv_context_options {
        struct_size: std::mem::size_of::<unikv_context_options>(),
        backend,
        device: 0,
        cpu_threads: 0,
        validate: 0,
    };
    let mut ctx = ptr::null_mut();
    match unsafe { unikv_context_create(&options, &mut ctx) } {
        UNIKV_OK => Ok(Ctx(ctx)),
        status => Err(status),
    }
}

pub(crate) fn backend_of(ctx: &Ctx) -> u32 {
    let mut info: unikv_context_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<unikv_context_info>();
    ok(unsafe { unikv_context_get_info(ctx.0, &mut info) });
    info.backend
}

/// A CUDA context in validate mode (device values checked before each launch);
/// call only after `gpu()` found a device.
pub(crate) fn validating_gpu() -> Ctx {
    let options = unikv_context_options {
        struct_size: std::mem::size_of::<unikv_context_options>(),
        backend: 2,
        device: 0,
        cpu_threads: 0,
        validate: 1,
    };
    let mut raw = ptr::null_mut();
    ok(unsafe { unikv_context_create(&options, &mut raw) });
    Ctx(raw)
}

/// The CUDA context, or None (with a note) when this machine has no GPU.
pub(crate) fn gpu() -> Option<Ctx> {
    match context(2) {
        Ok(ctx) => Some(ctx),
        Err(status) => {
            assert_eq!(status, UNIKV_BACKEND_UNAVAILABLE, "{}", last_error());
            assert!(
                std::env::var_os("UNIKV_EXPECT_GPU").is_none(),
                "UNIKV_EXPECT_GPU is set but CUDA is unavailable: {}",
                last_error()
            );
            eprintln!("no GPU: {}", last_error());
            None
        }
    }
}

/// The FP8 flavour of a pool, None for bf16 pools.
pub(crate) fn pool_format(pool: &Pool) -> Option<Fp8Format> {
    match pool.info().kv_dtype {
        1 => None,
        7 => Some(Fp8Format::E4m3Fn),
        8 => Some(Fp8Format::E4m3Fnuz),
        d => panic!("kv_dtype {d}"),
    }
}

pub(crate) fn upload_to(ctx: &Ctx, dst: *mut c_void, bytes: &[u8]) {
    ok(unsafe {
        unikv_memory_copy(
            ctx.0,
            dst,
            bytes.as_ptr().cast(),
            bytes.len(),
            0,
            ptr::null_mut(),
        )
    });
}

/// Writes host rows into a pool layer of either backend (FP8 pools receive the
/// rows quantized on the host).
pub(crate) fn fill_layer(ctx: &Ctx, pool: &Pool, layer: u32, rows: &[bf16]) {
    let info = pool.layer(layer);
    assert_eq!(rows.len() as u64, info.rows * 512);
    let Some(fmt) = pool_format(pool) else {
        upload_to(ctx, info.data, &bytes_of(rows));
        return;
    };
    let n = info.rows as usize;
    let (mut nope, mut rope) = (vec![0u8; n * 512], vec![bf16::ZERO; n * 64]);
    for r in 0..n {
        let (nr, rr) = (&mut nope[r * 512..][..512], &mut rope[r * 64..][..64]);
        unified::quantize_row(
            &rows[r * 512..][..512],
            fmt,
            nr.try_into().unwrap(),
            rr.try_into().unwrap(),
        );
    }
    upload_to(ctx, info.data, &nope);
    upload_to(ctx, info.rope_data, &bytes_of(&rope));
}

/// A plan with its workspace; destroyed on drop.
pub(crate) struct Plan<'a> {
    pub(crate) handle: *mut c_void,
    pub(crate) ws: Option<Dev<'a>>,
    pub(crate) bytes: usize,
    pub(crate) decode: bool,
}

impl Plan<'_> {
    pub(crate) fn ws_ptr(&self) -> *mut c_void {
        self.ws.as_ref().map_or(ptr::null_mut(), |w| w.ptr)
    }

    /// What the plan chose (`unikv_*_plan_get_info`).
    pub(crate) fn info(&self) -> unikv::ffi::introspect::unikv_plan_info {
        use unikv::ffi::introspect::*;
        let mut info: unikv_plan_info = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of::<unikv_plan_info>();
        ok(unsafe {
            if self.decode {
                unikv_decode_plan_get_info(self.handle.cast(), &mut info)
            } else {
                unikv_prefill_plan_get_info(self.handle.cast(), &mut info)
            }
        });
        info
    }
}

impl Drop for Plan<'_> {
    fn drop(&mut self) {
        unsafe {
            if self.decode {
                unikv_decode_plan_destroy(self.handle.cast());
            } else {
                unikv_prefill_plan_destroy(self.handle.cast());
            }
        }
    }
}

pub(crate) fn plan(ctx: &Ctx, decode: bool, max_tokens: usize, heads: usize) -> Plan<'_> {
    plan_kv(ctx, decode, max_tokens, heads, 1)
}

/// A plan for pools of `kv_dtype` rows.
pub(crate) fn plan_kv(
    ctx: &Ctx,
    decode: bool,
    max_tokens: usize,
    heads: usize,
    kv_dtype: u32,
) -> Plan<'_> {
    let params = unikv_attention_plan_params {
        struct_size: std::mem::size_of::<unikv_attention_plan_params>(),
        max_tokens: max_tokens as u32,
        num_heads: heads as u32,
        head_dim: 512,
        q_dtype: 1,
        kv_dtype,
        out_dtype: 1,
        kv_layout: 0,
        reserved: 0,
    };
    let mut bytes = 0usize;
    let handle: *mut c_void = if decode {
        let mut p = ptr::null_mut();
        ok(unsafe { unikv_decode_plan_create(ctx.0, &params, &mut p) });
        ok(unsafe { unikv_decode_plan_workspace_size(p, &mut bytes) });
        p.cast()
    } else {
        let mut p = ptr::null_mut();
        ok(unsafe { unikv_prefill_plan_create(ctx.0, &params, &mut p) });
        ok(unsafe { unikv_prefill_plan_workspace_size(p, &mut bytes) });
        p.cast()
    };
    Plan {
        handle,
        ws: (bytes > 0).then(|| Dev::zeroed(ctx, bytes)),
        bytes,
        decode,
    }
}

/// Per (token, head): relative L2 error < 1e-2, exact zeros where the oracle
/// has zeros (empty slices), nothing left unwritten, LSE close.
pub(crate) fn compare(
    (tokens, heads): (usize, usize),
    got: &(Vec<bf16>, Vec<f32>),
    want: &(Vec<bf16>, Vec<f32>),
    what: &str,
) {
    let mut worst = 0f64;
    for t in 0..tokens {
        for h in 0..heads {
            let o = (t * heads + h) * 512;
            let (g, w) = (&got.0[o..o + 512], &want.0[o..o + 512]);
            let norm: f64 = w.iter().map(|x| (x.to_f64()).powi(2)).sum::<f64>().sqrt();
            let diff: f64 = g
                .iter()
                .zip(w)
                .map(|(a, b)| (a.to_f64() - b.to_f64()).powi(2))
                .sum::<f64>()
                .sqrt();
            assert!(
                g.iter().all(|x| x.is_finite()),
                "{what}: non-finite output at token {t} head {h}"
            );
            if norm == 0.0 {
                assert!(
                    g.iter().all(|x| x.to_f32() == 0.0),
                    "{what}: token {t} head {h} should be exact zeros"
                );
            } else if norm < 1e-30 {
                // Underflowed in the oracle's f32 arithmetic: only ~0 is meaningful.
                let max = g.iter().map(|x| x.to_f64().abs()).fold(0.0, f64::max);
                assert!(max < 1e-3, "{what}: token {t} head {h} should be ~0");
            } else {
                let rel = diff / norm;
                worst = worst.max(rel);
                assert!(
                    rel < 1e-2,
                    "{what}: token {t} head {h} relative error {rel}"
                );
            }
            let (gl, wl) = (got.1[t * heads + h], want.1[t * heads + h]);
            if wl.is_infinite() {
                assert_eq!(gl, wl, "{what}: lse of token {t} head {h}");
            } else {
                assert!(
                    (gl - wl).abs() <= 2e-3 * wl.abs().max(1.0),
                    "{what}: lse {gl} vs {wl} at token {t} head {h}"
                );
            }
        }
    }
    eprintln!("{what}: max relative error {worst:.2e}");
}

pub(crate) struct Setup {
    pub(crate) cpu: Ctx,
    pub(crate) gpu: Ctx,
}

pub(crate) fn setup() -> Option<Setup> {
    Some(Setup {
        gpu: gpu()?,
        cpu: context(1).unwrap(),
    })
}

pub(crate) fn index_pools_of(s: &Setup, kv_dtype: unikv_dtype) -> (Pool, Pool, PoolSpec) {
    let spec = PoolSpec {
        ratios: vec![0, 4, 128],
        max_requests: 6,
        window: 32,
        spec_extra: 3,
        c128_blocks: 64,
    };
    (
        Pool::of(&s.cpu, &spec, kv_dtype),
        Pool::of(&s.gpu, &spec, kv_dtype),
        spec,
    )
}
