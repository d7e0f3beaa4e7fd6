//! Decodes bytes into a sequence of C-API calls over small shapes and checks
//! invariants after each (issue 21): the status is a defined value and never
//! INTERNAL; on error a message is set and every buffer of the call is
//! byte-identical to its state before (outputs are poisoned); on success
//! inputs are untouched and outputs are written only inside their views;
//! slots follow a shadow model; built index streams stay in range; a hostile
//! handle, struct size or descriptor the library must refuse is refused.
//! A violated invariant panics, which libFuzzer reports as a crash.
//!
//! Used by the libFuzzer target (fuzz/fuzz_targets/api.rs) and by the replay
//! test (tests/fuzz_replay.rs). Environment: `UNIKV_FUZZ_BACKEND=cuda` makes
//! the contexts CUDA ones. Outputs are also placed over other arguments'
//! memory, and such a call must be refused (UNIKV_OVERLAPPING_BUFFERS);
//! `UNIKV_FUZZ_ALIASING=1` only places them, `=off` not at all.
#![allow(dead_code)]

mod attention;
mod call;
mod cursor;
mod indexer;
mod lifecycle;
mod pools;
mod stores;
mod streams;

use std::collections::BTreeSet;
use std::ffi::CStr;
use std::os::raw::c_void;
use std::ptr;

use unikv::ffi::context::*;

pub use call::{Call, Mem};
pub use cursor::Cursor;

/// Calls decoded from one input at most.
const MAX_OPS: usize = 48;
/// Rows of the honest RoPE table (positions of RoPE calls mostly stay below).
pub const ROPE_ROWS: usize = 64;

#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// `unikv_backend` of the contexts: 1 (CPU) or 2 (CUDA).
    pub backend: u32,
    /// Generate outputs that overlap other arguments.
    pub aliasing: bool,
    /// ... and require the library to refuse them.
    pub aliasing_strict: bool,
}

impl Config {
    pub fn from_env() -> Self {
        let backend = match std::env::var("UNIKV_FUZZ_BACKEND").as_deref() {
            Ok("cuda") => 2,
            _ => 1,
        };
        let mode = std::env::var("UNIKV_FUZZ_ALIASING").unwrap_or_default();
        Config {
            backend,
            aliasing: mode != "off",
            aliasing_strict: mode != "off" && mode != "1",
        }
    }
}

pub fn last_error() -> String {
    unsafe { CStr::from_ptr(unikv::ffi::unikv_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

thread_local! {
    /// The harness contexts of this thread, by backend and `validate` (see
    /// `World::new`): per thread, so that an input that makes a context
    /// unusable (a caught panic) cannot fail another thread's inputs.
    static CONTEXTS: std::cell::RefCell<Vec<(u32, bool, usize)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Forgets this thread's harness contexts (after a failed input, which may
/// have left one unusable): the next input creates fresh ones. The old ones
/// leak.
pub fn reset() {
    CONTEXTS.with(|c| c.borrow_mut().clear());
}

pub struct CtxState {
    pub h: *mut unikv_context,
    pub validates: bool,
}

pub struct PoolState {
    pub h: *mut unikv::ffi::pool::unikv_pool,
    pub validates: bool,
    /// The context handle it was made from (possibly destroyed since).
    pub ctx: *mut unikv_context,
    pub ratios: Vec<u32>,
    pub max_requests: u32,
    pub window: u32,
    pub spec_extra: u32,
    pub c128_blocks: u32,
    pub dtype: u32,
    /// Shadow of the acquired slots.
    pub slots: BTreeSet<u32>,
}

impl PoolState {
    pub fn ring(&self) -> usize {
        (self.window + self.spec_extra) as usize
    }
    pub fn swa_rows(&self) -> usize {
        (self.max_requests as usize + 1) * self.ring()
    }
    /// Compressed rows of a layer of this ratio.
    pub fn compressed(&self, ratio: u32) -> usize {
        match ratio {
            4 => self.c128_blocks as usize * 32 + 64,
            128 => self.c128_blocks as usize + 2,
            _ => 0,
        }
    }
    pub fn rows(&self, layer: usize) -> usize {
        self.swa_rows() + self.compressed(self.ratios[layer])
    }
}

pub struct PlanState {
    pub h: *mut c_void,
    pub prefill: bool,
    pub ctx: *mut unikv_context,
    pub max_tokens: u32,
    pub heads: u32,
    pub kv_dtype: u32,
    pub workspace: *mut u8,
    pub ws_bytes: usize,
}

/// What the last successful decode-stream build produced, for
/// `unikv_fill_csa_tail`.
pub struct StreamsMemo {
    pub pool: usize,
    pub batch_id: Vec<i64>,
    pub positions: Vec<i64>,
    pub csa_topk: usize,
    pub csa_indptr: Vec<i64>,
    pub csa_indices: Vec<i64>,
}

pub struct World {
    pub cfg: Config,
    pub mem: Mem,
    /// ctxs[0] is the harness's own context (never destroyed by an op); the
    /// others come and go.
    pub ctxs: Vec<CtxState>,
    pub pools: Vec<PoolState>,
    pub plans: Vec<PlanState>,
    pub memo: Option<StreamsMemo>,
    pub rope: &'static [f32],
    /// Harness-owned context memory freed at teardown (adopted pool
    /// buffers, workspaces).
    pub owned: Vec<*mut u8>,
    pub scratch: [u64; 8],
}

impl World {
    /// A world around the harness context of this configuration: created
    /// once per process and kept (creating a context per input would cost
    /// more than the calls; the context holds no state a call can observe
    /// besides its allocations, which every input frees).
    pub fn new(cfg: Config, validate: bool) -> Self {
        use std::sync::OnceLock;
        static ROPE: OnceLock<Vec<f32>> = OnceLock::new();
        let known = CONTEXTS.with(|c| {
            c.borrow()
                .iter()
                .find(|k| k.0 == cfg.backend && k.1 == validate)
                .map(|k| k.2)
        });
        let ctx = match known {
            Some(h) => h as *mut unikv_context,
            None => {
                let options = unikv_context_options {
                    struct_size: std::mem::size_of::<unikv_context_options>(),
                    backend: cfg.backend,
                    device: 0,
                    cpu_threads: 1,
                    validate: validate as u32,
                };
                let mut ctx = ptr::null_mut();
                let status = unsafe { unikv_context_create(&options, &mut ctx) };
                assert_eq!(status as u32, 0, "harness context: {}", last_error());
                CONTEXTS.with(|c| c.borrow_mut().push((cfg.backend, validate, ctx as usize)));
                ctx
            }
        };
        let rope = ROPE
            .get_or_init(|| lifecycle::honest_rope_table(ROPE_ROWS as u32))
            .as_slice();
        World {
            cfg,
            mem: Mem { ctx },
            ctxs: vec![CtxState {
                h: ctx,
                validates: cfg.backend == 1 || validate,
            }],
            pools: Vec::new(),
            plans: Vec::new(),
            memo: None,
            rope,
            owned: Vec::new(),
            scratch: [0; 8],
        }
    }

    pub fn call(&self, name: &'static str, validates: bool) -> Call {
        Call::new(name, self.mem, self.cfg, validates)
    }

    fn step(&mut self, c: &mut Cursor) {
        match c.u8() % 30 {
            0 => lifecycle::context_create(self, c),
            1 => lifecycle::context_destroy(self, c),
            2 => lifecycle::context_info(self, c),
            3 => lifecycle::memory(self, c),
            4 => pools::pool_create(self, c),
            5 => pools::pool_destroy(self, c),
            6 => pools::pool_info(self, c),
            7 => pools::acquire(self, c),
            8 => pools::release(self, c),
            9 => lifecycle::plan_create(self, c),
            10 => lifecycle::plan_destroy(self, c),
            11 => lifecycle::workspace_size(self, c),
            12 => lifecycle::rope_table(self, c),
            13 => lifecycle::misc(self, c),
            14 => stores::store_swa(self, c),
            15 => stores::store_compressed(self, c),
            16 => stores::store_cache(self, c, false),
            17 => stores::store_cache(self, c, true),
            18 => stores::prepare_qkv(self, c),
            19 => stores::inverse_rope(self, c),
            20 => streams::decode_streams(self, c),
            21 => streams::csa_tail(self, c),
            22 => streams::prefill_streams(self, c),
            23 => indexer::prepare_q(self, c),
            24 => indexer::prepare_k(self, c),
            25 => indexer::topk(self, c, false),
            26 => indexer::topk(self, c, true),
            27 => indexer::hash_topk(self, c),
            28 => attention::attention(self, c),
            _ => attention::merge(self, c),
        }
    }

    /// A live pool's index, or None when there is none.
    /// A live pool's index; an honest one is made first when there is none
    /// (None only when even that failed).
    pub fn pick_pool(&mut self, c: &mut Cursor) -> Option<usize> {
        if self.pools.is_empty() {
            pools::default_pool(self, c);
        }
        if self.pools.is_empty() {
            return None;
        }
        Some(c.below(self.pools.len()))
    }

    /// A handle argument: usually `honest`; now and then NULL, a live handle
    /// of another kind or a pointer unikv never returned, which the call
    /// must refuse (recorded in `call`).
    pub fn handle(&self, c: &mut Cursor, call: &mut Call, honest: *mut c_void) -> *mut c_void {
        if honest.is_null() {
            call.fail_because("NULL handle");
            return honest;
        }
        if !c.chance(10) {
            return honest;
        }
        let others: Vec<*mut c_void> = self
            .ctxs
            .iter()
            .map(|x| x.h.cast())
            .chain(self.pools.iter().map(|p| p.h.cast()))
            .chain(self.plans.iter().map(|p| p.h))
            .filter(|h| *h != honest)
            .collect();
        let bad = match c.below(4) {
            0 => ptr::null_mut(),
            1 if !others.is_empty() => others[c.below(others.len())],
            2 => unsafe { honest.cast::<u8>().add(8) }.cast(),
            _ => call::garbage_handle(c, &self.scratch),
        };
        if bad != honest {
            // Another live handle of the same kind would be valid.
            let same_kind = self
                .ctxs
                .iter()
                .any(|x| x.h.cast() == bad && self.is_ctx(honest))
                || self
                    .pools
                    .iter()
                    .any(|p| p.h.cast() == bad && self.is_pool(honest))
                || self
                    .plans
                    .iter()
                    .any(|p| p.h == bad && self.plan_kind(honest) == Some(p.prefill));
            if same_kind {
                return honest;
            }
            call.fail_because(format!("handle {bad:p} instead of {honest:p}"));
        }
        bad
    }

    fn is_ctx(&self, h: *mut c_void) -> bool {
        self.ctxs.iter().any(|x| x.h.cast() == h)
    }
    fn is_pool(&self, h: *mut c_void) -> bool {
        self.pools.iter().any(|p| p.h.cast() == h)
    }
    fn plan_kind(&self, h: *mut c_void) -> Option<bool> {
        self.plans.iter().find(|p| p.h == h).map(|p| p.prefill)
    }

    /// A context for a context-level operation.
    pub fn pick_ctx(&self, c: &mut Cursor) -> &CtxState {
        &self.ctxs[c.below(self.ctxs.len())]
    }

    fn teardown(mut self) {
        use unikv::ffi::attention::*;
        use unikv::ffi::pool::*;
        for p in self.plans.drain(..) {
            unsafe {
                if p.prefill {
                    unikv_prefill_plan_destroy(p.h.cast());
                } else {
                    unikv_decode_plan_destroy(p.h.cast());
                }
            }
        }
        for p in self.pools.drain(..) {
            unsafe { unikv_pool_destroy(p.h) };
        }
        for p in self.owned.drain(..) {
            self.mem.free(p);
        }
        // ctxs[0] is the process's harness context.
        for x in self.ctxs.drain(1..).rev() {
            unsafe { unikv_context_destroy(x.h) };
        }
    }
}

/// Statuses per entry point, counted when `UNIKV_FUZZ_STATS=1` (to see
/// which calls get past validation): `record` from `Call::finish`,
/// `stats_report` prints them.
static STATS: std::sync::Mutex<std::collections::BTreeMap<(&'static str, u32), u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn stats_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("UNIKV_FUZZ_STATS").as_deref() == Ok("1"))
}

pub fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("UNIKV_FUZZ_TRACE").as_deref() == Ok("1"))
}

pub fn record(name: &'static str, status: u32) {
    if stats_on() {
        *STATS.lock().unwrap().entry((name, status)).or_default() += 1;
    }
}

pub fn stats_report() -> String {
    let stats = STATS.lock().unwrap();
    let mut out = String::new();
    let mut last = "";
    for ((name, status), n) in stats.iter() {
        if *name != last {
            out.push_str(&format!("\n{name}:"));
            last = name;
        }
        out.push_str(&format!(" {status}x{n}"));
    }
    out
}

/// Runs one input with the configuration of the environment.
pub fn run(data: &[u8]) {
    static CONFIG: std::sync::OnceLock<Config> = std::sync::OnceLock::new();
    run_with(*CONFIG.get_or_init(Config::from_env), data);
}

pub fn run_with(cfg: Config, data: &[u8]) {
    let mut c = Cursor::new(data);
    let validate = c.u8() & 1 == 1;
    let mut world = World::new(cfg, validate);
    for _ in 0..MAX_OPS {
        if c.exhausted() {
            break;
        }
        world.step(&mut c);
    }
    world.teardown();
}
