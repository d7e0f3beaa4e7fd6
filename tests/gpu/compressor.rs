//! `unikv_compress_decode` / `_prefill` on the GPU against the CPU backend:
//! the same calls on both, the compressor state compared exactly after every
//! call (it holds copies of the raw rows), and the stored groups compared
//! bytewise: bit-exact except where a row's RMSNorm factor rounds differently
//! (the pooled values are the same bits on both, docs/compressor.md §2), which
//! may move a bf16 element by 1 ulp and an FP8 code by 1; such rows must be
//! rare. Also captured into a CUDA graph once and replayed with new lengths,
//! positions, slots and rows, and the clear of a released slot.

use super::*;
use unikv::ffi::compressor::*;
use unikv::ffi::pool::*;

const MAX_POS: u32 = 1024;
const EPS: f32 = 1e-6;
/// Tokens the buffers hold (the graph test's capture-time maximum).
const T_MAX: usize = 768;
const PAGES: usize = 6;
const PAGE: u32 = 64;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    Pool,
    FlashMla,
    Indexer,
}

#[derive(Debug, Clone, Copy)]
struct Kind {
    layer: u32,
    compressor: u32,
    target: Target,
}

impl Kind {
    fn ratio(self) -> usize {
        [0, 4, 128][self.layer as usize]
    }
    fn dim(self) -> usize {
        if self.compressor == 1 {
            128
        } else {
            512
        }
    }
    fn values(self) -> usize {
        self.dim() * if self.ratio() == 4 { 2 } else { 1 }
    }
    fn row(self) -> usize {
        2 * self.values()
    }
    /// Where group n of request b goes (inside every target).
    fn loc(self, b: usize, n: usize) -> i64 {
        if self.ratio() == 4 {
            (b * 64 + n) as i64
        } else {
            (b * 3 + n) as i64
        }
    }
    fn bytes_per_page(self) -> usize {
        match self.target {
            Target::Pool => 0,
            Target::FlashMla => 37_440,
            Target::Indexer => 132 * PAGE as usize,
        }
    }
}

const KINDS: [Kind; 4] = [
    Kind {
        layer: 1,
        compressor: 0,
        target: Target::Pool,
    },
    Kind {
        layer: 2,
        compressor: 0,
        target: Target::Pool,
    },
    Kind {
        layer: 1,
        compressor: 0,
        target: Target::FlashMla,
    },
    Kind {
        layer: 1,
        compressor: 1,
        target: Target::Indexer,
    },
];

/// One token: request, position, raw row.
#[derive(Clone)]
struct Tok {
    b: i32,
    pos: i64,
    row: Vec<f32>,
    loc: i64,
}

fn tok(kind: Kind, b: usize, pos: usize, rows: &[Vec<f32>]) -> Tok {
    let r = kind.ratio();
    Tok {
        b: b as i32,
        pos: pos as i64,
        row: rows[pos].clone(),
        loc: if (pos + 1) % r == 0 {
            kind.loc(b, (pos + 1) / r - 1)
        } else {
            -1
        },
    }
}

fn padding(kind: Kind) -> Tok {
    Tok {
        b: -1,
        pos: 0,
        row: vec![0.5; kind.row()],
        loc: 0,
    }
}

fn random_rows(rng: &mut impl Rng, kind: Kind, len: usize) -> Vec<Vec<f32>> {
    (0..len)
        .map(|_| {
            (0..kind.row())
                .map(|i| {
                    let x: f32 = if i < kind.values() {
                        rng.random_range(-2.0..2.0)
                    } else {
                        rng.random_range(-4.0..4.0)
                    };
                    // bf16 values, so either input dtype carries them exactly.
                    bf16::from_f32(x).to_f32()
                })
                .collect()
        })
        .collect()
}

/// A pool with compressor state and one call's device buffers, on one backend.
struct Side<'a> {
    ctx: &'a Ctx,
    pool: Pool,
    kind: Kind,
    kv_f32: Dev<'a>,
    kv_bf16: Dev<'a>,
    batch: Dev<'a>,
    slots: Dev<'a>,
    positions: Dev<'a>,
    loc: Dev<'a>,
    ape: Dev<'a>,
    norm: Dev<'a>,
    table: Dev<'a>,
    cache: Option<Dev<'a>>,
}

struct Model {
    ape: Vec<f32>,
    norm: Vec<bf16>,
    table: Vec<f32>,
}

impl Model {
    fn random(rng: &mut impl Rng, kind: Kind) -> Self {
        Model {
            ape: (0..kind.ratio() * kind.values())
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect(),
            norm: (0..kind.dim())
                .map(|_| bf16::from_f32(rng.random_range(0.5f32..1.5)))
                .collect(),
            table: rope_table(40_000.0, 4.0, MAX_POS),
        }
    }
}

fn pool_spec() -> PoolSpec {
    PoolSpec {
        ratios: vec![0, 4, 128],
        max_requests: 3,
        window: 8,
        spec_extra: 0,
        c128_blocks: 8,
    }
}

impl<'a> Side<'a> {
    fn new(ctx: &'a Ctx, kind: Kind, model: &Model, dtype: unikv_dtype, rings: (u32, u32)) -> Self {
        // The spec owns the ratios the params point at: it outlives the create call.
        let spec = pool_spec();
        let params = unikv_pool_params {
            compressor_state: 1,
            c4_state_ring: rings.0,
            c128_state_ring: rings.1,
            ..spec.params_of(dtype)
        };
        let mut raw = ptr::null_mut();
        ok(unsafe { unikv_pool_create(ctx.0, &params, &mut raw) });
        let cache = (kind.target != Target::Pool).then(|| {
            let d = Dev::zeroed(ctx, PAGES * kind.bytes_per_page());
            d.poison();
            d
        });
        Side {
            ctx,
            pool: Pool(raw),
            kind,
            kv_f32: Dev::zeroed(ctx, T_MAX * kind.row() * 4),
            kv_bf16: Dev::zeroed(ctx, T_MAX * kind.row() * 2),
            batch: Dev::zeroed(ctx, T_MAX * 4),
            slots: Dev::zeroed(ctx, 16),
            positions: Dev::zeroed(ctx, T_MAX * 8),
            loc: Dev::zeroed(ctx, T_MAX * 8),
            ape: Dev::upload(ctx, &model.ape),
            norm: Dev::upload(ctx, &model.norm),
            table: Dev::upload(ctx, &model.table),
            cache,
        }
    }

    /// Writes a call's tokens into the buffers (i64 or i32 positions and
    /// locations, f32 or bf16 rows).
    fn write(&self, toks: &[Tok], slots: &[i32], wide: bool) {
        let f32_rows: Vec<f32> = toks.iter().flat_map(|t| t.row.clone()).collect();
        let bf16_rows: Vec<bf16> = f32_rows.iter().map(|&x| bf16::from_f32(x)).collect();
        self.kv_f32.write(&f32_rows);
        self.kv_bf16.write(&bf16_rows);
        self.batch
            .write(&toks.iter().map(|t| t.b).collect::<Vec<_>>());
        self.slots.write(slots);
        let pos: Vec<i64> = toks.iter().map(|t| t.pos).collect();
        let loc: Vec<i64> = toks.iter().map(|t| t.loc).collect();
        if wide {
            self.positions.write(&pos);
            self.loc.write(&loc);
        } else {
            self.positions
                .write(&pos.iter().map(|&p| p as i32).collect::<Vec<_>>());
            self.loc
                .write(&loc.iter().map(|&l| l as i32).collect::<Vec<_>>());
        }
    }

    fn args(&self, n: usize, requests: usize, wide: bool, f32_rows: bool) -> unikv_compress_args {
        let k = self.kind;
        let ints = |d: &Dev| {
            if wide {
                d.t::<i64>(&[n])
            } else {
                d.t::<i32>(&[n])
            }
        };
        let (cache, cache_dtype, page_size) = match &self.cache {
            None => (absent(), 0, 0),
            Some(c) => (
                c.t::<u8>(&[PAGES, k.bytes_per_page()]),
                unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN as u32,
                PAGE,
            ),
        };
        unikv_compress_args {
            struct_size: std::mem::size_of::<unikv_compress_args>(),
            kv_score: if f32_rows {
                self.kv_f32.t::<f32>(&[n, k.row()])
            } else {
                self.kv_bf16.t::<bf16>(&[n, k.row()])
            },
            ape: self.ape.t::<f32>(&[k.ratio(), k.values()]),
            norm_weight: self.norm.t::<bf16>(&[k.dim()]),
            rope_table: self.table.t::<f32>(&[MAX_POS as usize, 64]),
            batch_id: self.batch.t::<i32>(&[n]),
            req_slots: self.slots.t::<i32>(&[requests]),
            positions: ints(&self.positions),
            loc: ints(&self.loc),
            cache,
            layer: k.layer,
            compressor: k.compressor,
            num_tokens: n as u32,
            cache_dtype,
            page_size,
            eps: EPS,
        }
    }

    fn run(&self, toks: &[Tok], slots: &[i32], decode: bool, wide: bool, f32_rows: bool) {
        self.write(toks, slots, wide);
        let args = self.args(toks.len(), slots.len(), wide, f32_rows);
        let f = if decode {
            unikv_compress_decode
        } else {
            unikv_compress_prefill
        };
        ok(unsafe { f(self.pool.0, &args, ptr::null_mut()) });
        ok(unsafe { unikv_stream_synchronize(self.ctx.0, ptr::null_mut()) });
    }

    fn state(&self) -> Vec<u8> {
        let mut info: unikv_compressor_info = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of_val(&info);
        ok(unsafe {
            unikv_pool_get_compressor(
                self.pool.0,
                self.kind.layer,
                self.kind.compressor,
                &mut info,
            )
        });
        download(self.ctx, info.state, info.bytes as usize)
    }

    /// The target's bytes: the layer's rows, or the cache.
    fn target(&self) -> Vec<u8> {
        match &self.cache {
            None => read_layer(self.ctx, &self.pool, self.kind.layer),
            Some(c) => c.read::<u8>(),
        }
    }
}

/// Byte ranges of stored group `loc` in a target's bytes: (start, len, kind
/// of elements: 2 = bf16, 1 = FP8 codes or scale bytes, 4 = f32 scale).
fn group_bytes(kind: Kind, side: &Side, loc: usize) -> Vec<(usize, usize, usize)> {
    match kind.target {
        Target::Pool => {
            let info = side.pool.layer(kind.layer);
            let row = info.swa_rows as usize + loc;
            if info.rope_bytes == 0 {
                vec![(row * 1024, 1024, 2)]
            } else {
                vec![
                    (row * 512, 512, 1),
                    (info.bytes as usize + row * 128, 128, 2),
                ]
            }
        }
        Target::FlashMla => {
            let (page, slot) = (loc / PAGE as usize, loc % PAGE as usize);
            let base = page * kind.bytes_per_page();
            vec![
                (base + slot * 576, 448, 1),
                (base + slot * 576 + 448, 128, 2),
                (base + 576 * PAGE as usize + slot * 8, 7, 1),
            ]
        }
        Target::Indexer => {
            let (page, slot) = (loc / PAGE as usize, loc % PAGE as usize);
            let base = page * kind.bytes_per_page();
            vec![
                (base + slot * 128, 128, 1),
                (base + 128 * PAGE as usize + slot * 4, 4, 4),
            ]
        }
    }
}

/// The two targets agree: bytes outside the stored groups exactly, each
/// group exactly or (a norm factor rounded differently) within 1 bf16 ulp
/// per element and 1 step per FP8 code or scale; returns the groups that
/// differ.
fn compare_targets(kind: Kind, cpu: &Side, gpu: &Side, locs: &[i64]) -> usize {
    let (a, b) = (cpu.target(), gpu.target());
    assert_eq!(a.len(), b.len());
    let mut owned = vec![false; a.len()];
    let mut differing = 0;
    for &loc in locs {
        let mut differs = false;
        for (start, len, elem) in group_bytes(kind, cpu, loc as usize) {
            owned[start..start + len].iter_mut().for_each(|o| *o = true);
            let (x, y) = (&a[start..start + len], &b[start..start + len]);
            if x == y {
                continue;
            }
            differs = true;
            for (i, (p, q)) in x.chunks(elem).zip(y.chunks(elem)).enumerate() {
                let close = match elem {
                    2 => {
                        let (p, q) = (
                            u16::from_le_bytes([p[0], p[1]]),
                            u16::from_le_bytes([q[0], q[1]]),
                        );
                        (p as i32 - q as i32).abs() <= 1
                    }
                    4 => {
                        let (p, q) = (
                            f32::from_le_bytes(p.try_into().unwrap()),
                            f32::from_le_bytes(q.try_into().unwrap()),
                        );
                        (p - q).abs() <= 2.0 * f32::EPSILON * p.abs()
                    }
                    _ => (p[0] as i32 - q[0] as i32).abs() <= 1,
                };
                assert!(close, "{kind:?}: group at {loc}: element {i} of a range differs by more than one step");
            }
        }
        differing += usize::from(differs);
    }
    for (i, o) in owned.iter().enumerate() {
        if !o {
            assert_eq!(
                a[i], b[i],
                "{kind:?}: byte {i} outside the stored groups differs"
            );
        }
    }
    differing
}

/// Runs the same call on both backends and compares the state exactly.
fn both(
    cpu: &Side,
    gpu: &Side,
    toks: &[Tok],
    slots: &[i32],
    decode: bool,
    wide: bool,
    f32_rows: bool,
) {
    cpu.run(toks, slots, decode, wide, f32_rows);
    gpu.run(toks, slots, decode, wide, f32_rows);
    assert!(
        cpu.state() == gpu.state(),
        "{:?}: the states differ",
        cpu.kind
    );
}

#[test]
fn compress_matches_the_cpu_backend() {
    let Some(g) = gpu() else { return };
    let c = Ctx::cpu(0);
    let (mut rng, _) = seeded("compress_matches_the_cpu_backend");
    let fp8 = unikv_dtype::UNIKV_DTYPE_FP8_E4M3FN;
    let cases = [
        (KINDS[0], unikv_dtype::UNIKV_DTYPE_BF16),
        (KINDS[0], fp8),
        (KINDS[1], unikv_dtype::UNIKV_DTYPE_BF16),
        (KINDS[1], fp8),
        (KINDS[2], unikv_dtype::UNIKV_DTYPE_BF16),
        (KINDS[3], unikv_dtype::UNIKV_DTYPE_BF16),
    ];
    let (mut groups, mut differing) = (0, 0);
    for (case, (kind, dtype)) in cases.into_iter().enumerate() {
        let model = Model::random(&mut rng, kind);
        let (cpu, gpu) = (
            Side::new(&c, kind, &model, dtype, (8, 128)),
            Side::new(&g, kind, &model, dtype, (8, 128)),
        );
        poison_layer(&c, &cpu.pool, kind.layer, POISON_BYTE);
        poison_layer(&g, &gpu.pool, kind.layer, POISON_BYTE);
        let r = kind.ratio();
        // Ratio 4: request 0 long enough that a chunk spans several 32-token
        // blocks of the prefill kernel.
        let lens = [3 * r + 5 + if r == 4 { 90 } else { 0 }, 2 * r, r - 1];
        let rows: Vec<_> = lens
            .iter()
            .map(|&l| random_rows(&mut rng, kind, l + 8))
            .collect();
        let slots = [3, 1, 2];
        let wide = case % 2 == 0;
        // Prefill in two chunks per request (cut mid-group), both requests
        // in each call. Ratio 128: the second chunks are the last 8 tokens,
        // so two requests close a group inside one 128-token slot of the
        // prefill kernel (two groups for one cluster).
        let cuts: Vec<usize> = lens
            .iter()
            .map(|&l| if r == 128 { l - 8 } else { (l / 2).max(1) })
            .collect();
        for (a, z) in [(0usize, 0usize), (1, 1)] {
            let mut toks = Vec::new();
            for b in 0..3 {
                let (from, to) = if a == 0 {
                    (0, cuts[b])
                } else {
                    (cuts[b], lens[b])
                };
                toks.extend((from..to).map(|p| tok(kind, b, p, &rows[b])));
            }
            // Padding between requests (a request's tokens stay contiguous).
            toks.insert(0, padding(kind));
            toks.push(padding(kind));
            both(&cpu, &gpu, &toks, &slots, false, wide, z == 0);
        }
        // Decode 8 more tokens per request, with padding.
        for step in 0..8 {
            let mut toks = vec![padding(kind)];
            for b in [2, 0, 1] {
                toks.push(tok(kind, b, lens[b] + step, &rows[b]));
            }
            both(&cpu, &gpu, &toks, &slots, true, !wide, step % 2 == 0);
        }
        let locs: Vec<i64> = (0..3)
            .flat_map(|b| (0..(lens[b] + 8) / r).map(move |n| kind.loc(b, n)))
            .collect();
        groups += locs.len();
        differing += compare_targets(kind, &cpu, &gpu, &locs);
    }
    assert!(
        differing * 10 <= groups,
        "{differing} of {groups} groups differ in the last bit: more than the norm factor explains"
    );
}

/// Decode captured into a CUDA graph once, replayed with new tokens written
/// into the captured buffers (lengths, slots, positions, padding vary); the
/// CPU backend runs the same calls directly. Then a prefill captured the same
/// way (its two launches).
#[test]
fn compress_replays_in_a_cuda_graph() {
    use unikv::backend::gpu::devtools::OwnedStream;
    let Some(g) = gpu() else { return };
    let c = Ctx::cpu(0);
    let (mut rng, _) = seeded("compress_replays_in_a_cuda_graph");
    for kind in [KINDS[0], KINDS[1], KINDS[3]] {
        let model = Model::random(&mut rng, kind);
        let dtype = unikv_dtype::UNIKV_DTYPE_BF16;
        let (cpu, gpu) = (
            Side::new(&c, kind, &model, dtype, (16, 256)),
            Side::new(&g, kind, &model, dtype, (16, 256)),
        );
        let r = kind.ratio();
        let rows: Vec<_> = (0..3)
            .map(|_| random_rows(&mut rng, kind, 3 * r + 64))
            .collect();
        let slots = [1, 2, 3];
        // Requests start at different lengths.
        let mut len = [r + 3, 2 * r - 1, 1];
        let mut toks = Vec::new();
        for b in 0..3 {
            toks.extend((0..len[b]).map(|p| tok(kind, b, p, &rows[b])));
        }
        both(&cpu, &gpu, &toks, &slots, false, true, true);
        // Capture a decode of T = 4 tokens.
        let t = 4;
        let step = |len: &[usize; 3], order: &[usize]| -> Vec<Tok> {
            let mut toks: Vec<Tok> = order
                .iter()
                .map(|&b| tok(kind, b, len[b], &rows[b]))
                .collect();
            toks.resize(t, padding(kind));
            toks
        };
        gpu.write(&step(&len, &[0, 1, 2]), &slots, true);
        let args = gpu.args(t, 3, true, true);
        let stream = OwnedStream::new(0).unwrap();
        stream.begin_capture().unwrap();
        ok(unsafe { unikv_compress_decode(gpu.pool.0, &args, stream.raw) });
        let graph = stream.end_capture().unwrap();
        // Every request crosses a group boundary; request 1 (the longest)
        // stays within 3 groups (kind.loc) and its 3 r + 64 raw rows.
        for i in 0..r + r / 2 + 8 {
            // A varying subset of requests, in a varying order.
            let mut order: Vec<usize> = (0..3).filter(|b| (i + b) % 4 != 0).collect();
            order.shuffle(&mut rng);
            let toks = step(&len, &order);
            cpu.run(&toks, &slots, true, true, true);
            gpu.write(&toks, &slots, true);
            ok(unsafe { unikv_stream_synchronize(g.0, ptr::null_mut()) });
            graph.launch(&stream).unwrap();
            ok(unsafe { unikv_stream_synchronize(g.0, stream.raw) });
            assert!(
                cpu.state() == gpu.state(),
                "{kind:?}: replay {i}: the states differ"
            );
            for &b in &order {
                len[b] += 1;
            }
        }
        let locs: Vec<i64> = (0..3)
            .flat_map(|b| (0..len[b] / r).map(move |n| kind.loc(b, n)))
            .collect();
        compare_targets(kind, &cpu, &gpu, &locs);

        // Prefill: chunks of up to 24 tokens per request, captured once for
        // T = 48 and replayed with new chunk lengths (padding fills the rest).
        let t = 48;
        let chunk = |len: &[usize; 3], sizes: [usize; 2]| -> Vec<Tok> {
            let mut toks = Vec::new();
            for (b, &n) in [0usize, 2].iter().zip(&sizes) {
                toks.extend((len[*b]..len[*b] + n).map(|p| tok(kind, *b, p, &rows[*b])));
            }
            toks.resize(t, padding(kind));
            toks
        };
        gpu.write(&chunk(&len, [1, 1]), &slots, true);
        let args = gpu.args(t, 3, true, true);
        stream.begin_capture().unwrap();
        ok(unsafe { unikv_compress_prefill(gpu.pool.0, &args, stream.raw) });
        let graph = stream.end_capture().unwrap();
        for sizes in [[24, 3], [5, 24], [17, 0]] {
            let toks = chunk(&len, sizes);
            cpu.run(&toks, &slots, false, true, true);
            gpu.write(&toks, &slots, true);
            ok(unsafe { unikv_stream_synchronize(g.0, ptr::null_mut()) });
            graph.launch(&stream).unwrap();
            ok(unsafe { unikv_stream_synchronize(g.0, stream.raw) });
            assert!(
                cpu.state() == gpu.state(),
                "{kind:?}: prefill replay {sizes:?}: the states differ"
            );
            len[0] += sizes[0];
            len[2] += sizes[1];
        }
        let locs: Vec<i64> = (0..3)
            .flat_map(|b| (0..len[b] / r).map(move |n| kind.loc(b, n)))
            .collect();
        compare_targets(kind, &cpu, &gpu, &locs);
    }
}

/// Releasing a slot clears its rings on the GPU as on the CPU (both release
/// calls), and pool creation leaves every ring empty.
#[test]
fn release_clears_the_rings_on_the_gpu() {
    let Some(g) = gpu() else { return };
    let c = Ctx::cpu(0);
    let (mut rng, _) = seeded("release_clears_the_rings_on_the_gpu");
    let kind = KINDS[1];
    let model = Model::random(&mut rng, kind);
    let dtype = unikv_dtype::UNIKV_DTYPE_BF16;
    let (cpu, gpu) = (
        Side::new(&c, kind, &model, dtype, (8, 128)),
        Side::new(&g, kind, &model, dtype, (8, 128)),
    );
    assert!(cpu.state() == gpu.state(), "fresh states differ");
    for side in [&cpu, &gpu] {
        for want in 1..=3 {
            let mut s = 0;
            ok(unsafe { unikv_pool_acquire_slot(side.pool.0, &mut s) });
            assert_eq!(s, want);
        }
    }
    let rows: Vec<_> = (0..3).map(|_| random_rows(&mut rng, kind, 200)).collect();
    let mut toks = Vec::new();
    for (b, r) in rows.iter().enumerate() {
        toks.extend((0..150 + b).map(|p| tok(kind, b, p, r)));
    }
    both(&cpu, &gpu, &toks, &[1, 2, 3], false, false, true);
    for side in [&cpu, &gpu] {
        ok(unsafe { unikv_pool_release_slot(side.pool.0, 2) });
        ok(unsafe { unikv_pool_release_slot_async(side.pool.0, 3, ptr::null_mut()) });
        ok(unsafe { unikv_stream_synchronize(side.ctx.0, ptr::null_mut()) });
    }
    assert!(cpu.state() == gpu.state(), "states differ after release");
}
