//! Within every crate of the workspace, sibling modules depend on each
//! other in one direction only: a cycle (attach needing metrics needing
//! attach, or `volume/core` needing `volume/recover` needing
//! `volume/open` needing `volume/core`) means modules that cannot be
//! read, tested or moved apart. This reads each crate's `src`, takes the
//! modules its non-test code names (`crate::a::b`, `super::c`,
//! `self::d`, with `use` groups), and fails on any cycle among the
//! children of one module, printing it.
//!
//! Test code may use anything: a `#[cfg(test)]` item is left out whole,
//! matched by its braces, so code after a test module is still read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path inside its crate (`["volume", "core"]`).
type ModPath = Vec<String>;
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The module a source file is (`volume/mod.rs` and `volume.rs` are
/// `volume`; `lib.rs` and `main.rs` the crate root).
fn module_of(rel: &Path) -> ModPath {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().expect("a file");
    let stem = file.trim_end_matches(".rs");
    let root = parts.is_empty() && matches!(stem, "lib" | "main");
    if stem != "mod" && !root {
        parts.push(stem.to_owned());
    }
    parts
}

/// `text` without its comments, string literals' contents and
/// `#[cfg(test)]` items (each matched to its closing brace or semicolon).
fn non_test_code(text: &str) -> String {
    let code = strip_comments_and_strings(text);
    let mut out = String::with_capacity(code.len());
    let mut rest = code.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        rest = skip_item(&rest[at + "#[cfg(test)]".len()..]);
    }
    out.push_str(rest);
    out
}

/// What follows the item at the start of `s`: up to its first `;` outside
/// braces, or past the brace that closes its first `{`.
fn skip_item(s: &str) -> &str {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return &s[i + 1..];
                }
            }
            ';' if depth == 0 => return &s[i + 1..],
            _ => {}
        }
    }
    ""
}

fn strip_comments_and_strings(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('{', '\n'), not a lifetime.
            let end = text[i + 1..].find('\'').map_or(b.len(), |e| i + 2 + e);
            i = end;
            out.push_str("' '");
        } else {
            let c = text[i..].chars().next().expect("a char");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The paths `s` (just past a `::`) names: one path, or each leaf of a
/// `{...}` group, nested groups included.
fn paths_after(s: &str) -> Vec<Vec<String>> {
    let s = s.trim_start();
    if let Some(group) = s.strip_prefix('{') {
        let mut out = Vec::new();
        let mut depth = 0usize;
        let mut start = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    out.extend(item_paths(&group[start..i]));
                    return out;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.extend(item_paths(&group[start..i]));
                    start = i + 1;
                }
                _ => {}
            }
        }
        out
    } else {
        item_paths(s)
    }
}

/// The paths one `use` item names (`a::b::C`, `a::{b, c}`).
fn item_paths(s: &str) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    let mut rest = s.trim_start();
    loop {
        let name = ident(rest);
        if name.is_empty() {
            return if prefix.is_empty() {
                Vec::new()
            } else {
                vec![prefix]
            };
        }
        prefix.push(name.to_owned());
        rest = rest[name.len()..].trim_start();
        match rest.strip_prefix("::") {
            Some(r) if r.trim_start().starts_with('{') => {
                return paths_after(r)
                    .into_iter()
                    .map(|p| prefix.iter().cloned().chain(p).collect())
                    .collect();
            }
            Some(r) => rest = r.trim_start(),
            None => return vec![prefix],
        }
    }
}

/// The module paths `code` of module `me` names, as written from the
/// crate root (not yet cut to modules that exist).
fn references(me: &[String], code: &str) -> Vec<ModPath> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    for (i, _) in code.match_indices("::") {
        let before = code[..i].trim_end();
        let word_start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |p| p + 1);
        let word = &before[word_start..];
        // Only a path's first segment: `a::crate::` does not occur, but
        // `x::super::` would be part of a longer path already counted.
        let preceded = before[..word_start].trim_end();
        if preceded.ends_with("::") || (word_start > 0 && b[word_start - 1] == b':') {
            continue;
        }
        let base: Option<Vec<String>> = match word {
            "crate" => Some(Vec::new()),
            "self" => Some(me.to_vec()),
            "super" => {
                let mut p = me.to_vec();
                p.pop();
                Some(p)
            }
            _ => None,
        };
        let Some(mut base) = base else { continue };
        let mut rest = &code[i + 2..];
        // `super::super::x`
        while let Some(r) = rest.trim_start().strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        for p in paths_after(rest) {
            out.push(base.iter().cloned().chain(p).collect());
        }
    }
    out
}

/// Each crate's module tree and the edges between sibling modules.
struct CrateGraph {
    /// Parent module (`a::b`) -> its children's edges.
    levels: BTreeMap<String, Graph>,
}

fn source_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("source dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out
}

fn crate_graph(src: &Path) -> CrateGraph {
    let files = source_files(src);
    let modules: BTreeSet<ModPath> = files
        .iter()
        .map(|f| module_of(f.strip_prefix(src).expect("under src")))
        .collect();
    let mut levels: BTreeMap<String, Graph> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(src).expect("under src");
        let me = module_of(rel);
        let text = std::fs::read_to_string(f).expect("source file");
        for r in references(&me, &non_test_code(&text)) {
            // The longest prefix of the path that is a module of ours.
            let Some(target) = (0..=r.len())
                .rev()
                .map(|n| r[..n].to_vec())
                .find(|p| modules.contains(p))
            else {
                continue;
            };
            let common = me.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common < me.len() && common < target.len() {
                levels
                    .entry(me[..common].join("::"))
                    .or_default()
                    .entry(me[common].clone())
                    .or_default()
                    .insert(target[common].clone());
            }
        }
    }
    CrateGraph { levels }
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

/// Everything reachable from `m`.
fn reach(g: &Graph, m: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![m.to_owned()];
    while let Some(n) = todo.pop() {
        for d in g.get(&n).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

/// The groups of modules that each reach one another (a cycle's
/// members, however many cycles run through them).
fn knots(g: &Graph) -> Vec<BTreeSet<String>> {
    let reached: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|m| (m, reach(g, m))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for m in g.keys() {
        if !reached[m].contains(m) || out.iter().any(|k| k.contains(m)) {
            continue;
        }
        out.push(
            reached[m]
                .iter()
                .filter(|n| reached.get(n).is_some_and(|r| r.contains(m)))
                .cloned()
                .collect(),
        );
    }
    out
}

/// `g` cut down to the modules of `keep`.
fn only(g: &Graph, keep: &BTreeSet<String>) -> Graph {
    keep.iter()
        .map(|m| {
            let to = g[m].iter().filter(|d| keep.contains(*d)).cloned().collect();
            (m.clone(), to)
        })
        .collect()
}

fn workspace_crates() -> Vec<(String, PathBuf)> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(&crates)
        .expect("crates/")
        .filter_map(|e| {
            let dir = e.expect("dir entry").path();
            let src = dir.join("src");
            src.is_dir().then(|| {
                let name = dir
                    .file_name()
                    .expect("a name")
                    .to_string_lossy()
                    .into_owned();
                (name, src)
            })
        })
        .collect();
    out.sort();
    out
}

/// Knots that were there before this test read every crate, each as
/// "crate: {a, b, ...}", to be untied, not added to: a knot not listed
/// fails, and so does a listed one that is gone (strike it).
const KNOWN_KNOTS: &[&str] = &["gateway: {fence, volume}", "store: {registry, stats}"];

#[test]
fn no_crate_has_a_module_cycle() {
    let crates = workspace_crates();
    assert!(crates.len() > 10, "read too few crates: {crates:?}");
    let mut cycles = Vec::new();
    let mut known: Vec<&str> = KNOWN_KNOTS.to_vec();
    for (name, src) in &crates {
        let g = crate_graph(src);
        for (parent, level) in &g.levels {
            for knot in knots(level) {
                let at = if parent.is_empty() {
                    String::new()
                } else {
                    format!("{parent}::")
                };
                let names: Vec<String> = knot.iter().map(|m| format!("{at}{m}")).collect();
                let tangle = only(level, &knot);
                let cycle = find_cycle(&tangle).unwrap_or_default();
                let edges: Vec<String> = tangle
                    .iter()
                    .flat_map(|(a, to)| to.iter().map(move |b| format!("{a} -> {b}")))
                    .collect();
                let knot = format!("{name}: {{{}}}", names.join(", "));
                if let Some(i) = known.iter().position(|k| *k == knot) {
                    known.remove(i);
                    continue;
                }
                cycles.push(format!(
                    "{knot} tangled, e.g. {} (every use among them: {})",
                    cycle.join(" -> "),
                    edges.join(", ")
                ));
            }
        }
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
    assert!(
        known.is_empty(),
        "untied, so strike them from KNOWN_KNOTS: {known:?}"
    );
}

#[test]
fn the_binarys_graph_is_read_whole() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = crate_graph(&src);
    let top = &g.levels[""];
    assert!(top.len() > 10, "read too few modules: {top:?}");
    assert!(
        top["attach"].contains("metrics"),
        "the reader lost track of `use crate::{{...}}`: {top:?}"
    );
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
    assert!(knots(&chain).is_empty());
    let knotted = knots(&cycle);
    assert_eq!(knotted.len(), 1);
    assert_eq!(knotted[0].len(), 3);
}

#[test]
fn code_after_a_test_module_is_read_and_test_code_is_not() {
    let text = "use crate::{control, ctl::Reply};\n\
                #[cfg(test)]\nmod tests { use crate::attach; fn f() { let _ = '}'; } }\n\
                #[cfg(test)]\nuse crate::serve;\n\
                fn g() { crate::out::x(); super::{a::b, c::{d, e}}; }\n\
                // crate::comment\nconst S: &str = \"crate::string\";\n";
    let refs = references(&["m".into(), "n".into()], &non_test_code(text));
    let names: BTreeSet<String> = refs.iter().map(|p| p.join("::")).collect();
    let want: BTreeSet<String> = [
        "control",
        "ctl::Reply",
        "out::x",
        "m::a::b",
        "m::c::d",
        "m::c::e",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(names, want);
}

#[test]
fn files_name_their_modules() {
    let m = |s: &str| module_of(Path::new(s)).join("::");
    assert_eq!(m("lib.rs"), "");
    assert_eq!(m("main.rs"), "");
    assert_eq!(m("volume/mod.rs"), "volume");
    assert_eq!(m("volume/core.rs"), "volume::core");
    assert_eq!(m("metrics.rs"), "metrics");
    assert_eq!(m("a/b/mod.rs"), "a::b");
}
