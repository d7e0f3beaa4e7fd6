//! Launch helpers (contiguous layouts): batches, outputs, decode and prefill
//! runs, and their checks against the reference.

use super::*;

/// Host inputs of one batch. Decode uses `lists` only; prefill adds `ext`.
pub(crate) struct Batch {
    pub(crate) heads: usize,
    pub(crate) scale: f32,
    /// `[tokens, heads, 512]`, contiguous.
    pub(crate) q: Buf<bf16>,
    pub(crate) lists: Vec<Vec<i32>>,
    pub(crate) sink: Option<Vec<f32>>,
    /// `[EXTEND_ROWS, 512]` extend K rows (prefill).
    pub(crate) extend_kv: Buf<bf16>,
    pub(crate) ext: Vec<Vec<i32>>,
}

impl Batch {
    pub(crate) fn new(rng: &mut StdRng, heads: usize, lists: Vec<Vec<i32>>) -> Self {
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

    pub(crate) fn tokens(&self) -> usize {
        self.lists.len()
    }

    pub(crate) fn sink_desc(&self) -> unikv_tensor {
        self.sink.as_ref().map_or(absent(), |s| vec1(s))
    }

    pub(crate) fn decode_reference(&self, pool: &KvPool) -> Reference {
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

    pub(crate) fn prefill_reference(&self, pool: &KvPool) -> Reference {
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
pub(crate) struct Outputs {
    pub(crate) out: Buf<bf16>,
    pub(crate) lse: Vec<f32>,
}

impl Outputs {
    pub(crate) fn new(tokens: usize, heads: usize) -> Self {
        Outputs {
            out: Buf::poisoned(tokens * heads * D),
            lse: poisoned(tokens * heads),
        }
    }

    pub(crate) fn token_bytes(&self, t: usize, heads: usize) -> (Vec<u8>, Vec<u8>) {
        (
            bytes_of(&self.out.as_slice()[t * heads * D..(t + 1) * heads * D]),
            bytes_of(&self.lse[t * heads..(t + 1) * heads]),
        )
    }
}

pub(crate) fn decode_args(
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
        kv: Default::default(),
        extra_kv: Default::default(),
        extra_indices: Default::default(),
        extra_indptr: Default::default(),
    }
}

pub(crate) fn launch_decode(
    plan: &DecodePlan,
    pool: &KvPool,
    args: &unikv_decode_args,
) -> unikv_status {
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

pub(crate) fn launch_prefill(
    plan: &PrefillPlan,
    pool: &KvPool,
    args: &unikv_prefill_args,
) -> unikv_status {
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
pub(crate) fn run_decode(plan: &DecodePlan, pool: &KvPool, b: &Batch, with_lse: bool) -> Outputs {
    let (indices, indptr) = csr(&b.lists);
    let mut o = Outputs::new(b.tokens(), b.heads);
    let args = decode_args(b, &indices, &indptr, &mut o, with_lse);
    ok(launch_decode(plan, pool, &args));
    o
}

pub(crate) struct PrefillStreams {
    pub(crate) indices: Vec<i32>,
    pub(crate) indptr: Vec<i32>,
    pub(crate) ext_indices: Vec<i32>,
    pub(crate) ext_indptr: Vec<i32>,
}

impl PrefillStreams {
    pub(crate) fn of(b: &Batch) -> Self {
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

pub(crate) fn prefill_args(b: &Batch, s: &PrefillStreams, o: &mut Outputs) -> unikv_prefill_args {
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
        kv: Default::default(),
        extend_cache: Default::default(),
    }
}

pub(crate) fn run_prefill(plan: &PrefillPlan, pool: &KvPool, b: &Batch) -> Outputs {
    let s = PrefillStreams::of(b);
    let mut o = Outputs::new(b.tokens(), b.heads);
    let args = prefill_args(b, &s, &mut o);
    ok(launch_prefill(plan, pool, &args));
    o
}

pub(crate) fn check_decode(tag: &str, pool: &KvPool, b: &Batch, o: &Outputs, with_lse: bool) {
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

pub(crate) fn check_prefill(tag: &str, pool: &KvPool, b: &Batch, o: &Outputs) {
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
pub(crate) fn random_prefill_batch(
    rng: &mut StdRng,
    pool: &KvPool,
    heads: usize,
    lens: &[usize],
) -> Batch {
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
