//! Replays the committed fuzz corpus (fuzz/corpus/api/) and every crash the
//! fuzzer found (fuzz/regressions/) through the fuzz harness, so plain
//! `cargo test` checks the same invariants as the fuzzer. On a GPU machine,
//! `UNIKV_FUZZ_BACKEND=cuda` replays them on CUDA contexts (build with
//! `--features cuda`; run under compute-sanitizer memcheck for the bounds).

mod fuzz_harness;

use std::path::{Path, PathBuf};

fn inputs(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.is_file()
                    && !p
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
}

fn replay(dir: &str) -> usize {
    let files = inputs(dir);
    for f in &files {
        let data = std::fs::read(f).unwrap();
        eprintln!("replaying {}", f.display());
        fuzz_harness::run(&data);
    }
    files.len()
}

#[test]
fn corpus_replays_cleanly() {
    let n = replay("fuzz/corpus/api");
    eprintln!("{n} corpus inputs replayed");
    eprintln!(
        "statuses (UNIKV_FUZZ_STATS=1):{}",
        fuzz_harness::stats_report()
    );
    assert!(n > 0, "the committed corpus fuzz/corpus/api is empty");
}

#[test]
fn regressions_replay_cleanly() {
    let n = replay("fuzz/regressions");
    eprintln!("{n} regression inputs replayed");
}

/// Inputs decoded from nothing and from constant bytes: the decoder's
/// honest defaults must pass too.
#[test]
fn trivial_inputs_pass() {
    for data in [&[][..], &[0u8; 64], &[0xFFu8; 64], &[0x55u8; 300]] {
        fuzz_harness::run(data);
    }
}
