//! Issue 21 through the C ABI on the CPU backend: an output that shares bytes
//! with another argument of the call, or with the pool rows the call reads or
//! writes, is refused with UNIKV_OVERLAPPING_BUFFERS and a message naming
//! both, and nothing is written; the exact in-place uses a function allows
//! give the out-of-place result bit for bit; slices of one buffer that share
//! no byte are accepted. A case carves its tensors from one poisoned arena,
//! so that arguments can overlap, and every refusal compares the whole arena
//! (and the pool) before and after.

mod common;

use std::mem::size_of;
use std::os::raw::c_void;
use std::ptr;

use common::*;
use half::bf16;
use rand::rngs::StdRng;
use unikv::ffi::attention::*;
use unikv::ffi::cache_store::*;
use unikv::ffi::index::*;
use unikv::ffi::indexer::*;
use unikv::ffi::prepare::*;
use unikv::ffi::rope::*;
use unikv::ffi::routing::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::store::*;
use unikv::ffi::types::{unikv_dtype, unikv_tensor};

const D: usize = 512;
/// Tokens and heads of the prepare and attention cases.
const T: usize = 2;
const H: usize = 2;
/// Rows of the RoPE tables.
const MAX_POS: usize = 8;
const FP8: u32 = unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN as u32;

/// A descriptor of `T` at `data` with explicit strides (in elements).
fn desc<T: Dt>(data: *mut c_void, shape: &[usize], strides: &[usize]) -> unikv_tensor {
    let mut t = absent();
    t.data = data;
    t.dtype = T::DTYPE as u32;
    t.ndim = shape.len() as u32;
    for (axis, (&n, &s)) in shape.iter().zip(strides).enumerate() {
        t.shape[axis] = n as i64;
        t.strides[axis] = s as i64;
    }
    t
}

fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * shape[axis + 1];
    }
    strides
}

/// Hands out 16-byte aligned regions of an arena, one after another.
#[derive(Default)]
struct Regions(usize);

impl Regions {
    fn take(&mut self, bytes: usize) -> usize {
        let at = self.0;
        self.0 += bytes.div_ceil(16) * 16;
        at
    }
}

/// A poisoned, 16-byte aligned host buffer (the library writes through the
/// descriptors into it, as into device memory).
struct Arena(Vec<u128>);

impl Arena {
    fn new(regions: &Regions) -> Self {
        Arena(poisoned(regions.0.div_ceil(16)))
    }

    fn len(&self) -> usize {
        self.0.len() * 16
    }

    fn ptr(&self, byte: usize) -> *mut c_void {
        assert!(byte <= self.len());
        unsafe { (self.0.as_ptr() as *mut u8).add(byte).cast() }
    }

    fn strided<T: Dt>(&self, byte: usize, shape: &[usize], strides: &[usize]) -> unikv_tensor {
        let span = 1 + shape
            .iter()
            .zip(strides)
            .map(|(n, s)| (n - 1) * s)
            .sum::<usize>();
        assert!(byte + span * size_of::<T>() <= self.len(), "past the arena");
        desc::<T>(self.ptr(byte), shape, strides)
    }

    /// A row-major descriptor.
    fn t<T: Dt>(&self, byte: usize, shape: &[usize]) -> unikv_tensor {
        self.strided::<T>(byte, shape, &row_major(shape))
    }

    fn write<T: Copy>(&mut self, byte: usize, values: &[T]) {
        let n = std::mem::size_of_val(values);
        assert!(byte + n <= self.len());
        unsafe { ptr::copy_nonoverlapping(values.as_ptr().cast::<u8>(), self.ptr(byte).cast(), n) };
    }

    /// `rows` rows of `len` values from `values`, `stride` elements apart.
    fn write_rows<T: Copy>(&mut self, byte: usize, stride: usize, len: usize, values: &[T]) {
        for (r, row) in values.chunks(len).enumerate() {
            self.write(byte + r * stride * size_of::<T>(), row);
        }
    }

    fn bytes(&self) -> Vec<u8> {
        bytes_of(&self.0)
    }

    fn region(&self, byte: usize, len: usize) -> Vec<u8> {
        self.bytes()[byte..byte + len].to_vec()
    }
}

/// Asserts UNIKV_OVERLAPPING_BUFFERS with a message that starts with `lead`
/// and names `other`.
#[track_caller]
fn refused(status: unikv_status, lead: &str, other: &str) {
    check(status, UNIKV_OVERLAPPING_BUFFERS);
    let msg = last_error();
    assert!(
        msg.starts_with(&format!("{lead}: overlaps ")) && msg.contains(other),
        "message {msg:?} should start with {lead:?} and name {other:?}"
    );
}

/// Runs a call that must be refused, and checks that it wrote nothing to
/// the arena or to the pool rows.
#[track_caller]
fn refused_unchanged(
    arena: &Arena,
    pool: Option<(&Pool, u32)>,
    call: impl FnOnce() -> unikv_status,
    lead: &str,
    other: &str,
) {
    let pool_bytes = || pool.map(|(p, layer)| layer_bytes(p, layer));
    let before = (arena.bytes(), pool_bytes());
    refused(call(), lead, other);
    assert!(
        before == (arena.bytes(), pool_bytes()),
        "{lead}: a refused call wrote"
    );
}

/// A pool layer's bytes, an FP8 layer's rope rows included.
fn layer_bytes(pool: &Pool, layer: u32) -> Vec<u8> {
    let info = pool.layer(layer);
    let mut out = bytes_of(unsafe {
        std::slice::from_raw_parts(info.data as *const u8, info.bytes as usize)
    });
    if info.rope_bytes > 0 {
        let rope = info.rope_data as *const u8;
        out.extend(unsafe { std::slice::from_raw_parts(rope, info.rope_bytes as usize) });
    }
    out
}

fn dense_pool(ctx: &Ctx, dtype: unikv_dtype) -> Pool {
    let spec = PoolSpec {
        ratios: vec![0, 4],
        max_requests: 2,
        window: 4,
        spec_extra: 0,
        c128_blocks: 1,
    };
    Pool::of(ctx, &spec, dtype)
}

// ---------------------------------------------------------------------------
// unikv_prepare_qkv

/// Where a prepare case keeps its tensors. Q heads sit in a head-padded
/// `[T, H + 1, 512]` region, so a view one head further stays inside it.
struct PrepareAt {
    q: usize,
    kv: usize,
    weight: usize,
    table: usize,
    positions: usize,
    rows: usize,
    q_out: usize,
    kv_out: usize,
}

const Q_STRIDES: [usize; 3] = [(H + 1) * D, D, 1];

struct PrepareCase {
    arena: Arena,
    at: PrepareAt,
}

impl PrepareCase {
    fn new(rng: &mut StdRng) -> Self {
        let mut r = Regions::default();
        let at = PrepareAt {
            q: r.take(T * (H + 1) * D * 2),
            kv: r.take(T * D * 2),
            weight: r.take(D * 2),
            table: r.take(MAX_POS * 64 * 4),
            positions: r.take(T * 4),
            rows: r.take(T * 4),
            q_out: r.take(T * H * D * 2),
            kv_out: r.take(T * D * 2),
        };
        let mut arena = Arena::new(&r);
        arena.write_rows(at.q, (H + 1) * D, H * D, &random_bf16(rng, T * H * D));
        arena.write(at.kv, &random_bf16(rng, T * D));
        arena.write(at.weight, &random_bf16(rng, D));
        arena.write(at.table, &rope_table(10000.0, 0.0, MAX_POS as u32));
        arena.write(at.positions, &[3i32, 5]);
        arena.write(at.rows, &[0i32, 1]);
        PrepareCase { arena, at }
    }

    fn q_in(&self) -> unikv_tensor {
        self.arena
            .strided::<bf16>(self.at.q, &[T, H, D], &Q_STRIDES)
    }

    fn kv_in(&self) -> unikv_tensor {
        self.arena.t::<bf16>(self.at.kv, &[T, D])
    }

    /// Separate outputs; token t stores into pool row t of layer 0.
    fn args(&self) -> unikv_prepare_qkv_args {
        let a = &self.arena;
        unikv_prepare_qkv_args {
            struct_size: size_of::<unikv_prepare_qkv_args>(),
            q_in: self.q_in(),
            q_out: a.t::<bf16>(self.at.q_out, &[T, H, D]),
            kv_in: self.kv_in(),
            kv_weight: a.t::<bf16>(self.at.weight, &[D]),
            kv_out: a.t::<bf16>(self.at.kv_out, &[T, D]),
            rope_table: a.t::<f32>(self.at.table, &[MAX_POS, 64]),
            positions: a.t::<i32>(self.at.positions, &[T]),
            rows: a.t::<i32>(self.at.rows, &[T]),
            layer: 0,
            num_tokens: T as u32,
            num_heads: H as u32,
            q_eps: 1e-6,
            kv_eps: 1e-6,
            reserved: 0,
        }
    }
}

fn prepare(pool: &Pool, args: &unikv_prepare_qkv_args) -> unikv_status {
    unsafe { unikv_prepare_qkv(pool.0, args, ptr::null_mut()) }
}

/// The case: `q_out` one head after `q_in` used to return OK with a
/// wrong output (head h's result overwrote head h + 1's input before it was
/// read). Other partial overlaps, and tensors inside the pool rows the call
/// writes, are refused too.
#[test]
fn prepare_qkv_refuses_q_out_one_head_after_q_in() {
    let (mut rng, _) = seeded("prepare_qkv_refuses_q_out_one_head_after_q_in");
    let ctx = Ctx::cpu(2);
    let pool = dense_pool(&ctx, unikv_dtype::UNIKV_DTYPE_BF16);
    let c = PrepareCase::new(&mut rng);
    let run = |args: unikv_prepare_qkv_args| prepare(&pool, &args);
    let written = Some((&pool, 0));

    let mut args = c.args();
    args.q_out = c
        .arena
        .strided::<bf16>(c.at.q + D * 2, &[T, H, D], &Q_STRIDES);
    refused_unchanged(&c.arena, written, || run(args), "q_out", "q_in (partially");

    let mut args = c.args();
    args.kv_out = c.arena.t::<bf16>(c.at.kv + 16, &[T, D]);
    refused_unchanged(&c.arena, written, || run(args), "kv_out", "kv_in");

    // kv_in inside the pool rows the call writes; fine when `rows` is absent.
    let layer = pool.layer(0);
    let mut args = c.args();
    args.kv_in = desc::<bf16>(layer.data, &[T, D], &[D, 1]);
    refused_unchanged(
        &c.arena,
        written,
        || run(args),
        "kv_in",
        "the pool's rows of layer 0, which this operation writes",
    );
    // positions inside kv_out, and q_out inside the pool rows.
    let mut args = c.args();
    args.positions = c.arena.t::<i32>(c.at.kv_out + 64, &[T]);
    refused_unchanged(&c.arena, written, || run(args), "kv_out", "positions");
    let mut args = c.args();
    args.q_out = desc::<bf16>(layer.data, &[T, H, D], &[H * D, D, 1]);
    refused_unchanged(
        &c.arena,
        written,
        || run(args),
        "q_out",
        "the pool's rows of layer 0",
    );

    let mut args = c.args();
    args.kv_in = desc::<bf16>(layer.data, &[T, D], &[D, 1]);
    args.rows = absent();
    ok(prepare(&pool, &args));
}

/// `q_out` may be `q_in` and `kv_out` may be `kv_in` exactly: the same bytes
/// as separate outputs. The same data with other strides is refused.
#[test]
fn prepare_qkv_in_place_is_exact_only() {
    let (mut rng, seed) = seeded("prepare_qkv_in_place_is_exact_only");
    let ctx = Ctx::cpu(2);
    let pool = dense_pool(&ctx, unikv_dtype::UNIKV_DTYPE_BF16);
    let apart = PrepareCase::new(&mut rng);
    ok(prepare(&pool, &apart.args()));
    let pool_apart = bytes_of(pool.rows_mut(0));

    let mut again = rand::SeedableRng::seed_from_u64(seed);
    let c = PrepareCase::new(&mut again);
    let mut args = c.args();
    args.q_out = args.q_in;
    args.kv_out = args.kv_in;
    pool.rows_mut(0).fill(bf16::ZERO);
    ok(prepare(&pool, &args));
    assert_eq!(bytes_of(pool.rows_mut(0)), pool_apart);
    for t in 0..T {
        assert_eq!(
            c.arena.region(c.at.q + t * (H + 1) * D * 2, H * D * 2),
            apart
                .arena
                .region(apart.at.q_out + t * H * D * 2, H * D * 2),
            "q token {t}"
        );
    }
    assert_eq!(
        c.arena.region(c.at.kv, T * D * 2),
        apart.arena.region(apart.at.kv_out, T * D * 2)
    );

    // The same data pointer with another token stride is a partial overlap.
    let mut args = c.args();
    args.q_out = c.arena.strided::<bf16>(c.at.q, &[T, H, D], &[H * D, D, 1]);
    refused_unchanged(
        &c.arena,
        Some((&pool, 0)),
        || prepare(&pool, &args),
        "q_out",
        "q_in (partially; in-place use must be exact",
    );
}

/// Q and KV as interleaved column slices of one fused `[T, 3 * 512]` buffer,
/// inputs and outputs alike, share no byte: accepted, with the results of
/// separate buffers. Moving `kv_out` 8 columns into `q_out` is refused.
#[test]
fn column_slices_of_one_buffer_are_accepted() {
    let (mut rng, _) = seeded("column_slices_of_one_buffer_are_accepted");
    let ctx = Ctx::cpu(2);
    let pool = dense_pool(&ctx, unikv_dtype::UNIKV_DTYPE_BF16);
    let apart = PrepareCase::new(&mut rng);
    let mut args = apart.args();
    args.rows = absent();
    ok(prepare(&pool, &args));

    let width = (H + 1) * D;
    let mut r = Regions::default();
    let (fused_in, fused_out) = (r.take(T * width * 2), r.take(T * width * 2));
    let mut f = Arena::new(&r);
    // The same inputs: apart's q heads and kv rows, token by token.
    for t in 0..T {
        let q = apart.arena.region(apart.at.q + t * width * 2, H * D * 2);
        f.write(fused_in + t * width * 2, &q);
        let kv = apart.arena.region(apart.at.kv + t * D * 2, D * 2);
        f.write(fused_in + (t * width + H * D) * 2, &kv);
    }
    let q_slice = |at| f.strided::<bf16>(at, &[T, H, D], &[width, D, 1]);
    let kv_slice = |at| f.strided::<bf16>(at + H * D * 2, &[T, D], &[width, 1]);
    let fused = unikv_prepare_qkv_args {
        q_in: q_slice(fused_in),
        kv_in: kv_slice(fused_in),
        q_out: q_slice(fused_out),
        kv_out: kv_slice(fused_out),
        ..args
    };
    ok(prepare(&pool, &fused));
    for t in 0..T {
        let row = f.region(fused_out + t * width * 2, width * 2);
        let q = apart
            .arena
            .region(apart.at.q_out + t * H * D * 2, H * D * 2);
        let kv = apart.arena.region(apart.at.kv_out + t * D * 2, D * 2);
        assert_eq!(row, [q, kv].concat(), "token {t}");
    }

    let shifted = unikv_prepare_qkv_args {
        kv_out: f.strided::<bf16>(fused_out + (H * D - 8) * 2, &[T, D], &[width, 1]),
        ..fused
    };
    refused_unchanged(&f, None, || prepare(&pool, &shifted), "q_out", "kv_out");
}

// ---------------------------------------------------------------------------
// Stores into the pool

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

// ---------------------------------------------------------------------------
// Index builders

fn index_pool(ctx: &Ctx) -> Pool {
    let spec = PoolSpec {
        ratios: vec![0, 4, 128],
        max_requests: 3,
        window: 4,
        spec_extra: 0,
        c128_blocks: 4,
    };
    Pool::new(ctx, &spec)
}

#[test]
fn index_builders_refuse_overlapping_streams() {
    let ctx = Ctx::cpu(1);
    let pool = index_pool(&ctx);
    // Three tokens, window 4, c128 width 2, top-k 8 (tests/bad_input.rs).
    let mut r = Regions::default();
    let (batch, slots, pos, c128) = (r.take(12), r.take(8), r.take(12), r.take(24));
    let outs = [4, 12, 4, 18, 4, 36].map(|n| r.take(n * 4));
    let mut a = Arena::new(&r);
    a.write(batch, &[0i32, 1, -1]);
    a.write(slots, &[1i32, 3]);
    a.write(pos, &[300i32, 7, 0]);
    a.write(c128, &[0i32, 1, 2, 3, 4, 5]);
    let out = |i: usize, n| a.t::<i32>(outs[i], &[n]);
    let decode = unikv_decode_streams_args {
        struct_size: size_of::<unikv_decode_streams_args>(),
        batch_id: a.t::<i32>(batch, &[3]),
        req_slots: a.t::<i32>(slots, &[2]),
        positions: a.t::<i32>(pos, &[3]),
        c128_page_indices: a.t::<i32>(c128, &[3, 2]),
        swa_indptr: out(0, 4),
        swa_indices: out(1, 12),
        hca_indptr: out(2, 4),
        hca_indices: out(3, 18),
        csa_indptr: out(4, 4),
        csa_indices: out(5, 36),
        num_tokens: 3,
        csa_topk: 8,
    };
    let build = |args: unikv_decode_streams_args| unsafe {
        unikv_build_decode_streams(pool.0, &args, ptr::null_mut())
    };
    let hca_indptr = a.t::<i32>(outs[1] + 8, &[4]);
    refused_unchanged(
        &a,
        None,
        || {
            build(unikv_decode_streams_args {
                hca_indptr,
                ..decode
            })
        },
        "swa_indices",
        "hca_indptr",
    );
    let positions = a.t::<i32>(outs[5] + 100, &[3]);
    refused_unchanged(
        &a,
        None,
        || {
            build(unikv_decode_streams_args {
                positions,
                ..decode
            })
        },
        "csa_indices",
        "positions",
    );
    ok(build(decode));

    // fill_csa_tail updates csa_indices in place; its table may not overlap it.
    let mut r = Regions::default();
    let table = r.take(24 * 4);
    let mut t = Arena::new(&r);
    t.write(table, &(0..24).collect::<Vec<i32>>());
    let tail = unikv_csa_tail_args {
        struct_size: size_of::<unikv_csa_tail_args>(),
        batch_id: decode.batch_id,
        positions: decode.positions,
        csa_page_indices: t.t::<i32>(table, &[3, 8]),
        csa_indptr: decode.csa_indptr,
        csa_indices: decode.csa_indices,
        num_tokens: 3,
        reserved: 0,
    };
    let csa_page_indices = a.strided::<i32>(outs[5] + 16, &[3, 8], &[8, 1]);
    refused_unchanged(
        &a,
        None,
        || unsafe {
            unikv_fill_csa_tail(
                pool.0,
                &unikv_csa_tail_args {
                    csa_page_indices,
                    ..tail
                },
                ptr::null_mut(),
            )
        },
        "csa_indices",
        "csa_page_indices",
    );
    // The very same tensor is refused too where no in-place use is allowed.
    let exact = unikv_csa_tail_args {
        csa_indices: tail.csa_indptr,
        ..tail
    };
    refused_unchanged(
        &a,
        None,
        || unsafe { unikv_fill_csa_tail(pool.0, &exact, ptr::null_mut()) },
        "csa_indices",
        "csa_indptr (exactly; in-place use is not supported",
    );
    ok(unsafe { unikv_fill_csa_tail(pool.0, &tail, ptr::null_mut()) });

    // Prefill streams: two tokens of request 0 at slot 2, ratio 4.
    let mut r = Regions::default();
    let (ints, page_table) = (r.take(64), r.take(16));
    let outs = [3, 12, 3, 8].map(|n| r.take(n * 4));
    let mut p = Arena::new(&r);
    // batch_id x2, req_slots, positions x2, chunk_start, extend_start.
    p.write(ints, &[0i32, 0, 2, 10, 11, 10, 0]);
    p.write(page_table, &[0i32, 1, 0, 1]);
    let prefill = unikv_prefill_streams_args {
        struct_size: size_of::<unikv_prefill_streams_args>(),
        batch_id: p.t::<i32>(ints, &[2]),
        req_slots: p.t::<i32>(ints + 8, &[1]),
        positions: p.t::<i32>(ints + 12, &[2]),
        chunk_start: p.t::<i32>(ints + 20, &[1]),
        extend_start: p.t::<i32>(ints + 24, &[1]),
        page_indices: p.t::<i32>(page_table, &[2, 2]),
        prefix_indptr: p.t::<i32>(outs[0], &[3]),
        prefix_indices: p.t::<i32>(outs[1], &[12]),
        extend_indptr: p.t::<i32>(outs[2], &[3]),
        extend_indices: p.t::<i32>(outs[3], &[8]),
        num_tokens: 2,
        compress_ratio: 4,
    };
    let chunk_start = p.t::<i32>(outs[3] + 12, &[1]);
    refused_unchanged(
        &p,
        None,
        || unsafe {
            unikv_build_prefill_streams(
                pool.0,
                &unikv_prefill_streams_args {
                    chunk_start,
                    ..prefill
                },
                ptr::null_mut(),
            )
        },
        "extend_indices",
        "chunk_start",
    );
    ok(unsafe { unikv_build_prefill_streams(pool.0, &prefill, ptr::null_mut()) });
}

// ---------------------------------------------------------------------------
// Attention: decode, prefill, merge, inverse RoPE

fn plan_params() -> unikv_attention_plan_params {
    let bf = unikv_dtype::UNIKV_DTYPE_BF16 as u32;
    unikv_attention_plan_params {
        struct_size: size_of::<unikv_attention_plan_params>(),
        max_tokens: T as u32,
        num_heads: H as u32,
        head_dim: D as u32,
        q_dtype: bf,
        kv_dtype: bf,
        out_dtype: bf,
    }
}

/// Where an attention case keeps its tensors: q head-padded as in the
/// prepare cases, then the outputs and the streams (token 0: pool rows 0..3,
/// token 1: rows 3..5; prefill's extend stream: token 0 rows 0 and 1 of
/// `extend`, token 1 none).
struct AttentionCase {
    arena: Arena,
    q: usize,
    out: usize,
    lse: usize,
    sink: usize,
    indices: usize,
    indptr: usize,
    extend: usize,
    extend_indptr: usize,
}

impl AttentionCase {
    fn new(rng: &mut StdRng, pool: &Pool) -> Self {
        let rows = pool.layer(0).rows as usize;
        pool.rows_mut(0)
            .copy_from_slice(&random_bf16(rng, rows * D));
        let mut r = Regions::default();
        let q = r.take(T * (H + 1) * D * 2);
        let (out, lse, sink) = (r.take(T * H * D * 2), r.take(T * H * 4), r.take(H * 4));
        let (indices, indptr) = (r.take(5 * 4), r.take(3 * 4));
        let (extend, extend_indptr) = (r.take(2 * D * 2), r.take(3 * 4));
        let mut arena = Arena::new(&r);
        arena.write_rows(q, (H + 1) * D, H * D, &random_bf16(rng, T * H * D));
        arena.write(sink, &[0.5f32, -1.0]);
        arena.write(indices, &[0i32, 1, 2, 3, 4]);
        arena.write(indptr, &[0i32, 3, 5]);
        arena.write(extend, &random_bf16(rng, 2 * D));
        arena.write(extend_indptr, &[0i32, 2, 2]);
        AttentionCase {
            arena,
            q,
            out,
            lse,
            sink,
            indices,
            indptr,
            extend,
            extend_indptr,
        }
    }

    fn q(&self) -> unikv_tensor {
        self.arena.strided::<bf16>(self.q, &[T, H, D], &Q_STRIDES)
    }

    fn decode_args(&self) -> unikv_decode_args {
        let a = &self.arena;
        unikv_decode_args {
            struct_size: size_of::<unikv_decode_args>(),
            q: self.q(),
            indices: a.t::<i32>(self.indices, &[5]),
            indptr: a.t::<i32>(self.indptr, &[3]),
            sink: a.t::<f32>(self.sink, &[H]),
            out: a.t::<bf16>(self.out, &[T, H, D]),
            lse: a.t::<f32>(self.lse, &[T, H]),
            layer: 0,
            num_tokens: T as u32,
            softmax_scale: 0.05,
            reserved: 0,
            rope_table: absent(),
            positions: absent(),
        }
    }

    /// Decode's streams as the prefix, and the extend stream.
    fn prefill_args(&self) -> unikv_prefill_args {
        let d = self.decode_args();
        let a = &self.arena;
        unikv_prefill_args {
            struct_size: size_of::<unikv_prefill_args>(),
            q: d.q,
            indices: d.indices,
            indptr: d.indptr,
            sink: d.sink,
            out: d.out,
            lse: d.lse,
            extend_kv: a.t::<bf16>(self.extend, &[2, D]),
            extend_indices: a.t::<i32>(self.indices, &[2]),
            extend_indptr: a.t::<i32>(self.extend_indptr, &[3]),
            layer: 0,
            num_tokens: T as u32,
            softmax_scale: 0.05,
            reserved: 0,
        }
    }

    /// Token t's output heads as computed out of place.
    fn out_of_place(&self, t: usize) -> Vec<u8> {
        self.arena.region(self.out + t * H * D * 2, H * D * 2)
    }

    /// Token t's heads of the q region (the output when run in place).
    fn in_place(&self, t: usize) -> Vec<u8> {
        self.arena.region(self.q + t * (H + 1) * D * 2, H * D * 2)
    }
}

/// Decode's `out` may be `q` itself: the same bytes and LSE as out of place.
/// `out` one head further, `lse` inside `q`, or `out` inside the pool rows
/// the call reads are refused.
#[test]
fn sparse_decode_out_may_be_q_exactly() {
    let (mut rng, _) = seeded("sparse_decode_out_may_be_q_exactly");
    let ctx = Ctx::cpu(2);
    let pool = dense_pool(&ctx, unikv_dtype::UNIKV_DTYPE_BF16);
    let mut plan = ptr::null_mut();
    ok(unsafe { unikv_decode_plan_create(ctx.0, &plan_params(), &mut plan) });
    let c = AttentionCase::new(&mut rng, &pool);
    let run = |args: unikv_decode_args| unsafe {
        unikv_sparse_decode(plan, pool.0, &args, ptr::null_mut(), 0, ptr::null_mut())
    };
    let read = Some((&pool, 0));

    let shifted = c.arena.strided::<bf16>(c.q + D * 2, &[T, H, D], &Q_STRIDES);
    refused_unchanged(
        &c.arena,
        read,
        || {
            run(unikv_decode_args {
                out: shifted,
                ..c.decode_args()
            })
        },
        "out",
        "q (partially; in-place use must be exact",
    );
    let lse = c.arena.t::<f32>(c.q + D * 2 + 64, &[T, H]);
    refused_unchanged(
        &c.arena,
        read,
        || {
            run(unikv_decode_args {
                lse,
                ..c.decode_args()
            })
        },
        "lse",
        "q (partially; exact in-place use is not supported",
    );
    let out = desc::<bf16>(pool.layer(0).data, &[T, H, D], &[H * D, D, 1]);
    refused_unchanged(
        &c.arena,
        read,
        || {
            run(unikv_decode_args {
                out,
                ..c.decode_args()
            })
        },
        "out",
        "the pool's rows of layer 0, which this operation reads",
    );

    ok(run(c.decode_args()));
    let lse_apart = c.arena.region(c.lse, T * H * 4);
    let in_place = unikv_decode_args {
        out: c.q(),
        ..c.decode_args()
    };
    ok(run(in_place));
    for t in 0..T {
        assert_eq!(c.in_place(t), c.out_of_place(t), "token {t}");
    }
    assert_eq!(c.arena.region(c.lse, T * H * 4), lse_apart);
    unsafe { unikv_decode_plan_destroy(plan) };
}

/// Prefill likewise, and its extend rows are an input `out` may not overlap.
#[test]
fn sparse_prefill_out_may_be_q_exactly() {
    let (mut rng, _) = seeded("sparse_prefill_out_may_be_q_exactly");
    let ctx = Ctx::cpu(2);
    let pool = dense_pool(&ctx, unikv_dtype::UNIKV_DTYPE_BF16);
    let mut plan = ptr::null_mut();
    ok(unsafe { unikv_prefill_plan_create(ctx.0, &plan_params(), &mut plan) });
    let c = AttentionCase::new(&mut rng, &pool);
    let run = |args: unikv_prefill_args| unsafe {
        unikv_sparse_prefill(plan, pool.0, &args, ptr::null_mut(), 0, ptr::null_mut())
    };
    let read = Some((&pool, 0));

    let extend_kv = c.arena.t::<bf16>(c.out + 1024, &[2, D]);
    refused_unchanged(
        &c.arena,
        read,
        || {
            run(unikv_prefill_args {
                extend_kv,
                ..c.prefill_args()
            })
        },
        "out",
        "extend_kv",
    );
    let shifted = c.arena.strided::<bf16>(c.q + D * 2, &[T, H, D], &Q_STRIDES);
    refused_unchanged(
        &c.arena,
        read,
        || {
            run(unikv_prefill_args {
                out: shifted,
                ..c.prefill_args()
            })
        },
        "out",
        "q (partially",
    );

    ok(run(c.prefill_args()));
    let in_place = unikv_prefill_args {
        out: c.q(),
        ..c.prefill_args()
    };
    ok(run(in_place));
    for t in 0..T {
        assert_eq!(c.in_place(t), c.out_of_place(t), "token {t}");
    }
    unsafe { unikv_prefill_plan_destroy(plan) };
}

/// Merge has no in-place use: an output that is one part of its input is
/// refused.
#[test]
fn merge_refuses_outputs_inside_the_parts() {
    let (mut rng, _) = seeded("merge_refuses_outputs_inside_the_parts");
    let ctx = Ctx::cpu(1);
    let (p, t, h) = (2, 1, 2);
    let mut r = Regions::default();
    let (parts_out, parts_lse) = (r.take(p * t * h * D * 2), r.take(p * t * h * 4));
    let (out, lse) = (r.take(t * h * D * 2), r.take(t * h * 4));
    let mut a = Arena::new(&r);
    a.write(parts_out, &random_bf16(&mut rng, p * t * h * D));
    a.write(parts_lse, &[1.0f32, 2.0, 0.5, -1.0]);
    let args = unikv_merge_args {
        struct_size: size_of::<unikv_merge_args>(),
        parts_out: a.t::<bf16>(parts_out, &[p, t, h, D]),
        parts_lse: a.t::<f32>(parts_lse, &[p, t, h]),
        sink: absent(),
        out: a.t::<bf16>(out, &[t, h, D]),
        lse: a.t::<f32>(lse, &[t, h]),
        num_tokens: t as u32,
        reserved: 0,
    };
    let run =
        |args: unikv_merge_args| unsafe { unikv_attention_merge(ctx.0, &args, ptr::null_mut()) };
    let part0 = a.t::<bf16>(parts_out, &[t, h, D]);
    refused_unchanged(
        &a,
        None,
        || run(unikv_merge_args { out: part0, ..args }),
        "out",
        "parts_out (partially",
    );
    let lse1 = a.t::<f32>(parts_lse + t * h * 4, &[t, h]);
    refused_unchanged(
        &a,
        None,
        || run(unikv_merge_args { lse: lse1, ..args }),
        "lse",
        "parts_lse",
    );
    ok(run(args));
}

#[test]
fn inverse_rope_refuses_inputs_inside_x() {
    let (mut rng, _) = seeded("inverse_rope_refuses_inputs_inside_x");
    let ctx = Ctx::cpu(1);
    let mut r = Regions::default();
    let (x, positions, table) = (
        r.take(T * H * D * 2),
        r.take(T * 4),
        r.take(MAX_POS * 64 * 4),
    );
    let mut a = Arena::new(&r);
    a.write(x, &random_bf16(&mut rng, T * H * D));
    a.write(positions, &[1i32, 6]);
    a.write(table, &rope_table(10000.0, 0.0, MAX_POS as u32));
    let args = unikv_inverse_rope_args {
        struct_size: size_of::<unikv_inverse_rope_args>(),
        x: a.t::<bf16>(x, &[T, H, D]),
        positions: a.t::<i32>(positions, &[T]),
        rope_table: a.t::<f32>(table, &[MAX_POS, 64]),
        num_tokens: T as u32,
        num_heads: H as u32,
    };
    let run = |args: unikv_inverse_rope_args| unsafe {
        unikv_inverse_rope(ctx.0, &args, ptr::null_mut())
    };
    // Inside the nope dims, which the op never writes: still refused.
    let rope_table = a.t::<f32>(x + 32, &[MAX_POS, 64]);
    refused_unchanged(
        &a,
        None,
        || run(unikv_inverse_rope_args { rope_table, ..args }),
        "x",
        "rope_table",
    );
    let positions = a.t::<i32>(x + 2000, &[T]);
    refused_unchanged(
        &a,
        None,
        || run(unikv_inverse_rope_args { positions, ..args }),
        "x",
        "positions",
    );
    ok(run(args));
}

// ---------------------------------------------------------------------------
// Caches, the indexer, routing

/// Bytes of a FlashMLA cache page of 64 tokens and an indexer cache page.
const FLASHMLA_PAGE: usize = 37_440;
const INDEXER_PAGE: usize = 132 * 64;

#[test]
fn cache_stores_refuse_rows_inside_the_cache() {
    let (mut rng, _) = seeded("cache_stores_refuse_rows_inside_the_cache");
    let ctx = Ctx::cpu(1);
    let mut r = Regions::default();
    let (flashmla, indexer) = (r.take(FLASHMLA_PAGE), r.take(INDEXER_PAGE));
    let (kv, key, loc) = (r.take(D * 2), r.take(128 * 2), r.take(16));
    let mut a = Arena::new(&r);
    a.write(kv, &random_bf16(&mut rng, D));
    a.write(key, &random_bf16(&mut rng, 128));
    a.write(loc, &[5i32]);
    let store = unikv_store_flashmla_args {
        struct_size: size_of::<unikv_store_flashmla_args>(),
        cache: a.t::<u8>(flashmla, &[1, FLASHMLA_PAGE]),
        kv: a.t::<bf16>(kv, &[1, D]),
        loc: a.t::<i32>(loc, &[1]),
        page_size: 64,
        cache_dtype: FP8,
        num_tokens: 1,
        reserved: 0,
    };
    let inside = a.t::<bf16>(flashmla + 4096, &[1, D]);
    refused_unchanged(
        &a,
        None,
        || unsafe {
            unikv_store_flashmla(
                ctx.0,
                &unikv_store_flashmla_args {
                    kv: inside,
                    ..store
                },
                ptr::null_mut(),
            )
        },
        "cache",
        "kv",
    );
    ok(unsafe { unikv_store_flashmla(ctx.0, &store, ptr::null_mut()) });

    let store = unikv_store_indexer_args {
        struct_size: size_of::<unikv_store_indexer_args>(),
        cache: a.t::<u8>(indexer, &[1, INDEXER_PAGE]),
        key: a.t::<bf16>(key, &[1, 128]),
        loc: a.t::<i32>(loc, &[1]),
        page_size: 64,
        cache_dtype: FP8,
        num_tokens: 1,
        reserved: 0,
    };
    let inside = a.t::<i32>(indexer + INDEXER_PAGE - 4, &[1]);
    refused_unchanged(
        &a,
        None,
        || unsafe {
            unikv_store_indexer(
                ctx.0,
                &unikv_store_indexer_args {
                    loc: inside,
                    ..store
                },
                ptr::null_mut(),
            )
        },
        "cache",
        "loc",
    );
    ok(unsafe { unikv_store_indexer(ctx.0, &store, ptr::null_mut()) });
}

#[test]
fn indexer_ops_refuse_overlapping_outputs() {
    let (mut rng, _) = seeded("indexer_ops_refuse_overlapping_outputs");
    let ctx = Ctx::cpu(1);
    let (heads, keys, topk) = (4, 8, 4);
    let mut r = Regions::default();
    let (q, weights, table, positions) = (
        r.take(T * heads * 128 * 2),
        r.take(T * heads * 2),
        r.take(MAX_POS * 64 * 4),
        r.take(T * 4),
    );
    let (q_fp8, weights_out, cache, key, norm) = (
        r.take(T * heads * 128),
        r.take(T * heads * 4),
        r.take(INDEXER_PAGE),
        r.take(T * 128 * 2),
        r.take(128 * 2),
    );
    let (ints, logits, topk_indices) = (r.take(32), r.take(T * keys * 4), r.take(T * topk * 4));
    let mut a = Arena::new(&r);
    a.write(q, &random_bf16(&mut rng, T * heads * 128));
    a.write(weights, &random_bf16(&mut rng, T * heads));
    a.write(table, &rope_table(10000.0, 0.0, MAX_POS as u32));
    a.write(positions, &[3i32, 7]);
    a.write(key, &random_bf16(&mut rng, T * 128));
    a.write(norm, &vec![bf16::ONE; 128]);
    a.write(ints, &[0i32, 0, 0, 1]); // page_table [1, 1], batch_id x2, loc x2 from 0
    a.write(logits, &(0..T * keys).map(|i| i as f32).collect::<Vec<_>>());

    let prepare_q = unikv_indexer_prepare_q_args {
        struct_size: size_of::<unikv_indexer_prepare_q_args>(),
        q: a.t::<bf16>(q, &[T, heads, 128]),
        weights: a.t::<bf16>(weights, &[T, heads]),
        rope_table: a.t::<f32>(table, &[MAX_POS, 64]),
        positions: a.t::<i32>(positions, &[T]),
        q_fp8: a.t::<u8>(q_fp8, &[T, heads, 128]),
        weights_out: a.t::<f32>(weights_out, &[T, heads]),
        q_dtype: FP8,
        num_tokens: T as u32,
        num_heads: heads as u32,
        weight_scale: 0.25,
    };
    let run_q = |args: unikv_indexer_prepare_q_args| unsafe {
        unikv_indexer_prepare_q(ctx.0, &args, ptr::null_mut())
    };
    let weights_out_in_q = a.t::<f32>(q + 256, &[T, heads]);
    refused_unchanged(
        &a,
        None,
        || {
            run_q(unikv_indexer_prepare_q_args {
                weights_out: weights_out_in_q,
                ..prepare_q
            })
        },
        "weights_out",
        "q (partially",
    );
    ok(run_q(prepare_q));

    let prepare_k = unikv_indexer_prepare_k_args {
        struct_size: size_of::<unikv_indexer_prepare_k_args>(),
        cache: a.t::<u8>(cache, &[1, INDEXER_PAGE]),
        key: a.t::<bf16>(key, &[T, 128]),
        norm_weight: a.t::<bf16>(norm, &[128]),
        rope_table: a.t::<f32>(table, &[MAX_POS, 64]),
        positions: a.t::<i32>(positions, &[T]),
        loc: a.t::<i32>(ints + 8, &[T]),
        page_size: 64,
        cache_dtype: FP8,
        num_tokens: T as u32,
        eps: 1e-6,
        reserved: 0,
    };
    let run_k = |args: unikv_indexer_prepare_k_args| unsafe {
        unikv_indexer_prepare_k(ctx.0, &args, ptr::null_mut())
    };
    let key_in_cache = a.t::<bf16>(cache + 128 * 60, &[T, 128]);
    refused_unchanged(
        &a,
        None,
        || {
            run_k(unikv_indexer_prepare_k_args {
                key: key_in_cache,
                ..prepare_k
            })
        },
        "cache",
        "key",
    );
    ok(run_k(prepare_k));

    let topk_args = unikv_indexer_topk_args {
        struct_size: size_of::<unikv_indexer_topk_args>(),
        q_fp8: a.t::<u8>(q_fp8, &[T, heads, 128]),
        weights: a.t::<f32>(weights_out, &[T, heads]),
        cache: a.t::<u8>(cache, &[1, INDEXER_PAGE]),
        page_table: a.t::<i32>(ints, &[1, 1]),
        batch_id: a.t::<i32>(ints + 4, &[T]),
        positions: a.t::<i32>(positions, &[T]),
        logits: a.t::<f32>(logits, &[T, keys]),
        topk_indices: a.t::<i32>(topk_indices, &[T, topk]),
        cache_dtype: FP8,
        num_tokens: T as u32,
        num_heads: heads as u32,
        topk: topk as u32,
    };
    let indices_in_logits = a.t::<i32>(logits + 16, &[T, topk]);
    let overlapping = unikv_indexer_topk_args {
        topk_indices: indices_in_logits,
        ..topk_args
    };
    refused_unchanged(
        &a,
        None,
        || unsafe { unikv_indexer_topk(ctx.0, &overlapping, ptr::null_mut()) },
        "logits",
        "topk_indices",
    );
    ok(unsafe { unikv_indexer_topk(ctx.0, &topk_args, ptr::null_mut()) });
    refused_unchanged(
        &a,
        None,
        || unsafe { unikv_indexer_topk_from_logits(ctx.0, &overlapping, ptr::null_mut()) },
        "topk_indices",
        "logits",
    );
    ok(unsafe { unikv_indexer_topk_from_logits(ctx.0, &topk_args, ptr::null_mut()) });
}

#[test]
fn hash_topk_refuses_overlapping_outputs() {
    let ctx = Ctx::cpu(1);
    let (experts, k, vocab) = (8, 2, 4);
    let slots = k + 1;
    let mut r = Regions::default();
    let (logits, ids, table) = (
        r.take(T * experts * 4),
        r.take(T * 4),
        r.take(vocab * k * 4),
    );
    let (weights, topk_ids, real) = (r.take(T * slots * 4), r.take(T * slots * 4), r.take(4));
    let mut a = Arena::new(&r);
    a.write(
        logits,
        &(0..T * experts).map(|i| i as f32 / 8.0).collect::<Vec<_>>(),
    );
    a.write(ids, &[1i32, 3]);
    a.write(
        table,
        &(0..(vocab * k) as i32)
            .map(|i| i % experts as i32)
            .collect::<Vec<_>>(),
    );
    a.write(real, &[T as i32]);
    let args = unikv_hash_topk_args {
        struct_size: size_of::<unikv_hash_topk_args>(),
        router_logits: a.t::<f32>(logits, &[T, experts]),
        input_ids: a.t::<i32>(ids, &[T]),
        tid2eid: a.t::<i32>(table, &[vocab, k]),
        topk_weights: a.t::<f32>(weights, &[T, slots]),
        topk_ids: a.t::<i32>(topk_ids, &[T, slots]),
        num_real_tokens: a.t::<i32>(real, &[1]),
        num_real_tokens_host: 0,
        num_tokens: T as u32,
        num_shared: 1,
        routed_scaling_factor: 1.5,
    };
    let run =
        |args: unikv_hash_topk_args| unsafe { unikv_hash_topk(ctx.0, &args, ptr::null_mut()) };
    let ids_in_logits = a.t::<i32>(logits + 8, &[T, slots]);
    refused_unchanged(
        &a,
        None,
        || {
            run(unikv_hash_topk_args {
                topk_ids: ids_in_logits,
                ..args
            })
        },
        "topk_ids",
        "router_logits",
    );
    let real_in_weights = a.t::<i32>(weights + 4, &[1]);
    refused_unchanged(
        &a,
        None,
        || {
            run(unikv_hash_topk_args {
                num_real_tokens: real_in_weights,
                ..args
            })
        },
        "topk_weights",
        "num_real_tokens",
    );
    ok(run(args));
}
