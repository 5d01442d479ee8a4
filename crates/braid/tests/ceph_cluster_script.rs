//! `scripts/ceph-cluster stop` (what a test run's watcher calls once the
//! test process exits) removes the cluster's directory even when a pid
//! file cannot be read: a daemon removes its own as it exits, between the
//! script's look at the file and its read of it, and the read's failure
//! ended the script (`set -e`) before the directory went, leaving it in
//! /dev/shm. Needs no Ceph: nothing here runs a ceph daemon, and the
//! script stops only processes that do.

mod common;

use std::path::Path;
use std::time::Duration;

#[test]
fn stop_removes_the_directory_when_a_pid_file_cannot_be_read() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("cluster");
    std::fs::create_dir_all(dir.join("run")).unwrap();
    std::fs::create_dir_all(dir.join("log")).unwrap();
    std::fs::write(dir.join("log/mon.a.log"), b"a log").unwrap();
    // Unreadable as a pid file, as one that vanished after the look is.
    std::fs::create_dir(dir.join("run/mon.a.pid")).unwrap();
    // A live process that is not a ceph daemon: left alone.
    let mut bystander = common::ChildGuard::spawn(std::process::Command::new("sleep").arg("30"));
    let pid = bystander.0.id();
    std::fs::write(dir.join("run/osd.0.pid"), pid.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-cluster");
    let out = common::output(
        std::process::Command::new(script).arg("stop").arg(&dir),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "stop failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dir.exists(), "the cluster's directory is left behind");
    assert!(
        bystander.wait(Duration::ZERO).is_none(),
        "a process that is not a ceph daemon was stopped"
    );
}
