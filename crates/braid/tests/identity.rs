//! A volume's identity travels with its data, not its name: a served file
//! renamed keeps it, two files whose names are swapped each keep their own,
//! identities kept the old way (by path) survive the upgrade, and on a file
//! system without extended attributes the identity follows the inode. A
//! copy of an image (which copies its extended attributes) is another
//! volume, two exports of one server never share an identity, and a
//! read-only export writes nothing into its file.

mod common;

use braid_test_needs::needs;

use std::path::Path;
use std::process::Command;

use common::{output, refused, Serve};

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

#[needs("root")]
fn without_extended_attributes_the_identity_follows_the_inode() {
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

/// What `path`'s `user.braid.volume` attribute holds, if anything.
fn label(path: &Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 8192];
    // SAFETY: NUL-terminated strings; buf is writable for its length.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"user.braid.volume".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    (n >= 0).then(|| String::from_utf8_lossy(&buf[..n as usize]).into_owned())
}

/// `cp -a` copies the identity attribute with the data: the copy must not
/// report the original's identity, or an initiator would combine two
/// disks as paths of one volume.
#[test]
fn a_copy_of_a_served_image_is_another_volume() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let a = file(dir.path(), "a.img");
    let original = identity_of(&state, &a);
    let b = dir.path().join("b.img");
    let cp = output(
        Command::new("cp").arg("-a").arg(&a).arg(&b),
        std::time::Duration::from_secs(20),
    );
    assert!(cp.status.success(), "cp -a");
    assert!(label(&b).is_some(), "cp -a copied the attribute");

    let mut both = Serve::start(&[
        "--state-dir",
        state.to_str().unwrap(),
        &format!("a={}", a.display()),
        &format!("b={}", b.display()),
    ]);
    let (ia, ib) = (both.logged_volume("a"), both.logged_volume("b"));
    assert_eq!(ia, original, "the original keeps its identity");
    assert_ne!(ib, ia, "the copy reports the original's identity");
    let log = both.log();
    assert!(
        log.contains("b.img") && log.contains("a.img") && log.contains(&format!("b={ia}")),
        "a warning names the copy, the original and the flag that would keep it:\n{log}"
    );
    assert!(both.stop().success());
    assert_eq!(
        identity_of(&state, &b),
        ib,
        "the copy keeps its new identity"
    );
}

/// One server, two exports, one identity: refused at start, both named.
#[test]
fn two_exports_with_one_identity_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let a = file(dir.path(), "a.img");
    let b = file(dir.path(), "b.img");
    let ia = identity_of(&state, &a);
    let err = refused(
        &state,
        &[
            "--volume-id",
            &format!("b={ia}"),
            &format!("a={}", a.display()),
            &format!("b={}", b.display()),
        ],
    );
    assert!(
        err.contains(&ia) && err.contains("\"a\"") && err.contains("\"b\""),
        "{err}"
    );
}

/// A read-only export is not written: its identity is kept in the state
/// directory, the same at every start, and taken over by the file once it
/// is served writable.
#[test]
fn a_read_only_export_writes_nothing_into_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let a = file(dir.path(), "a.img");
    let read_only = |state: &Path| {
        let mut s = Serve::start(&[
            "--read-only",
            "--state-dir",
            state.to_str().unwrap(),
            &format!("vol={}", a.display()),
        ]);
        let id = s.logged_volume("vol");
        assert!(s.stop().success());
        id
    };
    let first = read_only(&state);
    assert_eq!(label(&a), None, "a read-only export wrote into its file");
    assert_eq!(read_only(&state), first, "kept in the state directory");
    assert_eq!(
        identity_of(&state, &a),
        first,
        "and served writable, the same"
    );
    assert!(label(&a).is_some_and(|l| l.starts_with(&first)));
}
