//! A volume's identity travels with its data, not its name: a served file
//! renamed keeps it, two files whose names are swapped each keep their own,
//! identities kept the old way (by path) survive the upgrade, and on a file
//! system without extended attributes the identity follows the inode.

mod common;

use std::path::Path;
use std::process::Command;

use common::{need_root, Serve};

/// The identity `braid serve` gives `file` with state in `state`.
fn identity_of(state: &Path, file: &Path) -> String {
    let mut serve = Serve::start(&[
        "--state-dir",
        state.to_str().unwrap(),
        &format!("vol={}", file.display()),
    ]);
    let id = serve.logged_volume("vol");
    assert!(serve.stop().success());
    id
}

fn file(dir: &Path, name: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
    p
}

#[test]
fn a_renamed_file_keeps_its_identity() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let a = file(dir.path(), "a.img");
    let before = identity_of(&state, &a);
    let moved = dir.path().join("renamed.img");
    std::fs::rename(&a, &moved).unwrap();
    assert_eq!(identity_of(&state, &moved), before);
}

#[test]
fn swapped_names_keep_each_files_identity() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let a = file(dir.path(), "a.img");
    let b = file(dir.path(), "b.img");
    let (ia, ib) = (identity_of(&state, &a), identity_of(&state, &b));
    assert_ne!(ia, ib);
    let tmp = dir.path().join("swap");
    std::fs::rename(&a, &tmp).unwrap();
    std::fs::rename(&b, &a).unwrap();
    std::fs::rename(&tmp, &b).unwrap();
    // a.img now holds b's data, and so b's identity.
    assert_eq!(identity_of(&state, &a), ib);
    assert_eq!(identity_of(&state, &b), ia);
}

#[test]
fn identities_kept_by_path_survive_the_upgrade_and_then_follow_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let a = file(dir.path(), "a.img");
    let canonical = std::fs::canonicalize(&a).unwrap();
    let old = "6f1c5c8e-7a0f-4f63-9a51-0c4b5cbb6f11";
    std::fs::write(
        state.join("identities"),
        format!("# old format\n{old}\t{}\n", canonical.display()),
    )
    .unwrap();
    assert_eq!(identity_of(&state, &a), old);
    let moved = dir.path().join("moved.img");
    std::fs::rename(&a, &moved).unwrap();
    assert_eq!(
        identity_of(&state, &moved),
        old,
        "the identity moved with the data"
    );
}

/// A ramfs mount: a file system that refuses user extended attributes.
struct Ramfs(tempfile::TempDir);

impl Drop for Ramfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

#[cfg_attr(
    braid_skip = "root",
    ignore = "needs root (network namespaces, mounts): run as root, or scripts/test-all"
)]
#[test]
fn without_extended_attributes_the_identity_follows_the_inode() {
    if !need_root() {
        return;
    }
    let mnt = Ramfs(tempfile::tempdir().unwrap());
    let ok = Command::new("mount")
        .args(["-t", "ramfs", "ramfs"])
        .arg(mnt.0.path())
        .status()
        .unwrap();
    assert!(ok.success(), "mount -t ramfs");
    let dir = mnt.0.path();
    let state = tempfile::tempdir().unwrap();
    let a = file(dir, "a.img");
    let b = file(dir, "b.img");
    let (ia, ib) = (identity_of(state.path(), &a), identity_of(state.path(), &b));
    let tmp = dir.join("swap");
    std::fs::rename(&a, &tmp).unwrap();
    std::fs::rename(&b, &a).unwrap();
    std::fs::rename(&tmp, &b).unwrap();
    assert_eq!(identity_of(state.path(), &a), ib);
    assert_eq!(identity_of(state.path(), &b), ia);
}
