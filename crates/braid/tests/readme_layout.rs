//! The README's crate table is how a newcomer finds their way in: it must
//! name every crate directory there is, and none that is gone.

use std::collections::BTreeSet;
use std::path::Path;

#[test]
fn the_readme_layout_names_every_crate_and_only_those() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let on_disk: BTreeSet<String> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .map(|p| format!("crates/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let layout = readme
        .split("\n## Layout\n")
        .nth(1)
        .expect("README has a Layout section");
    let layout = layout.split("\n## ").next().unwrap_or(layout);
    let in_readme: BTreeSet<String> = layout
        .lines()
        .filter_map(|l| l.strip_prefix("| `crates/"))
        .filter_map(|l| l.split('`').next())
        .map(|name| format!("crates/{name}"))
        .collect();
    assert_eq!(
        in_readme, on_disk,
        "README's Layout table (left) and the crates/ directory (right) differ"
    );
}
