//! Finds, at build time, which external tools and privileges the test
//! suite needs that this machine lacks, so that outside CI a test that
//! cannot run is reported by the harness as *ignored, with its reason*
//! (`#[cfg_attr(braid_skip = "nbdkit", ignore = "...")]`), not as a pass.
//! With `CI` set nothing is marked: every test runs, and one whose tool is
//! missing fails (the tests check again at run time).

fn main() {
    const TOOLS: &[&str] = &[
        "nbdkit",
        "nbdinfo",
        "nbdsh",
        "nbdcopy",
        "nbdfuse",
        "fusermount3",
        "qemu-img",
        "qemu-io",
        "qemu-nbd",
        "fio",
        "iperf3",
        "nft",
        "losetup",
        "systemd-analyze",
        "man",
        "nbd-client",
        "python3",
        "ip",
        "tc",
        "iscsi-ls",
        "iscsi-test-cu",
        "ceph-mon",
        "rbd",
        "sysctl",
        "tgtd",
        "gcc",
        "chromium",
        "chromedriver",
    ];
    let mut values: Vec<String> = TOOLS.iter().map(|t| format!("\"{t}\"")).collect();
    values.push("\"root\"".into());
    values.push("\"libiscsi-dev\"".into());
    println!(
        "cargo::rustc-check-cfg=cfg(braid_skip, values({}))",
        values.join(", ")
    );
    println!("cargo::rerun-if-env-changed=CI");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-changed=build.rs");
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    if ci {
        return;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<std::path::PathBuf> = std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/sbin", "/sbin"].map(Into::into))
        .collect();
    for tool in TOOLS {
        let found = dirs.iter().any(|d| d.join(tool).is_file());
        if !found {
            println!("cargo::rustc-cfg=braid_skip=\"{tool}\"");
        }
    }
    // libiscsi's C API, for the test client built from
    // tests/libiscsi/qd_client.c.
    if !std::path::Path::new("/usr/include/iscsi/iscsi.h").is_file() {
        println!("cargo::rustc-cfg=braid_skip=\"libiscsi-dev\"");
    }
    // The uid that builds is the uid that runs `cargo test`.
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        println!("cargo::rustc-cfg=braid_skip=\"root\"");
    }
}
