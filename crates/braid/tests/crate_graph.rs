//! The arrows between the workspace's crates, as the design has them:
//! the neutral block words at the bottom, the sans-IO protocol and
//! decision crates over them, the storage layer and the initiator beside
//! each other (neither knows the other), the front ends as siblings over
//! the storage layer, and the binary on top. A new `braid-*` dependency
//! in any `Cargo.toml` must be stated here, with the layering it keeps;
//! one that breaks it (the initiator reaching into a target, a front end
//! into another, a sans-IO crate into one with I/O) fails this test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each crate (by directory) and the workspace crates its
/// `[dependencies]` may name.
const ALLOWED: &[(&str, &[&str])] = &[
    // Words and protocols: no I/O, nothing of the workspace's I/O crates.
    ("block", &[]),
    ("proto", &["block"]),
    ("policy", &[]),
    ("iscsi", &["block", "scsi"]),
    ("scsi", &["block"]),
    ("engine", &["block", "policy", "proto"]),
    // Leaves with I/O.
    ("netif", &[]),
    ("pool", &[]),
    ("powercut", &[]),
    ("rbd", &[]),
    ("console", &[]),
    ("lab", &[]),
    ("test-needs", &[]),
    // The storage layer, and the front ends over it.
    ("store", &["block", "netif", "pool", "proto"]),
    ("nbd-target", &["block", "netif", "pool", "proto", "store"]),
    (
        "iscsi-target",
        &["block", "netif", "pool", "iscsi", "scsi", "store"],
    ),
    ("gateway", &["block", "pool", "proto", "rbd", "store"]),
    // The initiator: the engine over transports; no target crate.
    (
        "initiator",
        &[
            "block", "engine", "iscsi", "scsi", "netif", "policy", "pool", "proto",
        ],
    ),
    ("doctor", &["block", "initiator", "netif", "proto"]),
    // The binary wires everything.
    (
        "braid",
        &[
            "block",
            "console",
            "doctor",
            "gateway",
            "initiator",
            "iscsi",
            "iscsi-target",
            "nbd-target",
            "netif",
            "policy",
            "pool",
            "proto",
            "scsi",
            "store",
        ],
    ),
];

/// Workspace package name -> directory, and directory -> the workspace
/// packages its `[dependencies]` name.
fn read_workspace() -> (BTreeMap<String, String>, BTreeMap<String, BTreeSet<String>>) {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut names = BTreeMap::new();
    let mut deps = BTreeMap::new();
    for entry in std::fs::read_dir(&crates).expect("crates/") {
        let dir = entry.expect("dir entry").path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let dir_name = dir
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        let package = manifest
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|l| l.strip_suffix('"'))
            .expect("a package name")
            .to_owned();
        names.insert(package, dir_name.clone());
        deps.insert(dir_name, dependencies(&manifest));
    }
    (names, deps)
}

/// The `braid-*` names in a manifest's `[dependencies]` table (not dev-
/// or build-dependencies: tests may use anything).
fn dependencies(manifest: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        if inside && line.starts_with("braid-") {
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            out.insert(name);
        }
    }
    out
}

#[test]
fn every_arrow_between_crates_is_one_the_design_allows() {
    let (names, deps) = read_workspace();
    assert!(deps.len() > 10, "read too few crates: {deps:?}");
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(c, d)| (*c, d.iter().copied().collect()))
        .collect();
    let mut wrong = Vec::new();
    for (dir, uses) in &deps {
        let Some(may) = allowed.get(dir.as_str()) else {
            wrong.push(format!(
                "crates/{dir} is not in this test's table: add it, with what it may depend on"
            ));
            continue;
        };
        for package in uses {
            let to = names.get(package).map_or(package.as_str(), String::as_str);
            if !may.contains(to) {
                wrong.push(format!("crates/{dir} -> crates/{to} ({package})"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "arrows the design does not allow:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_allowed_arrows_form_no_cycle_and_keep_the_layers() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    // No cycle: every crate is reached only after everything it uses.
    let mut done: BTreeSet<&str> = BTreeSet::new();
    while done.len() < allowed.len() {
        let before = done.len();
        for (c, d) in &allowed {
            if d.iter().all(|x| done.contains(x)) {
                done.insert(c);
            }
        }
        assert!(
            done.len() > before,
            "a cycle among: {:?}",
            allowed
                .keys()
                .filter(|c| !done.contains(*c))
                .collect::<Vec<_>>()
        );
    }
    let targets = ["store", "nbd-target", "iscsi-target", "gateway"];
    for t in targets {
        assert!(
            !allowed["initiator"].contains(&t),
            "the initiator must not use {t}"
        );
    }
    for front in ["nbd-target", "iscsi-target", "gateway"] {
        for other in ["nbd-target", "iscsi-target", "gateway"] {
            assert!(
                !allowed[front].contains(&other),
                "front ends are siblings: {front} uses {other}"
            );
        }
    }
    for pure in ["block", "proto", "policy", "iscsi", "scsi", "engine"] {
        for d in allowed[pure] {
            assert!(
                ["block", "proto", "policy", "iscsi", "scsi"].contains(d),
                "{pure} is sans-IO and uses {d}"
            );
        }
    }
}
