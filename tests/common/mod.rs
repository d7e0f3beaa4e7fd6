//! Helpers shared by the integration tests: they drive the library through its
//! C ABI (the product surface), with host buffers on the CPU backend.
#![allow(dead_code)]

pub mod cache_store;
pub mod csa_pipeline;
pub mod indexer;
pub mod routing;
pub mod scaled_store;

use std::ffi::CStr;
use std::os::raw::c_void;
use std::ptr;

use half::bf16;
use unikv::ffi::context::*;
use unikv::ffi::pool::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::types::{unikv_dtype, unikv_tensor};

pub use unikv::ffi::status::unikv_status::*;

/// Byte pattern written into outputs before a call, so unwritten elements show.
pub const POISON_BYTE: u8 = 0xA5;

pub fn last_error() -> String {
    unsafe { CStr::from_ptr(unikv::ffi::unikv_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// Asserts a status, printing the library's message when it differs.
#[track_caller]
pub fn check(status: unikv_status, want: unikv_status) {
    assert_eq!(
        status,
        want,
        "unexpected status; last error: {}",
        last_error()
    );
}

#[track_caller]
pub fn ok(status: unikv_status) {
    check(status, UNIKV_OK);
}

/// The build's capabilities (`unikv_get_capabilities`).
pub fn get_capabilities() -> unikv::ffi::capabilities::unikv_capabilities {
    let mut caps: unikv::ffi::capabilities::unikv_capabilities = unsafe { std::mem::zeroed() };
    caps.struct_size = std::mem::size_of_val(&caps);
    ok(unsafe { unikv::ffi::capabilities::unikv_get_capabilities(&mut caps) });
    caps
}

/// Asserts a failure with the given status whose message names `arg`.
#[track_caller]
pub fn fails(status: unikv_status, want: unikv_status, arg: &str) {
    check(status, want);
    let msg = last_error();
    assert!(msg.contains(arg), "message {msg:?} does not name {arg:?}");
}

/// An owned context handle.
pub struct Ctx(pub *mut unikv_context);

impl Ctx {
    pub fn cpu(threads: u32) -> Self {
        let options = unikv_context_options {
            struct_size: std::mem::size_of::<unikv_context_options>(),
            backend: 1,
            device: 0,
            cpu_threads: threads,
            validate: 0,
        };
        let mut ctx = ptr::null_mut();
        ok(unsafe { unikv_context_create(&options, &mut ctx) });
        Ctx(ctx)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        unsafe { unikv_context_destroy(self.0) };
    }
}

/// A buffer in a context's memory (host memory on the CPU backend, device
/// memory on GPU backends), freed on drop.
pub struct Dev<'a> {
    pub ctx: &'a Ctx,
    pub ptr: *mut c_void,
    pub bytes: usize,
}

impl<'a> Dev<'a> {
    pub fn zeroed(ctx: &'a Ctx, bytes: usize) -> Self {
        let mut ptr = ptr::null_mut();
        ok(unsafe { unikv_memory_alloc(ctx.0, bytes, &mut ptr) });
        Dev { ctx, ptr, bytes }
    }

    pub fn upload<T>(ctx: &'a Ctx, data: &[T]) -> Self {
        let d = Dev::zeroed(ctx, std::mem::size_of_val(data));
        d.write(data);
        d
    }

    pub fn write<T>(&self, data: &[T]) {
        assert!(std::mem::size_of_val(data) <= self.bytes);
        let n = std::mem::size_of_val(data);
        ok(unsafe {
            unikv_memory_copy(
                self.ctx.0,
                self.ptr,
                data.as_ptr().cast(),
                n,
                0,
                ptr::null_mut(),
            )
        });
    }

    pub fn poison(&self) {
        ok(unsafe {
            unikv_memory_set(
                self.ctx.0,
                self.ptr,
                POISON_BYTE,
                self.bytes,
                ptr::null_mut(),
            )
        });
    }

    pub fn read<T: Copy>(&self) -> Vec<T> {
        let n = self.bytes / std::mem::size_of::<T>();
        let mut out: Vec<T> = poisoned(n);
        ok(unsafe {
            unikv_memory_copy(
                self.ctx.0,
                out.as_mut_ptr().cast(),
                self.ptr,
                n * std::mem::size_of::<T>(),
                1,
                ptr::null_mut(),
            )
        });
        ok(unsafe { unikv_stream_synchronize(self.ctx.0, ptr::null_mut()) });
        out
    }

    /// Contiguous descriptor of dtype `T` over this buffer.
    pub fn t<T: Dt>(&self, shape: &[usize]) -> unikv_tensor {
        let mut d = absent();
        d.data = self.ptr;
        d.dtype = T::DTYPE as u32;
        d.ndim = shape.len() as u32;
        let mut stride = 1i64;
        for axis in (0..shape.len()).rev() {
            d.shape[axis] = shape[axis] as i64;
            d.strides[axis] = stride;
            stride *= shape[axis] as i64;
        }
        assert!(stride as usize * std::mem::size_of::<T>() <= self.bytes.max(1));
        d
    }
}

impl Drop for Dev<'_> {
    fn drop(&mut self) {
        unsafe { unikv_memory_free(self.ctx.0, self.ptr) };
    }
}

/// Pool creation parameters with the commonly varied fields.
#[derive(Clone, Debug)]
pub struct PoolSpec {
    pub ratios: Vec<u32>,
    pub max_requests: u32,
    pub window: u32,
    pub spec_extra: u32,
    pub c128_blocks: u32,
}

impl PoolSpec {
    pub fn params(&self) -> unikv_pool_params {
        self.params_of(unikv_dtype::UNIKV_DTYPE_BF16)
    }

    /// Parameters of a pool of `kv_dtype` rows (bf16 or an FP8 flavour).
    pub fn params_of(&self, kv_dtype: unikv_dtype) -> unikv_pool_params {
        unikv_pool_params {
            struct_size: std::mem::size_of::<unikv_pool_params>(),
            compress_ratios: self.ratios.as_ptr(),
            layer_buffers: ptr::null(),
            num_layers: self.ratios.len() as u32,
            max_requests: self.max_requests,
            window: self.window,
            spec_extra: self.spec_extra,
            c128_blocks: self.c128_blocks,
            kv_dtype: kv_dtype as u32,
            rope_buffers: ptr::null(),
            compressor_state: 0,
            c4_state_ring: 0,
            c128_state_ring: 0,
            reserved: 0,
            state_buffers: ptr::null(),
        }
    }
}

/// An owned pool handle (destroyed before its context).
pub struct Pool(pub *mut unikv_pool);

impl Pool {
    pub fn new(ctx: &Ctx, spec: &PoolSpec) -> Self {
        Self::of(ctx, spec, unikv_dtype::UNIKV_DTYPE_BF16)
    }

    /// A pool of `kv_dtype` rows.
    pub fn of(ctx: &Ctx, spec: &PoolSpec, kv_dtype: unikv_dtype) -> Self {
        let mut pool = ptr::null_mut();
        ok(unsafe { unikv_pool_create(ctx.0, &spec.params_of(kv_dtype), &mut pool) });
        Pool(pool)
    }

    pub fn info(&self) -> unikv_pool_info {
        let mut info: unikv_pool_info = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of::<unikv_pool_info>();
        ok(unsafe { unikv_pool_get_info(self.0, &mut info) });
        info
    }

    pub fn layer(&self, layer: u32) -> unikv_pool_layer_info {
        let mut info: unikv_pool_layer_info = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of::<unikv_pool_layer_info>();
        ok(unsafe { unikv_pool_get_layer(self.0, layer, &mut info) });
        info
    }

    /// The layer's rows as a mutable host slice (CPU backend). The memory belongs
    /// to the library, not to `self`, hence the `&self` receiver.
    #[allow(clippy::mut_from_ref)]
    pub fn rows_mut(&self, layer: u32) -> &mut [bf16] {
        let info = self.layer(layer);
        unsafe { std::slice::from_raw_parts_mut(info.data as *mut bf16, info.rows as usize * 512) }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        unsafe { unikv_pool_destroy(self.0) };
    }
}

/// `bytes` of `ctx`'s memory at `src`, copied to the host once its stream is idle.
pub fn download(ctx: &Ctx, src: *mut c_void, bytes: usize) -> Vec<u8> {
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
pub fn read_layer(ctx: &Ctx, pool: &Pool, layer: u32) -> Vec<u8> {
    let info = pool.layer(layer);
    let mut out = download(ctx, info.data, info.bytes as usize);
    if info.rope_bytes > 0 {
        out.extend(download(ctx, info.rope_data, info.rope_bytes as usize));
    }
    out
}

/// Sets every byte of a pool layer (both buffers) to `value`.
pub fn poison_layer(ctx: &Ctx, pool: &Pool, layer: u32, value: u8) {
    let info = pool.layer(layer);
    for (ptr, bytes) in [(info.data, info.bytes), (info.rope_data, info.rope_bytes)] {
        if bytes > 0 {
            ok(unsafe { unikv_memory_set(ctx.0, ptr, value, bytes as usize, ptr::null_mut()) });
        }
    }
}

/// Host element types usable in test tensors.
pub trait Dt: Copy {
    const DTYPE: unikv_dtype;
}
impl Dt for bf16 {
    const DTYPE: unikv_dtype = unikv_dtype::UNIKV_DTYPE_BF16;
}
impl Dt for f32 {
    const DTYPE: unikv_dtype = unikv_dtype::UNIKV_DTYPE_F32;
}
impl Dt for i32 {
    const DTYPE: unikv_dtype = unikv_dtype::UNIKV_DTYPE_I32;
}
impl Dt for i64 {
    const DTYPE: unikv_dtype = unikv_dtype::UNIKV_DTYPE_I64;
}
impl Dt for u8 {
    const DTYPE: unikv_dtype = unikv_dtype::UNIKV_DTYPE_U8;
}

/// A contiguous descriptor over `data` with the given shape.
pub fn tensor<T: Dt>(data: &[T], shape: &[usize]) -> unikv_tensor {
    assert!(
        shape.iter().product::<usize>() <= data.len(),
        "shape larger than data"
    );
    let mut t = unikv_tensor {
        data: data.as_ptr() as *mut c_void,
        dtype: T::DTYPE as u32,
        ndim: shape.len() as u32,
        shape: [0; 4],
        strides: [0; 4],
    };
    let mut stride = 1i64;
    for axis in (0..shape.len()).rev() {
        t.shape[axis] = shape[axis] as i64;
        t.strides[axis] = stride;
        stride *= shape[axis] as i64;
    }
    t
}

/// A 1-D descriptor over a whole slice.
pub fn vec1<T: Dt>(data: &[T]) -> unikv_tensor {
    tensor(data, &[data.len()])
}

/// The "absent" optional tensor.
pub fn absent() -> unikv_tensor {
    unikv_tensor {
        data: ptr::null_mut(),
        dtype: 0,
        ndim: 0,
        shape: [0; 4],
        strides: [0; 4],
    }
}

/// Reinterprets any plain buffer as bytes (to compare poisoned outputs).
pub fn bytes_of<T>(v: &[T]) -> Vec<u8> {
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
        .to_vec()
}

/// A vector of `n` poisoned elements.
pub fn poisoned<T: Copy>(n: usize) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(n);
    unsafe {
        std::ptr::write_bytes(v.as_mut_ptr(), POISON_BYTE, n);
        v.set_len(n);
    }
    v
}

/// Random bf16 values in [-1, 1), never all zero.
pub fn random_bf16(rng: &mut impl rand::Rng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
        .collect()
}

/// A fresh seed from `rand::rng()` (or `UNIKV_TEST_SEED`), printed so that a
/// failure can be replayed; returns the generator and the seed.
pub fn seeded(test: &str) -> (rand::rngs::StdRng, u64) {
    use rand::{Rng, SeedableRng};
    let seed = std::env::var("UNIKV_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("{test}: seed {seed} (replay with UNIKV_TEST_SEED={seed})");
    (rand::rngs::StdRng::seed_from_u64(seed), seed)
}

/// A RoPE table of `max_pos` rows (fp32 `[max_pos, 64]`) from `unikv_rope_table`:
/// `base` with YaRN of `yarn_factor` over 4096 positions (beta 32 / 1), or no
/// YaRN for a factor of 0 (a dense layer's table).
pub fn rope_table(base: f64, yarn_factor: f64, max_pos: u32) -> Vec<f32> {
    use unikv::ffi::rope::{unikv_rope_params, unikv_rope_table, unikv_rope_yarn};
    let params = unikv_rope_params {
        struct_size: std::mem::size_of::<unikv_rope_params>(),
        base,
        yarn: unikv_rope_yarn {
            factor: yarn_factor,
            original_max_position: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
        },
    };
    let mut table = vec![0f32; max_pos as usize * 64];
    ok(unsafe { unikv_rope_table(&params, max_pos, table.as_mut_ptr(), table.len()) });
    table
}
