//! libFuzzer target: bytes -> a sequence of unikv C-API calls with invariant
//! checks after each (tests/fuzz_harness/). Run it with scripts/fuzz.sh.
#![no_main]

#[path = "../../tests/fuzz_harness/mod.rs"]
mod harness;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    harness::run(data);
});
