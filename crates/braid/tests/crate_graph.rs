//! The arrows between the workspace's crates, as the design has them:
//! the neutral block words at the bottom, the sans-IO protocol and
//! decision crates over them, the storage layer and the initiator beside
//! each other (neither knows the other), the front ends as siblings over
//! the storage layer, and the binary on top. A new `braid-*` dependency
//! in any `Cargo.toml` must be allowed here, with the layering it keeps;
//! one that breaks it (the initiator reaching into a target, a front end
//! into another, a sans-IO crate into one with I/O) fails this test.
//!
//! Front ends are a rule, not rows: a crate `X-target` is a front end and
//! `X` its protocol without I/O, so a new protocol's pair of crates is
//! checked without an edit here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each crate (by directory) that is not a front end or a front end's
/// protocol crate, and the workspace crates its `[dependencies]` may name.
const ALLOWED: &[(&str, &[&str])] = &[
    // Words and protocols: no I/O, nothing of the workspace's I/O crates.
    ("block", &[]),
    ("proto", &["block"]),
    ("policy", &[]),
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
    // The storage layer, and the Ceph gateway over it (a front end of
    // RBD images, served by the NBD server).
    ("store", &["block", "netif", "pool", "proto"]),
    ("gateway", &["block", "pool", "proto", "rbd", "store"]),
    // The initiator: the engine over transports; no target crate.
    (
        "initiator",
        &[
            "block", "engine", "iscsi", "scsi", "netif", "policy", "pool", "proto",
        ],
    ),
    ("doctor", &["block", "initiator", "netif", "proto"]),
    // The binary wires everything: these, and every front end with its
    // protocol crate and what that uses (the rule below).
    (
        "braid",
        &[
            "block",
            "console",
            "doctor",
            "gateway",
            "initiator",
            "netif",
            "policy",
            "pool",
            "proto",
            "store",
        ],
    ),
];

/// What every front end (`X-target`) may use besides its protocol crate
/// `X` and what that uses: the storage layer, the neutral block words,
/// the interfaces and the buffer pool.
const FRONT_END_MAY: &[&str] = &["block", "netif", "pool", "store"];

/// What a front end's protocol crate `X` may use: the neutral words and
/// the command sets a transport carries.
const PROTOCOL_MAY: &[&str] = &["block", "scsi"];

/// Front ends whose protocol crate is not named after them (NBD's
/// protocol crate came first, and the engine and the store use it too).
const PROTOCOL_OF: &[(&str, &str)] = &[("nbd-target", "proto")];

/// The front end's protocol crate, by directory.
fn protocol_of(front: &str) -> Option<&str> {
    PROTOCOL_OF
        .iter()
        .find(|(f, _)| *f == front)
        .map(|(_, p)| *p)
        .or_else(|| front.strip_suffix("-target"))
}

/// Every crate of the workspace (by directory) and what it may use: the
/// table's rows, and the rule's for front ends and their protocol crates.
/// A crate that is neither is left out, for the caller to name.
fn allowed(dirs: &BTreeSet<String>) -> BTreeMap<String, BTreeSet<String>> {
    let own = |v: &[&str]| -> BTreeSet<String> { v.iter().map(|s| (*s).to_owned()).collect() };
    let mut out: BTreeMap<String, BTreeSet<String>> = ALLOWED
        .iter()
        .map(|(c, d)| ((*c).to_owned(), own(d)))
        .collect();
    let fronts: Vec<&String> = dirs.iter().filter(|d| d.ends_with("-target")).collect();
    for front in &fronts {
        let protocol = protocol_of(front).expect("a front end's name ends in -target");
        out.entry(protocol.to_owned())
            .or_insert_with(|| own(PROTOCOL_MAY));
    }
    for front in &fronts {
        let protocol = protocol_of(front).expect("a front end's name ends in -target");
        let mut may = own(FRONT_END_MAY);
        may.insert(protocol.to_owned());
        may.extend(out[protocol].iter().cloned());
        if let Some(binary) = out.get_mut("braid") {
            binary.insert((*front).clone());
            binary.extend(may.iter().cloned());
        }
        out.insert((*front).clone(), may);
    }
    out
}

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
    let allowed = allowed(&deps.keys().cloned().collect());
    let mut wrong = Vec::new();
    for (dir, uses) in &deps {
        let Some(may) = allowed.get(dir) else {
            wrong.push(format!(
                "crates/{dir} is not in this test's table: add it, with what it may depend on \
                 (a front end is named X-target, its protocol crate X)"
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
    let (_, deps) = read_workspace();
    let dirs: BTreeSet<String> = deps.keys().cloned().collect();
    let allowed = allowed(&dirs);
    // No cycle: every crate is reached only after everything it uses.
    let mut done: BTreeSet<&str> = BTreeSet::new();
    while done.len() < allowed.len() {
        let before = done.len();
        for (c, d) in &allowed {
            if d.iter().all(|x| done.contains(x.as_str())) {
                done.insert(c);
            }
        }
        assert!(
            done.len() > before,
            "a cycle among: {:?}",
            allowed
                .keys()
                .filter(|c| !done.contains(c.as_str()))
                .collect::<Vec<_>>()
        );
    }
    let fronts: Vec<&str> = dirs
        .iter()
        .map(String::as_str)
        .filter(|d| d.ends_with("-target"))
        .chain(["gateway"])
        .collect();
    assert!(
        fronts.contains(&"nbd-target") && fronts.contains(&"iscsi-target"),
        "front ends not found: {fronts:?}"
    );
    for t in fronts.iter().chain(&["store"]) {
        assert!(
            !allowed["initiator"].contains(*t),
            "the initiator must not use {t}"
        );
    }
    for front in &fronts {
        for other in &fronts {
            assert!(
                !allowed[*front].contains(*other),
                "front ends are siblings: {front} uses {other}"
            );
        }
    }
    let pure: BTreeSet<&str> = ["block", "proto", "policy", "scsi", "engine"]
        .into_iter()
        .chain(fronts.iter().filter_map(|f| protocol_of(f)))
        .collect();
    for p in &pure {
        for d in &allowed[*p] {
            assert!(
                pure.contains(d.as_str()) && d != "engine",
                "{p} is sans-IO and uses {d}"
            );
        }
    }
}
