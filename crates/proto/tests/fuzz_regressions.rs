//! Replays every input the fuzzers were ever seeded with or ever crashed
//! on through the same `braid_proto::fuzzing` entry points the cargo-fuzz
//! targets call, so `cargo test` pins every crash found (see `bench/fuzz`).
//!
//! Inputs live in the top-level `fuzz/` directory, one folder per target:
//! `fuzz/regressions/<target>/` (each crash `bench/fuzz` found, kept under
//! the name libFuzzer gave it) and `fuzz/seeds/<target>/` (the small
//! starting corpus). A folder named after no target fails the test, so an
//! input cannot be skipped by a typo.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use braid_proto::fuzzing;

/// A `braid_proto::fuzzing` entry point.
type Target = fn(&[u8]);

/// Every fuzz target, by the name of its folder and its binary.
const TARGETS: [(&str, Target); 4] = [
    ("server_handshake", fuzzing::server_handshake),
    ("client_handshake", fuzzing::client_handshake),
    ("request", fuzzing::request),
    ("reply", fuzzing::reply),
];

fn fuzz_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    dir.canonicalize().unwrap_or(dir)
}

/// `(target, file)` for every file in `fuzz/<kind>/<target>/`, sorted.
fn inputs(kind: &str) -> Vec<(String, PathBuf)> {
    let dir = fuzz_dir().join(kind);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        // regressions/ holds only a README until a crash is found.
        return Vec::new();
    };
    let mut found = Vec::new();
    for target in entries {
        let target = target.expect("reading fuzz directory").path();
        if !target.is_dir() {
            continue;
        }
        let name = target
            .file_name()
            .and_then(|n| n.to_str())
            .expect("UTF-8 folder name")
            .to_owned();
        for file in std::fs::read_dir(&target).expect("reading target folder") {
            let file = file.expect("reading target folder").path();
            if file.is_file() {
                found.push((name.clone(), file));
            }
        }
    }
    found.sort();
    found
}

/// Runs each input through its target; every failure is listed, not just
/// the first, with the file to hand to `cargo fuzz run TARGET FILE`.
fn replay(kind: &str) -> usize {
    let inputs = inputs(kind);
    let mut failures = Vec::new();
    for (target, file) in &inputs {
        let Some((_, run)) = TARGETS.iter().find(|(name, _)| name == target) else {
            // Another crate's target (iscsi_initiator) is replayed by that
            // crate's own test; a folder naming no target at all is a typo.
            let elsewhere = fuzz_dir()
                .join("fuzz_targets")
                .join(format!("{target}.rs"))
                .is_file();
            if !elsewhere {
                failures.push(format!(
                    "{}: no fuzz target named {target:?}",
                    file.display()
                ));
            }
            continue;
        };
        let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| run(&data))) {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "non-string panic".into());
            failures.push(format!("{} ({target}): {why}", file.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} inputs in fuzz/{kind} fail:\n  {}",
        failures.len(),
        inputs.len(),
        failures.join("\n  ")
    );
    inputs.len()
}

#[test]
fn every_crash_found_by_fuzzing_stays_fixed() {
    replay("regressions");
}

#[test]
fn every_seed_input_runs_clean() {
    let n = replay("seeds");
    assert!(n >= TARGETS.len(), "only {n} seed inputs in fuzz/seeds");
    for (target, _) in TARGETS {
        assert!(
            fuzz_dir().join("seeds").join(target).is_dir(),
            "no seeds for fuzz target {target}"
        );
    }
}
