//! Replays the committed fuzz corpus (fuzz/corpus/api/) and every crash the
//! fuzzer found (fuzz/regressions/) through the fuzz harness, so plain
//! `cargo test` checks the same invariants as the fuzzer. On a GPU machine,
//! `UNIKV_FUZZ_BACKEND=cuda` replays them on CUDA contexts (build with
//! `--features cuda`; run under compute-sanitizer memcheck for the bounds).

mod fuzz_harness;

use std::path::{Path, PathBuf};

/// The folder holding fuzz/: the repository, or `UNIKV_FUZZ_ROOT` (a test
/// binary carried to a GPU machine without the checkout it was built in).
fn root() -> PathBuf {
    std::env::var_os("UNIKV_FUZZ_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Fuzz inputs, not the folders' own notes (README.md, OPEN, dot files).
fn is_input(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    !name.is_some_and(|n| n.starts_with('.') || n.ends_with(".md") || n == "OPEN")
}

fn inputs(dir: &str) -> Vec<PathBuf> {
    let dir = root().join(dir);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file() && is_input(p))
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
}

/// Replays every input of `dir`, going on past failures (a GPU run should
/// report them all); returns how many there were and the failed ones.
fn replay(dir: &str) -> (usize, Vec<String>) {
    let files = inputs(dir);
    let mut failed = Vec::new();
    for f in &files {
        let data = std::fs::read(f).unwrap();
        eprintln!("replaying {}", f.display());
        if std::panic::catch_unwind(|| fuzz_harness::run(&data)).is_err() {
            failed.push(f.display().to_string());
            fuzz_harness::reset();
        }
    }
    (files.len(), failed)
}

#[test]
fn corpus_replays_cleanly() {
    let (n, failed) = replay("fuzz/corpus/api");
    eprintln!("{n} corpus inputs replayed, {} failed", failed.len());
    eprintln!(
        "statuses (UNIKV_FUZZ_STATS=1):{}",
        fuzz_harness::stats_report()
    );
    assert!(n > 0, "the committed corpus fuzz/corpus/api is empty");
    assert!(
        failed.is_empty(),
        "{} of {n} inputs failed: {failed:#?}",
        failed.len()
    );
}

/// Regression inputs named in fuzz/regressions/OPEN (the first '|' field of
/// each line) still fail: the library defect they found is not fixed yet.
/// They must keep failing until it is, and then leave that list.
fn open_defects() -> Vec<String> {
    let path = root().join("fuzz/regressions/OPEN");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split('|').next().unwrap().trim().to_string())
        .collect()
}

/// Where the open defects show: the CPU backend with overflow checks (the
/// test profile). A release build wraps instead of panicking and the CUDA
/// backend computes elsewhere; there they must replay cleanly.
fn reproduces_open_defects() -> bool {
    cfg!(debug_assertions) && fuzz_harness::Config::from_env().backend == 1
}

#[test]
fn regressions_replay_cleanly() {
    let open = open_defects();
    let files = inputs("fuzz/regressions");
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let data = std::fs::read(f).unwrap();
        eprintln!("replaying {}", f.display());
        if open.contains(&name) && reproduces_open_defects() {
            let failed = std::panic::catch_unwind(|| fuzz_harness::run(&data)).is_err();
            fuzz_harness::reset();
            assert!(
                failed,
                "{name} passes now: its defect is fixed, remove it from fuzz/regressions/OPEN"
            );
        } else {
            fuzz_harness::run(&data);
        }
    }
    for name in &open {
        assert!(
            files.iter().any(|f| f.ends_with(name)),
            "OPEN names {name}, which is not in fuzz/regressions"
        );
    }
    eprintln!(
        "{} regression inputs replayed, {} of them open defects",
        files.len(),
        open.len()
    );
}

/// Inputs decoded from nothing and from constant bytes: the decoder's
/// honest defaults must pass too.
#[test]
fn trivial_inputs_pass() {
    for data in [&[][..], &[0u8; 64], &[0xFFu8; 64], &[0x55u8; 300]] {
        fuzz_harness::run(data);
    }
}
