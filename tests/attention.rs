//! `unikv_sparse_decode` / `unikv_sparse_prefill` on the CPU backend, through the
//! C ABI, against an independent float64 reference written here from spec
//! unified_kv §3.2 / §4.4 (it shares no code with the implementation):
//!
//! for token t, head h and key set K_t (K = V):
//! `s_j = scale * <q, k_j>`, `z = sink[h]` (-inf when absent),
//! `M = max(z, max_j s_j)`, `den = e^(z-M) + sum_j e^(s_j-M)`,
//! `out = sum_j e^(s_j-M) k_j / den` (exact zeros for an empty key set),
//! `lse = M + ln(den)` (the sink itself for an empty key set, -inf without sink).
//!
//! Every run draws fresh random inputs; the seed is printed (and in every
//! assertion message). Rerun a failure with `UNIKV_TEST_SEED=<seed>`.

mod common;

use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use half::bf16;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use unikv::ffi::attention::*;
use unikv::ffi::status::unikv_status;
use unikv::ffi::types::{unikv_dtype, unikv_tensor};

/// Latent width.
const D: usize = 512;
/// DeepSeek-V4's softmax scale, 512^-0.5.
const SCALE: f32 = 0.044_194_173;
/// The pool layer the tests attend over (layer 0 holds other random data).
const LAYER: u32 = 1;
/// Slice lengths the ragged batches draw from (0, 1 and > 2048 included).
const LENGTHS: [usize; 8] = [0, 1, 2, 17, 128, 640, 1152, 2300];
/// Rows of the extend K tensor in prefill tests.
const EXTEND_ROWS: usize = 300;
/// bf16 bit pattern of the poison byte pair.
const POISON_BF16: u16 = u16::from_ne_bytes([POISON_BYTE, POISON_BYTE]);
const POISON_F32: u32 = u32::from_ne_bytes([POISON_BYTE; 4]);

// ---------------------------------------------------------------------------
// Randomness

/// `n` distinct rows below `rows`, in random order.
fn unique_rows(rng: &mut StdRng, rows: usize, n: usize) -> Vec<i32> {
    rand::seq::index::sample(rng, rows, n)
        .into_iter()
        .map(|r| r as i32)
        .collect()
}

/// Inserts `count` -1 entries at random positions (front and back included).
fn sprinkle(rng: &mut StdRng, mut list: Vec<i32>, count: usize) -> Vec<i32> {
    for _ in 0..count {
        let at = rng.random_range(0..=list.len());
        list.insert(at, -1);
    }
    list
}

/// `n` ragged lengths: always 0, 1 and 2300, the rest drawn from `LENGTHS`,
/// shuffled.
fn ragged_lengths(rng: &mut StdRng, n: usize) -> Vec<usize> {
    assert!(n >= 3);
    let mut lens = vec![0, 1, 2300];
    while lens.len() < n {
        lens.push(LENGTHS[rng.random_range(0..LENGTHS.len())]);
    }
    lens.shuffle(rng);
    lens
}

/// Per-head sink logits around the typical log-sum-exp of the scores, so the
/// sink really moves the result.
fn random_sink(rng: &mut StdRng, heads: usize) -> Vec<f32> {
    (0..heads).map(|_| rng.random_range(-3.0f32..8.0)).collect()
}

// ---------------------------------------------------------------------------
// Buffers and descriptors

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Block([u8; 64]);

/// A 64-byte aligned host buffer of `len` elements (bf16 rows must be 16-byte
/// aligned; a plain `Vec<bf16>` only guarantees 2).
struct Buf<T> {
    blocks: Vec<Block>,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T: Copy> Buf<T> {
    /// Every byte set to `POISON_BYTE` (through `common::poisoned`).
    fn poisoned(len: usize) -> Self {
        let bytes = len * std::mem::size_of::<T>();
        Buf {
            blocks: poisoned::<Block>(bytes.div_ceil(64) + 1),
            len,
            _elem: PhantomData,
        }
    }

    fn from_slice(data: &[T]) -> Self {
        let mut b = Self::poisoned(data.len());
        b.as_mut_slice().copy_from_slice(data);
        b
    }

    fn as_slice(&self) -> &[T] {
        unsafe { std::slice::from_raw_parts(self.blocks.as_ptr() as *const T, self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        unsafe { std::slice::from_raw_parts_mut(self.blocks.as_mut_ptr() as *mut T, self.len) }
    }
}

/// A descriptor with explicit strides (elements); checks the span fits `data`.
fn strided<T: Dt>(data: &[T], shape: &[usize], strides: &[usize]) -> unikv_tensor {
    assert_eq!(shape.len(), strides.len());
    let span = 1 + shape
        .iter()
        .zip(strides)
        .map(|(n, s)| (n - 1) * s)
        .sum::<usize>();
    assert!(span <= data.len(), "descriptor spans past its buffer");
    let mut t = tensor(data, shape);
    for (axis, &s) in strides.iter().enumerate() {
        t.strides[axis] = s as i64;
    }
    t
}

/// Element strides of a `[tokens, heads, 512]` tensor.
#[derive(Clone, Copy, Debug)]
struct Layout {
    token: usize,
    head: usize,
}

impl Layout {
    fn dense(heads: usize) -> Self {
        Layout {
            token: heads * D,
            head: D,
        }
    }

    fn at(&self, t: usize, h: usize) -> usize {
        t * self.token + h * self.head
    }

    /// Elements needed for `tokens` token rows.
    fn len(&self, tokens: usize, heads: usize) -> usize {
        (tokens - 1) * self.token + (heads - 1) * self.head + D
    }

    fn descriptor(&self, data: &[bf16], tokens: usize, heads: usize) -> unikv_tensor {
        strided(data, &[tokens, heads, D], &[self.token, self.head, 1])
    }
}

/// Puts `lead` garbage entries before the slices (indptr[0] > 0).
fn with_leading(lead: &[i32], indices: &mut Vec<i32>, indptr: &mut [i32]) {
    indices.splice(0..0, lead.iter().copied());
    for p in indptr.iter_mut() {
        *p += lead.len() as i32;
    }
}

/// Concatenates per-token lists into (indices, indptr).
fn csr(lists: &[Vec<i32>]) -> (Vec<i32>, Vec<i32>) {
    let mut indices = Vec::new();
    let mut indptr = vec![0i32];
    for list in lists {
        indices.extend_from_slice(list);
        indptr.push(indices.len() as i32);
    }
    (indices, indptr)
}

// ---------------------------------------------------------------------------
// Handles

fn plan_params(max_tokens: usize, heads: usize) -> unikv_attention_plan_params {
    let bf = unikv_dtype::UNIKV_DTYPE_BF16 as u32;
    unikv_attention_plan_params {
        struct_size: std::mem::size_of::<unikv_attention_plan_params>(),
        max_tokens: max_tokens as u32,
        num_heads: heads as u32,
        head_dim: D as u32,
        q_dtype: bf,
        kv_dtype: bf,
        out_dtype: bf,
    }
}

struct DecodePlan(*mut unikv_decode_plan);

impl DecodePlan {
    fn new(ctx: &Ctx, max_tokens: usize, heads: usize) -> Self {
        let mut plan = ptr::null_mut();
        ok(unsafe { unikv_decode_plan_create(ctx.0, &plan_params(max_tokens, heads), &mut plan) });
        DecodePlan(plan)
    }
}

impl Drop for DecodePlan {
    fn drop(&mut self) {
        unsafe { unikv_decode_plan_destroy(self.0) };
    }
}

struct PrefillPlan(*mut unikv_prefill_plan);

impl PrefillPlan {
    fn new(ctx: &Ctx, max_tokens: usize, heads: usize) -> Self {
        let mut plan = ptr::null_mut();
        ok(unsafe { unikv_prefill_plan_create(ctx.0, &plan_params(max_tokens, heads), &mut plan) });
        PrefillPlan(plan)
    }
}

impl Drop for PrefillPlan {
    fn drop(&mut self) {
        unsafe { unikv_prefill_plan_destroy(self.0) };
    }
}

/// Two layers (ratios 0 and 4); the attended layer 1 has 3392 rows.
fn pool_spec() -> PoolSpec {
    PoolSpec {
        ratios: vec![0, 4],
        max_requests: 1,
        window: 128,
        spec_extra: 0,
        c128_blocks: 96,
    }
}

/// A pool whose every row holds random bf16 (written through `rows_mut`), and
/// a host snapshot of the attended layer for the reference.
struct KvPool {
    pool: Pool,
    /// Copy of layer `LAYER`, `[rows, 512]`.
    rows: Vec<bf16>,
}

impl KvPool {
    fn new(ctx: &Ctx, rng: &mut StdRng) -> Self {
        let pool = Pool::new(ctx, &pool_spec());
        for layer in 0..pool.info().num_layers {
            let dst = pool.rows_mut(layer);
            let src = random_bf16(rng, dst.len());
            dst.copy_from_slice(&src);
        }
        let rows = pool.rows_mut(LAYER).to_vec();
        KvPool { pool, rows }
    }

    /// Another pool (maybe on another context) with the same layer contents.
    fn clone_on(&self, ctx: &Ctx) -> Self {
        let pool = Pool::new(ctx, &pool_spec());
        for layer in 0..pool.info().num_layers {
            pool.rows_mut(layer)
                .copy_from_slice(self.pool.rows_mut(layer));
        }
        KvPool {
            pool,
            rows: self.rows.clone(),
        }
    }

    fn num_rows(&self) -> usize {
        self.rows.len() / D
    }

    fn row(&self, r: i32) -> &[bf16] {
        let r = r as usize;
        &self.rows[r * D..(r + 1) * D]
    }
}

// ---------------------------------------------------------------------------
// Float64 reference (spec §3.2; prefill §4.4: both sources share one softmax)

struct Reference {
    heads: usize,
    /// `[tokens, heads, 512]`.
    out: Vec<f64>,
    /// `[tokens, heads]`.
    lse: Vec<f64>,
    /// Keys of each token.
    keys: Vec<usize>,
}

fn dot64(a: &[f64], b: &[f64]) -> f64 {
    let mut lanes = [0f64; 8];
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for i in 0..8 {
            lanes[i] += ca[i] * cb[i];
        }
    }
    lanes.iter().sum()
}

/// One token: `q` holds its head rows at `head_stride`; returns (out, lse).
fn reference_token(
    q: &[bf16],
    head_stride: usize,
    heads: usize,
    keys: &[&[bf16]],
    sink: Option<&[f32]>,
    scale: f32,
) -> (Vec<f64>, Vec<f64>) {
    let k64: Vec<f64> = keys
        .iter()
        .flat_map(|row| row.iter().map(|x| x.to_f64()))
        .collect();
    let scale = scale as f64;
    let mut out = vec![0f64; heads * D];
    let mut lse = vec![0f64; heads];
    let mut scores = Vec::with_capacity(keys.len());
    for h in 0..heads {
        let qh: Vec<f64> = q[h * head_stride..h * head_stride + D]
            .iter()
            .map(|x| x.to_f64())
            .collect();
        let z = sink.map_or(f64::NEG_INFINITY, |s| s[h] as f64);
        if keys.is_empty() {
            // Zero output; the log-sum-exp is the sink's own logit.
            lse[h] = z;
            continue;
        }
        scores.clear();
        scores.extend(k64.chunks_exact(D).map(|k| scale * dot64(&qh, k)));
        let m = scores.iter().fold(z, |a, &b| a.max(b));
        let mut den = if z == f64::NEG_INFINITY {
            0.0
        } else {
            (z - m).exp()
        };
        let acc = &mut out[h * D..(h + 1) * D];
        for (s, k) in scores.iter().zip(k64.chunks_exact(D)) {
            let w = (s - m).exp();
            den += w;
            for (a, x) in acc.iter_mut().zip(k) {
                *a += w * x;
            }
        }
        for a in acc.iter_mut() {
            *a /= den;
        }
        lse[h] = m + den.ln();
    }
    (out, lse)
}

/// The whole batch, tokens spread over the host's cores.
fn reference(
    q: &[bf16],
    layout: Layout,
    heads: usize,
    keys: &[Vec<&[bf16]>],
    sink: Option<&[f32]>,
    scale: f32,
) -> Reference {
    let tokens = keys.len();
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(tokens.max(1));
    let parts: Vec<(usize, Vec<f64>, Vec<f64>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let t = next.fetch_add(1, Ordering::Relaxed);
                        if t >= tokens {
                            break mine;
                        }
                        let qt = &q[t * layout.token..];
                        let (o, l) = reference_token(qt, layout.head, heads, &keys[t], sink, scale);
                        mine.push((t, o, l));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let mut r = Reference {
        heads,
        out: vec![0.0; tokens * heads * D],
        lse: vec![0.0; tokens * heads],
        keys: keys.iter().map(|k| k.len()).collect(),
    };
    for (t, o, l) in parts {
        r.out[t * heads * D..(t + 1) * heads * D].copy_from_slice(&o);
        r.lse[t * heads..(t + 1) * heads].copy_from_slice(&l);
    }
    r
}

/// Key rows of decode tokens.
fn decode_keys<'a>(pool: &'a KvPool, lists: &[Vec<i32>]) -> Vec<Vec<&'a [bf16]>> {
    lists
        .iter()
        .map(|l| l.iter().map(|&r| pool.row(r)).collect())
        .collect()
}

/// Key rows of prefill tokens: valid prefix rows of the pool, then valid rows
/// of the extend tensor (`extend` is `[rows, stride]`, row r at `r * stride`).
fn prefill_keys<'a>(
    pool: &'a KvPool,
    prefix: &[Vec<i32>],
    extend: &'a [bf16],
    extend_stride: usize,
    ext: &[Vec<i32>],
) -> Vec<Vec<&'a [bf16]>> {
    prefix
        .iter()
        .zip(ext)
        .map(|(p, e)| {
            let mut keys: Vec<&[bf16]> = p
                .iter()
                .filter(|&&r| r != -1)
                .map(|&r| pool.row(r))
                .collect();
            keys.extend(e.iter().filter(|&&r| r != -1).map(|&r| {
                let r = r as usize;
                &extend[r * extend_stride..r * extend_stride + D]
            }));
            keys
        })
        .collect()
}

/// Checks `out` (at `layout`) and `lse` (`[tokens, heads]` at row stride
/// `lse.1`) against the reference: empty key sets give exact zeros, otherwise
/// relative L2 error < 1e-2 per (token, head); lse absolute error
/// < 1e-3 * max(1, |ref|), -inf exactly where the reference is -inf.
fn check(tag: &str, r: &Reference, out: &[bf16], layout: Layout, lse: Option<(&[f32], usize)>) {
    let heads = r.heads;
    for (t, &nkeys) in r.keys.iter().enumerate() {
        for h in 0..heads {
            let at = layout.at(t, h);
            let got = &out[at..at + D];
            let want = &r.out[(t * heads + h) * D..(t * heads + h + 1) * D];
            let id = format!("{tag}: token {t} head {h} ({nkeys} keys)");
            // The poison pattern is a valid bf16 (about -2.9e-16), so a tiny
            // true output may round to it: flag it only where the reference
            // is not that value.
            let poison = bf16::from_bits(POISON_BF16).to_f64();
            for (d, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    g.to_bits() != POISON_BF16 || (w - poison).abs() <= 1e-2 * poison.abs(),
                    "{id}: output element {d} not written (poison left, reference {w:e})"
                );
            }
            if nkeys == 0 {
                assert!(
                    got.iter().all(|x| x.to_f32() == 0.0),
                    "{id}: empty key set must give exact zeros, got {:?}",
                    &got[..8]
                );
            } else {
                let want_norm = want.iter().map(|x| x * x).sum::<f64>().sqrt();
                let err = got
                    .iter()
                    .zip(want)
                    .map(|(g, w)| (g.to_f64() - w).powi(2))
                    .sum::<f64>()
                    .sqrt();
                assert!(got.iter().all(|x| x.is_finite()), "{id}: non-finite output");
                if want_norm < 1e-30 {
                    // Underflow (a huge sink): the true output is below what f32
                    // arithmetic represents, so it must be ~0.
                    let max = got.iter().map(|x| x.to_f64().abs()).fold(0.0, f64::max);
                    assert!(max < 1e-3, "{id}: output should be ~0, max |out| = {max}");
                } else {
                    let rel = err / want_norm;
                    assert!(
                        rel < 1e-2,
                        "{id}: relative L2 error {rel:.3e} (|ref| = {want_norm:.4e}); \
                         got[..4] = {:?}, ref[..4] = {:?}",
                        &got[..4],
                        &want[..4]
                    );
                }
            }
            if let Some((lse, stride)) = lse {
                let got = lse[t * stride + h];
                let want = r.lse[t * heads + h];
                let poison = f32::from_bits(POISON_F32) as f64;
                assert!(
                    got.to_bits() != POISON_F32 || (want - poison).abs() <= 1e-3 * poison.abs(),
                    "{id}: lse not written (poison left, reference {want:e})"
                );
                if want == f64::NEG_INFINITY {
                    assert_eq!(got, f32::NEG_INFINITY, "{id}: lse must be -inf");
                } else {
                    let tol = 1e-3 * want.abs().max(1.0);
                    assert!(
                        (got as f64 - want).abs() < tol,
                        "{id}: lse {got} vs reference {want}"
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Launch helpers (contiguous layouts)

/// Host inputs of one batch. Decode uses `lists` only; prefill adds `ext`.
struct Batch {
    heads: usize,
    scale: f32,
    /// `[tokens, heads, 512]`, contiguous.
    q: Buf<bf16>,
    lists: Vec<Vec<i32>>,
    sink: Option<Vec<f32>>,
    /// `[EXTEND_ROWS, 512]` extend K rows (prefill).
    extend_kv: Buf<bf16>,
    ext: Vec<Vec<i32>>,
}

impl Batch {
    fn new(rng: &mut StdRng, heads: usize, lists: Vec<Vec<i32>>) -> Self {
        let tokens = lists.len();
        Batch {
            heads,
            scale: SCALE,
            q: Buf::from_slice(&random_bf16(rng, tokens * heads * D)),
            ext: vec![Vec::new(); tokens],
            lists,
            sink: Some(random_sink(rng, heads)),
            extend_kv: Buf::from_slice(&random_bf16(rng, EXTEND_ROWS * D)),
        }
    }

    fn tokens(&self) -> usize {
        self.lists.len()
    }

    fn sink_desc(&self) -> unikv_tensor {
        self.sink.as_ref().map_or(absent(), |s| vec1(s))
    }

    fn decode_reference(&self, pool: &KvPool) -> Reference {
        let keys = decode_keys(pool, &self.lists);
        reference(
            self.q.as_slice(),
            Layout::dense(self.heads),
            self.heads,
            &keys,
            self.sink.as_deref(),
            self.scale,
        )
    }

    fn prefill_reference(&self, pool: &KvPool) -> Reference {
        let keys = prefill_keys(pool, &self.lists, self.extend_kv.as_slice(), D, &self.ext);
        reference(
            self.q.as_slice(),
            Layout::dense(self.heads),
            self.heads,
            &keys,
            self.sink.as_deref(),
            self.scale,
        )
    }
}

/// Poisoned outputs of one launch.
struct Outputs {
    out: Buf<bf16>,
    lse: Vec<f32>,
}

impl Outputs {
    fn new(tokens: usize, heads: usize) -> Self {
        Outputs {
            out: Buf::poisoned(tokens * heads * D),
            lse: poisoned(tokens * heads),
        }
    }

    fn token_bytes(&self, t: usize, heads: usize) -> (Vec<u8>, Vec<u8>) {
        (
            bytes_of(&self.out.as_slice()[t * heads * D..(t + 1) * heads * D]),
            bytes_of(&self.lse[t * heads..(t + 1) * heads]),
        )
    }
}

fn decode_args(
    b: &Batch,
    indices: &[i32],
    indptr: &[i32],
    o: &mut Outputs,
    with_lse: bool,
) -> unikv_decode_args {
    let (t, h) = (b.tokens(), b.heads);
    unikv_decode_args {
        struct_size: std::mem::size_of::<unikv_decode_args>(),
        q: tensor(b.q.as_slice(), &[t, h, D]),
        indices: vec1(indices),
        indptr: vec1(indptr),
        sink: b.sink_desc(),
        out: tensor(o.out.as_mut_slice(), &[t, h, D]),
        lse: if with_lse {
            tensor(&o.lse, &[t, h])
        } else {
            absent()
        },
        layer: LAYER,
        num_tokens: t as u32,
        softmax_scale: b.scale,
        reserved: 0,
        rope_table: absent(),
        positions: absent(),
    }
}

fn launch_decode(plan: &DecodePlan, pool: &KvPool, args: &unikv_decode_args) -> unikv_status {
    unsafe {
        unikv_sparse_decode(
            plan.0,
            pool.pool.0,
            args,
            ptr::null_mut(),
            0,
            ptr::null_mut(),
        )
    }
}

fn launch_prefill(plan: &PrefillPlan, pool: &KvPool, args: &unikv_prefill_args) -> unikv_status {
    unsafe {
        unikv_sparse_prefill(
            plan.0,
            pool.pool.0,
            args,
            ptr::null_mut(),
            0,
            ptr::null_mut(),
        )
    }
}

/// Runs decode on fresh poisoned outputs and expects success.
fn run_decode(plan: &DecodePlan, pool: &KvPool, b: &Batch, with_lse: bool) -> Outputs {
    let (indices, indptr) = csr(&b.lists);
    let mut o = Outputs::new(b.tokens(), b.heads);
    let args = decode_args(b, &indices, &indptr, &mut o, with_lse);
    ok(launch_decode(plan, pool, &args));
    o
}

struct PrefillStreams {
    indices: Vec<i32>,
    indptr: Vec<i32>,
    ext_indices: Vec<i32>,
    ext_indptr: Vec<i32>,
}

impl PrefillStreams {
    fn of(b: &Batch) -> Self {
        let (indices, indptr) = csr(&b.lists);
        let (ext_indices, ext_indptr) = csr(&b.ext);
        PrefillStreams {
            indices,
            indptr,
            ext_indices,
            ext_indptr,
        }
    }
}

fn prefill_args(b: &Batch, s: &PrefillStreams, o: &mut Outputs) -> unikv_prefill_args {
    let (t, h) = (b.tokens(), b.heads);
    unikv_prefill_args {
        struct_size: std::mem::size_of::<unikv_prefill_args>(),
        q: tensor(b.q.as_slice(), &[t, h, D]),
        indices: vec1(&s.indices),
        indptr: vec1(&s.indptr),
        sink: b.sink_desc(),
        out: tensor(o.out.as_mut_slice(), &[t, h, D]),
        lse: tensor(&o.lse, &[t, h]),
        extend_kv: tensor(b.extend_kv.as_slice(), &[EXTEND_ROWS, D]),
        extend_indices: vec1(&s.ext_indices),
        extend_indptr: vec1(&s.ext_indptr),
        layer: LAYER,
        num_tokens: t as u32,
        softmax_scale: b.scale,
        reserved: 0,
    }
}

fn run_prefill(plan: &PrefillPlan, pool: &KvPool, b: &Batch) -> Outputs {
    let s = PrefillStreams::of(b);
    let mut o = Outputs::new(b.tokens(), b.heads);
    let args = prefill_args(b, &s, &mut o);
    ok(launch_prefill(plan, pool, &args));
    o
}

fn check_decode(tag: &str, pool: &KvPool, b: &Batch, o: &Outputs, with_lse: bool) {
    let r = b.decode_reference(pool);
    let lse = with_lse.then_some((&o.lse[..], b.heads));
    check(tag, &r, o.out.as_slice(), Layout::dense(b.heads), lse);
    if !with_lse {
        assert!(
            o.lse.iter().all(|x| x.to_bits() == POISON_F32),
            "{tag}: lse was absent but the buffer changed"
        );
    }
}

fn check_prefill(tag: &str, pool: &KvPool, b: &Batch, o: &Outputs) {
    let r = b.prefill_reference(pool);
    check(
        tag,
        &r,
        o.out.as_slice(),
        Layout::dense(b.heads),
        Some((&o.lse, b.heads)),
    );
}

/// Random prefill streams for a ragged batch: prefix lengths from `lens` with
/// -1 sprinkled in, extend lists of 0..=128 unique extend rows with -1 too.
fn random_prefill_batch(rng: &mut StdRng, pool: &KvPool, heads: usize, lens: &[usize]) -> Batch {
    let lists: Vec<Vec<i32>> = lens
        .iter()
        .map(|&n| {
            let rows = unique_rows(rng, pool.num_rows(), n);
            let holes = if n == 0 {
                0
            } else {
                rng.random_range(0..=n.min(40))
            };
            sprinkle(rng, rows, holes)
        })
        .collect();
    let mut b = Batch::new(rng, heads, lists);
    b.ext = lens
        .iter()
        .map(|_| {
            let n = [0usize, 1, 7, 64, 128][rng.random_range(0..5)];
            let rows = unique_rows(rng, EXTEND_ROWS, n);
            let holes = rng.random_range(0..=3);
            sprinkle(rng, rows, holes)
        })
        .collect();
    b
}

// ---------------------------------------------------------------------------
// Correctness against the reference

/// Decode over ragged batches (lengths 0, 1, 2300 and others in every batch,
/// unique random rows per token) for H in {1, 8, 16, 64, 128}: every (token,
/// head) within 1e-2 relative L2 of the f64 reference and lse within 1e-3.
/// Varies the scale (0.0442 / 0.25), sink presence and lse presence; the pool
/// itself is left unmodified.
#[test]
fn decode_matches_reference_all_head_counts() {
    let (mut rng, seed) = seeded("decode_matches_reference_all_head_counts");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    for (i, heads) in [1usize, 8, 16, 64, 128].into_iter().enumerate() {
        let tokens = if heads >= 64 {
            6
        } else {
            rng.random_range(6..=9)
        };
        let lens = ragged_lengths(&mut rng, tokens);
        let lists = lens
            .iter()
            .map(|&n| unique_rows(&mut rng, pool.num_rows(), n))
            .collect();
        let mut b = Batch::new(&mut rng, heads, lists);
        b.scale = if i % 2 == 0 { SCALE } else { 0.25 };
        if heads == 16 {
            b.sink = None;
        }
        let with_lse = heads != 64;
        let plan = DecodePlan::new(&ctx, tokens + rng.random_range(0..4), heads);
        let o = run_decode(&plan, &pool, &b, with_lse);
        let tag = format!(
            "seed {seed}, H={heads}, lens {lens:?}, scale {}, sink {}, lse {with_lse}",
            b.scale,
            b.sink.is_some()
        );
        check_decode(&tag, &pool, &b, &o, with_lse);
    }
    assert!(
        bytes_of(pool.pool.rows_mut(LAYER)) == bytes_of(&pool.rows),
        "seed {seed}: decode modified the pool"
    );
}

/// Prefill over ragged batches for H in {8, 64, 128}: random prefix streams into
/// the pool (lengths incl. 0, 1, 2300, -1 entries sprinkled in) plus random
/// extend streams (0..=128 rows, -1 sprinkled) share one softmax with the sink;
/// compared to the f64 reference over the valid rows of both sources.
#[test]
fn prefill_matches_reference_all_head_counts() {
    let (mut rng, seed) = seeded("prefill_matches_reference_all_head_counts");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    for (i, heads) in [8usize, 64, 128].into_iter().enumerate() {
        let tokens = rng.random_range(5..=7);
        let lens = ragged_lengths(&mut rng, tokens);
        let mut b = random_prefill_batch(&mut rng, &pool, heads, &lens);
        b.scale = if i % 2 == 0 { SCALE } else { 0.25 };
        if heads == 64 {
            b.sink = None;
        }
        let plan = PrefillPlan::new(&ctx, tokens, heads);
        let o = run_prefill(&plan, &pool, &b);
        let ext: Vec<usize> = b.ext.iter().map(|e| e.len()).collect();
        let tag = format!("seed {seed}, H={heads}, prefix lens {lens:?}, extend lens {ext:?}");
        check_prefill(&tag, &pool, &b, &o);
    }
    assert!(
        bytes_of(pool.pool.rows_mut(LAYER)) == bytes_of(&pool.rows),
        "seed {seed}: prefill modified the pool"
    );
}

/// Spec §3.5 edge cases on one ragged batch (H = 16, empty slices included):
/// finite sink: empty slices give exact zeros and lse == sink exactly;
/// no sink: zeros and lse == -inf, and a sink tensor of -inf is bitwise equal
/// to an absent sink (plain softmax); sink 1e6 drives every output to ~0
/// (|out| < 1e-3) with lse ~ 1e6; a per-head mix of -inf / 1e6 / finite sinks
/// in one launch; a large scale (4.0, scores ~ +-100) stays finite and exact.
#[test]
fn decode_sink_and_empty_slice_edge_cases() {
    let (mut rng, seed) = seeded("decode_sink_and_empty_slice_edge_cases");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let heads = 16;
    let lens = [0usize, 5, 300, 0, 2300, 1, 128];
    let lists = lens
        .iter()
        .map(|&n| unique_rows(&mut rng, pool.num_rows(), n))
        .collect();
    let mut b = Batch::new(&mut rng, heads, lists);
    let plan = DecodePlan::new(&ctx, lens.len(), heads);
    let empty: Vec<usize> = (0..lens.len()).filter(|&t| lens[t] == 0).collect();

    // Finite sink.
    let o = run_decode(&plan, &pool, &b, true);
    check_decode(&format!("seed {seed}, finite sink"), &pool, &b, &o, true);
    let sink = b.sink.clone().unwrap();
    for &t in &empty {
        for (h, &z) in sink.iter().enumerate() {
            assert_eq!(
                o.lse[t * heads + h],
                z,
                "seed {seed}: empty slice lse must equal the sink"
            );
        }
    }

    // No sink: plain softmax; explicit -inf sink gives the same bits.
    b.sink = None;
    let absent_sink = run_decode(&plan, &pool, &b, true);
    check_decode(
        &format!("seed {seed}, no sink"),
        &pool,
        &b,
        &absent_sink,
        true,
    );
    for &t in &empty {
        assert!(
            absent_sink.lse[t * heads..(t + 1) * heads]
                .iter()
                .all(|&l| l == f32::NEG_INFINITY),
            "seed {seed}: empty slice without sink must have lse -inf"
        );
    }
    b.sink = Some(vec![f32::NEG_INFINITY; heads]);
    let inf_sink = run_decode(&plan, &pool, &b, true);
    check_decode(
        &format!("seed {seed}, -inf sink"),
        &pool,
        &b,
        &inf_sink,
        true,
    );
    assert!(
        bytes_of(inf_sink.out.as_slice()) == bytes_of(absent_sink.out.as_slice())
            && bytes_of(&inf_sink.lse) == bytes_of(&absent_sink.lse),
        "seed {seed}: a -inf sink must equal an absent sink bitwise"
    );

    // Huge sink: outputs ~0, lse = 1e6.
    b.sink = Some(vec![1e6; heads]);
    let big = run_decode(&plan, &pool, &b, true);
    check_decode(&format!("seed {seed}, sink 1e6"), &pool, &b, &big, true);
    let max = big
        .out
        .as_slice()
        .iter()
        .map(|x| x.to_f32().abs())
        .fold(0.0, f32::max);
    assert!(max < 1e-3, "seed {seed}: sink 1e6 left max |out| = {max}");

    // Per-head mix in one launch.
    let mix = [f32::NEG_INFINITY, 1e6, 0.0, -3.0, 7.5, 2.0, -30.0, 12.0];
    b.sink = Some((0..heads).map(|h| mix[h % mix.len()]).collect());
    let mixed = run_decode(&plan, &pool, &b, true);
    check_decode(
        &format!("seed {seed}, mixed sinks"),
        &pool,
        &b,
        &mixed,
        true,
    );
    for &t in &empty {
        for h in 0..heads {
            assert_eq!(
                mixed.lse[t * heads + h],
                mix[h % mix.len()],
                "seed {seed}: head {h}"
            );
        }
    }

    // Large scale: the max subtraction keeps e^(s - M) finite.
    b.scale = 4.0;
    b.sink = Some(random_sink(&mut rng, heads));
    let sharp = run_decode(&plan, &pool, &b, true);
    check_decode(&format!("seed {seed}, scale 4"), &pool, &b, &sharp, true);
}

/// Dense softmax computed separately (log-sum-exp form, no sink): keys are all
/// rows 0..n of the layer; with no sink (absent, or a -inf tensor) decode
/// equals `softmax(scale q K^T) K`, whatever the order of the indices (in
/// order, reversed, shuffled). H = 8.
#[test]
fn decode_without_sink_equals_dense_softmax() {
    let (mut rng, seed) = seeded("decode_without_sink_equals_dense_softmax");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let heads = 8;
    let n = [640usize, 2300][rng.random_range(0..2)];
    let forward: Vec<i32> = (0..n as i32).collect();
    let reversed: Vec<i32> = forward.iter().rev().copied().collect();
    let mut shuffled = forward.clone();
    shuffled.shuffle(&mut rng);
    let mut b = Batch::new(&mut rng, heads, vec![forward, reversed, shuffled]);
    // Same query for the three tokens.
    let q0 = b.q.as_slice()[..heads * D].to_vec();
    for t in 1..3 {
        b.q.as_mut_slice()[t * heads * D..(t + 1) * heads * D].copy_from_slice(&q0);
    }
    b.scale = [SCALE, 0.25][rng.random_range(0..2)];
    // Dense reference: logits, log-sum-exp, probabilities, weighted sum.
    let keys = &pool.rows[..n * D];
    let mut dense = vec![0f64; heads * D];
    let mut dense_lse = vec![0f64; heads];
    for h in 0..heads {
        let q: Vec<f64> = q0[h * D..(h + 1) * D].iter().map(|x| x.to_f64()).collect();
        let logits: Vec<f64> = keys
            .chunks_exact(D)
            .map(|k| b.scale as f64 * k.iter().zip(&q).map(|(x, y)| x.to_f64() * y).sum::<f64>())
            .collect();
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
        dense_lse[h] = lse;
        for (l, k) in logits.iter().zip(keys.chunks_exact(D)) {
            let p = (l - lse).exp();
            for (o, x) in dense[h * D..(h + 1) * D].iter_mut().zip(k) {
                *o += p * x.to_f64();
            }
        }
    }
    let plan = DecodePlan::new(&ctx, 3, heads);
    for sink in [None, Some(vec![f32::NEG_INFINITY; heads])] {
        b.sink = sink;
        let o = run_decode(&plan, &pool, &b, true);
        let r = Reference {
            heads,
            out: [dense.clone(), dense.clone(), dense.clone()].concat(),
            lse: [dense_lse.clone(), dense_lse.clone(), dense_lse.clone()].concat(),
            keys: vec![n; 3],
        };
        let tag = format!(
            "seed {seed}, n {n}, scale {}, sink {:?}",
            b.scale,
            b.sink.is_some()
        );
        check(
            &tag,
            &r,
            o.out.as_slice(),
            Layout::dense(heads),
            Some((&o.lse, heads)),
        );
    }
}

/// A prefill token whose prefix stream is empty equals decode over its extend
/// rows: both are checked against the f64 reference, and decode over the same
/// rows copied into the pool agrees with prefill within 1e-2. H = 16.
#[test]
fn prefill_with_empty_prefix_equals_decode_over_extend() {
    let (mut rng, seed) = seeded("prefill_with_empty_prefix_equals_decode_over_extend");
    let ctx = Ctx::cpu(0);
    let mut pool = KvPool::new(&ctx, &mut rng);
    let heads = 16;
    let ext_lens = [1usize, 64, 128, 17, 128];
    let mut b = Batch::new(&mut rng, heads, vec![Vec::new(); ext_lens.len()]);
    b.ext = ext_lens
        .iter()
        .map(|&n| unique_rows(&mut rng, EXTEND_ROWS, n))
        .collect();
    let plan = PrefillPlan::new(&ctx, ext_lens.len(), heads);
    let pre = run_prefill(&plan, &pool, &b);
    check_prefill(
        &format!("seed {seed}, prefill, ext {ext_lens:?}"),
        &pool,
        &b,
        &pre,
    );

    // Copy the extend rows into distinct pool rows and run decode over them.
    let targets = unique_rows(&mut rng, pool.num_rows(), EXTEND_ROWS);
    let layer = pool.pool.rows_mut(LAYER);
    for (e, &r) in targets.iter().enumerate() {
        let r = r as usize;
        layer[r * D..(r + 1) * D].copy_from_slice(&b.extend_kv.as_slice()[e * D..(e + 1) * D]);
    }
    pool.rows = layer.to_vec();
    let dec = Batch {
        heads,
        scale: b.scale,
        q: Buf::from_slice(b.q.as_slice()),
        lists: b
            .ext
            .iter()
            .map(|l| l.iter().map(|&e| targets[e as usize]).collect())
            .collect(),
        sink: b.sink.clone(),
        extend_kv: Buf::poisoned(0),
        ext: Vec::new(),
    };
    let dplan = DecodePlan::new(&ctx, ext_lens.len(), heads);
    let out = run_decode(&dplan, &pool, &dec, true);
    check_decode(
        &format!("seed {seed}, decode over extend rows"),
        &pool,
        &dec,
        &out,
        true,
    );
    // Prefill vs decode directly.
    let as_ref = Reference {
        heads,
        out: out.out.as_slice().iter().map(|x| x.to_f64()).collect(),
        lse: out.lse.iter().map(|&x| x as f64).collect(),
        keys: ext_lens.to_vec(),
    };
    check(
        &format!("seed {seed}, prefill vs decode"),
        &as_ref,
        pre.out.as_slice(),
        Layout::dense(heads),
        Some((&pre.lse, heads)),
    );
}

/// -1 entries are skipped in both prefill streams: tokens whose streams are
/// all -1 (or empty) give exact zeros with lse = sink (-inf without sink);
/// -1 interleaved anywhere (front, back, runs) drops just those entries.
/// Runs with and without a sink. H = 8.
#[test]
fn prefill_skips_minus_one_in_both_streams() {
    let (mut rng, seed) = seeded("prefill_skips_minus_one_in_both_streams");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let heads = 8;
    let rows = pool.num_rows();
    let mut p = |n| unique_rows(&mut rng, rows, n);
    let prefix = vec![
        vec![-1, -1, -1],
        {
            let r = p(2);
            vec![-1, r[0], -1, -1, r[1], -1]
        },
        vec![-1; 300],
        {
            let mut v = p(640);
            for i in (0..v.len()).step_by(5) {
                v[i] = -1;
            }
            v
        },
        Vec::new(),
        vec![-1],
        p(1),
    ];
    let mut e = |n| unique_rows(&mut rng, EXTEND_ROWS, n);
    let extend = vec![
        vec![-1],
        {
            let r = e(2);
            vec![-1, r[0], -1, r[1]]
        },
        e(128),
        vec![-1; 20],
        Vec::new(),
        Vec::new(),
        {
            let r = e(3);
            vec![r[0], -1, r[1], r[2], -1, -1]
        },
    ];
    let mut b = Batch::new(&mut rng, heads, prefix);
    b.ext = extend;
    let plan = PrefillPlan::new(&ctx, b.tokens(), heads);
    let empty = [0usize, 4, 5];
    for with_sink in [true, false] {
        if !with_sink {
            b.sink = None;
        }
        let o = run_prefill(&plan, &pool, &b);
        check_prefill(&format!("seed {seed}, sink {with_sink}"), &pool, &b, &o);
        for &t in &empty {
            for h in 0..heads {
                let want = b.sink.as_ref().map_or(f32::NEG_INFINITY, |s| s[h]);
                assert_eq!(
                    o.lse[t * heads + h],
                    want,
                    "seed {seed}: token {t} head {h}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Determinism and batch composition

/// Two runs of the same batch are bitwise equal (decode and prefill), and so is
/// a run on a second context with one worker thread. H = 16.
#[test]
fn runs_are_deterministic() {
    let (mut rng, seed) = seeded("runs_are_deterministic");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let heads = 16;
    let lens = ragged_lengths(&mut rng, 8);
    let lists = lens
        .iter()
        .map(|&n| unique_rows(&mut rng, pool.num_rows(), n))
        .collect();
    let b = Batch::new(&mut rng, heads, lists);
    let plan = DecodePlan::new(&ctx, b.tokens(), heads);
    let first = run_decode(&plan, &pool, &b, true);
    let second = run_decode(&plan, &pool, &b, true);
    assert!(
        bytes_of(first.out.as_slice()) == bytes_of(second.out.as_slice())
            && bytes_of(&first.lse) == bytes_of(&second.lse),
        "seed {seed}: decode runs differ"
    );
    let ctx1 = Ctx::cpu(1);
    let pool1 = pool.clone_on(&ctx1);
    let plan1 = DecodePlan::new(&ctx1, b.tokens(), heads);
    let single = run_decode(&plan1, &pool1, &b, true);
    assert!(
        bytes_of(first.out.as_slice()) == bytes_of(single.out.as_slice())
            && bytes_of(&first.lse) == bytes_of(&single.lse),
        "seed {seed}: decode differs between 1 and all worker threads"
    );

    let pb = random_prefill_batch(&mut rng, &pool, heads, &lens);
    let pplan = PrefillPlan::new(&ctx, pb.tokens(), heads);
    let a = run_prefill(&pplan, &pool, &pb);
    let c = run_prefill(&pplan, &pool, &pb);
    assert!(
        bytes_of(a.out.as_slice()) == bytes_of(c.out.as_slice())
            && bytes_of(&a.lse) == bytes_of(&c.lse),
        "seed {seed}: prefill runs differ"
    );
}

/// Batch layouts for the victim: (tokens, victim position, plan max_tokens).
const LAYOUTS: [(usize, usize, usize); 6] = [
    (1, 0, 1),
    (1, 0, 64),
    (4, 0, 4),
    (5, 2, 8),
    (9, 8, 9),
    (12, 5, 128),
];

/// Spec §7.2, decode: a victim token (H = 64, 1152 keys) gives bitwise the same
/// out and lse alone (plans of max_tokens 1 and 64), first, in the middle or
/// last of batches of random mates (lengths incl. 0, 1, 2300) at different
/// index-buffer offsets; it also matches the reference.
#[test]
fn decode_batch_composition_invariance() {
    let (mut rng, seed) = seeded("decode_batch_composition_invariance");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let heads = 64;
    let victim_rows = unique_rows(&mut rng, pool.num_rows(), 1152);
    let victim_q = random_bf16(&mut rng, heads * D);
    let sink = random_sink(&mut rng, heads);
    let mut baseline: Option<(Vec<u8>, Vec<u8>)> = None;
    for (tokens, pos, max_tokens) in LAYOUTS {
        let mut lists: Vec<Vec<i32>> = (0..tokens)
            .map(|_| {
                let n = LENGTHS[rng.random_range(0..LENGTHS.len())];
                unique_rows(&mut rng, pool.num_rows(), n)
            })
            .collect();
        if tokens >= 4 {
            // Mates of very different lengths, including an empty and a long one.
            lists[(pos + 1) % tokens] = unique_rows(&mut rng, pool.num_rows(), 2300);
            lists[(pos + 2) % tokens] = Vec::new();
        }
        lists[pos] = victim_rows.clone();
        let mut b = Batch::new(&mut rng, heads, lists);
        b.sink = Some(sink.clone());
        b.q.as_mut_slice()[pos * heads * D..(pos + 1) * heads * D].copy_from_slice(&victim_q);
        let plan = DecodePlan::new(&ctx, max_tokens, heads);
        let o = run_decode(&plan, &pool, &b, true);
        let got = o.token_bytes(pos, heads);
        let lens: Vec<usize> = b.lists.iter().map(|l| l.len()).collect();
        match &baseline {
            None => {
                check_decode(&format!("seed {seed}, victim alone"), &pool, &b, &o, true);
                baseline = Some(got);
            }
            Some(base) => assert!(
                *base == got,
                "seed {seed}: victim at {pos} of {lens:?} (plan max {max_tokens}) differs from alone"
            ),
        }
    }
}

/// Spec §7.2, prefill (the ATOM composition test): a victim (prefix 131 pool
/// rows with -1 entries, extend 64 rows) is bitwise identical alone and among
/// mates with long prefixes (up to 2300) and full extends, at any position.
#[test]
fn prefill_batch_composition_invariance() {
    let (mut rng, seed) = seeded("prefill_batch_composition_invariance");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let heads = 64;
    let victim_prefix = {
        let rows = unique_rows(&mut rng, pool.num_rows(), 131);
        sprinkle(&mut rng, rows, 7)
    };
    let victim_ext = unique_rows(&mut rng, EXTEND_ROWS, 64);
    let victim_q = random_bf16(&mut rng, heads * D);
    let sink = random_sink(&mut rng, heads);
    let extend_kv = random_bf16(&mut rng, EXTEND_ROWS * D);
    let mut baseline: Option<(Vec<u8>, Vec<u8>)> = None;
    for (tokens, pos, max_tokens) in LAYOUTS {
        let mut lens: Vec<usize> = (0..tokens)
            .map(|_| [0usize, 1, 512, 643, 2300][rng.random_range(0..5)])
            .collect();
        if tokens >= 4 {
            lens[(pos + 1) % tokens] = 2300;
            lens[(pos + 2) % tokens] = 0;
        }
        let mut b = random_prefill_batch(&mut rng, &pool, heads, &lens);
        b.lists[pos] = victim_prefix.clone();
        b.ext[pos] = victim_ext.clone();
        b.sink = Some(sink.clone());
        b.extend_kv = Buf::from_slice(&extend_kv);
        b.q.as_mut_slice()[pos * heads * D..(pos + 1) * heads * D].copy_from_slice(&victim_q);
        let plan = PrefillPlan::new(&ctx, max_tokens, heads);
        let o = run_prefill(&plan, &pool, &b);
        let got = o.token_bytes(pos, heads);
        match &baseline {
            None => {
                check_prefill(&format!("seed {seed}, victim alone"), &pool, &b, &o);
                baseline = Some(got);
            }
            Some(base) => assert!(
                *base == got,
                "seed {seed}: prefill victim at {pos} of prefix lens {lens:?} (plan max {max_tokens}) \
                 differs from alone"
            ),
        }
    }
}

// ---------------------------------------------------------------------------
// Strided and oversized buffers

/// Checks that every element of `buf` outside `written` still holds poison.
fn assert_untouched<T: Copy>(tag: &str, buf: &[T], written: &[bool]) {
    let size = std::mem::size_of::<T>();
    let bytes = bytes_of(buf);
    for (i, w) in written.iter().enumerate() {
        if !w {
            assert!(
                bytes[i * size..(i + 1) * size]
                    .iter()
                    .all(|&x| x == POISON_BYTE),
                "{tag}: element {i} outside the written region changed"
            );
        }
    }
}

/// Strided, longer-than-needed buffers, decode and prefill (H = 16): q and out
/// with padded head and token strides (multiples of 8 elements), extra token
/// rows in q / out / lse, lse with a padded row stride, indptr and indices with
/// garbage entries before indptr[0] (> 0) and past the used ones, extend_kv with a padded row stride and
/// extra rows. Results match the reference; every element of out and lse
/// outside the first num_tokens rows' data (padding, extra rows) keeps its
/// poison. A zero-token decode succeeds and writes nothing.
#[test]
fn strided_and_oversized_buffers() {
    let (mut rng, seed) = seeded("strided_and_oversized_buffers");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let heads = 16;
    let tokens = 5;
    let lens = ragged_lengths(&mut rng, tokens);
    let sink = random_sink(&mut rng, heads);
    let ql = Layout {
        token: heads * (D + 8) + 64,
        head: D + 8,
    };
    let ol = Layout {
        token: heads * (D + 16) + 128,
        head: D + 16,
    };
    let lse_stride = heads + 3;
    let (q_rows, out_rows, lse_rows) = (tokens + 2, tokens + 3, tokens + 2);
    let q = Buf::from_slice(&random_bf16(&mut rng, ql.len(q_rows, heads)));
    let mut written = vec![false; ol.len(out_rows, heads)];
    let mut lse_written = vec![false; lse_rows * lse_stride];
    for t in 0..tokens {
        for h in 0..heads {
            written[ol.at(t, h)..ol.at(t, h) + D].fill(true);
            lse_written[t * lse_stride + h] = true;
        }
    }

    // Decode.
    let lists: Vec<Vec<i32>> = lens
        .iter()
        .map(|&n| unique_rows(&mut rng, pool.num_rows(), n))
        .collect();
    let (mut indices, mut indptr) = csr(&lists);
    with_leading(&[-1, i32::MAX, -5], &mut indices, &mut indptr);
    indices.extend_from_slice(&[-1, i32::MAX, -5]);
    indptr.extend_from_slice(&[-7, i32::MAX]);
    let mut out = Buf::<bf16>::poisoned(ol.len(out_rows, heads));
    let lse: Vec<f32> = poisoned(lse_rows * lse_stride);
    let plan = DecodePlan::new(&ctx, tokens + 4, heads);
    let args = unikv_decode_args {
        struct_size: std::mem::size_of::<unikv_decode_args>(),
        q: ql.descriptor(q.as_slice(), q_rows, heads),
        indices: vec1(&indices),
        indptr: vec1(&indptr),
        sink: vec1(&sink),
        out: ol.descriptor(out.as_mut_slice(), out_rows, heads),
        lse: strided(&lse, &[lse_rows, heads], &[lse_stride, 1]),
        layer: LAYER,
        num_tokens: tokens as u32,
        softmax_scale: SCALE,
        reserved: 0,
        rope_table: absent(),
        positions: absent(),
    };
    ok(launch_decode(&plan, &pool, &args));
    let tag = format!("seed {seed}, strided decode, lens {lens:?}");
    let keys = decode_keys(&pool, &lists);
    let r = reference(q.as_slice(), ql, heads, &keys, Some(&sink), SCALE);
    check(&tag, &r, out.as_slice(), ol, Some((&lse, lse_stride)));
    assert_untouched(&tag, out.as_slice(), &written);
    assert_untouched(&tag, &lse, &lse_written);

    // Zero tokens: succeeds and writes nothing.
    let mut out = Buf::<bf16>::poisoned(ol.len(out_rows, heads));
    let lse: Vec<f32> = poisoned(lse_rows * lse_stride);
    let zero = unikv_decode_args {
        out: ol.descriptor(out.as_mut_slice(), out_rows, heads),
        lse: strided(&lse, &[lse_rows, heads], &[lse_stride, 1]),
        num_tokens: 0,
        ..args
    };
    ok(launch_decode(&plan, &pool, &zero));
    let nothing = vec![false; out.as_slice().len()];
    assert_untouched(
        &format!("seed {seed}, zero tokens"),
        out.as_slice(),
        &nothing,
    );
    assert_untouched(
        &format!("seed {seed}, zero tokens"),
        &lse,
        &vec![false; lse.len()],
    );

    // Prefill.
    let mut pre = random_prefill_batch(&mut rng, &pool, heads, &lens);
    pre.sink = Some(sink.clone());
    let ext_stride = D + 24;
    let ext_rows = EXTEND_ROWS + 5;
    let ext = Buf::from_slice(&random_bf16(&mut rng, ext_rows * ext_stride));
    let mut s = PrefillStreams::of(&pre);
    with_leading(&[-2, i32::MAX], &mut s.indices, &mut s.indptr);
    with_leading(&[i32::MIN, -2, 7], &mut s.ext_indices, &mut s.ext_indptr);
    s.indices.extend_from_slice(&[-3, i32::MAX]);
    s.indptr.extend_from_slice(&[i32::MIN, 0]);
    s.ext_indices.extend_from_slice(&[i32::MAX, -9]);
    s.ext_indptr.extend_from_slice(&[-1, -1, 5]);
    let mut out = Buf::<bf16>::poisoned(ol.len(out_rows, heads));
    let lse: Vec<f32> = poisoned(lse_rows * lse_stride);
    let pplan = PrefillPlan::new(&ctx, tokens, heads);
    let args = unikv_prefill_args {
        struct_size: std::mem::size_of::<unikv_prefill_args>(),
        q: ql.descriptor(q.as_slice(), q_rows, heads),
        indices: vec1(&s.indices),
        indptr: vec1(&s.indptr),
        sink: vec1(&sink),
        out: ol.descriptor(out.as_mut_slice(), out_rows, heads),
        lse: strided(&lse, &[lse_rows, heads], &[lse_stride, 1]),
        extend_kv: strided(ext.as_slice(), &[ext_rows, D], &[ext_stride, 1]),
        extend_indices: vec1(&s.ext_indices),
        extend_indptr: vec1(&s.ext_indptr),
        layer: LAYER,
        num_tokens: tokens as u32,
        softmax_scale: SCALE,
        reserved: 0,
    };
    ok(launch_prefill(&pplan, &pool, &args));
    let tag = format!("seed {seed}, strided prefill, prefix lens {lens:?}");
    let keys = prefill_keys(&pool, &pre.lists, ext.as_slice(), ext_stride, &pre.ext);
    let r = reference(q.as_slice(), ql, heads, &keys, Some(&sink), SCALE);
    check(&tag, &r, out.as_slice(), ol, Some((&lse, lse_stride)));
    assert_untouched(&tag, out.as_slice(), &written);
    assert_untouched(&tag, &lse, &lse_written);
}

// ---------------------------------------------------------------------------
// Argument and plan checks (nothing written on failure)

/// A small valid decode batch (H = 8, 3 tokens) for the rejection tests.
fn small_batch(rng: &mut StdRng, pool: &KvPool) -> Batch {
    let lists = [3usize, 17, 1]
        .iter()
        .map(|&n| unique_rows(rng, pool.num_rows(), n))
        .collect();
    Batch::new(rng, 8, lists)
}

/// Asserts `o` still holds only poison.
#[track_caller]
fn assert_poisoned(what: &str, o: &Outputs) {
    assert!(
        o.out.as_slice().iter().all(|x| x.to_bits() == POISON_BF16),
        "{what}: out was written on failure"
    );
    assert!(
        o.lse.iter().all(|x| x.to_bits() == POISON_F32),
        "{what}: lse was written on failure"
    );
}

/// Decode rejections, each with the documented status, a message naming the
/// argument, and out / lse byte-identical to their poison:
/// num_tokens > max_tokens (CAPACITY_EXCEEDED), q with another H (BAD_SHAPE
/// "q"), out with another H or fewer than num_tokens rows (BAD_SHAPE "out"),
/// lse with another H (BAD_SHAPE "lse"), index -1 / index = rows / index valid only in another layer
/// (OUT_OF_RANGE "indices"), layer past the pool (OUT_OF_RANGE "layer"),
/// non-monotonic indptr, negative indptr[0] and indptr[T] past the indices
/// (OUT_OF_RANGE "indptr"), bf16 sink (BAD_DTYPE "sink"), q misaligned by 2
/// bytes (BAD_ALIGNMENT "q"), NaN / +-inf scale (INVALID_ARGUMENT
/// "softmax_scale"). The valid call succeeds afterwards.
#[test]
fn decode_rejects_invalid_arguments() {
    let (mut rng, seed) = seeded("decode_rejects_invalid_arguments");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let b = small_batch(&mut rng, &pool);
    let heads = b.heads;
    let (indices, indptr) = csr(&b.lists);
    let plan = DecodePlan::new(&ctx, 3, heads);
    let mut o = Outputs::new(3, heads);
    let base = decode_args(&b, &indices, &indptr, &mut o, true);
    let expect = |what: &str, args: &unikv_decode_args, plan: &DecodePlan, want, name: &str| {
        fails(launch_decode(plan, &pool, args), want, name);
        assert_poisoned(&format!("seed {seed}, {what}"), &o);
    };

    // num_tokens over the plan.
    let small = DecodePlan::new(&ctx, 2, heads);
    expect(
        "capacity",
        &base,
        &small,
        UNIKV_CAPACITY_EXCEEDED,
        "num_tokens",
    );

    // q with another head count.
    let q16 = Buf::from_slice(&random_bf16(&mut rng, 3 * 16 * D));
    let mut a = base;
    a.q = tensor(q16.as_slice(), &[3, 16, D]);
    expect("q heads", &a, &plan, UNIKV_BAD_SHAPE, "q");
    // out with another head count, or fewer rows than num_tokens; lse likewise.
    let mut out16 = Buf::<bf16>::poisoned(3 * 16 * D);
    let mut a = base;
    a.out = tensor(out16.as_mut_slice(), &[3, 16, D]);
    expect("out heads", &a, &plan, UNIKV_BAD_SHAPE, "out");
    let mut a = base;
    a.out.shape[0] = 2;
    expect("out rows", &a, &plan, UNIKV_BAD_SHAPE, "out");
    let mut a = base;
    a.lse.shape[1] = heads as i64 - 1;
    expect("lse heads", &a, &plan, UNIKV_BAD_SHAPE, "lse");

    // Bad indices.
    let rows = pool.num_rows() as i32;
    let layer0_rows = pool.pool.layer(0).rows as i32;
    for (bad, layer) in [
        (-1, LAYER),
        (rows, LAYER),
        (i32::MAX, LAYER),
        (layer0_rows, 0),
    ] {
        let mut idx = indices.clone();
        let at = rng.random_range(0..idx.len());
        idx[at] = bad;
        let mut a = base;
        a.indices = vec1(&idx);
        a.layer = layer;
        expect(
            &format!("index {bad} in layer {layer}"),
            &a,
            &plan,
            UNIKV_OUT_OF_RANGE,
            "indices",
        );
    }
    let mut a = base;
    a.layer = 2;
    expect("layer 2", &a, &plan, UNIKV_OUT_OF_RANGE, "layer");

    // Bad indptr.
    let bad_ptrs = [
        ("non-monotonic", vec![0, 10, 3, indptr[3]]),
        ("negative first", vec![-1, indptr[1], indptr[2], indptr[3]]),
        (
            "past indices",
            vec![0, indptr[1], indptr[2], indices.len() as i32 + 1],
        ),
    ];
    for (what, ptr) in &bad_ptrs {
        let mut a = base;
        a.indptr = vec1(ptr);
        expect(what, &a, &plan, UNIKV_OUT_OF_RANGE, "indptr");
    }

    // Sink of the wrong dtype.
    let sink_bf16: Vec<bf16> = (0..heads).map(|_| bf16::from_f32(1.0)).collect();
    let mut a = base;
    a.sink = vec1(&sink_bf16);
    expect("bf16 sink", &a, &plan, UNIKV_BAD_DTYPE, "sink");

    // q misaligned by 2 bytes.
    let mut shifted = Buf::<bf16>::poisoned(3 * heads * D + 1);
    shifted.as_mut_slice()[1..].copy_from_slice(b.q.as_slice());
    let mut a = base;
    a.q = tensor(&shifted.as_slice()[1..], &[3, heads, D]);
    expect("misaligned q", &a, &plan, UNIKV_BAD_ALIGNMENT, "q");

    // Non-finite scale.
    for scale in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut a = base;
        a.softmax_scale = scale;
        expect(
            &format!("scale {scale}"),
            &a,
            &plan,
            UNIKV_INVALID_ARGUMENT,
            "softmax_scale",
        );
    }

    // The untouched arguments still work.
    ok(launch_decode(&plan, &pool, &base));
    check_decode(
        &format!("seed {seed}, valid after rejections"),
        &pool,
        &b,
        &o,
        true,
    );
}

/// Prefill rejections (OUT_OF_RANGE, nothing written): -2 in either stream,
/// an extend index past extend_kv's rows, a prefix index past the layer
/// (message names "indices", not "extend_"), non-monotonic extend_indptr,
/// extend_indptr[T] past extend_indices; num_tokens > max_tokens is
/// CAPACITY_EXCEEDED.
#[test]
fn prefill_rejects_invalid_streams() {
    let (mut rng, seed) = seeded("prefill_rejects_invalid_streams");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let mut b = small_batch(&mut rng, &pool);
    b.ext = vec![
        unique_rows(&mut rng, EXTEND_ROWS, 4),
        Vec::new(),
        vec![-1, 5],
    ];
    let heads = b.heads;
    let plan = PrefillPlan::new(&ctx, 3, heads);
    let good = PrefillStreams::of(&b);
    let run = |what: &str, s: &PrefillStreams, plan: &PrefillPlan, want, name: &str| {
        let mut o = Outputs::new(3, heads);
        let args = prefill_args(&b, s, &mut o);
        fails(launch_prefill(plan, &pool, &args), want, name);
        assert_poisoned(&format!("seed {seed}, {what}"), &o);
        last_error()
    };
    let rows = pool.num_rows() as i32;
    for (what, bad, extend) in [
        ("prefix -2", -2, false),
        ("prefix past rows", rows, false),
        ("extend -2", -2, true),
        ("extend past rows", EXTEND_ROWS as i32, true),
    ] {
        let mut s = PrefillStreams::of(&b);
        let list = if extend {
            &mut s.ext_indices
        } else {
            &mut s.indices
        };
        let at = rng.random_range(0..list.len());
        list[at] = bad;
        let name = if extend { "extend_indices" } else { "indices" };
        let msg = run(what, &s, &plan, UNIKV_OUT_OF_RANGE, name);
        if !extend {
            assert!(
                !msg.contains("extend_"),
                "{what}: message {msg:?} blames the extend stream"
            );
        }
    }
    let mut s = PrefillStreams::of(&b);
    s.ext_indptr = vec![0, 4, 2, 6];
    run(
        "extend indptr non-monotonic",
        &s,
        &plan,
        UNIKV_OUT_OF_RANGE,
        "extend_indptr",
    );
    let mut s = PrefillStreams::of(&b);
    s.ext_indptr[3] = s.ext_indices.len() as i32 + 1;
    run(
        "extend indptr past",
        &s,
        &plan,
        UNIKV_OUT_OF_RANGE,
        "extend_indptr",
    );
    let small = PrefillPlan::new(&ctx, 2, heads);
    run(
        "capacity",
        &good,
        &small,
        UNIKV_CAPACITY_EXCEEDED,
        "num_tokens",
    );

    let o = run_prefill(&plan, &pool, &b);
    check_prefill(
        &format!("seed {seed}, valid after rejections"),
        &pool,
        &b,
        &o,
    );
}

/// Both plan kinds report a workspace of 0 bytes on the CPU backend (and run
/// with a NULL workspace, as every test here does).
#[test]
fn workspace_size_is_zero_on_cpu() {
    let ctx = Ctx::cpu(0);
    for (max_tokens, heads) in [(1usize, 1usize), (64, 16), (4096, 128)] {
        let d = DecodePlan::new(&ctx, max_tokens, heads);
        let p = PrefillPlan::new(&ctx, max_tokens, heads);
        let mut bytes = usize::MAX;
        ok(unsafe { unikv_decode_plan_workspace_size(d.0, &mut bytes) });
        assert_eq!(bytes, 0, "decode plan ({max_tokens}, {heads})");
        bytes = usize::MAX;
        ok(unsafe { unikv_prefill_plan_workspace_size(p.0, &mut bytes) });
        assert_eq!(bytes, 0, "prefill plan ({max_tokens}, {heads})");
    }
}

/// Decode's inverse-RoPE epilogue: the rope dims of every output equal the
/// float64 reference output rotated by the conjugate of the token's table row
/// (within the decode tolerance); dims 0..447 and lse are bitwise those of
/// plain decode; int32 and int64 positions give the same bytes. A position past
/// the table is OUT_OF_RANGE and one of the two tensors alone NULL_ARGUMENT,
/// nothing written.
#[test]
fn decode_inverse_rope_epilogue() {
    let (mut rng, seed) = seeded("decode_inverse_rope_epilogue");
    let ctx = Ctx::cpu(0);
    let pool = KvPool::new(&ctx, &mut rng);
    let max_pos = 9000u32;
    let table = rope_table(40_000.0, 16.0, max_pos);
    for heads in [1usize, 16, 64] {
        let tokens = 6;
        let lens = ragged_lengths(&mut rng, tokens);
        let lists = lens
            .iter()
            .map(|&n| unique_rows(&mut rng, pool.num_rows(), n))
            .collect();
        let b = Batch::new(&mut rng, heads, lists);
        let plan = DecodePlan::new(&ctx, tokens, heads);
        let plain = run_decode(&plan, &pool, &b, true);
        let pos: Vec<i32> = (0..tokens)
            .map(|_| rng.random_range(0..max_pos as i32))
            .collect();
        let pos64: Vec<i64> = pos.iter().map(|&p| p as i64).collect();
        let (indices, indptr) = csr(&b.lists);
        let run = |positions: unikv_tensor, table_desc: unikv_tensor| {
            let mut o = Outputs::new(tokens, heads);
            let mut args = decode_args(&b, &indices, &indptr, &mut o, true);
            args.rope_table = table_desc;
            args.positions = positions;
            (launch_decode(&plan, &pool, &args), o)
        };
        let table_desc = tensor(&table, &[max_pos as usize, 64]);
        let (status, o) = run(vec1(&pos), table_desc);
        ok(status);
        let tag = format!("seed {seed}, H={heads}, lens {lens:?}");
        // The reference, rotated in float64.
        let mut r = b.decode_reference(&pool);
        for (t, &p) in pos.iter().enumerate() {
            let cs = &table[p as usize * 64..(p as usize + 1) * 64];
            for h in 0..heads {
                let row = &mut r.out[(t * heads + h) * D..(t * heads + h + 1) * D];
                for i in 0..32 {
                    let (c, s) = (cs[2 * i] as f64, cs[2 * i + 1] as f64);
                    let (re, im) = (row[448 + 2 * i], row[449 + 2 * i]);
                    row[448 + 2 * i] = re * c + im * s;
                    row[449 + 2 * i] = im * c - re * s;
                }
            }
        }
        check(
            &tag,
            &r,
            o.out.as_slice(),
            Layout::dense(heads),
            Some((&o.lse, heads)),
        );
        for t in 0..tokens * heads {
            let (a, b) = (&o.out.as_slice()[t * D..], &plain.out.as_slice()[t * D..]);
            assert!(
                bytes_of(&a[..448]) == bytes_of(&b[..448]),
                "{tag}: nope dims changed"
            );
        }
        assert!(
            bytes_of(&o.lse) == bytes_of(&plain.lse),
            "{tag}: lse changed"
        );
        let (status, o64) = run(vec1(&pos64), table_desc);
        ok(status);
        assert!(
            bytes_of(o64.out.as_slice()) == bytes_of(o.out.as_slice()),
            "{tag}: int64 positions differ"
        );

        let mut bad = pos.clone();
        bad[tokens - 1] = max_pos as i32;
        let (status, o) = run(vec1(&bad), table_desc);
        fails(
            status,
            UNIKV_OUT_OF_RANGE,
            &format!("positions[{}]", tokens - 1),
        );
        assert!(o.out.as_slice().iter().all(|x| x.to_bits() == POISON_BF16));
        for (positions, table_desc, arg) in [
            (vec1(&pos), absent(), "rope_table"),
            (absent(), table_desc, "positions"),
        ] {
            let (status, o) = run(positions, table_desc);
            fails(status, UNIKV_NULL_ARGUMENT, arg);
            assert!(o.out.as_slice().iter().all(|x| x.to_bits() == POISON_BF16));
        }
    }
}
