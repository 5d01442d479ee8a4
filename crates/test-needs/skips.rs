// The build script of every crate whose tests use `#[needs(...)]`
// (each crate's build.rs is `include!` of this file): it finds which
// needs this machine lacks, so that outside CI a test that cannot run is
// reported by the harness as ignored, with its reason, not as a pass.
// With `CI` set nothing is marked: every test runs, and one whose need is
// missing fails (the tests check again at run time).

include!("src/needs.rs");

fn main() {
    let mut values: Vec<String> = TOOLS.iter().map(|t| format!("\"{t}\"")).collect();
    values.extend(OTHERS.iter().map(|(n, _)| format!("\"{n}\"")));
    println!(
        "cargo::rustc-check-cfg=cfg(braid_skip, values({}))",
        values.join(", ")
    );
    println!("cargo::rerun-if-env-changed=CI");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=../test-needs/skips.rs");
    println!("cargo::rerun-if-changed=../test-needs/src/needs.rs");
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    if ci {
        return;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<std::path::PathBuf> = std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/sbin", "/sbin"].map(Into::into))
        .collect();
    for tool in TOOLS {
        if !dirs.iter().any(|d| d.join(tool).is_file()) {
            println!("cargo::rustc-cfg=braid_skip=\"{tool}\"");
        }
    }
    for (need, file) in OTHERS {
        let met = match file {
            Some(f) => std::path::Path::new(f).is_file(),
            // The uid that builds is the uid that runs `cargo test`.
            None => std::process::Command::new("id")
                .arg("-u")
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0"),
        };
        if !met {
            println!("cargo::rustc-cfg=braid_skip=\"{need}\"");
        }
    }
}
