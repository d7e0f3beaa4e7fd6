//! The request-slot allocator: hands out slots 1..=R; slot 0 is reserved (CUDA-graph
//! padding tokens may point at it, so no live request ever owns it).

use parking_lot::Mutex;

use crate::error::{ensure, err, Result};

#[derive(Debug)]
pub struct SlotAllocator {
    state: Mutex<SlotState>,
}

#[derive(Debug)]
struct SlotState {
    /// `in_use[s]` for s in 0..=R; index 0 is never handed out.
    in_use: Vec<bool>,
    /// Free slots, popped from the back; lowest slots come out first.
    free: Vec<u32>,
}

impl SlotAllocator {
    pub fn new(max_requests: usize) -> Self {
        let free = (1..=max_requests as u32).rev().collect();
        SlotAllocator {
            state: Mutex::new(SlotState {
                in_use: vec![false; max_requests + 1],
                free,
            }),
        }
    }

    pub fn acquire(&self) -> Result<u32> {
        let mut state = self.state.lock();
        let Some(slot) = state.free.pop() else {
            return Err(err!(
                CapacityExceeded,
                "pool: all {} request slots are in use",
                state.in_use.len() - 1
            ));
        };
        state.in_use[slot as usize] = true;
        Ok(slot)
    }

    pub fn release(&self, slot: u32) -> Result<()> {
        let mut state = self.state.lock();
        let max = state.in_use.len() - 1;
        ensure!(
            slot >= 1 && (slot as usize) <= max,
            OutOfRange,
            "slot: {slot} is not a request slot of this pool (1..={max})"
        );
        ensure!(
            state.in_use[slot as usize],
            InvalidState,
            "slot: {slot} is not acquired"
        );
        state.in_use[slot as usize] = false;
        state.free.push(slot);
        Ok(())
    }

    pub fn in_use(&self) -> usize {
        let state = self.state.lock();
        state.in_use.iter().filter(|used| **used).count()
    }
}
