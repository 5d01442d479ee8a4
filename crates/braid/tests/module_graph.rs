//! The binary's modules depend on each other in one direction only: a
//! cycle (attach needing metrics needing attach) means two modules that
//! cannot be read, tested or moved apart. This reads `crates/braid/src`,
//! takes every `crate::module` a module's non-test code names, and fails
//! on any cycle, printing it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The top-level module a source file belongs to (`metrics/attach.rs` is
/// part of `metrics`).
fn module_of(rel: &Path) -> String {
    let first = rel.components().next().expect("a file").as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_owned()
}

/// Modules named by `crate::name` or `use crate::{a, b::c}` in `text`,
/// up to its first `#[cfg(test)]` (test code may use anything).
fn uses(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or(text);
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or("");
            for item in group.split(',') {
                let name = item.trim().split("::").next().unwrap_or("").trim();
                if !name.is_empty() {
                    out.insert(name.to_owned());
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

fn graph(src: &Path) -> Graph {
    let mut g = Graph::new();
    let mut stack = vec![src.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("source dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let module = module_of(path.strip_prefix(src).expect("under src"));
            let text = std::fs::read_to_string(&path).expect("source file");
            let deps = g.entry(module.clone()).or_default();
            deps.extend(uses(&text).into_iter().filter(|d| *d != module));
        }
    }
    g
}

/// One cycle, as the modules along it, if there is any.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        g: &Graph,
        m: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut cycle = path[at..].to_vec();
            cycle.push(m.to_owned());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_owned());
        for d in g.get(m).into_iter().flatten() {
            if let Some(c) = visit(g, d, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|m| visit(g, m, &mut Vec::new(), &mut done))
}

#[test]
fn the_binarys_modules_form_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    assert!(g.len() > 10, "read too few modules: {g:?}");
    assert!(
        g["attach"].contains("metrics"),
        "the reader lost track of `use crate::{{...}}`: {g:?}"
    );
    if let Some(cycle) = find_cycle(&g) {
        panic!("module cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn a_cycle_is_found_and_a_chain_is_not() {
    let g = |edges: &[(&str, &str)]| -> Graph {
        let mut g = Graph::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    let chain = g(&[("attach", "metrics"), ("metrics", "attached")]);
    assert_eq!(find_cycle(&chain), None);
    let cycle = g(&[
        ("attach", "serve"),
        ("serve", "metrics"),
        ("metrics", "attach"),
    ]);
    let found = find_cycle(&cycle).expect("a cycle");
    assert_eq!(found.first(), found.last());
    assert_eq!(found.len(), 4);
    assert_eq!(
        uses("use crate::{control, ctl::Reply};\nfn f() { crate::out::x(); }\n#[cfg(test)]\nuse crate::attach;"),
        ["control", "ctl", "out"].iter().map(|s| s.to_string()).collect()
    );
}
