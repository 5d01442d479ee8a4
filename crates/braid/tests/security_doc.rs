//! SECURITY.md backs each promise with the tests that check it, named as
//! `module::test`. A renamed or deleted test would leave a promise with
//! nothing behind it while the page still reads as tested; this finds
//! every such name and the function it names.

use std::path::{Path, PathBuf};

/// The workspace root, two levels above this crate.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `a::b` (or longer) in backticks whose parts are Rust identifiers:
/// how the page names tests.
fn named_tests(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 0 {
            continue; // outside backticks
        }
        let parts: Vec<&str> = span.split("::").collect();
        let ident = |p: &&str| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        if parts.len() >= 2 && parts.iter().all(ident) {
            out.push(parts.into_iter().map(str::to_owned).collect());
        }
    }
    out
}

/// Rust sources under `dir`, recursively (`crates/` holds no build output).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether `path` is the file of module path `modules` (`a/b.rs` or
/// `a/b/mod.rs` at its end). A crate's `src/` is left out, so that
/// `engine::sim` is `crates/engine/src/sim.rs`.
fn is_module(path: &Path, modules: &[String]) -> bool {
    let as_file = format!("/{}.rs", modules.join("/"));
    let as_dir = format!("/{}/mod.rs", modules.join("/"));
    let p = path.to_string_lossy().replace("/src/", "/");
    p.ends_with(&as_file) || p.ends_with(&as_dir)
}

/// Whether some module file matching `modules`, or a shorter prefix of
/// them (the rest being inline modules such as `mod tests`), defines
/// `fn name(`.
fn defined(files: &[PathBuf], modules: &[String], name: &str) -> bool {
    (1..=modules.len()).rev().any(|k| {
        files
            .iter()
            .filter(|f| is_module(f, &modules[..k]))
            .any(|f| {
                let text = std::fs::read_to_string(f).expect("readable source");
                text.contains(&format!("fn {name}("))
            })
    })
}

#[test]
fn every_test_security_md_names_exists() {
    let root = root();
    let page = std::fs::read_to_string(root.join("SECURITY.md")).expect("SECURITY.md");
    let names = named_tests(&page);
    assert!(
        names.len() >= 15,
        "SECURITY.md names only {} tests: did the naming change?",
        names.len()
    );
    let mut files = Vec::new();
    sources(&root.join("crates"), &mut files);
    let missing: Vec<String> = names
        .iter()
        .filter(|parts| {
            let (name, modules) = parts.split_last().expect("two parts at least");
            !defined(&files, modules, name)
        })
        .map(|parts| parts.join("::"))
        .collect();
    assert!(
        missing.is_empty(),
        "SECURITY.md names tests that do not exist (renamed? then rename them on the page \
         too): {missing:?}"
    );
}

#[test]
fn the_checker_tells_a_real_test_from_a_made_up_one() {
    let mut files = Vec::new();
    sources(&root().join("crates"), &mut files);
    let path = |s: &str| -> Vec<String> { s.split("::").map(str::to_owned).collect() };
    assert!(defined(&files, &path("security_doc"), "named_tests"));
    assert!(defined(
        &files,
        &path("backend::durable::tests"),
        "a_flush_that_overlapped_a_failed_one_fails_too"
    ));
    assert!(defined(
        &files,
        &path("engine::sim::fence_runs"),
        "randomised_faults_keep_every_invariant"
    ));
    assert!(!defined(&files, &path("security_doc"), "no_such_test"));
    assert!(
        !defined(&files, &path("power_loss"), "named_tests"),
        "another file's function"
    );
    assert_eq!(
        named_tests("a `x::y_z` b `NBD_CMD_FLUSH` c `--flag` `braid_export_failed{export}`"),
        vec![path("x::y_z")]
    );
}
