//! Replays every input the `iscsi_initiator` fuzz target was seeded with
//! (`fuzz/seeds/iscsi_initiator/`) or ever crashed on
//! (`fuzz/regressions/iscsi_initiator/`) through the same entry point the
//! cargo-fuzz target calls, so `cargo test` pins every crash `bench/fuzz`
//! finds.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use braid_iscsi::fuzzing::{self, Reached};

const TARGET: &str = "iscsi_initiator";

fn dir(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(kind)
        .join(TARGET)
}

/// Every file of `fuzz/<kind>/iscsi_initiator/`, sorted, with what each
/// reached; every input that panics is listed.
fn replay(kind: &str) -> Vec<(String, Reached)> {
    let Ok(entries) = std::fs::read_dir(dir(kind)) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("reading a fuzz folder").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let mut out = Vec::new();
    let mut failures = Vec::new();
    for f in files {
        let data = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let name = f
            .file_name()
            .expect("a file name")
            .to_string_lossy()
            .into_owned();
        match catch_unwind(AssertUnwindSafe(|| fuzzing::initiator(&data))) {
            Ok(r) => out.push((name, r)),
            Err(p) => {
                let why = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                failures.push(format!("{}: {why}", f.display()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "inputs that fail:\n  {}",
        failures.join("\n  ")
    );
    out
}

#[test]
fn every_crash_found_by_fuzzing_stays_fixed() {
    replay("regressions");
}

#[test]
fn the_seeds_run_clean_and_reach_the_full_feature_phase() {
    let seeds = replay("seeds");
    assert!(seeds.len() >= 4, "only {} seeds", seeds.len());
    let (_, deep) = seeds
        .iter()
        .find(|(n, _)| n == "chap-then-everything")
        .expect("the seed that logs in with CHAP");
    assert!(deep.logged_in, "the CHAP seed no longer logs in");
    assert!(
        deep.events >= 5,
        "the CHAP seed reaches only {} events",
        deep.events
    );
}

/// The `iscsi_unit` target's seeds and crashes, each through
/// `fuzzing::unit`; every seed is decided at least once, so fuzzing
/// starts past the unit attentions and checks of the dispatch.
#[test]
fn the_unit_targets_seeds_and_crashes_run_clean() {
    let mut ran = 0;
    let mut unanswered = Vec::new();
    for kind in ["seeds", "regressions"] {
        let folder = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz")
            .join(kind)
            .join("iscsi_unit");
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for e in entries {
            let p = e.expect("reading a fuzz folder").path();
            let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let r = catch_unwind(AssertUnwindSafe(|| fuzzing::unit(&data)));
            assert!(r.is_ok(), "{} panics", p.display());
            if kind == "seeds" && r.ok() == Some(0) {
                unanswered.push(p.display().to_string());
            }
            ran += 1;
        }
    }
    assert!(ran >= 5, "only {ran} inputs for iscsi_unit");
    assert!(unanswered.is_empty(), "seeds never decided: {unanswered:?}");
}

/// The `iscsi_target` target's seeds log in and reach the full feature
/// phase (so fuzzing starts past the login), and its crashes stay fixed.
#[test]
fn the_target_seeds_log_in_and_its_crashes_stay_fixed() {
    let mut deep = 0;
    for kind in ["seeds", "regressions"] {
        let folder = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz")
            .join(kind)
            .join("iscsi_target");
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for e in entries {
            let p = e.expect("reading a fuzz folder").path();
            let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let r = catch_unwind(AssertUnwindSafe(|| fuzzing::target(&data)))
                .unwrap_or_else(|_| panic!("{} panics", p.display()));
            if kind == "seeds" && r.logged_in && r.pdus >= 3 {
                deep += 1;
            }
        }
    }
    assert!(deep >= 2, "only {deep} seeds reach past the login");
}
