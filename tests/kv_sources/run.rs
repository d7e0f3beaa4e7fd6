//! Plans, launches and the float64 reference (docs/attention.md §1, §2; it
//! shares no code with the implementation) of the key-source tests.
// Shared with tests/gpu (kv_sources.rs), which uses a different subset.
#![allow(dead_code)]

use std::ptr;

use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;
use unikv::ffi::attention::*;
use unikv::ffi::pool::unikv_pool;
use unikv::ffi::status::unikv_status;
use unikv::ffi::types::{unikv_dtype, unikv_tensor};

use crate::common::*;
use crate::layouts::Cache;
use crate::{D, SCALE};

const BF16: u32 = unikv_dtype::UNIKV_DTYPE_BF16 as u32;

/// Plan parameters: `kv_dtype` rows of `layout` sources.
pub(crate) fn plan_params(
    max_tokens: usize,
    heads: usize,
    kv_dtype: u32,
    layout: unikv_kv_layout,
) -> unikv_attention_plan_params {
    unikv_attention_plan_params {
        struct_size: std::mem::size_of::<unikv_attention_plan_params>(),
        max_tokens: max_tokens as u32,
        num_heads: heads as u32,
        head_dim: D as u32,
        q_dtype: BF16,
        kv_dtype,
        out_dtype: BF16,
        kv_layout: layout as u32,
        reserved: 0,
    }
}

/// A decode or prefill plan handle.
pub(crate) enum Plan {
    Decode(*mut unikv_decode_plan),
    Prefill(*mut unikv_prefill_plan),
}

impl Plan {
    pub(crate) fn decode(ctx: &Ctx, params: &unikv_attention_plan_params) -> Plan {
        let mut plan = ptr::null_mut();
        ok(unsafe { unikv_decode_plan_create(ctx.0, params, &mut plan) });
        Plan::Decode(plan)
    }

    pub(crate) fn prefill(ctx: &Ctx, params: &unikv_attention_plan_params) -> Plan {
        let mut plan = ptr::null_mut();
        ok(unsafe { unikv_prefill_plan_create(ctx.0, params, &mut plan) });
        Plan::Prefill(plan)
    }

    /// The workspace bytes every launch through the plan needs.
    pub(crate) fn workspace_bytes(&self) -> usize {
        let mut bytes = 0;
        ok(unsafe {
            match self {
                Plan::Decode(p) => unikv_decode_plan_workspace_size(*p, &mut bytes),
                Plan::Prefill(p) => unikv_prefill_plan_workspace_size(*p, &mut bytes),
            }
        });
        bytes
    }

    /// A plan for `cache`'s layout and flavour (or a bf16 pool plan).
    pub(crate) fn for_cache(
        ctx: &Ctx,
        prefill: bool,
        tokens: usize,
        heads: usize,
        cache: Option<&Cache>,
    ) -> Plan {
        let params = match cache {
            Some(c) => plan_params(tokens, heads, c.fmt.dtype(), c.layout),
            None => plan_params(tokens, heads, BF16, unikv_kv_layout::UNIKV_KV_LAYOUT_POOL),
        };
        if prefill {
            Plan::prefill(ctx, &params)
        } else {
            Plan::decode(ctx, &params)
        }
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        match self {
            Plan::Decode(p) => unsafe { unikv_decode_plan_destroy(*p) },
            Plan::Prefill(p) => unsafe { unikv_prefill_plan_destroy(*p) },
        }
    }
}

/// One key stream: where its rows live and each token's list of indices.
#[derive(Clone)]
pub(crate) struct Stream {
    pub(crate) kv: unikv_kv_cache,
    pub(crate) lists: Vec<Vec<i32>>,
}

/// A stream's indices and indptr in the context's memory.
pub(crate) struct StreamBufs<'a> {
    pub(crate) indices: Dev<'a>,
    pub(crate) indptr: Dev<'a>,
    pub(crate) len: usize,
    pub(crate) tokens: usize,
}

impl<'a> StreamBufs<'a> {
    pub(crate) fn new(ctx: &'a Ctx, lists: &[Vec<i32>]) -> Self {
        let mut indices: Vec<i32> = lists.concat();
        let len = indices.len();
        indices.push(0); // never empty: a zero-byte buffer has no address
        let mut indptr = vec![0i32];
        for l in lists {
            indptr.push(indptr.last().unwrap() + l.len() as i32);
        }
        StreamBufs {
            indices: Dev::upload(ctx, &indices),
            indptr: Dev::upload(ctx, &indptr),
            len,
            tokens: lists.len(),
        }
    }

    pub(crate) fn indices(&self) -> unikv_tensor {
        self.indices.t::<i32>(&[self.len])
    }

    pub(crate) fn indptr(&self) -> unikv_tensor {
        self.indptr.t::<i32>(&[self.tokens + 1])
    }
}

/// A plan's workspace for one launch (none on the CPU backend).
pub(crate) struct Workspace<'a> {
    pub(crate) dev: Option<Dev<'a>>,
    pub(crate) bytes: usize,
}

impl<'a> Workspace<'a> {
    pub(crate) fn of(ctx: &'a Ctx, plan: &Plan) -> Self {
        let bytes = plan.workspace_bytes();
        Workspace {
            dev: (bytes > 0).then(|| Dev::zeroed(ctx, bytes)),
            bytes,
        }
    }

    pub(crate) fn ptr(&self) -> *mut std::os::raw::c_void {
        self.dev.as_ref().map_or(ptr::null_mut(), |d| d.ptr)
    }
}

/// The query side of a batch: q, the sink, and poisoned outputs.
pub(crate) struct Batch<'a> {
    pub(crate) ctx: &'a Ctx,
    pub(crate) tokens: usize,
    pub(crate) heads: usize,
    pub(crate) q_host: Vec<bf16>,
    pub(crate) sink_host: Vec<f32>,
    pub(crate) q: Dev<'a>,
    pub(crate) sink: Dev<'a>,
    pub(crate) out: Dev<'a>,
    pub(crate) lse: Dev<'a>,
}

impl<'a> Batch<'a> {
    pub(crate) fn new(ctx: &'a Ctx, rng: &mut StdRng, tokens: usize, heads: usize) -> Self {
        let q_host = random_bf16(rng, tokens * heads * D);
        let sink_host: Vec<f32> = (0..heads).map(|_| rng.random_range(-3.0f32..4.0)).collect();
        Self::with(ctx, q_host, sink_host, tokens, heads)
    }

    /// The same queries and sink in another context's memory.
    pub(crate) fn copy_to<'b>(&self, ctx: &'b Ctx) -> Batch<'b> {
        Batch::with(
            ctx,
            self.q_host.clone(),
            self.sink_host.clone(),
            self.tokens,
            self.heads,
        )
    }

    fn with(
        ctx: &'a Ctx,
        q_host: Vec<bf16>,
        sink_host: Vec<f32>,
        tokens: usize,
        heads: usize,
    ) -> Self {
        let b = Batch {
            ctx,
            tokens,
            heads,
            q: Dev::upload(ctx, &q_host),
            sink: Dev::upload(ctx, &sink_host),
            out: Dev::zeroed(ctx, tokens * heads * D * 2),
            lse: Dev::zeroed(ctx, tokens * heads * 4),
            q_host,
            sink_host,
        };
        b.poison();
        b
    }

    pub(crate) fn poison(&self) {
        self.out.poison();
        self.lse.poison();
    }

    /// (out, lse) as they are now.
    pub(crate) fn outputs(&self) -> (Vec<bf16>, Vec<f32>) {
        (self.out.read(), self.lse.read())
    }

    fn common(&self) -> (unikv_tensor, unikv_tensor, unikv_tensor, unikv_tensor) {
        let (t, h) = (self.tokens, self.heads);
        (
            self.q.t::<bf16>(&[t, h, D]),
            self.sink.t::<f32>(&[h]),
            self.out.t::<bf16>(&[t, h, D]),
            self.lse.t::<f32>(&[t, h]),
        )
    }

    /// Decode over `primary` (and `extra`) after `edit` changed the args;
    /// returns the status.
    pub(crate) fn decode(
        &self,
        plan: &Plan,
        pool: *const unikv_pool,
        layer: u32,
        primary: &Stream,
        extra: Option<&Stream>,
        edit: &dyn Fn(&mut unikv_decode_args),
    ) -> unikv_status {
        let self_plan = plan;
        let Plan::Decode(plan) = plan else {
            panic!("a decode plan")
        };
        let s0 = StreamBufs::new(self.ctx, &primary.lists);
        let s1 = extra.map(|e| StreamBufs::new(self.ctx, &e.lists));
        let (q, sink, out, lse) = self.common();
        let mut a = unikv_decode_args {
            struct_size: std::mem::size_of::<unikv_decode_args>(),
            q,
            indices: s0.indices(),
            indptr: s0.indptr(),
            sink,
            out,
            lse,
            layer,
            num_tokens: self.tokens as u32,
            softmax_scale: SCALE,
            reserved: 0,
            rope_table: absent(),
            positions: absent(),
            kv: primary.kv,
            extra_kv: extra.map_or_else(Default::default, |e| e.kv),
            extra_indices: s1.as_ref().map_or_else(absent, |s| s.indices()),
            extra_indptr: s1.as_ref().map_or_else(absent, |s| s.indptr()),
        };
        edit(&mut a);
        let ws = Workspace::of(self.ctx, self_plan);
        unsafe { unikv_sparse_decode(*plan, pool, &a, ws.ptr(), ws.bytes, ptr::null_mut()) }
    }

    /// Prefill over `prefix` and `extend` (whose rows are `extend_kv` when
    /// its descriptor is zeroed) after `edit`; returns the status.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn prefill(
        &self,
        plan: &Plan,
        pool: *const unikv_pool,
        layer: u32,
        prefix: &Stream,
        extend: &Stream,
        extend_kv: unikv_tensor,
        edit: &dyn Fn(&mut unikv_prefill_args),
    ) -> unikv_status {
        let self_plan = plan;
        let Plan::Prefill(plan) = plan else {
            panic!("a prefill plan")
        };
        let s0 = StreamBufs::new(self.ctx, &prefix.lists);
        let s1 = StreamBufs::new(self.ctx, &extend.lists);
        let (q, sink, out, lse) = self.common();
        let mut a = unikv_prefill_args {
            struct_size: std::mem::size_of::<unikv_prefill_args>(),
            q,
            indices: s0.indices(),
            indptr: s0.indptr(),
            sink,
            out,
            lse,
            extend_kv,
            extend_indices: s1.indices(),
            extend_indptr: s1.indptr(),
            layer,
            num_tokens: self.tokens as u32,
            softmax_scale: SCALE,
            reserved: 0,
            kv: prefix.kv,
            extend_cache: extend.kv,
        };
        edit(&mut a);
        let ws = Workspace::of(self.ctx, self_plan);
        unsafe { unikv_sparse_prefill(*plan, pool, &a, ws.ptr(), ws.bytes, ptr::null_mut()) }
    }

    /// The float64 reference over each token's key rows (docs/attention.md
    /// §1): `keys[t]` are token t's rows, in any order.
    pub(crate) fn reference(&self, keys: &[Vec<&[f64]>]) -> (Vec<f64>, Vec<f64>) {
        let (heads, scale) = (self.heads, f64::from(SCALE));
        let mut out = vec![0f64; self.tokens * heads * D];
        let mut lse = vec![0f64; self.tokens * heads];
        for (t, rows) in keys.iter().enumerate() {
            for h in 0..heads {
                let at = (t * heads + h) * D;
                let q: Vec<f64> = self.q_host[at..at + D].iter().map(|x| x.to_f64()).collect();
                let z = f64::from(self.sink_host[h]);
                let scores: Vec<f64> = rows
                    .iter()
                    .map(|k| scale * q.iter().zip(k.iter()).map(|(a, b)| a * b).sum::<f64>())
                    .collect();
                if rows.is_empty() {
                    lse[t * heads + h] = z;
                    continue;
                }
                let m = scores.iter().fold(z, |a, &b| a.max(b));
                let mut den = (z - m).exp();
                let acc = &mut out[at..at + D];
                for (s, k) in scores.iter().zip(rows) {
                    let w = (s - m).exp();
                    den += w;
                    for (a, x) in acc.iter_mut().zip(k.iter()) {
                        *a += w * x;
                    }
                }
                acc.iter_mut().for_each(|a| *a /= den);
                lse[t * heads + h] = m + den.ln();
            }
        }
        (out, lse)
    }

    /// Checks the outputs against the reference: exact zeros for an empty key
    /// set, else relative L2 error < 1e-2 per (token, head); LSE within
    /// 1e-3 * max(1, |ref|). `nkeys[t]` is token t's key count.
    pub(crate) fn check(&self, tag: &str, nkeys: &[usize], reference: &(Vec<f64>, Vec<f64>)) {
        let (out, lse) = self.outputs();
        let heads = self.heads;
        for (t, &n) in nkeys.iter().enumerate() {
            for h in 0..heads {
                let at = (t * heads + h) * D;
                let (got, want) = (&out[at..at + D], &reference.0[at..at + D]);
                let id = format!("{tag}: token {t} head {h} ({n} keys)");
                if n == 0 {
                    assert!(
                        got.iter().all(|x| x.to_f32() == 0.0),
                        "{id}: not exact zeros"
                    );
                } else {
                    let norm = want.iter().map(|x| x * x).sum::<f64>().sqrt();
                    let err = got
                        .iter()
                        .zip(want)
                        .map(|(g, w)| (g.to_f64() - w).powi(2))
                        .sum::<f64>()
                        .sqrt();
                    assert!(
                        err / norm < 1e-2,
                        "{id}: relative L2 error {:.3e}",
                        err / norm
                    );
                }
                let (g, w) = (f64::from(lse[t * heads + h]), reference.1[t * heads + h]);
                assert!(
                    (g - w).abs() < 1e-3 * w.abs().max(1.0),
                    "{id}: lse {g} vs {w}"
                );
            }
        }
    }
}

/// Random per-token lists of indices below `rows` (lengths from `lengths`,
/// repeats allowed, as top-k lists may hold).
pub(crate) fn random_lists(
    rng: &mut StdRng,
    tokens: usize,
    rows: usize,
    lengths: &[usize],
) -> Vec<Vec<i32>> {
    (0..tokens)
        .map(|_| {
            let n = lengths[rng.random_range(0..lengths.len())];
            (0..n).map(|_| rng.random_range(0..rows) as i32).collect()
        })
        .collect()
}

/// A bf16 pool whose layer 1 (3392 rows) holds, from row `at[i]` on, the
/// reader values of `caches[i]`; other rows random.
pub(crate) fn bf16_pool(ctx: &Ctx, rng: &mut StdRng, caches: &[(&Cache, usize)]) -> Pool {
    let spec = PoolSpec {
        ratios: vec![0, 4],
        max_requests: 1,
        window: 128,
        spec_extra: 0,
        c128_blocks: 96,
    };
    let pool = Pool::new(ctx, &spec);
    let rows = pool.rows_mut(1);
    rows.copy_from_slice(&random_bf16(rng, rows.len()));
    for (cache, at) in caches {
        for r in 0..cache.rows {
            rows[(at + r) * D..(at + r + 1) * D].copy_from_slice(&cache.bf16_row(r));
        }
    }
    pool
}

/// Asserts two runs' outputs are the same bits.
#[track_caller]
pub(crate) fn assert_same_bits(tag: &str, a: &(Vec<bf16>, Vec<f32>), b: &(Vec<bf16>, Vec<f32>)) {
    let first =
        a.0.iter()
            .zip(&b.0)
            .position(|(x, y)| x.to_bits() != y.to_bits());
    assert!(
        first.is_none(),
        "{tag}: outputs differ first at element {} ({} vs {})",
        first.unwrap(),
        a.0[first.unwrap()],
        b.0[first.unwrap()]
    );
    let first =
        a.1.iter()
            .zip(&b.1)
            .position(|(x, y)| x.to_bits() != y.to_bits());
    assert!(first.is_none(), "{tag}: lse differs first at {first:?}");
}
