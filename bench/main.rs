//! unikv-bench: times every GPU operation under CUDA-graph replay on the H200
//! and prints achieved bandwidth / FLOP rate against the floor
//! max(bytes / copy_bw, flops / mma_peak), with both ceilings measured in the
//! same run (a copy kernel here and, with the bf16 matmul, through PyTorch by the
//! calling script: UNIKV_COPY_TBPS, UNIKV_MATMUL_TFLOPS). Inputs: a 1,000,000-row pool of random
//! values, random unique rows per token, index sets rotating over >= 3x L2.

use std::os::raw::c_void;
use std::ptr;

use half::bf16;
use rand::seq::IndexedRandom;
use rand::Rng;
use unikv::backend::gpu::devtools::{copy_kernel, Event, Graph, OwnedStream};
use unikv::cache_layouts::unified;
use unikv::ffi::attention::*;
use unikv::ffi::cache_store::*;
use unikv::ffi::context::*;
use unikv::ffi::index::*;
use unikv::ffi::pool::*;
use unikv::ffi::prepare::*;
use unikv::ffi::rope::{unikv_rope_params, unikv_rope_table, unikv_rope_yarn};
use unikv::ffi::status::unikv_status;
use unikv::ffi::store::*;
use unikv::ffi::types::unikv_tensor;
use unikv::fp8::Fp8Format;

mod compressor;
mod indexer;
mod layer_step;
mod reference;

const L2_BYTES: usize = 60 << 20;
const POOL_ROWS_MIN: usize = 1_000_000;

fn ok(status: unikv_status, what: &str) {
    if status != unikv_status::UNIKV_OK {
        let msg = unsafe { std::ffi::CStr::from_ptr(unikv::ffi::unikv_last_error_message()) };
        panic!("{what}: {status:?}: {}", msg.to_string_lossy());
    }
}

struct Dev {
    ctx: *mut unikv_context,
    ptr: *mut c_void,
    bytes: usize,
}

impl Dev {
    fn new(ctx: *mut unikv_context, bytes: usize) -> Dev {
        let mut ptr = ptr::null_mut();
        ok(unsafe { unikv_memory_alloc(ctx, bytes, &mut ptr) }, "alloc");
        Dev { ctx, ptr, bytes }
    }
    fn upload<T>(ctx: *mut unikv_context, data: &[T]) -> Dev {
        let d = Dev::new(ctx, std::mem::size_of_val(data).max(4));
        let n = std::mem::size_of_val(data);
        ok(
            unsafe { unikv_memory_copy(ctx, d.ptr, data.as_ptr().cast(), n, 0, ptr::null_mut()) },
            "upload",
        );
        d
    }
    fn t(&self, dtype: u32, elem: usize, shape: &[usize]) -> unikv_tensor {
        let mut d = unikv_tensor {
            data: self.ptr,
            dtype,
            ndim: shape.len() as u32,
            shape: [0; 4],
            strides: [0; 4],
        };
        let mut stride = 1i64;
        for axis in (0..shape.len()).rev() {
            d.shape[axis] = shape[axis] as i64;
            d.strides[axis] = stride;
            stride *= shape[axis] as i64;
        }
        assert!(stride as usize * elem <= self.bytes);
        d
    }
    fn i32s(&self, shape: &[usize]) -> unikv_tensor {
        self.t(4, 4, shape)
    }
    fn bf16s(&self, shape: &[usize]) -> unikv_tensor {
        self.t(1, 2, shape)
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        unsafe { unikv_memory_free(self.ctx, self.ptr) };
    }
}

/// Median milliseconds of one graph replay.
fn time_graph(graph: &Graph, stream: &OwnedStream, reps: usize) -> f64 {
    let (a, b) = (Event::new(0).unwrap(), Event::new(0).unwrap());
    for _ in 0..3 {
        graph.launch(stream).unwrap();
    }
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            a.record(stream).unwrap();
            graph.launch(stream).unwrap();
            b.record(stream).unwrap();
            a.elapsed_ms(&b).unwrap() as f64
        })
        .collect();
    times.sort_by(|x, y| x.partial_cmp(y).unwrap());
    times[times.len() / 2]
}

/// Captures `launches` calls of `body(i)` into one graph and returns the median
/// time per call in microseconds.
fn per_call_us(
    stream: &OwnedStream,
    launches: usize,
    mut body: impl FnMut(usize, *mut c_void),
) -> f64 {
    stream.begin_capture().unwrap();
    for i in 0..launches {
        body(i, stream.raw);
    }
    let graph = stream.end_capture().unwrap();
    time_graph(&graph, stream, 15) * 1000.0 / launches as f64
}

struct Ceilings {
    copy_bw: f64,   // bytes/s, read + write
    mma_flops: f64, // FLOP/s
}

struct Row {
    op: String,
    t: usize,
    h: usize,
    keys: usize,
    us: f64,
    bytes: f64,
    flops: f64,
}

impl Row {
    /// Prints the row and keeps it for the side-by-side tables.
    fn record(self, c: &Ceilings, measured: &mut Vec<Row>) {
        self.print(c);
        measured.push(self);
    }

    fn print(&self, c: &Ceilings) {
        let s = self.us * 1e-6;
        let floor = (self.bytes / c.copy_bw).max(self.flops / c.mma_flops);
        println!(
            "| {:<16} | {:>5} | {:>3} | {:>5} | {:>9.2} | {:>7.0} | {:>7.1} | {:>8.2} | {:>5.1}% |",
            self.op,
            self.t,
            self.h,
            self.keys,
            self.us,
            self.bytes / s / 1e9,
            self.flops / s / 1e12,
            floor * 1e6,
            100.0 * floor / s
        );
    }
}

/// Microseconds per call of the copy kernel moving `bytes` (a multiple of 16)
/// into one buffer, `launches` calls in one graph, call i reading source
/// i % `sources`.
fn copy_us(
    ctx: *mut unikv_context,
    stream: &OwnedStream,
    bytes: usize,
    sources: usize,
    launches: usize,
) -> f64 {
    let (src, dst) = (Dev::new(ctx, sources * bytes), Dev::new(ctx, bytes));
    per_call_us(stream, launches, |i, _| {
        let from = unsafe { (src.ptr as *const u8).add(i % sources * bytes) };
        unsafe { copy_kernel(0, dst.ptr, from.cast(), bytes, stream) }.unwrap();
    })
}

fn measure_copy(ctx: *mut unikv_context, stream: &OwnedStream) -> f64 {
    let bytes = 2usize << 30;
    2.0 * bytes as f64 / (copy_us(ctx, stream, bytes, 1, 4) * 1e-6)
}

fn main() {
    let mut rng = rand::rng();
    let options = unikv_context_options {
        struct_size: std::mem::size_of::<unikv_context_options>(),
        backend: 2,
        device: 0,
        cpu_threads: 0,
        validate: 0,
    };
    let mut ctx = ptr::null_mut();
    ok(
        unsafe { unikv_context_create(&options, &mut ctx) },
        "CUDA context",
    );
    let stream = OwnedStream::new(0).unwrap();
    let mma_tflops: f64 = std::env::var("UNIKV_MATMUL_TFLOPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .expect(
            "UNIKV_MATMUL_TFLOPS: the measured bf16 matmul rate (scripts/gpu-check.sh sets it)",
        );
    let torch_copy: f64 = std::env::var("UNIKV_COPY_TBPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
        * 1e12;
    let kernel_copy = measure_copy(ctx, &stream);
    // The higher of the two copies is the stricter (lower) floor.
    let c = Ceilings {
        copy_bw: kernel_copy.max(torch_copy),
        mma_flops: mma_tflops * 1e12,
    };
    println!(
        "ceilings: copy {:.2} TB/s (read + write; copy kernel {:.2}, PyTorch {:.2}), bf16 matmul {:.0} TFLOP/s",
        c.copy_bw / 1e12,
        kernel_copy / 1e12,
        torch_copy / 1e12,
        mma_tflops
    );
    if c.copy_bw < 4.0e12 || mma_tflops < 700.0 {
        eprintln!("ceilings are implausibly low (< 4.0 TB/s or < 700 TFLOP/s): refusing to report");
        std::process::exit(2);
    }
    let only = std::env::var("UNIKV_BENCH_ONLY").unwrap_or_default();
    // UNIKV_BENCH_CASE=T,H,keys runs one decode case (for profiling it alone,
    // or timing a shape off the table, e.g. one tile: keys = 64).
    let case: Option<(usize, usize, usize)> = std::env::var("UNIKV_BENCH_CASE").ok().map(|v| {
        let f: Vec<usize> = v
            .split(',')
            .map(|x| x.trim().parse().expect("UNIKV_BENCH_CASE=T,H,keys"))
            .collect();
        (f[0], f[1], f[2])
    });

    // A dense single-layer pool of >= 1M rows filled with random values.
    let ratios = [0u32];
    let window = 128u32;
    let max_requests = (POOL_ROWS_MIN as u32).div_ceil(window);
    let params = unikv_pool_params {
        struct_size: std::mem::size_of::<unikv_pool_params>(),
        compress_ratios: ratios.as_ptr(),
        layer_buffers: ptr::null(),
        num_layers: 1,
        max_requests,
        window,
        spec_extra: 0,
        c128_blocks: 0,
        kv_dtype: 1,
        rope_buffers: ptr::null(),
        compressor_state: 0,
        c4_state_ring: 0,
        c128_state_ring: 0,
        reserved: 0,
        state_buffers: ptr::null(),
    };
    let mut pool = ptr::null_mut();
    ok(
        unsafe { unikv_pool_create(ctx, &params, &mut pool) },
        "pool",
    );
    // The same rows in an FP8 (e4m3fn) pool: 512-byte nope rows + bf16 rope rows.
    let mut pool8 = ptr::null_mut();
    ok(
        unsafe {
            unikv_pool_create(
                ctx,
                &unikv_pool_params {
                    kv_dtype: 7,
                    ..params
                },
                &mut pool8,
            )
        },
        "fp8 pool",
    );
    let layer = layer_info(pool, 0);
    let rows = layer.rows as usize;
    fill_repeating(
        ctx,
        layer.data,
        bytes_of(&random_bf16(&mut rng, 64 << 20)),
        rows * 1024,
    );
    fill_fp8_pool(ctx, pool8, &mut rng);
    println!(
        "pools: {rows} rows x 1024 B = {:.2} GB (bf16), x 640 B = {:.2} GB (fp8 e4m3fn)\n",
        rows as f64 * 1024.0 / 1e9,
        rows as f64 * 640.0 / 1e9
    );
    println!("| op               |     T |   H |  keys |  us/call |    GB/s | TFLOP/s | floor us | floor |");
    println!("|------------------|-------|-----|-------|----------|---------|---------|----------|-------|");

    // The rows FlashMLA's times are compared with, for the side-by-side table.
    let mut measured: Vec<Row> = Vec::new();
    let all_rows: Vec<i32> = (0..rows as i32).collect();
    let idx_set = |t: usize, keys: usize, rng: &mut rand::rngs::ThreadRng| -> Vec<i32> {
        let mut v = Vec::with_capacity(t * keys);
        for _ in 0..t {
            v.extend(all_rows.choose_multiple(rng, keys).copied());
        }
        v
    };

    // (pool, its kv dtype, row label, bytes a key row moves)
    let kinds = [
        (pool, 1u32, "decode", 1024usize),
        (pool8, 7, "decode fp8", 640),
    ];
    for &(kv_pool, kv_dtype, label, row_bytes) in &kinds {
        if !(only.is_empty() || only == "decode" || only == label) {
            continue;
        }
        for (t, h, keys) in decode_cases(case) {
            let bytes_call = t * keys * row_bytes;
            let sets = (3 * L2_BYTES).div_ceil(bytes_call).clamp(2, 64);
            let idx: Vec<Dev> = (0..sets)
                .map(|_| Dev::upload(ctx, &idx_set(t, keys, &mut rng)))
                .collect();
            let indptr: Vec<i32> = (0..=t).map(|i| (i * keys) as i32).collect();
            let indptr = Dev::upload(ctx, &indptr);
            let q = Dev::upload(ctx, &random_bf16(&mut rng, t * h * 512));
            let out = Dev::new(ctx, t * h * 512 * 2);
            let sink = Dev::upload(ctx, &vec![0.5f32; h]);
            let (plan, ws, ws_bytes) = decode_plan(ctx, t, h, kv_dtype);
            let us = per_call_us(&stream, sets, |i, s| {
                let args = decode_args(
                    (&q, &sink, &out),
                    idx[i].i32s(&[t * keys]),
                    indptr.i32s(&[t + 1]),
                    t,
                    h,
                );
                ok(
                    unsafe {
                        unikv_sparse_decode(
                            plan,
                            kv_pool,
                            &args,
                            ws.as_ref().map_or(ptr::null_mut(), |w| w.ptr),
                            ws_bytes,
                            s,
                        )
                    },
                    "decode",
                );
            });
            let bytes = (t * keys * (row_bytes + 4) + 2 * t * h * 1024) as f64;
            let flops = 4.0 * (t * h * keys * 512) as f64;
            Row {
                op: label.into(),
                t,
                h,
                keys,
                us,
                bytes,
                flops,
            }
            .record(&c, &mut measured);
            unsafe { unikv_decode_plan_destroy(plan) };
        }
    }

    if only.is_empty() || only == "decode" || only == FLASHMLA_DECODE {
        bench_flashmla_decode(ctx, &stream, &c, pool8, rows, case, &mut rng, &mut measured);
    }

    if only.is_empty() || only == "prefill" {
        for &t in &[1024usize, 4096] {
            for &h in &[16usize, 64, 128] {
                let (prefix, extend) = (1024usize, 128usize);
                let keys = prefix + extend;
                let idx = Dev::upload(ctx, &idx_set(t, prefix, &mut rng));
                let indptr = Dev::upload(
                    ctx,
                    &(0..=t).map(|i| (i * prefix) as i32).collect::<Vec<_>>(),
                );
                let ext_kv = Dev::upload(ctx, &random_bf16(&mut rng, t * 512));
                let ext_idx: Vec<i32> = (0..t)
                    .flat_map(|i| (0..extend).map(move |k| ((i + k) % t) as i32))
                    .collect();
                let ext_idx = Dev::upload(ctx, &ext_idx);
                let ext_ptr = Dev::upload(
                    ctx,
                    &(0..=t).map(|i| (i * extend) as i32).collect::<Vec<_>>(),
                );
                let q = Dev::upload(ctx, &random_bf16(&mut rng, t * h * 512));
                let out = Dev::new(ctx, t * h * 512 * 2);
                // Sink on, as in FlashMLA's prefill measurement (reference.rs).
                let sink = Dev::upload(ctx, &vec![0.5f32; h]);
                let mut plan = ptr::null_mut();
                ok(
                    unsafe { unikv_prefill_plan_create(ctx, &plan_params(t, h), &mut plan) },
                    "prefill plan",
                );
                let mut ws_bytes = 0;
                ok(
                    unsafe { unikv_prefill_plan_workspace_size(plan, &mut ws_bytes) },
                    "ws",
                );
                let ws = (ws_bytes > 0).then(|| Dev::new(ctx, ws_bytes));
                let us = per_call_us(&stream, 2, |_, s| {
                    let args = unikv_prefill_args {
                        struct_size: std::mem::size_of::<unikv_prefill_args>(),
                        q: q.bf16s(&[t, h, 512]),
                        indices: idx.i32s(&[t * prefix]),
                        indptr: indptr.i32s(&[t + 1]),
                        sink: sink.t(3, 4, &[h]),
                        out: out.bf16s(&[t, h, 512]),
                        lse: ABSENT,
                        extend_kv: ext_kv.bf16s(&[t, 512]),
                        extend_indices: ext_idx.i32s(&[t * extend]),
                        extend_indptr: ext_ptr.i32s(&[t + 1]),
                        layer: 0,
                        num_tokens: t as u32,
                        softmax_scale: 0.044194173,
                        reserved: 0,
                        kv: Default::default(),
                        extend_cache: Default::default(),
                    };
                    ok(
                        unsafe {
                            unikv_sparse_prefill(
                                plan,
                                pool,
                                &args,
                                ws.as_ref().map_or(ptr::null_mut(), |w| w.ptr),
                                ws_bytes,
                                s,
                            )
                        },
                        "prefill",
                    );
                });
                let bytes = (t * keys * (1024 + 4) + 2 * t * h * 1024) as f64;
                let flops = 4.0 * (t * h * keys * 512) as f64;
                Row {
                    op: "prefill".into(),
                    t,
                    h,
                    keys,
                    us,
                    bytes,
                    flops,
                }
                .record(&c, &mut measured);
                unsafe { unikv_prefill_plan_destroy(plan) };
            }
        }
    }

    if only.is_empty() || only == "index" {
        for &t in &[1usize, 64, 4096] {
            let reqs = t;
            let batch = Dev::upload(ctx, &(0..t as i32).collect::<Vec<_>>());
            let slots = Dev::upload(
                ctx,
                &(0..reqs)
                    .map(|i| 1 + (i % max_requests as usize) as i32)
                    .collect::<Vec<_>>(),
            );
            let positions = Dev::upload(
                ctx,
                &(0..t)
                    .map(|_| rng.random_range(20_000..60_000))
                    .collect::<Vec<i32>>(),
            );
            let width = 512usize;
            let topk = 1024usize;
            let c128 = Dev::upload(
                ctx,
                &(0..t * width)
                    .map(|j| (j % width) as i32)
                    .collect::<Vec<_>>(),
            );
            let caps = [t * 128, t * (128 + width), t * (128 + topk)];
            let outs: Vec<(Dev, Dev)> = caps
                .iter()
                .map(|&c| (Dev::new(ctx, (t + 1) * 4), Dev::new(ctx, c * 4)))
                .collect();
            let us = per_call_us(&stream, 4, |_, s| {
                let args = unikv_decode_streams_args {
                    struct_size: std::mem::size_of::<unikv_decode_streams_args>(),
                    batch_id: batch.i32s(&[t]),
                    req_slots: slots.i32s(&[reqs]),
                    positions: positions.i32s(&[t]),
                    c128_page_indices: c128.i32s(&[t, width]),
                    swa_indptr: outs[0].0.i32s(&[t + 1]),
                    swa_indices: outs[0].1.i32s(&[caps[0]]),
                    hca_indptr: outs[1].0.i32s(&[t + 1]),
                    hca_indices: outs[1].1.i32s(&[caps[1]]),
                    csa_indptr: outs[2].0.i32s(&[t + 1]),
                    csa_indices: outs[2].1.i32s(&[caps[2]]),
                    num_tokens: t as u32,
                    csa_topk: topk as u32,
                };
                ok(
                    unsafe { unikv_build_decode_streams(pool, &args, s) },
                    "decode streams",
                );
            });
            // Written: 3 SWA copies + the HCA tail; read: the c128 table.
            let hca = (40_000 / 128).min(width);
            let bytes = (t * (3 * 128 + 2 * hca) * 4) as f64;
            Row {
                op: "decode_streams".into(),
                t,
                h: 0,
                keys: 128 + hca,
                us,
                bytes,
                flops: 0.0,
            }
            .print(&c);

            let kv = Dev::upload(ctx, &random_bf16(&mut rng, t * 512));
            let pos_seq = Dev::upload(ctx, &(0..t as i32).collect::<Vec<_>>());
            let one_slot = Dev::upload(ctx, &[1i32]);
            let zeros = Dev::upload(ctx, &vec![0i32; t]);
            let final_pos = Dev::upload(ctx, &[t as i32 - 1]);
            let us = per_call_us(&stream, 4, |_, s| {
                let args = unikv_store_swa_args {
                    struct_size: std::mem::size_of::<unikv_store_swa_args>(),
                    kv: kv.bf16s(&[t, 512]),
                    batch_id: zeros.i32s(&[t]),
                    req_slots: one_slot.i32s(&[1]),
                    positions: pos_seq.i32s(&[t]),
                    final_pos: final_pos.i32s(&[1]),
                    layer: 0,
                    num_tokens: t as u32,
                };
                ok(unsafe { unikv_store_swa(pool, &args, s) }, "store_swa");
            });
            let written = t.min(window as usize);
            let bytes = (written * 2048 + t * 8) as f64;
            Row {
                op: "store_swa".into(),
                t,
                h: 0,
                keys: 0,
                us,
                bytes,
                flops: 0.0,
            }
            .print(&c);
        }
    }
    if only.is_empty() || only == "prepare" {
        bench_prepare(ctx, &stream, &c, &mut rng);
    }
    if only.is_empty() || only == "cache_store" {
        bench_cache_stores(ctx, &stream, &c, &mut rng);
    }
    if only.is_empty() || only == "indexer" {
        indexer::bench_indexer_topk(ctx, &stream, &c, &mut rng);
        indexer::bench_hash_topk(ctx, &stream, &c, &mut rng);
    }
    if only.is_empty() || only == "compressor" {
        compressor::bench_compressor(ctx, &stream, &c, &mut rng);
    }
    if only.is_empty() || only == "layer_step" {
        layer_step::bench_layer_steps(ctx, &stream, &c, &mut rng);
    }
    // Last, so that it is what scripts/gpu-check.sh's summary shows.
    let us_of = |op: &str, t, h, keys| {
        measured
            .iter()
            .find(|r| (r.op.as_str(), r.t, r.h, r.keys) == (op, t, h, keys))
            .map(|r| r.us)
    };
    // Issue 26: over FlashMLA's 584-byte cache unikv must be at least as fast
    // as over its own 640-byte FP8 pool rows, read through the same index
    // streams (window + top-k, two sources), and, for reference, the
    // one-source pool rows of the table above.
    let fmla: Vec<&Row> = measured
        .iter()
        .filter(|r| r.op == FLASHMLA_DECODE)
        .collect();
    if !fmla.is_empty() {
        println!("\nFP8 decode over a FlashMLA cache (page size 64) against the FP8 pool with the same index streams (target: ratio >= 1)");
        println!(
            "|     T |   H |  keys | FlashMLA layout us | FP8 pool, 2 sources us | ratio |  FP8 pool, 1 source us | ratio |"
        );
        println!(
            "|-------|-----|-------|--------------------|------------------------|-------|------------------------|-------|"
        );
        // "pool us | pool / layout" for one comparison row, or dashes.
        let cell = |us: Option<f64>, layout_us: f64| {
            us.map_or(format!("{:>22} | {:>5}", "-", "-"), |u| {
                format!("{u:>22.2} | {:>5.3}", u / layout_us)
            })
        };
        for r in fmla {
            let two = cell(us_of(POOL_TWO_SOURCE_DECODE, r.t, r.h, r.keys), r.us);
            let one = cell(us_of("decode fp8", r.t, r.h, r.keys), r.us);
            println!(
                "| {:>5} | {:>3} | {:>5} | {:>18.2} | {two} | {one} |",
                r.t, r.h, r.keys, r.us
            );
        }
    }
    for line in reference::side_by_side(us_of) {
        println!("{line}");
    }
    unsafe {
        unikv_pool_destroy(pool);
        unikv_pool_destroy(pool8);
        unikv_context_destroy(ctx);
    }
}

/// The pool decode rows' (T, H, keys): the table's grid, or the one case
/// UNIKV_BENCH_CASE names (any shape).
fn decode_cases(case: Option<(usize, usize, usize)>) -> Vec<(usize, usize, usize)> {
    if let Some(c) = case {
        return vec![c];
    }
    let mut cases = vec![];
    for t in [1usize, 4, 16, 64, 128, 256] {
        for h in [8usize, 16, 32, 64, 128] {
            for keys in [640usize, 1152, 2176, 8320] {
                cases.push((t, h, keys));
            }
        }
    }
    cases
}

/// The op label of FP8 decode over a FlashMLA-layout cache.
const FLASHMLA_DECODE: &str = "decode fp8 fmla";
/// The op label of FP8 decode over the FP8 pool with the FlashMLA rows' index
/// streams (window + top-k, two sources): what issue 26 compares the layout with.
const POOL_TWO_SOURCE_DECODE: &str = "decode fp8 2src";

/// FP8 (e4m3fn) decode over FlashMLA's 584-byte paged cache, page size 64, of
/// at least as many tokens as the pools have rows (written by the host
/// quantizer and repeated), at the shapes of FlashMLA's table
/// (reference.rs): each token's keys are a 128-token window (consecutive
/// token ids, the call's `extra_indices`) plus the top-k (random token ids,
/// `indices`), two sources over the same cache as FlashMLA's two-cache call,
/// so the kernel reads the same 584 bytes per key FlashMLA does. Index sets
/// rotate over >= 3x L2 as in the pool rows. Bytes: 584 per key plus its
/// 4-byte index, q read and out written. The same index sets then run over
/// the FP8 pool `pool8` (ids below its `tokens_min` rows), two sources of its
/// layer 0, so the layout is compared with the pool call for call.
#[allow(clippy::too_many_arguments)]
fn bench_flashmla_decode(
    ctx: *mut unikv_context,
    stream: &OwnedStream,
    c: &Ceilings,
    pool8: *mut unikv_pool,
    tokens_min: usize,
    case: Option<(usize, usize, usize)>,
    rng: &mut rand::rngs::ThreadRng,
    measured: &mut Vec<Row>,
) {
    use unikv::cache_layouts::flashmla::{self, FlashMlaGeometry};
    const PAGE: usize = 64;
    const WINDOW: usize = 128;
    const BLOCK_PAGES: usize = 1024;
    let geometry = FlashMlaGeometry::new(PAGE as u64, Fp8Format::E4m3Fn).unwrap();
    let page_bytes = geometry.bytes_per_page() as usize;
    let pages = tokens_min.div_ceil(PAGE).div_ceil(BLOCK_PAGES) * BLOCK_PAGES;
    let tokens = pages * PAGE;
    // One block of pages quantized on the host, repeated over the cache.
    let mut block = vec![0u8; BLOCK_PAGES * page_bytes];
    let latents = random_bf16(rng, BLOCK_PAGES * PAGE * 512);
    for (loc, row) in latents.chunks_exact(512).enumerate() {
        flashmla::store_token(&mut block, &geometry, loc as i64, row).unwrap();
    }
    let cache = Dev::new(ctx, pages * page_bytes);
    fill_repeating(ctx, cache.ptr, &block, pages * page_bytes);
    println!(
        "FlashMLA cache: {tokens} tokens x 584 B in {pages} pages of {PAGE} ({:.2} GB)",
        (pages * page_bytes) as f64 / 1e9
    );
    let source = |data: unikv_tensor| unikv_kv_cache {
        layout: unikv_kv_layout::UNIKV_KV_LAYOUT_FLASHMLA as u32,
        fp8_dtype: 7,
        page_size: PAGE as u32,
        reserved: 0,
        data,
        scales: ABSENT,
    };
    let kv = source(cache.t(6, 1, &[pages, page_bytes]));
    // Ids the pool has rows for too (the cache holds at least as many tokens).
    let all: Vec<i32> = (0..tokens_min as i32).collect();
    for &t in &[1usize, 4, 16, 64, 128, 256] {
        for &h in &[64usize, 128] {
            for &keys in &[640usize, 2176] {
                if case.is_some_and(|c| c != (t, h, keys)) {
                    continue;
                }
                let topk = keys - WINDOW;
                let bytes_call = t * keys * 584;
                let sets = (3 * L2_BYTES).div_ceil(bytes_call).clamp(2, 64);
                let top: Vec<Dev> = (0..sets)
                    .map(|_| {
                        let ids: Vec<i32> = (0..t)
                            .flat_map(|_| {
                                all.choose_multiple(rng, topk).copied().collect::<Vec<_>>()
                            })
                            .collect();
                        Dev::upload(ctx, &ids)
                    })
                    .collect();
                let window: Vec<Dev> = (0..sets)
                    .map(|_| {
                        let ids: Vec<i32> = (0..t)
                            .flat_map(|_| {
                                let start = rng.random_range(0..tokens_min - WINDOW) as i32;
                                start..start + WINDOW as i32
                            })
                            .collect();
                        Dev::upload(ctx, &ids)
                    })
                    .collect();
                let top_ptr =
                    Dev::upload(ctx, &(0..=t).map(|i| (i * topk) as i32).collect::<Vec<_>>());
                let win_ptr = Dev::upload(
                    ctx,
                    &(0..=t).map(|i| (i * WINDOW) as i32).collect::<Vec<_>>(),
                );
                let q = Dev::upload(ctx, &random_bf16(rng, t * h * 512));
                let out = Dev::new(ctx, t * h * 512 * 2);
                let sink = Dev::upload(ctx, &vec![0.5f32; h]);
                let (plan, ws, ws_bytes) = decode_plan_for(
                    ctx,
                    &unikv_attention_plan_params {
                        kv_layout: unikv_kv_layout::UNIKV_KV_LAYOUT_FLASHMLA as u32,
                        ..plan_params_kv(t, h, 7)
                    },
                );
                // kv: the cache (FlashMLA rows) or zeroed (the pool's layer 0).
                let args = |i: usize, kv: unikv_kv_cache| unikv_decode_args {
                    kv,
                    extra_kv: kv,
                    extra_indices: window[i].i32s(&[t * WINDOW]),
                    extra_indptr: win_ptr.i32s(&[t + 1]),
                    ..decode_args(
                        (&q, &sink, &out),
                        top[i].i32s(&[t * topk]),
                        top_ptr.i32s(&[t + 1]),
                        t,
                        h,
                    )
                };
                let us = per_call_us(stream, sets, |i, s| {
                    let ws_ptr = ws.as_ref().map_or(ptr::null_mut(), |w| w.ptr);
                    ok(
                        unsafe {
                            unikv_sparse_decode(
                                plan,
                                ptr::null(),
                                &args(i, kv),
                                ws_ptr,
                                ws_bytes,
                                s,
                            )
                        },
                        "FlashMLA decode",
                    );
                });
                unsafe { unikv_decode_plan_destroy(plan) };
                let (pool_plan, pool_ws, pool_ws_bytes) = decode_plan(ctx, t, h, 7);
                let pool_us = per_call_us(stream, sets, |i, s| {
                    let ws_ptr = pool_ws.as_ref().map_or(ptr::null_mut(), |w| w.ptr);
                    let pool_args = args(i, Default::default());
                    ok(
                        unsafe {
                            unikv_sparse_decode(
                                pool_plan,
                                pool8,
                                &pool_args,
                                ws_ptr,
                                pool_ws_bytes,
                                s,
                            )
                        },
                        "pool decode, two sources",
                    );
                });
                unsafe { unikv_decode_plan_destroy(pool_plan) };
                for (op, us, row_bytes) in [
                    (FLASHMLA_DECODE, us, 584),
                    (POOL_TWO_SOURCE_DECODE, pool_us, 640),
                ] {
                    Row {
                        op: op.into(),
                        t,
                        h,
                        keys,
                        us,
                        bytes: (t * keys * (row_bytes + 4) + 2 * t * h * 1024) as f64,
                        flops: 4.0 * (t * h * keys * 512) as f64,
                    }
                    .record(c, measured);
                }
            }
        }
    }
}

/// The FP8 quantize-and-store into caller-owned caches of FlashMLA-based stacks
/// (page size 64), T rows at distinct random locations of a cache with twice
/// as many slots; input sets rotate so they are cold in L2. Bytes: the bf16 (or
/// indexer) row and its location read, the slot written (FlashMLA: 576 + 8
/// bytes; indexer: 128 codes + a 4-byte scale).
fn bench_cache_stores(
    ctx: *mut unikv_context,
    stream: &OwnedStream,
    c: &Ceilings,
    rng: &mut rand::rngs::ThreadRng,
) {
    const PAGE: usize = 64;
    const FLASHMLA_PAGE_BYTES: usize = 37_440; // ceil(584 * 64 / 576) * 576
    const INDEXER_PAGE_BYTES: usize = 132 * PAGE;
    for &t in &[1usize, 8, 64, 8192] {
        let pages = (2 * t).div_ceil(PAGE);
        let slots: Vec<i32> = (0..(pages * PAGE) as i32).collect();
        for (op, dims, page_bytes, written) in [
            ("store_flashmla", 512usize, FLASHMLA_PAGE_BYTES, 584usize),
            ("store_indexer", 128, INDEXER_PAGE_BYTES, 132),
        ] {
            let sets = (3 * L2_BYTES).div_ceil(t * dims * 2).clamp(2, 64);
            let rows = Dev::upload(ctx, &random_bf16(rng, sets * t * dims));
            let locs: Vec<Dev> = (0..sets)
                .map(|_| {
                    let l: Vec<i32> = slots.choose_multiple(rng, t).copied().collect();
                    Dev::upload(ctx, &l)
                })
                .collect();
            let cache = Dev::new(ctx, pages * page_bytes);
            let cache_t = cache.t(6, 1, &[pages, page_bytes]);
            let us = per_call_us(stream, sets, |i, s| {
                let mut input = rows.bf16s(&[t, dims]);
                input.data = unsafe { (rows.ptr as *mut bf16).add(i * t * dims) }.cast();
                let status = if op == "store_flashmla" {
                    let args = unikv_store_flashmla_args {
                        struct_size: std::mem::size_of::<unikv_store_flashmla_args>(),
                        cache: cache_t,
                        kv: input,
                        loc: locs[i].i32s(&[t]),
                        page_size: PAGE as u32,
                        cache_dtype: 7,
                        num_tokens: t as u32,
                        reserved: 0,
                    };
                    unsafe { unikv_store_flashmla(ctx, &args, s) }
                } else {
                    let args = unikv_store_indexer_args {
                        struct_size: std::mem::size_of::<unikv_store_indexer_args>(),
                        cache: cache_t,
                        key: input,
                        loc: locs[i].i32s(&[t]),
                        page_size: PAGE as u32,
                        cache_dtype: 7,
                        num_tokens: t as u32,
                        reserved: 0,
                    };
                    unsafe { unikv_store_indexer(ctx, &args, s) }
                };
                ok(status, op);
            });
            let bytes = t * (dims * 2 + 4 + written);
            Row {
                op: op.into(),
                t,
                h: 0,
                keys: 0,
                us,
                bytes: bytes as f64,
                flops: 0.0,
            }
            .print(c);
            // The same bytes through the copy kernel (half read from rotating
            // sources like the op's inputs, half written): what a dependent
            // call of this size reaches at all, where launch and DRAM latency
            // weigh as much as bandwidth.
            let half = (bytes / 2).div_ceil(16) * 16;
            Row {
                op: "  same-size copy".into(),
                t,
                h: 0,
                keys: 0,
                us: copy_us(ctx, stream, half, sets, sets),
                bytes: (2 * half) as f64,
                flops: 0.0,
            }
            .print(c);
        }
    }
}

/// Layer `index` of a pool.
fn layer_info(pool: *mut unikv_pool, index: u32) -> unikv_pool_layer_info {
    let mut layer: unikv_pool_layer_info = unsafe { std::mem::zeroed() };
    layer.struct_size = std::mem::size_of::<unikv_pool_layer_info>();
    ok(
        unsafe { unikv_pool_get_layer(pool, index, &mut layer) },
        "layer",
    );
    layer
}

/// Copies `pattern` over and over into `bytes` bytes of device memory at `dst`.
fn fill_repeating(ctx: *mut unikv_context, dst: *mut c_void, pattern: &[u8], bytes: usize) {
    let mut done = 0;
    while done < bytes {
        let n = (bytes - done).min(pattern.len());
        ok(
            unsafe {
                unikv_memory_copy(
                    ctx,
                    (dst as *mut u8).add(done).cast(),
                    pattern.as_ptr().cast(),
                    n,
                    0,
                    ptr::null_mut(),
                )
            },
            "fill pool",
        );
        done += n;
    }
}

/// The bytes of a slice.
fn bytes_of<T>(v: &[T]) -> &[u8] {
    // SAFETY: any initialized value is readable as bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

/// Fills an FP8 pool with quantized random rows: one block of rows quantized on
/// the host, repeated over the pool.
fn fill_fp8_pool(ctx: *mut unikv_context, pool: *mut unikv_pool, rng: &mut impl Rng) {
    let (nope, rope) = fp8_rows(rng, 1 << 16);
    fill_fp8_layer(ctx, &layer_info(pool, 0), &nope, &rope);
}

/// `n` random rows quantized as an FP8 (e4m3fn) pool stores them: the
/// 512-byte nope rows and the bf16 rope rows.
fn fp8_rows(rng: &mut impl Rng, n: usize) -> (Vec<u8>, Vec<bf16>) {
    let (mut nope, mut rope) = (vec![0u8; n * 512], vec![bf16::ZERO; n * 64]);
    let rows = random_bf16(rng, n * 512);
    for r in 0..n {
        unified::quantize_row(
            &rows[r * 512..(r + 1) * 512],
            Fp8Format::E4m3Fn,
            (&mut nope[r * 512..(r + 1) * 512]).try_into().unwrap(),
            (&mut rope[r * 64..(r + 1) * 64]).try_into().unwrap(),
        );
    }
    (nope, rope)
}

/// Repeats FP8 rows (`fp8_rows`) over every row of an FP8 pool layer.
fn fill_fp8_layer(
    ctx: *mut unikv_context,
    layer: &unikv_pool_layer_info,
    nope: &[u8],
    rope: &[bf16],
) {
    let total = layer.rows as usize;
    fill_repeating(ctx, layer.data, nope, total * 512);
    fill_repeating(ctx, layer.rope_data, bytes_of(rope), total * 128);
}

fn random_bf16(rng: &mut impl Rng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
        .collect()
}

/// An optional tensor argument left out.
const ABSENT: unikv_tensor = unikv_tensor {
    data: ptr::null_mut(),
    dtype: 0,
    ndim: 0,
    shape: [0; 4],
    strides: [0; 4],
};

/// bf16 plan shapes for `t` tokens and `h` heads.
fn plan_params(t: usize, h: usize) -> unikv_attention_plan_params {
    plan_params_kv(t, h, 1)
}

/// Plan shapes for pools of `kv_dtype` rows.
fn plan_params_kv(t: usize, h: usize, kv_dtype: u32) -> unikv_attention_plan_params {
    unikv_attention_plan_params {
        struct_size: std::mem::size_of::<unikv_attention_plan_params>(),
        max_tokens: t as u32,
        num_heads: h as u32,
        head_dim: 512,
        q_dtype: 1,
        kv_dtype,
        out_dtype: 1,
        kv_layout: 0,
        reserved: 0,
    }
}

/// A benchmark decode call's arguments: `(q, sink, out)` of `t` tokens and
/// `h` heads (sink 0.5 per head), one index stream over the pool's layer 0, no
/// LSE and no inverse-RoPE epilogue. Callers with other key sources override
/// `kv`, `extra_kv` and the extra stream.
fn decode_args(
    (q, sink, out): (&Dev, &Dev, &Dev),
    indices: unikv_tensor,
    indptr: unikv_tensor,
    t: usize,
    h: usize,
) -> unikv_decode_args {
    unikv_decode_args {
        struct_size: std::mem::size_of::<unikv_decode_args>(),
        q: q.bf16s(&[t, h, 512]),
        indices,
        indptr,
        sink: sink.t(3, 4, &[h]),
        out: out.bf16s(&[t, h, 512]),
        lse: ABSENT,
        layer: 0,
        num_tokens: t as u32,
        softmax_scale: 0.044194173,
        reserved: 0,
        rope_table: ABSENT,
        positions: ABSENT,
        kv: Default::default(),
        extra_kv: Default::default(),
        extra_indices: Default::default(),
        extra_indptr: Default::default(),
    }
}

fn decode_plan(
    ctx: *mut unikv_context,
    t: usize,
    h: usize,
    kv_dtype: u32,
) -> (*mut unikv_decode_plan, Option<Dev>, usize) {
    decode_plan_for(ctx, &plan_params_kv(t, h, kv_dtype))
}

/// A decode plan for `params` and its workspace (None when it needs none).
fn decode_plan_for(
    ctx: *mut unikv_context,
    params: &unikv_attention_plan_params,
) -> (*mut unikv_decode_plan, Option<Dev>, usize) {
    let mut plan = ptr::null_mut();
    ok(
        unsafe { unikv_decode_plan_create(ctx, params, &mut plan) },
        "decode plan",
    );
    let mut bytes = 0;
    ok(
        unsafe { unikv_decode_plan_workspace_size(plan, &mut bytes) },
        "ws",
    );
    (plan, (bytes > 0).then(|| Dev::new(ctx, bytes)), bytes)
}

/// A plain RoPE table (no YaRN) of `max_pos` rows of 64 floats with `base`;
/// the bench's timings do not depend on its values.
pub fn rope_table(base: f64, max_pos: usize) -> Vec<f32> {
    let rope = unikv_rope_params {
        struct_size: std::mem::size_of::<unikv_rope_params>(),
        base,
        yarn: unikv_rope_yarn {
            factor: 0.0,
            original_max_position: 0,
            beta_fast: 0.0,
            beta_slow: 0.0,
        },
    };
    let mut table = vec![0f32; max_pos * 64];
    ok(
        unsafe { unikv_rope_table(&rope, max_pos as u32, table.as_mut_ptr(), table.len()) },
        "rope table",
    );
    table
}

/// Fused Q/KV preparation (`unikv_prepare_qkv`) on an FP8 (e4m3fn) pool layer.
/// Decode shapes (T <= 64) store each token's KV row into a distinct pool row
/// and write no `kv_out`; the prefill chunk (T = 8192) writes `kv_out` and
/// stores nothing (prefill stores its final window later). Inputs rotate over
/// at least 3x L2. Bytes: Q read and written, KV rows read, `kv_out` or the
/// 640-byte FP8 row written, table rows, positions, rows and the weight read.
fn bench_prepare(
    ctx: *mut unikv_context,
    stream: &OwnedStream,
    c: &Ceilings,
    rng: &mut rand::rngs::ThreadRng,
) {
    const MAX_POS: usize = 65536;
    /// The same bf16 view `elems` elements further on.
    fn shifted(mut d: unikv_tensor, elems: usize) -> unikv_tensor {
        d.data = unsafe { (d.data as *mut bf16).add(elems) }.cast();
        d
    }
    let ratios = [0u32];
    let params = unikv_pool_params {
        struct_size: std::mem::size_of::<unikv_pool_params>(),
        compress_ratios: ratios.as_ptr(),
        layer_buffers: ptr::null(),
        num_layers: 1,
        max_requests: 1023,
        window: 128,
        spec_extra: 0,
        c128_blocks: 0,
        kv_dtype: 7,
        rope_buffers: ptr::null(),
        compressor_state: 0,
        c4_state_ring: 0,
        c128_state_ring: 0,
        reserved: 0,
        state_buffers: ptr::null(),
    };
    let mut pool = ptr::null_mut();
    ok(
        unsafe { unikv_pool_create(ctx, &params, &mut pool) },
        "FP8 pool",
    );
    let mut layer: unikv_pool_layer_info = unsafe { std::mem::zeroed() };
    layer.struct_size = std::mem::size_of::<unikv_pool_layer_info>();
    ok(
        unsafe { unikv_pool_get_layer(pool, 0, &mut layer) },
        "layer",
    );
    let pool_rows: Vec<i32> = (0..layer.rows as i32).collect();
    let table = rope_table(10_000.0, MAX_POS);
    let table = Dev::upload(ctx, &table);
    let weight = Dev::upload(ctx, &random_bf16(rng, 512));
    // Inputs are tiled from one random chunk: drawing GBs of values is slow.
    let chunk = random_bf16(rng, 32 << 20);
    let random_dev = |elems: usize| -> Dev {
        let d = Dev::new(ctx, elems * 2);
        let mut done = 0;
        while done < elems {
            let n = (elems - done).min(chunk.len());
            ok(
                unsafe {
                    unikv_memory_copy(
                        ctx,
                        (d.ptr as *mut bf16).add(done).cast(),
                        chunk.as_ptr().cast(),
                        n * 2,
                        0,
                        ptr::null_mut(),
                    )
                },
                "fill",
            );
            done += n;
        }
        d
    };
    for &t in &[1usize, 8, 64, 8192] {
        let prefill = t > 64;
        for &h in &[8usize, 16, 64, 128] {
            let set_elems = t * (h + 1) * 512;
            let sets = (3 * L2_BYTES).div_ceil(set_elems * 2).clamp(2, 64);
            // Per set: Q rows then KV rows.
            let inputs = random_dev(sets * set_elems);
            let q_out = Dev::new(ctx, t * h * 1024);
            let kv_out = Dev::new(ctx, if prefill { t * 1024 } else { 16 });
            let positions: Vec<Dev> = (0..sets)
                .map(|_| {
                    let p: Vec<i32> = (0..t)
                        .map(|_| rng.random_range(0..MAX_POS as i32))
                        .collect();
                    Dev::upload(ctx, &p)
                })
                .collect();
            let rows: Vec<Dev> = (0..sets)
                .map(|_| {
                    let r: Vec<i32> = pool_rows.choose_multiple(rng, t).copied().collect();
                    Dev::upload(ctx, &r)
                })
                .collect();
            let us = per_call_us(stream, sets, |i, s| {
                let q_in = shifted(inputs.bf16s(&[t, h, 512]), i * set_elems);
                let kv_in = shifted(inputs.bf16s(&[t, 512]), i * set_elems + t * h * 512);
                let args = unikv_prepare_qkv_args {
                    struct_size: std::mem::size_of::<unikv_prepare_qkv_args>(),
                    q_in,
                    q_out: q_out.bf16s(&[t, h, 512]),
                    kv_in,
                    kv_weight: weight.bf16s(&[512]),
                    kv_out: if prefill {
                        kv_out.bf16s(&[t, 512])
                    } else {
                        ABSENT
                    },
                    rope_table: table.t(3, 4, &[MAX_POS, 64]),
                    positions: positions[i].i32s(&[t]),
                    rows: if prefill { ABSENT } else { rows[i].i32s(&[t]) },
                    layer: 0,
                    num_tokens: t as u32,
                    num_heads: h as u32,
                    q_eps: 1e-6,
                    kv_eps: 1e-6,
                    reserved: 0,
                };
                ok(unsafe { unikv_prepare_qkv(pool, &args, s) }, "prepare_qkv");
            });
            let written = if prefill { 1024 } else { 640 + 4 };
            let bytes = (2 * t * h * 1024 + t * (1024 + 256 + 4 + written) + 1024) as f64;
            Row {
                op: "prepare_qkv".into(),
                t,
                h,
                keys: 0,
                us,
                bytes,
                flops: 0.0,
            }
            .print(c);
        }
    }
    unsafe { unikv_pool_destroy(pool) };
}
