//! Compress calls with one argument broken: a specific status, nothing written.

use super::*;
use unikv::ffi::status::unikv_status;

/// A valid call that tests then break one argument of.
struct Fixture {
    setup: Setup,
    model: Model,
    toks: Vec<Tok>,
    target: Target,
}

fn fixture(rng: &mut impl Rng, kind: Kind, target: Target) -> Fixture {
    let setup = Setup::bf16();
    let model = Model::random(rng, kind);
    let rows: Vec<_> = (0..2)
        .map(|_| random_rows(rng, kind, 3 * kind.ratio(), false))
        .collect();
    // Request 0: tokens 0..8 (groups 0 and 1 closed by tokens 3 and 7);
    // request 1: tokens 9..12 (group 0 closed by token 12).
    let toks = full_prefill(kind, &rows, &[2 * kind.ratio() + 1, kind.ratio()]);
    Fixture {
        setup,
        model,
        toks,
        target,
    }
}

#[test]
fn bad_input_is_refused_and_writes_nothing() {
    let (mut rng, _) = seeded("bad_input_is_refused_and_writes_nothing");
    type Edit = Box<dyn Fn(&mut Call)>;
    let kind = CSA_KV;
    let cases: Vec<(&str, unikv_status, bool, Edit)> = vec![
        (
            "args.struct_size",
            UNIKV_BAD_STRUCT_SIZE,
            false,
            Box::new(|c| c.args.struct_size = 8),
        ),
        (
            "layer",
            UNIKV_OUT_OF_RANGE,
            false,
            Box::new(|c| c.args.layer = 3),
        ),
        (
            "layer",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.args.layer = 0),
        ),
        (
            "compressor",
            UNIKV_BAD_ENUM,
            false,
            Box::new(|c| c.args.compressor = 2),
        ),
        (
            "compressor",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| {
                c.args.layer = HCA;
                c.args.compressor = 1;
            }),
        ),
        (
            "eps",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.args.eps = 0.0),
        ),
        (
            "eps",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.args.eps = f32::NAN),
        ),
        (
            "kv_score.data",
            UNIKV_NULL_ARGUMENT,
            false,
            Box::new(|c| c.args.kv_score.data = ptr::null_mut()),
        ),
        (
            "kv_score",
            UNIKV_BAD_DTYPE,
            false,
            Box::new(|c| c.args.kv_score.dtype = unikv_dtype::UNIKV_DTYPE_I32 as u32),
        ),
        (
            "kv_score",
            UNIKV_BAD_SHAPE,
            false,
            Box::new(|c| c.args.kv_score.shape[1] = 1024),
        ),
        (
            "kv_score",
            UNIKV_BAD_SHAPE,
            false,
            Box::new(|c| c.args.kv_score.shape[0] -= 1),
        ),
        (
            "kv_score",
            UNIKV_BAD_ALIGNMENT,
            false,
            Box::new(|c| {
                c.args.kv_score.data = unsafe { (c.args.kv_score.data as *mut u8).add(4) }.cast()
            }),
        ),
        (
            "ape",
            UNIKV_BAD_SHAPE,
            false,
            Box::new(|c| c.args.ape.shape[0] = 8),
        ),
        (
            "ape",
            UNIKV_BAD_DTYPE,
            false,
            Box::new(|c| c.args.ape.dtype = unikv_dtype::UNIKV_DTYPE_BF16 as u32),
        ),
        (
            "norm_weight",
            UNIKV_BAD_SHAPE,
            false,
            Box::new(|c| c.args.norm_weight.shape[0] = 128),
        ),
        (
            "norm_weight",
            UNIKV_BAD_DTYPE,
            false,
            Box::new(|c| c.args.norm_weight.dtype = unikv_dtype::UNIKV_DTYPE_I64 as u32),
        ),
        (
            "rope_table",
            UNIKV_BAD_SHAPE,
            false,
            Box::new(|c| c.args.rope_table.shape[1] = 32),
        ),
        (
            "batch_id",
            UNIKV_BAD_DTYPE,
            false,
            Box::new(|c| c.args.batch_id.dtype = unikv_dtype::UNIKV_DTYPE_I64 as u32),
        ),
        (
            "batch_id",
            UNIKV_BAD_SHAPE,
            false,
            Box::new(|c| c.args.batch_id.shape[0] = 1),
        ),
        (
            "req_slots",
            UNIKV_BAD_SHAPE,
            false,
            Box::new(|c| c.args.req_slots.shape[0] = 0),
        ),
        (
            "positions",
            UNIKV_BAD_DTYPE,
            false,
            Box::new(|c| c.args.positions.dtype = unikv_dtype::UNIKV_DTYPE_F32 as u32),
        ),
        (
            "loc.data",
            UNIKV_NULL_ARGUMENT,
            false,
            Box::new(|c| c.args.loc.data = ptr::null_mut()),
        ),
        (
            "page_size",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.args.page_size = 64),
        ),
        (
            "cache_dtype",
            UNIKV_BAD_ENUM,
            false,
            Box::new(|c| {
                c.args.cache = c.args.kv_score;
                c.args.cache_dtype = 99;
            }),
        ),
        // Device values.
        (
            "batch_id[0]",
            UNIKV_OUT_OF_RANGE,
            false,
            Box::new(|c| c.batch[0] = 5),
        ),
        (
            "req_slots[1]",
            UNIKV_OUT_OF_RANGE,
            false,
            Box::new(|c| c.req_slots[1] = 4),
        ),
        (
            "req_slots[1]",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.req_slots[1] = 1),
        ),
        (
            "positions[3]",
            UNIKV_OUT_OF_RANGE,
            false,
            Box::new(|c| c.positions[3] = -1),
        ),
        (
            "positions[3]",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.positions[3] = 4),
        ),
        (
            "batch_id[10]",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.batch[10] = 0),
        ),
        (
            "batch_id[1]",
            UNIKV_INVALID_ARGUMENT,
            true,
            Box::new(|_| {}),
        ),
        (
            "positions[7]",
            UNIKV_OUT_OF_RANGE,
            false,
            Box::new(|c| c.args.rope_table.shape[0] = 4),
        ),
        (
            "loc[3]",
            UNIKV_OUT_OF_RANGE,
            false,
            Box::new(|c| c.loc[3] = 320),
        ),
        (
            "loc[12]",
            UNIKV_INVALID_ARGUMENT,
            false,
            Box::new(|c| c.loc[12] = c.loc[3]),
        ),
        // Overlap with the state or the target.
        (
            "the pool's compressor state",
            UNIKV_OVERLAPPING_BUFFERS,
            false,
            Box::new(|c| {
                let state = c.setup.compressor(CSA_KV).state;
                c.args.ape.data = state;
            }),
        ),
        (
            "ape",
            UNIKV_OVERLAPPING_BUFFERS,
            false,
            Box::new(|c| {
                let rows = c.setup.pool.layer(CSA).data;
                c.args.ape.data = rows;
            }),
        ),
    ];
    for (arg, status, decode, edit) in cases {
        let f = fixture(&mut rng, kind, Target::Pool);
        // A first valid call fills part of the state.
        ok(f.setup
            .call(&f.model, false, &f.toks[..2], &SLOTS, &f.target, false));
        let before = f.setup.snapshot(kind, &f.target);
        let mut call = Call::new(&f.setup, &f.model, &f.toks, &SLOTS, &f.target, false);
        edit(&mut call);
        fails(call.run(decode), status, arg);
        assert!(
            f.setup.snapshot(kind, &f.target) == before,
            "{arg}: something was written"
        );
    }
    // The indexer compressor needs a cache; a cache's geometry is checked.
    let f = fixture(&mut rng, CSA_INDEXER, Target::indexer(Fp8Format::E4m3Fn));
    let mut call = Call::new(&f.setup, &f.model, &f.toks, &SLOTS, &Target::Pool, false);
    fails(call.run(false), UNIKV_NULL_ARGUMENT, "cache");
    let mut call = Call::new(&f.setup, &f.model, &f.toks, &SLOTS, &f.target, false);
    call.args.page_size = 32;
    fails(call.run(false), UNIKV_INVALID_ARGUMENT, "page_size");
    let mut call = Call::new(&f.setup, &f.model, &f.toks, &SLOTS, &f.target, false);
    call.args.cache.strides[0] += 16;
    fails(call.run(false), UNIKV_BAD_STRIDE, "cache");
    let mut call = Call::new(&f.setup, &f.model, &f.toks, &SLOTS, &f.target, false);
    call.args.cache_dtype = unikv_dtype::UNIKV_DTYPE_BF16 as u32;
    fails(call.run(false), UNIKV_BAD_DTYPE, "cache_dtype");
    // A pool without compressor state.
    let ctx = Ctx::cpu(1);
    let plain = Pool::new(&ctx, &spec());
    let mut call = Call::new(&f.setup, &f.model, &f.toks, &SLOTS, &f.target, false);
    fails(
        unsafe { unikv_compress_prefill(plain.0, &call.args, ptr::null_mut()) },
        UNIKV_INVALID_STATE,
        "compressor_state",
    );
    fails(
        unsafe { unikv_compress_prefill(f.setup.pool.0, ptr::null(), ptr::null_mut()) },
        UNIKV_NULL_ARGUMENT,
        "args",
    );
    fails(
        unsafe { unikv_compress_decode(ptr::null(), &call.args, ptr::null_mut()) },
        UNIKV_NULL_ARGUMENT,
        "pool",
    );
    ok(call.run(false));
}
