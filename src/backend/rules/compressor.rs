//! The compressor's device values: requests, slots, positions, how a
//! request's tokens sit in the call, and where closed groups go.

use std::collections::HashMap;

use crate::args::compressor::{CompressArgs, CompressMode};
use crate::backend::host::{int_values, slice};
use crate::compressor::{closed_group, window_start};
use crate::error::{ensure, err, Result};

/// A group closed by token `t`: group `n` of its request, stored at `loc`
/// (None: not stored).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Emission {
    pub t: usize,
    pub n: u64,
    pub loc: Option<u64>,
}

/// What a call reads and writes, derived from its checked device values.
#[derive(Debug, Default)]
pub(crate) struct CompressPlan {
    /// Per token its slot, position and run; None for padding.
    pub tokens: Vec<Option<TokenPlan>>,
    pub emissions: Vec<Emission>,
    /// (token, state row) pairs: the raw rows the state keeps after the call.
    pub writes: Vec<(usize, usize)>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenPlan {
    pub slot: usize,
    pub pos: u64,
    /// The request's first token in this call and its position.
    pub run_start: usize,
    pub run_pos: u64,
}

/// Where the raw row of absolute position `q` comes from when token `t`'s
/// group is pooled: the call's own row of that position, or the state.
pub(crate) enum Source {
    Input(usize),
    State(usize),
}

impl CompressPlan {
    pub(crate) fn source(&self, a: &CompressArgs, t: usize, q: u64) -> Source {
        let tp = self.tokens[t].expect("an emitting token is not padding");
        if q >= tp.run_pos {
            Source::Input(tp.run_start + (q - tp.run_pos) as usize)
        } else {
            Source::State(a.state.geometry.row(tp.slot, q))
        }
    }
}

/// Checks every device value the call reads and returns its plan:
/// `batch_id` below the requests, slots of the pool, non-negative positions;
/// decode: at most one token per request; prefill: a request's tokens
/// contiguous with consecutive positions; no two requests on one slot; for
/// every token that closes a group, the group's first position inside the
/// RoPE table and a location inside the target (no two groups on one). Reads
/// only the integer arguments, so `Validating` runs it on host copies.
pub(crate) fn compress_plan(a: &CompressArgs) -> Result<CompressPlan> {
    let n = a.num_tokens;
    let g = &a.state.geometry;
    // SAFETY: host views with extents checked by `ops::compressor`.
    let (batch, slots, positions, locations) = unsafe {
        (
            slice(&a.batch_id, n),
            slice(&a.req_slots, a.req_slots.shape[0]),
            int_values(&a.positions, n),
            int_values(&a.loc, n),
        )
    };
    let mut plan = CompressPlan {
        tokens: Vec::with_capacity(n),
        ..CompressPlan::default()
    };
    // Per request: its slot's owner check and the run it occupies.
    let mut runs: HashMap<i32, (usize, usize)> = HashMap::new();
    let mut slot_owner: HashMap<usize, i32> = HashMap::new();
    for t in 0..n {
        let b = batch[t];
        if b < 0 {
            plan.tokens.push(None);
            continue;
        }
        ensure!(
            (b as usize) < slots.len(),
            OutOfRange,
            "batch_id[{t}]: {b} is not below the number of requests {}",
            slots.len()
        );
        let slot = slots[b as usize];
        ensure!(
            slot >= 0 && (slot as usize) < g.slots,
            OutOfRange,
            "req_slots[{b}]: {slot} is not a slot of this pool (0..{})",
            g.slots
        );
        let slot = slot as usize;
        let p = positions[t];
        ensure!(p >= 0, OutOfRange, "positions[{t}]: {p} is negative");
        let pos = p as u64;
        if let Some(other) = slot_owner.insert(slot, b) {
            ensure!(
                other == b,
                InvalidArgument,
                "req_slots[{b}]: requests {other} and {b} share slot {slot}"
            );
        }
        let (run_start, run_pos) = match runs.get(&b).copied() {
            None => {
                runs.insert(b, (t, t));
                (t, pos)
            }
            Some((start, last)) => {
                ensure!(
                    a.mode == CompressMode::Prefill,
                    InvalidArgument,
                    "batch_id[{t}]: request {b} already has token {start}; decode takes one token per request (prefill takes chunks)"
                );
                ensure!(
                    last + 1 == t,
                    InvalidArgument,
                    "batch_id[{t}]: request {b}'s tokens are not contiguous (token {last} is its previous one)"
                );
                let start_pos = plan.tokens[start].expect("a run starts at a token").pos;
                ensure!(
                    positions[last].checked_add(1) == Some(p),
                    InvalidArgument,
                    "positions[{t}]: {p} does not follow position {} of request {b}'s previous token",
                    positions[last]
                );
                runs.insert(b, (start, t));
                (start, start_pos)
            }
        };
        plan.tokens.push(Some(TokenPlan {
            slot,
            pos,
            run_start,
            run_pos,
        }));
    }
    let ratio = g.ratio;
    let capacity = a.target.capacity();
    let mut loc_owner: HashMap<u64, usize> = HashMap::new();
    for t in 0..n {
        let Some(tp) = plan.tokens[t] else { continue };
        // The state keeps each request's last `ring` rows.
        let (_, last) = runs[&batch[t]];
        let last_pos = plan.tokens[last].expect("a run ends at a token").pos;
        if tp.pos + g.ring as u64 > last_pos {
            plan.writes.push((t, g.row(tp.slot, tp.pos)));
        }
        let Some(group) = closed_group(ratio, tp.pos) else {
            continue;
        };
        let first = group * ratio.value() as u64;
        ensure!(
            first < a.rope_table.shape[0] as u64,
            OutOfRange,
            "positions[{t}]: its group starts at position {first}, not below the {} rows of rope_table",
            a.rope_table.shape[0]
        );
        debug_assert!(window_start(ratio, group) < tp.pos as i64);
        let l = locations[t];
        let loc = if l < 0 {
            None
        } else {
            ensure!(
                (l as u64) < capacity,
                OutOfRange,
                "loc[{t}]: {l} is not below the target's {capacity} locations"
            );
            if let Some(first) = loc_owner.insert(l as u64, t) {
                return Err(err!(
                    InvalidArgument,
                    "loc[{t}]: tokens {first} and {t} both store a group to location {l}"
                ));
            }
            Some(l as u64)
        };
        plan.emissions.push(Emission { t, n: group, loc });
    }
    Ok(plan)
}
