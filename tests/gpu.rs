//! The CUDA backend against the CPU backend (the oracle), through the C ABI.
//! Without a usable GPU only `auto_context_falls_back_to_cpu` runs; set
//! UNIKV_EXPECT_GPU=1 to make a missing GPU a failure. UNIKV_GPU_TEST_SMALL=1
//! shrinks the shapes for compute-sanitizer runs.
#![cfg(all(feature = "cuda", feature = "devtools"))]

mod common;
#[path = "gpu/indexer.rs"]
mod indexer;
#[path = "gpu/routing.rs"]
mod routing;

use std::os::raw::c_void;
use std::ptr;

use common::*;
use half::bf16;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;
use unikv::cache_layouts::unified;
use unikv::ffi::attention::*;
use unikv::ffi::context::*;
use unikv::ffi::index::*;
use unikv::ffi::store::*;
use unikv::ffi::types::{unikv_dtype, unikv_tensor};
use unikv::fp8::Fp8Format;

fn small() -> bool {
    std::env::var_os("UNIKV_GPU_TEST_SMALL").is_some()
}

fn context(backend: u32) -> Result<Ctx, unikv::ffi::status::unikv_status> {
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

fn backend_of(ctx: &Ctx) -> u32 {
    let mut info: unikv_context_info = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<unikv_context_info>();
    ok(unsafe { unikv_context_get_info(ctx.0, &mut info) });
    info.backend
}

/// A CUDA context in validate mode (device values checked before each launch);
/// call only after `gpu()` found a device.
fn validating_gpu() -> Ctx {
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
fn gpu() -> Option<Ctx> {
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

#[test]
fn auto_context_falls_back_to_cpu() {
    let auto = context(0).expect("auto context");
    match context(2) {
        Ok(_) => assert_eq!(
            backend_of(&auto),
            2,
            "auto must pick the GPU when one is present"
        ),
        Err(status) => {
            assert_eq!(status, UNIKV_BACKEND_UNAVAILABLE);
            assert!(last_error().contains("backend"), "{}", last_error());
            assert_eq!(
                backend_of(&auto),
                1,
                "auto without a GPU is the CPU backend"
            );
        }
    }
}

/// The FP8 flavour of a pool, None for bf16 pools.
fn pool_format(pool: &Pool) -> Option<Fp8Format> {
    match pool.info().kv_dtype {
        1 => None,
        7 => Some(Fp8Format::E4m3Fn),
        8 => Some(Fp8Format::E4m3Fnuz),
        d => panic!("kv_dtype {d}"),
    }
}

fn upload_to(ctx: &Ctx, dst: *mut c_void, bytes: &[u8]) {
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
fn fill_layer(ctx: &Ctx, pool: &Pool, layer: u32, rows: &[bf16]) {
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

fn download(ctx: &Ctx, src: *mut c_void, bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes];
    ok(unsafe {
        unikv_memory_copy(
            ctx.0,
            out.as_mut_ptr().cast(),
            src,
            bytes,
            1,
            ptr::null_mut(),
        )
    });
    ok(unsafe { unikv_stream_synchronize(ctx.0, ptr::null_mut()) });
    out
}

/// Every byte of a pool layer: its data buffer, then its rope buffer (FP8).
fn read_layer(ctx: &Ctx, pool: &Pool, layer: u32) -> Vec<u8> {
    let info = pool.layer(layer);
    let mut out = download(ctx, info.data, info.bytes as usize);
    if info.rope_bytes > 0 {
        out.extend(download(ctx, info.rope_data, info.rope_bytes as usize));
    }
    out
}

/// Sets every byte of a pool layer (both buffers) to `value`.
fn poison_layer(ctx: &Ctx, pool: &Pool, layer: u32, value: u8) {
    let info = pool.layer(layer);
    for (ptr, bytes) in [(info.data, info.bytes), (info.rope_data, info.rope_bytes)] {
        if bytes > 0 {
            ok(unsafe { unikv_memory_set(ctx.0, ptr, value, bytes as usize, ptr::null_mut()) });
        }
    }
}

/// A plan with its workspace; destroyed on drop.
struct Plan<'a> {
    handle: *mut c_void,
    ws: Option<Dev<'a>>,
    bytes: usize,
    decode: bool,
}

impl Plan<'_> {
    fn ws_ptr(&self) -> *mut c_void {
        self.ws.as_ref().map_or(ptr::null_mut(), |w| w.ptr)
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

fn plan(ctx: &Ctx, decode: bool, max_tokens: usize, heads: usize) -> Plan<'_> {
    plan_kv(ctx, decode, max_tokens, heads, 1)
}

/// A plan for pools of `kv_dtype` rows.
fn plan_kv(ctx: &Ctx, decode: bool, max_tokens: usize, heads: usize, kv_dtype: u32) -> Plan<'_> {
    let params = unikv_attention_plan_params {
        struct_size: std::mem::size_of::<unikv_attention_plan_params>(),
        max_tokens: max_tokens as u32,
        num_heads: heads as u32,
        head_dim: 512,
        q_dtype: 1,
        kv_dtype,
        out_dtype: 1,
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

/// Host inputs of one attention call.
#[derive(Clone)]
struct AttnCase {
    t: usize,
    h: usize,
    q: Vec<bf16>,
    indices: Vec<i32>,
    indptr: Vec<i32>,
    sink: Option<Vec<f32>>,
    scale: f32,
    extend_kv: Vec<bf16>,
    extend_indices: Vec<i32>,
    extend_indptr: Vec<i32>,
    /// Decode's inverse-RoPE epilogue: `[max_pos, 64]` table and int64 positions.
    rope: Option<(Vec<f32>, Vec<i64>)>,
    /// Write the output over `q` (exact in-place use).
    in_place: bool,
}

fn random_lengths(rng: &mut impl Rng, t: usize, max: usize) -> Vec<usize> {
    let menu = [0usize, 1, 2, 17, 64, 65, 128, 640, 1152, 2300];
    let mut lens: Vec<usize> = (0..t)
        .map(|_| *menu.choose(rng).unwrap())
        .map(|l| l.min(max))
        .collect();
    // Every batch of more than a few tokens holds 0, 1 and the longest.
    if t >= 3 {
        lens[0] = 0;
        lens[1] = 1;
        lens[2] = max.min(2300);
    }
    lens
}

fn random_case(rng: &mut impl Rng, t: usize, h: usize, rows: usize, prefill: bool) -> AttnCase {
    let max = if small() { 300 } else { 2300 };
    let lens = random_lengths(rng, t, max.min(rows));
    let mut indices = vec![];
    let mut indptr = vec![0i32];
    let mut all: Vec<i32> = (0..rows as i32).collect();
    for &l in &lens {
        all.shuffle(rng);
        indices.extend(all[..l].iter().map(|&r| {
            if prefill && rng.random_bool(0.05) {
                -1
            } else {
                r
            }
        }));
        indptr.push(indices.len() as i32);
    }
    let ext_rows = if prefill { 300 } else { 0 };
    let mut extend_indices = vec![];
    let mut extend_indptr = vec![0i32];
    if prefill {
        for _ in 0..t {
            let l = rng.random_range(0..=128usize);
            for _ in 0..l {
                extend_indices.push(if rng.random_bool(0.05) {
                    -1
                } else {
                    rng.random_range(0..ext_rows as i32)
                });
            }
            extend_indptr.push(extend_indices.len() as i32);
        }
    }
    AttnCase {
        t,
        h,
        q: random_bf16(rng, t * h * 512),
        indices,
        indptr,
        sink: rng
            .random_bool(0.7)
            .then(|| (0..h).map(|_| rng.random_range(-2.0f32..4.0)).collect()),
        scale: 1.0 / (512f32).sqrt() * rng.random_range(0.5f32..2.0),
        extend_kv: random_bf16(rng, ext_rows * 512),
        extend_indices,
        extend_indptr,
        rope: None,
        in_place: false,
    }
}

/// Runs one attention call on `ctx` and returns (out, lse).
fn run_attention(
    ctx: &Ctx,
    pool: &Pool,
    layer: u32,
    c: &AttnCase,
    plan: &Plan,
) -> (Vec<bf16>, Vec<f32>) {
    let prefill = !plan.decode;
    let q = Dev::upload(ctx, &c.q);
    let idx = Dev::upload(
        ctx,
        &c.indices.iter().copied().chain([0]).collect::<Vec<_>>(),
    );
    let ptr_ = Dev::upload(ctx, &c.indptr);
    let sink = c.sink.as_ref().map(|s| Dev::upload(ctx, s));
    let apart = (!c.in_place).then(|| {
        let out = Dev::zeroed(ctx, c.t * c.h * 512 * 2);
        out.poison();
        out
    });
    let out = apart.as_ref().unwrap_or(&q);
    let lse = Dev::zeroed(ctx, c.t * c.h * 4);
    lse.poison();
    let n_idx = c.indices.len().max(1);
    if prefill {
        let ekv = Dev::upload(ctx, &c.extend_kv);
        let eidx = Dev::upload(
            ctx,
            &c.extend_indices
                .iter()
                .copied()
                .chain([0])
                .collect::<Vec<_>>(),
        );
        let eptr = Dev::upload(ctx, &c.extend_indptr);
        let args = unikv_prefill_args {
            struct_size: std::mem::size_of::<unikv_prefill_args>(),
            q: q.t::<bf16>(&[c.t, c.h, 512]),
            indices: idx.t::<i32>(&[n_idx]),
            indptr: ptr_.t::<i32>(&[c.t + 1]),
            sink: sink.as_ref().map_or(absent(), |s| s.t::<f32>(&[c.h])),
            out: out.t::<bf16>(&[c.t, c.h, 512]),
            lse: lse.t::<f32>(&[c.t, c.h]),
            extend_kv: ekv.t::<bf16>(&[c.extend_kv.len() / 512, 512]),
            extend_indices: eidx.t::<i32>(&[c.extend_indices.len().max(1)]),
            extend_indptr: eptr.t::<i32>(&[c.t + 1]),
            layer,
            num_tokens: c.t as u32,
            softmax_scale: c.scale,
            reserved: 0,
        };
        ok(unsafe {
            unikv_sparse_prefill(
                plan.handle.cast(),
                pool.0,
                &args,
                plan.ws_ptr(),
                plan.bytes,
                ptr::null_mut(),
            )
        });
    } else {
        let rope = c.rope.as_ref().map(|(table, pos)| {
            (
                Dev::upload(ctx, table),
                Dev::upload(ctx, pos),
                table.len() / 64,
            )
        });
        let args = unikv_decode_args {
            struct_size: std::mem::size_of::<unikv_decode_args>(),
            q: q.t::<bf16>(&[c.t, c.h, 512]),
            indices: idx.t::<i32>(&[n_idx]),
            indptr: ptr_.t::<i32>(&[c.t + 1]),
            sink: sink.as_ref().map_or(absent(), |s| s.t::<f32>(&[c.h])),
            out: out.t::<bf16>(&[c.t, c.h, 512]),
            lse: lse.t::<f32>(&[c.t, c.h]),
            layer,
            num_tokens: c.t as u32,
            softmax_scale: c.scale,
            reserved: 0,
            rope_table: rope.as_ref().map_or(absent(), |r| r.0.t::<f32>(&[r.2, 64])),
            positions: rope.as_ref().map_or(absent(), |r| r.1.t::<i64>(&[c.t])),
        };
        ok(unsafe {
            unikv_sparse_decode(
                plan.handle.cast(),
                pool.0,
                &args,
                plan.ws_ptr(),
                plan.bytes,
                ptr::null_mut(),
            )
        });
    }
    (out.read::<bf16>(), lse.read::<f32>())
}

/// Per (token, head): relative L2 error < 1e-2, exact zeros where the oracle
/// has zeros (empty slices), nothing left unwritten, LSE close.
fn compare(
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

struct Setup {
    cpu: Ctx,
    gpu: Ctx,
}

fn setup() -> Option<Setup> {
    Some(Setup {
        gpu: gpu()?,
        cpu: context(1).unwrap(),
    })
}

fn attention_pools(s: &Setup, rng: &mut impl Rng) -> (Pool, Pool, usize) {
    attention_pools_of(s, rng, unikv_dtype::UNIKV_DTYPE_BF16)
}

/// Two pools (CPU, GPU) of `kv_dtype` rows holding the same random rows.
fn attention_pools_of(s: &Setup, rng: &mut impl Rng, kv_dtype: unikv_dtype) -> (Pool, Pool, usize) {
    let spec = PoolSpec {
        ratios: vec![0, 0],
        max_requests: 23,
        window: 128,
        spec_extra: 0,
        c128_blocks: 0,
    };
    let (pc, pg) = (
        Pool::of(&s.cpu, &spec, kv_dtype),
        Pool::of(&s.gpu, &spec, kv_dtype),
    );
    let rows = pc.layer(1).rows as usize;
    for layer in 0..2 {
        let data = random_bf16(rng, rows * 512);
        fill_layer(&s.cpu, &pc, layer, &data);
        fill_layer(&s.gpu, &pg, layer, &data);
    }
    (pc, pg, rows)
}

/// Decode of a fresh random case on the GPU against the CPU backend, and twice
/// on the GPU bitwise.
fn check_decode(s: &Setup, pc: &Pool, pg: &Pool, rows: usize, t: usize, h: usize, what: &str) {
    let c = random_case(&mut rand::rng(), t, h, rows, false);
    let kv = pc.info().kv_dtype;
    let cp = plan_kv(&s.cpu, true, t, h, kv);
    let gp = plan_kv(&s.gpu, true, t, h, kv);
    let want = run_attention(&s.cpu, pc, 1, &c, &cp);
    let got = run_attention(&s.gpu, pg, 1, &c, &gp);
    compare((c.t, c.h), &got, &want, &format!("{what} T={t} H={h}"));
    let again = run_attention(&s.gpu, pg, 1, &c, &gp);
    assert_eq!(
        bytes_of(&got.0),
        bytes_of(&again.0),
        "{what} T={t} H={h}: not deterministic"
    );
}

/// Head counts cover every kernel: heads-on-N wgmma (1-16, 24-32), the
/// mma.sync kernel with three m-tiles (40), heads-on-M wgmma (64, 128).
#[test]
fn decode_matches_cpu() {
    let Some(s) = setup() else { return };
    let (pc, pg, rows) = attention_pools(&s, &mut rand::rng());
    let (tokens, heads): (&[usize], &[usize]) = if small() {
        (&[1, 3, 140], &[1, 16, 24, 40, 64])
    } else {
        (&[1, 3, 64, 257], &[1, 8, 16, 24, 32, 40, 64, 128])
    };
    for &t in tokens {
        for &h in heads {
            check_decode(&s, &pc, &pg, rows, t, h, "decode");
        }
    }
}

/// `out` may be `q` itself (the header's exact in-place use): every kernel
/// family, decode and prefill, bf16 and FP8 pools, split and unsplit tokens,
/// gives the bits it gives out of place.
#[test]
fn attention_in_place_matches_out_of_place() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let shapes: &[(usize, usize)] = if small() {
        &[(3, 16), (3, 32), (3, 64)]
    } else {
        &[
            (1, 16),
            (3, 32),
            (64, 16),
            (64, 32),
            (3, 40),
            (5, 64),
            (64, 128),
        ]
    };
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_BF16,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
    ] {
        let (_pc, pg, rows) = attention_pools_of(&s, &mut rng, dtype);
        for decode in [true, false] {
            for &(t, h) in shapes {
                let mut c = random_case(&mut rng, t, h, rows, !decode);
                let p = plan_kv(&s.gpu, decode, t, h, dtype as u32);
                let apart = run_attention(&s.gpu, &pg, 1, &c, &p);
                c.in_place = true;
                let over_q = run_attention(&s.gpu, &pg, 1, &c, &p);
                let what = format!("{dtype:?} decode={decode} T={t} H={h}");
                assert_eq!(bytes_of(&apart.0), bytes_of(&over_q.0), "{what}: out");
                assert_eq!(bytes_of(&apart.1), bytes_of(&over_q.1), "{what}: lse");
            }
        }
    }
}

/// FP8 pools (both flavours) through every kernel: the rows are dequantized in
/// the key tile on the GPU and on gather on the CPU, so both see the same
/// values. The fallback paths gather with cp.async instead of bulk copies.
#[test]
fn decode_over_fp8_pools_matches_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    // T = 140 under UNIKV_GPU_TEST_SMALL: one split per token, so 16-head
    // blocks of more than three tiles take turns at whole tiles; the other
    // sizes also have blocks of a few tiles, which split each tile's dims.
    // There every kernel refills its stages, so the sanitizers see each
    // pipeline (16, 32 and 64 heads, raw and in-place) wrap around.
    let (tokens, heads): (&[usize], &[usize]) = if small() {
        (&[3, 140], &[16, 32, 64])
    } else {
        (&[1, 64, 257], &[1, 16, 32, 40, 64, 128])
    };
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
    ] {
        let (pc, pg, rows) = attention_pools_of(&s, &mut rng, dtype);
        for &t in tokens {
            for &h in heads {
                check_decode(&s, &pc, &pg, rows, t, h, &format!("{dtype:?} decode"));
            }
        }
        #[cfg(feature = "test-hooks")]
        {
            unikv::ffi::test_hooks::gpu_plan_fallbacks(true, true);
            for (t, h) in [(3, 16), (16, 64)] {
                check_decode(
                    &s,
                    &pc,
                    &pg,
                    rows,
                    t,
                    h,
                    &format!("{dtype:?} decode (fallback paths)"),
                );
            }
            unikv::ffi::test_hooks::gpu_plan_fallbacks(false, false);
        }
    }
}

/// With one key per token and no sink the output is that key's row exactly, so
/// the GPU's in-tile dequantization is checked bit for bit against the CPU's:
/// raw FP8 rows holding every code (NaN codes included), scale bytes inside
/// and outside the integer path's range (0, 9, 10, 120, 134, 135, 200), both
/// flavours, every kernel (heads 16, 40, 64) and the cp.async gathers of the
/// fallback paths. NaN outputs only need to be NaN on both, zeros equal in value.
#[test]
fn fp8_dequantization_is_exact_on_gpu() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
    ] {
        let (pc, pg, rows) = attention_pools_of(&s, &mut rng, dtype);
        let scales = [0u8, 9, 10, 120, 134, 135, 200];
        let mut nope = vec![0u8; rows * 512];
        for (r, row) in nope.chunks_mut(512).enumerate() {
            for (i, b) in row[..448].iter_mut().enumerate() {
                // Rows 0..4 walk through all 256 codes; the rest are random.
                *b = if r < 4 {
                    ((r * 448 + i) % 256) as u8
                } else {
                    rng.random()
                };
            }
            for k in 0..7 {
                let sb = scales[(r + k) % scales.len()];
                row[448 + 2 * k] = sb;
                row[449 + 2 * k] = sb;
            }
        }
        let rope = random_bf16(&mut rng, rows * 64);
        for (ctx, pool) in [(&s.cpu, &pc), (&s.gpu, &pg)] {
            let info = pool.layer(1);
            upload_to(ctx, info.data, &nope);
            upload_to(ctx, info.rope_data, &bytes_of(&rope));
        }
        let t = 200;
        let order: Vec<i32> = (0..rows as i32).collect::<Vec<_>>();
        for (h, fallback) in [
            (16, false),
            (40, false),
            (64, false),
            (16, true),
            (64, true),
        ] {
            #[cfg(feature = "test-hooks")]
            unikv::ffi::test_hooks::gpu_plan_fallbacks(fallback, fallback);
            #[cfg(not(feature = "test-hooks"))]
            if fallback {
                continue;
            }
            let c = AttnCase {
                t,
                h,
                q: random_bf16(&mut rng, t * h * 512),
                indices: (0..4)
                    .chain(order.choose_multiple(&mut rng, t - 4).copied())
                    .collect(),
                indptr: (0..=t as i32).collect(),
                sink: None,
                scale: 0.04,
                extend_kv: Vec::new(),
                extend_indices: Vec::new(),
                extend_indptr: Vec::new(),
                rope: None,
                in_place: false,
            };
            let want = run_attention(
                &s.cpu,
                &pc,
                1,
                &c,
                &plan_kv(&s.cpu, true, t, h, dtype as u32),
            );
            let got = run_attention(
                &s.gpu,
                &pg,
                1,
                &c,
                &plan_kv(&s.gpu, true, t, h, dtype as u32),
            );
            for (i, (g, w)) in got.0.iter().zip(&want.0).enumerate() {
                // ±0 may differ: the GPU accumulates onto +0.
                assert!(
                    g.to_bits() == w.to_bits()
                        || g.to_f32() == w.to_f32()
                        || (g.is_nan() && w.is_nan()),
                    "{dtype:?} H={h} fallback {fallback}: token {} head {} dim {}: GPU {g} CPU {w}",
                    i / (h * 512),
                    i / 512 % h,
                    i % 512
                );
            }
        }
        #[cfg(feature = "test-hooks")]
        unikv::ffi::test_hooks::gpu_plan_fallbacks(false, false);
    }
}

/// Decode's inverse-RoPE epilogue on the GPU against the CPU backend, through
/// every write path: direct writes of each kernel (heads 16, 40, 64, 128), the
/// cluster merge (long slices), and the workspace combine of the fallback paths.
#[test]
fn decode_inverse_rope_epilogue_matches_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let (pc, pg, rows) = attention_pools(&s, &mut rng);
    let max_pos = 5000u32;
    let table = rope_table(10_000.0, 0.0, max_pos);
    for (t, h, fallback) in [
        (1, 16, false),
        (3, 40, false),
        (64, 64, false),
        (17, 128, false),
        (5, 16, true),
        (9, 64, true),
    ] {
        #[cfg(feature = "test-hooks")]
        unikv::ffi::test_hooks::gpu_plan_fallbacks(fallback, fallback);
        #[cfg(not(feature = "test-hooks"))]
        if fallback {
            continue;
        }
        let what = format!("inverse-RoPE epilogue T={t} H={h} fallback {fallback}");
        check_rope_epilogue(&s, (&pc, &pg, rows), t, h, (&table, max_pos), &what);
    }
    #[cfg(feature = "test-hooks")]
    unikv::ffi::test_hooks::gpu_plan_fallbacks(false, false);
    // FP8 pools: the heads-on-N kernels' raw variant, whose rope tile pairs
    // dims across lanes as the bf16 kernels do (direct writes at T = 64, the
    // cluster merge at T = 1 and 3).
    let (pc, pg, rows) = attention_pools_of(&s, &mut rng, unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN);
    for (t, h) in [(1, 16), (3, 32), (64, 16), (64, 32)] {
        let what = format!("inverse-RoPE epilogue, FP8 pool, T={t} H={h}");
        check_rope_epilogue(&s, (&pc, &pg, rows), t, h, (&table, max_pos), &what);
    }
}

/// A random prefill chunk (pool rows and the chunk's own rows), GPU against CPU.
fn check_prefill(
    s: &Setup,
    (pc, pg, rows): (&Pool, &Pool, usize),
    dtype: unikv_dtype,
    t: usize,
    h: usize,
    what: &str,
) {
    let c = random_case(&mut rand::rng(), t, h, rows, true);
    let want = run_attention(
        &s.cpu,
        pc,
        0,
        &c,
        &plan_kv(&s.cpu, false, t, h, dtype as u32),
    );
    let got = run_attention(
        &s.gpu,
        pg,
        0,
        &c,
        &plan_kv(&s.gpu, false, t, h, dtype as u32),
    );
    compare((c.t, c.h), &got, &want, what);
}

/// Decode with the inverse-RoPE epilogue at random positions, GPU against CPU.
fn check_rope_epilogue(
    s: &Setup,
    (pc, pg, rows): (&Pool, &Pool, usize),
    t: usize,
    h: usize,
    (table, max_pos): (&[f32], u32),
    what: &str,
) {
    let mut rng = rand::rng();
    let mut c = random_case(&mut rng, t, h, rows, false);
    let pos = (0..t)
        .map(|_| rng.random_range(0..i64::from(max_pos)))
        .collect();
    c.rope = Some((table.to_vec(), pos));
    let kv = pc.info().kv_dtype;
    let want = run_attention(&s.cpu, pc, 1, &c, &plan_kv(&s.cpu, true, t, h, kv));
    let got = run_attention(&s.gpu, pg, 1, &c, &plan_kv(&s.gpu, true, t, h, kv));
    compare((t, h), &got, &want, what);
}

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

/// The paths GPUs without clusters or wgmma take (workspace + combine kernel,
/// mma.sync for 64-head blocks), forced on this thread's plans.
#[cfg(feature = "test-hooks")]
#[test]
fn decode_fallback_paths_match_cpu() {
    let Some(s) = setup() else { return };
    let (pc, pg, rows) = attention_pools(&s, &mut rand::rng());
    unikv::ffi::test_hooks::gpu_plan_fallbacks(true, true);
    for (t, h) in [(1, 16), (3, 64), (16, 32), (64, 128)] {
        check_decode(&s, &pc, &pg, rows, t, h, "decode (fallback paths)");
    }
    unikv::ffi::test_hooks::gpu_plan_fallbacks(false, false);
}

/// bf16 pools, and FP8 pools whose tiles mix FP8 pool rows with the bf16
/// extend rows of the chunk.
#[test]
fn prefill_matches_cpu() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let cases: &[(usize, usize)] = if small() {
        &[(3, 8)]
    } else {
        &[(64, 8), (64, 32), (257, 64), (64, 128)]
    };
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_BF16,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
    ] {
        let (pc, pg, rows) = attention_pools_of(&s, &mut rng, dtype);
        for &(t, h) in cases {
            let what = format!("{dtype:?} prefill T={t} H={h}");
            check_prefill(&s, (&pc, &pg, rows), dtype, t, h, &what);
        }
    }
}

/// A victim token's output is bitwise the same alone, inside an MTP-sized batch,
/// and among other batch-mates at another position (same plan).
#[test]
fn decode_is_batch_invariant() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let (_pc, pg, rows) = attention_pools(&s, &mut rng);
    let h = 16;
    let gp = plan(&s.gpu, true, 8, h);
    let base = random_case(&mut rng, 8, h, rows, false);
    let slice = |c: &AttnCase, t: usize| -> (Vec<bf16>, Vec<i32>) {
        let (lo, hi) = (c.indptr[t] as usize, c.indptr[t + 1] as usize);
        (
            c.q[t * h * 512..(t + 1) * h * 512].to_vec(),
            c.indices[lo..hi].to_vec(),
        )
    };
    let victim = 2; // the longest slice of the batch
    let (vq, vidx) = slice(&base, victim);
    let build = |order: &[usize]| -> AttnCase {
        let mut c = base.clone();
        c.t = order.len();
        c.q.clear();
        c.indices.clear();
        c.indptr = vec![0];
        for &t in order {
            let (q, idx) = if t == victim {
                (vq.clone(), vidx.clone())
            } else {
                slice(&base, t)
            };
            c.q.extend(q);
            c.indices.extend(idx);
            c.indptr.push(c.indices.len() as i32);
        }
        c
    };
    let row = |c: &AttnCase, out: &(Vec<bf16>, Vec<f32>), at: usize| {
        let _ = c;
        bytes_of(&out.0[at * h * 512..(at + 1) * h * 512])
    };
    let alone = build(&[victim]);
    let want = run_attention(&s.gpu, &pg, 1, &alone, &gp);
    for order in [
        vec![0, victim, 1, 3],
        vec![victim, 5, 6, 7, 4, 0, 1, 3],
        vec![7, 6, victim],
    ] {
        let c = build(&order);
        let got = run_attention(&s.gpu, &pg, 1, &c, &gp);
        let at = order.iter().position(|&t| t == victim).unwrap();
        assert_eq!(
            row(&c, &got, at),
            row(&alone, &want, 0),
            "victim differs in batch {order:?}"
        );
    }
}

fn index_pools(s: &Setup) -> (Pool, Pool, PoolSpec) {
    index_pools_of(s, unikv_dtype::UNIKV_DTYPE_BF16)
}

fn index_pools_of(s: &Setup, kv_dtype: unikv_dtype) -> (Pool, Pool, PoolSpec) {
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

/// Runs build_decode_streams + fill_csa_tail on one context; returns the six outputs.
fn decode_streams(ctx: &Ctx, pool: &Pool, inp: &DecodeInputs) -> Vec<Vec<i32>> {
    let t = inp.batch.len();
    let win = 32;
    let caps = [t * win, t * (win + inp.c128_width), t * (win + inp.topk)];
    let b = Dev::upload(ctx, &inp.batch);
    let sl = Dev::upload(ctx, &inp.slots);
    let p = Dev::upload(ctx, &inp.pos);
    let c128 = Dev::upload(ctx, &inp.c128);
    let csa = Dev::upload(ctx, &inp.csa);
    let outs: Vec<(Dev, Dev)> = caps
        .iter()
        .map(|&cap| {
            (
                Dev::zeroed(ctx, (t + 1) * 4),
                Dev::zeroed(ctx, cap.max(1) * 4),
            )
        })
        .collect();
    for (a, b) in &outs {
        a.poison();
        b.poison();
    }
    let args = unikv_decode_streams_args {
        struct_size: std::mem::size_of::<unikv_decode_streams_args>(),
        batch_id: b.t::<i32>(&[t]),
        req_slots: sl.t::<i32>(&[inp.slots.len()]),
        positions: p.t::<i32>(&[t]),
        c128_page_indices: c128.t::<i32>(&[t, inp.c128_width]),
        swa_indptr: outs[0].0.t::<i32>(&[t + 1]),
        swa_indices: outs[0].1.t::<i32>(&[caps[0]]),
        hca_indptr: outs[1].0.t::<i32>(&[t + 1]),
        hca_indices: outs[1].1.t::<i32>(&[caps[1]]),
        csa_indptr: outs[2].0.t::<i32>(&[t + 1]),
        csa_indices: outs[2].1.t::<i32>(&[caps[2]]),
        num_tokens: t as u32,
        csa_topk: inp.topk as u32,
    };
    ok(unsafe { unikv_build_decode_streams(pool.0, &args, ptr::null_mut()) });
    if inp.topk > 0 {
        let tail = unikv_csa_tail_args {
            struct_size: std::mem::size_of::<unikv_csa_tail_args>(),
            batch_id: args.batch_id,
            positions: args.positions,
            csa_page_indices: csa.t::<i32>(&[t, inp.topk]),
            csa_indptr: args.csa_indptr,
            csa_indices: args.csa_indices,
            num_tokens: t as u32,
            reserved: 0,
        };
        ok(unsafe { unikv_fill_csa_tail(pool.0, &tail, ptr::null_mut()) });
    }
    let mut result = vec![];
    for (ptr_, idx) in &outs {
        let ptr_v = ptr_.read::<i32>();
        let n = ptr_v[t] as usize;
        result.push(ptr_v);
        result.push(idx.read::<i32>()[..n].to_vec());
    }
    result
}

struct DecodeInputs {
    batch: Vec<i32>,
    slots: Vec<i32>,
    pos: Vec<i32>,
    c128: Vec<i32>,
    c128_width: usize,
    csa: Vec<i32>,
    topk: usize,
}

#[test]
fn index_builders_match_cpu_exactly() {
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let (pc, pg, spec) = index_pools(&s);
    let hca_rows = spec.c128_blocks as i32 + 2;
    let csa_rows = spec.c128_blocks as i32 * 32 + 64;
    for &t in &[1usize, 3, 64, 257] {
        let reqs = 6;
        let c128_width = rng.random_range(1..80usize);
        let topk = *[0usize, 8, 64, 512].choose(&mut rng).unwrap();
        let inp = DecodeInputs {
            batch: (0..t).map(|_| rng.random_range(-1..reqs)).collect(),
            slots: (0..reqs).map(|_| rng.random_range(0..7)).collect(),
            pos: (0..t).map(|_| rng.random_range(0..12000)).collect(),
            c128: (0..t * c128_width)
                .map(|_| {
                    if rng.random_bool(0.98) {
                        rng.random_range(0..hca_rows)
                    } else {
                        -1
                    }
                })
                .collect(),
            c128_width,
            csa: (0..t * topk)
                .map(|_| rng.random_range(0..csa_rows))
                .collect(),
            topk,
        };
        let want = decode_streams(&s.cpu, &pc, &inp);
        let got = decode_streams(&s.gpu, &pg, &inp);
        assert_eq!(got, want, "decode streams T={t}");

        // Prefill streams for each layer kind.
        for ratio in [0u32, 4, 128] {
            let width = 40;
            let chunk_start: Vec<i32> = (0..reqs).map(|_| rng.random_range(0..6000)).collect();
            let batch: Vec<i32> = (0..t).map(|_| rng.random_range(-1..reqs)).collect();
            let pos: Vec<i32> = batch
                .iter()
                .map(|&b| {
                    if b < 0 {
                        0
                    } else {
                        chunk_start[b as usize] + rng.random_range(0..300)
                    }
                })
                .collect();
            let rows = if ratio == 4 { csa_rows } else { hca_rows };
            let table: Vec<i32> = (0..t * width)
                .map(|_| {
                    if rng.random_bool(0.97) {
                        rng.random_range(0..rows)
                    } else {
                        -1
                    }
                })
                .collect();
            let extend_start: Vec<i32> = (0..reqs).map(|_| rng.random_range(0..1000)).collect();
            let run = |ctx: &Ctx, pool: &Pool| -> Vec<Vec<i32>> {
                let up = |v: &Vec<i32>| Dev::upload(ctx, v);
                let (b, sl, p, cs, es, tb) = (
                    up(&batch),
                    up(&inp.slots),
                    up(&pos),
                    up(&chunk_start),
                    up(&extend_start),
                    up(&table),
                );
                let caps = [t * (32 + width), t * 32];
                let outs: Vec<(Dev, Dev)> = caps
                    .iter()
                    .map(|&cap| (Dev::zeroed(ctx, (t + 1) * 4), Dev::zeroed(ctx, cap * 4)))
                    .collect();
                let args = unikv_prefill_streams_args {
                    struct_size: std::mem::size_of::<unikv_prefill_streams_args>(),
                    batch_id: b.t::<i32>(&[t]),
                    req_slots: sl.t::<i32>(&[reqs as usize]),
                    positions: p.t::<i32>(&[t]),
                    chunk_start: cs.t::<i32>(&[reqs as usize]),
                    extend_start: es.t::<i32>(&[reqs as usize]),
                    page_indices: tb.t::<i32>(&[t, width]),
                    prefix_indptr: outs[0].0.t::<i32>(&[t + 1]),
                    prefix_indices: outs[0].1.t::<i32>(&[caps[0]]),
                    extend_indptr: outs[1].0.t::<i32>(&[t + 1]),
                    extend_indices: outs[1].1.t::<i32>(&[caps[1]]),
                    num_tokens: t as u32,
                    compress_ratio: ratio,
                };
                ok(unsafe { unikv_build_prefill_streams(pool.0, &args, ptr::null_mut()) });
                let mut r = vec![];
                for (a, i) in &outs {
                    let pv = a.read::<i32>();
                    let n = pv[t] as usize;
                    r.push(pv);
                    r.push(i.read::<i32>()[..n].to_vec());
                }
                r
            };
            assert_eq!(
                run(&s.gpu, &pg),
                run(&s.cpu, &pc),
                "prefill streams T={t} ratio {ratio}"
            );
        }
    }
}

/// Byte for byte, bf16 and both FP8 pools (every byte poisoned first, so an
/// unwritten FP8 pad byte fails too).
#[test]
fn stores_match_cpu_exactly() {
    let Some(s) = setup() else { return };
    for dtype in [
        unikv_dtype::UNIKV_DTYPE_BF16,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
        unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
    ] {
        check_stores(&s, dtype);
    }
}

fn check_stores(s: &Setup, dtype: unikv_dtype) {
    let mut rng = rand::rng();
    let (pc, pg, spec) = index_pools_of(s, dtype);
    poison_layer(&s.cpu, &pc, 1, 0xA5);
    poison_layer(&s.gpu, &pg, 1, 0xA5);
    let t = 300;
    // Tiles of different magnitudes exercise many scale bytes.
    let kv: Vec<bf16> = random_bf16(&mut rng, t * 512)
        .chunks(64)
        .flat_map(|tile| {
            let f = 2f32.powi(rng.random_range(-12..12));
            tile.iter()
                .map(move |x| bf16::from_f32(x.to_f32() * f))
                .collect::<Vec<_>>()
        })
        .collect();
    // Request 0 is a 200-token chunk (longer than the ring), then 99 decode-like rows and a pad.
    let batch: Vec<i32> = (0..t)
        .map(|i| {
            if i < 200 {
                0
            } else if i < 299 {
                1 + (i as i32 % 4)
            } else {
                -1
            }
        })
        .collect();
    let slots = [1, 2, 3, 4, 5];
    let pos: Vec<i32> = (0..t)
        .map(|i| {
            if i < 200 {
                1000 + i as i32
            } else {
                7 + i as i32
            }
        })
        .collect();
    let final_pos: Vec<i32> = (0..5)
        .map(|b| {
            batch
                .iter()
                .zip(&pos)
                .filter(|(x, _)| **x == b)
                .map(|(_, p)| *p)
                .max()
                .unwrap_or(0)
        })
        .collect();
    // Each of requests 1..4 writes ~25 consecutive positions: fewer than the ring.
    let loc: Vec<i32> = (0..t)
        .map(|i| {
            if i % 3 == 0 {
                -1
            } else {
                rng.random_range(0..spec.c128_blocks as i32 * 32 + 64)
            }
        })
        .collect();
    let mut seen = std::collections::HashSet::new();
    let loc: Vec<i32> = loc
        .into_iter()
        .map(|l| if l >= 0 && !seen.insert(l) { -1 } else { l })
        .collect();
    for (ctx, pool) in [(&s.cpu, &pc), (&s.gpu, &pg)] {
        let (k, b, sl, p, f, l) = (
            Dev::upload(ctx, &kv),
            Dev::upload(ctx, &batch),
            Dev::upload(ctx, &slots),
            Dev::upload(ctx, &pos),
            Dev::upload(ctx, &final_pos),
            Dev::upload(ctx, &loc),
        );
        let args = unikv_store_swa_args {
            struct_size: std::mem::size_of::<unikv_store_swa_args>(),
            kv: k.t::<bf16>(&[t, 512]),
            batch_id: b.t::<i32>(&[t]),
            req_slots: sl.t::<i32>(&[5]),
            positions: p.t::<i32>(&[t]),
            final_pos: f.t::<i32>(&[5]),
            layer: 1,
            num_tokens: t as u32,
        };
        ok(unsafe { unikv_store_swa(pool.0, &args, ptr::null_mut()) });
        let cargs = unikv_store_compressed_args {
            struct_size: std::mem::size_of::<unikv_store_compressed_args>(),
            kv: k.t::<bf16>(&[t, 512]),
            loc: l.t::<i32>(&[t]),
            layer: 1,
            num_rows: t as u32,
        };
        ok(unsafe { unikv_store_compressed(pool.0, &cargs, ptr::null_mut()) });
    }
    assert!(
        read_layer(&s.gpu, &pg, 1) == read_layer(&s.cpu, &pc, 1),
        "{dtype:?}: GPU pool bytes differ from the CPU's"
    );
}

/// A full decode step (store, index build, CSA tail, attention on a dense, a CSA
/// and an HCA layer) captured once into a CUDA graph on a test-owned stream and
/// replayed with new positions, padding, empty and > 2048-key slices and new
/// indices written into the same buffers; every replay matches the CPU backend.
#[test]
fn cuda_graph_replays_a_decode_step() {
    use unikv::backend::gpu::devtools::OwnedStream;
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let spec = PoolSpec {
        ratios: vec![0, 4, 128],
        max_requests: 4,
        window: 128,
        spec_extra: 0,
        c128_blocks: 2400,
    };
    let (pc, pg) = (Pool::new(&s.cpu, &spec), Pool::new(&s.gpu, &spec));
    for layer in 0..3 {
        let rows = pc.layer(layer).rows as usize;
        let data = random_bf16(&mut rng, rows * 512);
        fill_layer(&s.cpu, &pc, layer, &data);
        fill_layer(&s.gpu, &pg, layer, &data);
    }
    let (t, h, reqs, w128, topk) = (6usize, 16usize, 4usize, 2300usize, 64usize);
    let csa_rows = spec.c128_blocks as i32 * 32 + 64;
    let stream = OwnedStream::new(0).unwrap();
    // Device buffers written before every replay, read by the captured graph.
    let g = &s.gpu;
    let dv = |n: usize| Dev::zeroed(g, n);
    let (d_kv, d_batch, d_slots, d_pos, d_c128, d_csa, d_q, d_sink) = (
        dv(t * 512 * 2),
        dv(t * 4),
        dv(reqs * 4),
        dv(t * 4),
        dv(t * w128 * 4),
        dv(t * topk * 4),
        dv(3 * t * h * 512 * 2),
        dv(h * 4),
    );
    let caps = [t * 128, t * (128 + w128), t * (128 + topk)];
    let streams: Vec<(Dev, Dev)> = caps.iter().map(|&c| (dv((t + 1) * 4), dv(c * 4))).collect();
    let outs: Vec<Dev> = (0..3).map(|_| dv(t * h * 512 * 2)).collect();
    let gp = plan(g, true, t, h);
    let stream_args = |ctx_streams: &[(Dev, Dev)], b: &Dev, sl: &Dev, p: &Dev, c128: &Dev| {
        unikv_decode_streams_args {
            struct_size: std::mem::size_of::<unikv_decode_streams_args>(),
            batch_id: b.t::<i32>(&[t]),
            req_slots: sl.t::<i32>(&[reqs]),
            positions: p.t::<i32>(&[t]),
            c128_page_indices: c128.t::<i32>(&[t, w128]),
            swa_indptr: ctx_streams[0].0.t::<i32>(&[t + 1]),
            swa_indices: ctx_streams[0].1.t::<i32>(&[caps[0]]),
            hca_indptr: ctx_streams[1].0.t::<i32>(&[t + 1]),
            hca_indices: ctx_streams[1].1.t::<i32>(&[caps[1]]),
            csa_indptr: ctx_streams[2].0.t::<i32>(&[t + 1]),
            csa_indices: ctx_streams[2].1.t::<i32>(&[caps[2]]),
            num_tokens: t as u32,
            csa_topk: topk as u32,
        }
    };
    // One serving step on `pool`, on `strm`: the sequence the graph captures.
    let step = |pool: &Pool,
                plan: &Plan,
                strm: *mut c_void,
                ins: (&Dev, &Dev, &Dev, &Dev, &Dev, &Dev, &Dev, &Dev),
                sts: &[(Dev, Dev)],
                outs: &[Dev]| {
        let (kv, b, sl, p, c128, csa, q, sink) = ins;
        for layer in 0..3u32 {
            let st = unikv_store_swa_args {
                struct_size: std::mem::size_of::<unikv_store_swa_args>(),
                kv: kv.t::<bf16>(&[t, 512]),
                batch_id: b.t::<i32>(&[t]),
                req_slots: sl.t::<i32>(&[reqs]),
                positions: p.t::<i32>(&[t]),
                final_pos: absent(),
                layer,
                num_tokens: t as u32,
            };
            ok(unsafe { unikv_store_swa(pool.0, &st, strm) });
        }
        let sa = stream_args(sts, b, sl, p, c128);
        ok(unsafe { unikv_build_decode_streams(pool.0, &sa, strm) });
        let tail = unikv_csa_tail_args {
            struct_size: std::mem::size_of::<unikv_csa_tail_args>(),
            batch_id: sa.batch_id,
            positions: sa.positions,
            csa_page_indices: csa.t::<i32>(&[t, topk]),
            csa_indptr: sa.csa_indptr,
            csa_indices: sa.csa_indices,
            num_tokens: t as u32,
            reserved: 0,
        };
        ok(unsafe { unikv_fill_csa_tail(pool.0, &tail, strm) });
        for (layer, out) in outs.iter().enumerate() {
            let (ip, ix) = match layer {
                0 => (sa.swa_indptr, sa.swa_indices),
                1 => (sa.csa_indptr, sa.csa_indices),
                _ => (sa.hca_indptr, sa.hca_indices),
            };
            let mut qd = q.t::<bf16>(&[t, h, 512]);
            qd.data = unsafe { q.ptr.cast::<bf16>().add(layer * t * h * 512).cast() };
            let args = unikv_decode_args {
                struct_size: std::mem::size_of::<unikv_decode_args>(),
                q: qd,
                indices: ix,
                indptr: ip,
                sink: sink.t::<f32>(&[h]),
                out: out.t::<bf16>(&[t, h, 512]),
                lse: absent(),
                layer: layer as u32,
                num_tokens: t as u32,
                softmax_scale: 1.0 / (512f32).sqrt(),
                reserved: 0,
                rope_table: absent(),
                positions: absent(),
            };
            let ws = plan.ws_ptr();
            ok(unsafe {
                unikv_sparse_decode(plan.handle.cast(), pool.0, &args, ws, plan.bytes, strm)
            });
        }
    };
    let ins = (
        &d_kv, &d_batch, &d_slots, &d_pos, &d_c128, &d_csa, &d_q, &d_sink,
    );
    stream.begin_capture().unwrap();
    step(&pg, &gp, stream.raw, ins, &streams, &outs);
    let graph = stream.end_capture().unwrap();

    let cp = plan(&s.cpu, true, t, h);
    let mut positions: Vec<i32> = vec![3, 1000, 130_000, 290_000];
    for replay in 0..4i32 {
        // New inputs each replay: positions advance, the padding moves, one request is empty-ish.
        for p in positions.iter_mut() {
            *p += 1 + replay;
        }
        let pad = (2 * replay as usize) % t; // never request 3's long token
        let batch: Vec<i32> = (0..t)
            .map(|i| if i == pad { -1 } else { (i % reqs) as i32 })
            .collect();
        let slots: Vec<i32> = vec![1, 2, 3, 4];
        let pos: Vec<i32> = (0..t)
            .map(|i| positions[i % reqs] + (i / reqs) as i32)
            .collect();
        // Request i's c128 table: (pos+1)/128 valid entries, a -1 cut on replay 2.
        let mut c128 = vec![-1i32; t * w128];
        for i in 0..t {
            let n = (((pos[i] + 1) / 128) as usize).min(w128);
            let cut = if replay == 2 && i == 1 { 0 } else { n };
            for j in 0..cut {
                c128[i * w128 + j] = ((i % reqs) * 50 + j) as i32 % (spec.c128_blocks as i32 + 2);
            }
        }
        let csa: Vec<i32> = (0..t * topk)
            .map(|_| rng.random_range(0..csa_rows))
            .collect();
        let kv = random_bf16(&mut rng, t * 512);
        let q = random_bf16(&mut rng, 3 * t * h * 512);
        let sink: Vec<f32> = (0..h).map(|_| rng.random_range(-1.0f32..2.0)).collect();
        d_kv.write(&kv);
        d_batch.write(&batch);
        d_slots.write(&slots);
        d_pos.write(&pos);
        d_c128.write(&c128);
        d_csa.write(&csa);
        d_q.write(&q);
        d_sink.write(&sink);
        for o in &outs {
            o.poison();
        }
        ok(unsafe { unikv_stream_synchronize(g.0, ptr::null_mut()) });
        graph.launch(&stream).unwrap();
        ok(unsafe { unikv_stream_synchronize(g.0, stream.raw) });

        // The same step on the CPU backend.
        let c = &s.cpu;
        let up = |v: &[i32]| Dev::upload(c, v);
        let (ckv, cq, csink) = (
            Dev::upload(c, &kv),
            Dev::upload(c, &q),
            Dev::upload(c, &sink),
        );
        let (cb, csl, cpos, cc128, ccsa) = (up(&batch), up(&slots), up(&pos), up(&c128), up(&csa));
        let cstreams: Vec<(Dev, Dev)> = caps
            .iter()
            .map(|&cap| (Dev::zeroed(c, (t + 1) * 4), Dev::zeroed(c, cap * 4)))
            .collect();
        let couts: Vec<Dev> = (0..3).map(|_| Dev::zeroed(c, t * h * 512 * 2)).collect();
        step(
            &pc,
            &cp,
            ptr::null_mut(),
            (&ckv, &cb, &csl, &cpos, &cc128, &ccsa, &cq, &csink),
            &cstreams,
            &couts,
        );
        let lens: Vec<i32> = cstreams[1]
            .0
            .read::<i32>()
            .windows(2)
            .map(|w| w[1] - w[0])
            .collect();
        assert!(
            lens.iter().any(|&l| l > 2048),
            "replay {replay}: HCA lengths {lens:?} include > 2048"
        );
        for layer in 0..3 {
            let got = (outs[layer].read::<bf16>(), vec![0f32; t * h]);
            let want = (couts[layer].read::<bf16>(), vec![0f32; t * h]);
            compare(
                (t, h),
                &got,
                &want,
                &format!("graph replay {replay} layer {layer}"),
            );
        }
        for (i, (gs, cs)) in streams.iter().zip(&cstreams).enumerate() {
            let (gptr, cptr) = (gs.0.read::<i32>(), cs.0.read::<i32>());
            assert_eq!(gptr, cptr, "replay {replay}: indptr of stream {i}");
            let n = cptr[t] as usize;
            assert_eq!(
                gs.1.read::<i32>()[..n],
                cs.1.read::<i32>()[..n],
                "replay {replay}: stream {i}"
            );
        }
    }
    assert_eq!(
        bytes_of(&read_layer(g, &pg, 0)),
        bytes_of(&read_layer(&s.cpu, &pc, 0)),
        "pool after replays"
    );
    drop(graph);
}

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

/// Every tested value encodes, scales and decodes on the GPU bit for bit as in
/// src/fp8.rs: the software codec, and for e4m3fn the hardware conversion
/// (sm_89+, pairs, so the byte order is checked too).
#[cfg(feature = "test-hooks")]
#[test]
fn fp8_codec_matches_rust_on_gpu() {
    use unikv::fp8::{decode, encode, ue8m0_scale_byte, Fp8Format};
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let mut values: Vec<f32> = (0..=u16::MAX)
        .map(|b| f32::from_bits(u32::from(b) << 16))
        .collect();
    for fmt in [Fp8Format::E4m3Fn, Fp8Format::E4m3Fnuz] {
        // Every code, the midpoints between neighbours, and one ULP either side.
        let codes: Vec<f32> = (0..=0x7Fu8)
            .map(|c| decode(c, fmt))
            .filter(|v| v.is_finite())
            .collect();
        for pair in codes.windows(2) {
            let mid = (pair[0] + pair[1]) / 2.0;
            for v in [
                pair[0],
                mid,
                f32::from_bits(mid.to_bits() - 1),
                f32::from_bits(mid.to_bits() + 1),
            ] {
                values.extend([v, -v]);
            }
        }
    }
    values.extend([
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        0.0,
        -0.0,
        1e30,
        -1e30,
    ]);
    values.extend((0..1 << 20).map(|_| f32::from_bits(rng.random())));
    let n = values.len();
    let x = Dev::upload(&s.gpu, &values);
    for (format, fmt) in [(0u32, Fp8Format::E4m3Fn), (1, Fp8Format::E4m3Fnuz)] {
        let out: Vec<Dev> = (0..3).map(|_| Dev::zeroed(&s.gpu, n)).collect();
        let decoded = Dev::zeroed(&s.gpu, 256 * 4);
        for d in out.iter().chain([&decoded]) {
            d.poison();
        }
        unsafe {
            unikv::ffi::test_hooks::gpu_fp8_check(
                x.ptr.cast(),
                n,
                format,
                [out[0].ptr.cast(), out[1].ptr.cast(), out[2].ptr.cast()],
                decoded.ptr.cast(),
            )
        }
        .unwrap();
        let (sw, hw, scale) = (
            out[0].read::<u8>(),
            out[1].read::<u8>(),
            out[2].read::<u8>(),
        );
        for (i, &v) in values.iter().enumerate() {
            let want = encode(v, fmt);
            assert_eq!(
                sw[i],
                want,
                "{fmt:?} software encode of {v:e} ({:#x})",
                v.to_bits()
            );
            assert_eq!(
                hw[i],
                want,
                "{fmt:?} hardware encode of {v:e} ({:#x})",
                v.to_bits()
            );
            let scale_want = ue8m0_scale_byte(v.abs(), fmt);
            assert_eq!(scale[i], scale_want, "{fmt:?} scale byte of {v:e}");
        }
        let got: Vec<f32> = decoded.read();
        for code in 0..=255u8 {
            assert_eq!(
                got[code as usize].to_bits(),
                decode(code, fmt).to_bits(),
                "{fmt:?} decode of {code:#04x}"
            );
        }
    }
}

/// Inverse RoPE on the GPU equals the CPU backend bit for bit (both evaluate the
/// same unfused fp32 expressions and round once), with int32 and int64
/// positions, contiguous and head-padded `x`. A position past the table leaves
/// its token alone on the GPU, and fails with OUT_OF_RANGE, nothing written,
/// under `validate`.
#[test]
fn inverse_rope_matches_cpu_exactly() {
    use unikv::ffi::rope::*;
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let max_pos = 1u32 << 16;
    let table = rope_table(40_000.0, 40.0, max_pos);
    let strict = validating_gpu();
    // (tokens, heads, elements per head in the buffer)
    let shapes: &[(usize, usize, usize)] = if small() {
        &[(3, 16, 576)]
    } else {
        &[(1, 1, 512), (7, 16, 576), (130, 64, 512), (300, 128, 520)]
    };
    for &(t, h, head_stride) in shapes {
        let x = random_bf16(&mut rng, t * h * head_stride);
        let valid: Vec<i64> = (0..t)
            .map(|_| rng.random_range(0..i64::from(max_pos)))
            .collect();
        let mut invalid = valid.clone();
        let bad = rng.random_range(0..t);
        invalid[bad] = if rng.random_bool(0.5) {
            -1
        } else {
            i64::from(max_pos)
        };
        for wide in [false, true] {
            let run = |ctx: &Ctx, positions: &[i64]| {
                let xd = Dev::upload(ctx, &x);
                let tb = Dev::upload(ctx, &table);
                let narrow: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
                let (_pd, pt) = if wide {
                    let d = Dev::upload(ctx, positions);
                    let desc = d.t::<i64>(&[t]);
                    (d, desc)
                } else {
                    let d = Dev::upload(ctx, &narrow);
                    let desc = d.t::<i32>(&[t]);
                    (d, desc)
                };
                let mut xt = xd.t::<bf16>(&[t, h, head_stride]);
                xt.shape[2] = 512;
                let args = unikv_inverse_rope_args {
                    struct_size: std::mem::size_of::<unikv_inverse_rope_args>(),
                    x: xt,
                    positions: pt,
                    rope_table: tb.t::<f32>(&[max_pos as usize, 64]),
                    num_tokens: t as u32,
                    num_heads: h as u32,
                };
                let status = unsafe { unikv_inverse_rope(ctx.0, &args, ptr::null_mut()) };
                (status, xd.read::<bf16>())
            };
            let what = format!("T={t} H={h} head stride {head_stride} int64 {wide}");
            let first_diff = |a: &[bf16], b: &[bf16]| {
                a.iter()
                    .zip(b)
                    .position(|(x, y)| x.to_bits() != y.to_bits())
            };
            let (status, want) = run(&s.cpu, &valid);
            ok(status);
            let (status, got) = run(&s.gpu, &valid);
            ok(status);
            assert_eq!(first_diff(&got, &want), None, "{what}");
            assert_ne!(first_diff(&got, &x), None, "{what}: nothing rotated");

            let (status, got) = run(&s.gpu, &invalid);
            ok(status);
            let mut want_skip = want.clone();
            let row = bad * h * head_stride;
            want_skip[row..row + h * head_stride].copy_from_slice(&x[row..row + h * head_stride]);
            assert_eq!(
                first_diff(&got, &want_skip),
                None,
                "{what}: token {bad} skipped"
            );

            let (status, got) = run(&strict, &invalid);
            fails(status, UNIKV_OUT_OF_RANGE, &format!("positions[{bad}]"));
            assert_eq!(
                first_diff(&got, &x),
                None,
                "{what}: validate writes nothing"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// FlashMLA and indexer cache stores (unikv_store_flashmla / _indexer)
// ---------------------------------------------------------------------------

use common::cache_store::{random_rows, Case, Layout, FORMATS};

/// Runs a cache store on `ctx` with its buffers in that context's memory and
/// returns the cache, poisoned before the call.
fn cache_store_on<'a>(ctx: &'a Ctx, case: &Case) -> Dev<'a> {
    let cache = Dev::zeroed(ctx, case.cache_bytes());
    cache.poison();
    let rows = Dev::upload(ctx, case.row_buffer().bytes());
    let loc = Dev::upload(ctx, case.loc_buffer().bytes());
    ok(case.call(cache.ptr, rows.ptr, loc.ptr).run(ctx));
    cache
}

/// Rows through the codec's edge cases: all-zero tiles and keys, NaN and ±Inf
/// elements, values near the bf16 maximum, bf16 subnormals, and values whose
/// scaled codes are ties between FP8 neighbours (17, 19, 21 at scale 1: round
/// to the even mantissa).
fn special_rows(layout: Layout) -> Vec<f32> {
    let groups: [Vec<f32>; 6] = [
        vec![0.0; 64],
        (0..64)
            .map(|i| if i == 5 { f32::NAN } else { i as f32 })
            .collect(),
        (0..64)
            .map(|i| match i {
                3 => f32::INFINITY,
                9 => f32::NEG_INFINITY,
                _ => -(i as f32),
            })
            .collect(),
        (0..64)
            .map(|i| if i % 2 == 0 { 3.0e38 } else { -1.5e38 })
            .collect(),
        (0..64).map(|i| (i as f32 - 30.0) * 1e-40).collect(),
        (0..64)
            .map(|i| [448.0, 17.0, 19.0, 21.0, -23.0, 0.0][i % 6])
            .collect(),
    ];
    let values: Vec<f32> = groups
        .iter()
        .flatten()
        .map(|&x| bf16::from_f32(x).to_f32())
        .collect();
    // Each row cycles through the groups from its own start, so every group
    // lands in FlashMLA nope tiles, RoPE dims and indexer keys; the last row
    // is all zeros.
    let (dims, len) = (layout.dims(), values.len());
    (0..groups.len())
        .flat_map(|r| (0..dims).map(move |d| (r * 64 + d) % len))
        .map(|i| values[i])
        .chain(std::iter::repeat(0.0).take(dims))
        .collect()
}

#[test]
fn cache_stores_match_cpu_exactly() {
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("cache_stores_match_cpu_exactly");
    let max_tokens = if small() { 40 } else { 600 };
    for layout in Layout::ALL {
        for &p in layout.page_sizes() {
            for fmt in FORMATS {
                for loc_i64 in [false, true] {
                    let mut case = Case::random(&mut rng, layout, p, fmt, max_tokens);
                    case.loc_i64 = loc_i64;
                    let specials = special_rows(layout);
                    let n = specials.len().min(case.rows.len());
                    case.rows[..n].copy_from_slice(&specials[..n]);
                    let what = format!("{layout:?} P = {p} {:?} i64 loc {loc_i64}", case.fmt);
                    let want = cache_store_on(&s.cpu, &case).read::<u8>();
                    assert!(
                        want != vec![POISON_BYTE; want.len()],
                        "{what}: nothing stored"
                    );
                    let got = cache_store_on(&s.gpu, &case).read::<u8>();
                    assert!(got == want, "{what}: GPU bytes differ from the CPU's");

                    // On the GPU a location past the cache is skipped, like a
                    // negative one on the CPU.
                    let slots = (case.num_pages as u64 * p) as i64;
                    let mut past = case.clone();
                    let mut skipped = case.clone();
                    for t in (0..case.num_tokens()).step_by(3) {
                        past.locations[t] = slots + t as i64;
                        skipped.locations[t] = -1;
                    }
                    let want = cache_store_on(&s.cpu, &skipped).read::<u8>();
                    let got = cache_store_on(&s.gpu, &past).read::<u8>();
                    assert!(got == want, "{what}: locations past the cache");
                }
            }
        }
    }
}

#[test]
fn cache_store_validate_mode_reports_bad_locations() {
    if gpu().is_none() {
        return;
    }
    let strict = validating_gpu();
    let (mut rng, _) = seeded("cache_store_validate_mode_reports_bad_locations");
    for layout in Layout::ALL {
        let mut case = Case::random(&mut rng, layout, 64, FORMATS[0], 50);
        let bad = case.num_tokens() / 2;
        case.locations[bad] = (case.num_pages * 64) as i64;
        let cache = Dev::zeroed(&strict, case.cache_bytes());
        cache.poison();
        let rows = Dev::upload(&strict, case.row_buffer().bytes());
        let loc = Dev::upload(&strict, case.loc_buffer().bytes());
        let status = case.call(cache.ptr, rows.ptr, loc.ptr).run(&strict);
        fails(status, UNIKV_OUT_OF_RANGE, &format!("loc[{bad}]"));
        assert!(
            cache.read::<u8>().iter().all(|&b| b == POISON_BYTE),
            "{layout:?}: nothing written"
        );
    }
}

/// `bytes` of device memory at `offset` bytes into `buf`.
fn read_range(buf: &Dev, offset: usize, bytes: usize) -> Vec<u8> {
    assert!(offset + bytes <= buf.bytes);
    let mut out = vec![0u8; bytes];
    ok(unsafe {
        unikv_memory_copy(
            buf.ctx.0,
            out.as_mut_ptr().cast(),
            buf.ptr.cast::<u8>().add(offset).cast(),
            bytes,
            1,
            ptr::null_mut(),
        )
    });
    ok(unsafe { unikv_stream_synchronize(buf.ctx.0, ptr::null_mut()) });
    out
}

/// Stores every slot of `pages` (in random order, with skipped tokens mixed
/// in) into a GPU cache of `total_pages` pages, more than 4 GiB, and compares
/// those pages with the CPU store of the same tokens into a cache of just
/// those pages; `guards` are pages nothing is stored to, which must stay
/// poisoned.
fn check_cache_past_4gib(
    s: &Setup,
    rng: &mut impl Rng,
    (layout, page_size, loc_i64): (Layout, u64, bool),
    total_pages: usize,
    pages: &[usize],
    guards: &[usize],
) {
    let bpp = layout.bytes_per_page(page_size) as usize;
    assert!(total_pages * bpp > 1 << 32);
    let mut small_loc = vec![];
    let mut big_loc = vec![];
    for (j, &page) in pages.iter().enumerate() {
        for slot in 0..page_size {
            small_loc.push((j as u64 * page_size + slot) as i64);
            big_loc.push((page as u64 * page_size + slot) as i64);
        }
    }
    for _ in 0..small_loc.len() / 8 {
        small_loc.push(-1);
        big_loc.push(-1);
    }
    let mut order: Vec<usize> = (0..small_loc.len()).collect();
    order.shuffle(rng);
    let n = order.len();
    let small = Case {
        layout,
        page_size,
        fmt: FORMATS[0].0,
        cache_dtype: FORMATS[0].1,
        num_pages: pages.len(),
        rows: random_rows(rng, layout, n, true),
        locations: order.iter().map(|&i| small_loc[i]).collect(),
        f32_rows: false,
        loc_i64,
    };
    let big = Case {
        num_pages: total_pages,
        locations: order.iter().map(|&i| big_loc[i]).collect(),
        ..small.clone()
    };
    let want = cache_store_on(&s.cpu, &small).read::<u8>();
    let got = cache_store_on(&s.gpu, &big);
    for (j, &page) in pages.iter().enumerate() {
        assert!(
            read_range(&got, page * bpp, bpp) == want[j * bpp..][..bpp],
            "{layout:?}: page {page} (bytes {} ..) differs from the CPU's",
            page * bpp
        );
    }
    for &page in guards {
        assert!(
            read_range(&got, page * bpp, bpp)
                .iter()
                .all(|&b| b == POISON_BYTE),
            "{layout:?}: page {page} was written"
        );
    }
}

/// Byte offsets past 2^31 and 2^32 (spec store_fused §1.1: 32-bit offsets
/// faulted once a per-layer cache passed 2 GiB). Skipped under
/// UNIKV_GPU_TEST_SMALL (two caches of 4.3 GB).
#[test]
fn cache_stores_past_4gib_match_cpu() {
    if small() {
        eprintln!("UNIKV_GPU_TEST_SMALL: skipped");
        return;
    }
    let Some(s) = setup() else { return };
    let (mut rng, _) = seeded("cache_stores_past_4gib_match_cpu");
    // FlashMLA, pages of 149 760 bytes: page 14 339 straddles 2^31, page
    // 28 679 straddles 2^32. int32 locations: only the offsets are 64-bit.
    check_cache_past_4gib(
        &s,
        &mut rng,
        (Layout::FlashMla, 256, false),
        28_700,
        &[0, 14_339, 14_340, 28_679, 28_699],
        &[14_338, 28_678],
    );
    // Indexer, pages of 8 448 bytes: page 254 200 straddles 2^31, page
    // 508 400 straddles 2^32.
    check_cache_past_4gib(
        &s,
        &mut rng,
        (Layout::Indexer, 64, true),
        508_500,
        &[0, 254_200, 508_400, 508_499],
        &[254_199, 508_401],
    );
}

/// `unikv_prepare_qkv` on the GPU against the CPU backend: bf16 outputs within
/// 1 bf16 ulp per element, FP8 codes within 1 code, scale and pad bytes exact,
/// and differences rare (the kernel follows the host's operation order, so only
/// a norm factor rounded differently can move an element).
mod prepare_qkv {
    use super::*;
    use unikv::ffi::prepare::*;
    use unikv::ffi::status::unikv_status;
    use unikv::ffi::types::unikv_dtype;

    const D: usize = 512;
    const MAX_POS: usize = 4096;
    /// Strided inputs and outputs (elements): `kv_in` is a slice of a fused
    /// projection's rows, `kv_out` rows are padded, `q_in` has a padding head
    /// per token, and `q_out` is heads 1..=H of H + 2.
    const KV_IN_STRIDE: usize = 640;
    const KV_IN_OFFSET: usize = 128;
    const KV_OUT_STRIDE: usize = 576;

    fn spec() -> PoolSpec {
        PoolSpec {
            ratios: vec![0],
            max_requests: 4,
            window: 128,
            spec_extra: 0,
            c128_blocks: 0,
        }
    }

    /// A compressed layer's table: base 40000 with YaRN.
    fn table() -> Vec<f32> {
        rope_table(40_000.0, 16.0, MAX_POS as u32)
    }

    /// Host inputs of one call; `wide` picks i64 (else i32) positions and rows.
    #[derive(Clone)]
    struct Inputs {
        t: usize,
        h: usize,
        q_in: Vec<bf16>,
        kv_in: Vec<bf16>,
        weight: Vec<bf16>,
        table: Vec<f32>,
        positions: Vec<i64>,
        rows: Vec<i64>,
        wide: (bool, bool),
    }

    /// Random rows per token (scaled per row so eps matters in some), random
    /// positions, distinct pool rows with every fifth token storing nothing.
    fn inputs(
        rng: &mut impl Rng,
        t: usize,
        h: usize,
        pool_rows: usize,
        wide: (bool, bool),
    ) -> Inputs {
        let mut scaled = |n: usize| -> Vec<bf16> {
            let scale = 2f32.powi(rng.random_range(-10..=6));
            random_bf16(rng, n)
                .into_iter()
                .map(|v| bf16::from_f32(v.to_f32() * scale))
                .collect()
        };
        let q_in = (0..t * (h + 1)).flat_map(|_| scaled(D)).collect();
        let kv_in = (0..t).flat_map(|_| scaled(KV_IN_STRIDE)).collect();
        let weight = random_bf16(rng, D)
            .into_iter()
            .map(|w| bf16::from_f32(1.0 + 0.5 * w.to_f32()))
            .collect();
        let mut all: Vec<i64> = (0..pool_rows as i64).collect();
        all.shuffle(rng);
        let rows = (0..t)
            .map(|i| if i % 5 == 4 { -1 } else { all[i] })
            .collect();
        let positions = (0..t)
            .map(|_| rng.random_range(0..MAX_POS as i64))
            .collect();
        Inputs {
            t,
            h,
            q_in,
            kv_in,
            weight,
            table: table(),
            positions,
            rows,
            wide,
        }
    }

    /// Everything a call may write, read back after it.
    struct Outputs {
        q_out: Vec<bf16>,
        kv_out: Vec<bf16>,
        /// The layer's bf16 rows or FP8 nope rows, then (FP8) its rope rows.
        pool: Vec<u8>,
        rope: Vec<u8>,
    }

    fn ints<'a>(ctx: &'a Ctx, values: &[i64], wide: bool) -> Dev<'a> {
        if wide {
            Dev::upload(ctx, values)
        } else {
            Dev::upload(ctx, &values.iter().map(|&v| v as i32).collect::<Vec<_>>())
        }
    }

    fn int_t(d: &Dev, n: usize, wide: bool) -> unikv_tensor {
        if wide {
            d.t::<i64>(&[n])
        } else {
            d.t::<i32>(&[n])
        }
    }

    /// A descriptor `offset` elements into `d` with explicit strides.
    fn strided<T: Dt>(d: &Dev, offset: usize, shape: &[usize], strides: &[usize]) -> unikv_tensor {
        let mut t = d.t::<T>(&[0]);
        t.data = unsafe { (d.ptr as *mut T).add(offset) }.cast();
        t.ndim = shape.len() as u32;
        for (axis, (&n, &s)) in shape.iter().zip(strides).enumerate() {
            t.shape[axis] = n as i64;
            t.strides[axis] = s as i64;
        }
        t
    }

    fn poison_pool(ctx: &Ctx, pool: &Pool) {
        let info = pool.layer(0);
        for (p, n) in [(info.data, info.bytes), (info.rope_data, info.rope_bytes)] {
            if n > 0 {
                ok(unsafe { unikv_memory_set(ctx.0, p, POISON_BYTE, n as usize, ptr::null_mut()) });
            }
        }
    }

    fn read_bytes(ctx: &Ctx, p: *mut c_void, n: u64) -> Vec<u8> {
        let mut out = vec![0u8; n as usize];
        if n > 0 {
            ok(unsafe {
                unikv_memory_copy(
                    ctx.0,
                    out.as_mut_ptr().cast(),
                    p,
                    n as usize,
                    1,
                    ptr::null_mut(),
                )
            });
        }
        ok(unsafe { unikv_stream_synchronize(ctx.0, ptr::null_mut()) });
        out
    }

    /// One call on `ctx` with poisoned outputs and pool layer.
    fn run(ctx: &Ctx, pool: &Pool, inp: &Inputs) -> (unikv_status, Outputs) {
        let (t, h) = (inp.t, inp.h);
        let q_in = Dev::upload(ctx, &inp.q_in);
        let kv_in = Dev::upload(ctx, &inp.kv_in);
        let weight = Dev::upload(ctx, &inp.weight);
        let table = Dev::upload(ctx, &inp.table);
        let positions = ints(ctx, &inp.positions, inp.wide.0);
        let rows = ints(ctx, &inp.rows, inp.wide.1);
        let q_out = Dev::zeroed(ctx, t * (h + 2) * D * 2);
        let kv_out = Dev::zeroed(ctx, t * KV_OUT_STRIDE * 2);
        q_out.poison();
        kv_out.poison();
        poison_pool(ctx, pool);
        let args = unikv_prepare_qkv_args {
            struct_size: std::mem::size_of::<unikv_prepare_qkv_args>(),
            q_in: strided::<bf16>(&q_in, 0, &[t, h, D], &[(h + 1) * D, D, 1]),
            q_out: strided::<bf16>(&q_out, D, &[t, h, D], &[(h + 2) * D, D, 1]),
            kv_in: strided::<bf16>(&kv_in, KV_IN_OFFSET, &[t, D], &[KV_IN_STRIDE, 1]),
            kv_weight: weight.t::<bf16>(&[D]),
            kv_out: strided::<bf16>(&kv_out, 0, &[t, D], &[KV_OUT_STRIDE, 1]),
            rope_table: table.t::<f32>(&[MAX_POS, 64]),
            positions: int_t(&positions, t, inp.wide.0),
            rows: int_t(&rows, t, inp.wide.1),
            layer: 0,
            num_tokens: t as u32,
            num_heads: h as u32,
            q_eps: 1e-6,
            kv_eps: 1e-6,
            reserved: 0,
        };
        let status = unsafe { unikv_prepare_qkv(pool.0, &args, ptr::null_mut()) };
        let info = pool.layer(0);
        let out = Outputs {
            q_out: q_out.read(),
            kv_out: kv_out.read(),
            pool: read_bytes(ctx, info.data, info.bytes),
            rope: read_bytes(ctx, info.rope_data, info.rope_bytes),
        };
        (status, out)
    }

    /// Position of a bf16 value on the ordered line of bf16 values.
    fn bf16_rank(bits: u16) -> i64 {
        let magnitude = i64::from(bits & 0x7FFF);
        if bits & 0x8000 != 0 {
            -magnitude
        } else {
            magnitude
        }
    }

    fn fp8_rank(code: u8) -> i64 {
        let magnitude = i64::from(code & 0x7F);
        if code & 0x80 != 0 {
            -magnitude
        } else {
            magnitude
        }
    }

    /// Compared elements, how many differ, and the largest difference in
    /// ulps (bf16) or codes (FP8).
    #[derive(Default)]
    struct Diff {
        compared: usize,
        differ: usize,
        worst: i64,
    }

    impl Diff {
        fn add(&mut self, got: i64, want: i64) {
            self.compared += 1;
            let d = (got - want).abs();
            self.differ += usize::from(d != 0);
            self.worst = self.worst.max(d);
        }

        fn bf16s(&mut self, got: &[bf16], want: &[bf16]) {
            for (g, w) in got.iter().zip(want) {
                self.add(bf16_rank(g.to_bits()), bf16_rank(w.to_bits()));
            }
        }

        fn bf16_bytes(&mut self, got: &[u8], want: &[u8]) {
            for (g, w) in got.chunks_exact(2).zip(want.chunks_exact(2)) {
                let (g, w) = (
                    u16::from_le_bytes([g[0], g[1]]),
                    u16::from_le_bytes([w[0], w[1]]),
                );
                self.add(bf16_rank(g), bf16_rank(w));
            }
        }

        #[track_caller]
        fn check(&self, what: &str) {
            assert!(self.compared > 0, "{what}: nothing compared");
            assert!(self.worst <= 1, "{what}: a difference of {}", self.worst);
            assert!(
                self.differ * 1000 <= self.compared,
                "{what}: {} of {} elements differ",
                self.differ,
                self.compared
            );
        }
    }

    /// Compares the outputs of the tokens in `tokens` and the whole pool layer.
    fn compare(
        inp: &Inputs,
        got: &Outputs,
        want: &Outputs,
        fp8: bool,
        tokens: &[usize],
        what: &str,
    ) {
        let (h, mut q, mut kv) = (inp.h, Diff::default(), Diff::default());
        for &t in tokens {
            // The padding heads too: they must stay poisoned on both.
            let span = t * (h + 2) * D..(t + 1) * (h + 2) * D;
            q.bf16s(&got.q_out[span.clone()], &want.q_out[span]);
            let span = t * KV_OUT_STRIDE..(t + 1) * KV_OUT_STRIDE;
            kv.bf16s(&got.kv_out[span.clone()], &want.kv_out[span]);
        }
        q.check(&format!("{what}: q_out"));
        kv.check(&format!("{what}: kv_out"));
        let mut pool = Diff::default();
        if !fp8 {
            pool.bf16_bytes(&got.pool, &want.pool);
            pool.check(&format!("{what}: bf16 pool"));
            return;
        }
        for (r, (g, w)) in got
            .pool
            .chunks_exact(512)
            .zip(want.pool.chunks_exact(512))
            .enumerate()
        {
            for (c, (&gc, &wc)) in g[..448].iter().zip(&w[..448]).enumerate() {
                assert!(
                    (fp8_rank(gc) - fp8_rank(wc)).abs() <= 1,
                    "{what}: row {r} code {c}: {gc:#04x} vs {wc:#04x}"
                );
                pool.add(fp8_rank(gc), fp8_rank(wc));
            }
            assert_eq!(g[448..], w[448..], "{what}: row {r} scale and pad bytes");
        }
        pool.check(&format!("{what}: FP8 codes"));
        let mut rope = Diff::default();
        rope.bf16_bytes(&got.rope, &want.rope);
        rope.check(&format!("{what}: FP8 pool rope rows"));
    }

    #[test]
    fn matches_cpu() {
        let Some(s) = setup() else { return };
        let mut rng = rand::rng();
        let (tokens, heads): (&[usize], &[usize]) = if small() {
            (&[1, 7, 33], &[1, 16])
        } else {
            (&[1, 7, 300], &[1, 16, 128])
        };
        let dtypes = [
            unikv_dtype::UNIKV_DTYPE_BF16,
            unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
            unikv_dtype::UNIKV_DTYPE_FP8_E4M3FNUZ,
        ];
        let mut case = 0;
        for dtype in dtypes {
            let (pc, pg) = (
                Pool::of(&s.cpu, &spec(), dtype),
                Pool::of(&s.gpu, &spec(), dtype),
            );
            let pool_rows = pc.layer(0).rows as usize;
            for &t in tokens {
                for &h in heads {
                    // Every index width on every pool kind across the cases.
                    let wide = (case % 2 == 0, case % 3 == 0);
                    case += 1;
                    let inp = inputs(&mut rng, t, h, pool_rows, wide);
                    let (sc, want) = run(&s.cpu, &pc, &inp);
                    let (sg, got) = run(&s.gpu, &pg, &inp);
                    ok(sc);
                    ok(sg);
                    let what = format!("{dtype:?} T={t} H={h} wide={wide:?}");
                    let all: Vec<usize> = (0..t).collect();
                    compare(
                        &inp,
                        &got,
                        &want,
                        dtype != unikv_dtype::UNIKV_DTYPE_BF16,
                        &all,
                        &what,
                    );
                }
            }
        }
    }

    /// Without `validate` the GPU writes nothing for a token whose position is
    /// outside the table and skips a store to a row past the layer; with it,
    /// the call fails as on the CPU with nothing written.
    #[test]
    fn skips_invalid_device_values() {
        let Some(s) = setup() else { return };
        let strict = validating_gpu();
        let mut rng = rand::rng();
        for dtype in [
            unikv_dtype::UNIKV_DTYPE_BF16,
            unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN,
        ] {
            let (pc, pg, ps) = (
                Pool::of(&s.cpu, &spec(), dtype),
                Pool::of(&s.gpu, &spec(), dtype),
                Pool::of(&strict, &spec(), dtype),
            );
            let pool_rows = pc.layer(0).rows as usize;
            let mut bad = inputs(&mut rng, 6, 16, pool_rows, (true, false));
            bad.positions[1] = MAX_POS as i64;
            bad.positions[3] = -1;
            bad.rows[4] = pool_rows as i64;
            let (status, got) = run(&s.gpu, &pg, &bad);
            ok(status);
            // The CPU oracle: valid positions for tokens 1 and 3 (compared
            // nowhere), and no stores for tokens 1, 3 and 4.
            let mut fixed = bad.clone();
            for t in [1, 3] {
                fixed.positions[t] = 0;
            }
            for t in [1, 3, 4] {
                fixed.rows[t] = -1;
            }
            let (status, want) = run(&s.cpu, &pc, &fixed);
            ok(status);
            let fp8 = dtype != unikv_dtype::UNIKV_DTYPE_BF16;
            compare(
                &fixed,
                &got,
                &want,
                fp8,
                &[0, 2, 4, 5],
                &format!("{dtype:?}"),
            );
            for t in [1, 3] {
                let q = &got.q_out[t * (bad.h + 2) * D..(t + 1) * (bad.h + 2) * D];
                let kv = &got.kv_out[t * KV_OUT_STRIDE..(t + 1) * KV_OUT_STRIDE];
                assert!(
                    bytes_of(q)
                        .iter()
                        .chain(&bytes_of(kv))
                        .all(|&b| b == POISON_BYTE),
                    "{dtype:?}: token {t} with an invalid position was written"
                );
            }
            let (status, strict_out) = run(&strict, &ps, &bad);
            fails(status, UNIKV_OUT_OF_RANGE, "positions[1]");
            for bytes in [
                bytes_of(&strict_out.q_out),
                bytes_of(&strict_out.kv_out),
                strict_out.pool,
                strict_out.rope,
            ] {
                assert!(
                    bytes.iter().all(|&b| b == POISON_BYTE),
                    "{dtype:?}: validate mode wrote"
                );
            }
        }
    }
}
