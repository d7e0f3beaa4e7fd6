//! The request-slot allocator: hands out slots 1..=R, lowest free slot first;
//! slot 0 is reserved (CUDA-graph padding tokens may point at it, so no live
//! request ever owns it).
//!
//! Its memory is proportional to the slots in use, not to R: a pool may be
//! created for 2^32 - 1 requests without the allocator reserving anything.
//! Slots at or above `fresh` have never been handed out (or were released
//! from the top); below it, a slot is either in use or in `free`.

use std::collections::BTreeSet;

use parking_lot::Mutex;

use crate::error::{ensure, Result};

#[derive(Debug)]
pub struct SlotAllocator {
    max: u64,
    state: Mutex<SlotState>,
}

#[derive(Debug)]
struct SlotState {
    /// The lowest slot never handed out since it was last at the top.
    fresh: u64,
    /// Released slots below `fresh`.
    free: BTreeSet<u64>,
    in_use: u64,
}

impl SlotAllocator {
    pub fn new(max_requests: u32) -> Self {
        SlotAllocator {
            max: max_requests.into(),
            state: Mutex::new(SlotState {
                fresh: 1,
                free: BTreeSet::new(),
                in_use: 0,
            }),
        }
    }

    pub fn acquire(&self) -> Result<u32> {
        let mut state = self.state.lock();
        let slot = match state.free.pop_first() {
            Some(slot) => slot,
            None => {
                ensure!(
                    state.fresh <= self.max,
                    CapacityExceeded,
                    "pool: all {} request slots are in use",
                    self.max
                );
                state.fresh += 1;
                state.fresh - 1
            }
        };
        state.in_use += 1;
        Ok(slot as u32)
    }

    /// Fails as `release` would for a slot that is not acquired, without
    /// releasing it.
    pub fn check_acquired(&self, slot: u32) -> Result<()> {
        self.acquired(&self.state.lock(), slot)
    }

    fn acquired(&self, state: &SlotState, slot: u32) -> Result<()> {
        let s = u64::from(slot);
        ensure!(
            s >= 1 && s <= self.max,
            OutOfRange,
            "slot: {slot} is not a request slot of this pool (1..={})",
            self.max
        );
        ensure!(
            s < state.fresh && !state.free.contains(&s),
            InvalidState,
            "slot: {slot} is not acquired"
        );
        Ok(())
    }

    pub fn release(&self, slot: u32) -> Result<()> {
        let mut state = self.state.lock();
        self.acquired(&state, slot)?;
        let s = u64::from(slot);
        if s + 1 == state.fresh {
            // Give the top back to the never-used range, with any released
            // slots directly below it, so `free` stays as small as the gaps.
            state.fresh = s;
            while state.free.last() == Some(&(state.fresh - 1)) {
                state.free.pop_last();
                state.fresh -= 1;
            }
        } else {
            state.free.insert(s);
        }
        state.in_use -= 1;
        Ok(())
    }

    pub fn in_use(&self) -> usize {
        self.state.lock().in_use as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_free_slot_first_after_any_release_order() {
        let slots = SlotAllocator::new(5);
        let got: Vec<u32> = (0..5).map(|_| slots.acquire().unwrap()).collect();
        assert_eq!(got, [1, 2, 3, 4, 5]);
        assert!(slots.acquire().is_err());
        for s in [2, 4, 1] {
            slots.release(s).unwrap();
        }
        assert_eq!(slots.in_use(), 2);
        assert_eq!(slots.acquire().unwrap(), 1);
        assert_eq!(slots.acquire().unwrap(), 2);
        slots.release(5).unwrap();
        slots.release(3).unwrap();
        assert_eq!(slots.acquire().unwrap(), 3);
        assert_eq!(slots.acquire().unwrap(), 4);
        assert_eq!(slots.acquire().unwrap(), 5);
    }

    #[test]
    fn memory_follows_use_not_capacity() {
        let slots = SlotAllocator::new(u32::MAX);
        for want in 1..=64 {
            assert_eq!(slots.acquire().unwrap(), want);
        }
        for s in (1..=64).rev() {
            slots.release(s).unwrap();
        }
        let state = slots.state.lock();
        assert_eq!((state.fresh, state.free.len(), state.in_use), (1, 0, 0));
    }

    #[test]
    fn matches_a_set_model_under_random_use() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5107);
        let slots = SlotAllocator::new(16);
        let mut model = BTreeSet::new();
        for _ in 0..20_000 {
            let slot: u32 = rng.random_range(0..=17);
            if rng.random_bool(0.5) {
                let want = (1..=16).find(|s| !model.contains(s));
                assert_eq!(slots.acquire().ok(), want);
                model.extend(want);
            } else {
                let held = model.remove(&slot);
                assert_eq!(slots.release(slot).is_ok(), held, "release {slot}");
            }
            assert_eq!(slots.in_use(), model.len());
        }
    }

    #[test]
    fn the_last_slot_of_a_full_range_is_handed_out() {
        let slots = SlotAllocator::new(u32::MAX);
        slots.state.lock().fresh = u64::from(u32::MAX);
        assert_eq!(slots.acquire().unwrap(), u32::MAX);
        assert!(slots.acquire().is_err());
        slots.release(u32::MAX).unwrap();
        assert_eq!(slots.acquire().unwrap(), u32::MAX);
    }
}
